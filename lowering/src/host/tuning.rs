//! The JIT's per-CPU choices, measured on the CPU at hand at first use
//! and kept on disk.
//!
//! A register tile fast on one microarchitecture is slow on another
//! (AVX-512's 12 × 32 tile spills on AVX2; on a double-pumped AVX-512 a
//! narrower tile can win), and a register count does not say which. So the
//! first JIT compile in a process asks [`HostTuning::host`], which:
//!
//! 1. takes `TESSERA_HOST_TUNING` when set (`default`: the register rule's
//!    tile, nothing measured or written; `ROWSxLANES`, e.g. `6x16`: that
//!    tile for every dot; `deep-wide=4x16,shallow-wide=5x16`: those
//!    classes' tiles, the rule's for the rest);
//! 2. else reads `host-tuning-<key>.txt` in the cache folder, where the
//!    key hashes the CPU's identity ([`CpuIdentity`]: model, family, model
//!    and stepping numbers, vector ISA, L1d and L2 sizes) and Tessera's
//!    version, so another CPU or release measures again;
//! 3. else measures every [`DotTiling::candidates`] tile on each
//!    [`DotClass`]'s probe kernel (one dot of the class at the shapes and
//!    strides the library runs: attention's `q·kᵀ` at blocks of 128 and
//!    256, its `p·v`, a 1024-deep matmul in 256³ blocks), a few seconds,
//!    and writes the file all or nothing.
//!
//! Per class, a tile replaces the register rule's
//! ([`DotTiling::heuristic`]) only where it is [`MARGIN`] faster on that
//! class's probe, in the search and again head to head: one tile for
//! every dot, chosen on two probes, once ran a 1024³ matmul 2.3× slower
//! than the rule on an AVX-512 CPU (29 × 16 won the probes by 3 %).
//!
//! A file that is unreadable, of another format, CPU or release, or names a
//! tile that does not fit is measured again and replaced, never trusted.
//! `tessera tune --cpu` measures again on purpose ([`HostTuning::search`]).
//!
//! ```no_run
//! let tuning = lowering::HostTuning::host()?;
//! println!("{}: dot tiles {}", tuning.cpu, tuning.dots);
//! for line in tuning.choices() {
//!     println!("  {line}");
//! }
//! # Ok::<(), lowering::LoweringError>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::LoweringError;
use crate::host::cpu::CpuIdentity;
use crate::host::probe::{Trial, measure};
use crate::host::tiling::{DotClass, DotTiling, DotTilings, TilingError};

/// The environment variable that overrides the measured tile.
pub const TUNING_ENV: &str = "TESSERA_HOST_TUNING";

/// First line of a tuning file: what it is and its format version.
const HEADER: &str = "tessera host JIT tuning, format 2";

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
    /// The dot micro-kernel's register tile for each class of dot.
    pub dots: DotTilings,
    /// Every tile measured on every class's probe, each class's fastest
    /// first (empty when none was).
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

/// How much faster than the register rule's tile another tile must be on
/// a class's probe to replace it, twice over (the search, then a
/// head-to-head run of the two): closer than that is inside the noise of
/// a short measurement, and the rule is the safer bet on the shapes no
/// probe ran.
pub const MARGIN: f64 = 0.03;

