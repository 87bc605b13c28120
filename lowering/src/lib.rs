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

mod body;
mod convention;
mod cost;
mod custom_call;
mod decomposed;
mod embed;
mod host;
mod kernel_module;
mod lowered_values;
mod mlir;
pub mod op_names;

pub use convention::Flavor;
pub use cost::CostEstimate;
pub use custom_call::{
    HOST_CALL_TARGET, TpuCustomCall, Transpose, host_custom_call, tpu_custom_call,
};
pub use decomposed::decomposed;
pub use embed::{private_function, private_functions};
pub use host::{HostKernel, HostOptions, host_module};
pub use kernel_module::MOSAIC_VERSION;
pub use mlir::literal_text;

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
