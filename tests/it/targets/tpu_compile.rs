//! The TPU compiler (libtpu, compile-only) as the authority on the TPU
//! lowering: every library kernel and preset compiles for every generation,
//! a Mosaic error names the kernel author's line, and Tessera's VMEM budget
//! agrees with the compiler's (random kernels: `tpu_fuzz.rs`).
//!
//! libtpu comes from `.ci/setup.sh`; without it these tests fail with a
//! message naming the fix (they are never skipped).

use std::sync::Arc;

use kernel_ir::Target;
use libtpu::{TpuCompiler, TpuError};

pub(crate) fn tpu() -> Arc<TpuCompiler> {
    TpuCompiler::load().unwrap_or_else(|e| panic!("the TPU compile check needs libtpu: {e}"))
}

/// A kernel over `shape` in blocks of `block` (one grid step per block)
/// with inputs `x`, `y` of `dtype` and an output `o` of `out`; `body`
/// writes it.
fn one_op(
    dtype: kernel_ir::DType,
    out: kernel_ir::DType,
    shape: &[usize],
    block: &[usize],
    body: impl FnOnce(kernel_ir::Ref, kernel_ir::Ref, kernel_ir::Ref),
) -> kernel_ir::Kernel {
    use kernel_ir::IndexExpr;
    use kernel_ir::prelude::*;
    let mut k = KernelBuilder::new("rule");
    let grid: Vec<(usize, kernel_ir::DimSemantics)> = shape
        .iter()
        .zip(block)
        .map(|(a, b)| (a.div_ceil(*b), Parallel))
        .collect();
    k.grid_dims(&grid);
    let map: Vec<IndexExpr> = (0..shape.len()).map(IndexExpr::Grid).collect();
    let x = k
        .input("x", dtype, shape.to_vec())
        .block_exprs(block.to_vec(), map.clone());
    let y = k
        .input("y", dtype, shape.to_vec())
        .block_exprs(block.to_vec(), map.clone());
    let o = k
        .output("o", out, shape.to_vec())
        .block_exprs(block.to_vec(), map);
    body(x, y, o);
    k.finish().unwrap()
}

