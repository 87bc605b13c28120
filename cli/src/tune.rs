//! `tessera tune KERNEL --tpu G | --cpu`: the block sizes of a kernel
//! searched and ranked, by libtpu's trusted estimate or by measured JIT
//! time; `tessera tune --cpu` alone: the JIT's own per-CPU choices
//! measured again and kept ([`lowering::HostTuning::search`]).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kernel_ir::Target;
use kernels::{Config, Entry};
use runtime::backend::{Backend, Prepared};
use tooling::cost::cost;
use tooling::estimate::{KernelEstimate, estimate_kernel};

use crate::args::{Args, parse_shape};
use crate::tpu_child::child_compiler;
use crate::{Failure, usage};

/// Whether a config parameter is a block size the search varies.
fn is_block_param(name: &str) -> bool {
    name.starts_with("block") || ["bm", "bn", "bk"].contains(&name)
}

/// One candidate: its block values and what it scored.
struct Candidate {
    blocks: Vec<(&'static str, String)>,
    score: Score,
}

enum Score {
    Tpu(Box<KernelEstimate>),
    Cpu(Duration),
    /// Verified and estimated, but not rankable (dropped work, no clock,
    /// a profiler abort), with why.
    Unranked(String),
}

impl Candidate {
    /// The rank key: seconds (bandwidth-corrected for TPU estimates), or
    /// cycles where the generation has no clock.
    fn key(&self) -> Option<f64> {
        match &self.score {
            Score::Tpu(e) => e.verdict.seconds.or(Some(e.cycles() as f64)),
            Score::Cpu(d) => Some(d.as_secs_f64()),
            Score::Unranked(_) => None,
        }
    }

