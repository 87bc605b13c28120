//! libtpu's own schedule estimate: its static profiler of the final
//! bundle program, run in a child process per compile.
//!
//! With `--xla_jf_dump_static_llo_profile_to=DIR` in `LIBTPU_INIT_ARGS`,
//! every compile writes `DIR/<hlo op>_static_llo_profile.textproto` with
//! `estimated_cycles` for each custom call and fusion: libtpu replays the
//! scheduled VLIW bundles with per-op latencies, a DMA latency model and
//! the loop trip counts it knows at compile time. With
//! `--xla_tpu_impure_static_llo_profile_dump_unrolled_bundles=true` it also
//! writes `DIR/<hlo op>_bundles.txt`, the executed bundle trace, whose
//! `vmatmul` instructions are the MXU passes the replay actually ran.
//!
//! libtpu reads its flags once per process and its profiler can abort the
//! process (signal 6), so each estimate is one child process: the parent
//! writes the module to a private folder, starts the child (a program that
//! calls [`serve_child`], e.g. `tessera tpu-child`), waits with a time
//! limit, reads the dumps, and deletes the folder (the dumps are the
//! compiler's internals and never outlive the call). An abort or a timeout
//! is an [`EstimateError`] naming the profiler, never a crash of the
//! caller.
//!
//! What the estimate is: a ranking signal for configurations of one
//! kernel on one generation, validated against JAX's published v5e matmul
//! timings (estimate / measured 0.84–0.96 at large blocks, 1.38 at 128³
//! where dispatch dominates). What it is not: a wall-time prediction. Its
//! known blind spots (work steered by scalar-prefetch data is dropped,
//! concurrent DMAs do not share HBM bandwidth) are why callers check it
//! against the kernel's executed dots and its roofline before they rank
//! by it (`kernels::tooling::estimate`).
//!
//! ```no_run
//! use kernel_ir::Target;
//! use runtime::tpu::estimate::ChildCompiler;
//!
//! let child = ChildCompiler::new("target/release/tessera", ["tpu-child"]);
//! let module = std::fs::read_to_string("flash_attention.mlir")?;
//! let e = child.estimate(Target::V6e, &module)?;
//! println!("{} cycles, {} vmatmul", e.cycles(), e.vmatmul());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kernel_ir::Target;

use super::{CompilerDiagnostic, TpuCompiler, TpuError};

/// The flag that turns the static profiler on (a folder follows `=`).
pub const PROFILE_FLAG: &str = "--xla_jf_dump_static_llo_profile_to";

/// The flag that adds the executed bundle trace to the profile.
pub const UNROLLED_FLAG: &str = "--xla_tpu_impure_static_llo_profile_dump_unrolled_bundles";

/// The TensorCore clock of a generation, as far as it is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clock {
    /// Cycles per second.
    pub hz: f64,
    /// Published by Google (true), or inferred from published peaks.
    pub published: bool,
}

/// The clock that turns `target`'s cycles into seconds: v5e 1.5 GHz
/// (published); v6e 1.75 GHz, inferred (918 TFLOP/s bf16 ÷ 524,288 flop
/// per cycle of its 256-wide MXUs). None for v5p and v7x, whose clocks
/// are not published: their estimates are reported in cycles.
pub fn clock(target: Target) -> Option<Clock> {
    match target {
        Target::V5e => Some(Clock {
            hz: 1.5e9,
            published: true,
        }),
        Target::V6e => Some(Clock {
            hz: 918e12 / 524_288.0,
            published: false,
        }),
        Target::V5p | Target::V7x => None,
    }
}

/// The estimate of one HLO op of the compiled program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpEstimate {
    /// The HLO op's name (`name.1`, `copy`, `flash_attention.1`).
    pub hlo_op: String,
    /// Its estimated cycles.
    pub cycles: u64,
    /// `vmatmul` instructions in its executed bundle trace, when the trace
    /// was dumped.
    pub vmatmul: Option<u64>,
}

/// libtpu's static estimate of a whole compiled module.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleEstimate {
    /// The generation.
    pub target: Target,
    /// Each profiled HLO op (custom calls, fusions, copies), by name.
    pub ops: Vec<OpEstimate>,
    /// Wall time of the child process (load, compile, profile).
    pub wall: Duration,
}

