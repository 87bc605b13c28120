//! Testing a kernel in its author's own crate, as Tessera tests its own:
//!
//! * [`check_every_path`]: the kernel on every CPU path (the reference
//!   interpreter, the native JIT, PJRT decomposed StableHLO, PJRT calling
//!   the JIT through XLA's FFI) against an f64 reference, each output
//!   under a [`Tolerance`] (per dtype by default), reporting max abs and
//!   relative error and NaN counts per path; a [`Mismatch`] names the
//!   kernel, the input shapes and the failing paths, and turns into a
//!   proptest failure with `?`, so shapes shrink to a minimal one;
//! * [`assert_lowered_snapshots!`]: the printed IR and each lowering
//!   target pinned by [`insta`], one folder per target, stable names;
//! * [`check_refused_on_every_path`]: bad arguments are an error on
//!   every path, for the caller to check each message;
//! * [`compile_for_tpu`]: libtpu (the TPU compiler, compile-only) takes the
//!   kernel for chosen generations, failing with the fix when libtpu is
//!   missing;
//! * [`estimate_for_tpu`]: libtpu's static schedule estimate of the kernel
//!   on a generation, judged by the guards against its blind spots, from a
//!   child process of the test binary ([`tpu_child!`]).
//!
//! ```no_run
//! use kernel_ir::{Array, DType};
//! use tessera_testing::{check_every_path, Tolerance};
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! let x = Array::random(DType::F32, [8, 128], 1, -1.0, 1.0);
//! let y = Array::random(DType::F32, [8, 128], 2, -1.0, 1.0);
//! let want = vec![x.data().iter().zip(y.data()).map(|(a, b)| a + b).collect()];
//! let report = check_every_path(&kernel, &[x, y], &want, &[]).unwrap();
//! println!("{report}"); // per path and output: max abs, max rel, NaN count
//! ```
//!
//! `proptest` and `insta` are re-exported, so a kernel crate needs only
//! this crate among its dev-dependencies.

use std::fmt;

use kernel_ir::{Array, Target, VerifiedKernel};
use runtime::backend::Backend;
use tooling::paths::{PathReport, run_paths};

pub use insta;
pub use kernels::check::{ErrorStats, Tolerance};
pub use proptest;

/// Every CPU path one kernel ran on, with each output's error.
#[derive(Debug)]
pub struct Report {
    /// The kernel's name.
    pub kernel: String,
    /// The input shapes it ran at.
    pub shapes: Vec<Vec<usize>>,
    /// One report per path, in [`Backend::ALL`] order.
    pub paths: Vec<PathReport>,
}

impl Report {
    /// True when every path ran and matched every output.
    pub fn passes(&self) -> bool {
        self.paths.iter().all(PathReport::passes)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel `{}` at input shapes {:?}:",
            self.kernel, self.shapes
        )?;
        for p in &self.paths {
            let mark = if p.passes() { "ok" } else { "FAILED" };
            for line in p.to_string().lines() {
                writeln!(f, "  {line} [{mark}]")?;
            }
        }
        Ok(())
    }
}

/// A kernel that failed on some path: the whole report, the failing
/// paths first in its text.
#[derive(Debug)]
pub struct Mismatch(pub Report);

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failing: Vec<String> = self
            .0
            .paths
            .iter()
            .filter(|p| !p.passes())
            .map(|p| p.backend.to_string())
            .collect();
        writeln!(
            f,
            "kernel `{}` does not match its reference on {} at input shapes {:?}",
            self.0.kernel,
            failing.join(", "),
            self.0.shapes
        )?;
        write!(f, "{}", self.0)
    }
}

/// An error, so `?` turns it into a proptest failure (proptest takes any
/// error) and into a `Box<dyn Error>`.
impl std::error::Error for Mismatch {}

/// Runs `kernel` with `args` (scalar prefetch first, then the inputs, as
/// [`kernel_ir::Kernel::arguments`] lists them) on every CPU path and
/// compares output `i` with `reference[i]` (row-major f64) under
/// `tolerances[i]`; the last tolerance repeats, and with none each output
/// gets [`Tolerance::for_dtype`] of its dtype. NaN never passes.
pub fn check_every_path(
    kernel: &VerifiedKernel,
    args: &[Array],
    reference: &[Vec<f64>],
    tolerances: &[Tolerance],
) -> Result<Report, Mismatch> {
    let report = Report {
        kernel: kernel.name.clone(),
        shapes: args.iter().map(|a| a.shape().to_vec()).collect(),
        paths: run_paths(kernel, args, &Backend::ALL, reference, tolerances),
    };
    if report.passes() {
        Ok(report)
    } else {
        Err(Mismatch(report))
    }
}

