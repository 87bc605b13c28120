//! Tessera's GPU kernels beside Triton's own tutorial kernels, by what
//! Triton's compiler makes of them (no GPU needed): flash attention
//! forward and backward and the matmul, at the same blocks, warps and
//! stages, for sm_90 (H100/H200) and gfx942 (MI300X). The tutorials'
//! numbers are measured facts in `tests/gpu/tutorial_baseline.json`
//! (the tutorials' code is not in this repository); Tessera's are
//! compiled here. Writes `target/conformance/gpu.md`.
//!
//! Asserted where Tessera matches the tutorial's structure: no more spills
//! than the tutorial (none where it has none; its backward spills on
//! sm_90), a launchable shared-memory size, registers at most 10 % above the
//! tutorial's, tensor-core instructions within 10 %. The rows where the
//! kernels differ in structure are reported, not asserted (the table says
//! why).

use std::fmt::Write;

use kernel_ir::{GpuTarget, Platform, VerifiedKernel};
use kernels::Config;
use lowering::TritonOptions;
use runtime::triton::{GpuStats, check_launchable};

#[derive(Clone)]
struct Row {
    kernel: String,
    target: String,
    causal: bool,
    head_dim: usize,
    blocks: Vec<usize>,
    warps: usize,
    stages: usize,
    registers: u64,
    spill_bytes: u64,
    shared_bytes: u64,
    tensor_core: u64,
}

fn rows(text: &str) -> Vec<Row> {
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let num = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Row {
            kernel: r["kernel"].as_str().unwrap().to_string(),
            target: r["target"].as_str().unwrap().to_string(),
            causal: r["causal"].as_bool().unwrap(),
            head_dim: num(r, "head_dim") as usize,
            blocks: r["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as usize)
                .collect(),
            warps: num(r, "warps") as usize,
            stages: num(r, "stages") as usize,
            registers: num(r, "registers"),
            spill_bytes: num(r, "spill_bytes"),
            shared_bytes: num(r, "shared_bytes"),
            tensor_core: num(r, "tensor_core"),
        })
        .collect()
}

fn build(entry: &str, config: &[(&str, String)], shapes: &[(&str, Vec<usize>)]) -> VerifiedKernel {
    let e = kernels::find(entry).unwrap();
    let pairs: Vec<(String, String)> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let cfg = Config::parse(e, &pairs).unwrap();
    kernel_ir::for_platform(Platform::Gpu, || e.build_with_shapes(&cfg, shapes))
        .unwrap_or_else(|err| panic!("{entry}: {err}"))
}

/// Tessera's kernels for a tutorial row: the one kernel, or for the
/// backward the dk/dv and dq kernels (the tutorial computes both in one).
fn ours(r: &Row) -> Vec<VerifiedKernel> {
    let s = 4096;
    let d = r.head_dim;
    let qkv = |extra: &[&'static str]| {
        let mut v: Vec<(&str, Vec<usize>)> = ["q", "k", "v"]
            .iter()
            .chain(extra)
            .map(|n| (*n, vec![1, 2, s, d]))
            .collect();
        if extra.contains(&"d_o") {
            v.push(("lse", vec![1, 2, s, 1]));
            v.push(("delta", vec![1, 2, s, 1]));
        }
        v
    };
    let attn = |bq: usize, bk: usize| {
        vec![
            ("dtype", "bf16".to_string()),
            ("causal", r.causal.to_string()),
            ("block_q", bq.to_string()),
            ("block_k", bk.to_string()),
        ]
    };
    match r.kernel.as_str() {
        "attention_fwd" => vec![build(
            "flash_attention",
            &attn(r.blocks[0], r.blocks[1]),
            &qkv(&[]),
        )],
        "attention_bwd" => vec![
            build(
                "flash_attention_dkv",
                &attn(r.blocks[0], r.blocks[1]),
                &qkv(&["d_o"]),
            ),
            build(
                "flash_attention_dq",
                &attn(r.blocks[2], r.blocks[3]),
                &qkv(&["d_o"]),
            ),
        ],
        "matmul" => {
            let n = 4096;
            let cfg = [
                ("dtype", "bf16".to_string()),
                ("out_dtype", "bf16".to_string()),
                ("bm", r.blocks[0].to_string()),
                ("bn", r.blocks[1].to_string()),
                ("bk", r.blocks[2].to_string()),
            ];
            vec![build(
                "matmul",
                &cfg,
                &[("x", vec![n, n]), ("y", vec![n, n])],
            )]
        }
        other => panic!("no Tessera kernel for `{other}`"),
    }
}