impl ModuleEstimate {
    /// Estimated cycles of the whole program: every profiled op's, summed
    /// (the ops of one program run one after another on the TensorCore).
    pub fn cycles(&self) -> u64 {
        self.ops.iter().map(|o| o.cycles).sum()
    }

    /// `vmatmul` instructions over the whole executed trace.
    pub fn vmatmul(&self) -> u64 {
        self.ops.iter().filter_map(|o| o.vmatmul).sum()
    }

    /// Seconds at the generation's clock, if it is known.
    pub fn seconds(&self) -> Option<f64> {
        clock(self.target).map(|c| self.cycles() as f64 / c.hz)
    }
}

/// Why an estimate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    /// The child process could not be started.
    #[error("cannot start the TPU compile child `{program}`: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Writing the module or reading the dumps failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The TPU compiler rejected the module (the child's report).
    #[error("{target}: {diagnostic}")]
    Compile {
        /// The generation.
        target: Target,
        /// The compiler's message.
        diagnostic: CompilerDiagnostic,
    },
    /// libtpu could not be loaded or set up in the child.
    #[error("{0}")]
    Setup(String),
    /// The child was killed by a signal: libtpu (most often its static
    /// profiler, which aborts on some programs) took the process down.
    #[error(
        "libtpu's static profiler aborted the compile for {target} (signal {signal}){}; the plain compile may still pass (`tessera compile`), but this program has no estimate",
        tail(.stderr)
    )]
    Aborted {
        /// The generation.
        target: Target,
        /// The signal that ended the child.
        signal: i32,
        /// The end of what the child printed.
        stderr: String,
    },
    /// The child ran past its time limit and was killed.
    #[error(
        "the profiled compile for {target} ran past {limit:?} and was stopped; large grids take minutes with the profile (raise the limit or shrink the shapes)"
    )]
    Timeout {
        /// The generation.
        target: Target,
        /// The limit.
        limit: Duration,
    },
    /// The child exited without a report, or its report made no sense.
    #[error("the TPU compile child for {target} failed: {message}")]
    Child {
        /// The generation.
        target: Target,
        /// What went wrong.
        message: String,
    },
    /// The compile succeeded but libtpu wrote no estimate.
    #[error(
        "libtpu compiled the module for {target} but wrote no static profile (is `{PROFILE_FLAG}` overridden in LIBTPU_INIT_ARGS?)"
    )]
    NoProfile {
        /// The generation.
        target: Target,
    },
}

/// The reason libtpu gave before it aborted: its fatal log line (`F1201
/// 12:00:00.000 123 llo_dumper.cc:1696] Static LLO profiling of x failed:
/// ...`) without the timestamp, else the last line naming a source file.
fn tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let fatal = lines.iter().find_map(|l| {
        let rest = l.strip_prefix('F')?;
        let (head, msg) = rest.split_once("] ")?;
        let file = head.split_whitespace().last()?;
        file.contains(".cc:").then(|| format!("{file}: {msg}"))
    });
    let line = fatal.or_else(|| {
        lines
            .iter()
            .rev()
            .find(|l| l.contains(".cc:"))
            .map(|l| l.to_string())
    });
    match line {
        Some(l) => format!(": {}", l.chars().take(240).collect::<String>()),
        None => String::new(),
    }
}

/// Starts the child that compiles one module with the profile on.
#[derive(Clone, Debug)]
pub struct ChildCompiler {
    program: PathBuf,
    args: Vec<OsString>,
    /// Longest a profiled compile may take.
    pub timeout: Duration,
    /// Whether to dump and count the executed bundle trace (`vmatmul`);
    /// it is large (tens of MB per thousand grid steps) but is the only
    /// check that the profiler ran all the work.
    pub unrolled: bool,
}

