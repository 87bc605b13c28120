//! Directories published all or nothing: every file is written into a
//! staging folder beside the target, synced, and the folder is then put in
//! place with one rename (or, over an earlier version, one atomic exchange
//! of the two folders, `renameat2(RENAME_EXCHANGE)`, after which the old
//! one is removed). A reader, or a kill at any moment, sees the old
//! directory or the whole new one, never a mix.
//!
//! What a kill can leave is a hidden `.NAME.staging-PID-N` folder beside
//! the target (the half-written new version, or the old one swapped out
//! and not yet removed); the next [`StagedDir::new`] for that target
//! removes those of processes that are gone.
//!
//! ```no_run
//! use tooling::atomic_dir::StagedDir;
//! let staged = StagedDir::new("out/artifact".as_ref(), |_| true)?;
//! staged.write("module.mlir", b"module {}")?;
//! staged.write("vjp/module.mlir", b"module {}")?;
//! staged.publish()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

/// A directory being built beside its target; dropped without
/// [`StagedDir::publish`], it is removed.
#[derive(Debug)]
pub struct StagedDir {
    staging: PathBuf,
    target: PathBuf,
    replaceable: fn(&Path) -> bool,
    published: bool,
}

fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether process `pid` is alive (`kill(pid, 0)`; EPERM means it is).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes staging folders of `target` whose process is gone.
fn remove_stale(target: &Path) {
    let prefix = format!(".{}.staging-", name_of(target));
    let Ok(entries) = std::fs::read_dir(parent_of(target)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !alive(pid)
            && e.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Why a directory could not be staged or published.
#[derive(Debug, Clone)]
pub enum StageError {
    /// The target exists and is not a directory.
    NotADirectory(PathBuf),
    /// The target is a non-empty directory the caller's predicate does not
    /// take for an earlier version of what is written.
    NotAnEarlierVersion(PathBuf),
    /// Reading or writing `path` failed.
    Io {
        /// What was being done (`create`, `read`, `write`).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::sync::Arc<std::io::Error>,
    },
}

impl StageError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StageError {
        let path = path.to_path_buf();
        move |e| StageError::Io {
            action,
            path,
            source: std::sync::Arc::new(e),
        }
    }
}

impl std::fmt::Display for StageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StageError::NotADirectory(p) => write!(
                f,
                "{} exists and is not a directory; name a new directory or an earlier one to replace",
                p.display()
            ),
            StageError::NotAnEarlierVersion(p) => write!(
                f,
                "{} exists and is not an earlier version of what is written; name a new directory (it is replaced whole)",
                p.display()
            ),
            StageError::Io {
                action,
                path,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for StageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StageError::Io { source, .. } => Some(source.as_ref()),
            _ => None,
        }
    }
}

