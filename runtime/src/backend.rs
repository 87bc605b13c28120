//! One kernel, every CPU path.
//!
//! A verified kernel runs four ways on this machine, and they must agree:
//!
//! | [`Backend`] | what runs |
//! |---|---|
//! | `interp` | the reference interpreter ([`kernel_ir::interpret`]) |
//! | `jit` | the native JIT ([`lowering::HostKernel`]) called directly |
//! | `pjrt-decomposed` | the decomposed StableHLO ([`lowering::decomposed`]) on the PJRT CPU plugin |
//! | `pjrt-ffi` | a StableHLO module calling the native kernel through the FFI handler ([`crate::host_call`]) on the PJRT CPU plugin |
//! | `triton-interp` | the kernel's Triton program ([`lowering::triton()`](fn@lowering::triton)), the one Triton compiles for GPUs, under Triton's interpreter ([`crate::triton`]) |
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! # let args: Vec<kernel_ir::Array> = Vec::new();
//! use runtime::backend::{Backend, Prepared};
//! for b in Backend::ALL {
//!     let outputs = Prepared::new(b, &kernel)?.run(&args)?;
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use kernel_ir::{Array, KernelError, VerifiedKernel};
use lowering::{HostKernel, LoweringError};

use crate::host_call::{self, HostCallError};
use crate::pjrt::{Buffer, Client, CompileOptions, Executable, PjrtError};

/// A way to run a kernel on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The reference interpreter.
    Interpreter,
    /// The native JIT, called directly.
    Native,
    /// Decomposed StableHLO on the PJRT CPU plugin.
    Decomposed,
    /// The native kernel as an FFI custom call on the PJRT CPU plugin.
    HostCall,
    /// The GPU program (Triton) under Triton's interpreter.
    TritonInterp,
}

impl Backend {
    /// Every backend, in the order reports list them.
    pub const ALL: [Backend; 5] = [
        Backend::Interpreter,
        Backend::Native,
        Backend::Decomposed,
        Backend::HostCall,
        Backend::TritonInterp,
    ];

    /// The name the CLI and reports use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Interpreter => "interp",
            Backend::Native => "jit",
            Backend::Decomposed => "pjrt-decomposed",
            Backend::HostCall => "pjrt-ffi",
            Backend::TritonInterp => "triton-interp",
        }
    }
}

/// What a path does with an f32 subnormal (a magnitude below 2^-126, the
/// smallest normal f32; bf16 shares f32's exponent range) in arithmetic.
/// The policy each path follows, measured (`y / (x + x)` at x = 1e-40, y
/// = 1e-30: 5e9 where subnormals are kept, inf where they are flushed):
///
/// | path | subnormals | why |
/// |---|---|---|
/// | `interp` | kept | IEEE arithmetic in f64, rounded to f32 |
/// | `jit` | kept | LLVM's default FP environment on the calling threads |
/// | `pjrt-decomposed` | flushed | XLA's CPU runtime sets flush-to-zero and denormals-are-zero while it runs a program (`--xla_cpu_ftz=false` changes only its code generation: still inf) |
/// | `pjrt-ffi` | flushed | the native kernel runs inside XLA's program, in its FP environment |
/// | `triton-interp` | kept | NumPy's IEEE arithmetic |
///
/// The targets themselves are not measured here (no TPU, and a GPU only
/// in some sessions): a TPU is expected to flush f32 subnormals as XLA's
/// CPU backend does, so the flushing paths are the TPU's answer; a
/// program that must see subnormals checks it on the chip. A comparison
/// of two paths of different policies may differ at such magnitudes and
/// nowhere else: `tessera diff` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subnormals {
    /// Subnormal inputs and results take part as IEEE 754 says.
    Kept,
    /// Subnormal inputs read as zero and subnormal results become zero
    /// (sign kept).
    Flushed,
}

impl Subnormals {
    /// `kept` or `flushed`.
    pub fn name(self) -> &'static str {
        match self {
            Subnormals::Kept => "kept",
            Subnormals::Flushed => "flushed",
        }
    }
}

impl Backend {
    /// What this path does with f32 subnormals ([`Subnormals`]).
    pub fn subnormals(self) -> Subnormals {
        match self {
            Backend::Interpreter | Backend::Native | Backend::TritonInterp => Subnormals::Kept,
            Backend::Decomposed | Backend::HostCall => Subnormals::Flushed,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown backend `{s}`; expected one of {}",
                    Backend::ALL.map(Backend::name).join(", ")
                )
            })
    }
}

