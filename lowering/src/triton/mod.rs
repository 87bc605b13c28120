//! The GPU target: a verified kernel as a Triton program (Python source of
//! one `@triton.jit` function), which Triton compiles for NVIDIA and AMD
//! GPUs and its interpreter runs on the CPU.
//!
//! # Why Triton's Python front end, not TTIR
//!
//! Tessera writes the program as Triton Python source, as PyTorch's
//! Inductor does, rather than TTIR: Triton's interpreter
//! (`TRITON_INTERPRET=1`) runs Python source only, so this is the one form
//! that both Triton's compiler and an execution on the CPU take, and the
//! program the CPU check runs is the program the GPU compiler compiles
//! (the brief's rule: two back ends agreeing proves nothing if both follow
//! the same wrong rule; here the program is checked by Triton's own
//! semantics). TTIR for XLA's Triton custom call is Triton's own front
//! end's output for this source. Every line carries the Rust location of
//! the op it comes from (`# file.rs:line:col`), so a Triton error names the
//! author's line.
//!
//! # The program
//!
//! * **Grid**: parallel dims are program ids (the innermost on axis 0; more
//!   than three, or a y/z dim over 65,535, folded into axis 0); `arbitrary`
//!   dims are `for` loops inside the program, in grid order, so a kernel
//!   written for the TPU's sequential grid means the same thing here.
//! * **Buffers**: see [`plan`](self) (registers, fetched blocks, memory);
//!   every array is row-major on the GPU: layout hints are TPU tiling
//!   facts, so they change nothing here (no transposes), and `align`
//!   holds for every pointer (buffers are at least 16-byte aligned, which
//!   the compile states as `tt.divisibility = 16`).
//! * **Edges**: a block past an array's end loads zeros there and stores
//!   only in bounds, as the host JIT's zero padding does.
//! * **Arithmetic**: bf16, f16 and fp8 values are stored and multiplied in
//!   their own type (`tl.dot` on them uses the tensor cores) but every
//!   other float op runs in f32 and rounds once to the op's type (the
//!   reference's rule; Triton's interpreter has no bf16 arithmetic).
//!   Conversions follow `DType::convert_from` (NaN-propagating max/min,
//!   truncating float-to-int conversion that saturates with NaN as 0, fp8
//!   overflow to NaN or ∞ rather than the hardware's saturation).
//! * **Dots**: `tl.dot` with f32 (or i32) accumulation where every dim is at
//!   least 16, a broadcast product and sum otherwise; `acc + dot(a, b)` is
//!   one `tl.dot(a, b, acc)`. f32 operands take the program's `F32_DOT`
//!   precision: IEEE in the interpreter, and for a GPU compile the most
//!   exact scheme its tensor cores have (3xTF32 on NVIDIA, whose tensor
//!   cores have no f32; IEEE on AMD, whose matrix cores multiply f32), so
//!   an f32 kernel keeps f32's accuracy (plain TF32 would lose 13 bits).
//! * **Copies**: kernels that move their own data run their copies
//!   synchronously (`VerifiedKernel::with_synchronous_copies`, the CPU
//!   targets' rule): a copy is a load and a store, a wait nothing.
//! * **Refused**: what [`kernel_ir::VerifiedKernel::check_gpu`] refuses
//!   (kernels across chips, non-power-of-two tiles) is a
//!   [`LoweringError::Refused`] before anything is written.

mod emit;
mod plan;

use kernel_ir::{DType, GpuTarget, VerifiedKernel};

use crate::LoweringError;

/// Launch options of a Triton program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TritonOptions {
    /// Warps per program.
    pub num_warps: usize,
    /// Software-pipeline stages of loops with loads.
    pub num_stages: usize,
}

