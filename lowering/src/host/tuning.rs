//! The JIT's per-CPU choices, measured on the CPU at hand at first use
//! and kept on disk.
//!
//! A register tile fast on one microarchitecture is slow on another
//! (AVX-512's 12 × 32 tile spills on AVX2; on a double-pumped AVX-512 a
//! narrower tile can win), and a register count does not say which. So the
//! first JIT compile in a process asks [`HostTuning::host`], which:
//!
//! 1. takes `TESSERA_HOST_TUNING` when set (`default`: the heuristic tile,
//!    nothing measured or written; `ROWSxLANES`, e.g. `6x16`: that tile);
//! 2. else reads `host-tuning-<key>.txt` in the cache folder, where the
//!    key hashes the CPU's identity ([`CpuIdentity`]: model, family, model
//!    and stepping numbers, vector ISA, L1d and L2 sizes) and Tessera's
//!    version, so another CPU or release measures again;
//! 3. else measures every [`DotTiling::candidates`] tile on two probe
//!    kernels (a 256³ matmul block and attention's `q·kᵀ` then `p·v`),
//!    about three seconds, and writes the file all or nothing.
//!
//! A file that is unreadable, of another format, CPU or release, or names a
//! tile that does not fit is measured again and replaced, never trusted.
//! `tessera tune --cpu` measures again on purpose ([`HostTuning::search`]).
//!
//! ```no_run
//! let tuning = lowering::HostTuning::host()?;
//! println!("{}: dot tile {}", tuning.cpu, tuning.dot);
//! # Ok::<(), lowering::LoweringError>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kernel_ir::{Array, DType};

use crate::LoweringError;
use crate::host::HostKernel;
use crate::host::cpu::VectorRegisters;
use crate::host::tiling::DotTiling;

/// The environment variable that overrides the measured tile.
pub const TUNING_ENV: &str = "TESSERA_HOST_TUNING";

/// First line of a tuning file: what it is and its format version.
const HEADER: &str = "tessera host JIT tuning, format 1";

/// What the JIT's tuning is keyed by: what makes one CPU's best tile
/// differ from another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuIdentity {
    /// The model name (`/proc/cpuinfo`), with the family, model and
    /// stepping numbers (x86) or implementer and part (Arm), which tell
    /// apart CPUs a hypervisor reports under one generic name.
    pub model: String,
    /// The vector registers the JIT's code uses.
    pub registers: VectorRegisters,
    /// Level-1 data cache per core, bytes (0 when unknown).
    pub l1d_bytes: usize,
    /// Level-2 cache per core, bytes (0 when unknown).
    pub l2_bytes: usize,
}

impl CpuIdentity {
    /// This machine's, read once.
    pub fn host() -> &'static CpuIdentity {
        static HOST: OnceLock<CpuIdentity> = OnceLock::new();
        HOST.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            let field = |name: &str| {
                info.lines()
                    .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            };
            let name = field("model name").unwrap_or_else(|| "unknown CPU".into());
            let numbers: Vec<String> = [
                ("family", "cpu family"),
                ("model", "model"),
                ("stepping", "stepping"),
                ("implementer", "CPU implementer"),
                ("part", "CPU part"),
            ]
            .into_iter()
            .filter_map(|(short, key)| field(key).map(|v| format!("{short} {v}")))
            .collect();
            let model = if numbers.is_empty() {
                name
            } else {
                format!("{name} ({})", numbers.join(", "))
            };
            CpuIdentity {
                model,
                registers: VectorRegisters::host(),
                l1d_bytes: cache_bytes(1, "Data"),
                l2_bytes: cache_bytes(2, "Unified"),
            }
        })
    }

    /// The file name its tuning is kept under: a hash of the identity
    /// and Tessera's version.
    fn file_name(&self) -> String {
        // FNV-1a: stable across Rust releases, unlike `DefaultHasher`.
        let text = format!("{self} / tessera {}", env!("CARGO_PKG_VERSION"));
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("host-tuning-{}-{hash:016x}.txt", self.registers.isa)
    }
}

impl fmt::Display for CpuIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.registers;
        write!(
            f,
            "{}; {} ({} vector registers of {} B); L1d {} KiB, L2 {} KiB",
            self.model,
            r.isa,
            r.count,
            r.bytes,
            self.l1d_bytes / 1024,
            self.l2_bytes / 1024
        )
    }
}

