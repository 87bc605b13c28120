//! Triton in the loop: a kernel's Triton program ([`lowering::triton()`](fn@lowering::triton))
//! compiled for GPUs by Triton's compiler, and run on the CPU by Triton's
//! interpreter, both in child processes of the Python that `.ci/setup.sh`
//! installs Triton into (`<cache>/triton-3.9.0/`, or
//! `$TESSERA_TRITON_PYTHON`).
//!
//! * [`interpret`]: the `triton-interp` path of every kernel: the program,
//!   unchanged, run by `TRITON_INTERPRET=1` on NumPy arrays. A few
//!   long-lived children (one per thread that asks, at most
//!   [`MAX_INTERPRETERS`]) take requests, so a test run pays Python's
//!   start-up once per child, not per kernel.
//! * [`compile`]: Triton's compiler for [`GpuTarget`]s, no GPU needed,
//!   one child per call (a compiler abort ends the child, not the
//!   caller): per target its registers, spills, shared memory, code size
//!   and tensor-core instructions, read from the final code with the tools
//!   the Triton wheel ships (`cuobjdump`; the AMD kernel's metadata).
//!
//! What the Python side adds to Triton is in `runner.py` (its docs): only
//! the glue a caller without PyTorch needs.
//!
//! ```no_run
//! use kernel_ir::GpuTarget;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! let program = lowering::triton(&kernel)?;
//! for c in runtime::triton::compile(&program, &[GpuTarget::Sm90, GpuTarget::Gfx942], None)? {
//!     match c.result {
//!         Ok(s) => println!("{}: {} registers, {} bytes spilled", c.target, s.registers, s.spill_bytes),
//!         Err(e) => println!("{}: {e}", c.target),
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use kernel_ir::{Array, DType, GpuTarget, Kernel};
use lowering::{ParamRole, TritonProgram};

/// The Triton release Tessera's programs are written for and checked with.
pub const TRITON_VERSION: &str = "3.9.0";

/// The environment variable naming the Python to run Triton with.
pub const PYTHON_ENV: &str = "TESSERA_TRITON_PYTHON";

/// When set, [`interpret`] writes each program it runs to this folder
/// (`<function>.py`), for reading one that failed.
pub const KEEP_ENV: &str = "TESSERA_TRITON_KEEP";

/// At most this many interpreter children live at once.
pub const MAX_INTERPRETERS: usize = 4;

// The interpreter's patches first: runner.py calls them (and
// `tessera_torch` ships the same file).
const RUNNER: &str = concat!(
    include_str!("interpreter.py"),
    "\n",
    include_str!("runner.py")
);

/// Why Triton gave no result.
#[derive(Debug, thiserror::Error)]
pub enum TritonError {
    /// No Python with Triton where Tessera looks.
    #[error(
        "Triton is not installed: no {path} ({why}); run .ci/setup.sh, which installs Triton {TRITON_VERSION} there, or set {PYTHON_ENV} to a Python 3.12 with triton=={TRITON_VERSION} and numpy"
    )]
    NotInstalled {
        /// Where it looked.
        path: PathBuf,
        /// Why there.
        why: &'static str,
    },
    /// The child could not be started or talked to.
    #[error("the Triton child process failed: {0}")]
    Child(String),
    /// The interpreter ran the program and it failed.
    #[error("{}Triton's interpreter: {message}", .loc.as_ref().map(|l| format!("{l}: ")).unwrap_or_default())]
    Run {
        /// The Rust location of the program line that failed.
        loc: Option<String>,
        /// What Triton said.
        message: String,
    },
    /// Arrays that do not fit the kernel (the shared check).
    #[error(transparent)]
    Arguments(Box<kernel_ir::ArgumentError>),
    /// The kernel has no Triton program, or Triton rejects it.
    #[error("{0}")]
    Program(String),
}

/// The PJRT platforms that call a kernel's Triton program, each with the
/// GPU target whose Triton IR its custom call carries (the targets the
/// GPU table measures; TTIR is not yet per architecture, XLA lowers it
/// for the GPU at hand).
pub const PLATFORMS: [(&str, GpuTarget); 2] =
    [("cuda", GpuTarget::Sm90), ("rocm", GpuTarget::Gfx942)];

