//! Checkpoints that survive preemption.
//!
//! A checkpoint at step `N` is two files in the checkpoint directory:
//! `step-0000000N.safetensors` (every tensor: parameters and optimizer
//! state, f32, in the safetensors layout: an 8-byte little-endian header
//! length, a JSON header naming each tensor's dtype, shape and byte range,
//! then the data) and `step-0000000N.json`, the manifest: step, optimizer
//! steps, generator state, data position, loss, and the tensor file's size
//! and SHA-256. Each file is written to a temporary name, synced and
//! renamed (the directory synced after), tensors first: the manifest is
//! the commit point, so a crash at any moment leaves either a whole
//! checkpoint or one without a manifest, which loading ignores.
//!
//! Loading takes the newest manifest whose tensor file has the recorded
//! size and checksum and parses; every checkpoint skipped is reported with
//! why. [`Writer`] saves on a background thread so training does not wait
//! for the disk; only the last [`KEEP`] checkpoints are kept.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use kernel_ir::sha256_hex;
use kernel_ir::{Array, DType};

use crate::atomic_file;

/// Checkpoints kept on disk (older ones are removed after a save).
pub const KEEP: usize = 3;

/// Why a checkpoint was not written, or a checkpoint directory not
/// taken or cleared (the messages are what `tessera train` prints).
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation in the directory failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// `create`, `remove`, `sync` or `read`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A checkpoint's file was not written (nothing of it was).
    #[error(transparent)]
    Write(#[from] atomic_file::WriteError),
    /// The directory given cannot be created.
    #[error("--checkpoint-dir {}: cannot create it: {source}", dir.display())]
    DirNotCreated {
        /// The directory.
        dir: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The directory given cannot be written (its lock file cannot be opened).
    #[error("--checkpoint-dir {} is not writable: {source}", dir.display())]
    DirNotWritable {
        /// The directory.
        dir: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// Another run holds the directory.
    #[error(
        "--checkpoint-dir {} is in use by another tessera train (it holds {}); wait for it or give another directory",
        dir.display(),
        lock.display()
    )]
    DirInUse {
        /// The directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
    },
    /// A tensor that is not f32.
    #[error("tensor `{name}` is {dtype}; checkpoints hold f32")]
    NotF32 {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: DType,
    },
}

/// Why bytes are not the safetensors file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafetensorsError {
    /// The header's length or its JSON is broken.
    #[error("{0}")]
    Header(String),
    /// A tensor's entry does not describe f32 data inside the file.
    #[error("tensor `{name}`: {why}")]
    Tensor {
        /// The tensor.
        name: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Why the checkpoint writer could not save.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriterError {
    /// Saving a step failed; nothing after it is saved.
    #[error("saving step {step}: {source}")]
    Save {
        /// The step.
        step: u64,
        /// Why.
        source: std::sync::Arc<CheckpointError>,
    },
    /// The writer's thread is gone (closed, or it panicked).
    #[error("the checkpoint writer {0}")]
    Stopped(&'static str),
}

impl CheckpointError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
        let path = path.to_path_buf();
        move |source| CheckpointError::Io {
            action,
            path,
            source,
        }
    }
}

const FORMAT: &str = "tessera-checkpoint-1";

/// Everything a resumed run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Training steps done.
    pub step: u64,
    /// The optimizer's step count.
    pub optimizer_steps: u64,
    /// The data generator's state.
    pub rng_state: u64,
    /// Sequences drawn so far.
    pub data_position: u64,
    /// The loss of the last step.
    pub loss: f64,
    /// Named f32 tensors (parameters, optimizer state).
    pub tensors: Vec<(String, Array)>,
    /// The run it belongs to: the settings that decide its numbers (seed,
    /// learning rate, model), as `(field, value)` pairs. A resume with
    /// other settings is refused naming the field.
    pub run: Vec<(String, String)>,
}

/// Removes every checkpoint in `dir` (manifests first, so none is left
/// pointing at removed tensors): a run started over (`--no-resume`) must
/// not leave an older run's checkpoints to be mixed with its own. Returns
/// how many were removed.
pub fn remove_all(dir: &Path) -> Result<usize, CheckpointError> {
    let all = manifests(dir)?;
    for (_, m) in &all {
        std::fs::remove_file(m).map_err(CheckpointError::io("remove", m))?;
    }
    sync_dir(dir)?;
    for (step, _) in &all {
        let _ = std::fs::remove_file(dir.join(format!("{}.safetensors", stem(*step))));
    }
    Ok(all.len())
}

fn stem(step: u64) -> String {
    format!("step-{step:010}")
}

