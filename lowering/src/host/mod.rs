//! Native host kernels: a kernel compiled for this CPU and run over host
//! buffers.
//!
//! Three steps, one module each:
//!
//! * [`emit`] builds the *host flavor* of the kernel module: the same
//!   signature shape as target 1 (grid indices, scalar prefetch, operand
//!   windows, scratch) plus a workspace buffer, with a body written for a
//!   CPU (loops over short vectors, fused elementwise chains, a
//!   register-blocked matmul) instead of whole-block vectors;
//! * [`jit`] lowers it with the upstream pipeline to the LLVM dialect,
//!   checks that nothing else is left and JIT-compiles it with MLIR's
//!   ExecutionEngine;
//! * [`driver`] runs the grid: block windows as strided memref descriptors
//!   into padded storage, `parallel` groups on threads.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kernel_ir::{Array, DType};
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! let native = lowering::HostKernel::compile(&kernel)?;
//! let x = Array::random(DType::F32, vec![256, 256], 7, -1.0, 1.0);
//! let outputs = native.run(&[x])?;
//! # Ok(()) }
//! ```
//!
//! fp8 on the host (`host/emit/fp8.rs`): LLVM has no fp8 types, so an fp8
//! value is its bit pattern in memory (one byte, what XLA's buffers hold) and
//! an f16 in registers (every value of both formats is one); loads decode,
//! stores and conversions to fp8 encode straight from f32 (nearest even,
//! subnormals, NaN/∞ overflow), so rounding never passes through f16.
//!
//! `HostKernel::compile` builds the *host flavor* of the kernel module, lowers
//! it to the LLVM dialect and JIT-compiles it with MLIR's ExecutionEngine;
//! `run`/`run_bytes`/`run_raw` execute the grid. `host_module` prints the host
//! flavor. Three modules: `emit/` (the body: `mod` the emitter and op
//! dispatch, `lazy` lazy expressions and chunk loops, `math` elementwise math
//! and the polynomial `exp`, `reduce`, `dot` the micro-kernel, `control`
//! loops and conditionals), `jit` (pipeline, LLVM-only check, engine),
//! `driver` (storage, descriptors, threads).
//!
//! **The JIT compiles a CPU-shaped module, not target 1.** Target 1
//! computes on whole-block vectors (`vector<128x128xf32>`), which LLVM unrolls
//! into tens of thousands of register ops (minutes to compile, spills at run
//! time). The host flavor keeps target 1's signature shape (grid indices,
//! prefetch, windows, scratch) plus a workspace buffer, and lowers the body for
//! a CPU:
//!
//! * a tile is a *lazy expression* (elementwise ops, broadcasts, transposes,
//!   unit-dim reshapes, iota, loads of windows) evaluated chunk by chunk
//!   (`vector<16 x T>` along the last dim) where it is consumed, so elementwise
//!   chains fuse into one loop nest; a value used twice, a reduction result, a
//!   matmul result or a loop-carried tile lives in a workspace buffer
//!   (`memref.view` at a static offset);
//! * before a buffer is stored to, lazy values that read it and are still
//!   needed are computed ("frozen") first, so laziness never changes results;
//!   a store whose value reads the target only at the same site, through
//!   elementwise ops (`acc = acc · α + pv`), runs in place (each chunk is read
//!   before it is overwritten) instead of through a temporary; one op between
//!   a buffer and a constant (`s · scale`) is recomputed at each use rather
//!   than stored;
//! * a transpose of a window is a window with its index map permuted (still
//!   vector loads along whichever dim has unit stride);
//! * `dot` lays its operands out as BLAS libraries do: the rhs is *packed*
//!   into `[batch, n / NR, k, NR]` panels (one k step reads one contiguous run;
//!   a k × NR panel stays in L1 while the lhs row tiles sweep it), through
//!   16 × 16 in-register transposes (`vector.shuffle`) when the rhs is
//!   contiguous along k (`kᵀ`, `qᵀ`); the lhs is read in place when it is a
//!   window or buffer of the accumulator type (its elements are scalar loads
//!   broadcast to the lanes, so its stride does not matter), a transposed
//!   computed value (`pᵀ`, `dSᵀ`) is written in its own order and read in
//!   place through the transpose, anything else is computed into a `[batch,
//!   m, k]` buffer. The micro-kernel's register tile is measured per CPU
//!   (`DotTiling`, `HostTuning`: 12 rows × 32 lanes on AVX-512's 32
//!   registers, 6 × 16 on AVX2's 16; a tail of 8/4/2/1-row tiles covers the
//!   rest), `vector.fma` with broadcast lhs, k unrolled by 4,
//!   row tiles inside column panels so a panel is reused while it is in L1;
//!   half-float accumulation and arithmetic run in f32 and round once per op,
//!   as the interpreter does;
//! * `exp` is a range-reduced polynomial (LLVM would call libm per lane);
//!   other transcendentals go to libm through `convert-math-to-libm`;
//! * dynamic slice starts are clamped into the buffer (as `dynamic_slice`
//!   does): the interpreter reports them, native code must never touch memory
//!   outside a window; bools are bytes in memory (LLVM packs `vector<N x i1>`).
//!
//! The pipeline (`jit::PIPELINE`) is upstream passes only; after it every op
//! must be in the LLVM dialect (`jit::non_llvm_ops`), checked before the engine
//! sees the module, because the engine crashes instead of failing on leftovers.
//!
//! Driver invariants: each operand runs from *row-major storage*: its dims
//! padded to whole blocks (an unpadded operand is the caller's buffer itself,
//! no copy). Layout hints are the TPU's business: honouring a column-major K
//! here cost a transpose of the whole array per run (a fifth of causal
//! attention's time at S = 2048), while the packer reads either order at full
//! speed. Its window is a memref descriptor (block offset, block shape,
//! storage strides) in logical dim order, so the last dim always has unit
//! stride and vector loads apply; block
//! indices come from `Kernel::block_index` (the interpreter's function) and are
//! bounds-checked before any call. Grid points sharing their `parallel`
//! indices form a group that runs in order on one thread with that thread's
//! scratch and workspace; groups are taken from an atomic counter by
//! `HostOptions::threads` threads, the calling thread one of them. Scratch and
//! workspace start zeroed each run; they are kept between runs (a bounded
//! `BufferPool`, twice the thread count) and cleared, instead of fresh
//! allocations whose page faults cost 4% of a 6 ms matmul. `HostKernel` is
//! `Send + Sync`.