/// The size of cpu0's cache of `level` and `kind` from sysfs (0 when
/// unknown).
fn cache_bytes(level: u32, kind: &str) -> usize {
    let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    (0..8)
        .map(|i| base.join(format!("index{i}")))
        .find(|d| {
            read(d.join("level")).trim() == level.to_string() && read(d.join("type")).trim() == kind
        })
        .and_then(|d| {
            let s = read(d.join("size"));
            let s = s.trim();
            let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let n: usize = n.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                _ => n,
            })
        })
        .unwrap_or(0)
}

/// One measured tile: the sum over the probe kernels of each one's
/// fastest run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trial {
    /// The tile.
    pub tiling: DotTiling,
    /// Seconds.
    pub seconds: f64,
}

/// Where a [`HostTuning`] came from.
#[derive(Clone, Debug, PartialEq)]
pub enum TuningSource {
    /// Read from this tuning file, measured earlier on this CPU.
    Cached(PathBuf),
    /// Measured in this process; written to the file when it is `Some`.
    Measured(Option<PathBuf>),
    /// Measured in this process; the file could not be written (its path
    /// and the OS error): later processes measure again.
    Unwritable(PathBuf, String),
    /// `TESSERA_HOST_TUNING` chose it.
    Environment(String),
}

/// The JIT's choices for this CPU.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTuning {
    /// The CPU they are for.
    pub cpu: CpuIdentity,
    /// The dot micro-kernel's register tile.
    pub dot: DotTiling,
    /// Every tile measured, fastest first (empty when none was).
    pub trials: Vec<Trial>,
    /// Where they came from.
    pub source: TuningSource,
}

impl fmt::Display for TuningSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuningSource::Cached(p) => write!(f, "measured earlier, read from {}", p.display()),
            TuningSource::Measured(Some(p)) => write!(f, "measured now, kept in {}", p.display()),
            TuningSource::Measured(None) => write!(f, "measured now, not kept"),
            TuningSource::Unwritable(p, e) => {
                write!(
                    f,
                    "measured now, not kept: cannot write {}: {e}",
                    p.display()
                )
            }
            TuningSource::Environment(v) => write!(f, "{TUNING_ENV}={v}"),
        }
    }
}

impl HostTuning {
    /// This machine's tuning, settled at the first call in a process (see
    /// the module docs): the environment, else the cache folder's file,
    /// else measured now and written there. An error only for a malformed
    /// `TESSERA_HOST_TUNING`; a folder that cannot be written costs the
    /// file, not the tuning.
    pub fn host() -> Result<&'static HostTuning, LoweringError> {
        static HOST: OnceLock<Result<HostTuning, String>> = OnceLock::new();
        HOST.get_or_init(|| HostTuning::settle(std::env::var(TUNING_ENV).ok(), &cache_dir()))
            .as_ref()
            .map_err(|e| LoweringError::Run(e.clone()))
    }

    /// [`HostTuning::host`]'s rule, for an explicit environment value and
    /// cache folder.
    pub fn settle(env: Option<String>, dir: &Path) -> Result<HostTuning, String> {
        let cpu = CpuIdentity::host().clone();
        match env.as_deref().map(str::trim) {
            Some("") | None => {}
            Some("default") => {
                return Ok(HostTuning {
                    dot: DotTiling::heuristic(cpu.registers),
                    cpu,
                    trials: Vec::new(),
                    source: TuningSource::Environment("default".into()),
                });
            }
            Some(v) => {
                let dot: DotTiling = v
                    .parse()
                    .map_err(|e| format!("{TUNING_ENV}: {e}, or `default`"))?;
                return Ok(HostTuning {
                    cpu,
                    dot,
                    trials: Vec::new(),
                    source: TuningSource::Environment(v.into()),
                });
            }
        }
        if let Some(t) = HostTuning::load(dir) {
            return Ok(t);
        }
        Ok(HostTuning::search(Some(dir)))
    }

    /// Reads this CPU's tuning file in `dir`; `None` when there is none or
    /// it is not one Tessera can trust here.
    pub fn load(dir: &Path) -> Option<HostTuning> {
        let cpu = CpuIdentity::host().clone();
        let path = dir.join(cpu.file_name());
        let text = read_tuning_file(&path)?;
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut fields = lines.filter_map(|l| l.split_once(": "));
        let mut next = |key: &str| {
            fields
                .next()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        };
        if next("tessera")? != env!("CARGO_PKG_VERSION") || next("cpu")? != cpu.to_string() {
            return None;
        }
        let dot: DotTiling = next("dot")?.parse().ok()?;
        if !dot.fits(cpu.registers) {
            return None;
        }
        let mut trials = Vec::new();
        while let Some(t) = next("trial") {
            let (tile, secs) = t.split_once(' ')?;
            trials.push(Trial {
                tiling: tile.parse().ok()?,
                seconds: secs.parse().ok()?,
            });
        }
        Some(HostTuning {
            cpu,
            dot,
            trials,
            source: TuningSource::Cached(path),
        })
    }

    /// Measures every candidate tile now and, with a `dir`, writes the
    /// result there (all or nothing; a failed write is reported in
    /// [`HostTuning::source`] as not kept). A candidate that fails to
    /// compile or run is left out; if all do, the heuristic tile stands.
    pub fn search(dir: Option<&Path>) -> HostTuning {
        let cpu = CpuIdentity::host().clone();
        let heuristic = DotTiling::heuristic(cpu.registers);
        let mut trials = measure(&DotTiling::candidates(cpu.registers));
        trials.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
        // Another tile must beat the heuristic one by 3 %: closer than
        // that is within the noise of a short search.
        let base = trials.iter().find(|t| t.tiling == heuristic);
        let dot = match (trials.first(), base) {
            (Some(best), Some(base)) if best.seconds < 0.97 * base.seconds => best.tiling,
            (Some(best), None) => best.tiling,
            _ => heuristic,
        };
        let mut tuning = HostTuning {
            cpu,
            dot,
            trials,
            source: TuningSource::Measured(None),
        };
        if let Some(dir) = dir {
            let path = dir.join(tuning.cpu.file_name());
            tuning.source = match write_all_or_nothing(&path, tuning.file_text().as_bytes()) {
                Ok(()) => TuningSource::Measured(Some(path)),
                Err(e) => TuningSource::Unwritable(path, e.to_string()),
            };
        }
        tuning
    }

    /// The tuning file's text.
    fn file_text(&self) -> String {
        let mut s = format!(
            "{HEADER}\ntessera: {}\ncpu: {}\ndot: {}\n",
            env!("CARGO_PKG_VERSION"),
            self.cpu,
            self.dot
        );
        for t in &self.trials {
            s.push_str(&format!("trial: {} {:e}\n", t.tiling, t.seconds));
        }
        s
    }
}

