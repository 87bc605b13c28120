//! The TPU compiler in the loop, compile-only.
//!
//! `libtpu.so` (the `libtpu` wheel on PyPI) is the whole TPU compiler,
//! Mosaic included, as a PJRT plugin. On a machine with no TPU it still
//! compiles: a *topology description* names the slice to compile for
//! (`PJRT_TopologyDescription_Create`), and `PJRT_Compile` compiles a
//! StableHLO module against it with no client and no devices. Mosaic and
//! the TPU back end run exactly as on a TPU host and reject a kernel with
//! the same errors; nothing runs. The result reports the compiler's memory
//! stats and cost analysis and serializes to an ahead-of-time artifact a
//! TPU host can load.
//!
//! What libtpu needs without a TPU attached, set automatically before it is
//! loaded (each only when the variable is not already set):
//!
//! * `TPU_SKIP_MDS_QUERY=1`: do not ask the cloud metadata server what
//!   machine this is (without it, loading takes ten minutes of retries);
//! * `TPU_WORKER_HOSTNAMES=localhost`: a single-host "slice";
//! * `ALLOW_MULTIPLE_LIBTPU_LOAD=1`: libtpu otherwise takes
//!   `/tmp/libtpu_lockfile` so that one process at a time owns the TPU,
//!   and a second process (a test, a parallel `tessera compile`) fails to
//!   load; with no TPU there is nothing to own.
//!
//! libtpu's set-up warnings go to a captured log (see
//! [`runtime::plugin_log`]); `TESSERA_PLUGIN_LOG=1` shows them.
//!
//! ```no_run
//! use kernel_ir::{Target, VerifiedKernel};
//! use libtpu::TpuCompiler;
//!
//! let tpu = TpuCompiler::load()?;
//! let module = std::fs::read_to_string("add.mlir")?;
//! let compiled = tpu.compile(Target::V6e, &module)?;
//! println!("{} bytes of code", compiled.code_bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod child;
mod diagnostic;
pub mod estimate;

pub use diagnostic::CompilerDiagnostic;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kernel_ir::{Target, VerifiedKernel};

use runtime::pjrt::{CompileOptions, CompiledMemoryStats, PjrtError, Plugin, Topology};
use runtime::plugin::cache_dir;

/// Environment variable naming the `libtpu.so` to use.
pub const LIBTPU_ENV: &str = "TESSERA_LIBTPU";

/// The libtpu version `.ci/setup.sh` installs (the one jax 0.11.2 pins).
pub const LIBTPU_VERSION: &str = "0.0.48.1";

/// Where `.ci/setup.sh` unpacks `libtpu.so`, under the cache folder.
pub const LIBTPU_SUBPATH: &str = "libtpu/0.0.48.1/libtpu.so";

/// The topology libtpu compiles `target` for: the smallest slice name it
/// accepts for that generation (single-chip names such as `v5e:1x1` are
/// rejected). A kernel compiles for one core of it.
pub fn topology_name(target: Target) -> &'static str {
    match target {
        Target::V5e => "v5e:2x2",
        Target::V6e => "v6e:2x2",
        Target::V5p => "v5p:2x2x1",
        Target::V7x => "tpu7x:2x2x1",
    }
}

/// Why a TPU compile did not happen or did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TpuError {
    /// No `libtpu.so` where it was looked for.
    #[error(
        "no libtpu at {path} ({why}); run .ci/setup.sh to fetch libtpu {LIBTPU_VERSION}, or set {LIBTPU_ENV} to a libtpu.so"
    )]
    NotInstalled {
        /// The path looked at.
        path: PathBuf,
        /// Where the path came from.
        why: &'static str,
    },
    /// libtpu is there but could not be loaded or set up.
    #[error("libtpu at {path} could not be loaded: {source}{}", log_tail(.log))]
    Load {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: PjrtError,
        /// What libtpu logged while loading.
        log: String,
    },
    /// The topology for a generation could not be created.
    #[error("libtpu could not create the {target} topology `{name}`: {source}")]
    Topology {
        /// The generation.
        target: Target,
        /// The topology name asked for.
        name: &'static str,
        /// What failed.
        source: PjrtError,
    },
    /// The TPU compiler rejected the module.
    #[error("{target}: {diagnostic}")]
    Compile {
        /// The generation compiled for.
        target: Target,
        /// The compiler's message, taken apart.
        diagnostic: CompilerDiagnostic,
    },
    /// The compile succeeded but a query of its result failed.
    #[error("{target}: {source}")]
    Query {
        /// The generation compiled for.
        target: Target,
        /// What failed.
        source: PjrtError,
    },
}

