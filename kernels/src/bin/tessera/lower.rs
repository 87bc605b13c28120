//! `tessera lower` and `tessera list`.

use kernels::library::{self, Config};

use crate::args::Args;
use crate::kernel_args::kernel_for_lower;
use crate::{Failure, usage};

/// `tessera lower KERNEL [--config k=v]... [--shape NAME=DxD..]... --target T [--out FILE]`.
pub fn lower(args: &[String]) -> Result<(), Failure> {
    let a =
        Args::parse("lower", args, &["config", "shape", "target", "out"], &[]).map_err(usage)?;
    let name = a.kernel("lower").map_err(usage)?;
    let target = a.one("target").map_err(usage)?.ok_or_else(|| {
        usage("give --target: kernel, mosaic, mosaic-body, decomposed or host".into())
    })?;
    if !["kernel", "mosaic", "mosaic-body", "decomposed", "host"].contains(&target) {
        return Err(usage(format!(
            "unknown target `{target}`; use kernel, mosaic, mosaic-body, decomposed or host"
        )));
    }
    let kernel = kernel_for_lower(name, &a).map_err(usage)?;
    let text = match target {
        "kernel" => lowering::kernel_module(&kernel),
        "mosaic" => lowering::tpu_custom_call(&kernel).map(|c| c.module),
        "mosaic-body" => lowering::tpu_custom_call(&kernel).map(|c| c.body),
        "decomposed" => lowering::decomposed(&kernel),
        _ => lowering::host_module(&kernel),
    }
    .map_err(|e| Failure::Run(e.to_string()))?;
    match a.one("out").map_err(usage)? {
        Some(path) => {
            let p = std::path::Path::new(path);
            if p.exists() && !p.is_file() {
                return Err(usage(format!(
                    "--out {path} exists and is not a regular file; name a new file or a regular one to replace"
                )));
            }
            kernels::tooling::atomic_file::write(p, text.as_bytes()).map_err(Failure::Run)?;
            println!("wrote {path} ({} bytes)", text.len());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// `tessera list`: every catalog kernel with its inputs, outputs and
/// config parameters (with defaults), then the presets.
pub fn list(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse("list", args, &[], &[]).map_err(usage)?;
    if let Some(extra) = a.positional.first() {
        return Err(usage(format!(
            "unexpected argument `{extra}`; see `tessera list --help`"
        )));
    }
    for e in library::ENTRIES {
        println!("{} - {}", e.name, e.about);
        let cfg = Config::parse(e, &[]).map_err(|e| Failure::Run(e.to_string()))?;
        let kernel = e
            .build_at_default_shapes(&cfg)
            .map_err(|e| Failure::Run(e.to_string()))?;
        let inputs: Vec<String> = kernel
            .prefetch
            .iter()
            .map(|p| format!("{} {}{:?} (scalar prefetch)", p.name, p.dtype, p.shape))
            .chain(
                kernel
                    .inputs()
                    .map(|o| format!("{} {}{:?}", o.name, o.dtype, o.shape)),
            )
            .collect();
        let outputs: Vec<String> = kernel
            .outputs()
            .map(|o| format!("{} {}{:?}", o.name, o.dtype, o.shape))
            .collect();
        println!("    inputs:  {}", inputs.join(", "));
        println!("    outputs: {}", outputs.join(", "));
        for p in e.params {
            println!("    --config {}={:<8} {}", p.name, p.default, p.help);
        }
    }
    println!("\npresets (fixed config and shapes; `tessera lower PRESET --target T`):");
    for p in library::presets() {
        println!("    {:<32} {}", p.name(), p.preset.about);
    }
    Ok(())
}

/// `tessera export KERNEL [--config k=v]... [--shape NAME=DxD..]... [--bucket AXIS=N,N..] --out DIR`:
/// the kernel as a multi-platform artifact (`module.mlir`, `manifest.json`,
/// `vjp/` where it has backward kernels) for `kernels/python/tessera_jax.py`;
/// with `--bucket`, one artifact per size of that axis (`DIR/AXIS_N/`) and
/// `DIR/buckets.json`.
pub fn export(args: &[String]) -> Result<(), Failure> {
    let a =
        Args::parse("export", args, &["config", "shape", "out", "bucket"], &[]).map_err(usage)?;
    let name = a.kernel("export").map_err(usage)?;
    let dir = a.one("out").map_err(usage)?.ok_or_else(|| {
        usage("give --out DIR: the directory that receives module.mlir and manifest.json".into())
    })?;
    if dir.trim().is_empty() {
        return Err(usage(
            "--out is empty; give the directory that receives the artifact (it would have been the current one)".into(),
        ));
    }
    let dir = std::path::Path::new(dir);
    let kernel = kernel_for_lower(name, &a).map_err(usage)?;
    // The entry and config behind the name, for the VJP and the buckets.
    let (entry, config): (&'static library::Entry, Vec<(String, String)>) =
        match library::preset(name) {
            Some(p) if library::find(name).is_none() => (
                p.entry,
                p.preset
                    .config
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            _ => (
                library::find(name).ok_or_else(|| usage(format!("unknown kernel `{name}`")))?,
                a.pairs("config").map_err(usage)?,
            ),
        };
    let Some(spec) = a.one("bucket").map_err(usage)? else {
        return export_one(dir, &kernel, entry.name, &config);
    };
    let bad = || {
        usage(format!(
            "--bucket {spec}: write AXIS=N,N,.. (e.g. 2=128,256,512 for attention's sequence axis)"
        ))
    };
    let (axis, sizes) = spec.split_once('=').ok_or_else(bad)?;
    let axis: usize = axis.trim().parse().map_err(|_| bad())?;
    let sizes: Vec<usize> = sizes
        .split(',')
        .map(|n| n.trim().parse::<usize>().ok().filter(|&n| n >= 1))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if let Some(n) = sizes
        .iter()
        .enumerate()
        .find_map(|(i, n)| sizes[..i].contains(n).then_some(n))
    {
        return Err(usage(format!("--bucket {spec}: size {n} is given twice")));
    }
    // Every input whose dim `axis` matches the first array input's is
    // bucketed (scalar prefetch, e.g. a valid length, is never bucketed).
    let base: Vec<(&str, Vec<usize>)> = kernel
        .arguments()
        .map(|x| (x.name, x.shape.to_vec()))
        .collect();
    let prefetch = kernel.kernel().prefetch.len();
    let first = base.get(prefetch).ok_or_else(|| {
        usage(format!(
            "--bucket: kernel `{name}` has no array input to bucket"
        ))
    })?;
    let along = first.1.get(axis).copied().ok_or_else(|| {
        usage(format!(
            "--bucket: the first array input `{}` of `{name}` has no axis {axis} (its shape is {:?})",
            first.0, first.1
        ))
    })?;
    let cfg = library::Config::parse(entry, &config).map_err(|e| usage(e.to_string()))?;
    let mut dirs = Vec::new();
    for &n in &sizes {
        let shapes: Vec<(&str, Vec<usize>)> = base
            .iter()
            .enumerate()
            .map(|(i, (nm, s))| {
                let mut s = s.clone();
                if i >= prefetch && s.get(axis) == Some(&along) {
                    s[axis] = n;
                }
                (*nm, s)
            })
            .collect();
        let k = entry
            .build_with_shapes(&cfg, &shapes)
            .map_err(|e| Failure::Run(format!("bucket {n}: {e}")))?;
        let sub = format!("{axis}_{n}");
        export_one(&dir.join(&sub), &k, entry.name, &config)?;
        dirs.push(sub);
    }
    let list = |v: Vec<String>| v.join(", ");
    let family = format!(
        "{{\"kernel\": \"{}\", \"axis\": {axis}, \"sizes\": [{}], \"dirs\": [{}]}}\n",
        kernel.name,
        list(sizes.iter().map(usize::to_string).collect()),
        list(dirs.iter().map(|d| format!("\"{d}\"")).collect())
    );
    kernels::tooling::atomic_file::write(&dir.join("buckets.json"), family.as_bytes())
        .map_err(Failure::Run)?;
    println!(
        "wrote {} (buckets.json): {} buckets of axis {axis}",
        dir.display(),
        sizes.len()
    );
    Ok(())
}

/// One artifact (and its VJP) into `dir`.
fn export_one(
    dir: &std::path::Path,
    kernel: &kernel_ir::VerifiedKernel,
    entry: &str,
    config: &[(String, String)],
) -> Result<(), Failure> {
    let mut art = kernels::tooling::export::export(kernel).map_err(Failure::Run)?;
    let vjp = kernels::tooling::export::vjp_for(entry, kernel, config).map_err(Failure::Run)?;
    if vjp.is_some() {
        art.manifest =
            art.manifest
                .replacen("  \"platforms\"", "  \"vjp\": \"vjp\",\n  \"platforms\"", 1);
    }
    let write = |d: &std::path::Path, art: &kernels::tooling::export::Artifact| {
        std::fs::create_dir_all(d)
            .map_err(|e| Failure::Run(format!("cannot create {}: {e}", d.display())))?;
        for (file, text) in [
            ("module.mlir", &art.module),
            ("manifest.json", &art.manifest),
        ] {
            kernels::tooling::atomic_file::write(&d.join(file), text.as_bytes())
                .map_err(Failure::Run)?;
        }
        Ok::<(), Failure>(())
    };
    write(dir, &art)?;
    if let Some(v) = &vjp {
        write(&dir.join("vjp"), v)?;
    }
    println!(
        "wrote {} (module.mlir, manifest.json{}): {} for platforms cpu and tpu",
        dir.display(),
        if vjp.is_some() { ", vjp/" } else { "" },
        kernel.name
    );
    Ok(())
}
