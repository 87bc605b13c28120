//! `tessera estimate`: libtpu's static schedule estimate of kernels, each
//! compile in a child process, with the guards of
//! `tooling::estimate` (trusted or untrusted, and why).

use kernel_ir::Target;
use libtpu::child::{ChildCompiler, ChildError};
use tooling::cost::cost;
use tooling::estimate::{KernelChildError, KernelEstimate, estimate_kernel, module_json};

use crate::args::Args;
use crate::compile::parse_targets;
use crate::cost::kernels_named;
use crate::tpu_child::child_compiler;
use crate::{Failure, usage};

/// `tessera estimate KERNEL|PRESET|kernels|presets|all --tpu G,.. [--config ..] [--shape ..] [--json] [--no-trace]`,
/// or `tessera estimate --module FILE --tpu G,..`.
pub fn estimate(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "estimate",
        args,
        &[
            "config",
            "shape",
            "input",
            "tpu",
            "module",
            "timeout",
            "max-memory",
            "max-work",
        ],
        &["json", "no-trace"],
    )
    .map_err(usage)?;
    let targets =
        parse_targets(a.one("tpu").map_err(usage)?.unwrap_or("v5e,v6e")).map_err(usage)?;
    let mut child = child_compiler()?;
    child.unrolled = !a.flag("no-trace");
    if let Some(t) = crate::limits::timeout(&a)? {
        child.timeout = t;
    }
    if let Some(path) = a.one("module").map_err(usage)? {
        if !a.positional.is_empty() {
            return Err(usage(
                "--module estimates a module file; give no kernel name".into(),
            ));
        }
        return estimate_module(&child, path, &targets, a.flag("json"));
    }
    let name = a.kernel("estimate").map_err(usage)?;
    let kernels = kernels_named("estimate", name, &a)?;
    let json = a.flag("json");
    let mut rows = Vec::new();
    let (mut failures, mut no_estimate) = (0usize, 0usize);
    for (kname, kernel, inputs) in &kernels {
        let c = cost(kernel, inputs).map_err(|e| Failure::Run(format!("{kname}: {e}")))?;
        if !json {
            println!(
                "{kname}: grid {:?}, {:.3e} dot flops, {} moved, {}",
                kernel.grid.dims.iter().map(|d| d.bound).collect::<Vec<_>>(),
                c.flops as f64,
                kernel_ir::human_bytes(c.bytes_in() + c.bytes_out()),
                c.roofline(targets[0]).bound()
            );
            println!(
                "  {:<4} {:>11} {:>10} {:>15} {:>12} {:>8} {:>17}  verdict",
                "gen", "cycles", "time", "clock", "roofline", "est/roof", "vmatmul/needed"
            );
        }
        for &t in &targets {
            match estimate_kernel(&child, kernel, &c, t) {
                Ok(e) => {
                    if json {
                        rows.push(e.to_json(kname));
                    } else {
                        print_row(&e);
                    }
                }
                Err(e) => {
                    // A profiler abort is a known blind spot (no estimate
                    // for that program), not a failure of the command.
                    let aborted =
                        matches!(e, KernelChildError::Estimate(ChildError::Aborted { .. }));
                    if aborted {
                        no_estimate += 1;
                    } else {
                        failures += 1;
                    }
                    if json {
                        rows.push(serde_json::json!({
                            "kernel": kname, "target": t.name(), "error": e.to_string(),
                            "aborted": aborted, "trusted": false,
                        }));
                    } else {
                        let word = if aborted { "NO ESTIMATE" } else { "FAILED" };
                        println!("  {:<4} {word}  {e}", t.name());
                    }
                }
            }
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    } else if kernels.len() * targets.len() > 1 {
        println!(
            "\n{} estimates: {} with an estimate, {no_estimate} where libtpu's profiler aborted, {failures} failed",
            kernels.len() * targets.len(),
            kernels.len() * targets.len() - no_estimate - failures
        );
    }
    if failures > 0 {
        return Err(Failure::Run(format!(
            "{failures} of {} estimates failed",
            kernels.len() * targets.len()
        )));
    }
    Ok(())
}

fn print_row(e: &KernelEstimate) {
    let clock = match e.clock {
        Some(c) => format!(
            "{:.2} GHz ({})",
            c.hz / 1e9,
            if c.published { "pub" } else { "inf" }
        ),
        None => "unknown".into(),
    };
    let time = e
        .verdict
        .seconds
        .map_or("-".into(), |s| format!("{:.2} µs", s * 1e6));
    let roof = format!(
        "{:.2} µs {}",
        e.roofline.seconds() * 1e6,
        if e.roofline.bound() == "memory" {
            "M"
        } else {
            "C"
        }
    );
    let over = e.over_roofline().map_or("-".into(), |r| format!("{r:.2}"));
    let passes = format!("{}/{}", e.module.vmatmul(), e.needed_passes);
    let verdict = if e.verdict.trusted() {
        "trusted".to_string()
    } else {
        format!("UNTRUSTED: {}", e.verdict.reasons())
    };
    println!(
        "  {:<4} {:>11} {:>10} {:>15} {:>12} {:>8} {:>17}  {verdict}",
        e.target.name(),
        e.cycles(),
        time,
        clock,
        roof,
        over,
        passes
    );
}

/// `--module FILE`: a whole StableHLO module (a Pallas kernel exported by
/// JAX, say) estimated as is, with no guards (Tessera knows nothing of what
/// it computes): cycles per profiled op and the `vmatmul` count.
fn estimate_module(
    child: &ChildCompiler,
    path: &str,
    targets: &[Target],
    json: bool,
) -> Result<(), Failure> {
    let text = crate::compile::read_module(path)?;
    let mut rows = Vec::new();
    let mut failed = 0usize;
    for &t in targets {
        crate::compile::check_module_tensors(&text, t)
            .map_err(|m| usage(format!("--module {path}: {m}")))?;
        match child.estimate(t, &text) {
            Ok(m) => {
                if json {
                    rows.push(module_json(&m));
                } else {
                    let secs = m
                        .seconds()
                        .map_or("-".into(), |s| format!("{:.2} µs", s * 1e6));
                    println!(
                        "  {:<4} {:>11} cycles {:>10}  vmatmul {}",
                        t.name(),
                        m.cycles(),
                        secs,
                        m.vmatmul()
                    );
                    for o in &m.ops {
                        println!("         {:>11} {}", o.cycles, o.hlo_op);
                    }
                }
            }
            Err(e) => {
                failed += 1;
                if json {
                    rows.push(serde_json::json!({"target": t.name(), "error": e.to_string()}));
                } else {
                    println!("  {:<4} FAILED  {e}", t.name());
                }
            }
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(rows));
    }
    if failed > 0 {
        return Err(Failure::Run(format!(
            "{path}: {failed} of {} estimates failed",
            targets.len()
        )));
    }
    Ok(())
}
