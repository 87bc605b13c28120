//! The kernel-file harness: generated `.kir` kernels (well-typed ones, then
//! mutated ones) through `tessera run FILE.kir --backend all`. One
//! invariant per case: the command either fails with exit 1 or 2 and one
//! line on stderr, or succeeds with outputs that agree on every path
//! (interpreter, JIT, PJRT decomposed, PJRT FFI, the Triton program under
//! Triton's interpreter) within the output dtype's rounding, NaN and ±∞ in
//! the same places; each in bounded time (a minute) and memory (the
//! largest child below 4 GiB).
//!
//! `TESSERA_KIR_CASES` (default 40, what CI runs) and `TESSERA_KIR_SEED`
//! (default 44) choose the sample; a failing case prints its number and
//! the command that reruns it alone (`TESSERA_KIR_ONLY=N`), and leaves
//! its kernel and inputs in a folder it names (`TESSERA_KIR_KEEP=1` keeps
//! every case's).

mod kir_fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kernel_ir::{Array, DType};

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v} is not a whole number"))
        })
        .unwrap_or(default)
}

/// The case `n` of the sample seeded `seed`: seven in ten well-typed, the
/// rest mutated.
fn case(seed: u64, n: u64) -> kir_fuzz::Case {
    let s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(n);
    let c = kir_fuzz::generate(s);
    if n % 10 >= 7 {
        kir_fuzz::mutate(c, s)
    } else {
        c
    }
}

/// How a case ended.
#[derive(Debug)]
enum Outcome {
    Agreed,
    /// Exit 2, with the message.
    Refused(String),
    /// Exit 1, with the message.
    RunFailed(String),
}

impl Outcome {
    fn index(&self) -> usize {
        match self {
            Outcome::Agreed => 0,
            Outcome::Refused(_) => 1,
            Outcome::RunFailed(_) => 2,
        }
    }
}

/// Runs one case in `dir`; `Err` says how it broke the invariant.
fn check(case: &kir_fuzz::Case, dir: &Path) -> Result<Outcome, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let kir = dir.join("kernel.kir");
    std::fs::write(&kir, &case.text).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(TESSERA);
    cmd.arg("run").arg(&kir);
    for (name, a) in &case.inputs {
        let p = dir.join(format!("{name}.npy"));
        tooling::npy::write(&p, a).map_err(|e| e.to_string())?;
        cmd.arg("--input").arg(format!("{name}={}", p.display()));
    }
    let out = dir.join("out");
    cmd.arg("--out").arg(&out).args(["--backend", "all"]);
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).map_err(|e| e.to_string())?)
        .stderr(std::fs::File::create(&stderr).map_err(|e| e.to_string())?);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            // The whole group: the Triton interpreter is a child of it.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            return Err("ran for more than a minute".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    match status.code() {
        Some(0) => {}
        Some(code @ (1 | 2)) => {
            let lines = err.lines().count();
            if lines != 1 {
                return Err(format!("exit {code} with {lines} lines on stderr:\n{err}"));
            }
            let line = err.trim_end().to_string();
            return Ok(if code == 2 {
                Outcome::Refused(line)
            } else {
                Outcome::RunFailed(line)
            });
        }
        other => return Err(format!("exit {other:?} (not 0, 1 or 2):\n{err}")),
    }
    agree(&case.text, &out)
}

/// Every path's outputs against the interpreter's, each at the rounding
/// of the dtype the kernel file declares for it (a bf16 output is written
/// as f32, so the file cannot say).
fn agree(text: &str, out: &Path) -> Result<Outcome, String> {
    let kernel = kernel_ir::parse(text).map_err(|e| format!("ran, yet does not parse: {e}"))?;
    let reference = out.join("interp");
    let names: Vec<(PathBuf, DType)> = kernel
        .outputs()
        .map(|o| (reference.join(format!("{}.npy", o.name)), o.dtype))
        .collect();
    let mut paths = 0;
    for entry in std::fs::read_dir(out).map_err(|e| e.to_string())?.flatten() {
        let path = entry.path();
        if path == reference {
            continue;
        }
        paths += 1;
        for (r, dtype) in &names {
            let file = r.file_name().unwrap();
            let want = tooling::npy::read(r).map_err(|e| e.to_string())?;
            let got = tooling::npy::read(&path.join(file)).map_err(|e| e.to_string())?;
            compare(*dtype, &want, &got).map_err(|e| {
                format!(
                    "{} differs from interp in {}: {e}",
                    path.file_name().unwrap().to_string_lossy(),
                    file.to_string_lossy()
                )
            })?;
        }
    }
    if paths < 3 {
        return Err(format!("only {paths} paths besides the interpreter ran"));
    }
    Ok(Outcome::Agreed)
}