/// The tensors in the safetensors layout.
pub fn encode_safetensors(tensors: &[(String, Array)]) -> Result<Vec<u8>, CheckpointError> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, a) in tensors {
        if a.dtype() != DType::F32 {
            return Err(CheckpointError::NotF32 {
                name: name.clone(),
                dtype: a.dtype(),
            });
        }
        let bytes = a.to_le_bytes();
        let start = data.len();
        data.extend_from_slice(&bytes);
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": "F32",
                "shape": a.shape(),
                "data_offsets": [start, data.len()],
            }),
        );
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    // The data starts 8-byte aligned, as the format recommends.
    while !(8 + h.len()).is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + data.len());
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    Ok(out)
}

/// The tensors of a safetensors file (f32 only), in header order.
pub fn decode_safetensors(bytes: &[u8]) -> Result<Vec<(String, Array)>, SafetensorsError> {
    let header = |why: &str| SafetensorsError::Header(why.to_string());
    let len = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| header("shorter than the 8-byte header length"))? as usize;
    let body = 8usize
        .checked_add(len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| header("the header runs past the end of the file"))?;
    let json: serde_json::Value = serde_json::from_slice(&bytes[8..body])
        .map_err(|e| header(&format!("the header is not JSON: {e}")))?;
    let obj = json
        .as_object()
        .ok_or_else(|| header("the header is not a JSON object"))?;
    let data = &bytes[body..];
    let mut out = Vec::new();
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let bad = |why: &str| SafetensorsError::Tensor {
            name: name.clone(),
            why: why.to_string(),
        };
        if info["dtype"] != "F32" {
            return Err(bad("not F32"));
        }
        let shape: Vec<usize> = info["shape"]
            .as_array()
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .map(|d| d as usize)
                    .ok_or_else(|| bad("a bad dim"))
            })
            .collect::<Result<_, _>>()?;
        let off = info["data_offsets"]
            .as_array()
            .ok_or_else(|| bad("no data_offsets"))?;
        let (s, e) = match (
            off.first().and_then(|v| v.as_u64()),
            off.get(1).and_then(|v| v.as_u64()),
        ) {
            (Some(s), Some(e)) => (s as usize, e as usize),
            _ => return Err(bad("bad data_offsets")),
        };
        let count: usize = shape.iter().product();
        if s > e || e > data.len() || e - s != 4 * count {
            return Err(bad("its bytes are out of range or not its shape's size"));
        }
        let a = Array::from_le_bytes(DType::F32, shape, &data[s..e])
            .map_err(|e| bad(&e.to_string()))?;
        out.push((name.clone(), a));
    }
    Ok(out)
}

/// Syncs a directory, so renames in it survive a crash.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(CheckpointError::io("sync", dir))
}

/// Writes `ck` into `dir` (created if missing), atomically; removes all
/// but the newest [`KEEP`] checkpoints. Returns the manifest's path.
pub fn save(dir: &Path, ck: &Checkpoint) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(CheckpointError::io("create", dir))?;
    let bytes = encode_safetensors(&ck.tensors)?;
    let name = stem(ck.step);
    let tensors = dir.join(format!("{name}.safetensors"));
    atomic_file::write_own(&tensors, &bytes)?;
    sync_dir(dir)?;
    let mut manifest = serde_json::json!({
        "format": FORMAT,
        "step": ck.step,
        "optimizer_steps": ck.optimizer_steps,
        "rng_state": format!("{:016x}", ck.rng_state),
        "data_position": ck.data_position,
        "loss": ck.loss,
        "tensors": format!("{name}.safetensors"),
        "bytes": bytes.len(),
        "sha256": sha256_hex(&bytes),
        "run": ck.run.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect::<serde_json::Map<_, _>>(),
    });
    // The manifest's own checksum, over its other fields: an edited step,
    // generator state or optimizer step count is a corrupt manifest, not a
    // silently different resumed run.
    let own = manifest_digest(&manifest);
    manifest["manifest_sha256"] = serde_json::Value::String(own);
    let path = dir.join(format!("{name}.json"));
    atomic_file::write_own(&path, format!("{manifest:#}\n").as_bytes())?;
    sync_dir(dir)?;
    prune(dir)?;
    Ok(path)
}