/// Runs `kernel` with `args` it must refuse (an out-of-range
/// scalar-prefetch value, a wrong shape): every CPU path has to return an
/// error, since each edge case has one documented answer on every path.
/// Gives each path's message, in [`Backend::ALL`] order, for the caller
/// to check that they name the problem; an `Err` names a path that ran.
///
/// ```no_run
/// # let (kernel, args): (kernel_ir::VerifiedKernel, Vec<kernel_ir::Array>) = unimplemented!();
/// for (path, message) in tessera_testing::check_refused_on_every_path(&kernel, &args).unwrap() {
///     assert!(message.contains("k_pages"), "{path}: {message}");
/// }
/// ```
pub fn check_refused_on_every_path(
    kernel: &VerifiedKernel,
    args: &[Array],
) -> Result<Vec<(Backend, String)>, RanAnyway> {
    Backend::ALL
        .into_iter()
        .map(|b| match runtime::backend::run(b, kernel, args) {
            Ok(_) => Err(RanAnyway {
                kernel: kernel.name.clone(),
                path: b,
                shapes: args.iter().map(|a| a.shape().to_vec()).collect(),
            }),
            Err(e) => Ok((b, e.to_string())),
        })
        .collect()
}

/// A path that ran a kernel with arguments it should have refused
/// ([`check_refused_on_every_path`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}` ran on {path} with arguments it should refuse (shapes {shapes:?})")]
pub struct RanAnyway {
    /// The kernel's name.
    pub kernel: String,
    /// The path that ran it.
    pub path: Backend,
    /// The arguments' shapes.
    pub shapes: Vec<Vec<usize>>,
}

/// The texts [`assert_lowered_snapshots!`] pins, by folder: the printed
/// IR (`ir`), the upstream kernel module (`kernel_module`), the StableHLO
/// calling it through `tpu_custom_call` (`tpu_custom_call`) and the
/// decomposed StableHLO (`decomposed`). An error names the target.
///
/// The custom call carries the Mosaic kernel as base64 bytecode holding
/// the kernel's source lines, which would change the snapshot whenever a
/// line above the kernel moves: its text shows a placeholder there and
/// the Mosaic module printed after it, without locations.
pub fn lowered_texts(kernel: &VerifiedKernel) -> Result<Vec<(&'static str, String)>, LoweredError> {
    use base64::Engine;
    let named = |target: &'static str| {
        move |source: lowering::LoweringError| LoweredError::Lowering { target, source }
    };
    let call = lowering::tpu_custom_call(kernel).map_err(named("tpu_custom_call"))?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&call.serialized_body);
    if !call.module.contains(&b64) {
        return Err(LoweredError::BodyMissing);
    }
    Ok(vec![
        ("ir", kernel.to_string()),
        (
            "kernel_module",
            lowering::kernel_module(kernel).map_err(named("kernel_module"))?,
        ),
        (
            "tpu_custom_call",
            format!(
                "{}\n// ---- the Mosaic kernel module inside backend_config ----\n{}",
                call.module
                    .replace(&b64, "<the Mosaic body below, as bytecode>"),
                call.body
            ),
        ),
        (
            "decomposed",
            lowering::decomposed(kernel).map_err(named("decomposed"))?,
        ),
    ])
}

/// Why [`lowered_texts`] has no text for a kernel.
#[derive(Debug, thiserror::Error)]
pub enum LoweredError {
    /// A target's lowering failed.
    #[error("{target}: {source}")]
    Lowering {
        /// The snapshot folder (target) whose lowering failed.
        target: &'static str,
        /// The lowering's error.
        source: lowering::LoweringError,
    },
    /// The custom call's module does not carry its serialized Mosaic body
    /// (a lowering bug).
    #[error("tpu_custom_call: the module does not carry its serialized body")]
    BodyMissing,
}

/// Pins a kernel's printed IR and its lowering to each target as insta
/// snapshots: `snapshots/<target>/<name>.snap` beside the test file, one
/// folder per target (`ir`, `kernel_module`, `tpu_custom_call`,
/// `decomposed`), so a review (`cargo insta review`) shows one target's
/// changes together. Fails the test on a lowering error.
///
/// ```no_run
/// # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
/// tessera_testing::assert_lowered_snapshots!("my_kernel_f32", &kernel);
/// ```
#[macro_export]
macro_rules! assert_lowered_snapshots {
    ($name:expr, $kernel:expr) => {{
        let texts = $crate::lowered_texts($kernel).unwrap_or_else(|e| panic!("{}: {e}", $name));
        for (folder, text) in texts {
            $crate::assert_snapshot_in!(folder, $name, text);
        }
    }};
}

