//! Lowering of verified Tessera kernels to MLIR.
//!
//! Three targets, each built with melior on a fresh MLIR context and
//! verified by MLIR before it is printed or serialized:
//!
//! 1. [`kernel_module`]: the kernel in upstream dialects (func, memref,
//!    vector, arith, math, scf), with the grid, window and transform
//!    metadata Mosaic uses;
//! 2. [`tpu_custom_call`]: the same kernel in Mosaic's conventions,
//!    serialized to bytecode inside `stablehlo.custom_call
//!    @tpu_custom_call` in a complete StableHLO module;
//! 3. [`decomposed`]: the kernel as plain StableHLO (the grid as loops),
//!    which any PJRT back end runs.
//!
//! Only [`kernel_ir::VerifiedKernel`]s are lowered.
//!
//! # Decisions
//!
//! * **A body with semaphores is serialized as MLIR text**, not bytecode: its
//!   memref element types (`!tpu.dma_semaphore`) belong to the tpu dialect,
//!   which this MLIR lacks, so they are opaque types here, and bytecode would
//!   carry them as opaque types the TPU compiler does not read back as
//!   semaphores; text is re-parsed by the consumer's dialects (libtpu and
//!   jaxlib both take a text body, with locations). Other bodies stay
//!   bytecode.
//! * **Kernel function arguments** (`convention::ArgLayout`): grid indices (i32), scalar prefetch, the
//!   call's inputs (in, in-out), its outputs (out, in-out), scratch. An in-out
//!   operand appears twice, as Pallas passes it: loads read the input window,
//!   stores write the output window.
//! * **Upstream flavor**: memory spaces are integers (1 = vmem, 2 = smem, none =
//!   any) so that the module is valid upstream MLIR and round-trips through
//!   `mlir-opt-22`; non-row-major windows are strided memrefs (accessed with
//!   `vector.transfer_read/write`); `align` is the `llvm.align` argument
//!   attribute; `dot` is `vector.contract` on widened inputs; iota is
//!   `vector.step` + broadcast.
//! * **Mosaic flavor**: `#tpu.memory_space<..>` and the other `#tpu` attributes
//!   are parsed as opaque attributes (the tpu dialect is not in upstream MLIR);
//!   memref types are built with the unchecked constructor because MLIR's type
//!   verifier rejects opaque memory spaces, and it verifies types only when it
//!   parses them. In bytecode, opaque attributes are written as text, which
//!   jaxlib re-parses into real tpu attributes (checked by the conformance
//!   script). The serialized body renames every op `stable_mosaic.<op>`, the
//!   form Mosaic's deserializer requires, at `stable_mosaic.version = 15` (jax
//!   0.11.2's). `dot` is `tpu.matmul`, iota `tpu.iota`, stores
//!   `tpu.vector_store`.
//! * **Layout hints on TPU**: a hinted operand is transposed explicitly into its
//!   physical order by `stablehlo.transpose` before the call (outputs back after
//!   it); the kernel's window for it is in physical order and loads/stores
//!   transpose in registers; a transpose that undoes another is folded, so a
//!   col-major K feeds `tpu.matmul` directly. `operand_layouts` are then
//!   row-major and XLA adds no hidden copies. `TpuCustomCall::transposes`
//!   counts them and their bytes.
//! * **backend_config** follows Pallas' key order; the cost estimate counts
//!   flops/transcendentals over the grid (run-time loop bounds count one trip,
//!   both branches count) and bytes per block transfer (a block is fetched when
//!   its index changes); `scoped_memory_configs` always states the effective
//!   VMEM limit.
//! * **Decomposed**: arrays are padded to whole blocks, the grid is one while
//!   loop over all steps, outputs and scratch are loop-carried, a step's windows
//!   are `dynamic_slice`s and output windows are written back with
//!   `dynamic_update_slice`; kernel loops/branches thread the buffers they
//!   write. Generic-form StableHLO (plus `chlo.erf`), which PJRT plugins accept.
//! * **What Mosaic takes** (found with libtpu): stores are `tpu.vector_store`
//!   of a vector at the window's full rank (unit dims for points); floor
//!   division and the divisor-signed remainder in index maps are built from
//!   `divsi`/`remsi` (no `floordivsi` legalizes; tested exact for every sign
//!   by JIT-compiling the expansion); bool buffers are i32 in memory
//!   (`DType::tpu_memory_dtype`; the wrapper converts at the call, loads
//!   compare with 0, stores widen), bool selects and comparisons are bitwise;
//!   float `!=` is `not(oeq)` (no unordered predicates); rank-1 iotas are rows
//!   of a 2-D `tpu.iota`; bf16 reductions and bf16 sin/cos run in f32 and round
//!   once (which is also what the reference does).

