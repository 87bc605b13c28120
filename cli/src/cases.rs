//! `tessera cases`: every catalog kernel and preset as a check case a GPU
//! machine runs without Tessera: the Triton program, sample inputs, the f64
//! reference and the tolerances (`tests/gpu/run.sh` runs them with
//! `tessera_torch` and compares there).

use kernel_ir::{Array, Platform, VerifiedKernel};
use kernels::{Config, ENTRIES, presets};
use runtime::triton::{dtype_name, program_json};
use serde_json::{Value, json};

use crate::args::Args;
use crate::{Failure, usage};

pub const HELP: &str = "\
tessera cases: every catalog kernel as a check case for a GPU

USAGE:
    tessera cases --out DIR [--seed N]

Writes DIR/cases.json and DIR/data/: for every catalog kernel at its
defaults and every preset, built for GPUs (the build `compile --gpu`
compiles), its Triton program (as in an exported triton.json), sample
inputs (little-endian bytes of their dtype), the f64 reference of each
output (little-endian f64) and its tolerance (|out - ref| <= abs + rel *
|ref|, NaN never passes); a kernel the GPU's rules refuse is listed with
the rule. tests/gpu/run.sh runs the cases on a GPU with tessera_torch and
compares there, so the GPU machine needs Python, not Tessera. All or
nothing: DIR appears whole or not at all.
";

/// Runs `tessera cases`.
pub fn cases(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse("cases", args, &["out", "seed"], &[]).map_err(usage)?;
    let out = a
        .one("out")
        .map_err(usage)?
        .ok_or_else(|| usage("give --out DIR".into()))?;
    let seed: u64 = match a.one("seed").map_err(usage)? {
        Some(s) => s
            .parse()
            .map_err(|_| usage(format!("--seed takes a number, got `{s}`")))?,
        None => 7,
    };
    // --out before the work (every kernel built and sampled), as the
    // publish will check it.
    let is_cases = |d: &std::path::Path| d.join("cases.json").is_file();
    tooling::atomic_dir::check_replaceable(std::path::Path::new(out), is_cases)
        .map_err(|e| usage(e.to_string()))?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut list = Vec::new();
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).map_err(|e| Failure::Run(e.to_string()))?;
        let build = || e.build_at_default_shapes(&cfg).map_err(|e| e.to_string());
        let n = list.len();
        list.push(case(n, e.name, e, &cfg, &build, seed, &mut files));
    }
    for p in presets() {
        let cfg = p.config().map_err(|e| Failure::Run(e.to_string()))?;
        let build = || p.build().map_err(|e| e.to_string());
        let n = list.len();
        list.push(case(n, p.name(), p.entry, &cfg, &build, seed, &mut files));
    }
    let index =
        json!({"format": "tessera-gpu-cases", "format_version": 1, "seed": seed, "cases": list});
    files.push(("cases.json".into(), index.to_string().into_bytes()));
    let dir = std::path::Path::new(out);
    let staged = tooling::atomic_dir::StagedDir::new(dir, is_cases)
        .map_err(|e| Failure::Run(e.to_string()))?;
    for (rel, bytes) in &files {
        staged
            .write(rel, bytes)
            .map_err(|e| Failure::Run(e.to_string()))?;
    }
    staged.publish().map_err(|e| Failure::Run(e.to_string()))?;
    let runnable = list.iter().filter(|c| c.get("program").is_some()).count();
    println!(
        "wrote {out} (cases.json, data/): {} cases, {runnable} with a Triton program",
        list.len()
    );
    Ok(())
}

fn case(
    n: usize,
    name: &str,
    entry: &kernels::Entry,
    cfg: &Config,
    build: &dyn Fn() -> Result<VerifiedKernel, String>,
    seed: u64,
    files: &mut Vec<(String, Vec<u8>)>,
) -> Value {
    let skip = |why: String| json!({"name": name, "skipped": why});
    let k = match build() {
        Ok(k) => k,
        Err(e) => return skip(format!("does not build: {e}")),
    };
    // The GPU build of the same config (a layout may differ by platform).
    let gpu = match kernel_ir::for_platform(Platform::Gpu, build) {
        Ok(g) => g,
        Err(e) => return skip(format!("the GPU's rules refuse it: {e}")),
    };
    let program = match lowering::triton(&gpu) {
        Ok(p) => p,
        Err(e) => return skip(format!("no Triton program: {e}")),
    };
    let inputs = entry.sample_inputs(cfg, &k, seed);
    if let Err(e) = entry.check_inputs(cfg, &k, &inputs) {
        return skip(format!("its sampled inputs are refused: {e}"));
    }
    let reference = match entry.reference(cfg, &inputs) {
        Ok(r) => r,
        Err(e) => return skip(format!("no reference: {e}")),
    };
    let tol = entry.tolerances(cfg, &k);
    let mut ins = Vec::new();
    for (i, a) in inputs.iter().enumerate() {
        let file = format!("data/{n}_in{i}.bin");
        files.push((file.clone(), a.to_le_bytes()));
        ins.push(array_entry(a, &file));
    }
    let mut outs = Vec::new();
    for (i, (o, r)) in k.outputs().zip(&reference).enumerate() {
        let file = format!("data/{n}_ref{i}.bin");
        files.push((
            file.clone(),
            r.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ));
        let t = tol.get(i).or(tol.last()).copied();
        outs.push(json!({
            "name": o.name,
            "dtype": dtype_name(o.dtype),
            "shape": o.shape,
            "reference": file,
            "abs": t.map_or(0.0, |t| t.abs),
            "rel": t.map_or(0.0, |t| t.rel),
        }));
    }
    json!({"name": name, "program": program_json(&program), "inputs": ins, "outputs": outs})
}

fn array_entry(a: &Array, file: &str) -> Value {
    json!({"dtype": dtype_name(a.dtype()), "shape": a.shape(), "file": file})
}