/// The cache folder: `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`,
/// else `~/.cache/tessera` (as `.ci/setup.sh` computes it).
pub fn cache_dir() -> PathBuf {
    cache_dir_from(
        std::env::var_os("TESSERA_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
    )
}

/// The tuning file's text, if it is a regular file of at most 64 KiB (it
/// is a few hundred bytes): a FIFO there would block every JIT compile, a
/// link to `/dev/zero` would be read without end.
fn read_tuning_file(path: &Path) -> Option<String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 64 << 10 {
        return None;
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// [`cache_dir`] from the two variables: an empty `TESSERA_CACHE` is unset,
/// and an empty or relative `XDG_CACHE_HOME` is ignored (the XDG base
/// directory rule), so no setting puts the cache in the working directory.
fn cache_dir_from(tessera: Option<std::ffi::OsString>, xdg: Option<std::ffi::OsString>) -> PathBuf {
    if let Some(d) = tessera.filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = xdg.map(PathBuf::from).filter(|d| d.is_absolute()) {
        return d.join("tessera");
    }
    // `HOME` unset (or empty) falls back to the account's home directory,
    // never to a path relative to the working directory.
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(std::env::home_dir)
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    home.join(".cache").join("tessera")
}

/// Writes `bytes` to `path` through a synced temporary file renamed over
/// it: a reader sees the old file or the whole new one.
fn write_all_or_nothing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let result = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The probe kernels: what the JIT's dots spend their time on.
const PROBES: [&str; 2] = [
    // A matmul block, as `matmul` runs it at 256³ blocks.
    "kernel @probe_matmul {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[256, 256] vmem block [256, 256] at (g0, 0) row_major
  in @y: f32[256, 256] vmem block [256, 256] at (g0, 0) row_major
  out @o: f32[256, 256] vmem block [256, 256] at (g0, 0) row_major
body:
  %0 = load @x[0:256, 0:256] : f32[256, 256]
  %1 = load @y[0:256, 0:256] : f32[256, 256]
  %2 = dot_general %0, %1, batch []x[], contract [1]x[0] : f32[256, 256], f32[256, 256] -> f32[256, 256]
  store @o[0:256, 0:256], %2 : f32[256, 256]
}",
    // Attention's two products at head dim 128: `q·kᵀ` (the rhs packed
    // through transposes) and `p·v`.
    "kernel @probe_attention {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @q: f32[256, 128] vmem block [256, 128] at (g0, 0) row_major
  in @k: f32[256, 128] vmem block [256, 128] at (g0, 0) row_major
  in @v: f32[256, 128] vmem block [256, 128] at (g0, 0) row_major
  out @o: f32[256, 128] vmem block [256, 128] at (g0, 0) row_major
body:
  %0 = load @q[0:256, 0:128] : f32[256, 128]
  %1 = load @k[0:256, 0:128] : f32[256, 128]
  %2 = transpose %1, perm [1, 0] : f32[256, 128] -> f32[128, 256]
  %3 = dot_general %0, %2, batch []x[], contract [1]x[0] : f32[256, 128], f32[128, 256] -> f32[256, 256]
  %4 = load @v[0:256, 0:128] : f32[256, 128]
  %5 = dot_general %3, %4, batch []x[], contract [1]x[0] : f32[256, 256], f32[256, 128] -> f32[256, 128]
  store @o[0:256, 0:128], %5 : f32[256, 128]
}",
];

