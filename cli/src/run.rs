//! `tessera run` and `tessera diff`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use kernel_ir::{Array, VerifiedKernel};
use kernels::Config;
use runtime::backend::{Backend, Prepared};

use crate::args::Args;
use crate::kernel_args::{choose, is_kernel_file, kernel_and_inputs, kernel_file};
use crate::{Failure, usage};

/// A back end by name (`pjrt` is the portable decomposed StableHLO).
pub fn backend(name: &str) -> Result<Backend, String> {
    match name {
        "pjrt" => Ok(Backend::Decomposed),
        other => other.parse::<Backend>().map_err(|_| {
            format!("unknown backend `{other}`; use interp, jit, pjrt (pjrt-decomposed), pjrt-ffi, triton-interp or all")
        }),
    }
}

/// Elements the interpreter handles per second here, roughly (it computes
/// exactly in f64 and checks every access).
const INTERP_ELEMENTS_PER_SECOND: f64 = 2e7;

fn run_on(b: Backend, k: &VerifiedKernel, inputs: &[Array]) -> Result<Vec<Array>, Failure> {
    if b == Backend::Interpreter {
        // The reference interpreter is slow on big shapes: say so up front
        // (one note, on stderr) rather than sit silent for minutes.
        let per_step: usize = k
            .operands
            .iter()
            .map(|o| o.block.shape.iter().product::<usize>())
            .sum();
        let work = k.grid.steps() as f64 * per_step as f64 * 8.0;
        let secs = work / INTERP_ELEMENTS_PER_SECOND;
        if secs > 10.0 {
            eprintln!(
                "note: the interpreter runs {} grid steps here, about {:.0} s; --backend jit is the fast path",
                k.grid.steps(),
                secs
            );
        }
    }
    Prepared::new(b, k)
        .and_then(|p| p.run(inputs))
        .map_err(|e| Failure::Run(format!("{b}: {e}")))
}

/// The kernel back end `b` runs of catalog kernel `c`: Triton's
/// interpreter runs the kernel built for the GPU's rules
/// ([`kernel_ir::Platform::Gpu`]), the program a GPU compile compiles
/// (a kernel may lay its work out differently there, as the dk/dv
/// kernels do), at the TPU build `tpu`'s argument shapes; every other
/// path the TPU build.
fn kernel_for(
    b: Backend,
    tpu: &VerifiedKernel,
    c: &crate::kernel_args::Chosen,
) -> Result<VerifiedKernel, String> {
    if b != Backend::TritonInterp {
        return Ok(tpu.clone());
    }
    let shapes: Vec<Vec<usize>> = tpu.arguments().map(|a| a.shape.to_vec()).collect();
    kernel_ir::for_platform(kernel_ir::Platform::Gpu, || {
        c.entry.build(&c.config, &shapes)
    })
    .map_err(|e| e.to_string())
}

/// `tessera run KERNEL --input NAME=FILE.npy... [--config k=v]... [--backend B] --out DIR`.
pub fn run(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "run",
        args,
        &[
            "input",
            "config",
            "backend",
            "out",
            "seed",
            "max-memory",
            "max-work",
            "timeout",
        ],
        &[],
    )
    .map_err(usage)?;
    let name = a.kernel("run").map_err(usage)?;
    // A kernel file runs as it is written (a kernel across chips on every
    // device of its mesh); a catalog kernel is built for the inputs.
    let file = if is_kernel_file(name) {
        Some(kernel_file(name, &a).map_err(usage)?)
    } else {
        None
    };
    let seed: u64 = match a.one("seed").map_err(usage)? {
        None => 0,
        Some(s) => s.parse().map_err(|_| {
            usage(format!(
                "--seed {s} is not a whole number; give the interleaving seed of a kernel across chips"
            ))
        })?,
    };
    let out = a
        .one("out")
        .map_err(usage)?
        .ok_or_else(|| usage("give --out DIR, where the output .npy files go".into()))?;
    let which = a.one("backend").map_err(usage)?.unwrap_or("jit");
    let across_chips = file.as_ref().is_some_and(|k| k.mesh.is_some());
    let backends: Vec<Backend> = if which == "all" && across_chips {
        vec![Backend::Interpreter, Backend::Decomposed]
    } else if which == "all" {
        Backend::ALL.to_vec()
    } else {
        vec![backend(which).map_err(usage)?]
    };
    // The output folder is checked before any work: a file in the way or
    // a folder that cannot be made is a usage error now, not after a run.
    let out = Path::new(out);
    if out.exists() && !out.is_dir() {
        return Err(usage(format!(
            "--out {} is a file; give a folder for the output .npy files",
            out.display()
        )));
    }
    let (kernel, inputs, chosen) = match file {
        Some(k) => (k, Vec::new(), None),
        None => {
            let c = choose(name, &a).map_err(usage)?;
            let (k, i) = kernel_and_inputs(&c, &a).map_err(usage)?;
            (k, i, Some(c))
        }
    };
    crate::limits::check(&kernel, &a)?;
    crate::limits::child_timeout(&a)?;
    let mut files = Vec::new();
    let mut report = Vec::new();
    for b in &backends {
        let kernel = match &chosen {
            Some(c) => kernel_for(*b, &kernel, c),
            None => Ok(kernel.clone()),
        };
        // With `all`, a kernel the GPU rules refuse (a tile Triton cannot
        // express) has no Triton path: said, not failed.
        let refused = match &kernel {
            Err(e) => Some(e.clone()),
            Ok(k) if *b == Backend::TritonInterp => k.check_gpu(None).err().map(|e| e.to_string()),
            Ok(_) => None,
        };
        let kernel = match (kernel, refused) {
            (_, Some(why)) if backends.len() > 1 => {
                report.push(format!(
                    "{:<16} refused: {}",
                    b.name(),
                    why.lines().next().unwrap_or_default()
                ));
                continue;
            }
            (Ok(k), _) => k,
            (Err(e), _) => return Err(usage(e)),
        };
        let t = Instant::now();
        let outs = if is_kernel_file(name) {
            crate::run_file::run_file(&kernel, &a, *b, seed)?
        } else {
            run_on(*b, &kernel, &inputs)?
        };
        let dir: PathBuf = if backends.len() > 1 {
            out.join(b.name())
        } else {
            out.to_path_buf()
        };
        for (o, arr) in kernel.outputs().zip(&outs) {
            let path = dir.join(format!("{}.npy", o.name));
            report.push(format!(
                "{:<16} wrote {} ({}{:?})",
                b.name(),
                path.display(),
                arr.dtype(),
                arr.shape()
            ));
            files.push((path, tooling::npy::encode(arr)));
        }
        report.push(format!(
            "{:<16} {:.1} ms including compile",
            b.name(),
            t.elapsed().as_secs_f64() * 1e3
        ));
    }
    // All or nothing: only when every back end succeeded is anything
    // written, and then every file is staged before any is renamed in.
    for (path, _) in &files {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Failure::Run(format!("cannot create {}: {e}", dir.display())))?;
        }
    }
    tooling::atomic_file::write_all(&files).map_err(|e| Failure::Run(e.into()))?;
    for line in report {
        println!("{line}");
    }
    Ok(())
}