/// Each rule of the verifier's `mosaic` pass: a kernel that breaks it gets
/// that rule's error at the line of the offending op, and libtpu (with the
/// rule skipped) rejects the same kernel on every generation, so the rule is
/// needed.
#[test]
fn every_tpu_rule_is_spanned_and_libtpu_agrees_it_is_needed() {
    use kernel_ir::prelude::*;
    use kernel_ir::{ErrorKind, Kernel};
    let tpu = tpu();
    let sq = [64usize, 128];
    let bl = [32usize, 128];
    let mut cases: Vec<(&str, u32, Kernel)> = Vec::new();
    macro_rules! case {
        ($rule:expr, $k:expr) => {{
            let line = line!();
            cases.push(($rule, line, $k));
        }};
    }
    case!(
        "f16",
        one_op(F16, F16, &sq, &bl, |x, _, o| o.store(.., x.load(..)))
    );
    case!(
        "i8-arith",
        one_op(I8, I8, &sq, &bl, |x, y, o| o
            .store(.., x.load(..) + y.load(..)))
    );
    case!(
        "fp8-arith",
        one_op(F8E4M3FN, F8E4M3FN, &sq, &bl, |x, y, o| o
            .store(.., x.load(..) + y.load(..)))
    );
    case!(
        "fp8-arith",
        one_op(F8E5M2, F8E5M2, &sq, &bl, |x, _, o| o
            .store(.., x.load(..).max_keep(1).broadcast_to(bl)))
    );
    case!(
        "masked-store",
        one_op(BF16, BF16, &sq, &bl, |x, _, o| o.store_masked(
            ..,
            x.load(..),
            iota(I32, bl, 1).lt(9)
        ))
    );
    case!(
        "bf16-rem",
        one_op(BF16, BF16, &sq, &bl, |x, y, o| o
            .store(.., x.load(..) % y.load(..)))
    );
    case!(
        "dot-operands",
        one_op(I32, I32, &[128, 128], &[128, 128], |x, y, o| o.store(
            ..,
            dot_general(x.load(..), y.load(..), DotDims::matmul(), I32)
        ))
    );
    case!(
        "dot-acc",
        one_op(BF16, BF16, &[128, 128], &[128, 128], |x, y, o| o.store(
            ..,
            dot_general(x.load(..), y.load(..), DotDims::matmul(), BF16)
        ))
    );
    {
        let mut k = KernelBuilder::new("rule");
        k.grid([2], [Parallel]);
        let t = k.scalar_prefetch("t", [8]);
        let x = k.input("x", I32, [64, 128]).block([32, 128], |[i]| (i, 0));
        let o = k.output("o", I32, [64, 128]).block([32, 128], |[i]| (i, 0));
        let (line, v) = (line!(), t.load([ds(0, 1)]));
        o.store(.., x.load(..) + v.sum_all().broadcast_to([32, 128]));
        cases.push(("smem-vector", line, k.finish().unwrap()));
    }
    case!(
        "bool-carry",
        one_op(Bool, Bool, &sq, &bl, |x, y, o| o.store(
            ..,
            for_range(0, 3, (x.load(..), y.load(..)), |_, (a, b)| (b, a)).0
        ))
    );
    case!(
        "rank1-select",
        one_op(BF16, BF16, &[1024], &[512], |x, y, o| o.store(
            ..,
            iota(I32, [512], 0).lt(7).select(x.load(..), y.load(..))
        ))
    );
    case!(
        "dot-k1",
        one_op(F32, F32, &[2, 16, 1], &[1, 16, 1], |x, y, o| {
            let nt = DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![2],
            };
            let nn = DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            };
            let (x, y) = (x.load(..), y.load(..));
            let a = x * y;
            o.store(.., dot_general(dot_general(a, y, nt, F32), a, nn, F32) + y)
        })
    );
    case!(
        "rank1-carry",
        one_op(F32, F32, &[1024], &[512], |x, y, o| o.store(
            ..,
            for_range(
                0,
                3,
                (x.load_masked(.., iota(I32, [512], 0).lt(100)), y.load(..)),
                |_, (a, b)| (b, a)
            )
            .0
        ))
    );
    for (rule, line, kernel) in cases {
        // rustfmt may break a case over a few lines; the op is among them.
        let lines = line..line + 20;
        // A rule of some generations only is checked on those.
        let targets: Vec<Target> = if rule == "dot-k1" {
            vec![Target::V6e, Target::V7x]
        } else {
            Target::ALL.to_vec()
        };
        let mut kernel = kernel;
        kernel.target = targets[0];
        let e = kernel.clone().verify().expect_err(rule);
        // Reported, at the line of the op that breaks it.
        let hit = e
            .0
            .iter()
            .filter(|e| matches!(&e.kind, ErrorKind::TpuUnsupported { rule: r, .. } if *r == rule))
            .find(|e| {
                e.loc
                    .as_ref()
                    .is_some_and(|l| l.file.ends_with("tpu_compile.rs") && lines.contains(&l.line))
            })
            .unwrap_or_else(|| panic!("{rule}: not reported at line {line}: {e}"));
        assert!(hit.to_string().contains(&format!("[tpu-{rule}]")), "{hit}");
        let unchecked = kernel
            .verify_without_mosaic_rules()
            .unwrap_or_else(|e| panic!("{rule}: {e}"));
        for target in targets {
            let mut k = unchecked.kernel().clone();
            k.target = target;
            let k = k.verify_without_mosaic_rules().unwrap();
            let module = lowering::tpu_custom_call(&k).unwrap().module;
            let r = tpu.compile(target, &module);
            assert!(
                matches!(r, Err(TpuError::Compile { .. })),
                "{rule} on {target}: libtpu accepts what the rule rejects"
            );
        }
    }
}