/// Pins `text` as the snapshot `name` in the folder `snapshots/<folder>`
/// beside the test file (what [`assert_lowered_snapshots!`] does per
/// target).
#[macro_export]
macro_rules! assert_snapshot_in {
    ($folder:expr, $name:expr, $text:expr) => {
        $crate::insta::with_settings!({
            snapshot_path => format!("snapshots/{}", $folder),
            prepend_module_to_snapshot => false,
        }, {
            $crate::insta::assert_snapshot!($name, $text);
        })
    };
}

/// The environment variable that makes the [`tpu_child!`] test serve one
/// libtpu compile.
pub const TPU_CHILD_ENV: &str = "TESSERA_TESTING_TPU_CHILD";

/// The test name [`tpu_child!`] defines: it must sit at the root of the
/// test file (the child is this test binary run with `--exact` on it).
pub const TPU_CHILD_TEST: &str = "tessera_tpu_child";

/// Defines the test through which [`estimate_for_tpu`] runs libtpu in a
/// child process of this test binary (libtpu reads its profiling flags
/// once per process and can abort it). Put it once at the root of a test
/// file that estimates; in a normal run it does nothing.
///
/// ```no_run
/// // At the root of tests/my_kernel.rs:
/// tessera_testing::tpu_child!();
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! tpu_child {
    () => {
        /// Serves one libtpu compile when started by `estimate_for_tpu`.
        #[test]
        fn tessera_tpu_child() {
            $crate::serve_tpu_child();
        }
    };
}

/// The child's side of [`tpu_child!`]: when started for a compile (its
/// environment says so), compiles and exits with the report written;
/// otherwise returns at once.
pub fn serve_tpu_child() {
    if std::env::var_os(TPU_CHILD_ENV).is_none() {
        return;
    }
    // The libtest arguments come first, then TARGET MODULE REPORT.
    let args: Vec<String> = std::env::args().collect();
    let rest = args.len().saturating_sub(3);
    std::process::exit(libtpu::child::serve_child(&args[rest..]));
}

/// libtpu's static schedule estimate of `kernel` on `target` (cycles,
/// seconds where the clock is known) with the guards' verdict on whether
/// to trust it (`trusted()`; prefetch-driven control flow and concurrent
/// DMAs are its known blind spots), for assertions such as "no slower
/// than the previous version". `args` are sample arguments: the kernel's
/// traffic and flops, which the guards compare with, come from running
/// it on the interpreter. The compile runs in a child process of this
/// test binary, so the test file needs [`tpu_child!`] at its root; the
/// error says so when it is missing.
pub fn estimate_for_tpu(
    kernel: &VerifiedKernel,
    args: &[Array],
    target: Target,
) -> Result<tooling::estimate::KernelEstimate, EstimateError> {
    let exe = std::env::current_exe().map_err(EstimateError::NoTestBinary)?;
    let child = libtpu::child::ChildCompiler::new(
        exe,
        [TPU_CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"],
    )
    .with_env(TPU_CHILD_ENV, "1");
    let cost = tooling::cost::cost(kernel, args).map_err(|source| EstimateError::Cost {
        kernel: kernel.name.clone(),
        source,
    })?;
    tooling::estimate::estimate_kernel(&child, kernel, &cost, target).map_err(|source| {
        EstimateError::Estimate {
            kernel: kernel.name.clone(),
            target,
            source: Box::new(source),
        }
    })
}

/// Why [`estimate_for_tpu`] has no estimate.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The running test binary, which serves the compile, cannot be found.
    #[error("cannot find this test binary: {0}")]
    NoTestBinary(std::io::Error),
    /// The kernel did not run on the interpreter with the sample
    /// arguments (their traffic and flops are what the guards compare).
    #[error("`{kernel}`: counting its traffic on the interpreter: {source}")]
    Cost {
        /// The kernel's name.
        kernel: String,
        /// The interpreter's error.
        source: Box<kernel_ir::KernelError>,
    },
    /// Lowering, libtpu or its profiler failed in the child process.
    #[error(
        "`{kernel}` on {target}: {source} (a test file that estimates needs `tessera_testing::tpu_child!();` at its root)"
    )]
    Estimate {
        /// The kernel's name.
        kernel: String,
        /// The generation.
        target: Target,
        /// The child's error.
        source: Box<tooling::estimate::KernelChildError>,
    },
}

