//! TPU compiles in a child process. libtpu reads its flags once per
//! process and can end the process (a failed `CHECK` is signal 6, a huge
//! module can exhaust memory), so the CLI never compiles with libtpu in its
//! own process: the parent writes the module to a private folder, starts
//! the child (a program that calls [`serve_child`], e.g. `tessera
//! tpu-child`), waits with a time limit, reads the child's report (and its
//! profile dumps or executable), and deletes the folder on every path. An
//! abort or a timeout is a [`ChildError`] naming libtpu, never a crash of
//! the caller.
//!
//! ```no_run
//! use kernel_ir::Target;
//! use libtpu::child::ChildCompiler;
//!
//! let child = ChildCompiler::new("target/release/tessera", ["tpu-child"]);
//! let module = std::fs::read_to_string("flash_attention.mlir")?;
//! let c = child.compile(Target::V5e, &module, false)?;
//! println!("compiled in {:?}, peak {} bytes", c.compile_time, c.memory.peak_bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kernel_ir::Target;

use super::estimate::{ModuleEstimate, PROFILE_FLAG, UNROLLED_FLAG, read_profile};
use super::{CompilerDiagnostic, TpuCompiler, TpuError};
use runtime::pjrt::CompiledMemoryStats;

/// Why a compile in a child process (profiled or plain) gave no result.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
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
    /// A plain compile's child was killed by a signal: libtpu aborted (a
    /// failed check inside the compiler) or ran out of memory.
    #[error(
        "libtpu aborted the compile for {target} (signal {signal}){}; {}",
        tail(.stderr),
        likely_cause(*.signal)
    )]
    CompilerAborted {
        /// The generation.
        target: Target,
        /// The signal that ended the child.
        signal: i32,
        /// The end of what the child printed.
        stderr: String,
    },
    /// The child ran past its time limit and was killed.
    #[error(
        "the compile for {target} ran past {limit:?} and was stopped; large grids take minutes with the profile (raise the limit or shrink the shapes)"
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
        "libtpu compiled the module for {target} but wrote no static profile: it writes none for a program that runs on the SparseCore only; otherwise, is `{PROFILE_FLAG}` overridden in LIBTPU_INIT_ARGS?"
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

/// What the plain compile in a child reports.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildCompiled {
    /// The generation.
    pub target: Target,
    /// Wall time of the compile inside the child.
    pub compile_time: Duration,
    /// Device memory the program needs, as the compiler reports it.
    pub memory: CompiledMemoryStats,
    /// The serialized executable, when asked for.
    pub executable: Option<Vec<u8>>,
}

/// Starts the child that compiles one module: plain ([`ChildCompiler::compile`])
/// or with libtpu's static profile ([`ChildCompiler::estimate`]).
#[derive(Clone, Debug)]
pub struct ChildCompiler {
    program: PathBuf,
    args: Vec<OsString>,
    /// Extra environment of the child (what tells a test binary's hook
    /// test to serve the compile).
    env: Vec<(OsString, OsString)>,
    /// Longest a compile may take.
    pub timeout: Duration,
    /// Whether to dump and count the executed bundle trace (`vmatmul`);
    /// it is large (tens of MB per thousand grid steps) but is the only
    /// check that the profiler ran all the work.
    pub unrolled: bool,
}

/// What one child run is for.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Profile,
    Plain { executable: bool },
}