/// The smallest scoped VMEM limit (in bytes, to 4 KiB) at which libtpu
/// compiles `module`, whose backend config asks for `asked` bytes: found by
/// rewriting the limit in the module and bisecting. `None` if even
/// `hi` bytes fail.
fn libtpu_vmem_need(
    tpu: &TpuCompiler,
    target: Target,
    module: &str,
    asked: u64,
    hi: u64,
) -> Option<u64> {
    let needle = format!("\\22size\\22: {asked}");
    assert!(module.contains(&needle), "the module states its limit");
    let ok = |limit: u64| {
        let m = module.replace(&needle, &format!("\\22size\\22: {limit}"));
        match tpu.compile(target, &m) {
            Ok(_) => true,
            Err(TpuError::Compile { .. }) => false,
            Err(e) => panic!("{e}"),
        }
    };
    if !ok(hi) {
        return None;
    }
    let (mut lo, mut hi) = (0u64, hi);
    while hi - lo > 4096 {
        let mid = (lo + hi) / 2 / 4096 * 4096;
        if ok(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Tessera's VMEM budget is what libtpu needs, or more: a kernel just
/// under its scoped limit compiles, and the limit libtpu needs (found by
/// bisection) is never above Tessera's budget. Prints the slack.
#[test]
fn tessera_vmem_budget_covers_what_libtpu_allocates() {
    use kernel_ir::prelude::*;
    let tpu = tpu();
    // (name, kernel): copies, a matmul with an accumulator, flash attention.
    let copy = |dtype: DType, rows: usize, cols: usize, br: usize, limit: u64| {
        let mut k = KernelBuilder::new("copy");
        k.grid([rows / br], [Parallel]);
        k.vmem_limit(limit);
        let x = k
            .input("x", dtype, [rows, cols])
            .block([br, cols], |[i]| (i, 0));
        let o = k
            .output("o", dtype, [rows, cols])
            .block([br, cols], |[i]| (i, 0));
        o.store(.., x.load(..) * 2.0);
        k.build()
    };
    let mut kernels = Vec::new();
    for (dtype, br) in [(F32, 512), (BF16, 1024), (F32, 1024)] {
        let k = copy(dtype, 4096, 1024, br, 64 << 20).unwrap();
        kernels.push((format!("copy {dtype} [{br}, 1024]"), k));
    }
    let mm = kernels::foundation::matmul(&kernels::foundation::MatmulConfig {
        m: 1024,
        n: 1024,
        k: 1024,
        bm: 512,
        bn: 512,
        bk: 512,
        dtype: BF16,
        out_dtype: F32,
    })
    .unwrap();
    kernels.push(("matmul bf16 512^3 blocks".into(), mm));
    let preset = kernels::preset("flash_attention_f32").unwrap();
    kernels.push(("flash_attention_f32".into(), preset.build().unwrap()));
    let mut report = Vec::new();
    for (name, kernel) in kernels {
        for target in [Target::V5e, Target::V7x] {
            let mut k = kernel.kernel().clone();
            k.target = target;
            let budget = kernel_ir::VmemBudget::of(&k).total();
            // Just under: a limit of exactly the budget verifies and compiles.
            k.vmem_limit = Some(budget.div_ceil(4096) * 4096);
            let v = k.clone().verify().unwrap_or_else(|e| panic!("{name}: {e}"));
            let c = lowering::tpu_custom_call(&v).unwrap();
            tpu.compile(target, &c.module)
                .unwrap_or_else(|e| panic!("{name} on {target}: Tessera accepts a {budget}-byte budget at that limit, libtpu does not: {e}"));
            // Just over: one tile more than the limit is Tessera's error.
            let mut over = k.clone();
            over.vmem_limit = Some(budget - 4096);
            assert!(over.verify().is_err(), "{name}: over the limit verifies");
            // What libtpu needs, at most the budget.
            let need = libtpu_vmem_need(&tpu, target, &c.module, c.vmem_limit, c.vmem_limit)
                .expect("compiles at the budget");
            assert!(
                need <= budget.div_ceil(4096) * 4096,
                "{name} on {target}: libtpu needs {need} > budget {budget}"
            );
            report.push(format!(
                "{name} on {target}: Tessera budget {budget} B, libtpu needs {need} B (slack {:.1}%)",
                100.0 * (budget as f64 - need as f64) / budget as f64
            ));
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// Every catalog kernel at its defaults compiles with libtpu for every
/// generation; each preset and each catalog kernel's other variants (bf16,
/// and the attention options on: causal, window, soft-cap, masks) compile
/// for one generation each, taken in turn (a variant changes the body or
/// the shapes, not the generation's rules, which the defaults meet on all
/// four; each generation's VMEM is the verifier's budget, held to libtpu's
/// by `tessera_vmem_budget_covers_what_libtpu_allocates`).
/// `TESSERA_TPU_VARIANTS=all` compiles every one for every generation.
#[test]
fn every_library_kernel_and_preset_compiles_for_every_generation() {
    use kernels::{Config, ENTRIES, presets};
    let all = std::env::var("TESSERA_TPU_VARIANTS").as_deref() == Ok("all");
    let mut variant = 0;
    let mut in_turn = || {
        variant += 1;
        if all {
            Target::ALL.to_vec()
        } else {
            vec![Target::ALL[variant % Target::ALL.len()]]
        }
    };
    let mut kernels: Vec<(String, kernel_ir::VerifiedKernel, Vec<Target>)> = Vec::new();
    for p in presets() {
        kernels.push((
            p.name().to_string(),
            p.build().unwrap_or_else(|e| panic!("{}: {e}", p.name())),
            in_turn(),
        ));
    }
    for e in ENTRIES {
        let has = |p: &str| e.params.iter().any(|q| q.name == p);
        let dtypes: &[&str] = if has("dtype") {
            &["f32", "bf16"]
        } else {
            &["default"]
        };
        for &dtype in dtypes {
            let mut variants: Vec<Vec<(String, String)>> = vec![vec![]];
            if has("causal") {
                variants.push(vec![("causal".into(), "true".into())]);
            }
            if has("window") {
                let mut v = vec![
                    ("window".into(), "64".into()),
                    ("softcap".into(), "30".into()),
                ];
                if has("causal") {
                    v.push(("causal".into(), "true".into()));
                }
                variants.push(v);
            }
            if has("mask") {
                variants.push(vec![
                    (
                        "mask".into(),
                        "prefix:32|local:15:15;chunked:100&causal".into(),
                    ),
                    ("softcap".into(), "30".into()),
                ]);
            }
            for mut pairs in variants {
                // The defaults: no option on, f32 where the dtype is a
                // parameter.
                let defaults = pairs.is_empty() && dtype != "bf16";
                if has("dtype") {
                    pairs.push(("dtype".into(), dtype.into()));
                }
                if dtype == "bf16" && has("block_rows") {
                    pairs.push(("block_rows".into(), "16".into()));
                }
                let cfg = Config::parse(e, &pairs).unwrap_or_else(|m| panic!("{}: {m}", e.name));
                let k = e
                    .build_at_default_shapes(&cfg)
                    .unwrap_or_else(|m| panic!("{} {pairs:?}: {m}", e.name));
                let targets = if defaults {
                    Target::ALL.to_vec()
                } else {
                    in_turn()
                };
                kernels.push((format!("{} {pairs:?}", e.name), k, targets));
            }
        }
    }
    let failures: Vec<String> = kernels
        .iter()
        .filter_map(|(name, k, targets)| {
            tessera_testing::compile_for_tpu(k, targets)
                .err()
                .map(|e| format!("{name}: {e}"))
        })
        .collect();
    let compiles: usize = kernels.iter().map(|(_, _, t)| t.len()).sum();
    eprintln!("{} kernels, {compiles} compiles", kernels.len());
    assert!(kernels.len() > 100, "{} kernels", kernels.len());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A Mosaic error names the kernel author's line: a kernel the verifier's
/// TPU rules would stop (an i8 add) is compiled with those rules skipped,
/// and libtpu's error comes back located at the Rust line of the add.
#[test]
fn a_mosaic_error_names_the_rust_line_of_the_offending_op() {
    use kernel_ir::prelude::*;
    let tpu = tpu();
    let mut k = KernelBuilder::new("bad");
    k.grid([2], [Parallel]);
    let x = k.input("x", I8, [64, 128]).block([32, 128], |[i]| (i, 0));
    let y = k.input("y", I8, [64, 128]).block([32, 128], |[i]| (i, 0));
    let o = k.output("o", I8, [64, 128]).block([32, 128], |[i]| (i, 0));
    let (a, b) = (x.load(..), y.load(..));
    let line = line!();
    let sum = a + b;
    o.store(.., sum);
    let kernel = k.finish().unwrap().verify_without_mosaic_rules().unwrap();
    let module = lowering::tpu_custom_call(&kernel).unwrap().module;
    let Err(TpuError::Compile { diagnostic, .. }) = tpu.compile(Target::V6e, &module) else {
        panic!("libtpu compiled an i8 add");
    };
    assert!(diagnostic.is_mosaic(), "{diagnostic}");
    let want = format!("tests/it/targets/tpu_compile.rs:{}:", line + 1);
    let at = diagnostic.location.clone().unwrap_or_default();
    assert!(
        at.starts_with(&want),
        "located at `{at}`, want {want}..\n{diagnostic}"
    );
    // Shown location first, then the op, then the compiler's words.
    let shown = diagnostic.to_string();
    assert!(shown.starts_with(&at), "{shown}");
    assert!(
        shown.contains("op: ") && shown.contains("arith.addi"),
        "{shown}"
    );
}

/// A kernel's generation decides its VMEM. A copy whose double-buffered
/// windows take 96 MiB (24 MiB blocks) fits v5e and v6e (128 MiB per core):
/// it verifies with a 100 MiB limit and compiles. On v7x (64 MiB per core)
/// the verifier refuses the limit, and libtpu, given the module anyway,
/// runs out of VMEM. (On v5p libtpu accepts it: a megacore kernel spreads
/// its grid over both cores, 64 MiB each; there Tessera is the stricter.)
#[test]
fn each_generation_s_vmem_is_honoured() {
    use kernel_ir::prelude::*;
    let tpu = tpu();
    let mut k = KernelBuilder::new("big_copy");
    k.grid([2], [Parallel]);
    k.vmem_limit(100 << 20);
    let x = k
        .input("x", F32, [3072, 4096])
        .block([1536, 4096], |[i]| (i, 0));
    let o = k
        .output("o", F32, [3072, 4096])
        .block([1536, 4096], |[i]| (i, 0));
    o.store(.., x.load(..));
    let kernel = k.finish().unwrap();
    for t in Target::ALL {
        let mut kt = kernel.clone();
        kt.target = t;
        match kt.clone().verify() {
            Ok(v) => {
                assert!(t.vmem_bytes() >= 100 << 20, "{t}");
                tpu.compile_kernel(&v, t)
                    .unwrap_or_else(|e| panic!("{t}: {e}"));
            }
            Err(e) => {
                assert!(t.vmem_bytes() < 100 << 20, "{t}: {e}");
                assert!(
                    e.any(|k| matches!(k, kernel_ir::ErrorKind::VmemLimitTooLarge { .. })),
                    "{e}"
                );
                if t == Target::V7x {
                    let mut other = kernel.clone();
                    other.target = Target::V6e;
                    let module = lowering::tpu_custom_call(&other.verify().unwrap())
                        .unwrap()
                        .module;
                    let e = tpu
                        .compile(t, &module)
                        .expect_err("libtpu fits 96 MiB in v7x");
                    assert!(e.to_string().contains("memory space vmem"), "{e}");
                }
            }
        }
    }
}

/// `core_parallel` (Pallas's `CORE_PARALLEL`) splits a grid dim across the
/// TensorCores a device runs on: the verifier accepts exactly what libtpu
/// compiles (one such dim, one step per core: 2 on v5p, 1 elsewhere), and
/// refuses the rest with `[tpu-core-parallel]`, which libtpu confirms by
/// rejecting the same kernel built without the Mosaic rules.
#[test]
fn core_parallel_compiles_exactly_where_the_verifier_accepts_it() {
    use kernel_ir::prelude::*;
    let tpu = tpu();
    let mut accepted = Vec::new();
    for t in Target::ALL {
        for (grid, sem) in [
            ([2usize, 2usize], [CoreParallel, Arbitrary]),
            ([1, 2], [CoreParallel, Parallel]),
            ([2, 2], [CoreParallel, CoreParallel]),
            ([2, 2], [Parallel, CoreParallel]),
        ] {
            let mut k = KernelBuilder::new("scale");
            k.target(t);
            k.grid(grid, sem);
            let (bm, bn) = (64 / grid[0], 256 / grid[1]);
            let x = k
                .input("x", F32, [64, 256])
                .block([bm, bn], |[i, j]| (i, j));
            let o = k
                .output("o", F32, [64, 256])
                .block([bm, bn], |[i, j]| (i, j));
            o.store(.., x.load(..) * 2.0);
            let kernel = k.finish().unwrap();
            let case = format!("{t} grid {grid:?} {sem:?}");
            let compiled = |v: &kernel_ir::VerifiedKernel| {
                lowering::tpu_custom_call(v)
                    .map_err(|e| e.to_string())
                    .and_then(|c| {
                        tpu.compile(t, &c.module)
                            .map(drop)
                            .map_err(|e| e.to_string())
                    })
            };
            match kernel.clone().verify() {
                Ok(v) => {
                    compiled(&v)
                        .unwrap_or_else(|e| panic!("{case}: verifies, libtpu refuses: {e}"));
                    accepted.push(case);
                }
                Err(e) => {
                    assert!(e.to_string().contains("[tpu-core-parallel]"), "{case}: {e}");
                    // At the `grid` call.
                    let loc = e.0[0].loc.as_ref().map(|l| l.file.to_string());
                    assert!(
                        loc.is_some_and(|f| f.ends_with("tpu_compile.rs")),
                        "{case}: {e:?}"
                    );
                    let v = kernel.verify_without_mosaic_rules().unwrap();
                    assert!(
                        compiled(&v).is_err(),
                        "{case}: the rule refuses what libtpu compiles"
                    );
                }
            }
        }
    }
    assert_eq!(
        accepted,
        [
            "v5e grid [1, 2] [CoreParallel, Parallel]",
            "v5p grid [2, 2] [CoreParallel, Arbitrary]",
            "v5p grid [2, 2] [Parallel, CoreParallel]",
            "v6e grid [1, 2] [CoreParallel, Parallel]",
            "v7x grid [1, 2] [CoreParallel, Parallel]",
        ]
    );
}

/// `o = x + y` with x's window single-buffered and y's double-buffered
/// (Pallas's `Buffered(1)` and `Buffered(2)`).
#[kernel_ir::tpu_kernel(grid = (m / 32, n / 128), semantics = (parallel, parallel))]
fn buffered_add(
    #[shape(m, n)]
    #[block([32, 128], |i, j| (i, j))]
    #[buffered(1)]
    x: In<f32>,
    #[shape(m, n)]
    #[block([32, 128], |i, j| (i, j))]
    #[buffered(2)]
    y: In<f32>,
    #[shape(m, n)]
    #[block([32, 128], |i, j| (i, j))]
    o: Out<f32>,
) {
    o.store(.., x.load(..) + y.load(..));
}

/// Buffering depths reach the Mosaic module as Pallas writes them
/// (`pipeline_mode = #tpu.pipeline_mode<synchronous | double_buffered>`),
/// the VMEM budget counts one copy of a single-buffered window, libtpu
/// compiles them for every generation, and a depth Mosaic has no mode for
/// is the verifier's `[tpu-buffering]`.
#[test]
fn buffering_depths_compile_and_count_in_the_budget() {
    use kernel_ir::prelude::*;
    let tpu = tpu();
    let k = buffered_add::build(buffered_add::Dims { m: 64, n: 256 }).unwrap();
    let budget = k.vmem_budget();
    let copies: Vec<(String, u64)> = budget
        .items
        .iter()
        .filter(|i| i.kind != "scratch")
        .map(|i| (i.name.clone(), i.copies))
        .collect();
    assert!(copies.contains(&("x".to_string(), 1)), "{copies:?}");
    assert!(copies.contains(&("y".to_string(), 2)), "{copies:?}");
    let c = lowering::tpu_custom_call(&k).unwrap();
    assert!(
        c.body.contains(
            "pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_0"
        ),
        "{}",
        c.body
    );
    assert!(
        c.body.contains(
            "pipeline_mode = #tpu.pipeline_mode<double_buffered>, transform_indices = @transform_1"
        ),
        "{}",
        c.body
    );
    for t in Target::ALL {
        tpu.compile_kernel(&k, t)
            .unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    let mut b = KernelBuilder::new("triple");
    b.grid([2], [Parallel]);
    let x = b
        .input("x", F32, [64, 128])
        .block([32, 128], |[i]| (i, 0))
        .buffered(3);
    let o = b.output("o", F32, [64, 128]).block([32, 128], |[i]| (i, 0));
    o.store(.., x.load(..));
    let e = b.build().unwrap_err().to_string();
    assert!(
        e.contains("[tpu-buffering]") && e.contains("3 pipeline buffers"),
        "{e}"
    );
}

/// Kernels across chips compile with libtpu for the four multi-chip
/// topologies (`v5e:2x2`, `v6e:2x2`, `v5p:2x2x1`, `tpu7x:2x2x1`): a ring
/// permute by remote DMA and a barrier handshake, from their `.kir` files,
/// one partition per device of the mesh with a static device assignment.
/// What the lowering adds is needed: without `has_communication` libtpu
/// refuses the remote copy. (Without `collective_id` it aborts the
/// process on the barrier kernel, so that case is not compiled here; the
/// lowering snapshot pins the id.)
#[test]
fn kernels_across_chips_compile_for_every_multichip_topology() {
    let tpu = tpu();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests/lower");
    let load = |f: &str| {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        kernel_ir::parse_file(f, &text).unwrap().verify().unwrap()
    };
    let ring = load("ring-permute-tpu-custom-call.kir");
    let barrier = load("barrier-handshake-tpu-custom-call.kir");
    for t in Target::ALL {
        for k in [&ring, &barrier] {
            if let Err(e) = tpu.compile_kernel(k, t) {
                panic!("{} on {t}: {e}", k.name);
            }
        }
    }
    let module = lowering::tpu_custom_call(&ring).unwrap().module;
    let flag = "\\22has_communication\\22: true, ";
    assert!(module.contains(flag), "{module}");
    let e = tpu
        .compile(Target::V5e, &module.replace(flag, ""))
        .expect_err("a remote copy without has_communication must be refused");
    assert!(e.to_string().contains("has_communication"), "{e}");
}

/// The collective kernels (`kernels::collective`, 4 devices) compile with
/// libtpu for every multi-chip topology, f32 and bf16.
#[test]
fn the_collective_kernels_compile_for_every_multichip_topology() {
    use kernel_ir::DType;
    use kernels::collective::*;
    let tpu = tpu();
    let mut kernels = Vec::new();
    for dt in [DType::F32, DType::BF16] {
        let m = 16;
        kernels.push(all_gather(dt, 4, m, 128).unwrap());
        let dims = all_gather_matmul_kernel::Dims { m, k: 128, n: 256 };
        kernels
            .push(all_gather_matmul_kernel::build_for(dt, 4, Protocol::Handshake, dims).unwrap());
        let dims = all_gather_matmul_bidirectional_kernel::Dims {
            h: m,
            k: 128,
            n: 256,
        };
        kernels.push(all_gather_matmul_bidirectional_kernel::build_for(dt, 4, dims).unwrap());
        let dims = matmul_reduce_scatter_kernel::Dims { m, k: 128, n: 256 };
        kernels.push(matmul_reduce_scatter_kernel::build_for(dt, 4, dims).unwrap());
        let dims = ring_attention_kernel::Dims {
            sq: 16,
            d: 128,
            skv: 128,
        };
        kernels.push(ring_attention_kernel::build_for(dt, 4, 0.088, dims).unwrap());
        let dims = ring_attention_bwd_kernel::Dims {
            sq: 16,
            d: 128,
            skv: 128,
        };
        kernels.push(ring_attention_bwd_kernel::build_for(dt, 4, 0.088, dims).unwrap());
        kernels.push(all_to_all(dt, 4, m, 128).unwrap());
    }
    for t in Target::ALL {
        for k in &kernels {
            if let Err(e) = tpu.compile_kernel(k, t) {
                panic!("{} ({:?}) on {t}: {e}", k.name, k.operands[0].dtype);
            }
        }
    }
}

/// A grid-free kernel whose operands are VMEM blocks (found by the mesh
/// mutants: the all-to-all with a VMEM input): Mosaic takes window
/// parameters only with iteration bounds, so it is lowered as a grid of one
/// step, and libtpu compiles it on every generation.
#[test]
fn a_grid_free_kernel_with_vmem_blocks_compiles() {
    let text = "kernel @gridless {
  target v5e, vmem_limit default
  grid []
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
";
    let k = kernel_ir::parse(text).unwrap().verify().unwrap();
    let module = lowering::mosaic_module(&k).unwrap();
    assert!(
        module.contains("iteration_bounds = array<i64: 1>"),
        "{module}"
    );
    let tpu = tpu();
    for t in Target::ALL {
        if let Err(e) = tpu.compile_kernel(&k, t) {
            panic!("{t}: {e}");
        }
    }
}

/// Masked attention (block tables by scalar prefetch, segment ids)
/// compiles with libtpu for every generation, f32 and bf16, at blocks of
/// 128 × 128.
/// The public estimate runs libtpu in a child of the test binary through
/// a hook test; this binary has none, and the error says what to add
/// (instead of hanging, or running other tests in the child).
#[test]
fn an_estimate_without_the_child_hook_names_the_fix() {
    let k = kernels::preset("add_f32").unwrap().build().unwrap();
    let args: Vec<kernel_ir::Array> = k
        .arguments()
        .enumerate()
        .map(|(i, a)| kernel_ir::Array::random(a.dtype, a.shape.to_vec(), i as u64, -1.0, 1.0))
        .collect();
    let e = tessera_testing::estimate_for_tpu(&k, &args, Target::V5e).unwrap_err();
    assert!(
        matches!(e, tessera_testing::EstimateError::Estimate { .. }),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("tessera_testing::tpu_child!()"),
        "{e}"
    );
}