/// Equal up to the rounding of `dtype`: the same NaNs and infinities,
/// integers exactly, finite floats within a relative 1e-4 (bf16: one unit
/// in the last place), plus 1e-5 of the output's largest finite magnitude
/// for cancellation.
fn compare(dtype: DType, want: &Array, got: &Array) -> Result<(), String> {
    if want.shape() != got.shape() {
        return Err(format!("shape {:?}, not {:?}", got.shape(), want.shape()));
    }
    let exact = !dtype.is_float();
    let rtol = match dtype {
        _ if exact => 0.0,
        DType::F32 => 1e-4,
        d => d.epsilon() * 2.0,
    };
    let scale = want
        .data()
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    let atol = if exact { 0.0 } else { 1e-5 * scale };
    for (i, (a, b)) in want.data().iter().zip(got.data()).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= rtol * (a.abs() + b.abs()) + atol
        };
        if !ok {
            return Err(format!(
                "element {i} (row {}, lane {}) is {b}, interp {a}",
                i / want.shape().last().copied().unwrap_or(1).max(1),
                i % want.shape().last().copied().unwrap_or(1).max(1)
            ));
        }
    }
    Ok(())
}

/// The largest resident set of any child so far, in bytes.
fn largest_child() -> u64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    u.ru_maxrss as u64 * 1024
}

#[test]
fn generated_kernel_files_fail_cleanly_or_agree_on_every_path() {
    let seed = env_u64("TESSERA_KIR_SEED", 44);
    let cases = env_u64("TESSERA_KIR_CASES", 40);
    let only = std::env::var("TESSERA_KIR_ONLY")
        .ok()
        .map(|v| v.parse::<u64>().expect("TESSERA_KIR_ONLY is a case number"));
    let todo: Vec<u64> = only.map_or_else(|| (0..cases).collect(), |n| vec![n]);
    let root = std::env::temp_dir().join(format!("tessera-kir-{}", std::process::id()));
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let tally = Mutex::new([[0usize; 3]; 2]);
    let why = Mutex::new(std::collections::BTreeMap::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while let Some(&n) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let c = case(seed, n);
                    let dir = root.join(format!("case-{n}"));
                    match check(&c, &dir) {
                        Ok(o) => {
                            tally.lock().unwrap()[usize::from(!c.mutations.is_empty())]
                                [o.index()] += 1;
                            if let (true, Outcome::Refused(m) | Outcome::RunFailed(m)) =
                                (c.mutations.is_empty(), &o)
                            {
                                // What stops well-typed kernels: the
                                // report says, so a generator drifting
                                // into refusals shows.
                                let key = m.split(": ").nth(2).unwrap_or(m).to_string();
                                *why.lock().unwrap().entry(key).or_insert(0usize) += 1;
                            }
                            if std::env::var_os("TESSERA_KIR_KEEP").is_none() {
                                let _ = std::fs::remove_dir_all(&dir);
                            }
                        }
                        Err(e) => failures.lock().unwrap().push(format!(
                            "case {n} (rerun alone: TESSERA_KIR_SEED={seed} TESSERA_KIR_ONLY={n}; kernel and inputs in {}){}: {e}",
                            dir.display(),
                            if c.mutations.is_empty() {
                                String::new()
                            } else {
                                format!(" mutated by {}", c.mutations.join(", "))
                            }
                        )),
                    }
                }
            });
        }
    });
    let [typed, mutated] = *tally.lock().unwrap();
    eprintln!(
        "kernel files, seed {seed}, {} cases: well-typed {} agreed / {} refused / {} failed to run; mutated {} / {} / {}",
        todo.len(),
        typed[0],
        typed[1],
        typed[2],
        mutated[0],
        mutated[1],
        mutated[2]
    );
    for (m, n) in why.into_inner().unwrap() {
        eprintln!(
            "  {n} well-typed: {}",
            m.chars().take(600).collect::<String>()
        );
    }
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} cases broke the invariant:\n{}",
        failures.len(),
        todo.len(),
        failures.join("\n\n")
    );
    if std::env::var_os("TESSERA_KIR_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    let rss = largest_child();
    assert!(
        rss < 4 << 30,
        "a child grew to {} MiB (more than 4 GiB)",
        rss >> 20
    );
    // A generator whose kernels the verifier refuses tests nothing.
    if only.is_none() && cases >= 20 {
        let typed_total: usize = typed.iter().sum();
        assert!(
            typed[0] * 2 >= typed_total,
            "only {} of {typed_total} well-typed kernels ran on every path",
            typed[0]
        );
    }
}

