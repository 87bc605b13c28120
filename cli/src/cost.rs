//! `tessera cost [KERNEL|PRESET|all] [--config K=V].. [--shape I=DxD..].. [--input I=FILE].. [--json]`:
//! the HBM↔VMEM traffic a kernel's pipeline implies, its flops and a
//! roofline per TPU generation (`tooling::cost`).

use kernel_ir::{Array, VerifiedKernel};
use kernels::Config;
use tooling::cost::{Cost, cost, lane_sparse, mesh_cost, table};

use crate::args::Args;
use crate::kernel_args::{choose, kernel_for_lower};
use crate::{Failure, usage};

/// A catalog kernel (with `--config`/`--shape`) or preset, built, with its
/// sample inputs (`--input NAME=FILE.npy` replacing any).
pub fn kernel_with_inputs(name: &str, a: &Args) -> Result<(VerifiedKernel, Vec<Array>), Failure> {
    let kernel = kernel_for_lower(name, a).map_err(usage)?;
    // Sampling allocates the inputs: their size is checked first (the
    // work by the commands that run the kernel).
    crate::limits::check_memory(&kernel, a)?;
    if crate::kernel_args::is_kernel_file(name) {
        if !a.all("input").is_empty() {
            return Err(usage(format!(
                "`{name}` is a kernel file; its inputs are sampled (--input takes catalog kernels)"
            )));
        }
        let inputs = kernels::entry::random_inputs(&kernel, 1);
        return Ok((kernel, inputs));
    }
    let (entry, cfg) = match kernels::find(name) {
        Some(e) => (e, choose(name, a).map_err(usage)?.config),
        None => {
            let p =
                kernels::preset(name).ok_or_else(|| usage(format!("unknown kernel `{name}`")))?;
            (p.entry, p.config().map_err(|e| usage(e.to_string()))?)
        }
    };
    let mut inputs = entry.sample_inputs(&cfg, &kernel, 1);
    // `--input NAME=FILE.npy` replaces a sampled input (a valid length, a
    // page table: values that decide the traffic).
    for (k, path) in a.pairs("input").map_err(usage)? {
        let names: Vec<&str> = kernel.arguments().map(|x| x.name).collect();
        let i = names.iter().position(|n| *n == k).ok_or_else(|| {
            usage(format!(
                "kernel `{name}` has no input `{k}`; its inputs are: {}",
                names.join(", ")
            ))
        })?;
        let arr =
            tooling::npy::read(std::path::Path::new(&path)).map_err(|e| usage(e.to_string()))?;
        inputs[i] = arr.cast(inputs[i].dtype());
    }
    entry
        .check_inputs(&cfg, &kernel, &inputs)
        .map_err(|e| usage(e.to_string()))?;
    Ok((kernel, inputs))
}

/// Every catalog kernel at its defaults and every preset, each with its
/// sample inputs (`all` for `cost` and `estimate`).
pub fn every_kernel() -> Result<Vec<(String, VerifiedKernel, Vec<Array>)>, Failure> {
    let mut out = Vec::new();
    for e in kernels::ENTRIES {
        let cfg = Config::parse(e, &[]).map_err(|x| Failure::Run(x.to_string()))?;
        let k = e
            .build_at_default_shapes(&cfg)
            .map_err(|x| Failure::Run(x.to_string()))?;
        let inputs = e.sample_inputs(&cfg, &k, 1);
        out.push((e.name.to_string(), k, inputs));
    }
    for p in kernels::presets() {
        let (k, inputs) = kernel_with_inputs(p.name(), &Args::default())?;
        out.push((p.name().to_string(), k, inputs));
    }
    Ok(out)
}

/// The kernels a name stands for, built, with their sample inputs: one
/// catalog kernel or preset, or `kernels` (every catalog kernel at its
/// defaults), `presets` or `all` (both), for which `--config`, `--shape`
/// and `--input` are usage errors naming `cmd`.
pub fn kernels_named(
    cmd: &str,
    name: &str,
    a: &Args,
) -> Result<Vec<(String, VerifiedKernel, Vec<Array>)>, Failure> {
    if !["all", "kernels", "presets"].contains(&name) {
        let (k, inputs) = kernel_with_inputs(name, a)?;
        // `cost` and `estimate` run it in the interpreter; `compile` does not.
        if cmd != "compile" {
            crate::limits::check(&k, a)?;
        }
        return Ok(vec![(name.to_string(), k, inputs)]);
    }
    if !a.all("config").is_empty() || !a.all("shape").is_empty() || !a.all("input").is_empty() {
        return Err(usage(format!(
            "`{name}` makes `{cmd}` take many kernels at their defaults; --config and --shape need one kernel"
        )));
    }
    let is_preset = |n: &str| kernels::find(n).is_none();
    Ok(every_kernel()?
        .into_iter()
        .filter(|(n, _, _)| match name {
            "kernels" => !is_preset(n),
            "presets" => is_preset(n),
            _ => true,
        })
        .collect())
}

pub fn cost_cmd(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "cost",
        args,
        &["config", "shape", "input", "max-memory", "max-work"],
        &["json"],
    )
    .map_err(usage)?;
    let which = a.positional.first().map(String::as_str).unwrap_or("all");
    if a.positional.len() > 1 {
        return Err(usage(format!("unexpected argument `{}`", a.positional[1])));
    }
    let mut rows: Vec<(String, Cost)> = Vec::new();
    let mut warnings = Vec::new();
    if which == "all" {
        if !a.all("config").is_empty() || !a.all("shape").is_empty() {
            return Err(usage(
                "--config and --shape need one kernel, not `all`".into(),
            ));
        }
        for (name, k, inputs) in every_kernel()? {
            let c = cost(&k, &inputs).map_err(|x| Failure::Run(format!("{name}: {x}")))?;
            warnings.extend(lane_sparse(&k));
            rows.push((name, c));
        }
    } else {
        let (kernel, inputs) = kernel_with_inputs(which, &a)?;
        crate::limits::check(&kernel, &a)?;
        if let Some(mesh) = &kernel.kernel().mesh {
            // Each device gets its own sample (seeded by its id).
            let per_device: Vec<Vec<Array>> = (0..mesh.devices())
                .map(|d| kernels::entry::random_inputs(&kernel, 1 + d as u64))
                .collect();
            let c = mesh_cost(&kernel, &per_device)
                .map_err(|e| Failure::Run(format!("{which}: {e}")))?;
            if a.flag("json") {
                println!("[{}]", c.to_json());
            } else {
                print!("{}", c.table());
            }
            return Ok(());
        }
        let c = cost(&kernel, &inputs).map_err(|e| Failure::Run(format!("{which}: {e}")))?;
        warnings.extend(lane_sparse(&kernel));
        rows.push((which.to_string(), c));
    }
    if a.flag("json") {
        let items: Vec<String> = rows.iter().map(|(_, c)| c.to_json()).collect();
        println!("[{}]", items.join(",\n "));
    } else {
        print!("{}", table(&rows));
    }
    for w in warnings {
        eprintln!("{w}");
    }
    Ok(())
}