/// Why a backend could not run a kernel.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The interpreter rejected the run.
    #[error(transparent)]
    Kernel(Box<KernelError>),
    /// Lowering or the native kernel failed.
    #[error(transparent)]
    Lowering(#[from] LoweringError),
    /// PJRT failed.
    #[error(transparent)]
    Pjrt(#[from] PjrtError),
    /// Arrays that do not fit the kernel (the shared check).
    #[error(transparent)]
    Arguments(Box<kernel_ir::ArgumentError>),
    /// Triton (its interpreter, or finding it) failed.
    #[error(transparent)]
    Triton(#[from] crate::triton::TritonError),
}

/// A grid larger than `backend` runs in bounded time is refused before
/// anything compiles (the interpreter checks its own limit as it runs).
fn check_steps(backend: Backend, kernel: &VerifiedKernel) -> Result<(), LoweringError> {
    use kernel_ir::limits::{MAX_CPU_STEPS, MAX_TRITON_INTERP_STEPS};
    let (limit, name) = match backend {
        Backend::Interpreter => return Ok(()),
        Backend::TritonInterp => (MAX_TRITON_INTERP_STEPS, "MAX_TRITON_INTERP_STEPS"),
        Backend::Native | Backend::Decomposed | Backend::HostCall => {
            (MAX_CPU_STEPS, "MAX_CPU_STEPS")
        }
    };
    let steps = kernel.grid.steps() as u64;
    if steps <= limit {
        return Ok(());
    }
    Err(LoweringError::Unsupported {
        op: "grid".into(),
        loc: kernel.grid_loc.clone(),
        target: backend.name(),
        reason: format!(
            "[limit] the grid has {steps} steps, more than this path runs in bounded time ({limit}, kernel_ir::limits::{name}); run a smaller problem on the CPU, or compile it for the TPU or a GPU (`tessera compile`)"
        ),
    })
}

impl From<KernelError> for BackendError {
    fn from(e: KernelError) -> Self {
        BackendError::Kernel(Box::new(e))
    }
}

impl From<HostCallError> for BackendError {
    fn from(e: HostCallError) -> Self {
        match e {
            HostCallError::Lowering(e) => BackendError::Lowering(e),
            HostCallError::Pjrt(e) => BackendError::Pjrt(e),
        }
    }
}

/// The process's one-device CPU client, created on first use.
pub fn cpu_client() -> Result<&'static Client, PjrtError> {
    static CLIENT: OnceLock<Result<Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| Client::cpu(1).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| PjrtError::Usage(e.clone()))
}

/// A kernel compiled for one backend, ready to run many times.
pub enum Prepared {
    /// The interpreter needs no compilation.
    Interpreter(VerifiedKernel),
    /// A native kernel.
    Native(Arc<HostKernel>),
    /// A PJRT executable (decomposed or FFI call).
    Pjrt {
        /// Which of the two.
        backend: Backend,
        /// The compiled program.
        executable: Executable,
        /// The client it runs on.
        client: &'static Client,
        /// The kernel it runs (`None` for a module that is no Tessera
        /// kernel, a baseline): [`Prepared::run`] makes the shared argument
        /// check against it, and checks the blocks scalar prefetch picks
        /// where the path itself does not.
        kernel: Option<VerifiedKernel>,
    },
    /// A Triton program for Triton's interpreter.
    Triton {
        /// The kernel it runs.
        kernel: VerifiedKernel,
        /// Its program.
        program: Box<lowering::TritonProgram>,
    },
}

