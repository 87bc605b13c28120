//! Running one kernel on every CPU path and comparing each with the f64
//! reference: what the tests assert and what `tessera demo` prints.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use kernels::check::Tolerance;
//! use tooling::paths::{PathReport, run_paths};
//! use runtime::backend::Backend;
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! # let (x, y): (kernel_ir::Array, kernel_ir::Array) = unimplemented!();
//! let want = kernels::reference::add(&x, &y);
//! let reports = run_paths(&kernel, &[x, y], &Backend::ALL, &[want], &[Tolerance::for_dtype(kernel_ir::DType::F32)]);
//! assert!(reports.iter().all(PathReport::passes));
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::{Duration, Instant};

use kernel_ir::{Array, VerifiedKernel};
use lowering::LoweringError;
use runtime::backend::{Backend, BackendError, Prepared};

use kernels::check::{ErrorStats, Tolerance};

/// Why a path gave no comparison.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// The backend could not prepare or run the kernel.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The run gave another number of outputs than there are references.
    #[error("{outputs} outputs, {references} references")]
    Outputs {
        /// Outputs the run gave.
        outputs: usize,
        /// References given.
        references: usize,
    },
}

/// One backend's run of one kernel.
#[derive(Debug)]
pub struct PathReport {
    /// The backend.
    pub backend: Backend,
    /// Each output's error against its reference, or why the run failed.
    pub result: Result<Vec<ErrorStats>, PathError>,
    /// Time to compile (JIT, or PJRT compile); zero for the interpreter.
    pub compile: Duration,
    /// Time of one run, including host↔device copies for PJRT.
    pub run: Duration,
    /// The path does not take this kernel by a documented rule of its
    /// target (the GPU target's `[gpu]` rules,
    /// [`kernel_ir::VerifiedKernel::check_gpu`]): the rule broken. Not a
    /// failure; every other error is.
    pub refused: Option<String>,
}

impl PathReport {
    /// True when the run succeeded and every output is within tolerance,
    /// or the path's target refuses the kernel by rule.
    pub fn passes(&self) -> bool {
        self.refused.is_some()
            || self
                .result
                .as_ref()
                .is_ok_and(|s| s.iter().all(ErrorStats::passes))
    }
}

impl fmt::Display for PathReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.result {
            Ok(stats) => {
                for (i, s) in stats.iter().enumerate() {
                    if i > 0 {
                        writeln!(f)?;
                    }
                    write!(
                        f,
                        "{}: output {i}: {s} ({})",
                        self.backend,
                        if s.passes() { "ok" } else { "MISMATCH" }
                    )?;
                }
                Ok(())
            }
            Err(e) if self.refused.is_some() => {
                write!(f, "{}: refused by its target's rules: {e}", self.backend)
            }
            Err(e) => write!(f, "{}: error: {e}", self.backend),
        }
    }
}

/// Runs `kernel` on each backend with `args` and compares output `i` with
/// `reference[i]` under `tol[i]` (the last tolerance repeats).
pub fn run_paths(
    kernel: &VerifiedKernel,
    args: &[Array],
    backends: &[Backend],
    reference: &[Vec<f64>],
    tol: &[Tolerance],
) -> Vec<PathReport> {
    backends
        .iter()
        .map(|&backend| {
            let t = Instant::now();
            let prepared = Prepared::new(backend, kernel);
            let compile = t.elapsed();
            let refused = match &prepared {
                Err(BackendError::Lowering(e @ LoweringError::Refused(_))) => Some(e.to_string()),
                _ => None,
            };
            let t = Instant::now();
            let outputs = prepared.and_then(|p| p.run(args));
            let run = t.elapsed();
            let result = outputs.map_err(PathError::from).and_then(|outs| {
                if outs.len() != reference.len() {
                    return Err(PathError::Outputs {
                        outputs: outs.len(),
                        references: reference.len(),
                    });
                }
                Ok(outs
                    .iter()
                    .zip(reference)
                    .enumerate()
                    .map(|(i, (o, r))| {
                        let t = tol
                            .get(i)
                            .or(tol.last())
                            .copied()
                            .unwrap_or(Tolerance::for_dtype(o.dtype()));
                        ErrorStats::between(o, r, t)
                    })
                    .collect())
            });
            PathReport {
                backend,
                result,
                compile: if backend == Backend::Interpreter {
                    Duration::ZERO
                } else {
                    compile
                },
                run,
                refused,
            }
        })
        .collect()
}