/// A probe kernel compiled with one tile, its inputs and output buffer.
struct Probe {
    kernel: HostKernel,
    inputs: Vec<Vec<u8>>,
    output: Vec<u8>,
    fastest: Duration,
}

impl Probe {
    fn new(text: &str, tiling: DotTiling) -> Result<Probe, LoweringError> {
        let kernel = kernel_ir::parse(text)
            .map_err(|e| LoweringError::Internal(format!("probe kernel: {e:?}")))?
            .verify()
            .map_err(|e| LoweringError::Internal(format!("probe kernel: {e}")))?;
        let kernel = HostKernel::compile_tiled(&kernel, tiling)?
            .with_options(crate::HostOptions { threads: 1 });
        let k = kernel.kernel();
        let inputs = k
            .inputs()
            .enumerate()
            .map(|(i, o)| Array::random(DType::F32, o.shape.clone(), i as u64, -1.0, 1.0))
            .map(|a| a.to_le_bytes())
            .collect();
        let output = vec![
            0u8;
            k.outputs()
                .map(|o| o.shape.iter().product::<usize>() * 4)
                .sum()
        ];
        Ok(Probe {
            kernel,
            inputs,
            output,
            fastest: Duration::MAX,
        })
    }

    fn time(&mut self) -> Result<(), LoweringError> {
        let inputs: Vec<&[u8]> = self.inputs.iter().map(Vec::as_slice).collect();
        let start = Instant::now();
        self.kernel
            .run_bytes(&[], &inputs, &mut [self.output.as_mut_slice()])?;
        self.fastest = self.fastest.min(start.elapsed());
        Ok(())
    }
}

