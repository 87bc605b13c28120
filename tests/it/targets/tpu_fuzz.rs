//! Differential fuzzing against the TPU compiler: random, mutated and
//! support-matrix kernels the verifier accepts compile with libtpu, each
//! compile in a child test process (libtpu aborts the process on some
//! inputs), and what libtpu rejects is a verifier gap to close.

use std::collections::BTreeMap;

use kernel_ir::Target;
use libtpu::{KernelCompileError, TpuError};
use tests::random_kernel::{RandomKernel, random_kernel};
use tests::support_matrix;

use crate::targets::tpu_compile::tpu;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One compile of the fuzz: a seed on a generation, and what libtpu said.
#[derive(Debug)]
enum Outcome {
    Compiled,
    /// Tessera's lowering refused it with a spanned error.
    Refused,
    /// libtpu rejected it: the compiler's summary, then the report.
    Rejected(String, String),
    /// libtpu aborted the process compiling it.
    Crashed(String),
}

/// Where the kernels of a differential run come from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// [`random_kernel`] of the seed.
    Random,
    /// Kernel `seed` of the [`support_matrix`].
    Matrix,
    /// [`tests::mutation::mutated_kernel`] of the seed.
    Mutated,
}

impl Source {
    fn kernel(self, seed: u64) -> RandomKernel {
        match self {
            Source::Random => random_kernel(seed),
            Source::Matrix => support_matrix::kernel(seed),
            Source::Mutated => tests::mutation::mutated_kernel(seed),
        }
    }
}

/// Compiles kernels `seeds` of `source` (each for every generation the
/// verifier accepts it for) and prints one `FUZZ` line per compile, so a
/// parent can follow even when libtpu aborts the process.
fn fuzz_worker(source: Source, seeds: impl Iterator<Item = u64>) {
    let tpu = tpu();
    for seed in seeds {
        let rk = source.kernel(seed);
        let Ok(kernel) = rk.kernel else {
            println!("FUZZ {seed} - unbuilt");
            continue;
        };
        for target in Target::ALL {
            let mut k = kernel.clone();
            k.target = target;
            // `TESSERA_TPU_FUZZ_NO_RULES=1` skips the verifier's `mosaic`
            // pass: what libtpu would reject without it (for the record).
            let verified = if std::env::var_os("TESSERA_TPU_FUZZ_NO_RULES").is_some() {
                k.verify_without_mosaic_rules()
            } else {
                k.verify()
            };
            let Ok(mut v) = verified else {
                println!("FUZZ {seed} {target} unverified");
                continue;
            };
            // Every third kernel gets a scoped VMEM limit of exactly its
            // Tessera budget: what Tessera accepts must fit for libtpu too.
            if seed % 3 == 0 {
                let mut k = v.kernel().clone();
                k.vmem_limit = Some(v.vmem_budget().total().div_ceil(4096).max(1) * 4096);
                v = k
                    .verify_without_mosaic_rules()
                    .expect("a kernel verifies at its own budget");
            }
            println!("FUZZ {seed} {target} start");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let compiled = lowering::tpu_custom_call(&v)
                .map_err(|source| KernelCompileError::Lowering { target, source })
                .and_then(|c| Ok(tpu.compile(target, &c.module)?));
            match compiled {
                Ok(_) => println!("FUZZ {seed} {target} ok"),
                Err(KernelCompileError::Tpu(TpuError::Compile { diagnostic, .. })) => {
                    let report = format!(
                        "seed {seed} on {target} ({:?}) at {}:\n{}\n{}",
                        rk.ops,
                        diagnostic.location.as_deref().unwrap_or("?"),
                        *v,
                        diagnostic.message
                    );
                    println!(
                        "FUZZ {seed} {target} rejected {}\u{1}{}",
                        diagnostic.summary.replace('\n', " "),
                        report.replace('\n', "\u{2}")
                    );
                }
                // Tessera's lowering refusing a kernel with a spanned
                // error (a load from `any` memory, which needs DMA) is a
                // refusal before libtpu, as the verifier's would be.
                Err(KernelCompileError::Lowering {
                    source: lowering::LoweringError::Unsupported { loc: Some(_), .. },
                    ..
                }) => println!("FUZZ {seed} {target} refused"),
                Err(e) => println!("FUZZ {seed} {target} error {e}"),
            }
        }
    }
}