/// The hostile suite's kernel-file surface at scale, in process (no
/// command per case): `TESSERA_HOSTILE_CASES` (default 2,000) generated
/// and mutated kernel files, seed 70, each through the parser and the
/// verifier, then the checking interpreter, and every tenth verified one
/// through the native JIT too. Each must hold: an error (never a panic),
/// or a run within the resource limits whose JIT outputs agree with the
/// interpreter's. The tally lands in `target/conformance/hostile/`.
#[test]
fn kernel_files_hold_in_process_at_scale() {
    use runtime::backend::{Backend, Prepared};
    let cases = env_u64("TESSERA_HOSTILE_CASES", tooling::hostile::CASES);
    let limits = tooling::resources::Limits::defaults();
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let tally = Mutex::new([0u64; 4]); // refused, failed to run, ran, ran on the JIT too
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if n >= cases {
                        break;
                    }
                    let c = case(70, n);
                    let judged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                        || -> Result<(usize, String), String> {
                            let k = match kernel_ir::parse(&c.text).map_err(|e| e.to_string()) {
                                Ok(k) => k,
                                Err(e) => return Ok((0, e)),
                            };
                            let k = match k.verify() {
                                Ok(k) => k,
                                Err(e) => return Ok((0, e.to_string())),
                            };
                            if let Err(e) = limits.check(&tooling::resources::Demand::of(&k)) {
                                return Ok((0, e));
                            }
                            let mut args = Vec::new();
                            for a in k.arguments() {
                                match c.inputs.iter().find(|(name, _)| name == a.name) {
                                    Some((_, x)) => args.push(x.clone()),
                                    None => return Ok((0, format!("no input `{}`", a.name))),
                                }
                            }
                            let want = match Prepared::new(Backend::Interpreter, &k)
                                .and_then(|p| p.run(&args))
                            {
                                Ok(w) => w,
                                Err(e) => return Ok((1, e.to_string())),
                            };
                            if !n.is_multiple_of(10) {
                                return Ok((2, String::new()));
                            }
                            let got = Prepared::new(Backend::Native, &k)
                                .and_then(|p| p.run(&args))
                                .map_err(|e| format!("interp ran, the JIT did not: {e}"))?;
                            for ((o, w), g) in k.outputs().zip(&want).zip(&got) {
                                compare(o.dtype, w, g)
                                    .map_err(|e| format!("jit `{}`: {e}", o.name))?;
                            }
                            Ok((3, String::new()))
                        },
                    ));
                    match judged {
                        Ok(Ok((kind, why))) => {
                            if kind < 2 && why.trim().is_empty() {
                                failures
                                    .lock()
                                    .unwrap()
                                    .push(format!("case {n}: an error with no message"));
                            }
                            tally.lock().unwrap()[kind] += 1;
                        }
                        Ok(Err(e)) => failures.lock().unwrap().push(format!("case {n}: {e}")),
                        Err(_) => failures.lock().unwrap().push(format!(
                            "case {n}: panicked{}",
                            if c.mutations.is_empty() {
                                String::new()
                            } else {
                                format!(" (mutated by {})", c.mutations.join(", "))
                            }
                        )),
                    }
                }
            });
        }
    });
    let [refused, failed, ran, jit] = *tally.lock().unwrap();
    let failures = failures.into_inner().unwrap();
    let note = format!(
        "seed 70: {refused} refused by the parser, verifier or limits, {failed} run errors, {} ran on the interpreter, {jit} of them on the JIT too",
        ran + jit
    );
    eprintln!("kernel files: {note}");
    tooling::hostile::record(
        &tooling::hostile::folder(),
        "kernel files",
        cases,
        cases - failures.len() as u64,
        &note,
    )
    .unwrap();
    assert!(
        failures.is_empty(),
        "{} of {cases} cases did not hold:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        ran + jit >= cases / 4,
        "{note}: too few ran to test the paths"
    );
}