/// Each tile's score: every probe's fastest run over interleaved rounds
/// (tiles alternate, so a burst of load elsewhere slows all of them, and
/// the fastest run is the one least disturbed), summed.
fn measure(tiles: &[DotTiling]) -> Vec<Trial> {
    let mut sets: Vec<(DotTiling, Vec<Probe>)> = tiles
        .iter()
        .filter_map(|&t| {
            let probes: Result<Vec<Probe>, _> = PROBES.iter().map(|p| Probe::new(p, t)).collect();
            let mut probes = probes.ok()?;
            // One untimed run each: page faults, first-touch.
            for p in &mut probes {
                p.time().ok()?;
                p.fastest = Duration::MAX;
            }
            Some((t, probes))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(1500);
    for round in 0..12 {
        if round >= 4 && Instant::now() > deadline {
            break;
        }
        let n = sets.len();
        for i in 0..n {
            let (_, probes) = &mut sets[(i + round) % n];
            for p in probes {
                // A run that fails here ran before; it cannot fail now
                // but for memory, and then it simply scores worse.
                let _ = p.time();
            }
        }
    }
    sets.into_iter()
        .map(|(tiling, probes)| Trial {
            tiling,
            seconds: probes.iter().map(|p| p.fastest.as_secs_f64()).sum(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No setting of the variables puts the cache folder in the working
    /// directory: an empty TESSERA_CACHE is unset, an empty or relative
    /// XDG_CACHE_HOME ignored.
    #[test]
    fn the_cache_folder_is_never_relative_to_the_working_directory() {
        let os = |s: &str| Some(std::ffi::OsString::from(s));
        for (t, x) in [
            (os(""), None),
            (None, os("")),
            (None, os("relative/cache")),
            (os(""), os("cache")),
        ] {
            let d = cache_dir_from(t.clone(), x.clone());
            assert!(d.is_absolute(), "{t:?} {x:?}: {}", d.display());
        }
        assert_eq!(cache_dir_from(os("/c"), os("/x")), PathBuf::from("/c"));
        assert_eq!(cache_dir_from(None, os("/x")), PathBuf::from("/x/tessera"));
    }

    /// A FIFO or a device where the tuning file goes is not read (a FIFO
    /// blocked every JIT compile; /dev/zero was read to gigabytes).
    #[test]
    fn a_tuning_file_that_is_not_a_regular_file_is_not_read() {
        let dir = Folder::new("special");
        let fifo = dir.0.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let started = Instant::now();
            assert!(read_tuning_file(&fifo).is_none());
            assert!(started.elapsed() < Duration::from_secs(2));
        }
        let zero = dir.0.join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(read_tuning_file(&zero).is_none());
        let big = dir.0.join("big");
        std::fs::write(&big, vec![b'x'; 100 << 10]).unwrap();
        assert!(read_tuning_file(&big).is_none());
        let fine = dir.0.join("fine");
        std::fs::write(&fine, "tessera\n").unwrap();
        assert_eq!(read_tuning_file(&fine).as_deref(), Some("tessera\n"));
    }

    /// A fresh folder under the system temp dir, removed on drop.
    struct Folder(PathBuf);

    impl Folder {
        fn new(name: &str) -> Folder {
            let p = std::env::temp_dir().join(format!(
                "tessera-tuning-{name}-{}-{:?}",
                std::process::id(),
                Instant::now()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Folder(p)
        }
    }

    impl Drop for Folder {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A tuning as a search would leave it, without measuring.
    fn measured() -> HostTuning {
        let cpu = CpuIdentity::host().clone();
        let c = DotTiling::candidates(cpu.registers);
        HostTuning {
            dot: c[1],
            trials: vec![
                Trial {
                    tiling: c[1],
                    seconds: 1.25e-3,
                },
                Trial {
                    tiling: c[0],
                    seconds: 1.5e-3,
                },
            ],
            cpu,
            source: TuningSource::Measured(None),
        }
    }

    #[test]
    fn a_written_tuning_reads_back_and_is_settled_on_without_measuring() {
        let dir = Folder::new("roundtrip");
        let t = measured();
        let path = dir.0.join(t.cpu.file_name());
        write_all_or_nothing(&path, t.file_text().as_bytes()).unwrap();
        let back = HostTuning::load(&dir.0).expect("the file just written");
        assert_eq!(back.dot, t.dot);
        assert_eq!(back.trials, t.trials);
        assert_eq!(back.source, TuningSource::Cached(path.clone()));
        // `settle` takes the file: a search would have replaced it with a
        // `Measured` source.
        let settled = HostTuning::settle(None, &dir.0).unwrap();
        assert_eq!(settled.source, TuningSource::Cached(path));
        // Nothing but the file is left (no temporary).
        let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_file_not_to_trust_here_is_not_read() {
        let t = measured();
        let good = t.file_text();
        let other_cpu = good.replace(&format!("cpu: {}", t.cpu), "cpu: Some Other CPU");
        let other_release = good.replace(
            &format!("tessera: {}", env!("CARGO_PKG_VERSION")),
            "tessera: 0.0.1",
        );
        let misfit = good.replace(&format!("dot: {}", t.dot), "dot: 32x64");
        let garbled = good.replace(&format!("dot: {}", t.dot), "dot: six by sixteen");
        let bad_trial = format!("{good}trial: 6x16 fast\n");
        let cases = [
            ("empty", String::new()),
            ("other format", good.replace("format 1", "format 0")),
            ("truncated", good[..good.find("dot:").unwrap()].to_string()),
            ("other CPU", other_cpu),
            ("other release", other_release),
            ("tile that does not fit", misfit),
            ("garbled tile", garbled),
            ("garbled trial", bad_trial),
            ("binary", "\u{0}\u{1}\u{2}".into()),
        ];
        for (what, text) in cases {
            let dir = Folder::new("bad");
            std::fs::write(dir.0.join(t.cpu.file_name()), text).unwrap();
            assert_eq!(HostTuning::load(&dir.0), None, "{what}");
        }
    }

    #[test]
    fn the_environment_overrides_and_a_bad_value_is_named() {
        let dir = Folder::new("env");
        let r = CpuIdentity::host().registers;
        let d = HostTuning::settle(Some("default".into()), &dir.0).unwrap();
        assert_eq!(d.dot, DotTiling::heuristic(r));
        let f = HostTuning::settle(Some("5x16".into()), &dir.0).unwrap();
        assert_eq!(f.dot.to_string(), "5x16");
        assert_eq!(f.source, TuningSource::Environment("5x16".into()));
        let e = HostTuning::settle(Some("fast".into()), &dir.0).unwrap_err();
        assert!(
            e.contains(TUNING_ENV) && e.contains("ROWSxLANES") && e.contains("default"),
            "{e}"
        );
        // Neither measured nor wrote anything.
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
    }
}