#[test]
fn tpu_fuzz_worker() {
    // Runs only as the child of the test below.
    let Ok(range) = std::env::var("TESSERA_TPU_FUZZ_WORKER") else {
        return;
    };
    let source = match std::env::var("TESSERA_TPU_FUZZ_SOURCE").as_deref() {
        Ok("matrix") => Source::Matrix,
        Ok("mutated") => Source::Mutated,
        _ => Source::Random,
    };
    let step = env_usize("TESSERA_TPU_FUZZ_STEP", 1).max(1);
    let (a, b) = range.split_once("..").expect("a..b");
    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
    fuzz_worker(source, (a..b).step_by(step));
}

/// Runs the kernels `seeds` (every `step`-th) of `source` in child
/// processes (this test binary, in worker mode), restarting after a libtpu
/// abort; returns every compile's outcome and the verified count per
/// generation.
fn fuzz(
    source: Source,
    seeds: std::ops::Range<u64>,
    step: u64,
) -> (Vec<(u64, String, Outcome)>, [usize; 4]) {
    let exe = std::env::current_exe().unwrap();
    // The harness names a test by its module path without the crate.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let worker = format!("{module}::tpu_fuzz_worker");
    let mut out = Vec::new();
    let mut verified = [0usize; 4];
    let mut next = seeds.start;
    while next < seeds.end {
        let from = next;
        let child = std::process::Command::new(&exe)
            .args(["--exact", &worker, "--nocapture", "--test-threads=1"])
            .env("TESSERA_TPU_FUZZ_WORKER", format!("{next}..{}", seeds.end))
            .env(
                "TESSERA_TPU_FUZZ_SOURCE",
                match source {
                    Source::Random => "random",
                    Source::Matrix => "matrix",
                    Source::Mutated => "mutated",
                },
            )
            .env("TESSERA_TPU_FUZZ_STEP", step.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout);
        let mut started: Option<(u64, String)> = None;
        for line in stdout.lines() {
            // The harness may print its own text before the first line.
            let Some(at) = line.find("FUZZ ") else {
                continue;
            };
            let rest = &line[at + 5..];
            let mut parts = rest.splitn(4, ' ');
            let seed: u64 = parts.next().unwrap().parse().unwrap();
            let target = parts.next().unwrap().to_string();
            let what = parts.next().unwrap_or("");
            next = next.max(seed + step);
            let g = Target::ALL.iter().position(|t| t.name() == target);
            match what {
                "start" => {
                    started = Some((seed, target.clone()));
                    if let Some(g) = g {
                        verified[g] += 1;
                    }
                    // A crash during this compile resumes after this seed.
                    next = seed + step;
                    continue;
                }
                "ok" => out.push((seed, target, Outcome::Compiled)),
                "refused" => out.push((seed, target, Outcome::Refused)),
                "rejected" => {
                    let body = parts.next().unwrap_or("");
                    let (summary, report) = body.split_once('\u{1}').unwrap_or((body, ""));
                    out.push((
                        seed,
                        target,
                        Outcome::Rejected(summary.to_string(), report.replace('\u{2}', "\n")),
                    ));
                }
                "error" => panic!("seed {seed} on {target}: {}", parts.next().unwrap_or("")),
                _ => {}
            }
            started = None;
        }
        if let Some((seed, target)) = started {
            let stderr = String::from_utf8_lossy(&child.stderr);
            let check = stderr
                .lines()
                .find(|l| l.contains("Check failed") || l.contains("FATAL"))
                .unwrap_or("libtpu aborted")
                .to_string();
            let rk = source.kernel(seed);
            let mut k = rk.kernel.unwrap();
            k.target = target.parse().unwrap();
            out.push((
                seed,
                target.clone(),
                Outcome::Crashed(format!(
                    "{check}\nseed {seed} on {target} ({:?}):\n{k}",
                    rk.ops
                )),
            ));
        } else if !child.status.success() {
            panic!(
                "the fuzz worker failed outside a compile: {}",
                String::from_utf8_lossy(&child.stderr)
            );
        }
        // A worker that ran no kernel would be started again forever.
        assert!(
            next > from,
            "the fuzz worker `{worker}` ran no kernel from seed {from}; is it this binary's test name?\n{stdout}"
        );
    }
    (out, verified)
}

