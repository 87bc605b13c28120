//! `tessera profile`: a workload through the graph runtime with tracing
//! on: the transformer block over sequence lengths that fall into several
//! buckets (or one catalog kernel called repeatedly), its trace, the trace's
//! summary, and the summary as an SVG chart.

use graph::{Buckets, Runtime, RuntimeOptions, Stats, Trace};
use kernel_ir::{Array, DType};

use crate::transformer::{BlockWeights, block_forward};
use kernels::{Config, EntryError, find};

/// Why a profile could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No catalog kernel has this name.
    #[error("unknown kernel `{0}`; `tessera list` shows them")]
    UnknownKernel(String),
    /// The kernel's configuration or build failed.
    #[error(transparent)]
    Entry(#[from] EntryError),
    /// The runtime failed (set-up, recording or running).
    #[error(transparent)]
    Runtime(#[from] graph::RuntimeError),
}

/// What ran and what it recorded.
pub struct Profile {
    /// The spans.
    pub trace: Trace,
    /// The runtime's counters over the same run.
    pub stats: Stats,
    /// What ran, in words.
    pub workload: String,
}

/// The transformer block (d_model 128, 2 heads, causal) for `steps` steps
/// over lengths cycling through `lengths`, padded to `buckets`, on a fresh
/// runtime without the disk cache (so first uses compile).
pub fn transformer(
    steps: usize,
    lengths: &[usize],
    buckets: &[usize],
) -> Result<Profile, ProfileError> {
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })?;
    let b = Buckets::new(buckets.to_vec())?;
    let w = BlockWeights::random(128, 2, 7);
    rt.start_tracing();
    let t = w.upload(&rt)?;
    for step in 0..steps {
        let len = lengths[step % lengths.len().max(1)];
        let x = Array::random(DType::F32, [len, 128], step as u64, -1.0, 1.0);
        let xt = rt.dynamic(&x, 0, &b)?;
        block_forward(&w, &t, &xt).and_then(|y| y.to_host())?;
    }
    let trace = rt.stop_tracing();
    Ok(Profile {
        trace,
        stats: rt.stats(),
        workload: format!(
            "transformer block (d_model 128, 2 heads, causal), {steps} steps over lengths {lengths:?}, buckets {buckets:?}"
        ),
    })
}

/// Catalog kernel `name` at its defaults, called `steps` times on its
/// sample inputs through the runtime.
pub fn kernel(name: &str, steps: usize) -> Result<Profile, ProfileError> {
    let e = find(name).ok_or_else(|| ProfileError::UnknownKernel(name.to_string()))?;
    let cfg = Config::parse(e, &[])?;
    let k = e.build_at_default_shapes(&cfg)?;
    let rt = Runtime::new(RuntimeOptions {
        disk_cache: false,
        ..RuntimeOptions::default()
    })?;
    rt.start_tracing();
    for step in 0..steps {
        let inputs = e.sample_inputs(&cfg, &k, step as u64);
        let ts = inputs
            .iter()
            .map(|a| rt.tensor(a))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<_> = ts.iter().collect();
        for o in rt.call(&k, &refs)? {
            o.to_host()?;
        }
    }
    let trace = rt.stop_tracing();
    Ok(Profile {
        trace,
        stats: rt.stats(),
        workload: format!("kernel `{name}` at its defaults, {steps} calls"),
    })
}

/// The summary as an SVG: the time split as one stacked bar, the bucket
/// histogram, and the cache tiers.
pub fn svg(p: &Profile) -> String {
    let s = p.trace.summary();
    let mut out = String::from(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"360\" font-family=\"sans-serif\" font-size=\"12\">\n",
    );
    out += "<rect width=\"720\" height=\"360\" fill=\"white\"/>\n";
    out += &format!(
        "<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n",
        escape(&p.workload)
    );
    let parts = [
        ("compile", s.compile_us, "#d62728"),
        ("kernel JIT", s.kernel_jit_us, "#ff7f0e"),
        ("transfer", s.transfer_us, "#2ca02c"),
        ("execute", s.execute_us, "#1f77b4"),
        ("host", s.host_us(), "#7f7f7f"),
    ];
    let total: f64 = parts.iter().map(|p| p.1).sum::<f64>().max(1e-9);
    out += "<text x=\"10\" y=\"50\">time split</text>\n";
    let mut x = 10.0;
    for (i, (name, us, color)) in parts.iter().enumerate() {
        let w = 700.0 * us / total;
        out += &format!(
            "<rect x=\"{x:.1}\" y=\"60\" width=\"{w:.1}\" height=\"30\" fill=\"{color}\"/>\n"
        );
        out += &format!(
            "<rect x=\"{}\" y=\"100\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"110\">{name} {:.1} ms ({:.0}%)</text>\n",
            10 + 140 * i,
            24 + 140 * i,
            us / 1e3,
            100.0 * us / total
        );
        x += w;
    }
    out += "<text x=\"10\" y=\"150\">inputs per bucket (padding bytes in the label)</text>\n";
    let max = s.buckets.values().map(|b| b.0).max().unwrap_or(1).max(1) as f64;
    for (i, (size, (n,))) in s.buckets.iter().enumerate() {
        let h = 120.0 * *n as f64 / max;
        let bx = 20 + 90 * i;
        out += &format!(
            "<rect x=\"{bx}\" y=\"{:.1}\" width=\"60\" height=\"{h:.1}\" fill=\"#9467bd\"/><text x=\"{bx}\" y=\"300\">{size}: {n}</text>\n",
            290.0 - h
        );
    }
    out += &format!(
        "<text x=\"10\" y=\"330\">padding {:.1}% of padded bytes; compile cache hit rate {:.1}% ({})</text>\n",
        100.0 * s.padding_bytes as f64 / s.padded_bytes.max(1) as f64,
        100.0 * s.hit_rate(),
        s.lookups
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out += "</svg>\n";
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
