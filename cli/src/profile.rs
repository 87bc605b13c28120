//! `tessera profile [KERNEL] [--steps N] [--out DIR]`: a traced run through
//! the graph runtime (`tooling::profile`).

use std::path::PathBuf;

use tooling::atomic_file;
use tooling::profile::{kernel, svg, transformer};

use crate::args::Args;
use crate::{Failure, usage};

pub fn profile(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse("profile", args, &["steps", "out"], &[]).map_err(usage)?;
    let steps = match a.one("steps").map_err(usage)? {
        None => 12,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| usage(format!("--steps {v}: give an integer in 1..=10000")))?,
    };
    let out = PathBuf::from(
        a.one("out")
            .map_err(usage)?
            .unwrap_or("target/tessera-profile"),
    );
    let p = match a.positional.as_slice() {
        [] => transformer(steps, &[40, 100, 200, 64, 130, 250], &[64, 128, 256]),
        [k] if kernels::find(k).is_none() => {
            return Err(usage(format!(
                "unknown kernel `{k}`; `tessera list` shows the catalog kernels"
            )));
        }
        [k] => kernel(k, steps),
        [_, extra, ..] => return Err(usage(format!("unexpected argument `{extra}`"))),
    }
    .map_err(|e| Failure::Run(e.to_string()))?;
    std::fs::create_dir_all(&out)
        .map_err(|e| Failure::Run(format!("cannot create {}: {e}", out.display())))?;
    let trace = out.join("trace.json");
    let chart = out.join("summary.svg");
    atomic_file::write_all(&[
        (trace.clone(), p.trace.to_chrome_json().into_bytes()),
        (chart.clone(), svg(&p).into_bytes()),
    ])
    .map_err(|e| Failure::Run(e.into()))?;
    println!("{}", p.workload);
    print!("{}", p.trace.summary());
    println!(
        "runtime stats: {} compiles, {} memory hits, {} bytes to the device, {} to the host",
        p.stats.compiles, p.stats.hits_memory, p.stats.bytes_to_device, p.stats.bytes_to_host
    );
    println!(
        "wrote {} ({} spans; open in https://ui.perfetto.dev) and {}",
        trace.display(),
        p.trace.spans.len(),
        chart.display()
    );
    Ok(())
}
