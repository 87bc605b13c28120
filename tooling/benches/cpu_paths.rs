//! `cargo bench -p tessera-tooling`: the CPU paths against their XLA baselines, in
//! one run (see `tooling::bench`). `TESSERA_BENCH_MAX_S` caps the attention
//! sequence length (default 8192), `TESSERA_BENCH_MAX_BWD_S` the backward's
//! (default 4096); `TESSERA_BENCH_BUDGET` is the seconds of
//! timed runs per measurement (default 3).

use std::time::Duration;

use tooling::bench::{child_main, measure_isolated, suite, table};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = child_main(&args) {
        return code;
    }
    let max_s = std::env::var("TESSERA_BENCH_MAX_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8192);
    let max_bwd_s = std::env::var("TESSERA_BENCH_MAX_BWD_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    let budget = std::env::var("TESSERA_BENCH_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let mut rows = Vec::new();
    let torch = tooling::bench::torch_python().is_some();
    for (w, methods) in suite(max_s, max_bwd_s, torch) {
        for m in methods {
            let r = measure_isolated(w, m, Duration::from_secs_f64(budget));
            match &r {
                Ok(r) => eprintln!("{w}: {} {:.1} ms", m.name(w), r.seconds * 1e3),
                Err(e) => eprintln!("{w}: {e}"),
            }
            rows.push(r);
        }
    }
    print!("{}", table(&rows));
    std::process::ExitCode::SUCCESS
}
