//! The on-disk tier: one file per key, shared by processes.
//!
//! * **Owner-only**: the directory is created with mode 0700, and an existing
//!   one that others can write is refused (or tightened when it is ours): a
//!   cached executable is code this process will run.
//! * **Per-key locks**: `<key>.lock` is locked exclusively (`flock`) around
//!   look-up, compile and write, so processes that want the same program
//!   compile it once and the others read it.
//! * **Atomic writes**: an entry is written to a unique temporary file,
//!   synced, then renamed over `<key>.exe`; readers never see half a file.
//! * **Checksums**: an entry is an envelope (magic, SHA-256 of the payload,
//!   payload length, payload); a truncated or corrupt entry is detected,
//!   removed and recompiled.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// First bytes of every entry.
const MAGIC: &[u8; 12] = b"TESSERA-EXE1";

/// An entry: magic, checksum, length, payload.
pub(crate) fn envelope(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 52);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&Sha256::digest(payload));
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Why an entry's bytes are unusable (the entry is dropped and the
/// program compiled again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// It does not start with Tessera's magic and checksum header.
    #[error("not a Tessera cache entry (bad header)")]
    BadHeader,
    /// Fewer (or more) payload bytes than the header says.
    #[error("truncated entry ({got} of {want} payload bytes)")]
    Truncated {
        /// Payload bytes present.
        got: usize,
        /// Payload bytes the header records.
        want: usize,
    },
    /// The payload's SHA-256 is not the header's.
    #[error("checksum mismatch")]
    Checksum,
}

/// Why the disk tier could not be used: each names the path and keeps the
/// OS's error (shared: a failed look-up is handed to every waiter).
#[derive(Debug, Clone, thiserror::Error)]
pub enum DiskError {
    /// The cache directory could not be created.
    #[error("cannot create the compile cache {}: {source}", dir.display())]
    Create {
        /// The directory.
        dir: PathBuf,
        /// The OS's error.
        source: Arc<std::io::Error>,
    },
    /// The cache directory's metadata could not be read.
    #[error("cannot read the compile cache {}: {source}", dir.display())]
    Metadata {
        /// The directory.
        dir: PathBuf,
        /// The OS's error.
        source: Arc<std::io::Error>,
    },
    /// Other users can write the directory (and it is not ours to tighten).
    #[error(
        "the compile cache {} is writable by other users, and a cached executable is code; run `chmod 700 {}` or choose another cache directory",
        dir.display(),
        dir.display()
    )]
    WritableByOthers {
        /// The directory.
        dir: PathBuf,
    },
    /// A key's lock file could not be opened or locked.
    #[error("cannot {action} {}: {source}", path.display())]
    Lock {
        /// `open` or `lock`.
        action: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The OS's error.
        source: Arc<std::io::Error>,
    },
    /// An entry could not be written.
    #[error("cannot write the compile cache entry {key}: {source}")]
    Write {
        /// The entry's key.
        key: String,
        /// The OS's error.
        source: Arc<std::io::Error>,
    },
}

/// The payload of an entry, or why the entry is unusable.
pub(crate) fn open_envelope(bytes: &[u8]) -> Result<&[u8], EntryError> {
    if bytes.len() < 52 || &bytes[..12] != MAGIC {
        return Err(EntryError::BadHeader);
    }
    let sum = &bytes[12..44];
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[44..52]);
    let len = u64::from_le_bytes(len) as usize;
    let payload = &bytes[52..];
    if payload.len() != len {
        return Err(EntryError::Truncated {
            got: payload.len(),
            want: len,
        });
    }
    if Sha256::digest(payload).as_slice() != sum {
        return Err(EntryError::Checksum);
    }
    Ok(payload)
}

/// What a read found.
pub(crate) enum Read {
    Missing,
    Valid(Vec<u8>),
    Corrupt,
}

/// The cache directory.
#[derive(Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

