//! `tessera demo`: the main job. Builds flash attention from the
//! `#[tpu_kernel]` DSL, verifies it, shows its grid, tiling, IR and VMEM
//! budget, writes it lowered to every target, compiles it with the TPU
//! compiler (libtpu, compile-only) for every generation, runs it and the
//! foundation kernels on every CPU path on random inputs, and compares each
//! with its f64 reference, with timings.

use std::io::Write;
use std::process::ExitCode;

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};
use kernels::check::Tolerance;
use kernels::{Config, EntryError};
use runtime::backend::Backend;
use tooling::paths::run_paths;

/// One demo case: a library kernel at the demo's config and shapes, with
/// inputs, reference and tolerances from its entry.
struct Case {
    name: &'static str,
    kernel: Result<VerifiedKernel, EntryError>,
    inputs: Vec<Array>,
    reference: Result<Vec<Vec<f64>>, EntryError>,
    tol: Vec<Tolerance>,
}

/// The demo's attention runs at the entry's default shapes, `[1, 2, 256,
/// 64]`, in 64 × 128 blocks.
const DEFAULT_SHAPES: &[(&str, &[usize])] = &[];
const ATTN_CONFIG: &[(&str, &str)] = &[("sm_scale", "0.125"), ("block_q", "64")];

type Demo = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static [usize])],
);

/// (label, entry, config, shapes) of every case.
const DEMO: &[Demo] = &[
    (
        "flash attention f32",
        "flash_attention",
        ATTN_CONFIG,
        DEFAULT_SHAPES,
    ),
    (
        "flash attention f32 causal",
        "flash_attention",
        &[("sm_scale", "0.125"), ("block_q", "64"), ("causal", "true")],
        DEFAULT_SHAPES,
    ),
    (
        "flash attention bf16 causal",
        "flash_attention",
        &[
            ("sm_scale", "0.125"),
            ("block_q", "64"),
            ("causal", "true"),
            ("dtype", "bf16"),
        ],
        DEFAULT_SHAPES,
    ),
    (
        "add 512x1024 (blocks 64x512)",
        "add",
        &[("block_rows", "64"), ("block_cols", "512")],
        &[("x", &[512, 1024]), ("y", &[512, 1024])],
    ),
    (
        "matmul 256x256x512 bf16 -> f32",
        "matmul",
        &[("dtype", "bf16")],
        &[],
    ),
    (
        "softmax 256x1024 (rows of 32)",
        "softmax",
        &[("block_rows", "32")],
        &[("x", &[256, 1024])],
    ),
    (
        "layer_norm 256x1024 (rows of 16)",
        "layer_norm",
        &[("block_rows", "16")],
        &[("x", &[256, 1024]), ("gamma", &[1024]), ("beta", &[1024])],
    ),
];

fn case((name, entry, config, shapes): &Demo, seed: u64) -> Result<Case, String> {
    let e = kernels::find(entry).ok_or_else(|| format!("no library kernel `{entry}`"))?;
    let pairs: Vec<(String, String)> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = Config::parse(e, &pairs).map_err(|e| e.to_string())?;
    let kernel = e.build_with_shapes(&cfg, shapes);
    let (inputs, reference, tol) = match &kernel {
        Ok(k) => {
            let inputs = e.sample_inputs(&cfg, k, seed);
            let reference = e.reference(&cfg, &inputs);
            (inputs, reference, e.tolerances(&cfg, k))
        }
        Err(err) => (Vec::new(), Err(err.clone()), Vec::new()),
    };
    Ok(Case {
        name,
        kernel,
        inputs,
        reference,
        tol,
    })
}

fn cases() -> Vec<Case> {
    DEMO.iter()
        .enumerate()
        .filter_map(|(i, d)| match case(d, 10 * (i as u64 + 2)) {
            Ok(c) => Some(c),
            Err(e) => {
                println!("{}: {e}", d.0);
                None
            }
        })
        .collect()
}