/// The exclusive hold of one run on a checkpoint directory: an `flock` on
/// `DIR/.lock`, released when dropped (or when the process ends, however).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Takes `dir` for this run: creates it (so a directory that cannot be
/// written fails before step 1), locks it against a second `tessera train`
/// (which gets an error naming the directory), and removes the temporary
/// files saves killed mid-write left behind (safe now that no other run
/// can be writing here).
pub fn lock_dir(dir: &Path) -> Result<DirLock, CheckpointError> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).map_err(|source| CheckpointError::DirNotCreated {
        dir: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| CheckpointError::DirNotWritable {
            dir: dir.to_path_buf(),
            source,
        })?;
    // SAFETY: a valid open descriptor; flock has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(CheckpointError::DirInUse {
            dir: dir.to_path_buf(),
            lock: path,
        });
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(Result::ok) {
            let n = e.file_name().to_string_lossy().into_owned();
            let stale = n.starts_with(".step-") && n.contains(".tmp-");
            if stale && e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(DirLock { _file: file })
}

/// The steps of the manifests in `dir`, newest first.
fn manifests(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CheckpointError::io("read", dir)(e)),
    };
    let mut v: Vec<(u64, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let step = n
                .strip_prefix("step-")?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.0));
    Ok(v)
}

fn prune(dir: &Path) -> Result<(), CheckpointError> {
    for (step, manifest) in manifests(dir)?.into_iter().skip(KEEP) {
        // Manifest first: a checkpoint is never left half-removed with a
        // manifest that points at nothing.
        let _ = std::fs::remove_file(&manifest);
        let _ = std::fs::remove_file(dir.join(format!("{}.safetensors", stem(step))));
    }
    Ok(())
}

/// SHA-256 of a manifest's fields other than `manifest_sha256`, in
/// serde_json's canonical (key-sorted, compact) form.
fn manifest_digest(m: &serde_json::Value) -> String {
    let mut m = m.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("manifest_sha256");
    }
    sha256_hex(m.to_string().as_bytes())
}

/// The largest manifest read (they are a few hundred bytes).
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// `path`'s bytes if it is a regular file (not a FIFO, device or link to
/// one) of at most `max` bytes; read no further than that.
fn read_regular(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| format!("{what}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{what} is not a regular file"));
    }
    if meta.len() > max {
        return Err(format!(
            "{what} has {} bytes, more than the {max} it may have",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max).read_to_end(&mut bytes))
        .map_err(|e| format!("{what}: {e}"))?;
    Ok(bytes)
}

/// One manifest and its tensors, every field and checksum checked.
fn load_one(dir: &Path, manifest: &Path) -> Result<Checkpoint, String> {
    let raw = read_regular(manifest, MAX_MANIFEST_BYTES, "the manifest")?;
    let text = String::from_utf8(raw).map_err(|_| "the manifest is not UTF-8".to_string())?;
    let m: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    if m["format"] != FORMAT {
        return Err(format!("not a {FORMAT} manifest"));
    }
    match m["manifest_sha256"].as_str() {
        Some(d) if d == manifest_digest(&m) => {}
        Some(_) => {
            return Err("the manifest does not match its own checksum (edited or corrupt)".into());
        }
        None => return Err("the manifest carries no checksum of its own".into()),
    }
    let field = |k: &str| {
        m[k].as_u64()
            .ok_or_else(|| format!("the manifest has no `{k}`"))
    };
    let file = m["tensors"]
        .as_str()
        .ok_or("the manifest names no tensor file")?;
    if file.contains('/') || file.contains("..") {
        return Err(format!(
            "the tensor file `{file}` is outside the checkpoint directory"
        ));
    }
    let want = field("bytes")? as usize;
    // Read no more than the manifest promises (a link to /dev/zero named
    // like a tensor file must not grow memory without bound).
    let bytes = read_regular(&dir.join(file), want as u64 + 1, file).map_err(|e| {
        if e.contains("more than") {
            format!("{file} is larger than the manifest says (not this checkpoint's)")
        } else {
            e
        }
    })?;
    if bytes.len() != want {
        return Err(format!(
            "{file} has {} bytes, the manifest says {want} (truncated or partial)",
            bytes.len()
        ));
    }
    if m["sha256"].as_str() != Some(sha256_hex(&bytes).as_str()) {
        return Err(format!("{file} does not match its SHA-256 (corrupt)"));
    }
    let rng = m["rng_state"]
        .as_str()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or("the manifest has no generator state")?;
    Ok(Checkpoint {
        step: field("step")?,
        optimizer_steps: field("optimizer_steps")?,
        rng_state: rng,
        data_position: field("data_position")?,
        loss: m["loss"].as_f64().unwrap_or(f64::NAN),
        tensors: decode_safetensors(&bytes).map_err(|e| format!("{file}: {e}"))?,
        run: m["run"]
            .as_object()
            .ok_or("the manifest names no run")?
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    v.as_str()
                        .ok_or("the manifest's run is malformed")?
                        .to_string(),
                ))
            })
            .collect::<Result<Vec<_>, &str>>()?,
    })
}

