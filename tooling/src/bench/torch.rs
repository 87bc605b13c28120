//! The PyTorch baseline: the same workload measured by PyTorch in a Python
//! child process (its own process, as every measurement), when a Python
//! with torch is at hand: `$TESSERA_TORCH_PYTHON`, or the venv
//! `tooling/benches/setup_torch.sh` makes in the cache folder. Time is the
//! median of runs after a warm-up filling the budget (at least two, at most
//! [`super::measure::MAX_RUNS`], as for the others); peak memory the resident-set growth of the
//! first run, read the same way.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{BenchError, HEAD_DIM, HEADS, Measurement, Method, Workload};

/// The Python that has torch, if any.
pub fn torch_python() -> Option<PathBuf> {
    let candidate = std::env::var_os("TESSERA_TORCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| runtime::plugin::cache_dir().join("bench-venv-torch-2.15.0/bin/python"));
    let ok = Command::new(&candidate)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(candidate)
}

const SCRIPT: &str = r#"
import sys, time, torch
import torch.nn.functional as F
kind, size, causal, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
heads, d, max_runs = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
torch.manual_seed(0)
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
if kind == "matmul":
    a, b = torch.rand(size, size), torch.rand(size, size)
    run = lambda: a @ b
else:
    q, k, v = (torch.rand(1, heads, size, d) - 0.5 for _ in range(3))
    try:
        from torch.nn.attention import sdpa_kernel, SDPBackend
        ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    except ImportError:
        import contextlib
        ctx = contextlib.nullcontext
    if kind == "attention":
        def run():
            with ctx(), torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        with ctx():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        do = torch.rand_like(o)
        def run():
            return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
run()
peak = max(0, status("VmHWM:") - before)
times, start = [], time.perf_counter()
while len(times) < 2 or (time.perf_counter() - start < budget and len(times) < max_runs):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
times.sort()
print("TESSERA_BENCH", times[len(times) // 2], len(times), peak)
"#;

/// Measures `w` with PyTorch through `python`.
pub fn measure_torch(
    python: &PathBuf,
    w: Workload,
    budget: Duration,
) -> Result<Measurement, BenchError> {
    let (kind, size, causal) = match w {
        Workload::Matmul { n } => ("matmul", n, false),
        Workload::Attention { s, causal } => ("attention", s, causal),
        Workload::AttentionBwd { s, causal } => ("attention_bwd", s, causal),
    };
    let out = Command::new(python)
        .args([
            "-c",
            SCRIPT,
            kind,
            &size.to_string(),
            if causal { "1" } else { "0" },
        ])
        .arg(budget.as_secs_f64().to_string())
        .args([
            HEADS.to_string(),
            HEAD_DIM.to_string(),
            super::measure::MAX_RUNS.to_string(),
        ])
        .output()
        .map_err(|source| BenchError::Spawn {
            what: format!("torch on {w}"),
            source: std::sync::Arc::new(source),
        })?;
    super::measure::child_result(w, Method::Torch, &out)
}