/// Compiles `kernel` with libtpu, the TPU compiler (compile-only, no TPU
/// needed), for each of `targets`, with that generation's rules verified
/// again first. The error names the generation and carries the
/// compiler's message (Mosaic's own, with the kernel's source line); when
/// libtpu is missing it says how to get it (`.ci/setup.sh`, or
/// `TESSERA_LIBTPU`).
///
/// The compile runs in this process, as Tessera's own libtpu tests do for
/// known kernels; a kernel that makes libtpu abort ends the test binary
/// (`tessera compile` runs each compile in a child process instead).
pub fn compile_for_tpu(kernel: &VerifiedKernel, targets: &[Target]) -> Result<(), CompileError> {
    let tpu = libtpu::TpuCompiler::load().map_err(CompileError::NoLibtpu)?;
    for &t in targets {
        tpu.compile_kernel(kernel, t)
            .map_err(|e| CompileError::Tpu {
                kernel: kernel.name.to_string(),
                target: t,
                source: Box::new(e),
            })?;
    }
    Ok(())
}

/// Why [`compile_for_tpu`] or [`compile_for_gpu`] failed: each names the
/// kernel and the target, and keeps the compiler's own error.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// libtpu could not be loaded (its message says how to get it).
    #[error("the TPU compile check needs libtpu: {0}")]
    NoLibtpu(libtpu::TpuError),
    /// The kernel does not lower or compile for a TPU generation.
    #[error("`{kernel}` on {target}: {source}")]
    Tpu {
        /// The kernel's name.
        kernel: String,
        /// The generation.
        target: Target,
        /// The lowering's or libtpu's error.
        source: Box<libtpu::KernelCompileError>,
    },
    /// The kernel breaks a GPU target's rules, has no Triton program, or
    /// Triton rejects it or its launch does not fit the target (`target`
    /// is `None` for what holds on every target).
    #[error("`{kernel}`{}: {message}", .target.map(|t| format!(" on {t}")).unwrap_or_default())]
    Gpu {
        /// The kernel's name.
        kernel: String,
        /// The target, where the failure is one target's.
        target: Option<kernel_ir::GpuTarget>,
        /// What failed, with Triton's message (its lines point at the
        /// kernel's Rust source).
        message: String,
    },
}

/// Compiles `kernel` with Triton's compiler (no GPU needed) for each of
/// `targets` (`sm_80`, `sm_90`, `sm_100`, `gfx942`, `gfx950`), in a child
/// process, with the GPU rules verified first and the launch fitted to
/// each target as `tessera compile --gpu` fits it (fewer pipeline stages
/// until shared memory fits, more warps when registers run out). Returns, per target, what
/// the final code says (registers, spills, shared memory, tensor-core
/// instructions) for assertions such as "no spills" or "the dots use
/// tensor cores"; an error names the target and carries Triton's message,
/// whose lines point at the kernel's Rust source. When Triton is missing
/// it says how to get it (`.ci/setup.sh`, or `TESSERA_TRITON_PYTHON`).
///
/// ```no_run
/// use kernel_ir::GpuTarget;
/// # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
/// for s in tessera_testing::compile_for_gpu(&kernel, &[GpuTarget::Sm90, GpuTarget::Gfx942]).unwrap() {
///     assert_eq!(s.spill_bytes, 0);
///     assert!(s.tensor_core_total() > 0);
/// }
/// ```
pub fn compile_for_gpu(
    kernel: &VerifiedKernel,
    targets: &[kernel_ir::GpuTarget],
) -> Result<Vec<runtime::triton::GpuStats>, CompileError> {
    let fail = |target: Option<kernel_ir::GpuTarget>| {
        move |e: &dyn std::fmt::Display| CompileError::Gpu {
            kernel: kernel.name.to_string(),
            target,
            message: e.to_string(),
        }
    };
    for &t in targets {
        kernel.check_gpu(Some(t)).map_err(|e| fail(Some(t))(&e))?;
    }
    let program = lowering::triton(kernel).map_err(|e| fail(None)(&e))?;
    let job = runtime::triton::CompileJob {
        program: &program,
        targets,
        keep: None,
        fit: true,
    };
    let compiled = runtime::triton::compile_many(&[job]).map_err(|e| fail(None)(&e))?;
    compiled
        .into_iter()
        .flatten()
        .map(|c| {
            let stats = c.result.map_err(|e| fail(Some(c.target))(&e))?;
            runtime::triton::check_launchable(c.target, &stats)
                .map_err(|e| fail(Some(c.target))(&e))?;
            Ok(stats)
        })
        .collect()
}