/// The newest valid checkpoint in `dir` (none if there is none), and a
/// line for each newer one skipped, saying why.
pub fn latest(dir: &Path) -> Result<(Option<Checkpoint>, Vec<String>), CheckpointError> {
    latest_accepted(dir, |_| Ok::<(), String>(()))
}

/// The newest checkpoint in `dir` that is valid and that `accept` takes
/// (the caller's model: its tensor names, shapes, finite values), and a
/// line for each newer one skipped, saying why: a checkpoint whose
/// checksums hold but that does not fit falls back to the previous one.
pub fn latest_accepted<E: std::fmt::Display>(
    dir: &Path,
    accept: impl Fn(&Checkpoint) -> Result<(), E>,
) -> Result<(Option<Checkpoint>, Vec<String>), CheckpointError> {
    let mut skipped = Vec::new();
    for (_, manifest) in manifests(dir)? {
        let loaded = load_one(dir, &manifest)
            .and_then(|ck| accept(&ck).map(|()| ck).map_err(|e| e.to_string()));
        match loaded {
            Ok(ck) => return Ok((Some(ck), skipped)),
            Err(why) => skipped.push(format!("skipping checkpoint {}: {why}", manifest.display())),
        }
    }
    Ok((None, skipped))
}

/// Saves checkpoints on a background thread. At most one save waits
/// behind the one being written (a slower disk makes [`Writer::save`]
/// wait rather than queue without bound); a failed save (a full or
/// read-only disk) is returned by the next [`Writer::save`], so the run
/// stops at its next checkpoint, not after every step; [`Writer::finish`]
/// waits for all and reports the first failure.
pub struct Writer {
    tx: Option<mpsc::SyncSender<Checkpoint>>,
    thread: Option<JoinHandle<Result<(), WriterError>>>,
    failed: std::sync::Arc<std::sync::Mutex<Option<WriterError>>>,
}

impl Writer {
    /// A writer into `dir`.
    pub fn new(dir: PathBuf) -> Writer {
        let (tx, rx) = mpsc::sync_channel::<Checkpoint>(1);
        let failed = std::sync::Arc::new(std::sync::Mutex::new(None::<WriterError>));
        let seen = failed.clone();
        let thread = std::thread::spawn(move || {
            let mut first_err = Ok(());
            for ck in rx {
                if first_err.is_err() {
                    continue; // after a failure nothing more is saved
                }
                if let Err(e) = save(&dir, &ck) {
                    let e = WriterError::Save {
                        step: ck.step,
                        source: std::sync::Arc::new(e),
                    };
                    if let Ok(mut f) = seen.lock() {
                        *f = Some(e.clone());
                    }
                    first_err = Err(e);
                }
            }
            first_err
        });
        Writer {
            tx: Some(tx),
            thread: Some(thread),
            failed,
        }
    }