/// The GPU target of `platform` in [`PLATFORMS`], or `None` for a
/// platform that has no Triton call.
pub fn platform_target(platform: &str) -> Option<GpuTarget> {
    PLATFORMS
        .iter()
        .find(|(p, _)| *p == platform)
        .map(|&(_, t)| t)
}

/// A StableHLO module calling `kernel`'s Triton program through XLA's
/// GPU custom call ([`lowering::triton_custom_call`]) with the TTIR
/// Triton's front end makes of it for `target` ([`ttir`]): the `cuda` and
/// `rocm` branches of an exported artifact, and kernel calls of the graph
/// runtime on a GPU plugin.
pub fn custom_call_module(
    kernel: &kernel_ir::VerifiedKernel,
    target: GpuTarget,
) -> Result<String, TritonError> {
    let ir = kernel_ttir(kernel, target)?;
    lowering::triton_custom_call(kernel, &ir).map_err(|e| TritonError::Program(e.to_string()))
}

/// The TTIR Triton's front end makes of `kernel`'s program for `target`
/// ([`ttir`]): what a Triton call carries (`lowering::program::CallForm::Triton`).
pub fn kernel_ttir(
    kernel: &kernel_ir::VerifiedKernel,
    target: GpuTarget,
) -> Result<String, TritonError> {
    let program = lowering::triton(kernel).map_err(|e| TritonError::Program(e.to_string()))?;
    ttir(&program, target)
}

/// The Python that runs Triton: `$TESSERA_TRITON_PYTHON`, else the one
/// `.ci/setup.sh` installs into the cache folder.
pub fn python() -> Result<PathBuf, TritonError> {
    let (path, why) = match std::env::var_os(PYTHON_ENV) {
        Some(p) if !p.is_empty() => (PathBuf::from(p), "from $TESSERA_TRITON_PYTHON"),
        _ => (
            crate::plugin::cache_dir()
                .join(format!("triton-{TRITON_VERSION}"))
                .join("bin")
                .join("python"),
            "the set-up's Triton environment",
        ),
    };
    if !path.is_file() {
        return Err(TritonError::NotInstalled { path, why });
    }
    Ok(path)
}

