//! The TPU compiler (libtpu, compile-only) as the authority on the TPU
//! lowering: every library kernel and preset compiles for every generation,
//! a Mosaic error names the kernel author's line, random kernels the
//! verifier accepts compile, and Tessera's VMEM budget agrees with the
//! compiler's.
//!
//! libtpu comes from `.ci/setup.sh`; without it these tests fail with a
//! message naming the fix (they are never skipped).

use std::collections::BTreeMap;
use std::sync::Arc;

use kernel_ir::Target;
use runtime::tpu::{KernelCompileError, TpuCompiler, TpuError};
use tests::random_kernel::{RandomKernel, random_kernel};
use tests::support_matrix;

fn tpu() -> Arc<TpuCompiler> {
    TpuCompiler::load().unwrap_or_else(|e| panic!("the TPU compile check needs libtpu: {e}"))
}

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
}

impl Source {
    fn kernel(self, seed: u64) -> RandomKernel {
        match self {
            Source::Random => random_kernel(seed),
            Source::Matrix => support_matrix::kernel(seed),
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
            let Ok(v) = k.verify() else {
                println!("FUZZ {seed} {target} unverified");
                continue;
            };
            println!("FUZZ {seed} {target} start");
            use std::io::Write;
            let _ = std::io::stdout().flush();
            match tpu.compile_kernel(&v, target) {
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
    let mut out = Vec::new();
    let mut verified = [0usize; 4];
    let mut next = seeds.start;
    while next < seeds.end {
        let child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "tpu_compile::tpu_fuzz_worker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TESSERA_TPU_FUZZ_WORKER", format!("{next}..{}", seeds.end))
            .env(
                "TESSERA_TPU_FUZZ_SOURCE",
                match source {
                    Source::Random => "random",
                    Source::Matrix => "matrix",
                },
            )
            .env("TESSERA_TPU_FUZZ_STEP", step.to_string())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout);
        let mut started: Option<(u64, String)> = None;
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix("FUZZ ") else {
                continue;
            };
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
    }
    (out, verified)
}

/// Tallies a run: verified and compiled per generation, and the rejected
/// kernels grouped by the compiler's summary; fails listing them.
fn check_run(what: &str, outcomes: &[(u64, String, Outcome)], verified: [usize; 4]) {
    let mut compiled = [0usize; 4];
    let mut rejected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (_, target, o) in outcomes {
        let g = Target::ALL.iter().position(|t| t.name() == target).unwrap();
        match o {
            Outcome::Compiled => compiled[g] += 1,
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
        "{what}: verified / compiled per generation: {}",
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
    let cases = env_usize("TESSERA_TPU_FUZZ_CASES", 48) as u64;
    let first = env_usize("TESSERA_TPU_FUZZ_SEED", 1) as u64;
    let (outcomes, verified) = fuzz(Source::Random, first..first + cases, 1);
    check_run(&format!("{cases} random kernels"), &outcomes, verified);
    assert!(
        verified.iter().all(|&v| v as u64 > cases / 8),
        "too few kernels verified: {verified:?}"
    );
}

/// The support matrix: every (op, dtype, rank, mask) kernel the verifier
/// accepts compiles. CI runs every `TESSERA_TPU_MATRIX_STEP`-th (default
/// 7); 1 runs all of it.
#[test]
fn the_support_matrix_compiles_where_the_verifier_accepts_it() {
    tpu();
    let step = env_usize("TESSERA_TPU_MATRIX_STEP", 7) as u64;
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

/// A kernel over [64, 128] blocks of [32, 128] that loads `x` and `y` of
/// `dtype` and stores `body(x, y)` into an `out`-typed output.
fn one_op(
    dtype: kernel_ir::DType,
    out: kernel_ir::DType,
    shape: &[usize],
    block: &[usize],
    body: impl FnOnce(kernel_ir::Ref, kernel_ir::Ref, kernel_ir::Ref),
) -> kernel_ir::Kernel {
    use kernel_ir::IndexExpr;
    use kernel_ir::prelude::*;
    let mut k = KernelBuilder::new("rule");
    let grid: Vec<(usize, kernel_ir::DimSemantics)> = shape
        .iter()
        .zip(block)
        .map(|(a, b)| (a.div_ceil(*b), Parallel))
        .collect();
    k.grid_dims(&grid);
    let map: Vec<IndexExpr> = (0..shape.len()).map(IndexExpr::Grid).collect();
    let x = k
        .input("x", dtype, shape.to_vec())
        .block_exprs(block.to_vec(), map.clone());
    let y = k
        .input("y", dtype, shape.to_vec())
        .block_exprs(block.to_vec(), map.clone());
    let o = k
        .output("o", out, shape.to_vec())
        .block_exprs(block.to_vec(), map);
    body(x, y, o);
    k.finish().unwrap()
}

/// Each rule of the verifier's `mosaic` pass: a kernel that breaks it gets
/// that rule's error at the line of the offending op, and libtpu (with the
/// rule skipped) rejects the same kernel on every generation, so the rule is
/// needed.
#[test]
fn every_tpu_rule_is_spanned_and_libtpu_agrees_it_is_needed() {
    use kernel_ir::prelude::*;
    use kernel_ir::{ErrorKind, Kernel};
    let tpu = tpu();
    let sq = [64usize, 128];
    let bl = [32usize, 128];
    let mut cases: Vec<(&str, u32, Kernel)> = Vec::new();
    macro_rules! case {
        ($rule:expr, $k:expr) => {{
            let line = line!();
            cases.push(($rule, line, $k));
        }};
    }
    case!(
        "f16",
        one_op(F16, F16, &sq, &bl, |x, _, o| o.store(.., x.load(..)))
    );
    case!(
        "i8-arith",
        one_op(I8, I8, &sq, &bl, |x, y, o| o
            .store(.., x.load(..) + y.load(..)))
    );
    case!(
        "masked-store",
        one_op(BF16, BF16, &sq, &bl, |x, _, o| o.store_masked(
            ..,
            x.load(..),
            iota(I32, bl, 1).lt(9)
        ))
    );
    case!(
        "bf16-rem",
        one_op(BF16, BF16, &sq, &bl, |x, y, o| o
            .store(.., x.load(..) % y.load(..)))
    );
    case!(
        "dot-operands",
        one_op(I32, I32, &[128, 128], &[128, 128], |x, y, o| o.store(
            ..,
            dot_general(x.load(..), y.load(..), DotDims::matmul(), I32)
        ))
    );
    case!(
        "dot-acc",
        one_op(BF16, BF16, &[128, 128], &[128, 128], |x, y, o| o.store(
            ..,
            dot_general(x.load(..), y.load(..), DotDims::matmul(), BF16)
        ))
    );
    {
        let mut k = KernelBuilder::new("rule");
        k.grid([2], [Parallel]);
        let t = k.scalar_prefetch("t", [8]);
        let x = k.input("x", I32, [64, 128]).block([32, 128], |[i]| (i, 0));
        let o = k.output("o", I32, [64, 128]).block([32, 128], |[i]| (i, 0));
        let (line, v) = (line!(), t.load([ds(0, 1)]));
        o.store(.., x.load(..) + v.sum_all().broadcast_to([32, 128]));
        cases.push(("smem-vector", line, k.finish().unwrap()));
    }
    case!(
        "bool-carry",
        one_op(Bool, Bool, &sq, &bl, |x, y, o| o.store(
            ..,
            for_range(0, 3, (x.load(..), y.load(..)), |_, (a, b)| (b, a)).0
        ))
    );
    case!(
        "rank1-select",
        one_op(BF16, BF16, &[1024], &[512], |x, y, o| o.store(
            ..,
            iota(I32, [512], 0).lt(7).select(x.load(..), y.load(..))
        ))
    );
    case!(
        "rank1-carry",
        one_op(F32, F32, &[1024], &[512], |x, y, o| o.store(
            ..,
            for_range(
                0,
                3,
                (x.load_masked(.., iota(I32, [512], 0).lt(100)), y.load(..)),
                |_, (a, b)| (b, a)
            )
            .0
        ))
    );
    for (rule, line, kernel) in cases {
        let e = kernel.clone().verify().expect_err(rule);
        // Reported, at the line of the op that breaks it.
        let hit = e
            .0
            .iter()
            .filter(|e| matches!(&e.kind, ErrorKind::TpuUnsupported { rule: r, .. } if *r == rule))
            .find(|e| {
                e.loc
                    .as_ref()
                    .is_some_and(|l| l.file.ends_with("tpu_compile.rs") && l.line == line)
            })
            .unwrap_or_else(|| panic!("{rule}: not reported at line {line}: {e}"));
        assert!(hit.to_string().contains(&format!("[tpu-{rule}]")), "{hit}");
        let unchecked = kernel
            .verify_without_mosaic_rules()
            .unwrap_or_else(|e| panic!("{rule}: {e}"));
        for target in Target::ALL {
            let mut k = unchecked.kernel().clone();
            k.target = target;
            let k = k.verify_without_mosaic_rules().unwrap();
            let module = lowering::tpu_custom_call(&k).unwrap().module;
            let r = tpu.compile(target, &module);
            assert!(
                matches!(r, Err(TpuError::Compile { .. })),
                "{rule} on {target}: libtpu accepts what the rule rejects"
            );
        }
    }
}