/// Whether Tessera's kernel has the tutorial's structure at this row (the
/// ratios are asserted), or why not.
fn asserted(r: &Row) -> Result<(), &'static str> {
    match (r.kernel.as_str(), r.target.as_str(), r.causal) {
        ("attention_bwd", "gfx942", _) => Err(
            "both run each loop in two pieces (the diagonal masked, the rest not), but the tutorial's diagonal pieces take half-height blocks (MASK_BLOCK_M1 = BLOCK_M1 / 2), products of other shapes",
        ),
        ("attention_fwd", "gfx942", true) => Err(
            "both run the causal loop in two pieces (left of the diagonal unmasked, the diagonal masked), but the tutorial's diagonal loop has a trip count the compiler knows (BLOCK_M / BLOCK_N = 2) and unrolls, three copies of the products against Tessera's two; registers 1.11",
        ),
        _ => Ok(()),
    }
}

/// The statistics of a row: the worst registers, spills and shared memory
/// of Tessera's kernels, the sum of their tensor-core instructions.
fn compile(r: &Row, target: GpuTarget) -> GpuStats {
    let mut total: Option<GpuStats> = None;
    for k in ours(r) {
        let options = TritonOptions {
            num_warps: r.warps,
            num_stages: r.stages,
        };
        let program = lowering::triton_with(&k, options, Some(target)).unwrap();
        let c = runtime::triton::compile(&program, &[target], None).unwrap();
        let s = c[0]
            .result
            .clone()
            .unwrap_or_else(|e| panic!("{}: {e}", k.name));
        total = Some(match total {
            None => s,
            Some(mut t) => {
                t.registers = t.registers.max(s.registers);
                t.spill_bytes = t.spill_bytes.max(s.spill_bytes);
                t.shared_bytes = t.shared_bytes.max(s.shared_bytes);
                for (kind, n) in s.tensor_core {
                    *t.tensor_core.entry(kind).or_default() += n;
                }
                t
            }
        });
    }
    total.unwrap()
}