fn command(python: &Path, mode: &str) -> Command {
    let mut c = Command::new(python);
    c.arg("-c")
        .arg(RUNNER)
        .arg(mode)
        .env("TRITON_DEFAULT_FP_FUSION", "1")
        // The runner chooses interpreting or compiling itself: a caller's
        // TRITON_INTERPRET (set by tessera_torch without a GPU) would
        // turn its compiles into interpretations.
        .env_remove("TRITON_INTERPRET")
        // Triton's own cache would grow with every program compiled.
        .env("TRITON_ALWAYS_COMPILE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

// ---- the interpreter ----

struct Interpreter {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Interpreter {
    fn start() -> Result<Interpreter, TritonError> {
        let python = python()?;
        let mut child = crate::child::spawn_pooled(command(&python, "serve").stderr(Stdio::null()))
            .map_err(|e| TritonError::Child(format!("cannot start {}: {e}", python.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(TritonError::Child("no pipes to the child".into()));
        };
        Ok(Interpreter {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }
}

impl Drop for Interpreter {
    fn drop(&mut self) {
        crate::child::kill_group(&mut self.child);
    }
}

static IDLE: Mutex<Vec<Interpreter>> = Mutex::new(Vec::new());

/// The name PyTorch (and Triton's interpreter) gives a dtype: `float32`,
/// `bfloat16`, `int8`, `float8_e4m3fn`, ...
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::I32 => "int32",
        DType::I8 => "int8",
        DType::Bool => "bool",
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
    }
}

/// A Triton program as JSON, everything a host needs to launch it:
/// `function`, `source`, `grid`, `num_warps`, `num_stages`,
/// `workspace_bytes` and `params` in call order, each with `name`, `role`
/// (`prefetch`, `input`, `output` or `workspace`), `operand` (the
/// prefetch array's or operand's index), `dtype` ([`dtype_name`]), `shape`
/// and `alias` (for an in-out operand's output: the index of its input's
/// param, the buffer it must be; else null); and `digests`, each of those
/// fields' hex SHA-256 ([`field_digest`]), which a loader checks before it
/// runs anything, so a program changed after export is refused by name.
pub fn program_json(program: &TritonProgram) -> serde_json::Value {
    let mut position: BTreeMap<ParamRole, usize> = BTreeMap::new();
    let params: Vec<serde_json::Value> = program
        .params
        .iter()
        .enumerate()
        .map(|(n, p)| {
            let (role, operand, alias) = match p.role {
                ParamRole::Prefetch(i) => ("prefetch", Some(i), None),
                ParamRole::Input(i) => ("input", Some(i), None),
                ParamRole::Output(i) => ("output", Some(i), position.get(&ParamRole::Input(i))),
                ParamRole::Workspace => ("workspace", None, None),
            };
            let v = serde_json::json!({
                "name": p.name,
                "role": role,
                "operand": operand,
                "dtype": dtype_name(p.dtype),
                "shape": p.shape,
                "alias": alias,
            });
            position.insert(p.role, n);
            v
        })
        .collect();
    let mut v = serde_json::json!({
        "function": program.function,
        "source": program.source,
        "grid": program.grid,
        "num_warps": program.options.num_warps,
        "num_stages": program.options.num_stages,
        "workspace_bytes": program.workspace_bytes,
        "params": params,
    });
    let digests: serde_json::Map<String, serde_json::Value> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| (k.clone(), field_digest(x).into()))
        .collect();
    v["digests"] = digests.into();
    v
}

/// The digest [`program_json`] records of one field: the hex SHA-256 of a
/// string's UTF-8 (the program's source: the exact text that will run),
/// and of any other value's compact JSON, keys sorted (`{"a":1,"b":[2]}`;
/// the fields hold numbers, identifiers and dtype names, which every JSON
/// writer spells alike).
pub fn field_digest(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => kernel_ir::sha256_hex(s.as_bytes()),
        other => kernel_ir::sha256_hex(other.to_string().as_bytes()),
    }
}

/// Runs `kernel`'s Triton `program` under Triton's interpreter on host
/// arrays (scalar prefetch, then inputs, as every path takes them) and
/// returns the outputs.
pub fn interpret(
    kernel: &Kernel,
    program: &TritonProgram,
    args: &[Array],
) -> Result<Vec<Array>, TritonError> {
    kernel
        .check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
        .map_err(|e| TritonError::Arguments(Box::new(e)))?;
    // Prefetch then inputs, in the kernel's argument order.
    let mut inputs: BTreeMap<ParamRole, &Array> = BTreeMap::new();
    let mut next = args.iter();
    for (i, _) in kernel.prefetch.iter().enumerate() {
        if let Some(a) = next.next() {
            inputs.insert(ParamRole::Prefetch(i), a);
        }
    }
    for (i, o) in kernel.operands.iter().enumerate() {
        if o.role.is_input()
            && let Some(a) = next.next()
        {
            inputs.insert(ParamRole::Input(i), a);
        }
    }
    let mut params = Vec::new();
    let mut payload: Vec<u8> = Vec::new();
    let mut position: BTreeMap<ParamRole, usize> = BTreeMap::new();
    for (n, p) in program.params.iter().enumerate() {
        let bytes = p.shape.iter().product::<usize>() * p.dtype.bytes();
        let alias = match p.role {
            // An in-out operand's output is its input's buffer.
            ParamRole::Output(i) => position.get(&ParamRole::Input(i)).copied(),
            _ => None,
        };
        match (alias, inputs.get(&p.role)) {
            (Some(_), _) => {}
            (None, Some(a)) => payload.extend(a.to_le_bytes()),
            (None, None) => payload.resize(payload.len() + bytes, 0),
        }
        position.insert(p.role, n);
        params.push(serde_json::json!({
            "name": p.name,
            "dtype": dtype_name(p.dtype),
            "shape": p.shape,
            "bytes": bytes,
            "alias": alias,
        }));
    }
    if let Some(dir) = std::env::var_os(KEEP_ENV) {
        // Best effort: a debugging aid, never a reason to fail the run.
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("{}.py", program.function)),
            &program.source,
        );
    }
    let request = serde_json::json!({
        "op": "run",
        "source": program.source,
        "function": program.function,
        "grid": program.grid,
        "params": params,
    });
    let taken = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let mut child = match taken {
        Some(c) => c,
        None => Interpreter::start()?,
    };
    let limit = crate::child::timeout();
    let pid = child.child.id();
    let (answer, killed) =
        crate::child::within(pid, limit, || exchange(&mut child, &request, &payload));
    if killed {
        return Err(TritonError::Child(format!(
            "Triton's interpreter did not finish `{}` within {} s (killed); give a longer --timeout",
            program.function,
            limit.as_secs_f64()
        )));
    }
    let (header, bodies) = match answer {
        Ok(a) => {
            let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_INTERPRETERS {
                idle.push(child);
            }
            a
        }
        // A child that failed mid-request is not reused (dropping kills it).
        Err(e) => return Err(e),
    };
    if header.get("ok").and_then(|v| v.as_bool()) != Some(true) {
        return Err(TritonError::Run {
            loc: header
                .get("loc")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            message: header
                .get("error")
                .and_then(|v| v.as_str())
                .unwrap_or("no message")
                .to_string(),
        });
    }
    let mut outputs = Vec::new();
    for (n, p) in program.params.iter().enumerate() {
        if let ParamRole::Output(_) = p.role {
            let source = match &params[n]["alias"] {
                serde_json::Value::Number(a) => a.as_u64().unwrap_or(n as u64) as usize,
                _ => n,
            };
            let bytes = bodies.get(source).ok_or_else(|| {
                TritonError::Child(format!("no bytes came back for `{}`", p.name))
            })?;
            let a = Array::from_le_bytes(p.dtype, p.shape.clone(), bytes)
                .map_err(|e| TritonError::Child(e.to_string()))?;
            outputs.push(a);
        }
    }
    Ok(outputs)
}

type Answer = (serde_json::Value, Vec<Vec<u8>>);

fn exchange(
    child: &mut Interpreter,
    request: &serde_json::Value,
    payload: &[u8],
) -> Result<Answer, TritonError> {
    let io = |e: std::io::Error| TritonError::Child(format!("the interpreter child stopped: {e}"));
    let mut line = request.to_string().into_bytes();
    line.push(b'\n');
    child.stdin.write_all(&line).map_err(io)?;
    child.stdin.write_all(payload).map_err(io)?;
    child.stdin.flush().map_err(io)?;
    let mut header = String::new();
    let n = child.stdout.read_line(&mut header).map_err(io)?;
    if n == 0 {
        let status = child.child.try_wait().ok().flatten();
        return Err(TritonError::Child(format!(
            "the interpreter child ended without an answer ({})",
            status.map_or("still running".to_string(), |s| s.to_string())
        )));
    }
    let header: serde_json::Value = serde_json::from_str(&header)
        .map_err(|e| TritonError::Child(format!("a garbled answer: {e}")))?;
    let mut bodies = Vec::new();
    if let Some(sizes) = header.get("sizes").and_then(|v| v.as_array()) {
        for s in sizes {
            let n = s.as_u64().unwrap_or(0) as usize;
            let mut b = vec![0u8; n];
            child.stdout.read_exact(&mut b).map_err(io)?;
            bodies.push(b);
        }
    }
    Ok((header, bodies))
}

// ---- the compiler ----

/// What Triton's compiler made of a program for one target.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuStats {
    /// Seconds Triton took.
    pub seconds: f64,
    /// Registers per thread (VGPRs on AMD).
    pub registers: u64,
    /// Bytes spilled to local memory per thread (0 is the goal).
    pub spill_bytes: u64,
    /// Stack bytes per thread.
    pub stack_bytes: u64,
    /// Shared memory (LDS) the program needs, bytes.
    pub shared_bytes: u64,
    /// Size of the final code object (cubin, hsaco), bytes.
    pub code_bytes: u64,
    /// Tensor-core instructions by kind (`HGMMA`, `HMMA`, `IMMA`,
    /// `UTCMMA`; `MFMA` on AMD), counted in the final code.
    pub tensor_core: BTreeMap<String, u64>,
    /// Instructions in the final code.
    pub instructions: u64,
    /// Software-pipeline stages it was compiled with.
    pub stages: u64,
    /// Warps it was compiled with.
    pub warps: u64,
}