pub(crate) mod cpu;
mod driver;
mod emit;
pub(crate) mod jit;
pub(crate) mod probe;
pub(crate) mod tiling;
pub(crate) mod tuning;

use melior::ir::attribute::StridedLayoutAttribute;
use melior::ir::r#type::MemRefType;
use melior::ir::{BlockLike, Module, Type};

use kernel_ir::{Array, DType, Kernel, VerifiedKernel};

use crate::LoweringError;
use crate::mlir::{Ir, Mlir};
use driver::{BufferPool, Program, Storage};
use emit::{HostArgs, HostEmitter};

/// The name of the kernel function in every host module.
const ENTRY: &str = "tessera_host_kernel";

/// Bytes per element of `d` in host memory (bool is a byte).
pub(crate) fn mem_bytes(d: DType) -> usize {
    d.bytes().max(1)
}

/// Options of a host kernel run.
#[derive(Clone, Copy, Debug)]
pub struct HostOptions {
    /// Threads for the `parallel` grid dims (1: run on the calling thread).
    pub threads: usize,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A kernel compiled to native code for this machine.
///
/// Safe to share between threads; one compiled kernel serves any number of
/// concurrent runs.
pub struct HostKernel {
    kernel: Kernel,
    engine: jit::Engine,
    storage: Vec<Storage>,
    workspace_bytes: usize,
    options: HostOptions,
    /// Grid workers' scratch and workspace, kept between runs.
    pool: driver::BufferPool,
}

impl std::fmt::Debug for HostKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKernel")
            .field("kernel", &self.kernel.name)
            .field("workspace_bytes", &self.workspace_bytes)
            .field("options", &self.options)
            .finish()
    }
}

/// The host flavor of the kernel module, printed (what the JIT compiles,
/// before the pipeline to LLVM).
pub fn host_module(kernel: &VerifiedKernel) -> Result<String, LoweringError> {
    crate::single_device(kernel, "host")?;
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let tilings = tuning::HostTuning::host()?.dots;
    let (module, _) = build(&ir, &kernel.with_synchronous_copies(), tilings)?;
    m.verify(&module, "host kernel module")?;
    Ok(module.as_operation().to_string())
}

impl HostKernel {
    /// Builds the host module, lowers it to LLVM and JIT-compiles it, with
    /// this CPU's tuned register tile ([`HostTuning::host`](crate::HostTuning::host):
    /// measured at the first compile on a CPU, read from disk after).
    pub fn compile(kernel: &VerifiedKernel) -> Result<HostKernel, LoweringError> {
        HostKernel::compile_tiled(kernel, tuning::HostTuning::host()?.dots)
    }

