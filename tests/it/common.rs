//! Helpers shared by the test modules.

use kernel_ir::{Array, KernelErrors, VerifiedKernel};
use kernels::check::Tolerance;
use proptest::prelude::*;

/// Fails unless every backend (interpreter, native JIT, PJRT decomposed,
/// PJRT FFI call, Triton's interpreter) ran `kernel` on `args` and matched every output's
/// reference within its tolerance (the last tolerance repeats): the
/// public [`tessera_testing::check_every_path`], as a kernel author's
/// crate calls it.
pub fn all_paths(
    kernel: Result<VerifiedKernel, KernelErrors>,
    args: &[Array],
    wants: Vec<Vec<f64>>,
    tols: &[Tolerance],
) -> Result<(), TestCaseError> {
    let kernel = kernel.map_err(|e| TestCaseError::fail(e.to_string()))?;
    let report = tessera_testing::check_every_path(&kernel, args, &wants, tols)?;
    prop_assert_eq!(report.paths.len(), runtime::backend::Backend::ALL.len());
    Ok(())
}

/// A runtime on the CPU plugin without the disk cache, so tests that count
/// compiles start cold.
pub fn fresh_runtime() -> graph::Runtime {
    graph::Runtime::new(graph::RuntimeOptions {
        disk_cache: false,
        ..Default::default()
    })
    .unwrap()
}

/// `Err` naming the first element of `got` outside `abs + rel·|want|` of
/// `want` (NaN always is), or a length mismatch.
pub fn within(got: &[f64], want: &[f64], abs: f64, rel: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} values, want {}", got.len(), want.len()));
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = (g - w).abs();
        if e.is_nan() || e > abs + rel * w.abs() {
            return Err(format!("element {i}: got {g}, want {w} (|err| {e:.3e})"));
        }
    }
    Ok(())
}