/// Tallies a run: verified and compiled per generation, and the rejected
/// kernels grouped by the compiler's summary; fails listing them.
fn check_run(what: &str, outcomes: &[(u64, String, Outcome)], verified: [usize; 4]) {
    let mut compiled = [0usize; 4];
    let mut refused = 0usize;
    let mut rejected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, target, o) in outcomes {
        let g = Target::ALL.iter().position(|t| t.name() == target).unwrap();
        match o {
            Outcome::Compiled => compiled[g] += 1,
            Outcome::Refused => refused += 1,
            Outcome::Rejected(summary, report) => {
                if std::env::var_os("TESSERA_TPU_FUZZ_TRACE").is_some() {
                    eprintln!(
                        "REJECT {target} {summary} | {}",
                        report.lines().next().unwrap_or("")
                    );
                }
                rejected
                    .entry(summary.clone())
                    .or_default()
                    .push(report.clone())
            }
            Outcome::Crashed(report) => rejected
                .entry("libtpu aborted".into())
                .or_default()
                .push(report.clone()),
        }
    }
    eprintln!(
        "{what}: verified / compiled per generation: {}; refused by the lowering: {refused}",
        Target::ALL
            .iter()
            .enumerate()
            .map(|(g, t)| format!("{t} {}/{}", verified[g], compiled[g]))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut report = String::new();
    for (summary, cases) in &rejected {
        report.push_str(&format!(
            "\n{} verified kernels rejected by libtpu with `{summary}`; first:\n{}\n",
            cases.len(),
            cases[0]
        ));
    }
    assert!(rejected.is_empty(), "{what}:{report}");
}

/// Random kernels: each one the verifier accepts for a generation must
/// compile with libtpu for it (and not crash it). `TESSERA_TPU_FUZZ_CASES`
/// sets how many (default: a fixed-seed sample for CI),
/// `TESSERA_TPU_FUZZ_SEED` the first seed.
#[test]
fn random_kernels_the_verifier_accepts_compile_with_libtpu() {
    tpu();
    let cases = env_usize("TESSERA_TPU_FUZZ_CASES", 32) as u64;
    let first = env_usize("TESSERA_TPU_FUZZ_SEED", 1) as u64;
    let (outcomes, verified) = fuzz(Source::Random, first..first + cases, 1);
    check_run(&format!("{cases} random kernels"), &outcomes, verified);
    assert!(
        verified.iter().all(|&v| v as u64 > cases / 8),
        "too few kernels verified: {verified:?}"
    );
}

/// Mutants of the seed kernels that still verify compile too.
/// `TESSERA_TPU_MUTANTS` sets how many (default 48).
#[test]
fn mutated_kernels_the_verifier_accepts_compile_with_libtpu() {
    tpu();
    let cases = env_usize("TESSERA_TPU_MUTANTS", 48) as u64;
    let (outcomes, verified) = fuzz(Source::Mutated, 0..cases, 1);
    check_run(&format!("{cases} mutated kernels"), &outcomes, verified);
}

/// The support matrix: every (op, dtype, rank, mask) kernel the verifier
/// accepts compiles. CI runs every `TESSERA_TPU_MATRIX_STEP`-th (default
/// 28); 1 runs all of it.
#[test]
fn the_support_matrix_compiles_where_the_verifier_accepts_it() {
    tpu();
    let step = env_usize("TESSERA_TPU_MATRIX_STEP", 28) as u64;
    let (outcomes, verified) = fuzz(Source::Matrix, 0..support_matrix::len(), step);
    check_run(
        &format!(
            "support matrix (every {step}th of {})",
            support_matrix::len()
        ),
        &outcomes,
        verified,
    );
}