    /// [`HostKernel::compile`] with the dot micro-kernel's register tiles
    /// given (what the tuning search measures; any tile computes the same
    /// results, only its speed differs).
    pub fn compile_tiled(
        kernel: &VerifiedKernel,
        tilings: tiling::DotTilings,
    ) -> Result<HostKernel, LoweringError> {
        crate::single_device(kernel, "host")?;
        // The host has no DMA engine: copies become synchronous.
        let synchronous = kernel.with_synchronous_copies();
        let k: &Kernel = &synchronous;
        let m = Mlir::new();
        let ir = Ir::new(&m.ctx, "");
        let (mut module, workspace_bytes) = build(&ir, k, tilings)?;
        m.verify(&module, "host kernel module")?;
        let ops = jit::op_count(&module);
        if ops > kernel_ir::limits::MAX_HOST_OPS {
            return Err(LoweringError::Unsupported {
                op: "kernel".into(),
                loc: k.loc.clone(),
                target: "host",
                reason: format!(
                    "[limit] its host module has {ops} ops, more than the JIT compiles in bounded time ({}, kernel_ir::limits::MAX_HOST_OPS); run it with --backend interp or pjrt, or loop over what the body repeats",
                    kernel_ir::limits::MAX_HOST_OPS
                ),
            });
        }
        jit::lower_to_llvm(&m, &mut module)?;
        let engine = jit::Engine::new(&m, &module, ENTRY)?;
        Ok(HostKernel {
            kernel: k.clone(),
            engine,
            storage: (0..k.operands.len()).map(|i| Storage::of(k, i)).collect(),
            workspace_bytes,
            options: HostOptions::default(),
            pool: BufferPool::new(2 * HostOptions::default().threads),
        })
    }

    /// The same compiled kernel with other run options.
    pub fn with_options(mut self, options: HostOptions) -> HostKernel {
        self.options = options;
        self.pool = BufferPool::new(2 * options.threads.max(1));
        self
    }

    /// The kernel it runs.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Workspace bytes each thread needs for intermediate tiles.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }

    /// Runs the kernel on arrays: scalar prefetch first, then the inputs
    /// (in and in-out operands) in operand order, as
    /// [`kernel_ir::interpret`] takes them; returns the outputs (out and
    /// in-out operands) in operand order.
    pub fn run(&self, args: &[Array]) -> Result<Vec<Array>, LoweringError> {
        let k = &self.kernel;
        k.check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
            .map_err(|e| LoweringError::Arguments(Box::new(e)))?;
        let bytes: Vec<Vec<u8>> = args.iter().map(Array::to_le_bytes).collect();
        let np = k.prefetch.len();
        let mut outs: Vec<Vec<u8>> = k
            .outputs()
            .map(|o| vec![0u8; o.shape.iter().product::<usize>() * mem_bytes(o.dtype)])
            .collect();
        let prefetch: Vec<&[u8]> = bytes[..np].iter().map(Vec::as_slice).collect();
        let inputs: Vec<&[u8]> = bytes[np..].iter().map(Vec::as_slice).collect();
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        self.run_bytes(&prefetch, &inputs, &mut out_refs)?;
        k.outputs()
            .zip(&outs)
            .map(|(o, b)| {
                Array::from_le_bytes(o.dtype, o.shape.clone(), b)
                    .map_err(|e| LoweringError::Internal(e.to_string()))
            })
            .collect()
    }

    /// Runs the kernel on little-endian byte buffers (prefetch, inputs,
    /// outputs as in [`HostKernel::run`]); every length is checked.
    pub fn run_bytes(
        &self,
        prefetch: &[&[u8]],
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), LoweringError> {
        let k = &self.kernel;
        let check = |what: &str, name: &str, have: usize, want: usize| {
            if have == want {
                Ok(())
            } else {
                Err(LoweringError::Run(format!(
                    "{what} `{name}` of kernel `{}` must be {want} bytes, got {have}",
                    k.name
                )))
            }
        };
        let count = |want: usize, have: usize, what: &str| {
            if want == have {
                Ok(())
            } else {
                Err(LoweringError::Run(format!(
                    "kernel `{}` takes {want} {what}, got {have}",
                    k.name
                )))
            }
        };
        count(k.prefetch.len(), prefetch.len(), "scalar-prefetch arrays")?;
        count(k.inputs().count(), inputs.len(), "inputs")?;
        count(k.outputs().count(), outputs.len(), "outputs")?;
        for (p, b) in k.prefetch.iter().zip(prefetch) {
            check(
                "scalar prefetch",
                &p.name,
                b.len(),
                p.shape.iter().product::<usize>() * 4,
            )?;
        }
        for (o, b) in k.inputs().zip(inputs) {
            let want = o.shape.iter().product::<usize>() * mem_bytes(o.dtype);
            check("input", &o.name, b.len(), want)?;
        }
        for (o, b) in k.outputs().zip(outputs.iter()) {
            let want = o.shape.iter().product::<usize>() * mem_bytes(o.dtype);
            check("output", &o.name, b.len(), want)?;
        }
        let p: Vec<*const u8> = prefetch.iter().map(|b| b.as_ptr()).collect();
        let i: Vec<*const u8> = inputs.iter().map(|b| b.as_ptr()).collect();
        let o: Vec<*mut u8> = outputs.iter_mut().map(|b| b.as_mut_ptr()).collect();
        // SAFETY: lengths checked above; `&mut` outputs cannot alias
        // anything else.
        unsafe { self.run_raw(&p, &i, &o) }
    }