/// Writes the kernel lowered to every target under `target/tessera-demo`
/// and says where.
fn write_lowered(name: &str, k: &VerifiedKernel) {
    let dir = std::path::Path::new("target/tessera-demo");
    println!("\n== {name}: lowered");
    if let Err(e) = std::fs::create_dir_all(dir) {
        println!("cannot create {}: {e}", dir.display());
        return;
    }
    let custom = lowering::tpu_custom_call(k);
    let files: Vec<(&str, Result<String, String>)> = vec![
        (
            "kernel.mlir",
            lowering::kernel_module(k).map_err(|e| e.to_string()),
        ),
        (
            "tpu_custom_call.mlir",
            custom
                .as_ref()
                .map(|c| c.module.clone())
                .map_err(|e| e.to_string()),
        ),
        (
            "mosaic_body.mlir",
            custom
                .as_ref()
                .map(|c| c.body.clone())
                .map_err(|e| e.to_string()),
        ),
        (
            "decomposed.mlir",
            lowering::decomposed(k).map_err(|e| e.to_string()),
        ),
        (
            "host.mlir",
            lowering::host_module(k).map_err(|e| e.to_string()),
        ),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        match text.and_then(|t| {
            std::fs::write(&path, &t)
                .map(|_| t.len())
                .map_err(|e| e.to_string())
        }) {
            Ok(n) => println!("  {:<42} {n:>8} bytes", path.display()),
            Err(e) => println!("  {:<42} error: {e}", path.display()),
        }
    }
}

/// Compiles the attention kernels with libtpu for every generation and
/// prints what the compiler reports; false if any fails (or libtpu is
/// missing).
fn compile_for_tpu(cases: &[Case]) -> bool {
    println!(
        "\n== flash attention compiled by the TPU compiler (libtpu, compile-only; nothing runs)"
    );
    if let Err(e) = libtpu::locate_libtpu() {
        println!("{e}");
        return false;
    }
    // Each compile in its own process: an abort of libtpu fails one row.
    let child = match crate::tpu_child::child_compiler() {
        Ok(c) => c,
        Err(_) => {
            println!("cannot find the tessera binary to run the compiles in");
            return false;
        }
    };
    println!(
        "{:<34} {:<4} {:>8} {:>10} {:>12} {:>12}  result",
        "kernel", "tpu", "compile", "code", "HBM peak", "VMEM budget"
    );
    let mut ok = true;
    for c in cases {
        let Ok(k) = &c.kernel else { continue };
        for t in Target::ALL {
            match crate::compile::compile_kernel(&child, k, t, false) {
                Ok((kernel, r)) => println!(
                    "{:<34} {:<4} {:>6.0}ms {:>10} {:>12} {:>12}  ok",
                    c.name,
                    t.name(),
                    r.compile_time.as_secs_f64() * 1e3,
                    kernel_ir::human_bytes(r.memory.generated_code_bytes.max(0) as u64),
                    kernel_ir::human_bytes(r.memory.peak_bytes.max(0) as u64),
                    kernel_ir::human_bytes(kernel.vmem_budget().total()),
                ),
                Err(e) => {
                    ok = false;
                    println!("{:<34} {:<4} FAILED: {e}", c.name, t.name());
                }
            }
        }
    }
    println!("(`tessera compile presets` compiles every preset the same way)");
    ok
}

/// Prints what a kernel author checks first: grid, blocks, IR, VMEM.
fn show_kernel(name: &str, k: &VerifiedKernel) {
    println!("\n== {name}: built from the #[tpu_kernel] DSL and verified");
    let args: Vec<String> = k
        .arguments()
        .map(|a| format!("{} {}{:?}", a.name, a.dtype, a.shape))
        .collect();
    println!("inputs {}", args.join(", "));
    let grid: Vec<String> = k
        .grid
        .dims
        .iter()
        .map(|d| format!("{} {}", d.bound, d.semantics))
        .collect();
    println!("grid: [{}] = {} steps", grid.join(", "), k.grid.steps());
    for o in &k.operands {
        println!(
            "  {:<3} {:<5} {}{} block {} {}",
            o.role,
            o.name,
            o.dtype,
            kernel_ir::ShapeDisplay(&o.shape),
            kernel_ir::ShapeDisplay(&o.block.shape),
            o.layout
        );
    }
    println!("\n== {name}: IR");
    print!("{}", **k);
    println!("\n== {name}: VMEM budget\n{}", k.vmem_budget());
}

