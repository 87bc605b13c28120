//! Helpers shared by the test modules.

use kernel_ir::{Array, KernelErrors, VerifiedKernel};
use kernels::tooling::check::Tolerance;
use kernels::tooling::paths::run_paths;
use proptest::prelude::*;
use runtime::backend::Backend;

/// Fails unless every backend (interpreter, native JIT, PJRT decomposed,
/// PJRT FFI call) ran `kernel` on `args` and matched every output's
/// reference within its tolerance (the last tolerance repeats).
pub fn all_paths(
    kernel: Result<VerifiedKernel, KernelErrors>,
    args: &[Array],
    wants: Vec<Vec<f64>>,
    tols: &[Tolerance],
) -> Result<(), TestCaseError> {
    let kernel = kernel.map_err(|e| TestCaseError::fail(e.to_string()))?;
    let reports = run_paths(&kernel, args, &Backend::ALL, &wants, tols);
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| !r.passes())
        .map(|r| r.to_string())
        .collect();
    prop_assert!(
        failed.is_empty(),
        "kernel `{}`:\n{}",
        kernel.name,
        failed.join("\n")
    );
    prop_assert_eq!(reports.len(), 4);
    Ok(())
}
