//! `tessera lower` and `tessera list`.

use kernels::Config;
use tooling::atomic_dir::StageError;
use tooling::export::{self, Provenance};

use crate::args::Args;
use crate::kernel_args::kernel_for_lower;
use crate::{Failure, usage};

/// `tessera lower KERNEL [--config k=v]... [--shape NAME=DxD..]... --target T [--out FILE]`.
pub fn lower(args: &[String]) -> Result<(), Failure> {
    let a =
        Args::parse("lower", args, &["config", "shape", "target", "out"], &[]).map_err(usage)?;
    let name = a.kernel("lower").map_err(usage)?;
    let target = a.one("target").map_err(usage)?.ok_or_else(|| {
        usage("give --target: kernel, mosaic, mosaic-body, decomposed, host or triton".into())
    })?;
    if ![
        "kernel",
        "mosaic",
        "mosaic-body",
        "decomposed",
        "host",
        "triton",
    ]
    .contains(&target)
    {
        return Err(usage(format!(
            "unknown target `{target}`; use kernel, mosaic, mosaic-body, decomposed, host or triton"
        )));
    }
    let platform = match target {
        "triton" => kernel_ir::Platform::Gpu,
        _ => kernel_ir::Platform::Tpu,
    };
    let kernel = kernel_ir::for_platform(platform, || kernel_for_lower(name, &a)).map_err(usage)?;
    let text = match target {
        "kernel" => lowering::kernel_module(&kernel),
        "mosaic" => lowering::tpu_custom_call(&kernel).map(|c| c.module),
        "mosaic-body" => lowering::tpu_custom_call(&kernel).map(|c| c.body),
        "decomposed" => lowering::decomposed(&kernel),
        "triton" => lowering::triton(&kernel).map(|p| p.source),
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
            tooling::atomic_file::write(p, text.as_bytes()).map_err(|e| Failure::Run(e.into()))?;
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
    for e in kernels::ENTRIES {
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
        let gpu = kernel_ir::for_platform(kernel_ir::Platform::Gpu, || {
            e.build_at_default_shapes(&cfg).map_err(|e| e.to_string())
        });
        println!(
            "    targets: cpu, tpu, {}",
            crate::compile_gpu::gpu_targets(&gpu)
        );
        for p in e.params {
            println!("    --config {}={:<8} {}", p.name, p.default, p.help);
        }
    }
    println!("\npresets (fixed config and shapes; `tessera lower PRESET --target T`):");
    for p in kernels::presets() {
        println!("    {:<32} {}", p.name(), p.preset.about);
        let gpu = kernel_ir::for_platform(kernel_ir::Platform::Gpu, || {
            p.build().map_err(|e| e.to_string())
        });
        println!(
            "    {:<32} targets: cpu, tpu, {}",
            "",
            crate::compile_gpu::gpu_targets(&gpu)
        );
    }
    Ok(())
}

/// `tessera export KERNEL [--config k=v]... [--shape NAME=DxD..]... [--bucket AXIS=N,N..] --out DIR`:
/// the kernel as a multi-platform artifact (`module.mlir`, `manifest.json`,
/// `vjp/` where it has backward kernels) for `python (package tessera-jax)`;
/// with `--bucket`, one artifact per size of that axis (`DIR/AXIS_N/`) and
/// `DIR/buckets.json`.
pub fn export(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "export",
        args,
        &["config", "shape", "out", "bucket"],
        &["gpu"],
    )
    .map_err(usage)?;
    let gpu = a.flag("gpu");
    let platforms = if gpu {
        "cpu, tpu, cuda and rocm"
    } else {
        "cpu and tpu"
    };
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
    // --out before the work, as the publish will check it.
    export::check_out(dir).map_err(|e| out_error(dir, e))?;
    let kernel = kernel_for_lower(name, &a).map_err(usage)?;
    if crate::kernel_args::is_kernel_file(name) {
        // A kernel file has no entry: no backward, no buckets.
        if a.one("bucket").map_err(usage)?.is_some() {
            return Err(usage(format!(
                "`{name}` is a kernel file, whose text fixes its shapes; drop --bucket"
            )));
        }
        let prov = Provenance {
            entry: format!("file:{name}"),
            config: Vec::new(),
        };
        let art = export::export_on(&kernel, &[], gpu).map_err(|e| Failure::Run(e.to_string()))?;
        publish(dir, &export::artifact_files(&art, None, &prov))?;
        let devices = kernel
            .mesh
            .as_ref()
            .map(|m| format!(", per shard of a mesh of {} devices", m.devices()))
            .unwrap_or_default();
        println!(
            "wrote {} (module.mlir, manifest.json): {} for platforms {platforms}{devices}",
            dir.display(),
            kernel.name
        );
        return Ok(());
    }
    // The entry and config behind the name, for the VJP and the buckets.
    let (entry, config): (&'static kernels::Entry, Vec<(String, String)>) =
        match kernels::preset(name) {
            Some(p) if kernels::find(name).is_none() => (
                p.entry,
                p.preset
                    .config
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            _ => (
                kernels::find(name).ok_or_else(|| usage(format!("unknown kernel `{name}`")))?,
                a.pairs("config").map_err(usage)?,
            ),
        };
    let cfg = kernels::Config::parse(entry, &config).map_err(|e| usage(e.to_string()))?;
    let prov = Provenance {
        entry: entry.name.to_string(),
        config: cfg
            .values()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    let Some(spec) = a.one("bucket").map_err(usage)? else {
        let (files, with_vjp) = artifact(&kernel, entry, &cfg, &prov, gpu).map_err(Failure::Run)?;
        publish(dir, &files)?;
        println!(
            "wrote {} (module.mlir, manifest.json{}): {} for platforms {platforms}",
            dir.display(),
            if with_vjp { ", vjp/" } else { "" },
            kernel.name
        );
        return Ok(());
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
    // Every bucket is built before anything is written: one that fails
    // leaves the earlier family as it was.
    let mut files = Vec::new();
    let mut buckets = Vec::new();
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
        let (bucket, _) = artifact(&k, entry, &cfg, &prov, gpu)
            .map_err(|e| Failure::Run(format!("bucket {n}: {e}")))?;
        let man = bucket
            .iter()
            .find(|(p, _)| p == "manifest.json")
            .map(|(_, b)| b.clone())
            .unwrap_or_default();
        files.extend(bucket.into_iter().map(|(p, b)| (format!("{sub}/{p}"), b)));
        buckets.push((n, sub, man));
    }
    let index = export::family_index(&kernel.name, &prov, axis, &buckets);
    files.push(("buckets.json".into(), index.into_bytes()));
    publish(dir, &files)?;
    println!(
        "wrote {} (buckets.json): {} buckets of axis {axis} of {}",
        dir.display(),
        sizes.len(),
        kernel.name
    );
    Ok(())
}

/// Files of a directory in memory: (relative path, bytes).
type Files = Vec<(String, Vec<u8>)>;

/// The files of one artifact (and its VJP, which the second value says
/// it has), in memory.
fn artifact(
    kernel: &kernel_ir::VerifiedKernel,
    entry: &kernels::Entry,
    cfg: &Config,
    prov: &Provenance,
    gpu: bool,
) -> Result<(Files, bool), String> {
    let fixed = match entry.fixed_inputs {
        Some(f) => {
            let shapes: Vec<Vec<usize>> = kernel.arguments().map(|a| a.shape.to_vec()).collect();
            f(cfg, &shapes).map_err(|e| e.to_string())?
        }
        None => Vec::new(),
    };
    let art = export::export_on(kernel, &fixed, gpu).map_err(|e| e.to_string())?;
    let vjp = export::vjp_on(entry, cfg, kernel, &fixed, gpu).map_err(|e| e.to_string())?;
    Ok((
        export::artifact_files(&art, vjp.as_ref(), prov),
        vjp.is_some(),
    ))
}

/// Writes `files` as the directory `dir`, all or nothing: staged beside
/// it and put in place with one rename (an earlier export there is
/// replaced whole; any other non-empty directory is refused).
/// An export's `--out` that cannot be written, as the command says it.
fn out_error(dir: &std::path::Path, e: StageError) -> Failure {
    match e {
        StageError::NotAnEarlierVersion(_) => usage(format!(
            "--out {} exists and is not an earlier Tessera export (it has no manifest.json or buckets.json); name a new or empty directory (an export replaces its directory whole)",
            dir.display()
        )),
        StageError::NotADirectory(_) => usage(format!("--out {e}")),
        StageError::Io { .. } => Failure::Run(e.to_string()),
    }
}

fn publish(dir: &std::path::Path, files: &[(String, Vec<u8>)]) -> Result<(), Failure> {
    export::publish(dir, files).map_err(|e| out_error(dir, e))
}