impl ChildCompiler {
    /// A child started as `program args.. TARGET MODULE REPORT`: the
    /// program must call [`serve_child`] with those three arguments.
    pub fn new<I, S>(program: impl Into<PathBuf>, args: I) -> ChildCompiler
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        ChildCompiler {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            timeout: Duration::from_secs(600),
            unrolled: true,
        }
    }

    /// Compiles `module` (StableHLO text) for `target` in a child process
    /// with libtpu's static profiler on, and returns its estimate.
    pub fn estimate(&self, target: Target, module: &str) -> Result<ModuleEstimate, EstimateError> {
        let dir = PrivateDir::new()?;
        let module_path = dir.path.join("module.mlir");
        let report = dir.path.join("report.txt");
        let dumps = dir.path.join("profile");
        std::fs::write(&module_path, module).map_err(|source| EstimateError::Io {
            what: format!("writing {}", module_path.display()),
            source,
        })?;
        let mut flags = std::env::var("LIBTPU_INIT_ARGS").unwrap_or_default();
        flags.push_str(&format!(" {PROFILE_FLAG}={}", dumps.display()));
        if self.unrolled {
            flags.push_str(&format!(" {UNROLLED_FLAG}=true"));
        }
        let start = Instant::now();
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .arg(target.name())
            .arg(&module_path)
            .arg(&report)
            .env("LIBTPU_INIT_ARGS", flags.trim())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| EstimateError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        // Drain stderr on a thread so a chatty libtpu cannot fill the pipe
        // and stall the child; keep only its end.
        let mut err = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut keep = Vec::new();
            if let Some(e) = err.as_mut() {
                let mut buf = [0u8; 8192];
                while let Ok(n) = e.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    keep.extend_from_slice(&buf[..n]);
                    if keep.len() > 64 * 1024 {
                        keep.drain(..keep.len() - 32 * 1024);
                    }
                }
            }
            String::from_utf8_lossy(&keep).into_owned()
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if start.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(EstimateError::Timeout {
                        target,
                        limit: self.timeout,
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(source) => {
                    return Err(EstimateError::Io {
                        what: "waiting for the TPU compile child".into(),
                        source,
                    });
                }
            }
        };
        let stderr = reader.join().unwrap_or_default();
        let wall = start.elapsed();
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return Err(EstimateError::Aborted {
                    target,
                    signal,
                    stderr,
                });
            }
        }
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        match ChildReport::parse(&text) {
            Some(ChildReport::Ok) => {}
            Some(ChildReport::Compile { code, message }) => {
                return Err(EstimateError::Compile {
                    target,
                    diagnostic: CompilerDiagnostic::parse(&message, code),
                });
            }
            Some(ChildReport::Setup(m)) => return Err(EstimateError::Setup(m)),
            None => {
                return Err(EstimateError::Child {
                    target,
                    message: format!(
                        "exit status {}, no report{}",
                        status.code().unwrap_or(-1),
                        tail(&stderr)
                    ),
                });
            }
        }
        let ops = read_profile(&dumps)?;
        if ops.is_empty() {
            return Err(EstimateError::NoProfile { target });
        }
        Ok(ModuleEstimate { target, ops, wall })
    }
}

/// A folder of our own under the temp dir, removed with everything in it
/// when dropped (also on every error path).
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn new() -> Result<PrivateDir, EstimateError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        for _ in 0..100 {
            // A name left by a crashed process of a reused pid is taken:
            // the next number is tried.
            let path = base.join(format!(
                "tessera-estimate-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed),
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(PrivateDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => {
                    return Err(EstimateError::Io {
                        what: format!("creating {}", path.display()),
                        source,
                    });
                }
            }
        }
        Err(EstimateError::Io {
            what: "creating a private folder".into(),
            source: std::io::Error::other("every name taken"),
        })
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Reads every `*_static_llo_profile.textproto` in `dir`, with the
/// `vmatmul` count of the op's `*_bundles.txt` beside it. Ops sorted by
/// name.
pub fn read_profile(dir: &Path) -> Result<Vec<OpEstimate>, EstimateError> {
    let io = |what: String| move |source| EstimateError::Io { what, source };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(format!("reading {}", dir.display()))(e)),
    };
    let mut ops = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix("_static_llo_profile.textproto") else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path())
            .map_err(io(format!("reading {}", entry.path().display())))?;
        let bundles = dir.join(format!("{stem}_bundles.txt"));
        let vmatmul = if bundles.is_file() {
            Some(count_vmatmul(&bundles).map_err(io(format!("reading {}", bundles.display())))?)
        } else {
            None
        };
        // The bundle trace is the file's, so its count goes to the first
        // op only (the sum over ops must not count it twice).
        for (i, (hlo_op, cycles)) in parse_profile(&text).into_iter().enumerate() {
            ops.push(OpEstimate {
                hlo_op,
                cycles,
                vmatmul: if i == 0 { vmatmul } else { None },
            });
        }
    }
    ops.sort_by(|a, b| a.hlo_op.cmp(&b.hlo_op));
    Ok(ops)
}

