//! `cargo bench -p tessera-graph`: what the deferred graph costs on a small
//! graph, next to the same graph run eagerly, op by op, through the plugin
//! (each op its own cached executable), in one run.
//!
//! The graph (10 ops): `softmax(tanh(x·w) * 0.5 + b, 1)`, row sums, mean.

use std::time::{Duration, Instant};

use graph::{Runtime, RuntimeError, RuntimeOptions, Tensor};
use kernel_ir::{Array, DType};

fn graph(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor, RuntimeError> {
    x.matmul(w)?
        .tanh()?
        .scale(0.5)?
        .add(b)?
        .softmax(1)?
        .sum(&[1])?
        .mean(&[0])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over runs filling about `budget`.
fn time(
    budget: Duration,
    mut f: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    f()?; // warm-up: compiles
    let mut v = Vec::new();
    let start = Instant::now();
    while v.len() < 20 || (start.elapsed() < budget && v.len() < 100_000) {
        let t = Instant::now();
        f()?;
        v.push(t.elapsed().as_secs_f64());
    }
    Ok(median(v))
}

fn main() -> Result<(), RuntimeError> {
    let budget = Duration::from_secs(2);
    let make = |eager| {
        Runtime::new(RuntimeOptions {
            disk_cache: false,
            eager,
            ..RuntimeOptions::default()
        })
    };
    let lazy = make(false)?;
    let eager = make(true)?;
    let xs = Array::random(DType::F32, [64, 64], 1, -1.0, 1.0);
    let ws = Array::random(DType::F32, [64, 64], 2, -0.1, 0.1);
    let bs = Array::random(DType::F32, [64, 64], 3, -1.0, 1.0);
    let inputs = |rt: &Runtime| -> Result<(Tensor, Tensor, Tensor), RuntimeError> {
        Ok((rt.tensor(&xs)?, rt.tensor(&ws)?, rt.tensor(&bs)?))
    };
    let (x, w, b) = inputs(&lazy)?;

    // Recording alone: ops per second without a sync.
    let record = time(budget, || {
        let t = Instant::now();
        let mut y = x.clone();
        for _ in 0..100 {
            y = y.tanh()?;
        }
        std::hint::black_box(&y);
        let _ = t;
        Ok(())
    })? / 100.0;

    // A cache hit: record the graph, sync (fingerprint, find, run), read.
    let lazy_iter = time(budget, || graph(&x, &w, &b)?.to_host().map(drop))?;
    // The same with tracing on (spans recorded; off, each span point is
    // one atomic load).
    lazy.start_tracing();
    let mut traced_runs = 0u64;
    let traced_iter = time(budget, || {
        traced_runs += 1;
        graph(&x, &w, &b)?.to_host().map(drop)
    })?;
    let trace = lazy.stop_tracing();
    let spans = trace.spans.len();
    // The runtime's own time per iteration, from the trace: recording and
    // materializing, less the PJRT execute and transfer calls.
    let sum = |name: &str| -> f64 {
        trace
            .spans
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.dur_us)
            .sum::<f64>()
    };
    let own = (sum("record") + sum("materialize") - sum("execute") - sum("h2d"))
        / traced_runs.max(1) as f64;
    let pjrt = (sum("execute") + sum("h2d") + sum("d2h")) / traced_runs.max(1) as f64;
    // Its parts: record + sync without the read; the read of a ready
    // tensor alone.
    let sync_only = time(budget, || {
        let y = graph(&x, &w, &b)?;
        lazy.sync(&[&y])
    })?;
    let ready = graph(&x, &w, &b)?;
    lazy.sync(&[&ready])?;
    let read_only = time(budget, || ready.to_host().map(drop))?;
    // Raw PJRT: one execute of the same graph's module, inputs already on
    // the device, outputs not read.
    let module = lazy.export(&[&x, &w, &b], &[&graph(&x, &w, &b)?])?;
    let client = runtime::pjrt::Client::cpu(1).map_err(|e| RuntimeError::failed("client", e))?;
    let exe = client
        .compile(
            module.as_bytes(),
            &runtime::pjrt::CompileOptions {
                num_replicas: 1,
                num_partitions: 1,
                static_assignment: false,
                shardy: false,
            },
        )
        .map_err(|e| RuntimeError::failed("compile", e))?;
    let bufs: Vec<runtime::pjrt::Buffer> = [&xs, &ws, &bs]
        .iter()
        .map(|a| client.upload(a, 0))
        .collect::<Result<_, _>>()
        .map_err(|e| RuntimeError::failed("upload", e))?;
    let args: Vec<&runtime::pjrt::Buffer> = bufs.iter().collect();
    let raw = time(budget, || {
        exe.execute(&args)
            .map(drop)
            .map_err(|e| RuntimeError::failed("execute", e))
    })?;
    let (ex, ew, eb) = inputs(&eager)?;
    let eager_iter = time(budget, || graph(&ex, &ew, &eb)?.to_host().map(drop))?;
    let same = graph(&x, &w, &b)?.item()? - graph(&ex, &ew, &eb)?.item()?;

    let s = lazy.stats();
    println!("graph runtime, small graph of 10 ops on f32[64, 64] (median of repeated runs)");
    let rows = [
        (
            "per-op recording overhead",
            format!("{:.2} µs", record * 1e6),
        ),
        (
            "deferred: record + sync + read (cache hit)",
            format!("{:.1} µs", lazy_iter * 1e6),
        ),
        (
            "  the same, tracing on",
            format!("{:.1} µs", traced_iter * 1e6),
        ),
        (
            "  tracing on / off",
            format!("{:.2}x ({spans} spans)", traced_iter / lazy_iter),
        ),
        ("  the runtime's own part (trace)", format!("{own:.1} µs")),
        (
            "  PJRT execute + transfers (trace)",
            format!("{pjrt:.1} µs"),
        ),
        (
            "  of which record + sync (no read)",
            format!("{:.1} µs", sync_only * 1e6),
        ),
        (
            "  a read of a ready tensor",
            format!("{:.1} µs", read_only * 1e6),
        ),
        (
            "raw PJRT execute of the same module",
            format!("{:.1} µs", raw * 1e6),
        ),
        (
            "deferred / raw PJRT execute",
            format!("{:.1}x", lazy_iter / raw),
        ),
        (
            "eager: op by op through the plugin",
            format!("{:.1} µs", eager_iter * 1e6),
        ),
        (
            "eager / deferred",
            format!("{:.2}x", eager_iter / lazy_iter),
        ),
    ];
    for (label, value) in rows {
        println!("{label:<44} {value:>12}");
    }
    println!(
        "deferred: {} compiles, {} memory hits, hit rate {:.4}; results differ by {same:.1e}",
        s.compiles,
        s.hits_memory,
        s.hit_rate()
    );
    let e = eager.stats();
    println!(
        "eager: {} compiles, {} materializations",
        e.compiles, e.materializations
    );
    Ok(())
}