impl GpuStats {
    /// Tensor-core instructions of every kind.
    pub fn tensor_core_total(&self) -> u64 {
        self.tensor_core.values().sum()
    }
}

/// Whether a compiled program can launch on `target`: its shared memory
/// within [`GpuTarget::max_shared_bytes`] (Triton compiles one that is not;
/// its launch fails). `Err` says by how much and what to change.
pub fn check_launchable(target: GpuTarget, stats: &GpuStats) -> Result<(), GpuCompileError> {
    let max = target.max_shared_bytes();
    if stats.shared_bytes > max {
        return Err(GpuCompileError {
            loc: None,
            message: format!(
                "needs {} KiB of shared memory and {target} gives a program at most {} KiB: it compiles but cannot launch; use fewer stages (--stages) or smaller blocks",
                stats.shared_bytes.div_ceil(1024),
                max / 1024
            ),
        });
    }
    Ok(())
}

/// Triton's error for one target, at the Rust line it names.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}{message}", .loc.as_ref().map(|l| format!("{l}: ")).unwrap_or_default())]
pub struct GpuCompileError {
    /// The Rust location of the program line Triton rejected.
    pub loc: Option<String>,
    /// Triton's message.
    pub message: String,
}

/// One target's compile.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuCompile {
    /// The target.
    pub target: GpuTarget,
    /// Its statistics, or Triton's error.
    pub result: Result<GpuStats, GpuCompileError>,
}