    /// Queues `ck`; returns as soon as it is queued, or the failure of an
    /// earlier save.
    pub fn save(&self, ck: Checkpoint) -> Result<(), WriterError> {
        if let Some(e) = self.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(e);
        }
        self.tx
            .as_ref()
            .ok_or(WriterError::Stopped("is closed"))?
            .send(ck)
            .map_err(|_| WriterError::Stopped("stopped"))
    }

    /// Waits for every queued save.
    pub fn finish(mut self) -> Result<(), WriterError> {
        self.close()
    }

    fn close(&mut self) -> Result<(), WriterError> {
        drop(self.tx.take());
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| WriterError::Stopped("panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(step: u64) -> Checkpoint {
        Checkpoint {
            step,
            optimizer_steps: step,
            rng_state: 0xdead_beef_0000_0001 + step,
            data_position: 16 * step,
            loss: 0.5,
            tensors: vec![
                (
                    "a".into(),
                    Array::random(DType::F32, [3, 4], step, -1.0, 1.0),
                ),
                (
                    "b.c".into(),
                    Array::random(DType::F32, [5], step + 9, -1.0, 1.0),
                ),
            ],
            run: vec![("lr".into(), "0.003".into()), ("seed".into(), "5".into())],
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tessera-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_checkpoint_round_trips_exactly() {
        let d = dir("round");
        save(&d, &ck(7)).unwrap();
        let (got, skipped) = latest(&d).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(got.unwrap(), ck(7));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_edited_manifest_or_a_non_regular_file_is_skipped_without_hanging() {
        let d = dir("edited");
        save(&d, &ck(1)).unwrap();
        save(&d, &ck(2)).unwrap();
        // One digit of the generator state changed: caught by the
        // manifest's own checksum.
        let m = d.join("step-0000000002.json");
        let text = std::fs::read_to_string(&m).unwrap();
        let edited = text.replacen("\"optimizer_steps\": ", "\"optimizer_steps\": 9", 1);
        assert_ne!(text, edited);
        std::fs::write(&m, edited).unwrap();
        let (got, skipped) = latest(&d).unwrap();
        assert_eq!(got.unwrap().step, 1);
        assert!(skipped[0].contains("own checksum"), "{skipped:?}");
        // A FIFO named like a newer manifest, and a tensor file that is a
        // link to /dev/zero: skipped, at once.
        let fifo = d.join("step-0000000003.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = d.join("step-0000000002.safetensors");
        std::fs::remove_file(&t).unwrap();
        std::fs::write(&m, &text).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &t).unwrap();
        let t0 = std::time::Instant::now();
        let (got, skipped) = latest(&d).unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(got.unwrap().step, 1);
        assert!(
            skipped.iter().any(|s| s.contains("not a regular file")),
            "{skipped:?}"
        );
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_truncated_or_corrupt_checkpoint_is_skipped_for_the_previous_one() {
        let d = dir("corrupt");
        save(&d, &ck(1)).unwrap();
        save(&d, &ck(2)).unwrap();
        let f = d.join("step-0000000002.safetensors");
        let bytes = std::fs::read(&f).unwrap();
        std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
        let (got, skipped) = latest(&d).unwrap();
        assert_eq!(got.unwrap().step, 1);
        assert!(skipped[0].contains("truncated"), "{skipped:?}");
        // Same size, one byte flipped: the checksum catches it.
        let mut bytes = bytes;
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&f, &bytes).unwrap();
        let (got, skipped) = latest(&d).unwrap();
        assert_eq!(got.unwrap().step, 1);
        assert!(skipped[0].contains("SHA-256"), "{skipped:?}");
        // A tensor file without a manifest (a crash before the commit) is
        // not a checkpoint.
        std::fs::remove_file(d.join("step-0000000002.json")).unwrap();
        let (got, skipped) = latest(&d).unwrap();
        assert_eq!(got.unwrap().step, 1);
        assert!(skipped.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_writer_keeps_the_newest_few_and_reports_failures() {
        let d = dir("writer");
        let w = Writer::new(d.clone());
        for s in 1..=5 {
            w.save(ck(s)).unwrap();
        }
        w.finish().unwrap();
        let steps: Vec<u64> = manifests(&d).unwrap().into_iter().map(|m| m.0).collect();
        assert_eq!(steps, vec![5, 4, 3]);
        assert!(!d.join("step-0000000001.safetensors").exists());
        // A directory that cannot be created: the failure comes back.
        let blocker = d.join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let w = Writer::new(blocker.join("sub"));
        w.save(ck(1)).unwrap();
        let e = w.finish().unwrap_err();
        assert!(matches!(&e, WriterError::Save { step: 1, .. }), "{e}");
        // The next save returns it, so a run stops at its next checkpoint
        // rather than after its last step.
        let w = Writer::new(blocker.join("sub"));
        w.save(ck(1)).unwrap();
        let t0 = std::time::Instant::now();
        let e = loop {
            match w.save(ck(2)) {
                Err(e) => break e,
                Ok(()) => {
                    assert!(t0.elapsed().as_secs() < 20, "no failure came back");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        };
        assert!(matches!(&e, WriterError::Save { step: 1, .. }), "{e}");
        assert!(e.to_string().starts_with("saving step 1: "), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn malformed_safetensors_are_errors_not_panics() {
        for bytes in [
            &b""[..],
            &b"\xff\xff\xff\xff\xff\xff\xff\xff{}"[..],
            &b"\x02\0\0\0\0\0\0\0[]"[..],
        ] {
            assert!(decode_safetensors(bytes).is_err());
        }
        let good = encode_safetensors(&ck(1).tensors).unwrap();
        assert_eq!(decode_safetensors(&good).unwrap(), ck(1).tensors);
    }

    #[test]
    fn a_held_directory_is_refused_naming_its_lock() {
        let d = dir("held");
        let _held = lock_dir(&d).unwrap();
        match lock_dir(&d) {
            Err(CheckpointError::DirInUse { dir, lock }) => {
                assert_eq!((dir, lock), (d.clone(), d.join(".lock")));
            }
            other => panic!("expected DirInUse, got {other:?}"),
        }
        let e = encode_safetensors(&[("x".into(), Array::zeros(DType::BF16, [2]))]);
        assert!(matches!(e, Err(CheckpointError::NotF32 { .. })), "{e:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