#[test]
fn gpu_kernels_beside_tritons_tutorials() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/gpu/tutorial_baseline.json"
    ))
    .unwrap();
    let baseline = rows(&text);
    let mut md = String::from(
        "# Tessera's GPU kernels beside Triton's tutorials (compile-only, Triton 3.9.0)\n\n\
         Registers per thread, bytes spilled, shared memory and tensor-core instructions in the final code, \
         Tessera's kernel (bf16) over the tutorial's (fp16: the same MMA shapes) at the same blocks, warps and stages. \
         The backward is Tessera's dk/dv and dq kernels (worst registers, summed tensor-core instructions) \
         against the tutorial's one kernel. Baseline: `tests/gpu/tutorial_baseline.json`.\n\n\
         | kernel | target | causal | d | blocks | warps/stages | registers (ratio) | spills | shared KiB | tensor-core instr. (ratio) | asserted |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut failures = Vec::new();
    for r in &baseline {
        let target: GpuTarget = r.target.parse().unwrap();
        let s = compile(r, target);
        let regs = s.registers as f64 / r.registers as f64;
        let tc = s.tensor_core_total() as f64 / r.tensor_core.max(1) as f64;
        let check = asserted(r);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:?} | {}/{} | {} / {} ({regs:.2}) | {} / {} | {} / {} | {} / {} ({tc:.2}) | {} |",
            r.kernel,
            r.target,
            r.causal,
            r.head_dim,
            r.blocks,
            r.warps,
            r.stages,
            s.registers,
            r.registers,
            s.spill_bytes,
            r.spill_bytes,
            s.shared_bytes.div_ceil(1024),
            r.shared_bytes.div_ceil(1024),
            s.tensor_core_total(),
            r.tensor_core,
            match check {
                Ok(()) => "yes".to_string(),
                Err(why) => format!("no: {why}"),
            }
        );
        if check.is_ok() {
            let name = format!("{} {} causal={}", r.kernel, r.target, r.causal);
            if s.spill_bytes > r.spill_bytes {
                failures.push(format!(
                    "{name}: spills {} bytes (the tutorial {})",
                    s.spill_bytes, r.spill_bytes
                ));
            }
            if let Err(e) = check_launchable(target, &s) {
                failures.push(format!("{name}: {e}"));
            }
            if regs > 1.10 {
                failures.push(format!(
                    "{name}: registers {} against the tutorial's {} ({regs:.2})",
                    s.registers, r.registers
                ));
            }
            if !(0.9..=1.1).contains(&tc) {
                failures.push(format!(
                    "{name}: tensor-core instructions {} against {} ({tc:.2})",
                    s.tensor_core_total(),
                    r.tensor_core
                ));
            }
        }
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/conformance");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(format!("{dir}/gpu.md"), &md).unwrap();
    println!("{md}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The catalog kernels and presets that a GPU target refuses, by the
/// `[gpu]` rule each breaks (anything else refused is a failure).
const REFUSED: &[(&str, &str)] = &[(
    "flash_attention_dqkv_gqa_window",
    "its whole-sequence dq scratch is loaded as one f32[2, 200, 64] tile (200 query rows)",
)];

/// Every catalog kernel (at its defaults) lowers to its Triton program
/// and compiles with Triton, or is refused by a `[gpu]` rule
/// ([`REFUSED`]), and can launch (shared memory within the target's).
/// CI samples: each catalog kernel for one target, the five taken in
/// turn (about 80 s of compiles on 2 cores); the long-run mode
/// `TESSERA_GPU_MATRIX=full` compiles every kernel and every preset for
/// all five targets (about 25 minutes).
#[test]
fn every_kernel_and_preset_compiles_for_gpus() {
    let full = std::env::var("TESSERA_GPU_MATRIX").as_deref() == Ok("full");
    let gpu =
        |f: &dyn Fn() -> Result<VerifiedKernel, String>| kernel_ir::for_platform(Platform::Gpu, f);
    let mut named: Vec<(String, Result<VerifiedKernel, String>)> = Vec::new();
    for e in kernels::ENTRIES {
        let k = gpu(&|| {
            let cfg = Config::parse(e, &[]).map_err(|x| x.to_string())?;
            e.build_at_default_shapes(&cfg).map_err(|x| x.to_string())
        });
        named.push((e.name.to_string(), k));
    }
    if full {
        for p in kernels::presets() {
            named.push((
                p.name().to_string(),
                gpu(&|| p.build().map_err(|x| x.to_string())),
            ));
        }
    }
    let mut refused = Vec::new();
    let mut programs = Vec::new();
    let mut pairs = 0;
    for (i, (name, k)) in named.iter().enumerate() {
        let targets: Vec<GpuTarget> = if full {
            GpuTarget::ALL.to_vec()
        } else {
            vec![GpuTarget::ALL[i % GpuTarget::ALL.len()]]
        };
        pairs += targets.len();
        let k = match k {
            Ok(k) => k,
            Err(e) => {
                for t in targets {
                    refused.push((name.clone(), t, e.clone()));
                }
                continue;
            }
        };
        let mut ok = Vec::new();
        for t in targets {
            match k.check_gpu(Some(t)) {
                Ok(()) => ok.push(t),
                Err(e) => refused.push((name.clone(), t, e.to_string())),
            }
        }
        if !ok.is_empty() {
            let program = lowering::triton(k).unwrap_or_else(|e| panic!("{name}: {e}"));
            programs.push((name.clone(), program, ok));
        }
    }
    let jobs: Vec<runtime::triton::CompileJob<'_>> = programs
        .iter()
        .map(|(_, p, t)| runtime::triton::CompileJob {
            program: p,
            targets: t,
            keep: None,
            fit: true,
        })
        .collect();
    let results = runtime::triton::compile_many(&jobs).unwrap();
    let mut failures = Vec::new();
    let mut compiled = 0;
    for ((name, _, _), compiles) in programs.iter().zip(&results) {
        for c in compiles {
            let launchable = c
                .result
                .as_ref()
                .map_err(ToString::to_string)
                .and_then(|s| check_launchable(c.target, s).map_err(|e| e.to_string()));
            match launchable {
                Ok(()) => compiled += 1,
                Err(e) => failures.push(format!("{name} on {}: {e}", c.target)),
            }
        }
    }
    println!(
        "compiled {compiled} of {pairs} kernel-target pairs; refused: {:?}",
        refused.iter().map(|(n, t, _)| (n, t)).collect::<Vec<_>>()
    );
    for (name, target, why) in &refused {
        // sm_80's Triton has no f8e4m3fn: an fp8 kernel is refused there.
        let no_e4m3 = *target == GpuTarget::Sm80 && why.contains("f8e4m3fn");
        if !no_e4m3 && !REFUSED.iter().any(|(n, _)| n == name) {
            failures.push(format!("{name} refused on {target}: {why}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        compiled + refused.len(),
        pairs,
        "every pair compiled or refused"
    );
    assert!(compiled * 10 >= pairs * 9, "{compiled} of {pairs} compiled");
}