    fn config_flags(&self) -> String {
        self.blocks
            .iter()
            .map(|(k, v)| format!("--config {k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Every combination of `values` over the block parameters.
fn combinations(params: &[&'static str], values: &[usize]) -> Vec<Vec<(&'static str, String)>> {
    let mut out: Vec<Vec<(&'static str, String)>> = vec![Vec::new()];
    for &p in params {
        let mut next = Vec::new();
        for prefix in &out {
            for v in values {
                let mut c = prefix.clone();
                c.push((p, v.to_string()));
                next.push(c);
            }
        }
        out = next;
    }
    out
}

/// `tessera tune KERNEL (--tpu G | --cpu) [--config ..] [--shape ..] [--values 128,256,..] [--top N]`.
pub fn tune(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "tune",
        args,
        &[
            "config",
            "shape",
            "tpu",
            "values",
            "top",
            "max-memory",
            "max-work",
        ],
        &["cpu"],
    )
    .map_err(usage)?;
    if a.positional.is_empty() && a.flag("cpu") {
        if let Some(o) = ["config", "shape", "tpu", "values", "top"]
            .into_iter()
            .find(|o| !a.all(o).is_empty())
        {
            return Err(usage(format!(
                "--{o} needs a KERNEL; `tessera tune --cpu` alone tunes the JIT for this CPU"
            )));
        }
        return tune_host();
    }
    let name = a.kernel("tune").map_err(usage)?;
    let entry: &'static Entry = kernels::find(name).ok_or_else(|| {
        usage(format!(
            "unknown kernel `{name}`; tune takes a catalog kernel (`tessera list`), not a preset"
        ))
    })?;
    let target = match (a.one("tpu").map_err(usage)?, a.flag("cpu")) {
        (Some(_), true) | (None, false) => {
            return Err(usage(
                "give one of --tpu G (rank by libtpu's trusted estimate) or --cpu (rank by measured JIT time)".into(),
            ));
        }
        (Some(t), false) => Some(t.parse::<Target>().map_err(|_| {
            usage(format!(
                "unknown TPU generation `{t}`; use v5e, v6e, v5p or v7x"
            ))
        })?),
        (None, true) => None,
    };
    let params: Vec<&'static str> = entry
        .params
        .iter()
        .map(|p| p.name)
        .filter(|n| is_block_param(n))
        .collect();
    if params.is_empty() {
        return Err(usage(format!(
            "kernel `{name}` has no block-size parameter to tune"
        )));
    }
    let fixed = a.pairs("config").map_err(usage)?;
    if let Some((k, _)) = fixed.iter().find(|(k, _)| params.contains(&k.as_str())) {
        return Err(usage(format!(
            "--config {k} is what tune searches; leave it out (or fix it and tune the others with --values)"
        )));
    }
    let values: Vec<usize> = match a.one("values").map_err(usage)? {
        None => vec![128, 256, 512],
        Some(v) => v
            .split(',')
            .map(|x| x.trim().parse::<usize>().ok().filter(|&n| n > 0))
            .collect::<Option<Vec<_>>>()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                usage(format!(
                    "--values {v}: give positive sizes, e.g. 128,256,512"
                ))
            })?,
    };
    let mut values = values;
    values.sort_unstable();
    values.dedup();
    let count = u32::try_from(params.len())
        .ok()
        .and_then(|p| (values.len() as u64).checked_pow(p));
    let max = kernel_ir::limits::MAX_TUNE_CANDIDATES;
    if count.is_none_or(|n| n > max) {
        return Err(usage(format!(
            "--values gives {} sizes for {} block parameters ({}), {} combinations, over the limit of {max} (kernel_ir::limits::MAX_TUNE_CANDIDATES); give fewer sizes, or fix some parameters with --config",
            values.len(),
            params.len(),
            params.join(", "),
            count.map_or("over 2^64".to_string(), |n| n.to_string())
        )));
    }
    let top: usize = match a.one("top").map_err(usage)? {
        None => 10,
        Some(t) => t
            .parse()
            .map_err(|_| usage(format!("--top {t}: give a count")))?,
    };
    let mut shapes = Vec::new();
    for (k, v) in a.pairs("shape").map_err(usage)? {
        shapes.push((k, parse_shape(&v).map_err(usage)?));
    }
    let child = match target {
        Some(_) => Some(child_compiler()?),
        None => None,
    };
    let mut seen = BTreeSet::new();
    let (mut rejected, mut duplicate) = (0usize, 0usize);
    let mut candidates = Vec::new();
    for blocks in combinations(&params, &values) {
        let mut pairs = fixed.clone();
        pairs.extend(blocks.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let Ok(cfg) = Config::parse(entry, &pairs) else {
            rejected += 1;
            continue;
        };
        let kernel = match entry.build_with_shapes(&cfg, &shapes) {
            Ok(k) => k,
            Err(_) => {
                rejected += 1;
                continue;
            }
        };
        // Blocks clamped to a small array build the same kernel.
        if !seen.insert(kernel.kernel().to_string()) {
            duplicate += 1;
            continue;
        }
        crate::limits::check(&kernel, &a)?;
        let inputs = entry.sample_inputs(&cfg, &kernel, 1);
        let score = match (target, &child) {
            (Some(t), Some(child)) => {
                let c = cost(&kernel, &inputs).map_err(|e| Failure::Run(format!("{name}: {e}")))?;
                match estimate_kernel(child, &kernel, &c, t) {
                    Ok(e) if e.verdict.work_in_doubt() => Score::Unranked(e.verdict.reasons()),
                    Ok(e) => Score::Tpu(Box::new(e)),
                    Err(tooling::estimate::KernelChildError::Lower(
                        libtpu::KernelCompileError::Verify { .. },
                    )) => {
                        rejected += 1;
                        continue;
                    }
                    Err(e) => Score::Unranked(e.to_string()),
                }
            }
            _ => {
                let p = Prepared::new(Backend::Native, &kernel)
                    .map_err(|e| Failure::Run(format!("{name}: {e}")))?;
                p.run(&inputs)
                    .map_err(|e| Failure::Run(format!("{name}: {e}")))?;
                let mut best = Duration::MAX;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    p.run(&inputs)
                        .map_err(|e| Failure::Run(format!("{name}: {e}")))?;
                    best = best.min(t0.elapsed());
                }
                Score::Cpu(best)
            }
        };
        candidates.push(Candidate { blocks, score });
    }
    if candidates.is_empty() {
        return Err(Failure::Run(format!(
            "no block sizes from {values:?} verify for `{name}` at these shapes ({rejected} rejected); try --values"
        )));
    }
    candidates.sort_by(|x, y| match (x.key(), y.key()) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let how = match target {
        Some(t) => format!(
            "libtpu's estimate on {t} ({})",
            if libtpu::estimate::clock(t).is_some() {
                "seconds; memory-bound ones at max(estimate, bytes / bandwidth)"
            } else {
                "cycles: no published clock"
            }
        ),
        None => "measured native JIT time (best of 5)".into(),
    };
    println!(
        "{name}: {} candidates ranked by {how}; {rejected} rejected by the verifier (tiling, VMEM, shapes), {duplicate} duplicates",
        candidates.len()
    );
    for (i, c) in candidates.iter().take(top).enumerate() {
        let blocks = c
            .blocks
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let what = match &c.score {
            Score::Tpu(e) => format!(
                "{:>10} cycles {:>11}  {}",
                e.cycles(),
                e.verdict
                    .seconds
                    .map_or("-".into(), |s| format!("{:.2} µs", s * 1e6)),
                if e.verdict.trusted() {
                    "trusted".to_string()
                } else {
                    format!("untrusted: {}", e.verdict.reasons())
                }
            ),
            Score::Cpu(d) => format!("{:>10.3} ms", d.as_secs_f64() * 1e3),
            Score::Unranked(why) => format!("unranked: {why}"),
        };
        println!("  {:>2}. {blocks:<36} {what}", i + 1);
    }
    let best = &candidates[0];
    if best.key().is_none() {
        return Err(Failure::Run(format!(
            "no candidate of `{name}` could be ranked (every estimate dropped work or failed)"
        )));
    }
    println!("winner: {}", best.config_flags());
    Ok(())
}

/// `tessera tune --cpu`: every register tile measured again on this CPU,
/// on each dot class's probe, the table printed and each class's choice
/// kept for every later JIT compile.
fn tune_host() -> Result<(), Failure> {
    let dir = lowering::cache_dir();
    let t = lowering::HostTuning::search(Some(&dir));
    println!("{}\n", t.cpu);
    println!(
        "{:<15} {:<10} {:>12} {:>10}",
        "dot class", "dot tile", "probe time", "vs best"
    );
    for class in lowering::DotClass::ALL {
        let trials: Vec<_> = t.trials.iter().filter(|x| x.class == class).collect();
        let best = trials.first().map_or(f64::NAN, |b| b.seconds);
        for trial in trials {
            let mark = if trial.tiling == t.dots.get(class) {
                "  <- kept"
            } else {
                ""
            };
            println!(
                "{:<15} {:<10} {:>9.3} ms {:>9.2}x{mark}",
                class.name(),
                trial.tiling.to_string(),
                trial.seconds * 1e3,
                trial.seconds / best
            );
        }
    }
    println!(
        "\nA tile replaces the register rule's for a class only where it is {:.0} % faster on the class's probe, in the search and again head to head.",
        lowering::MARGIN * 100.0
    );
    println!("\nJIT dot register tiles ({}):", t.source);
    for line in t.choices() {
        println!("  {line}");
    }
    match &t.source {
        lowering::TuningSource::Measured(Some(_)) => Ok(()),
        lowering::TuningSource::Unwritable(path, e) => Err(Failure::Run(format!(
            "could not write the tuning file {}: {e}; later processes will measure again (set TESSERA_CACHE to a writable folder)",
            path.display()
        ))),
        _ => Err(Failure::Run(format!(
            "could not write the tuning file in {}; later processes will measure again",
            dir.display()
        ))),
    }
}
