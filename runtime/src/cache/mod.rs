//! The compile cache: compiled executables by key, in three tiers.
//!
//! 1. **In-process**: a map from key to a once-cell; concurrent requests for
//!    one key wait for the one compile (or load) in flight and share it.
//! 2. **Disk** (module `disk`): shared by processes, owner-only, locked per key,
//!    written atomically, checksummed.
//! 3. **Remote**: anything implementing [`RemoteCache`]; off unless the
//!    runtime is given one. Entries carry the same checksummed envelope.
//!
//! The key is the SHA-256 of everything that determines the program: the
//! canonical module text, compile options, plugin platform and version, and
//! Tessera's version.

pub(crate) mod disk;

pub use disk::{DiskCache, DiskError, EntryError};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::pjrt::{Client, CompileOptions, Executable};
use disk::Read;

/// A remote store of cache entries (opaque bytes by key).
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use runtime::cache::{RemoteCache, RemoteError};
///
/// #[derive(Default)]
/// struct InMemory(Mutex<HashMap<String, Vec<u8>>>);
///
/// impl RemoteCache for InMemory {
///     fn get(&self, key: &str) -> Result<Option<Vec<u8>>, RemoteError> {
///         Ok(self.0.lock().unwrap().get(key).cloned())
///     }
///     fn put(&self, key: &str, entry: &[u8]) -> Result<(), RemoteError> {
///         self.0.lock().unwrap().insert(key.to_string(), entry.to_vec());
///         Ok(())
///     }
/// }
/// ```
pub trait RemoteCache: Send + Sync {
    /// The entry stored under `key`, if any.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, RemoteError>;
    /// Stores `entry` under `key`.
    fn put(&self, key: &str, entry: &[u8]) -> Result<(), RemoteError>;
}

/// A remote store's own error, whatever its type (an I/O error, an HTTP
/// client's): the cache is best effort, so a failed `get` is a miss and a
/// failed `put` leaves the entry local, but the error stays typed for an
/// implementation's own tests and logs.
pub type RemoteError = Box<dyn std::error::Error + Send + Sync>;

/// Checks a cache entry file's bytes (header, length, checksum): `Ok` with
/// the payload size, or why it would be dropped and recompiled.
pub fn check_entry(bytes: &[u8]) -> Result<usize, EntryError> {
    disk::open_envelope(bytes).map(<[u8]>::len)
}

/// Where an executable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// This process had it (or was compiling it).
    Memory,
    /// Loaded from the disk cache.
    Disk,
    /// Loaded from the remote cache.
    Remote,
    /// Compiled now.
    Compiled,
}

/// The outcome of one look-up.
#[derive(Debug)]
pub struct Lookup {
    /// The program, compiled for the cache's client.
    pub executable: Arc<Executable>,
    /// Where it came from.
    pub tier: Tier,
    /// Compile time when compiled now.
    pub compile_time: Duration,
    /// Disk or remote entries found corrupt and dropped on the way.
    pub corrupt: u64,
}

/// Why a program could not be had from the cache.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    /// The plugin refused to compile it (kept typed: the graph runtime
    /// reports it as its `Cause::Pjrt`).
    #[error(transparent)]
    Compile(#[from] crate::pjrt::PjrtError),
    /// The disk tier could not be used (its lock could not be taken).
    #[error(transparent)]
    Disk(#[from] DiskError),
}

type Slot = Arc<OnceLock<Result<(Arc<Executable>, Tier, Duration, u64), CacheError>>>;

/// The three tiers: what the graph runtime compiles through.
pub struct CompileCache {
    memory: Mutex<HashMap<String, Slot>>,
    disk: Option<DiskCache>,
    remote: Option<Arc<dyn RemoteCache>>,
}

impl std::fmt::Debug for CompileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileCache")
            .field("disk", &self.disk)
            .field("remote", &self.remote.is_some())
            .finish()
    }
}