impl TritonOptions {
    /// Triton's defaults, with 8 warps for programs whose dots produce
    /// 128 × 128 tiles or more (Triton's tutorials' choice at those
    /// blocks).
    pub fn for_kernel(kernel: &VerifiedKernel) -> TritonOptions {
        let mut largest = 0usize;
        kernel.body.walk(&mut |op| {
            if let kernel_ir::OpKind::Dot { .. } = op.kind {
                for &r in &op.results {
                    if let Some(t) = kernel.body.ty(r) {
                        largest = largest.max(t.elements());
                    }
                }
            }
        });
        TritonOptions {
            num_warps: if largest >= 128 * 128 { 8 } else { 4 },
            num_stages: 3,
        }
    }
}

/// What a pointer argument of the program is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ParamRole {
    /// Scalar-prefetch array `n`.
    Prefetch(usize),
    /// The input of operand `n` (in or in-out).
    Input(usize),
    /// The output of operand `n` (out or in-out; an in-out operand's input
    /// and output must be the same buffer).
    Output(usize),
    /// The global workspace of memory scratch, `workspace_bytes` long.
    Workspace,
}

/// One pointer argument of the program.
#[derive(Clone, Debug, PartialEq)]
pub struct TritonParam {
    /// The Python parameter name.
    pub name: String,
    /// What it points at.
    pub role: ParamRole,
    /// Element type (`I8` bytes for the workspace).
    pub dtype: DType,
    /// Array shape (`[workspace_bytes]` for the workspace).
    pub shape: Vec<usize>,
}

impl TritonParam {
    /// Its type in a Triton signature (`*fp32`, `*bf16`, ...).
    pub fn signature_type(&self) -> &'static str {
        match self.dtype {
            DType::F32 => "*fp32",
            DType::BF16 => "*bf16",
            DType::F16 => "*fp16",
            DType::I32 => "*i32",
            DType::I8 => "*i8",
            DType::Bool => "*i1",
            DType::F8E4M3FN => "*fp8e4nv",
            DType::F8E5M2 => "*fp8e5",
        }
    }
}

/// A kernel as a Triton program.
#[derive(Clone, Debug, PartialEq)]
pub struct TritonProgram {
    /// The `@triton.jit` function's name (`<kernel>_kernel`).
    pub function: String,
    /// The Python module: imports, helpers, the function.
    pub source: String,
    /// Pointer arguments, in order: scalar prefetch, inputs (in and
    /// in-out operands), outputs (out and in-out), the workspace if any.
    pub params: Vec<TritonParam>,
    /// Programs along launch axes x, y, z.
    pub grid: [u64; 3],
    /// Bytes of the global workspace (0: none, no workspace argument).
    pub workspace_bytes: u64,
    /// Warps and stages.
    pub options: TritonOptions,
}

/// Lowers a kernel to its Triton program with the default options
/// ([`TritonOptions::for_kernel`]).
///
/// ```
/// use kernel_ir::prelude::*;
/// let mut k = KernelBuilder::new("scale");
/// k.grid([4], [Parallel]);
/// let x = k.input("x", F32, [64, 128]).block([16, 128], |[i]| (i, 0));
/// let o = k.output("o", F32, [64, 128]).block([16, 128], |[i]| (i, 0));
/// o.store(.., x.load(..) * 2.0);
/// let p = lowering::triton(&k.build().unwrap()).unwrap();
/// assert_eq!(p.grid, [4, 1, 1]);
/// assert!(p.source.contains("@triton.jit\ndef scale_kernel(x_ptr, o_ptr):"));
/// ```
pub fn triton(kernel: &VerifiedKernel) -> Result<TritonProgram, LoweringError> {
    triton_with(kernel, TritonOptions::for_kernel(kernel), None)
}

/// Lowers a kernel to its Triton program with these options, checking the
/// rules of `target` too when one is given.
pub fn triton_with(
    kernel: &VerifiedKernel,
    options: TritonOptions,
    target: Option<GpuTarget>,
) -> Result<TritonProgram, LoweringError> {
    kernel
        .check_gpu(target)
        .map_err(|e| LoweringError::Refused(Box::new(e)))?;
    let synchronous = kernel.with_synchronous_copies();
    emit::program(&synchronous, options)
}