/// An exclusive lock on one key, released on drop.
pub(crate) struct KeyLock {
    file: File,
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

impl DiskCache {
    /// Opens (creating, owner-only) the cache directory.
    pub fn open(dir: &Path) -> Result<DiskCache, DiskError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| DiskError::Create {
                dir: dir.to_path_buf(),
                source: Arc::new(e),
            })?;
        let meta = std::fs::metadata(dir).map_err(|e| DiskError::Metadata {
            dir: dir.to_path_buf(),
            source: Arc::new(e),
        })?;
        if meta.mode() & 0o022 != 0 {
            let ours = current_uid().is_some_and(|u| u == meta.uid());
            if !ours
                || std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).is_err()
            {
                return Err(DiskError::WritableByOthers {
                    dir: dir.to_path_buf(),
                });
            }
        }
        Ok(DiskCache {
            dir: dir.to_path_buf(),
        })
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.exe"))
    }

    /// Locks `key` for this process (blocking while another holds it).
    pub(crate) fn lock(&self, key: &str) -> Result<KeyLock, DiskError> {
        let path = self.dir.join(format!("{key}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| DiskError::Lock {
                action: "open",
                path: path.clone(),
                source: Arc::new(e),
            })?;
        file.lock().map_err(|e| DiskError::Lock {
            action: "lock",
            path: path.clone(),
            source: Arc::new(e),
        })?;
        Ok(KeyLock { file })
    }

    pub(crate) fn read(&self, key: &str) -> Read {
        let path = self.entry(key);
        // Only a regular file is an entry: opening a FIFO put there would
        // block forever, a link to a device would read without end.
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Read::Missing,
            Ok(m) if m.is_file() => {}
            _ => return Read::Corrupt,
        }
        match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Missing,
            Err(_) => Read::Corrupt,
            Ok(bytes) => match open_envelope(&bytes) {
                Ok(p) => Read::Valid(p.to_vec()),
                Err(_) => Read::Corrupt,
            },
        }
    }

    pub(crate) fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.entry(key));
    }

    /// Writes `payload` for `key` atomically (temporary file, sync, rename).
    pub(crate) fn write(&self, key: &str, payload: &[u8]) -> Result<(), DiskError> {
        let tmp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .create_new(true)
                .write(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&envelope(payload))?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.entry(key))?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            DiskError::Write {
                key: key.to_string(),
                source: Arc::new(e),
            }
        })
    }
}

/// `OpenOptions::mode` lives in an extension trait.
use std::os::unix::fs::OpenOptionsExt;

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way an entry is unusable is its own variant, with the counts.
    #[test]
    fn damaged_entries_say_how() {
        let e = envelope(b"payload");
        assert_eq!(open_envelope(&e), Ok(&b"payload"[..]));
        assert_eq!(open_envelope(b"short"), Err(EntryError::BadHeader));
        assert_eq!(
            open_envelope(&e[..e.len() - 2]),
            Err(EntryError::Truncated { got: 5, want: 7 })
        );
        let mut flipped = e.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(open_envelope(&flipped), Err(EntryError::Checksum));
    }

    /// A cache directory that cannot be made is `Create`, naming it.
    #[test]
    fn a_directory_under_a_file_is_a_create_error() {
        let file = std::env::temp_dir().join(format!("tessera-disk-file-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let dir = file.join("cache");
        let e = DiskCache::open(&dir).unwrap_err();
        assert!(
            matches!(&e, DiskError::Create { dir: d, .. } if *d == dir),
            "{e:?}"
        );
        assert!(e.to_string().contains(&dir.display().to_string()), "{e}");
        let _ = std::fs::remove_file(&file);
    }

    /// A FIFO or a link to a device where an entry goes reads as a
    /// corrupt entry (dropped and compiled again), at once: reading the
    /// FIFO blocked `tessera train` forever.
    #[test]
    fn an_entry_that_is_not_a_regular_file_is_corrupt_not_read() {
        let dir = std::env::temp_dir().join(format!("tessera-disk-special-{}", std::process::id()));
        let cache = DiskCache::open(&dir).unwrap();
        let started = std::time::Instant::now();
        let made = std::process::Command::new("mkfifo")
            .arg(cache.entry("fifo"))
            .status();
        if made.is_ok_and(|s| s.success()) {
            assert!(matches!(cache.read("fifo"), Read::Corrupt));
        }
        std::os::unix::fs::symlink("/dev/zero", cache.entry("zero")).unwrap();
        assert!(matches!(cache.read("zero"), Read::Corrupt));
        assert!(matches!(cache.read("absent"), Read::Missing));
        assert!(started.elapsed().as_secs() < 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