    /// Runs the kernel on raw buffers (the FFI handler's entry).
    ///
    /// # Safety
    /// Every pointer must be valid for its whole array in the kernel's
    /// shape and dtype (outputs writable, bool as one byte), and no output
    /// may overlap another buffer except an in-out operand's input, which
    /// may be the very same buffer.
    pub unsafe fn run_raw(
        &self,
        prefetch: &[*const u8],
        inputs: &[*const u8],
        outputs: &[*mut u8],
    ) -> Result<(), LoweringError> {
        let k = &self.kernel;
        if prefetch.len() != k.prefetch.len()
            || inputs.len() != k.inputs().count()
            || outputs.len() != k.outputs().count()
        {
            return Err(LoweringError::Run(format!(
                "kernel `{}` got the wrong number of buffers",
                k.name
            )));
        }
        let program = Program {
            kernel: k,
            engine: &self.engine,
            storage: &self.storage,
            workspace_bytes: self.workspace_bytes,
            threads: self.options.threads,
            pool: &self.pool,
        };
        // SAFETY: upheld by the caller.
        unsafe { program.run(prefetch, inputs, outputs) }
    }
}

/// The memref type of an operand window: static block shape (in physical
/// dim order), dynamic offset and strides except a unit stride on the last
/// dim, so that vector loads apply along it.
fn window_type<'c>(ir: &Ir<'c>, shape: &[usize], d: DType) -> Type<'c> {
    let dynamic = i64::MIN;
    let mut strides = vec![dynamic; shape.len()];
    if let Some(last) = strides.last_mut() {
        *last = 1;
    }
    let layout = StridedLayoutAttribute::new(ir.ctx, dynamic, &strides);
    let dims: Vec<i64> = shape.iter().map(|&x| x as i64).collect();
    MemRefType::new(ir.elem(host_dtype(d)), &dims, Some(layout.into()), None).into()
}

/// The dtype a buffer of `d` has in host memory.
fn host_dtype(d: DType) -> DType {
    if d == DType::Bool || d.is_fp8() {
        DType::I8
    } else {
        d
    }
}

/// Builds the host module: `func.func @tessera_host_kernel(grid i32...,
/// prefetch, operand windows, scratch, workspace)`. Returns it with the
/// workspace bytes the body needs.
fn build<'c>(
    ir: &Ir<'c>,
    k: &Kernel,
    tilings: tiling::DotTilings,
) -> Result<(Module<'c>, usize), LoweringError> {
    let module = Module::new(ir.loc());
    let mut types: Vec<Type<'c>> = vec![ir.i32(); k.grid.rank()];
    for p in &k.prefetch {
        types.push(ir.memref(&p.shape, host_dtype(p.dtype), None, None));
    }
    // Windows in logical order: host storage is row-major (see `Storage`).
    for o in &k.operands {
        types.push(window_type(ir, o.view_shape(), o.dtype));
    }
    for s in &k.scratch {
        types.push(ir.memref(&s.shape, host_dtype(s.dtype), None, None));
    }
    let ws_type: Type<'c> = MemRefType::new(ir.elem(DType::I8), &[i64::MIN], None, None).into();
    types.push(ws_type);
    let entry = ir.block(&types);
    let a = ir.args(&entry);
    let g = k.grid.rank();
    let np = k.prefetch.len();
    let no = k.operands.len();
    let args = HostArgs {
        grid: a[..g].to_vec(),
        prefetch: a[g..g + np].to_vec(),
        operands: a[g + np..g + np + no].to_vec(),
        scratch: a[g + np + no..a.len() - 1].to_vec(),
        workspace: a[a.len() - 1],
    };
    let mut emitter = HostEmitter::new(ir, k, args, tilings);
    emitter.top(&entry)?;
    let workspace_bytes = emitter.workspace_bytes;
    ir.op(&entry, "func.return", &[], &[], Vec::new(), Vec::new())?;
    let func = ir.build(
        "func.func",
        &[],
        &[],
        vec![
            ("sym_name", ir.str_attr(ENTRY)),
            ("function_type", ir.type_attr(ir.func_type(&types, &[]))),
        ],
        vec![ir.region(entry)],
    )?;
    module.body().append_operation(func);
    Ok((module, workspace_bytes))
}