mod body;
mod convention;
mod cost;
mod custom_call;
mod decomposed;
mod embed;
mod hlo;
mod host;
mod index_expr;
mod kernel_module;
mod lowered_values;
mod mlir;
pub mod op_names;
pub mod program;
pub mod triton;
mod unary;

pub use convention::Flavor;
pub use cost::CostEstimate;
pub use custom_call::{
    HOST_CALL_TARGET, TRITON_CALL_TARGET, TpuCustomCall, Transpose, host_custom_call,
    tpu_custom_call, triton_custom_call,
};
pub use decomposed::{Spmd, decomposed, decomposed_as};
pub use embed::{private_function, private_functions};
pub use host::cpu::{CpuIdentity, VectorRegisters};
pub use host::probe::Trial;
pub use host::tiling::{DotClass, DotTiling, DotTilings, TilingError};
pub use host::tuning::{HostTuning, MARGIN, TUNING_ENV, TuningSource, cache_dir};
pub use host::{HostKernel, HostOptions, host_module};
pub use kernel_module::MOSAIC_VERSION;
pub use mlir::{dense_literal, literal_text};
pub use triton::{ParamRole, TritonOptions, TritonParam, TritonProgram, triton, triton_with};

use kernel_ir::VerifiedKernel;

use crate::kernel_module::ModuleOptions;
use crate::mlir::{Ir, Mlir};

/// Errors of the lowering crate.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoweringError {
    /// An op the target cannot express.
    #[error("{}{op} cannot be lowered to the {target} target: {reason}", .loc.as_ref().map(|l| format!("{l}: ")).unwrap_or_default())]
    Unsupported {
        /// The op's mnemonic.
        op: String,
        /// Where the user wrote it.
        loc: Option<kernel_ir::Loc>,
        /// The target.
        target: &'static str,
        /// Why.
        reason: String,
    },
    /// MLIR rejected a module Tessera built: a Tessera bug.
    #[error("MLIR rejected the {what} Tessera built (a Tessera bug, please report it):\n{message}")]
    Mlir {
        /// Which module.
        what: &'static str,
        /// MLIR's diagnostics.
        message: String,
    },
    /// A native (host) kernel was called with arrays that do not fit it
    /// (the shared [`kernel_ir::Kernel::check_arguments`]).
    #[error("{0}")]
    Arguments(Box<kernel_ir::ArgumentError>),
    /// A block index outside its array at run time (from scalar prefetch).
    #[error("{0}")]
    BlockIndex(Box<kernel_ir::KernelError>),
    /// A native (host) kernel run failed: buffers of the wrong size, or
    /// its workspace could not be allocated.
    #[error("{0}")]
    Run(String),
    /// The kernel breaks rules of the target (the GPU target's `[gpu]`
    /// rules, [`kernel_ir::VerifiedKernel::check_gpu`]).
    #[error("{0}")]
    Refused(Box<kernel_ir::KernelErrors>),
    /// `TESSERA_HOST_TUNING` is malformed (the native JIT's register
    /// tiles).
    #[error(transparent)]
    HostTuning(host::tiling::TilingError),
    /// An internal inconsistency: a Tessera bug.
    #[error("internal lowering error (a Tessera bug, please report it): {0}")]
    Internal(String),
}