impl HostTuning {
    /// This machine's tuning, settled at the first call in a process (see
    /// the module docs): the environment, else the cache folder's file,
    /// else measured now and written there. An error only for a malformed
    /// `TESSERA_HOST_TUNING`; a folder that cannot be written costs the
    /// file, not the tuning.
    pub fn host() -> Result<&'static HostTuning, LoweringError> {
        static HOST: OnceLock<Result<HostTuning, TilingError>> = OnceLock::new();
        HOST.get_or_init(|| HostTuning::settle(std::env::var(TUNING_ENV).ok(), &cache_dir()))
            .as_ref()
            .map_err(|e| LoweringError::HostTuning(e.clone()))
    }

    /// [`HostTuning::host`]'s rule, for an explicit environment value and
    /// cache folder.
    pub fn settle(env: Option<String>, dir: &Path) -> Result<HostTuning, TilingError> {
        let cpu = CpuIdentity::host().clone();
        match env.as_deref().map(str::trim) {
            Some("") | None => {}
            Some(v) => {
                let dots = if v == "default" {
                    DotTilings::heuristic(cpu.registers)
                } else {
                    DotTilings::parse_setting(v, cpu.registers)
                        .map_err(|e| TilingError::Setting(Box::new(e)))?
                };
                return Ok(HostTuning {
                    cpu,
                    dots,
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
        let mut fields = lines.map(|l| l.split_once(": "));
        let mut next = |key: &str| match fields.next() {
            Some(Some((k, v))) if k == key => Some(v.to_string()),
            _ => None,
        };
        if next("tessera")? != env!("CARGO_PKG_VERSION") || next("cpu")? != cpu.to_string() {
            return None;
        }
        let mut dots = DotTilings::heuristic(cpu.registers);
        for class in DotClass::ALL {
            dots.set(class, next(&format!("dot {class}"))?.parse().ok()?);
        }
        if !dots.fits(cpu.registers) {
            return None;
        }
        let mut trials = Vec::new();
        for f in fields {
            let (key, value) = f?;
            let class: DotClass = key.strip_prefix("trial ")?.parse().ok()?;
            let (tile, secs) = value.split_once(' ')?;
            trials.push(Trial {
                class,
                tiling: tile.parse().ok()?,
                seconds: secs.parse().ok().filter(|s: &f64| s.is_finite())?,
            });
        }
        Some(HostTuning {
            cpu,
            dots,
            trials,
            source: TuningSource::Cached(path),
        })
    }

    /// Measures every candidate tile on every class's probe now and, with
    /// a `dir`, writes the result there (all or nothing; a failed write is
    /// reported in [`HostTuning::source`] as not kept). Per class, the
    /// fastest tile replaces the register rule's only where it is faster
    /// by [`MARGIN`] in the search and again in a head-to-head run of the
    /// two; a candidate that fails to compile or run is left out.
    pub fn search(dir: Option<&Path>) -> HostTuning {
        let cpu = CpuIdentity::host().clone();
        let rule = DotTiling::heuristic(cpu.registers);
        let mut dots = DotTilings::heuristic(cpu.registers);
        let mut trials = Vec::new();
        for class in DotClass::ALL {
            let mut found = measure(class, &DotTiling::candidates(cpu.registers), 12);
            found.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
            let base = found.iter().find(|t| t.tiling == rule).map(|t| t.seconds);
            if let (Some(best), Some(base)) = (found.first(), base)
                && best.tiling != rule
                && best.seconds < (1.0 - MARGIN) * base
                && let [b, r] = measure(class, &[best.tiling, rule], 16)[..]
                && b.seconds < (1.0 - MARGIN) * r.seconds
            {
                dots.set(class, best.tiling);
            }
            trials.extend(found);
        }
        let mut tuning = HostTuning {
            cpu,
            dots,
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

    /// Each tile's fastest run on `class`'s probe over `rounds` interleaved
    /// rounds (at least four, more while under a second): the tiles
    /// alternate, so a burst of load elsewhere slows all of them, and the
    /// fastest run is the one least disturbed. A tile whose probe fails to
    /// compile or run is left out; the rest in `tiles`' order.
    pub fn measure(class: DotClass, tiles: &[DotTiling], rounds: usize) -> Vec<Trial> {
        measure(class, tiles, rounds)
    }

    /// Where each class's tile came from, one line per class: the rule,
    /// or the tile measured faster than the rule's on the class's probe
    /// (by how much), or the environment.
    pub fn choices(&self) -> Vec<String> {
        let rule = DotTiling::heuristic(self.cpu.registers);
        let time = |c: DotClass, t: DotTiling| {
            self.trials
                .iter()
                .find(|x| x.class == c && x.tiling == t)
                .map(|x| x.seconds)
        };
        DotClass::ALL
            .iter()
            .map(|&c| {
                let t = self.dots.get(c);
                let why = match (&self.source, t == rule) {
                    (TuningSource::Environment(v), _) => format!("{TUNING_ENV}={v}"),
                    (_, true) => "the register rule".to_string(),
                    (_, false) => match (time(c, t), time(c, rule)) {
                        (Some(a), Some(b)) => format!(
                            "measured {:.0} % faster than the rule's {rule} on its probe",
                            100.0 * (1.0 - a / b)
                        ),
                        _ => "measured".to_string(),
                    },
                };
                format!("{:<14} {:<6} {why}", c.name(), t.to_string())
            })
            .collect()
    }

    /// The tuning file's text.
    fn file_text(&self) -> String {
        let mut s = format!(
            "{HEADER}\ntessera: {}\ncpu: {}\n",
            env!("CARGO_PKG_VERSION"),
            self.cpu,
        );
        for c in DotClass::ALL {
            s.push_str(&format!("dot {c}: {}\n", self.dots.get(c)));
        }
        for t in &self.trials {
            s.push_str(&format!(
                "trial {}: {} {:e}\n",
                t.class, t.tiling, t.seconds
            ));
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

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

    /// A tuning as a search would leave it, without measuring: one class
    /// off the rule.
    fn measured() -> HostTuning {
        let cpu = CpuIdentity::host().clone();
        let c = DotTiling::candidates(cpu.registers);
        let mut dots = DotTilings::heuristic(cpu.registers);
        dots.set(DotClass::DeepWide, c[1]);
        HostTuning {
            dots,
            trials: vec![
                Trial {
                    class: DotClass::DeepWide,
                    tiling: c[1],
                    seconds: 1.25e-3,
                },
                Trial {
                    class: DotClass::DeepWide,
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
        assert_eq!(back.dots, t.dots);
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
        let deep = format!("dot deep-wide: {}", t.dots.get(DotClass::DeepWide));
        let misfit = good.replace(&deep, "dot deep-wide: 32x64");
        let garbled = good.replace(&deep, "dot deep-wide: six by sixteen");
        let missing = good.replace(&format!("{deep}\n"), "");
        let bad_trial = format!("{good}trial deep-wide: 6x16 fast\n");
        let bad_class = format!("{good}trial deep: 6x16 1e-3\n");
        let stray = format!("{good}something else\n");
        let cases = [
            ("empty", String::new()),
            ("other format", good.replace("format 2", "format 1")),
            ("truncated", good[..good.find("dot ").unwrap()].to_string()),
            ("a class missing", missing),
            ("a trial of no class", bad_class),
            ("a stray line", stray),
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

    /// The hostile suite's tuning-file surface: `TESSERA_HOSTILE_CASES`
    /// (default 2,000) mutations of a good tuning file, seed 70 (bytes
    /// flipped, lines dropped, doubled or added, values replaced with
    /// huge, negative, non-finite, garbled or non-ASCII ones, cuts), each
    /// read through `load`. Each must hold: no panic, and either no
    /// tuning or one that fits this CPU's registers with finite trial
    /// times. The tally lands in `target/conformance/hostile/`.
    #[test]
    fn mutated_tuning_files_are_refused_or_fit() {
        let cases: u64 = std::env::var("TESSERA_HOSTILE_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000);
        let t = measured();
        let good = t.file_text();
        let lines: Vec<&str> = good.lines().collect();
        let values = [
            "",
            "0x0",
            "6x16",
            "64x64",
            "1x1",
            "-1x16",
            "18446744073709551616x2",
            "nan",
            "inf",
            "-1e-3",
            "1e999",
            "6x",
            "x16",
            "\u{1F600}",
            "6x16 1e-3",
            "a: b",
            "\0",
        ];
        let dir = Folder::new("hostile");
        let path = dir.0.join(t.cpu.file_name());
        let mut failures = Vec::new();
        let mut loaded = 0u64;
        for n in 0..cases {
            let mut r = kernel_ir::SplitMix64(70_000 + n);
            let mut ls: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            for _ in 0..=r.below(3) {
                let i = r.below(ls.len().max(1));
                match r.below(6) {
                    0 if !ls.is_empty() => {
                        ls.remove(i);
                    }
                    1 if !ls.is_empty() => {
                        let l = ls[i].clone();
                        ls.insert(i, l);
                    }
                    2 => ls.insert(
                        i,
                        format!(
                            "{}: {}",
                            r.pick(&["dot deep-wide", "trial shallow-narrow", "cpu", "x"]),
                            r.pick(&values)
                        ),
                    ),
                    3 if !ls.is_empty() => {
                        let key = ls[i]
                            .split_once(": ")
                            .map_or(ls[i].clone(), |(k, _)| k.to_string());
                        ls[i] = format!("{key}: {}", r.pick(&values));
                    }
                    _ => {}
                }
            }
            let mut bytes = ls.join("\n").into_bytes();
            bytes.push(b'\n');
            if r.chance(25) && !bytes.is_empty() {
                let j = r.below(bytes.len());
                bytes[j] ^= 1 << r.below(8);
            }
            if r.chance(10) {
                bytes.truncate(r.below(bytes.len() + 1));
            }
            std::fs::write(&path, &bytes).unwrap();
            let got = std::panic::catch_unwind(|| HostTuning::load(&dir.0));
            match got {
                Err(_) => failures.push(format!("case {n}: panicked")),
                Ok(None) => {}
                Ok(Some(back)) => {
                    loaded += 1;
                    if !back.dots.fits(back.cpu.registers)
                        || back.trials.iter().any(|t| !t.seconds.is_finite())
                    {
                        failures.push(format!("case {n}: loaded a tuning that does not fit"));
                    }
                }
            }
        }
        let row = format!(
            "| tuning files | {cases} | {} | seed 70: {loaded} mutations still a tuning that fits, the rest not read |\n",
            cases - failures.len() as u64
        );
        let out =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/conformance/hostile");
        let _ = std::fs::create_dir_all(&out);
        let _ = write_all_or_nothing(&out.join("tuning_files.md"), row.as_bytes());
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// On whatever CPU runs it, the tile the JIT uses for each class (the
    /// cached tuning, else a search now; the environment left out) is not
    /// slower than the register rule's on that class's probe beyond noise:
    /// the fastest of 16 interleaved rounds each, 10 % allowed, three
    /// tries (a real loss repeats, a burst of load elsewhere does not).
    #[test]
    fn the_tuned_tile_of_every_class_never_loses_to_the_rule() {
        let t = HostTuning::settle(None, &cache_dir()).unwrap();
        let rule = DotTiling::heuristic(t.cpu.registers);
        for class in DotClass::ALL {
            let tuned = t.dots.get(class);
            assert!(tuned.fits(t.cpu.registers), "{class}: {tuned}");
            if tuned == rule {
                continue;
            }
            let mut tries = Vec::new();
            let lost = (0..3).all(|_| {
                let m = HostTuning::measure(class, &[tuned, rule], 16);
                assert_eq!(m.len(), 2, "{class}: both probes compile and run");
                tries.push((m[0].seconds, m[1].seconds));
                m[0].seconds > 1.10 * m[1].seconds
            });
            assert!(
                !lost,
                "{class}: the tuned tile {tuned} is slower than the rule's {rule} (seconds, tuned vs rule, per try: {tries:?}); its tuning file: {}",
                t.source
            );
        }
    }

    #[test]
    fn the_environment_overrides_and_a_bad_value_is_named() {
        let dir = Folder::new("env");
        let r = CpuIdentity::host().registers;
        let d = HostTuning::settle(Some("default".into()), &dir.0).unwrap();
        assert_eq!(d.dots, DotTilings::heuristic(r));
        let f = HostTuning::settle(Some("5x16".into()), &dir.0).unwrap();
        assert_eq!(f.dots.to_string(), "5x16");
        assert_eq!(f.source, TuningSource::Environment("5x16".into()));
        let one = HostTuning::settle(Some("shallow-wide=4x16".into()), &dir.0).unwrap();
        assert_eq!(one.dots.get(DotClass::ShallowWide).to_string(), "4x16");
        assert_eq!(one.dots.get(DotClass::DeepWide), DotTiling::heuristic(r));
        for bad in ["fast", "deep=4x16", "deep-wide=fast"] {
            let e = HostTuning::settle(Some(bad.into()), &dir.0).unwrap_err();
            assert!(matches!(e, TilingError::Setting(_)), "{e}");
            let e = e.to_string();
            assert!(
                e.contains(TUNING_ENV) && e.contains("ROWSxLANES") && e.contains("default"),
                "{e}"
            );
        }
        // Neither measured nor wrote anything.
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
    }
}