impl Prepared {
    /// Compiles `kernel` for `backend` (native kernels are compiled once
    /// per process and shared).
    pub fn new(backend: Backend, kernel: &VerifiedKernel) -> Result<Prepared, BackendError> {
        check_steps(backend, kernel)?;
        Ok(match backend {
            Backend::Interpreter => Prepared::Interpreter(kernel.clone()),
            Backend::Native => {
                let key = host_call::register_kernel(kernel)?;
                let k = host_call::registered(&key).ok_or_else(|| {
                    LoweringError::Internal(format!("kernel `{key}` vanished from the registry"))
                })?;
                Prepared::Native(k)
            }
            Backend::Decomposed => {
                let client = cpu_client()?;
                let module = lowering::decomposed(kernel)?;
                let executable = client.compile(module.as_bytes(), &CompileOptions::default())?;
                Prepared::Pjrt {
                    backend,
                    executable,
                    client,
                    kernel: Some(kernel.clone()),
                }
            }
            Backend::TritonInterp => Prepared::Triton {
                kernel: kernel.clone(),
                program: Box::new(lowering::triton(kernel)?),
            },
            Backend::HostCall => {
                let client = cpu_client()?;
                let module = host_call::host_call_module(client.plugin(), kernel)?;
                let executable = client.compile(module.as_bytes(), &CompileOptions::default())?;
                Prepared::Pjrt {
                    backend,
                    executable,
                    client,
                    kernel: Some(kernel.clone()),
                }
            }
        })
    }

    /// The backend it was compiled for.
    pub fn backend(&self) -> Backend {
        match self {
            Prepared::Interpreter(_) => Backend::Interpreter,
            Prepared::Native(_) => Backend::Native,
            Prepared::Pjrt { backend, .. } => *backend,
            Prepared::Triton { .. } => Backend::TritonInterp,
        }
    }

    /// Runs on host arrays (scalar prefetch, then inputs; as
    /// [`kernel_ir::interpret`]) and returns the outputs.
    pub fn run(&self, args: &[Array]) -> Result<Vec<Array>, BackendError> {
        match self {
            Prepared::Interpreter(k) => Ok(kernel_ir::interpret(k, args)?),
            Prepared::Native(k) => Ok(k.run(args)?),
            Prepared::Triton { kernel, program } => {
                kernel
                    .check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
                    .map_err(|e| BackendError::Arguments(Box::new(e)))?;
                if !kernel.prefetch.is_empty() {
                    // The program reads blocks where scalar prefetch points
                    // and cannot stop at a bad one: the same error as on
                    // the other paths, before it runs.
                    kernel.check_block_indices(&args[..kernel.prefetch.len()])?;
                }
                Ok(crate::triton::interpret(kernel, program, args)?)
            }
            Prepared::Pjrt {
                backend,
                executable,
                kernel,
                ..
            } => {
                if let Some(k) = kernel {
                    k.check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
                        .map_err(|e| BackendError::Arguments(Box::new(e)))?;
                    // Out-of-range scalar-prefetch indices are the same
                    // error here as on the interpreter and native paths:
                    // decomposed StableHLO would clamp them silently (the
                    // FFI handler runs the native driver, which checks).
                    if *backend == Backend::Decomposed && !k.prefetch.is_empty() {
                        k.check_block_indices(&args[..k.prefetch.len()])?;
                    }
                }
                let bufs = self.upload(args)?;
                let refs: Vec<&Buffer> = bufs.iter().collect();
                let outs = executable.execute(&refs)?;
                outs.iter()
                    .map(|b| b.to_host().map_err(BackendError::from))
                    .collect()
            }
        }
    }

    /// For PJRT backends: the arguments as device buffers (for timing
    /// execution alone with [`Prepared::execute`]).
    pub fn upload(&self, args: &[Array]) -> Result<Vec<Buffer>, BackendError> {
        match self {
            Prepared::Pjrt { client, .. } => Ok(args
                .iter()
                .map(|a| client.upload(a, 0))
                .collect::<Result<_, _>>()?),
            _ => Err(PjrtError::Usage(format!("{} has no device buffers", self.backend())).into()),
        }
    }

    /// For PJRT backends: runs on device buffers, leaving results there.
    pub fn execute(&self, args: &[Buffer]) -> Result<Vec<Buffer>, BackendError> {
        let refs: Vec<&Buffer> = args.iter().collect();
        self.execute_refs(&refs)
    }

    /// [`Prepared::execute`] on borrowed buffers.
    pub fn execute_refs(&self, args: &[&Buffer]) -> Result<Vec<Buffer>, BackendError> {
        match self {
            Prepared::Pjrt { executable, .. } => Ok(executable.execute(args)?),
            _ => Err(PjrtError::Usage(format!("{} has no device buffers", self.backend())).into()),
        }
    }
}

/// Compiles and runs `kernel` on `backend` once.
pub fn run(
    backend: Backend,
    kernel: &VerifiedKernel,
    args: &[Array],
) -> Result<Vec<Array>, BackendError> {
    Prepared::new(backend, kernel)?.run(args)
}