/// Runs the demo.
pub fn demo() -> ExitCode {
    println!("== set-up");
    match lowering::mlir_version_check() {
        Ok(_) => println!("MLIR 22 via melior: ok"),
        Err(e) => println!("MLIR: {e}"),
    }
    match runtime::plugin::locate().and_then(|p| runtime::plugin::PluginInfo::probe(&p)) {
        Ok(i) => println!(
            "PJRT plugin: {} (C API {}.{})",
            i.path.display(),
            i.major,
            i.minor
        ),
        Err(e) => println!("PJRT plugin: {e}"),
    }

    let cases = cases();
    let mut ok = true;
    for (i, c) in cases.iter().enumerate() {
        match &c.kernel {
            Err(e) => {
                println!("\n{}: the kernel does not verify:\n{e}", c.name);
                ok = false;
            }
            Ok(k) if i == 1 => show_kernel(c.name, k),
            Ok(_) => {}
        }
    }

    if let Some(Ok(k)) = cases.get(1).map(|c| &c.kernel) {
        write_lowered(cases[1].name, k);
    }
    ok &= compile_for_tpu(&cases[..3]);

    println!(
        "\n== every CPU path vs the f64 reference (err/tol: worst error over its tolerance, ≤ 1 passes)"
    );
    println!(
        "{:<34} {:<16} {:>10} {:>10} {:>8} {:>4} {:>10} {:>10}  result",
        "kernel", "path", "max abs", "max rel", "err/tol", "NaN", "compile", "run"
    );
    let mut err = std::io::stderr();
    for c in &cases {
        let Ok(k) = &c.kernel else { continue };
        let want = match &c.reference {
            Ok(w) => w.clone(),
            Err(e) => {
                println!("{:<34} reference: {e}", c.name);
                ok = false;
                continue;
            }
        };
        for b in Backend::ALL {
            // Progress: the first compile of a path takes a moment.
            let _ = write!(err, "\r  running {} on {} ...{:20}", c.name, b.name(), "");
            let _ = err.flush();
            let r = run_paths(k, &c.inputs, &[b], &want, &c.tol).remove(0);
            let _ = write!(err, "\r{:80}\r", "");
            ok &= r.passes();
            match &r.result {
                Ok(stats) => {
                    for (i, s) in stats.iter().enumerate() {
                        let label = if stats.len() > 1 {
                            format!(
                                "{} [{}]",
                                c.name,
                                k.outputs().nth(i).map_or("?", |o| o.name.as_str())
                            )
                        } else {
                            c.name.to_string()
                        };
                        println!(
                            "{:<34} {:<16} {:>10.3e} {:>10.3e} {:>8.3} {:>4} {:>8.1}ms {:>8.1}ms  {}",
                            label,
                            r.backend.name(),
                            s.max_abs,
                            s.max_rel,
                            s.worst_ratio,
                            s.nan_count,
                            r.compile.as_secs_f64() * 1e3,
                            r.run.as_secs_f64() * 1e3,
                            if s.passes() { "ok" } else { "MISMATCH" }
                        );
                    }
                }
                Err(e) => println!("{:<34} {:<16} error: {e}", c.name, r.backend.name()),
            }
        }
    }
    println!(
        "\n(interp: the reference interpreter, exact then rounded per op; jit: native code; \
         pjrt-decomposed: plain StableHLO on XLA's CPU plugin; pjrt-ffi: StableHLO calling the \
         native kernel through XLA's FFI. Run times include host<->device copies for PJRT.)"
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