/// The error for a copy, semaphore or scope op that reached a CPU target,
/// which lowers the kernel after
/// [`kernel_ir::VerifiedKernel::with_synchronous_copies`]: a Tessera bug.
pub(crate) fn removed_by_synchronous_pass(op: &kernel_ir::Op, target: &str) -> LoweringError {
    LoweringError::Internal(format!(
        "`{}` reached the {target}; the synchronous-copies pass removes it",
        op.kind.mnemonic()
    ))
}

/// A cross-device op reached a single-device target: a bug, since
/// [`single_device`] refuses kernels with a mesh (the only ones these ops
/// verify in) before they are lowered.
pub(crate) fn reached_single_device(op: &kernel_ir::Op, target: &str) -> LoweringError {
    LoweringError::Internal(format!(
        "`{}` reached the {target}; kernels with a mesh are refused before lowering",
        op.kind.mnemonic()
    ))
}

/// Refuses a kernel with a mesh on a single-device target, before it is
/// lowered: its barrier, ids and remote copies mean nothing on one chip.
pub(crate) fn single_device(
    k: &kernel_ir::Kernel,
    target: &'static str,
) -> Result<(), LoweringError> {
    match &k.mesh {
        Some(m) => Err(LoweringError::Unsupported {
            op: "mesh".into(),
            loc: k.grid_loc.clone(),
            target,
            reason: kernel_ir::single_device_only(&k.name, m),
        }),
        None => Ok(()),
    }
}

/// Refuses a kernel verified for the GPU on a TPU target: its blocks need
/// not meet the TPU's tiling, nor its buffers the VMEM budget.
pub(crate) fn tpu_platform(
    k: &kernel_ir::Kernel,
    target: &'static str,
) -> Result<(), LoweringError> {
    match k.platform {
        kernel_ir::Platform::Tpu => Ok(()),
        kernel_ir::Platform::Gpu => Err(LoweringError::Unsupported {
            op: "kernel".into(),
            loc: k.grid_loc.clone(),
            target,
            reason: format!(
                "kernel `{}` was built for the GPU's rules (`Platform::Gpu`); build it for the TPU (the default platform) to lower it for TPU, so that its blocks are checked against the TPU's tiling and VMEM",
                k.name
            ),
        }),
    }
}

/// Target 1: the kernel module in upstream dialects, printed.
pub fn kernel_module(kernel: &VerifiedKernel) -> Result<String, LoweringError> {
    printed_kernel_module(kernel, Flavor::Upstream, "kernel module")
}

/// The Mosaic-flavored kernel module, printed (for reading; the custom call
/// carries its serialized form).
pub fn mosaic_module(kernel: &VerifiedKernel) -> Result<String, LoweringError> {
    printed_kernel_module(kernel, Flavor::Mosaic, "Mosaic kernel module")
}

fn printed_kernel_module(
    kernel: &VerifiedKernel,
    flavor: Flavor,
    what: &'static str,
) -> Result<String, LoweringError> {
    if flavor == Flavor::Upstream {
        single_device(kernel, what)?;
    } else {
        tpu_platform(kernel, what)?;
    }
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let options = ModuleOptions {
        flavor,
        no_memory_spaces: false,
    };
    // Upstream dialects have no DMA engine: copies become synchronous.
    let synchronous;
    let kernel = match flavor {
        Flavor::Upstream => {
            synchronous = kernel.with_synchronous_copies();
            &synchronous
        }
        Flavor::Mosaic => kernel,
    };
    let module = kernel_module::build(&ir, kernel, options)?;
    m.verify(&module, what)?;
    Ok(module.as_operation().to_string())
}

/// Checks that melior links against MLIR 22 (used by the set-up check).
pub fn mlir_version_check() -> Result<String, LoweringError> {
    let m = Mlir::new();
    let module = melior::ir::Module::new(melior::ir::Location::unknown(&m.ctx));
    m.verify(&module, "empty module")?;
    Ok(module.as_operation().to_string())
}
