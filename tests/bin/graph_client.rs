//! A process that runs the transformer block on the graph runtime at the
//! given sequence lengths with the given compile-cache directory, checks
//! every result against the f64 reference and prints its cache counters.
//! The multi-process cache tests (`tests/it/graph_runtime/graph.rs`) run several.
//!
//! `graph-client --cache DIR --lengths 5,17,100 [--buckets 64,128,256]`

use std::process::ExitCode;

use graph::{Buckets, Runtime, RuntimeOptions};
use kernel_ir::{Array, DType};
use kernels::check::{ErrorStats, Tolerance};
use tooling::transformer::{BlockWeights, block_forward, block_reference};

fn list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| x.trim().parse().map_err(|_| format!("not a number: `{x}`")))
        .collect()
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cache = None;
    let mut lengths = Vec::new();
    let mut buckets = vec![64, 128, 256];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--cache" => cache = Some(value()?),
            "--lengths" => lengths = list(&value()?)?,
            "--buckets" => buckets = list(&value()?)?,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    let rt = Runtime::new(RuntimeOptions {
        cache_dir: cache.map(Into::into),
        ..RuntimeOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let buckets = Buckets::new(buckets).map_err(|e| e.to_string())?;
    let w = BlockWeights::random(128, 2, 7);
    let t = w.upload(&rt).map_err(|e| e.to_string())?;
    for &len in &lengths {
        let x = Array::random(DType::F32, [len, 128], len as u64, -1.0, 1.0);
        let xt = rt.dynamic(&x, 0, &buckets).map_err(|e| e.to_string())?;
        let y = block_forward(&w, &t, &xt)
            .and_then(|y| y.to_host())
            .map_err(|e| format!("length {len}: {e}"))?;
        let s = ErrorStats::between(
            &y,
            &block_reference(&w, &x),
            Tolerance {
                abs: 1e-4,
                rel: 1e-3,
            },
        );
        if !s.passes() {
            return Err(format!("length {len}: {s}"));
        }
    }
    let s = rt.stats();
    println!(
        "STATS compiles={} memory={} disk={} remote={} corrupt={}",
        s.compiles, s.hits_memory, s.hits_disk, s.hits_remote, s.corrupt_entries
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("graph-client: {e}");
            ExitCode::FAILURE
        }
    }
}
