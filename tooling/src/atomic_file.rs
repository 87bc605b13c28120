//! Files written all or nothing: into a temporary file beside the target,
//! flushed to disk, then renamed over it. A reader sees the old file or the
//! whole new one; a full disk or a crash leaves no half-written output
//! (and the temporary file is removed on failure).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a file was not written (nothing was: the target is as it was).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The target exists and is not a regular file: the rename would
    /// replace a device node, a FIFO or a directory.
    #[error(
        "{} exists and is not a regular file; name a new file or a regular one to replace",
        .0.display()
    )]
    NotARegularFile(PathBuf),
    /// The caller's own name is taken by a directory.
    #[error("{} is a directory; remove it (the name is a checkpoint's file)", .0.display())]
    Directory(PathBuf),
    /// Creating, writing, syncing or renaming failed.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The target file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// For the callers that report in words.
impl From<WriteError> for String {
    fn from(e: WriteError) -> String {
        e.to_string()
    }
}

/// The temporary name `write` uses for `path`.
fn temp_path(path: &Path) -> PathBuf {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}.tmp-{}", std::process::id()))
}

/// A file staged for an all-or-nothing write: [`Staged::commit`] puts it
/// in place, dropping it without committing removes it.
#[derive(Debug)]
pub struct Staged {
    temp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staged {
    /// Writes `bytes` to a temporary file beside `path` and syncs it.
    /// Refuses a `path` that exists and is not a regular file (a device
    /// node, a FIFO, a directory, a link to one): the rename would replace
    /// it, and run as root `--out /dev/null` would replace `/dev/null`.
    pub fn new(path: &Path, bytes: &[u8]) -> Result<Staged, WriteError> {
        if let Ok(meta) = std::fs::metadata(path)
            && !meta.is_file()
        {
            return Err(WriteError::NotARegularFile(path.to_path_buf()));
        }
        Staged::stage(path, bytes)
    }

    /// As [`Staged::new`], for a name the caller owns in a directory it
    /// holds (a checkpoint's file in a locked checkpoint directory): any
    /// entry there but a directory is replaced, a FIFO or a link left in
    /// its place included (the rename replaces the entry, never what a
    /// link points to).
    pub fn new_own(path: &Path, bytes: &[u8]) -> Result<Staged, WriteError> {
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.is_dir()
        {
            return Err(WriteError::Directory(path.to_path_buf()));
        }
        Staged::stage(path, bytes)
    }

    fn stage(path: &Path, bytes: &[u8]) -> Result<Staged, WriteError> {
        let temp = temp_path(path);
        let staged = Staged {
            temp: temp.clone(),
            target: path.to_path_buf(),
            committed: false,
        };
        let io = |source| WriteError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = std::fs::File::create(&temp).map_err(io)?;
        f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)?;
        Ok(staged)
    }

    /// Renames the temporary file over the target.
    pub fn commit(mut self) -> Result<(), WriteError> {
        std::fs::rename(&self.temp, &self.target).map_err(|source| WriteError::Io {
            path: self.target.clone(),
            source,
        })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Writes `bytes` to `path` all or nothing.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    Staged::new(path, bytes)?.commit()
}

/// Writes `bytes` to `path` all or nothing, replacing any entry but a
/// directory there (see [`Staged::new_own`]).
pub fn write_own(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    Staged::new_own(path, bytes)?.commit()
}

/// Writes several files all or nothing: every one is staged first, and only
/// when all are staged are they renamed into place.
pub fn write_all(files: &[(PathBuf, Vec<u8>)]) -> Result<(), WriteError> {
    let staged = files
        .iter()
        .map(|(p, b)| Staged::new(p, b))
        .collect::<Result<Vec<_>, _>>()?;
    staged.into_iter().try_for_each(Staged::commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_batch_leaves_nothing_behind() {
        let dir = std::env::temp_dir().join(format!("tessera-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("a.bin");
        std::fs::write(&ok, b"old").unwrap();
        // The second file's folder does not exist: nothing is written.
        let bad = dir.join("missing").join("b.bin");
        let e = write_all(&[(ok.clone(), b"new".to_vec()), (bad, b"x".to_vec())]);
        assert!(e.is_err());
        assert_eq!(std::fs::read(&ok).unwrap(), b"old");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
        write_all(&[(ok.clone(), b"new".to_vec())]).unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn what_is_not_a_regular_file_is_never_replaced() {
        let d = std::env::temp_dir().join(format!("tessera-atomic-nonreg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        // A directory, and a FIFO (what a device node is to this check).
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for p in [
            d.join("sub"),
            fifo.clone(),
            std::path::PathBuf::from("/dev/null"),
        ] {
            let e = write(&p, b"x").unwrap_err();
            assert!(
                matches!(&e, WriteError::NotARegularFile(at) if *at == p),
                "{e:?}"
            );
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
        let meta = std::fs::symlink_metadata(&fifo).unwrap();
        assert!(!meta.is_file(), "the FIFO is still a FIFO");
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        // A regular file is still replaced whole.
        let f = d.join("f");
        write(&f, b"old").unwrap();
        write(&f, b"new").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"new");
        let _ = std::fs::remove_dir_all(&d);
    }
}
