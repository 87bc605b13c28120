//! `tessera demo`: the main job. Builds flash attention from the
//! `#[tpu_kernel]` DSL, verifies it, shows its grid, tiling, IR and VMEM
//! budget, writes it lowered to every target, compiles it with the TPU
//! compiler (libtpu, compile-only) for every generation, runs it and the
//! foundation kernels on every CPU path on random inputs, and compares each
//! with its f64 reference, with timings.

use std::io::Write;
use std::process::ExitCode;

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};
use kernels::attention::{AttnConfig, flash_attention};
use kernels::check::Tolerance;
use kernels::foundation::*;
use kernels::paths::run_paths;
use kernels::reference;
use runtime::backend::Backend;

/// One demo case: a kernel, its inputs and its reference output.
struct Case {
    name: &'static str,
    kernel: Result<VerifiedKernel, KernelErrors>,
    inputs: Vec<Array>,
    reference: fn(&[Array]) -> Vec<Vec<f64>>,
    tol: Vec<Tolerance>,
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
            |a| {
                let (o, lse) = reference::attention_full(
                    &a[0],
                    &a[1],
                    &a[2],
                    &reference::AttnSpec::new(true, 0.125),
                );
                vec![o, lse]
            }
        } else {
            |a| {
                let (o, lse) = reference::attention_full(
                    &a[0],
                    &a[1],
                    &a[2],
                    &reference::AttnSpec::new(false, 0.125),
                );
                vec![o, lse]
            }
        },
        tol: vec![Tolerance::attention(dtype), Tolerance::logsumexp(dtype)],
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
            reference: |a| vec![reference::add(&a[0], &a[1])],
            tol: vec![Tolerance::for_dtype(F32)],
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
            reference: |a| vec![reference::matmul(&a[0], &a[1])],
            tol: vec![Tolerance::matmul(512, F32)],
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
            reference: |a| vec![reference::softmax_rows(&a[0])],
            tol: vec![Tolerance::for_dtype(F32)],
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
            reference: |a| vec![reference::layer_norm(&a[0], &a[1], &a[2], 1e-5)],
            tol: vec![Tolerance {
                abs: 1e-4,
                rel: 1e-4,
            }],
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

/// Compiles the attention kernels with libtpu for every generation and
/// prints what the compiler reports; false if any fails (or libtpu is
/// missing).
fn compile_for_tpu(cases: &[Case]) -> bool {
    println!(
        "\n== flash attention compiled by the TPU compiler (libtpu, compile-only; nothing runs)"
    );
    let tpu = match runtime::tpu::TpuCompiler::load() {
        Ok(t) => t,
        Err(e) => {
            println!("{e}");
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
            match tpu.compile_kernel(k, t) {
                Ok(r) => println!(
                    "{:<34} {:<4} {:>6.0}ms {:>10} {:>12} {:>12}  ok",
                    c.name,
                    t.name(),
                    r.compiled.compile_time.as_secs_f64() * 1e3,
                    kernel_ir::human_bytes(r.compiled.code_bytes.max(0) as u64),
                    kernel_ir::human_bytes(r.compiled.memory.peak_bytes.max(0) as u64),
                    kernel_ir::human_bytes(r.kernel.vmem_budget().total()),
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
        let want = (c.reference)(&c.inputs);
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
