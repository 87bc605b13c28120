//! The state harness: generated cases against what the CLI writes (export
//! directories, compile outputs, checkpoint directories): kills at random
//! points, concurrent writers, a full disk, damaged and non-regular files.
//! After each case one invariant is checked: the last good state is intact
//! and loadable, nothing is mixed, and a failure exits non-zero with one
//! line on stderr.
//!
//! `TESSERA_STATE_CASES` (default 40, what CI runs) and
//! `TESSERA_STATE_SEED` (default 27) choose the sample; a failing case
//! prints its number and seed, and `TESSERA_STATE_ONLY=N` reruns it alone.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kernel_ir::sha256_hex;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");

/// splitmix64: a small generator whose stream a seed fixes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// The exports the cases write: (what, arguments before `--out`).
const EXPORTS: &[(&str, &[&str])] = &[
    (
        "causal",
        &["export", "flash_attention", "--config", "causal=true"],
    ),
    ("plain", &["export", "flash_attention"]),
    ("rms", &["export", "rms_norm"]),
    (
        "family-causal",
        &[
            "export",
            "flash_attention",
            "--config",
            "causal=true",
            "--bucket",
            "2=128,256",
        ],
    ),
    (
        "family-plain",
        &["export", "flash_attention", "--bucket", "2=128,256,512"],
    ),
];

/// What a whole export directory is: the SHA-256 of its index (manifest or
/// `buckets.json`), after every file it names checked against its digest
/// (the rule `python (package tessera-jax)` applies). An error says what
/// does not match.
fn whole_export(dir: &Path) -> Result<String, String> {
    // Only a regular file is read: a damaged index may be a link to
    // /dev/zero.
    let (index, text) = ["manifest.json", "buckets.json"]
        .iter()
        .find_map(|f| {
            let p = dir.join(f);
            let regular = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file());
            regular
                .then(|| std::fs::read(&p).ok().map(|b| (f.to_string(), b)))
                .flatten()
        })
        .ok_or_else(|| format!("{}: no index", dir.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("{}/{index}: {e}", dir.display()))?;
    if v["format"] != "tessera-export" || v["format_version"] != 2 {
        return Err(format!("{}/{index}: not a version 2 export", dir.display()));
    }
    let files = v["files"]
        .as_object()
        .ok_or_else(|| format!("{index}: no files"))?;
    for (rel, digest) in files {
        let p = dir.join(rel);
        let meta = std::fs::symlink_metadata(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        if !meta.is_file() {
            return Err(format!("{}: not a regular file", p.display()));
        }
        let got = sha256_hex(&std::fs::read(&p).unwrap());
        if digest.as_str() != Some(got.as_str()) {
            return Err(format!("{}: digest mismatch", p.display()));
        }
    }
    // The sub-artifacts (VJP, buckets) are whole too, and of the same
    // config.
    let subs: Vec<String> = if index == "buckets.json" {
        v["dirs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str().map(String::from))
            .collect()
    } else {
        v["vjp"].as_str().map(String::from).into_iter().collect()
    };
    for sub in subs {
        if !files.contains_key(&format!("{sub}/manifest.json")) {
            return Err(format!("{index}: no digest of {sub}"));
        }
        whole_export(&dir.join(&sub))?;
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(&sub).join("manifest.json")).unwrap())
                .map_err(|e| format!("{sub}: {e}"))?;
        if m["config"] != v["config"] {
            return Err(format!("{sub}: another config than {index}"));
        }
    }
    Ok(sha256_hex(&text))
}

