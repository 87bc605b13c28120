//! `tessera bench [KERNEL] [--max-s N] [--max-bwd-s N] [--budget SECS] [--rounds N] [--json] [--svg FILE]`.

use std::time::Duration;

use tooling::bench::{
    Method, Workload, masked_suite, measure_interleaved, suite, svg_chart, table, to_json,
};

use crate::args::Args;
use crate::{Failure, usage};

/// Benchmark groups by the kernel names they measure; `masked_attention`
/// runs the attention workloads as masks beside the band kernels.
const GROUPS: [&str; 4] = [
    "matmul",
    "flash_attention",
    "flash_attention_bwd",
    "masked_attention",
];

fn group(w: Workload) -> &'static str {
    match w {
        Workload::Matmul { .. } => GROUPS[0],
        Workload::Attention { .. } => GROUPS[1],
        Workload::AttentionBwd { .. } => GROUPS[2],
    }
}

pub fn bench(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "bench",
        args,
        &["max-s", "max-bwd-s", "budget", "rounds", "svg"],
        &["json"],
    )
    .map_err(usage)?;
    let filter = match a.positional.as_slice() {
        [] => None,
        [k] if GROUPS.contains(&k.as_str()) => Some(k.as_str()),
        [k] => {
            return Err(usage(format!(
                "no benchmark for `{k}`; benchmarks exist for {}",
                GROUPS.join(", ")
            )));
        }
        [_, extra, ..] => return Err(usage(format!("unexpected argument `{extra}`"))),
    };
    // Every parameter has a range: a sequence length past 64k or a budget
    // past an hour is a typo, and would run (or allocate) without end.
    let num = |name: &str, default: f64, max: f64| -> Result<f64, Failure> {
        match a.one(name).map_err(usage)? {
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0 && *x <= max)
                .ok_or_else(|| {
                    usage(format!(
                        "--{name} takes a number above 0 and at most {max}, got `{v}`"
                    ))
                }),
            None => Ok(default),
        }
    };
    // The chart's path is checked before minutes of measurement, not after.
    if let Some(path) = a.one("svg").map_err(usage)? {
        let p = std::path::Path::new(path);
        let parent = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if path.trim().is_empty() || p.is_dir() || (p.exists() && !p.is_file()) || !parent.is_dir()
        {
            return Err(usage(format!(
                "--svg {path}: give a file name in an existing folder (not a directory or a device)"
            )));
        }
    }
    let max_s = num("max-s", 8192.0, 65536.0)? as usize;
    let max_bwd_s = num("max-bwd-s", 4096.0, 65536.0)? as usize;
    let budget = Duration::from_secs_f64(num("budget", 3.0, 3600.0)?);
    let rounds = num("rounds", 3.0, 100.0)?;
    if rounds.fract() != 0.0 || rounds < 1.0 {
        return Err(usage(format!(
            "--rounds {rounds}: give a whole number of rounds, 1 or more"
        )));
    }
    let rounds = rounds as usize;
    let mut rows = Vec::new();
    let torch = tooling::bench::torch_python().is_some();
    if !torch {
        eprintln!(
            "no Python with torch: PyTorch is not measured (tooling/benches/setup_torch.sh makes one)"
        );
    }
    let workloads = if filter == Some("masked_attention") {
        masked_suite(max_s, max_bwd_s)
    } else {
        suite(max_s, max_bwd_s, torch)
    };
    for (w, methods) in workloads {
        if filter.is_some_and(|f| f != "masked_attention" && f != group(w)) {
            continue;
        }
        rows.extend(measure_interleaved(w, &methods, budget, rounds, |m, r| {
            eprint!(
                "\r  measuring {w}: {} (round {} of {rounds}) ...{:20}",
                m.name(w),
                r + 1,
                ""
            );
        }));
    }
    eprint!("\r{:90}\r", "");
    if a.flag("json") {
        print!("{}", to_json(&rows));
    } else {
        println!("{}\n", tooling::bench::cpu_summary());
        print!("{}", table(&rows));
    }
    if let Some(path) = a.one("svg").map_err(usage)? {
        tooling::atomic_file::write(std::path::Path::new(path), svg_chart(&rows).as_bytes())
            .map_err(|e| Failure::Run(format!("cannot write {path}: {e}")))?;
        eprintln!("wrote {path}");
    }
    let _ = Method::Jit;
    Ok(())
}