/// The cache key of a program.
pub fn key(module: &str, options: &CompileOptions, client: &Client) -> String {
    let mut h = Sha256::new();
    h.update(b"tessera ");
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update(b"\nplatform ");
    h.update(client.platform().as_bytes());
    h.update(b" ");
    h.update(client.platform_version().as_bytes());
    let (major, minor) = client.plugin().version;
    h.update(format!(" pjrt {major}.{minor}").as_bytes());
    h.update(
        format!(
            "\noptions {} {}\n",
            options.num_replicas, options.num_partitions
        )
        .as_bytes(),
    );
    h.update(module.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl CompileCache {
    /// A cache over the tiers given (memory always).
    pub fn new(disk: Option<DiskCache>, remote: Option<Arc<dyn RemoteCache>>) -> CompileCache {
        CompileCache {
            memory: Mutex::new(HashMap::new()),
            disk,
            remote,
        }
    }

    /// The executable for `key`, from the fastest tier that has it, else
    /// compiled from `module` (and stored in every tier).
    pub fn get(
        &self,
        key: &str,
        module: &str,
        options: &CompileOptions,
        client: &Client,
    ) -> Result<Lookup, CacheError> {
        let slot = {
            let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
            m.entry(key.to_string()).or_default().clone()
        };
        let mut initialized_here = false;
        let r = slot
            .get_or_init(|| {
                initialized_here = true;
                self.load_or_compile(key, module, options, client)
            })
            .clone();
        match r {
            Ok((exe, tier, t, corrupt)) => Ok(Lookup {
                executable: exe,
                tier: if initialized_here { tier } else { Tier::Memory },
                compile_time: if initialized_here { t } else { Duration::ZERO },
                corrupt: if initialized_here { corrupt } else { 0 },
            }),
            Err(e) => {
                // Failures are not cached: a later request tries again.
                let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
                if m.get(key).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                    m.remove(key);
                }
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn load_or_compile(
        &self,
        key: &str,
        module: &str,
        options: &CompileOptions,
        client: &Client,
    ) -> Result<(Arc<Executable>, Tier, Duration, u64), CacheError> {
        let mut corrupt = 0;
        // Held until the entry is written, so other processes wait for it.
        let _lock = match &self.disk {
            Some(d) => Some(d.lock(key)?),
            None => None,
        };
        if let Some(d) = &self.disk {
            match d.read(key) {
                Read::Valid(bytes) => match client.deserialize(&bytes) {
                    Ok(exe) => return Ok((Arc::new(exe), Tier::Disk, Duration::ZERO, corrupt)),
                    Err(_) => {
                        corrupt += 1;
                        d.remove(key);
                    }
                },
                Read::Corrupt => {
                    corrupt += 1;
                    d.remove(key);
                }
                Read::Missing => {}
            }
        }
        if let Some(r) = &self.remote
            && let Ok(Some(entry)) = r.get(key)
        {
            match disk::open_envelope(&entry).map(|p| client.deserialize(p)) {
                Ok(Ok(exe)) => {
                    if let (Some(d), Ok(bytes)) = (&self.disk, exe.serialize()) {
                        let _ = d.write(key, &bytes);
                    }
                    return Ok((Arc::new(exe), Tier::Remote, Duration::ZERO, corrupt));
                }
                _ => corrupt += 1,
            }
        }
        let t = Instant::now();
        let exe = client.compile(module.as_bytes(), options)?;
        let elapsed = t.elapsed();
        if self.disk.is_some() || self.remote.is_some() {
            // Not every plugin serializes; then only this process caches.
            if let Ok(bytes) = exe.serialize() {
                if let Some(d) = &self.disk {
                    let _ = d.write(key, &bytes);
                }
                if let Some(r) = &self.remote {
                    let _ = r.put(key, &disk::envelope(&bytes));
                }
            }
        }
        Ok((Arc::new(exe), Tier::Compiled, elapsed, corrupt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: &str = r#"func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "stablehlo.negate"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}"#;

    #[test]
    fn concurrent_requests_for_one_key_share_one_compile() {
        let client = crate::backend::cpu_client().unwrap();
        let cache = CompileCache::new(None, None);
        let opts = CompileOptions::default();
        let key = key(NEG, &opts, client);
        let tiers: Vec<Tier> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| cache.get(&key, NEG, &opts, client).unwrap().tier))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            tiers.iter().filter(|t| **t == Tier::Compiled).count(),
            1,
            "{tiers:?}"
        );
        assert_eq!(
            tiers.iter().filter(|t| **t == Tier::Memory).count(),
            7,
            "{tiers:?}"
        );
        // A failed compile is not cached: the next request tries again.
        let bad = "func.func @main() { nonsense }";
        let k2 = super::key(bad, &opts, client);
        assert!(cache.get(&k2, bad, &opts, client).is_err());
        // ... and stays the plugin's typed error, which the graph runtime
        // reports as `Cause::Pjrt` (its own test).
        let e = cache.get(&k2, bad, &opts, client).unwrap_err();
        assert!(matches!(e, CacheError::Compile(_)), "{e:?}");
    }

    #[test]
    fn keys_cover_the_module_and_the_options() {
        let client = crate::backend::cpu_client().unwrap();
        let one = CompileOptions::default();
        let two = CompileOptions {
            num_replicas: 2,
            num_partitions: 1,
            static_assignment: false,
            shardy: false,
        };
        assert_eq!(key(NEG, &one, client), key(NEG, &one, client));
        assert_ne!(key(NEG, &one, client), key(NEG, &two, client));
        assert_ne!(
            key(NEG, &one, client),
            key(&NEG.replace("negate", "abs"), &one, client)
        );
    }
}