impl ChildCompiler {
    /// A child started as `program args.. TARGET MODULE REPORT [EXECUTABLE]`:
    /// the program must call [`serve_child`] with those arguments.
    pub fn new<I, S>(program: impl Into<PathBuf>, args: I) -> ChildCompiler
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        ChildCompiler {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            timeout: Duration::from_secs(600),
            unrolled: true,
        }
    }

    /// The same child with `key=value` in its environment.
    pub fn with_env(
        mut self,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> ChildCompiler {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Compiles `module` (StableHLO text) for `target` in a child process
    /// with libtpu's static profiler on, and returns its estimate.
    pub fn estimate(&self, target: Target, module: &str) -> Result<ModuleEstimate, ChildError> {
        let start = Instant::now();
        let (dir, _) = self.run(target, module, Mode::Profile)?;
        let profile = dir.path.join("profile");
        if let Some(keep) = std::env::var_os(KEEP_PROFILE_ENV) {
            keep_profile(&profile, &Path::new(&keep).join(target.to_string()))?;
        }
        let ops = read_profile(&profile).map_err(|source| ChildError::Io {
            what: "reading libtpu's profile".into(),
            source,
        })?;
        if ops.is_empty() {
            return Err(ChildError::NoProfile { target });
        }
        Ok(ModuleEstimate {
            target,
            ops,
            wall: start.elapsed(),
        })
    }

    /// Compiles `module` for `target` in a child process (an abort of
    /// libtpu is a [`ChildError::CompilerAborted`], not the caller's end),
    /// with the serialized executable when `executable` is set.
    pub fn compile(
        &self,
        target: Target,
        module: &str,
        executable: bool,
    ) -> Result<ChildCompiled, ChildError> {
        let (dir, report) = self.run(target, module, Mode::Plain { executable })?;
        let mut memory = CompiledMemoryStats::default();
        let mut compile_time = Duration::ZERO;
        for line in report.lines() {
            let Some((k, v)) = line.split_once(' ') else {
                continue;
            };
            let Ok(n) = v.trim().parse::<i64>() else {
                continue;
            };
            match k {
                "compile_time_us" => compile_time = Duration::from_micros(n.max(0) as u64),
                "code_bytes" => memory.generated_code_bytes = n,
                "argument_bytes" => memory.argument_bytes = n,
                "output_bytes" => memory.output_bytes = n,
                "alias_bytes" => memory.alias_bytes = n,
                "temp_bytes" => memory.temp_bytes = n,
                "peak_bytes" => memory.peak_bytes = n,
                _ => {}
            }
        }
        let executable = if executable {
            let p = dir.path.join("executable");
            Some(std::fs::read(&p).map_err(|source| ChildError::Io {
                what: format!("reading the executable the child wrote to {}", p.display()),
                source,
            })?)
        } else {
            None
        };
        Ok(ChildCompiled {
            target,
            compile_time,
            memory,
            executable,
        })
    }

    /// One child run: the module written to a private folder, the child
    /// waited for within the time limit, its report read. Returns the
    /// folder (the dumps and the executable are in it) and the report's
    /// body after its `ok` line.
    fn run(
        &self,
        target: Target,
        module: &str,
        mode: Mode,
    ) -> Result<(PrivateDir, String), ChildError> {
        let dir = PrivateDir::new()?;
        let module_path = dir.path.join("module.mlir");
        let report = dir.path.join("report.txt");
        let dumps = dir.path.join("profile");
        std::fs::write(&module_path, module).map_err(|source| ChildError::Io {
            what: format!("writing {}", module_path.display()),
            source,
        })?;
        let mut flags = std::env::var("LIBTPU_INIT_ARGS").unwrap_or_default();
        if mode == Mode::Profile {
            flags.push_str(&format!(" {PROFILE_FLAG}={}", dumps.display()));
            if self.unrolled {
                flags.push_str(&format!(" {UNROLLED_FLAG}=true"));
            }
        }
        let start = Instant::now();
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .arg(target.name())
            .arg(&module_path)
            .arg(&report);
        if mode == (Mode::Plain { executable: true }) {
            cmd.arg(dir.path.join("executable"));
        }
        cmd.env("LIBTPU_INIT_ARGS", flags.trim())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // Its own process group, killed whole at the limit or once it has
        // exited; stderr drained as it comes, its end kept.
        let child = runtime::child::spawn(&mut cmd).map_err(|source| ChildError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        let left = self.timeout.saturating_sub(start.elapsed());
        let got = runtime::child::collect(child, left).map_err(|source| ChildError::Io {
            what: "waiting for the TPU compile child".into(),
            source,
        })?;
        let stderr = got.stderr;
        let Some(status) = got.status else {
            return Err(ChildError::Timeout {
                target,
                limit: self.timeout,
            });
        };
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                return Err(if mode == Mode::Profile {
                    ChildError::Aborted {
                        target,
                        signal,
                        stderr,
                    }
                } else {
                    ChildError::CompilerAborted {
                        target,
                        signal,
                        stderr,
                    }
                });
            }
        }
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        match ChildReport::parse(&text) {
            Some(ChildReport::Ok(body)) => Ok((dir, body)),
            Some(ChildReport::Compile { code, message }) => Err(ChildError::Compile {
                target,
                diagnostic: CompilerDiagnostic::parse(&message, code),
            }),
            Some(ChildReport::Setup(m)) => Err(ChildError::Setup(m)),
            None => Err(ChildError::Child {
                target,
                message: format!(
                    "exit status {}, no report{}",
                    status.code().unwrap_or(-1),
                    tail(&stderr)
                ),
            }),
        }
    }
}

/// What most likely made libtpu end the process with `signal`.
fn likely_cause(signal: i32) -> &'static str {
    match signal {
        libc::SIGKILL => {
            "killed, most likely for memory (a tensor or grid too large for the compiler); shrink the shapes"
        }
        libc::SIGSEGV | libc::SIGBUS => {
            "a crash inside libtpu; the module is likely outside what this libtpu supports"
        }
        _ => {
            "a failed check inside libtpu or memory it could not get (a shape or size it cannot handle, or a memory limit on this process); shrink the shapes or split the program"
        }
    }
}

/// A folder of our own under the temp dir, removed with everything in it
/// when dropped (also on every error path).
/// The variable that keeps each estimate's profile (the static profile and
/// the executed bundle trace, libtpu's internals, for a bundle-level look
/// at an estimate) in `$TESSERA_KEEP_PROFILE/<generation>/`, replacing
/// what an earlier estimate for that generation left there.
pub const KEEP_PROFILE_ENV: &str = "TESSERA_KEEP_PROFILE";