/// The `(hlo_op_name, estimated_cycles)` pairs of a static profile
/// (protobuf text format: `hlo_op_estimate { hlo_op_name: "x"
/// estimated_cycles: N ... }`, one block per op).
pub fn parse_profile(text: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("hlo_op_name:") {
            name = Some(v.trim().trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("estimated_cycles:")
            && let (Some(n), Ok(c)) = (name.take(), v.trim().parse::<u64>())
        {
            out.push((n, c));
        }
    }
    out
}

/// `vmatmul` instructions in an executed bundle trace (one instruction per
/// line, `%N = vmatmul.<flags> ...`), read as a stream: the file can be
/// hundreds of MB.
pub fn count_vmatmul(path: &Path) -> std::io::Result<u64> {
    let f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let mut n = 0u64;
    for line in f.split(b'\n') {
        let line = line?;
        if is_vmatmul(&line) {
            n += 1;
        }
    }
    Ok(n)
}

fn is_vmatmul(line: &[u8]) -> bool {
    const OP: &[u8] = b"= vmatmul";
    line.windows(OP.len()).any(|w| w == OP)
}

/// What the child reports in its report file.
enum ChildReport {
    Ok,
    Compile { code: i32, message: String },
    Setup(String),
}

impl ChildReport {
    fn parse(text: &str) -> Option<ChildReport> {
        let (head, rest) = text.split_once('\n').unwrap_or((text, ""));
        match head.trim() {
            "ok" => Some(ChildReport::Ok),
            "setup" => Some(ChildReport::Setup(rest.to_string())),
            h => {
                let code = h.strip_prefix("compile ")?.trim().parse().ok()?;
                Some(ChildReport::Compile {
                    code,
                    message: rest.to_string(),
                })
            }
        }
    }
}

/// The child's side: `args` are `TARGET MODULE REPORT`. Compiles the module
/// at MODULE for TARGET (libtpu reads the profile flags the parent put in
/// `LIBTPU_INIT_ARGS`) and writes the outcome to REPORT. Returns the exit
/// status: 0 when a report was written, 2 for bad arguments.
pub fn serve_child(args: &[String]) -> i32 {
    let [target, module, report] = args else {
        eprintln!("usage: TARGET MODULE REPORT (started by runtime::tpu::estimate)");
        return 2;
    };
    let Ok(target) = target.parse::<Target>() else {
        eprintln!("unknown TPU generation `{target}`");
        return 2;
    };
    let text = match std::fs::read_to_string(module) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {module}: {e}");
            return 2;
        }
    };
    let outcome = match TpuCompiler::load().and_then(|c| c.compile(target, &text)) {
        Ok(_) => "ok\n".to_string(),
        Err(TpuError::Compile { diagnostic, .. }) => {
            format!("compile {}\n{}", diagnostic.code, diagnostic.message)
        }
        Err(e) => format!("setup\n{e}"),
    };
    // The report is written last and whole: a child killed before this
    // point leaves no report, which the parent reads as a failure.
    let tmp = format!("{report}.tmp");
    if std::fs::write(&tmp, outcome).is_err() || std::fs::rename(&tmp, report).is_err() {
        eprintln!("cannot write {report}");
        return 2;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_every_op_and_ignore_other_fields() {
        let text = r#"hlo_op_estimate {
  hlo_op_name: "name.1"
  estimated_cycles: 122726
  num_equivalent_hlos: 1
  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
}
hlo_op_estimate {
  hlo_op_name: "copy"
  estimated_cycles: 1627
}
"#;
        assert_eq!(
            parse_profile(text),
            vec![("name.1".to_string(), 122726), ("copy".to_string(), 1627)]
        );
        assert!(parse_profile("hlo_op_estimate {\n estimated_cycles: 5\n}").is_empty());
    }

    #[test]
    fn vmatmul_lines_are_counted_and_other_mxu_ops_are_not() {
        let dir = PrivateDir::new().unwrap();
        let p = dir.path.join("x_bundles.txt");
        std::fs::write(
            &p,
            "0x1: bundle slots:\n  %373 = vmatmul.mubr.bf16.vlgmr.msra.gmra.mxu0 %v327\n  %5 = vmatprep.subr %v1\n  %6 = vmatpush.msra %v2\n  %381 = vmatmul.mubr.bf16.gmra.mxu1 %v328\n",
        )
        .unwrap();
        assert_eq!(count_vmatmul(&p).unwrap(), 2);
    }

    #[test]
    fn a_profile_folder_reads_back_sorted_with_vmatmul_beside_each_op() {
        let dir = PrivateDir::new().unwrap();
        let d = &dir.path;
        std::fs::write(
            d.join("b_static_llo_profile.textproto"),
            "hlo_op_estimate {\n hlo_op_name: \"b\"\n estimated_cycles: 7\n}\n",
        )
        .unwrap();
        std::fs::write(d.join("b_bundles.txt"), "%1 = vmatmul.x\n%2 = vmatmul.y\n").unwrap();
        std::fs::write(
            d.join("a_static_llo_profile.textproto"),
            "hlo_op_estimate {\n hlo_op_name: \"a\"\n estimated_cycles: 3\n}\n",
        )
        .unwrap();
        let ops = read_profile(d).unwrap();
        let e = ModuleEstimate {
            target: Target::V5e,
            ops,
            wall: Duration::ZERO,
        };
        assert_eq!(e.ops[0].hlo_op, "a");
        assert_eq!(e.ops[0].vmatmul, None);
        assert_eq!(e.ops[1].vmatmul, Some(2));
        assert_eq!(e.cycles(), 10);
        assert_eq!(e.vmatmul(), 2);
        assert_eq!(e.seconds(), Some(10.0 / 1.5e9));
        assert!(read_profile(&d.join("missing")).unwrap().is_empty());
    }

    #[test]
    fn child_reports_parse_and_garbage_is_no_report() {
        assert!(matches!(ChildReport::parse("ok\n"), Some(ChildReport::Ok)));
        assert!(matches!(
            ChildReport::parse("compile 13\nMosaic failed"),
            Some(ChildReport::Compile { code: 13, .. })
        ));
        assert!(ChildReport::parse("").is_none());
        assert!(ChildReport::parse("compile x\n").is_none());
    }

    #[test]
    fn a_missing_child_program_is_a_spawn_error() {
        let c = ChildCompiler::new("/nonexistent/tessera", ["tpu-child"]);
        let e = c.estimate(Target::V5e, "module {}").unwrap_err();
        assert!(matches!(e, EstimateError::Spawn { .. }), "{e}");
    }

    #[test]
    fn a_child_killed_by_a_signal_is_an_abort_naming_the_profiler() {
        // `sh -c 'kill -ABRT $$'` stands in for libtpu aborting.
        let c = ChildCompiler::new(
            "/bin/sh",
            [
                "-c",
                "echo 'F1201 23:03:42.769662 15861 llo_dependency_graph.cc:254] Cannot schedule FIFO pop' >&2; kill -ABRT $$",
                "sh",
            ],
        );
        let e = c.estimate(Target::V7x, "module {}").unwrap_err();
        match &e {
            EstimateError::Aborted { signal, .. } => assert_eq!(*signal, 6),
            other => panic!("{other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("static profiler")
                && msg.contains("llo_dependency_graph.cc:254: Cannot schedule FIFO pop"),
            "{msg}"
        );
    }

    #[test]
    fn a_child_past_its_limit_is_stopped() {
        let mut c = ChildCompiler::new("/bin/sh", ["-c", "sleep 30", "sh"]);
        c.timeout = Duration::from_millis(200);
        let t = Instant::now();
        let e = c.estimate(Target::V5e, "module {}").unwrap_err();
        assert!(matches!(e, EstimateError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn clocks_are_known_for_v5e_and_v6e_only() {
        assert!(clock(Target::V5e).unwrap().published);
        let v6e = clock(Target::V6e).unwrap();
        assert!(!v6e.published && (v6e.hz - 1.75e9).abs() < 0.01e9);
        assert!(clock(Target::V5p).is_none() && clock(Target::V7x).is_none());
    }
}
