//! Child processes (Triton's compiler and interpreter, libtpu) that cannot
//! hang a command or outlive it.
//!
//! A child runs in a process group of its own, so it and everything it
//! starts are killed together ([`kill_group`]): at its time limit, and as
//! soon as it has exited, so that a grandchild still holding its pipes
//! (Triton runs `ptxas` with `close_fds=False`) neither delays the read
//! nor lingers. On Linux a child collected by the thread that started it
//! is also killed when that thread dies ([`spawn`]: `PR_SET_PDEATHSIG`),
//! since a group of its own no longer gets the terminal's Ctrl-C; a
//! pooled child ([`spawn_pooled`]) ends at the end of its input. [`collect`] reads a child's output, stops when it
//! exits, and keeps its stderr's end whatever ended it.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long output is still read once the child has exited and its group
/// is killed: what it wrote is in the pipe by then.
const GRACE: Duration = Duration::from_secs(1);

/// The most of a child's stderr that is kept (its end).
const STDERR_KEPT: usize = 32 * 1024;

/// The default of [`timeout`]: ten minutes.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

static TIMEOUT_MS: AtomicU64 = AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64);

/// How long one request to a long-lived child (Triton's interpreter
/// running a kernel) may take before the child and what it started are
/// killed: [`DEFAULT_TIMEOUT`] unless [`set_timeout`] said otherwise (the
/// CLI's `--timeout`).
pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// Sets [`timeout`] for this process.
pub fn set_timeout(d: Duration) {
    TIMEOUT_MS.store(
        d.as_millis().min(u64::MAX as u128) as u64,
        Ordering::Relaxed,
    );
}

/// Runs `f` (a blocking exchange with the child of process id `pid`) and
/// kills that child's group if `f` has not returned within `limit`; true
/// in the second element when it was killed for that.
pub fn within<T>(pid: u32, limit: Duration, f: impl FnOnce() -> T) -> (T, bool) {
    let (done, wait) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || match wait.recv_timeout(limit) {
        Err(mpsc::RecvTimeoutError::Timeout) => {
            kill_pgid(pid);
            true
        }
        _ => false,
    });
    let out = f();
    let _ = done.send(());
    let killed = watchdog.join().unwrap_or(false);
    (out, killed)
}

/// Starts `cmd` in a process group of its own (see the module docs), to
/// be collected by the thread that starts it: on Linux the child is
/// killed when that thread ends (`PR_SET_PDEATHSIG` follows the thread,
/// not the process), so a command killed mid-compile takes its compiler
/// with it.
pub fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
}

/// Starts `cmd` in a process group of its own, for a child that outlives
/// the thread that starts it (a pooled interpreter serving any thread):
/// no death signal, so it must end by itself when its parent does (at
/// the end of its standard input).
pub fn spawn_pooled(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0).spawn()
}

/// Kills `child`'s process group (the child and what it started) and
/// reaps the child.
pub fn kill_group(child: &mut Child) {
    kill_pgid(child.id());
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGKILL to the process group a child of id `pid` leads.
fn kill_pgid(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: a plain syscall; -pid names the group `spawn` made.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// What a collected child gave.
#[derive(Debug)]
pub struct Collected {
    /// Its exit status; `None` when it ran past its time limit and was
    /// killed.
    pub status: Option<ExitStatus>,
    /// Its stdout, line by line.
    pub lines: Vec<String>,
    /// The end of its stderr (the last 32 KiB).
    pub stderr: String,
}

/// Reads `child`'s stdout and stderr (both piped) until it exits or
/// `timeout` passes, then kills its group and returns what it wrote.
pub fn collect(mut child: Child, timeout: Duration) -> std::io::Result<Collected> {
    // Each reader owns its sender: a pipe that is not there (or has
    // ended) leaves a disconnected channel, never a wait.
    let lines_rx = child.stdout.take().map(|out| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        rx
    });
    let err_rx = child.stderr.take().map(|mut err| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut keep = Vec::new();
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                keep.extend_from_slice(&buf[..n]);
                if keep.len() > 2 * STDERR_KEPT {
                    keep.drain(..keep.len() - STDERR_KEPT);
                }
                // Each piece as it comes: a reader blocked by a grandchild
                // still gives what it has.
                let _ = tx.send(String::from_utf8_lossy(&keep).into_owned());
            }
        });
        rx
    });
    let start = Instant::now();
    let mut lines = Vec::new();
    let status = loop {
        if let Some(rx) = &lines_rx {
            lines.extend(rx.try_iter());
        }
        match child.try_wait()? {
            Some(s) => break Some(s),
            None if start.elapsed() > timeout => break None,
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    kill_group(&mut child);
    if let Some(rx) = &lines_rx {
        let until = Instant::now() + GRACE;
        while let Ok(l) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            lines.push(l);
        }
    }
    let mut stderr = String::new();
    if let Some(rx) = &err_rx {
        while let Ok(s) = rx.recv_timeout(GRACE) {
            stderr = s;
        }
    }
    Ok(Collected {
        status,
        lines,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn sh(script: &str) -> Child {
        spawn(
            Command::new("/bin/sh")
                .args(["-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .unwrap()
    }

    /// Issue 70's ninth finding: a grandchild holding the pipe made a
    /// 1 s child take 20 s (and one that never exits, for ever).
    #[test]
    fn a_lingering_grandchild_neither_delays_nor_outlives_the_read() {
        let start = Instant::now();
        let c = sh("sleep 30 & echo report; echo said >&2");
        let got = collect(c, Duration::from_secs(20)).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        assert!(got.status.is_some_and(|s| s.success()));
        assert_eq!(got.lines, ["report"]);
        assert_eq!(got.stderr, "said\n");
    }

    /// A child without a stdout pipe (libtpu's) costs no grace wait.
    #[test]
    fn a_missing_pipe_is_no_wait() {
        let c = spawn(
            Command::new("/bin/sh")
                .args(["-c", "echo err >&2"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        )
        .unwrap();
        let start = Instant::now();
        let got = collect(c, Duration::from_secs(20)).unwrap();
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(got.stderr, "err\n");
    }

    #[test]
    fn a_child_past_its_limit_is_killed_with_its_stderr_kept() {
        let start = Instant::now();
        let c = sh("echo before >&2; sleep 30");
        let got = collect(c, Duration::from_millis(300)).unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(got.status.is_none());
        assert_eq!(got.stderr, "before\n");
    }

    #[test]
    fn a_blocking_exchange_past_its_limit_kills_the_child() {
        let mut c = spawn(
            Command::new("/bin/sh")
                .args(["-c", "sleep 30"])
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let mut out = c.stdout.take().unwrap();
        let start = Instant::now();
        let (n, killed) = within(c.id(), Duration::from_millis(300), || {
            out.read(&mut [0u8; 16]).unwrap_or(0)
        });
        assert!(killed && n == 0 && start.elapsed() < Duration::from_secs(5));
        let _ = c.wait();
        let (v, killed) = within(c.id(), Duration::from_secs(5), || 7);
        assert!(v == 7 && !killed);
    }

    #[test]
    fn a_child_killed_by_a_signal_keeps_its_stderr() {
        use std::os::unix::process::ExitStatusExt;
        let c = sh("echo dying >&2; kill -KILL $$");
        let got = collect(c, Duration::from_secs(20)).unwrap();
        assert_eq!(got.status.and_then(|s| s.signal()), Some(libc::SIGKILL));
        assert_eq!(got.stderr, "dying\n");
    }
}