/// Copies the profile folder `from` to `to` (made anew).
fn keep_profile(from: &Path, to: &Path) -> Result<(), ChildError> {
    let io = |what: String| move |source| ChildError::Io { what, source };
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(io(format!("clearing {}", to.display())))?;
    }
    std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
    let entries = match std::fs::read_dir(from) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("reading {}", from.display()))(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(format!("reading {}", from.display())))?;
        let dest = to.join(entry.file_name());
        std::fs::copy(entry.path(), &dest).map_err(io(format!("writing {}", dest.display())))?;
    }
    Ok(())
}

pub(crate) struct PrivateDir {
    pub(crate) path: PathBuf,
}

impl PrivateDir {
    pub(crate) fn new() -> Result<PrivateDir, ChildError> {
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
                    return Err(ChildError::Io {
                        what: format!("creating {}", path.display()),
                        source,
                    });
                }
            }
        }
        Err(ChildError::Io {
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

/// What the child reports in its report file.
enum ChildReport {
    Ok(String),
    Compile { code: i32, message: String },
    Setup(String),
}

impl ChildReport {
    fn parse(text: &str) -> Option<ChildReport> {
        let (head, rest) = text.split_once('\n').unwrap_or((text, ""));
        match head.trim() {
            "ok" => Some(ChildReport::Ok(rest.to_string())),
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

/// The child's side: `args` are `TARGET MODULE REPORT [EXECUTABLE]`.
/// Compiles the module at MODULE for TARGET (libtpu reads any profile flags
/// the parent put in `LIBTPU_INIT_ARGS`), writes the serialized executable
/// to EXECUTABLE if given, and the outcome to REPORT. Returns the exit
/// status: 0 when a report was written, 2 for bad arguments.
pub fn serve_child(args: &[String]) -> i32 {
    let (target, module, report, executable) = match args {
        [t, m, r] => (t, m, r, None),
        [t, m, r, e] => (t, m, r, Some(e)),
        _ => {
            eprintln!("usage: TARGET MODULE REPORT [EXECUTABLE] (started by crate::child)");
            return 2;
        }
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
    let compiled = TpuCompiler::load().and_then(|c| c.compile(target, &text));
    let saved = match (&compiled, executable) {
        (Ok(c), Some(path)) => match c.serialize() {
            Ok(bytes) => {
                std::fs::write(path, bytes).map_err(|e| format!("cannot write {path}: {e}"))
            }
            Err(e) => Err(e.to_string()),
        },
        _ => Ok(()),
    };
    let outcome = match compiled {
        Ok(_) if saved.is_err() => format!("setup\n{}", saved.err().unwrap_or_default()),
        Ok(c) => {
            let m = &c.memory;
            format!(
                "ok\ncompile_time_us {}\ncode_bytes {}\nargument_bytes {}\noutput_bytes {}\nalias_bytes {}\ntemp_bytes {}\npeak_bytes {}\n",
                c.compile_time.as_micros(),
                c.code_bytes,
                m.argument_bytes,
                m.output_bytes,
                m.alias_bytes,
                m.temp_bytes,
                m.peak_bytes
            )
        }
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
    fn child_reports_parse_and_garbage_is_no_report() {
        assert!(matches!(
            ChildReport::parse("ok\n"),
            Some(ChildReport::Ok(_))
        ));
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
        assert!(matches!(e, ChildError::Spawn { .. }), "{e}");
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
            ChildError::Aborted { signal, .. } => assert_eq!(*signal, 6),
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
    fn a_plain_compile_killed_by_a_signal_names_libtpu_not_the_profiler() {
        let c = ChildCompiler::new("/bin/sh", ["-c", "kill -ABRT $$", "sh"]);
        let e = c.compile(Target::V5e, "module {}", false).unwrap_err();
        assert!(
            matches!(e, ChildError::CompilerAborted { signal: 6, .. }),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("libtpu aborted the compile for v5e (signal 6)")
                && !msg.contains("profiler"),
            "{msg}"
        );
        let c = ChildCompiler::new("/bin/sh", ["-c", "kill -KILL $$", "sh"]);
        let msg = c
            .compile(Target::V6e, "module {}", true)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("signal 9") && msg.contains("memory"), "{msg}");
    }

    #[test]
    fn a_plain_report_gives_the_memory_and_the_executable() {
        // A child that writes what serve_child writes: a report, and the
        // executable at the fourth argument.
        let script = "printf 'ok\\ncompile_time_us 1500\\ncode_bytes 7\\npeak_bytes 42\\n' > \"$3\"; printf exe > \"$4\"";
        let c = ChildCompiler::new("/bin/sh", ["-c", script, "sh"]);
        let r = c.compile(Target::V5e, "module {}", true).unwrap();
        assert_eq!(r.compile_time, Duration::from_micros(1500));
        assert_eq!(
            (r.memory.generated_code_bytes, r.memory.peak_bytes),
            (7, 42)
        );
        assert_eq!(r.executable.as_deref(), Some(&b"exe"[..]));
    }

    #[test]
    fn a_child_past_its_limit_is_stopped() {
        let mut c = ChildCompiler::new("/bin/sh", ["-c", "sleep 30", "sh"]);
        c.timeout = Duration::from_millis(200);
        let t = Instant::now();
        let e = c.estimate(Target::V5e, "module {}").unwrap_err();
        assert!(matches!(e, ChildError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