/// How long one target's compile may take.
pub const COMPILE_TIMEOUT: Duration = Duration::from_secs(300);

/// One program to compile for some targets ([`compile_many`]).
pub struct CompileJob<'a> {
    /// The program.
    pub program: &'a TritonProgram,
    /// Its targets.
    pub targets: &'a [GpuTarget],
    /// A folder that receives each target's stages.
    pub keep: Option<&'a Path>,
    /// Fewer pipeline stages than the program's where its buffers would
    /// not fit a target's shared memory, and more warps where ptxas runs
    /// out of registers ([`GpuStats::stages`] and [`GpuStats::warps`] say
    /// what it took).
    pub fit: bool,
}

/// Compiles `program` for each of `targets` with Triton, in one child
/// process; `keep` names a folder that receives each target's stages
/// (`<target>/kernel.{ttir,ttgir,llir,ptx,cubin,sass}` or `amdgcn`,
/// `hsaco`). A target Triton rejects is an `Err` in its entry; a child
/// that dies is the whole call's error.
pub fn compile(
    program: &TritonProgram,
    targets: &[GpuTarget],
    keep: Option<&Path>,
) -> Result<Vec<GpuCompile>, TritonError> {
    let mut all = compile_many(&[CompileJob {
        program,
        targets,
        keep,
        fit: false,
    }])?;
    Ok(all.pop().unwrap_or_default())
}

/// The TTIR module (as text) Triton's front end makes of `program` for
/// `target`, after Triton's TTIR passes and before any GPU code: what
/// XLA's Triton custom call compiles ([`lowering::triton_custom_call`]).
/// One child process, a fraction of a full compile's time.
pub fn ttir(program: &TritonProgram, target: GpuTarget) -> Result<String, TritonError> {
    let mut job = job_json(&CompileJob {
        program,
        targets: &[target],
        keep: None,
        fit: false,
    });
    job["ttir_only"] = serde_json::Value::Bool(true);
    let reports = compile_child(vec![job], 1)?;
    let v = &reports[0];
    if v.get("ok").and_then(|x| x.as_bool()) != Some(true) {
        let e = report(v).err().map_or_else(String::new, |e| {
            format!(
                "{}{}",
                e.message,
                e.loc.map_or(String::new(), |l| format!(" (at {l})"))
            )
        });
        return Err(TritonError::Program(format!(
            "Triton rejects the program for {target}: {e}"
        )));
    }
    v.get("ttir")
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .ok_or_else(|| TritonError::Child("a TTIR report without its text".into()))
}