/// One side of a diff: a back end's outputs or the f64 reference.
fn side(
    name: &str,
    kernel: &VerifiedKernel,
    c: &crate::kernel_args::Chosen,
    config: &Config,
    inputs: &[Array],
) -> Result<Vec<Vec<f64>>, Failure> {
    if name == "reference" {
        return c
            .entry
            .reference(config, inputs)
            .map_err(|e| Failure::Run(e.to_string()));
    }
    let b = backend(name).map_err(usage)?;
    Ok(
        run_on(b, &kernel_for(b, kernel, c).map_err(usage)?, inputs)?
            .into_iter()
            .map(|a| a.data().to_vec())
            .collect(),
    )
}

/// `tessera diff KERNEL --input ... [--config k=v]... --backends A,B`.
pub fn diff(args: &[String]) -> Result<(), Failure> {
    let a = Args::parse(
        "diff",
        args,
        &[
            "input",
            "config",
            "backends",
            "first",
            "max-memory",
            "max-work",
        ],
        &[],
    )
    .map_err(usage)?;
    let c = choose(a.kernel("diff").map_err(usage)?, &a).map_err(usage)?;
    let pair = a.one("backends").map_err(usage)?.ok_or_else(|| {
        usage(
            "give --backends A,B (two of interp, jit, pjrt, pjrt-ffi, triton-interp, reference)"
                .into(),
        )
    })?;
    let names: Vec<&str> = pair.split(',').map(str::trim).collect();
    let [x, y] = names.as_slice() else {
        return Err(usage(format!(
            "--backends takes two names joined by a comma, got `{pair}`"
        )));
    };
    for n in [x, y] {
        if *n != "reference" {
            backend(n).map_err(usage)?;
        }
    }
    let first: usize = match a.one("first").map_err(usage)? {
        Some(v) => v
            .parse()
            .map_err(|_| usage(format!("--first takes a count, got `{v}`")))?,
        None => 10,
    };
    let (kernel, inputs) = kernel_and_inputs(&c, &a).map_err(usage)?;
    crate::limits::check(&kernel, &a)?;
    crate::limits::child_timeout(&a)?;
    let left = side(x, &kernel, &c, &c.config, &inputs)?;
    let right = side(y, &kernel, &c, &c.config, &inputs)?;
    // Each side's subnormal policy (the f64 reference keeps them).
    let policy =
        |n: &str| backend(n).map_or(runtime::backend::Subnormals::Kept, |b| b.subnormals());
    let (px, py) = (policy(x), policy(y));
    println!(
        "f32 subnormals: {x} {}, {y} {}{}",
        px.name(),
        py.name(),
        if px == py {
            String::new()
        } else {
            " (values of magnitude below 2^-126 may differ by the policies alone)".into()
        }
    );
    for ((o, l), r) in kernel.outputs().zip(&left).zip(&right) {
        println!("output `{}` {}{:?}: {x} vs {y}", o.name, o.dtype, o.shape);
        let d = tooling::diff::compare(&o.name, o.dtype, &o.shape, l, r, first);
        print!("{d}");
    }
    Ok(())
}
