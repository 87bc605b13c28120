//! The `tessera` command. `tessera demo`, the main job: build flash
//! attention from the `#[tpu_kernel]` DSL, verify it, show its grid, tiling,
//! IR and VMEM budget, write it lowered to every target, run it and the
//! foundation kernels on every CPU path on random inputs and compare each
//! with its f64 reference, with timings.

use std::process::ExitCode;

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};
use kernels::attention::{AttnConfig, flash_attention};
use kernels::check::Tolerance;
use kernels::foundation::*;
use kernels::paths::run_paths;
use kernels::reference;
use runtime::backend::Backend;

const HELP: &str = "\
tessera: write, check and run TPU-style kernels in Rust

USAGE:
    tessera demo      build flash attention from the DSL, show its tiling, IR
                      and VMEM budget, write it lowered to every target, run it
                      and the other example kernels on every CPU path
                      (interpreter, native JIT, PJRT decomposed, PJRT FFI call)
                      and compare each with its f64 reference
    tessera list      the example kernels
    tessera lower KERNEL --target kernel|mosaic|mosaic-body|decomposed [--out FILE]
                      print (or write) a kernel lowered to a target:
                        kernel       the kernel module in upstream MLIR dialects
                        mosaic       StableHLO calling it via tpu_custom_call
                        mosaic-body  the Mosaic kernel module inside that call
                        decomposed   plain StableHLO, runnable on any PJRT back end
    tessera --help    this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") if args.len() == 1 => demo(),
        Some("list") if args.len() == 1 => {
            for e in kernels::examples::examples() {
                println!("{:<30} {}", e.name, e.about);
            }
            ExitCode::SUCCESS
        }
        Some("lower") => match lower(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!("tessera lower: {msg}");
                ExitCode::from(2)
            }
        },
        Some("--help" | "-h" | "help") => {
            print!("{HELP}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "tessera: unknown invocation `{}`; see `tessera --help`",
                args.join(" ")
            );
            ExitCode::from(2)
        }
    }
}