/// Every file under `dir` with its bytes' digest (relative paths).
fn tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                walk(base, &p, out);
            } else if t.is_file() {
                out.insert(rel, sha256_hex(&std::fs::read(&p).unwrap_or_default()));
            } else {
                out.insert(rel, "(not a regular file)".into());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Hidden staging folders left beside `target`.
fn staging_left(target: &Path) -> Vec<String> {
    let prefix = format!(".{}.", target.file_name().unwrap().to_string_lossy());
    std::fs::read_dir(target.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn command(args: &[&str], out: Option<&Path>) -> Command {
    let mut c = Command::new(TESSERA);
    c.args(args);
    if let Some(o) = out {
        c.arg("--out").arg(o);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child` at most a minute (a hang is a failure, not a stall).
fn wait(mut child: Child, what: &str) -> Result<Output, String> {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if t0.elapsed() > Duration::from_secs(60) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: hung for a minute"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn run(args: &[&str], out: Option<&Path>) -> Result<Output, String> {
    let child = command(args, out).spawn().map_err(|e| e.to_string())?;
    wait(child, &args.join(" "))
}

/// Kills `child` after `ms` milliseconds (if it is still running).
fn kill_after(mut child: Child, ms: u64) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(ms) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A failure's answer: a non-zero exit (not a signal, panic or internal
/// error) and exactly one line on stderr.
fn civil_failure(o: &Output, what: &str) -> Result<(), String> {
    let e = String::from_utf8_lossy(&o.stderr);
    match o.status.code() {
        Some(1..=3) if e.lines().count() == 1 => Ok(()),
        _ => Err(format!("{what}: status {:?}, stderr:\n{e}", o.status)),
    }
}

/// Damages the regular file `f` one of five ways; says which.
fn damage(r: &mut Rng, f: &Path) -> &'static str {
    let bytes = std::fs::read(f).unwrap();
    match r.below(5) {
        0 => {
            let mut b = bytes;
            let i = r.below(b.len() as u64) as usize;
            b[i] ^= 1 + r.below(255) as u8;
            std::fs::write(f, b).unwrap();
            "a flipped byte"
        }
        1 => {
            std::fs::write(f, &bytes[..r.below(bytes.len() as u64) as usize]).unwrap();
            "truncated"
        }
        2 => {
            std::fs::remove_file(f).unwrap();
            "removed"
        }
        3 => {
            std::fs::remove_file(f).unwrap();
            let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            "a FIFO in its place"
        }
        _ => {
            std::fs::remove_file(f).unwrap();
            std::os::unix::fs::symlink("/dev/zero", f).unwrap();
            "a link to /dev/zero in its place"
        }
    }
}

/// What an export that ran to its end must leave: when it passed, the
/// whole new export (`want`, its index digest); when it failed, one civil
/// line and `target` exactly as it was (`before`), no staging folder left.
fn new_or_unchanged(
    o: &Output,
    target: &Path,
    want: &str,
    before: &BTreeMap<String, String>,
    desc: String,
) -> Result<String, String> {
    if o.status.success() {
        return match whole_export(target) {
            Ok(dg) if dg == want => Ok(desc),
            got => Err(format!("{desc}: passed but left {got:?}")),
        };
    }
    civil_failure(o, &desc)?;
    let left = staging_left(target);
    if tree(target) != *before || !left.is_empty() {
        return Err(format!(
            "{desc}: failed and changed the old state, or left {left:?}"
        ));
    }
    Ok(desc)
}

/// The good exports, made once: their index digests, and a copy to start
/// cases from.
struct Templates {
    root: PathBuf,
    digests: Vec<String>,
}

impl Templates {
    fn make(root: &Path) -> Templates {
        let mut digests = Vec::new();
        for (i, (_, args)) in EXPORTS.iter().enumerate() {
            let d = root.join(format!("template-{i}"));
            let o = run(args, Some(&d)).unwrap();
            assert!(o.status.success(), "{args:?}: {o:?}");
            digests.push(whole_export(&d).unwrap());
        }
        Templates {
            root: root.to_path_buf(),
            digests,
        }
    }
    fn copy_to(&self, i: usize, to: &Path) {
        let from = self.root.join(format!("template-{i}"));
        let st = Command::new("cp")
            .arg("-r")
            .arg(&from)
            .arg(to)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

/// One generated case; `Err` says what broke the invariant.
fn case(n: usize, seed: u64, t: &Templates, scratch: &Path) -> Result<String, String> {
    let mut r = Rng(seed ^ (n as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let d = scratch.join(format!("case-{n}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let target = d.join("out");
    let k = r.below(100);
    let old = (r.below(4) != 0).then(|| r.below(EXPORTS.len() as u64) as usize);
    if let Some(i) = old {
        t.copy_to(i, &target);
    }
    let new = r.below(EXPORTS.len() as u64) as usize;
    let allowed: Vec<&String> = old.iter().chain([&new]).map(|&i| &t.digests[i]).collect();
    let kind = match k {
        0..40 => "export killed",
        40..55 => "concurrent exports",
        55..70 => "export on a full disk",
        70..80 => "export over a damaged one",
        80..86 => "--out not the command's",
        _ => "train",
    };
    let result = if k < 40 {
        // Killed at a random point.
        let ms = r.below(250);
        let child = command(EXPORTS[new].1, Some(&target)).spawn().unwrap();
        kill_after(child, ms);
        let desc = format!("kill export {} after {ms} ms over {old:?}", EXPORTS[new].0);
        match (whole_export(&target), old) {
            (Ok(dg), _) if allowed.contains(&&dg) => Ok(desc),
            (Err(_), None) if !target.exists() => Ok(desc),
            (got, _) => Err(format!("{desc}: left {got:?}")),
        }
        .and_then(|desc| {
            // The next export there works and leaves no staging folder.
            let o = run(EXPORTS[new].1, Some(&target))?;
            if !o.status.success() {
                return Err(format!("{desc}: the export after failed: {o:?}"));
            }
            let left = staging_left(&target);
            if whole_export(&target).ok().as_ref() != Some(&t.digests[new]) || !left.is_empty() {
                return Err(format!("{desc}: after the next export: {left:?}"));
            }
            Ok(desc)
        })
    } else if k < 55 {
        // Concurrent writers into one directory.
        let others: Vec<usize> = (0..1 + r.below(2))
            .map(|_| r.below(EXPORTS.len() as u64) as usize)
            .collect();
        let writers: Vec<usize> = [new].into_iter().chain(others.iter().copied()).collect();
        let children: Vec<Child> = writers
            .iter()
            .map(|&i| command(EXPORTS[i].1, Some(&target)).spawn().unwrap())
            .collect();
        let desc = format!("{} concurrent exports over {old:?}", writers.len());
        let mut ok_any = false;
        for c in children {
            let o = wait(c, &desc)?;
            if o.status.success() {
                ok_any = true;
            } else {
                civil_failure(&o, &desc)?;
            }
        }
        let written: Vec<&String> = writers.iter().map(|&i| &t.digests[i]).collect();
        match whole_export(&target) {
            Ok(dg) if ok_any && written.contains(&&dg) => Ok(desc),
            got => Err(format!(
                "{desc}: left {got:?} (some writer passed: {ok_any})"
            )),
        }
    } else if k < 70 {
        // A full disk: writes past a random size fail (RLIMIT_FSIZE, with
        // SIGXFSZ ignored, is the same error path as ENOSPC).
        let limit = 256 + r.below(200_000);
        let before = tree(&target);
        let mut c = command(EXPORTS[new].1, Some(&target));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let l = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &l);
                Ok(())
            });
        }
        let o = wait(c.spawn().unwrap(), "full disk")?;
        let desc = format!(
            "export {} with files limited to {limit} bytes over {old:?}",
            EXPORTS[new].0
        );
        new_or_unchanged(&o, &target, &t.digests[new], &before, desc)
    } else if k < 80 {
        // A damaged earlier export: the next export replaces it whole, or
        // (its index gone) refuses it, leaving it as it was.
        if old.is_none() {
            t.copy_to(new, &target);
        }
        let files: Vec<String> = tree(&target).into_keys().collect();
        let f = target.join(r.pick(&files));
        let how = damage(&mut r, &f);
        let desc = format!("export over {} damaged ({how})", f.display());
        if whole_export(&target).is_ok() && how != "a flipped byte" {
            return Err(format!("{desc}: the damage was not seen"));
        }
        let before = tree(&target);
        let o = run(EXPORTS[new].1, Some(&target))?;
        new_or_unchanged(&o, &target, &t.digests[new], &before, desc)
    } else if k < 86 {
        // `--out` naming what is not the command's to replace.
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let file = d.join("file");
        std::fs::write(&file, b"mine").unwrap();
        let foreign = d.join("foreign");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join("notes"), b"mine").unwrap();
        let (args, out): (&[&str], &Path) = match r.below(6) {
            0 => (&["lower", "matmul", "--target", "mosaic"], &fifo),
            1 => (
                &["lower", "matmul", "--target", "mosaic"],
                Path::new("/dev/null"),
            ),
            2 => (EXPORTS[new].1, &file),
            3 => (EXPORTS[new].1, &foreign),
            4 => (&["compile", "matmul", "--tpu", "v5e"], &foreign),
            _ => (&["compile", "matmul", "--tpu", "v5e,v6e"], &foreign),
        };
        let before = (
            tree(&d),
            std::fs::symlink_metadata(out).unwrap().file_type(),
        );
        let o = run(args, Some(out))?;
        let desc = format!("{} --out {}", args.join(" "), out.display());
        if o.status.code() != Some(2) {
            return Err(format!("{desc}: not refused: {o:?}"));
        }
        civil_failure(&o, &desc)?;
        if (
            tree(&d),
            std::fs::symlink_metadata(out).unwrap().file_type(),
        ) == before
        {
            Ok(desc)
        } else {
            Err(format!("{desc}: changed what it refused"))
        }
    } else {
        return train_case(&mut r, &d);
    };
    let _ = std::fs::remove_dir_all(&d);
    result.map(|_| kind.to_string())
}

/// The loss-log line of `step` (`step loss f32-bits`) of a run.
fn loss_at(log: &Path, step: u64) -> Option<String> {
    std::fs::read_to_string(log)
        .ok()?
        .lines()
        .rev()
        .find(|l| l.split_whitespace().next() == Some(&step.to_string()))
        .map(str::to_string)
}

/// The reference: the loss of a run of `STEPS` steps never interrupted.
const STEPS: u64 = 8;

fn reference_loss(scratch: &Path) -> String {
    static REF: Mutex<Option<String>> = Mutex::new(None);
    let mut g = REF.lock().unwrap();
    if let Some(l) = g.as_ref() {
        return l.clone();
    }
    let log = scratch.join("reference.log");
    let o = run(
        &train_args(&scratch.join("reference-ck"), &log, STEPS, true),
        None,
    )
    .unwrap();
    assert!(o.status.success(), "{o:?}");
    let l = loss_at(&log, STEPS).unwrap();
    *g = Some(l.clone());
    l
}

fn train_args<'a>(ck: &'a Path, log: &'a Path, steps: u64, fresh: bool) -> Vec<&'a str> {
    let steps: &'static str = Box::leak(steps.to_string().into_boxed_str());
    let mut v = vec![
        "train",
        "--quiet",
        "--seed",
        "3",
        "--steps",
        steps,
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
        ck.to_str().unwrap(),
        "--loss-log",
        log.to_str().unwrap(),
    ];
    if fresh {
        v.push("--no-resume");
    }
    v
}

/// A training case: a run killed at a random point, or its newest
/// checkpoint damaged; the resumed run must reach the reference's loss bit
/// for bit (a mixed or wrong state would not).
fn train_case(r: &mut Rng, d: &Path) -> Result<String, String> {
    let scratch = d.parent().unwrap();
    let want = reference_loss(scratch);
    let (ck, log) = (d.join("ck"), d.join("log"));
    let (desc, kind);
    if r.below(2) == 0 {
        let ms = 200 + r.below(2000);
        let child = command(&train_args(&ck, &log, STEPS, true), None)
            .spawn()
            .unwrap();
        kill_after(child, ms);
        desc = format!("train killed after {ms} ms");
        kind = "train killed";
    } else {
        let o = run(&train_args(&ck, &log, 6, true), None)?;
        if !o.status.success() {
            return Err(format!("train: {o:?}"));
        }
        let files: Vec<String> = tree(&ck)
            .into_keys()
            .filter(|f| f.contains("0006"))
            .collect();
        let f = ck.join(r.pick(&files));
        let how = damage(r, &f);
        desc = format!("train resumed over {} damaged ({how})", f.display());
        kind = "train over a damaged checkpoint";
    }
    let o = run(&train_args(&ck, &log, STEPS, false), None)?;
    let got = loss_at(&log, STEPS);
    let _ = std::fs::remove_dir_all(d);
    if o.status.success() && got.as_deref() == Some(want.as_str()) {
        Ok(kind.to_string())
    } else {
        Err(format!(
            "{desc}: resumed to {got:?}, the uninterrupted run {want}: {}",
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

#[test]
fn generated_kills_writers_full_disks_and_damage_leave_a_whole_state() {
    let cases: usize = std::env::var("TESSERA_STATE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("TESSERA_STATE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(27);
    let only: Option<usize> = std::env::var("TESSERA_STATE_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    let scratch = std::env::temp_dir().join(format!("tessera-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let t = Arc::new(Templates::make(&scratch));
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let kinds = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (t, next, failures, kinds, scratch) = (
                t.clone(),
                next.clone(),
                failures.clone(),
                kinds.clone(),
                scratch.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= cases {
                        break;
                    }
                    if only.is_some_and(|o| o != n) {
                        continue;
                    }
                    if n > 0 && n % 250 == 0 {
                        eprintln!("{n} of {cases} cases started");
                    }
                    match case(n, seed, &t, &scratch) {
                        Ok(kind) => {
                            *kinds.lock().unwrap().entry(kind).or_default() += 1;
                        }
                        Err(e) => failures
                            .lock()
                            .unwrap()
                            .push(format!("case {n} (seed {seed}): {e}")),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let failures = failures.lock().unwrap();
    let kinds = kinds.lock().unwrap();
    eprintln!(
        "{cases} cases, seed {seed}, {} failed; by kind: {kinds:?}",
        failures.len()
    );
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
