//! Helpers shared by the test modules.

use kernel_ir::{Array, KernelErrors, VerifiedKernel};
use kernels::check::Tolerance;
use proptest::prelude::*;
use runtime::backend::Backend;
use tooling::paths::run_paths;

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

/// A runtime on the CPU plugin without the disk cache, so tests that count
/// compiles start cold.
pub fn fresh_runtime() -> runtime::graph::Runtime {
    runtime::graph::Runtime::new(runtime::graph::RuntimeOptions {
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

/// Pins `$text` as the snapshot `$name` of one target: each target's
/// snapshots sit in one folder, `tests/it/snapshots/<folder>/<name>.snap`
/// (review changes with `cargo insta review`).
macro_rules! snapshot_in {
    ($folder:literal, $name:expr, $text:expr) => {
        insta::with_settings!({
            snapshot_path => concat!("snapshots/", $folder),
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($name, $text);
        })
    };
}
pub(crate) use snapshot_in;