/// `tessera lower KERNEL --target T [--out FILE]`.
fn lower(args: &[String]) -> Result<(), String> {
    let mut name = None;
    let mut target = None;
    let mut out = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--target" => target = Some(it.next().ok_or("--target needs a value")?.clone()),
            "--out" => out = Some(it.next().ok_or("--out needs a file")?.clone()),
            s if s.starts_with("--") => {
                return Err(format!("unknown option `{s}`; see `tessera --help`"));
            }
            s if name.is_none() => name = Some(s.to_string()),
            s => return Err(format!("unexpected argument `{s}`")),
        }
    }
    let name = name.ok_or("name a kernel; `tessera list` shows them")?;
    let example = kernels::examples::example(&name)
        .ok_or_else(|| format!("unknown kernel `{name}`; `tessera list` shows them"))?;
    let kernel = (example.build)().map_err(|e| e.to_string())?;
    let text = match target.as_deref() {
        Some("kernel") => lowering::kernel_module(&kernel),
        Some("mosaic") => lowering::tpu_custom_call(&kernel).map(|c| c.module),
        Some("mosaic-body") => lowering::tpu_custom_call(&kernel).map(|c| c.body),
        Some("decomposed") => lowering::decomposed(&kernel),
        Some(t) => {
            return Err(format!(
                "unknown target `{t}`; use kernel, mosaic, mosaic-body or decomposed"
            ));
        }
        None => return Err("give a --target: kernel, mosaic, mosaic-body or decomposed".into()),
    }
    .map_err(|e| e.to_string())?;
    match out {
        Some(path) => std::fs::write(&path, text).map_err(|e| format!("cannot write {path}: {e}")),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// One demo case: a kernel, its inputs and its reference output.
struct Case {
    name: &'static str,
    kernel: Result<VerifiedKernel, KernelErrors>,
    inputs: Vec<Array>,
    reference: fn(&[Array]) -> Vec<f64>,
    tol: Tolerance,
}

/// The attention shapes of the demo.
const ATTN: kernels::attention::flash_attention::Dims = kernels::attention::flash_attention::Dims {
    b: 1,
    h: 2,
    sq: 256,
    skv: 256,
    d: 64,
    hkv: 2,
};

fn attn_config(causal: bool) -> AttnConfig {
    AttnConfig {
        causal,
        sm_scale: 0.125,
        block_q: 64,
        block_k: 128,
        window: None,
        softcap: None,
    }
}

fn attention_case(name: &'static str, causal: bool, dtype: DType, seed: u64) -> Case {
    let shape = [ATTN.b, ATTN.h, ATTN.sq, ATTN.d];
    let r = |s| Array::random(dtype, shape, s, -1.0, 1.0);
    Case {
        name,
        kernel: flash_attention(&attn_config(causal), dtype, ATTN),
        inputs: vec![r(seed), r(seed + 1), r(seed + 2)],
        reference: if causal {
            |a| reference::attention(&a[0], &a[1], &a[2], true, 0.125)
        } else {
            |a| reference::attention(&a[0], &a[1], &a[2], false, 0.125)
        },
        tol: match dtype {
            DType::F32 => Tolerance {
                abs: 2e-5,
                rel: 1e-4,
            },
            d => Tolerance::for_dtype(d),
        },
    }
}

fn cases() -> Vec<Case> {
    let x = |shape: &[usize], seed| Array::random(F32, shape.to_vec(), seed, -2.0, 2.0);
    vec![
        attention_case("flash attention f32", false, F32, 20),
        attention_case("flash attention f32 causal", true, F32, 30),
        attention_case("flash attention bf16 causal", true, BF16, 40),
        Case {
            name: "add 512x1024 (blocks 64x512)",
            kernel: add(&AddConfig {
                rows: 512,
                cols: 1024,
                block_rows: 64,
                block_cols: 512,
                dtype: F32,
            }),
            inputs: vec![x(&[512, 1024], 1), x(&[512, 1024], 2)],
            reference: |a| reference::add(&a[0], &a[1]),
            tol: Tolerance::for_dtype(F32),
        },
        Case {
            name: "matmul 256x256x512 bf16 -> f32",
            kernel: matmul(&MatmulConfig {
                m: 256,
                n: 256,
                k: 512,
                bm: 128,
                bn: 128,
                bk: 128,
                dtype: BF16,
                out_dtype: F32,
            }),
            inputs: vec![x(&[256, 512], 3).cast(BF16), x(&[512, 256], 4).cast(BF16)],
            reference: |a| reference::matmul(&a[0], &a[1]),
            tol: Tolerance {
                abs: 1e-3,
                rel: 1e-5,
            },
        },
        Case {
            name: "softmax 256x1024 (rows of 32)",
            kernel: softmax(&SoftmaxConfig {
                rows: 256,
                cols: 1024,
                block_rows: 32,
                dtype: F32,
            }),
            inputs: vec![x(&[256, 1024], 5)],
            reference: |a| reference::softmax_rows(&a[0]),
            tol: Tolerance::for_dtype(F32),
        },
        Case {
            name: "layer_norm 256x1024 (rows of 16)",
            kernel: layer_norm(&LayerNormConfig {
                rows: 256,
                cols: 1024,
                block_rows: 16,
                eps: 1e-5,
                dtype: F32,
            }),
            inputs: vec![
                x(&[256, 1024], 6),
                Array::random(F32, [1024], 7, 0.5, 1.5),
                Array::random(F32, [1024], 8, -0.5, 0.5),
            ],
            reference: |a| reference::layer_norm(&a[0], &a[1], &a[2], 1e-5),
            tol: Tolerance {
                abs: 1e-4,
                rel: 1e-4,
            },
        },
    ]
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

/// Prints what a kernel author checks first: grid, blocks, IR, VMEM.
fn show_kernel(name: &str, k: &VerifiedKernel) {
    println!("\n== {name}: built from the #[tpu_kernel] DSL and verified");
    println!(
        "shapes b={} h={} sq={} skv={} d={}; config {:?}",
        ATTN.b,
        ATTN.h,
        ATTN.sq,
        ATTN.skv,
        ATTN.d,
        attn_config(true)
    );
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

fn demo() -> ExitCode {
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

    println!(
        "\n== every CPU path vs the f64 reference (err/tol: worst error over its tolerance, ≤ 1 passes)"
    );
    println!(
        "{:<32} {:<16} {:>10} {:>10} {:>8} {:>4} {:>10} {:>10}  result",
        "kernel", "path", "max abs", "max rel", "err/tol", "NaN", "compile", "run"
    );
    for c in &cases {
        let Ok(k) = &c.kernel else { continue };
        let want = (c.reference)(&c.inputs);
        let reports = run_paths(k, &c.inputs, &Backend::ALL, &[want], &[c.tol]);
        for r in reports {
            ok &= r.passes();
            match &r.result {
                Ok(stats) => {
                    let s = &stats[0];
                    println!(
                        "{:<32} {:<16} {:>10.3e} {:>10.3e} {:>8.3} {:>4} {:>8.1}ms {:>8.1}ms  {}",
                        c.name,
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
                Err(e) => println!("{:<32} {:<16} error: {e}", c.name, r.backend.name()),
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
