//! Lowering of verified Tessera kernels to MLIR.
//!
//! This crate will hold the three lowering targets of a kernel (see
//! `ARCHITECTURE.md`): the kernel module in upstream dialects, the Mosaic-shaped
//! body wrapped in `stablehlo.custom_call @tpu_custom_call`, and decomposed
//! StableHLO that any PJRT back end runs. Today it proves the MLIR 22 tool chain
//! is wired up: [`mlir_version_check`] builds, verifies and prints a module.

use melior::{
    Context,
    dialect::DialectRegistry,
    ir::{Location, Module, operation::OperationLike},
    utility::register_all_dialects,
};

/// Errors of the lowering crate.
#[derive(Debug, thiserror::Error)]
pub enum LoweringError {
    /// MLIR rejected a module we built; this is a bug in Tessera's lowering.
    #[error(
        "MLIR verification failed for the {what} module; this is a Tessera bug, please report it"
    )]
    Verify {
        /// Which module failed.
        what: &'static str,
    },
}

/// Builds an empty module in a fresh MLIR context with every upstream dialect
/// registered, verifies it and returns its printed form.
///
/// Used by the set-up and tests to prove that melior links against MLIR 22.
pub fn mlir_version_check() -> Result<String, LoweringError> {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let context = Context::new();
    context.append_dialect_registry(&registry);
    context.load_all_available_dialects();
    let module = Module::new(Location::unknown(&context));
    if !module.as_operation().verify() {
        return Err(LoweringError::Verify { what: "empty" });
    }
    Ok(module.as_operation().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_module_verifies_and_prints() {
        let text = mlir_version_check().expect("MLIR works");
        assert!(text.starts_with("module"), "unexpected module text: {text}");
    }
}
