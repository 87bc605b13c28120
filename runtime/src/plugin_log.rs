//! Plugin logging kept off the terminal unless asked for.
//!
//! PJRT plugins log through absl straight to file descriptor 2, bypassing
//! Rust's `eprintln!`; libtpu prints set-up warnings on load even when all
//! is well. While a plugin loads or initializes, Tessera points fd 2 at a
//! temporary file and keeps what was written, so a failure can still show
//! it. `TESSERA_PLUGIN_LOG=1` lets the plugin write to the terminal.
//!
//! Other threads' raw writes to fd 2 during that window go to the same
//! file; Rust's own `eprintln!` in tests is captured by the test harness
//! and unaffected.

use std::io::{Read, Seek};
use std::os::fd::AsRawFd;
use std::sync::Mutex;

/// Environment variable that lets plugins log to the terminal.
pub const PLUGIN_LOG_ENV: &str = "TESSERA_PLUGIN_LOG";

/// Whether plugin logging goes to the terminal.
pub fn verbose() -> bool {
    std::env::var_os(PLUGIN_LOG_ENV).is_some_and(|v| v != "0" && !v.is_empty())
}

/// Runs `f` with fd 2 redirected to a temporary file; returns its result
/// and what was written there. Without a temporary file (or with
/// [`PLUGIN_LOG_ENV`] set) `f` runs with stderr as it is.
pub fn capture_stderr<T>(f: impl FnOnce() -> T) -> (T, String) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    if verbose() {
        return (f(), String::new());
    }
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(mut file) = tempfile_in_tmp() else {
        return (f(), String::new());
    };
    // SAFETY: dup/dup2 on the process's own stderr and a file we own; the
    // saved descriptor is restored and closed below on every path.
    let saved = unsafe { libc::dup(2) };
    if saved < 0 {
        return (f(), String::new());
    }
    // SAFETY: as above.
    unsafe { libc::dup2(file.as_raw_fd(), 2) };
    let out = f();
    // SAFETY: as above; restores the original stderr.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    (out, text)
}

/// An anonymous temporary file (unlinked at once).
fn tempfile_in_tmp() -> std::io::Result<std::fs::File> {
    let dir = std::env::temp_dir();
    for attempt in 0..16u32 {
        let path = dir.join(format!(
            ".tessera-plugin-log-{}-{}-{attempt}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => {
                let _ = std::fs::remove_file(&path);
                return Ok(f);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temporary file name"))
}