/// [`compile`] for several programs in one child process (Python and
/// Triton start once): one list of compiles per job, in order.
pub fn compile_many(jobs: &[CompileJob<'_>]) -> Result<Vec<Vec<GpuCompile>>, TritonError> {
    let total: usize = jobs.iter().map(|j| j.targets.len()).sum();
    let reports = compile_child(jobs.iter().map(job_json).collect(), total)?;
    let mut out: Vec<Vec<GpuCompile>> = jobs.iter().map(|_| Vec::new()).collect();
    for v in &reports {
        let name = v.get("target").and_then(|t| t.as_str()).unwrap_or("");
        let target: GpuTarget = name
            .parse()
            .map_err(|e: kernel_ir::ParseGpuTargetError| TritonError::Child(e.to_string()))?;
        let job = v.get("job").and_then(|j| j.as_u64()).unwrap_or(0) as usize;
        let slot = out.get_mut(job).ok_or_else(|| {
            TritonError::Child(format!("a report for job {job} of {}", jobs.len()))
        })?;
        slot.push(GpuCompile {
            target,
            result: report(v),
        });
    }
    Ok(out)
}

/// One job of the compile child's request.
fn job_json(j: &CompileJob<'_>) -> serde_json::Value {
    let signature: serde_json::Map<String, serde_json::Value> = j
        .program
        .params
        .iter()
        .map(|p| (p.name.clone(), serde_json::Value::from(p.signature_type())))
        .collect();
    serde_json::json!({
        "source": j.program.source,
        "function": j.program.function,
        "signature": signature,
        "targets": j.targets
            .iter()
            .map(|t| {
                serde_json::json!([
                    t.backend(),
                    t.arch(),
                    t.warp_size(),
                    t.name(),
                    t.max_shared_bytes()
                ])
            })
            .collect::<Vec<_>>(),
        "num_warps": j.program.options.num_warps,
        "num_stages": j.program.options.num_stages,
        "fit": j.fit,
        "keep": j.keep.map(|k| k.display().to_string()),
    })
}

/// Runs `jobs` in one compile child and returns its `total` reports (one
/// per job and target); a child that dies, hangs past its deadline or
/// reports fewer is the error.
fn compile_child(
    jobs: Vec<serde_json::Value>,
    total: usize,
) -> Result<Vec<serde_json::Value>, TritonError> {
    let python = python()?;
    let request = serde_json::json!({ "op": "compile", "jobs": jobs });
    let mut child = crate::child::spawn(&mut command(&python, "compile"))
        .map_err(|e| TritonError::Child(format!("cannot start {}: {e}", python.display())))?;
    let io = |e: std::io::Error| TritonError::Child(format!("the compile child failed: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        let mut line = request.to_string().into_bytes();
        line.push(b'\n');
        if let Err(e) = stdin.write_all(&line) {
            crate::child::kill_group(&mut child);
            return Err(io(e));
        }
    }
    let deadline = COMPILE_TIMEOUT * total.max(1) as u32;
    // Reading stops when the child exits (its group killed then, so a
    // lingering `ptxas` holds nothing open), or at the deadline.
    let got = crate::child::collect(child, deadline).map_err(io)?;
    // The end of its stderr on one line (a command's error is one line).
    let tail = |stderr: &str| {
        let tail: Vec<&str> = stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .rev()
            .take(8)
            .collect();
        match tail.is_empty() {
            true => "it wrote nothing to stderr".to_string(),
            false => format!(
                "its stderr ended: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ),
        }
    };
    let Some(status) = got.status else {
        return Err(TritonError::Child(format!(
            "Triton's compile did not finish within {} s (killed with what it started); {}",
            deadline.as_secs(),
            tail(&got.stderr)
        )));
    };
    let (lines, stderr) = (got.lines, got.stderr);
    let mut reports = Vec::new();
    for line in lines
        .iter()
        .filter_map(|l| l.strip_prefix("tessera-report "))
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| TritonError::Child(format!("a garbled report ({e}): {line}")))?;
        reports.push(v);
    }
    if reports.len() != total {
        return Err(TritonError::Child(format!(
            "Triton's compile child ended ({status}) after {} of {total} compiles; {}",
            reports.len(),
            tail(&stderr)
        )));
    }
    Ok(reports)
}

fn report(v: &serde_json::Value) -> Result<GpuStats, GpuCompileError> {
    let num = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    if v.get("ok").and_then(|x| x.as_bool()) != Some(true) {
        return Err(GpuCompileError {
            loc: v.get("loc").and_then(|x| x.as_str()).map(str::to_string),
            message: v
                .get("error")
                .and_then(|x| x.as_str())
                .unwrap_or("no message")
                .to_string(),
        });
    }
    let tensor_core = v
        .get("tensor_core")
        .and_then(|t| t.as_object())
        .map(|m| {
            m.iter()
                .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    Ok(GpuStats {
        seconds: v.get("seconds").and_then(|x| x.as_f64()).unwrap_or(0.0),
        registers: num("registers"),
        spill_bytes: num("spill_bytes"),
        stack_bytes: num("stack_bytes"),
        shared_bytes: num("shared").max(num("static_shared")),
        code_bytes: num("code_bytes"),
        tensor_core,
        instructions: num("instructions"),
        stages: num("stages"),
        warps: num("warps"),
    })
}