impl StagedDir {
    /// A staging folder for `target`. `target` must not exist, or be a
    /// directory that is empty or that `replaceable` accepts (an earlier
    /// version of what is written; anything else is refused, so `--out
    /// $HOME` can never swap a home directory away).
    pub fn new(target: &Path, replaceable: fn(&Path) -> bool) -> Result<StagedDir, StageError> {
        check_replaceable(target, replaceable)?;
        let parent = parent_of(target);
        if !parent.is_dir() {
            std::fs::create_dir_all(parent).map_err(StageError::io("create", parent))?;
        }
        remove_stale(target);
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        for _ in 0..100 {
            let staging = parent.join(format!(
                ".{}.staging-{}-{}",
                name_of(target),
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::create_dir(&staging) {
                Ok(()) => {
                    return Ok(StagedDir {
                        staging,
                        target: target.to_path_buf(),
                        replaceable,
                        published: false,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(StageError::io("write", target)(e)),
            }
        }
        Err(StageError::io("write", target)(std::io::Error::other(
            "no free staging name",
        )))
    }

    /// The staging folder (where the files are until published).
    pub fn path(&self) -> &Path {
        &self.staging
    }

    /// Writes `bytes` at `rel` (a relative path, folders created) and
    /// syncs it. A `rel` that would leave the folder (absolute, or with a
    /// `..` or root component) is refused: nothing is written outside it.
    pub fn write(&self, rel: &str, bytes: &[u8]) -> Result<(), StageError> {
        let inside = Path::new(rel)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        if rel.is_empty() || !inside {
            return Err(StageError::io("write", &self.target)(
                std::io::Error::other(format!("{rel:?} is not a path inside the folder")),
            ));
        }
        let path = self.staging.join(rel);
        let fail = |e: std::io::Error| StageError::io("write", &self.target.join(rel))(e);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let mut f = std::fs::File::create(&path).map_err(fail)?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(fail)
    }

    /// Puts the folder in place of the target: a rename where there is
    /// none, else an atomic exchange with it and the old version removed.
    pub fn publish(mut self) -> Result<(), StageError> {
        let fail = |e: std::io::Error| StageError::io("write", &self.target)(e);
        sync_tree(&self.staging).map_err(fail)?;
        // Two writers may race: whichever publishes second exchanges with
        // the first's whole directory, so the result is one of them.
        loop {
            match std::fs::symlink_metadata(&self.target) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match std::fs::rename(&self.staging, &self.target) {
                        Ok(()) => break,
                        // Published by another writer in between.
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::ENOTEMPTY) | Some(libc::EEXIST)
                            ) =>
                        {
                            continue;
                        }
                        Err(e) => return Err(fail(e)),
                    }
                }
                Err(e) => return Err(fail(e)),
                Ok(_) => {
                    check_replaceable(&self.target, self.replaceable)?;
                    exchange(&self.staging, &self.target).map_err(fail)?;
                    // The staging name now holds the old version.
                    let _ = std::fs::remove_dir_all(&self.staging);
                    break;
                }
            }
        }
        self.published = true;
        if let Ok(d) = std::fs::File::open(parent_of(&self.target)) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}

/// Whether `target` may be replaced by a [`StagedDir`] with `replaceable`
/// (absent, an empty directory, or one `replaceable` accepts): what
/// [`StagedDir::new`] checks, for a command to say before its work, not
/// after it.
pub fn check_replaceable(target: &Path, replaceable: fn(&Path) -> bool) -> Result<(), StageError> {
    let Ok(meta) = std::fs::symlink_metadata(target) else {
        return Ok(());
    };
    if !meta.is_dir() {
        return Err(StageError::NotADirectory(target.to_path_buf()));
    }
    let empty = std::fs::read_dir(target)
        .map_err(StageError::io("read", target))?
        .next()
        .is_none();
    if empty || replaceable(target) {
        Ok(())
    } else {
        Err(StageError::NotAnEarlierVersion(target.to_path_buf()))
    }
}

/// Swaps two paths atomically (both must exist).
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("a path with a NUL byte"))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths, relative to the cwd.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Syncs every folder under `dir` (files are synced as written), so a
/// power cut after the rename cannot leave the new names without their
/// entries.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            sync_tree(&e.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("tessera-atomic-dir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn has_marker(p: &Path) -> bool {
        p.join("marker").is_file()
    }

    fn listing(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A path from outside (a kernel file's, say) never writes outside the
    /// staged folder (`compile --gpu --out` wrote the kept program at the
    /// kernel file's absolute path).
    #[test]
    fn a_path_that_leaves_the_folder_is_refused() {
        let d = scratch("escape");
        let t = d.join("art");
        let s = StagedDir::new(&t, has_marker).unwrap();
        let outside = d.join("outside");
        for rel in [
            outside.to_str().unwrap(),
            "../outside",
            "a/../../outside",
            "",
        ] {
            let e = s.write(rel, b"x").unwrap_err();
            assert!(e.to_string().contains("not a path inside"), "{rel}: {e}");
        }
        assert!(!outside.exists());
        s.write("a/b", b"x").unwrap();
    }

    #[test]
    fn a_published_folder_replaces_the_old_one_whole() {
        let d = scratch("replace");
        let t = d.join("art");
        let s = StagedDir::new(&t, has_marker).unwrap();
        s.write("marker", b"1").unwrap();
        s.write("sub/a", b"old").unwrap();
        s.write("only-old", b"x").unwrap();
        s.publish().unwrap();
        let s = StagedDir::new(&t, has_marker).unwrap();
        s.write("marker", b"2").unwrap();
        s.write("sub/a", b"new").unwrap();
        // Not yet published: the old version is what is there.
        assert_eq!(std::fs::read(t.join("sub/a")).unwrap(), b"old");
        s.publish().unwrap();
        assert_eq!(std::fs::read(t.join("sub/a")).unwrap(), b"new");
        assert!(
            !t.join("only-old").exists(),
            "nothing of the old one is kept"
        );
        assert_eq!(listing(&d), ["art"], "no staging folder is left");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_unpublished_folder_leaves_nothing_and_the_old_one_intact() {
        let d = scratch("drop");
        let t = d.join("art");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("marker"), b"old").unwrap();
        {
            let s = StagedDir::new(&t, has_marker).unwrap();
            s.write("marker", b"new").unwrap();
        }
        assert_eq!(std::fs::read(t.join("marker")).unwrap(), b"old");
        assert_eq!(listing(&d), ["art"]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn what_is_not_an_earlier_version_is_never_replaced() {
        let d = scratch("foreign");
        let t = d.join("home");
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("notes.txt"), b"mine").unwrap();
        let e = StagedDir::new(&t, has_marker).unwrap_err();
        assert!(
            matches!(&e, StageError::NotAnEarlierVersion(p) if *p == t),
            "{e}"
        );
        assert!(e.to_string().contains("not an earlier version"), "{e}");
        std::fs::write(d.join("file"), b"x").unwrap();
        let e = StagedDir::new(&d.join("file"), has_marker).unwrap_err();
        assert!(
            matches!(&e, StageError::NotADirectory(p) if *p == d.join("file")),
            "{e}"
        );
        assert_eq!(std::fs::read(t.join("notes.txt")).unwrap(), b"mine");
        // An empty directory is taken.
        std::fs::create_dir_all(d.join("empty")).unwrap();
        let s = StagedDir::new(&d.join("empty"), has_marker).unwrap();
        s.write("marker", b"1").unwrap();
        s.publish().unwrap();
        assert!(has_marker(&d.join("empty")));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn staging_folders_of_dead_processes_are_removed() {
        let d = scratch("stale");
        let t = d.join("art");
        // A pid that cannot be alive (above the kernel's pid_max limit).
        let stale = d.join(".art.staging-4194999-0");
        std::fs::create_dir_all(stale.join("vjp")).unwrap();
        let s = StagedDir::new(&t, has_marker).unwrap();
        assert!(!stale.exists());
        drop(s);
        let _ = std::fs::remove_dir_all(&d);
    }
}