fn log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(5)..];
    format!("\nlibtpu logged:\n  {}", tail.join("\n  "))
}

/// The `libtpu.so` to use: `$TESSERA_LIBTPU` if set, else the one in the
/// cache folder. Errors name the fix.
pub fn locate_libtpu() -> Result<PathBuf, TpuError> {
    let (path, why) = match std::env::var_os(LIBTPU_ENV) {
        Some(p) => (PathBuf::from(p), "from $TESSERA_LIBTPU"),
        None => (cache_dir().join(LIBTPU_SUBPATH), "the default libtpu path"),
    };
    if !path.is_file() {
        return Err(TpuError::NotInstalled { path, why });
    }
    if std::env::var_os(LIBTPU_ENV).is_none() {
        runtime::plugin::check_trusted(&path, &cache_dir()).map_err(|e| TpuError::Load {
            path: path.clone(),
            source: e.into(),
            log: String::new(),
        })?;
    }
    Ok(path)
}

/// A kernel module compiled for one TPU generation.
#[derive(Debug)]
pub struct TpuCompiled {
    /// The generation.
    pub target: Target,
    /// The topology it was compiled against.
    pub topology: &'static str,
    /// Wall time of the compile.
    pub compile_time: Duration,
    /// Size of the generated code.
    pub code_bytes: i64,
    /// Device memory the program needs, as the compiler reports it.
    pub memory: CompiledMemoryStats,
    /// The compiler's cost analysis (`flops`, `bytes accessed`, ...).
    pub cost: Vec<(String, f64)>,
    executable: runtime::pjrt::UnloadedExecutable,
}

impl TpuCompiled {
    /// The compiled program as bytes: an ahead-of-time artifact a TPU host
    /// with the same libtpu version can load.
    pub fn serialize(&self) -> Result<Vec<u8>, TpuError> {
        self.executable
            .serialize()
            .map_err(|source| TpuError::Query {
                target: self.target,
                source,
            })
    }

    /// One cost-analysis property by name.
    pub fn cost(&self, name: &str) -> Option<f64> {
        self.cost.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// libtpu loaded as a PJRT plugin, with a topology per generation created
/// on first use. Cheap to share: compiles may run on many threads at once.
pub struct TpuCompiler {
    plugin: Arc<Plugin>,
    topologies: Mutex<HashMap<Target, Arc<Topology>>>,
}

impl std::fmt::Debug for TpuCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TpuCompiler({})", self.plugin.path.display())
    }
}

impl TpuCompiler {
    /// The compiler at the default place (see [`locate_libtpu`]), loaded
    /// once per process.
    pub fn load() -> Result<Arc<TpuCompiler>, TpuError> {
        static DEFAULT: OnceLock<Mutex<Option<Arc<TpuCompiler>>>> = OnceLock::new();
        let slot = DEFAULT.get_or_init(|| Mutex::new(None));
        let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = Arc::new(TpuCompiler::load_from(&locate_libtpu()?)?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The compiler in the `libtpu.so` at `path`.
    pub fn load_from(path: &Path) -> Result<TpuCompiler, TpuError> {
        compile_only_environment();
        let (plugin, log) = runtime::plugin_log::capture_stderr(|| Plugin::load(path));
        let plugin = plugin.map_err(|source| TpuError::Load {
            path: path.to_path_buf(),
            source,
            log,
        })?;
        Ok(TpuCompiler {
            plugin,
            topologies: Mutex::new(HashMap::new()),
        })
    }

    /// The plugin's path.
    pub fn path(&self) -> &Path {
        &self.plugin.path
    }

    /// The topology Tessera compiles `target` for.
    pub fn topology(&self, target: Target) -> Result<Arc<Topology>, TpuError> {
        let mut all = self.topologies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = all.get(&target) {
            return Ok(t.clone());
        }
        let name = topology_name(target);
        let (t, _log) =
            runtime::plugin_log::capture_stderr(|| Topology::new(self.plugin.clone(), name));
        let t = Arc::new(t.map_err(|source| TpuError::Topology {
            target,
            name,
            source,
        })?);
        all.insert(target, t.clone());
        Ok(t)
    }

    /// Compiles a StableHLO module (text or bytecode) for `target`.
    pub fn compile(&self, target: Target, module: &str) -> Result<TpuCompiled, TpuError> {
        let topology = self.topology(target)?;
        let start = Instant::now();
        let exe = topology
            .compile(module.as_bytes(), &CompileOptions::of_module(module))
            .map_err(|e| match e {
                PjrtError::Plugin { message, code, .. } => TpuError::Compile {
                    target,
                    diagnostic: CompilerDiagnostic::parse(&message, code),
                },
                other => TpuError::Query {
                    target,
                    source: other,
                },
            })?;
        let compile_time = start.elapsed();
        let query = |source| TpuError::Query { target, source };
        Ok(TpuCompiled {
            target,
            topology: topology_name(target),
            compile_time,
            code_bytes: exe.code_size().map_err(query)?,
            memory: exe.memory_stats().map_err(query)?,
            cost: exe.cost_analysis().map_err(query)?,
            executable: exe,
        })
    }
}

/// A kernel compiled for one generation: what was compiled and what the
/// compiler said.
#[derive(Debug)]
pub struct KernelCompile {
    /// The kernel, verified again for the generation.
    pub kernel: VerifiedKernel,
    /// The `tpu_custom_call` module that was compiled.
    pub lowered: lowering::TpuCustomCall,
    /// The compiled program.
    pub compiled: TpuCompiled,
}

/// Why a kernel did not compile for a generation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelCompileError {
    /// The kernel breaks a rule of that generation (its VMEM, say).
    #[error("{target}: the kernel does not verify for this generation: {errors}")]
    Verify {
        /// The generation.
        target: Target,
        /// What the verifier found.
        errors: kernel_ir::KernelErrors,
    },
    /// Tessera could not lower it.
    #[error("{target}: {source}")]
    Lowering {
        /// The generation.
        target: Target,
        /// What failed.
        source: lowering::LoweringError,
    },
    /// The TPU compiler (or loading it) failed.
    #[error(transparent)]
    Tpu(#[from] TpuError),
}

impl TpuCompiler {
    /// Builds `kernel` for `target` (its `target` set to that generation and
    /// verified again, so that generation's VMEM and rules apply), lowers it
    /// to a `tpu_custom_call` module and compiles that against the
    /// generation's topology.
    pub fn compile_kernel(
        &self,
        kernel: &VerifiedKernel,
        target: Target,
    ) -> Result<KernelCompile, KernelCompileError> {
        let (kernel, lowered) = lower_for(kernel, target)?;
        let compiled = self.compile(target, &lowered.module)?;
        Ok(KernelCompile {
            kernel,
            lowered,
            compiled,
        })
    }
}

/// `kernel` with its `target` set to `target`, verified again (that
/// generation's VMEM and rules apply) and lowered to its
/// `tpu_custom_call` module: what [`TpuCompiler::compile_kernel`] and the
/// schedule estimate compile.
pub fn lower_for(
    kernel: &VerifiedKernel,
    target: Target,
) -> Result<(VerifiedKernel, lowering::TpuCustomCall), KernelCompileError> {
    let mut k = kernel.kernel().clone();
    k.target = target;
    k.platform = kernel_ir::Platform::Tpu;
    let kernel = k
        .verify()
        .map_err(|errors| KernelCompileError::Verify { target, errors })?;
    let lowered = lowering::tpu_custom_call(&kernel)
        .map_err(|source| KernelCompileError::Lowering { target, source })?;
    Ok((kernel, lowered))
}

/// Sets what libtpu needs to start without a TPU, where the user has not
/// set it.
fn compile_only_environment() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        for (key, value) in [
            ("TPU_SKIP_MDS_QUERY", "1"),
            ("TPU_WORKER_HOSTNAMES", "localhost"),
            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        ] {
            if std::env::var_os(key).is_none() {
                // SAFETY: runs once, before libtpu is loaded; Rust's own
                // environment access is serialized by std. libtpu reads
                // these with getenv while it initializes, after this.
                unsafe { std::env::set_var(key, value) };
            }
        }
    });
}

#[cfg(test)]
mod tests;
