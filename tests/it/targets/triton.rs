//! The Triton path's promises beside the numbers: an error in a Triton
//! program, from the compiler or the interpreter, names the Rust
//! `file:line:col` of the op its line came from.

use kernel_ir::{Array, DType, GpuTarget, Platform};
use kernels::Config;

/// The `add` kernel's Triton program, and the Rust location its first
/// load's line names.
fn add_program() -> (kernel_ir::VerifiedKernel, lowering::TritonProgram) {
    let e = kernels::find("add").unwrap();
    let cfg = Config::parse(e, &[]).unwrap();
    let k = kernel_ir::for_platform(Platform::Gpu, || e.build_at_default_shapes(&cfg)).unwrap();
    let p = lowering::triton(&k).unwrap();
    (k, p)
}

/// Breaks the program's first load (an attribute Triton does not have)
/// and returns the broken program with the location that line names.
fn broken(mut p: lowering::TritonProgram) -> (lowering::TritonProgram, String) {
    let line = p
        .source
        .lines()
        .find(|l| l.contains("tl.load("))
        .expect("a load")
        .to_string();
    let loc = line.rsplit("# ").next().unwrap().trim().to_string();
    assert!(
        loc.starts_with("kernels/src/") && loc.matches(':').count() == 2,
        "{loc}"
    );
    p.source = p
        .source
        .replacen(&line, &line.replacen("tl.load(", "tl.no_such_load(", 1), 1);
    (p, loc)
}

#[test]
fn a_triton_compile_error_names_the_rust_line() {
    let (_, p) = add_program();
    let (p, loc) = broken(p);
    let c = runtime::triton::compile(&p, &[GpuTarget::Sm90], None).unwrap();
    let e = c[0].result.clone().unwrap_err();
    assert_eq!(e.loc.as_deref(), Some(loc.as_str()), "{e}");
    assert!(e.to_string().starts_with(&loc), "{e}");
}

#[test]
fn a_triton_interpreter_error_names_the_rust_line() {
    let (k, p) = add_program();
    let (p, loc) = broken(p);
    let args: Vec<Array> = k
        .inputs()
        .map(|o| Array::random(DType::F32, o.shape.clone(), 1, -1.0, 1.0))
        .collect();
    let e = runtime::triton::interpret(&k, &p, &args).unwrap_err();
    match &e {
        runtime::triton::TritonError::Run { loc: Some(l), .. } => assert_eq!(l, &loc, "{e}"),
        other => panic!("not a located run error: {other}"),
    }
}

/// Flash attention built for the GPU with `config` at q/k/v shape `s`:
/// its Triton program and its error against the f64 reference under
/// Triton's interpreter.
fn attention_on_the_gpu(config: &[(&str, &str)], s: usize) -> String {
    let e = kernels::find("flash_attention").unwrap();
    let pairs: Vec<(String, String)> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = Config::parse(e, &pairs).unwrap();
    let shapes = [
        ("q", vec![1, 2, s, 64]),
        ("k", vec![1, 2, s, 64]),
        ("v", vec![1, 2, s, 64]),
    ];
    let k = kernel_ir::for_platform(Platform::Gpu, || e.build_with_shapes(&cfg, &shapes)).unwrap();
    let inputs = e.sample_inputs(&cfg, &k, 11);
    let want = e.reference(&cfg, &inputs).unwrap();
    let tol = e.tolerances(&cfg, &k);
    let runs = tooling::paths::run_paths(
        &k,
        &inputs,
        &[runtime::backend::Backend::TritonInterp],
        &want,
        &tol,
    );
    assert!(
        runs.iter().all(|r| r.passes() && r.refused.is_none()),
        "{config:?}: {}",
        runs[0]
    );
    lowering::triton(&k).unwrap().source
}

/// The loop over k blocks as a GPU kernel writes it: a causal forward
/// runs only the blocks the mask leaves, as two loops (left of the
/// diagonal unmasked, then the diagonal masked) with no branch inside; a
/// window adds a masked piece before them. Each matches the f64
/// reference under the interpreter, ragged last blocks included.
#[test]
fn a_causal_loop_is_split_where_its_mask_changes() {
    let loops = |src: &str| src.matches("for g3 in range(").count();
    // A branch in a grid loop's body (the function's body is indented
    // by 4, the loop's by 8).
    let branches = |src: &str| src.lines().filter(|l| l.starts_with("        if ")).count();
    let plain = attention_on_the_gpu(&[("block_q", "32"), ("block_k", "16")], 80);
    assert_eq!(loops(&plain), 1, "{plain}");
    let causal = attention_on_the_gpu(
        &[("causal", "true"), ("block_q", "32"), ("block_k", "16")],
        80,
    );
    assert_eq!(loops(&causal), 2, "{causal}");
    assert_eq!(branches(&causal), 0, "{causal}");
    let window = attention_on_the_gpu(
        &[
            ("causal", "true"),
            ("window", "40"),
            ("block_q", "32"),
            ("block_k", "16"),
        ],
        80,
    );
    assert_eq!(loops(&window), 3, "{window}");
    let both_ways = attention_on_the_gpu(
        &[("window", "20"), ("block_q", "16"), ("block_k", "32")],
        72,
    );
    assert!(loops(&both_ways) >= 2, "{both_ways}");
}

/// XLA's Triton custom call wraps the program as Pallas's Triton back end
/// does: typed FFI, the TTIR and launch grid in a dictionary config, the
/// program's pointer arguments as operands then results, row-major, and
/// an in-out operand aliasing its result.
#[test]
fn the_triton_custom_call_carries_the_program_and_aliases_in_out_operands() {
    use kernel_ir::prelude::*;
    let mut k = KernelBuilder::new("accumulate");
    k.grid([4], [Parallel]);
    let x = k.input("x", F32, [64, 128]).block([16, 128], |[i]| (i, 0));
    let acc = k
        .inout("acc", F32, [64, 128])
        .block([16, 128], |[i]| (i, 0));
    acc.store(.., acc.load(..) + x.load(..));
    let k = k.build().unwrap();
    let p = lowering::triton(&k).unwrap();
    let ttir = "module {\n  tt.func public @accumulate_kernel() {\n    tt.return\n  }\n}";
    let m = lowering::triton_custom_call(&k, ttir).unwrap();
    for want in [
        "\"stablehlo.custom_call\"(%arg0, %arg1)",
        "call_target_name = \"__gpu$xla.gpu.triton\"",
        "api_version = 4 : i32",
        "grid_x = 4 : i32, grid_y = 1 : i32, grid_z = 1 : i32",
        "name = \"accumulate_kernel\"",
        "tt.func public @accumulate_kernel",
        "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 1, operand_tuple_indices = []>]",
        "operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]",
        "(tensor<64x128xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>",
    ] {
        assert!(m.contains(want), "no `{want}` in:\n{m}");
    }
    assert!(
        m.contains(&format!("num_warps = {} : i32", p.options.num_warps)),
        "{m}"
    );
    assert_eq!(p.workspace_bytes, 0);
}

/// Every fp8 dot moves its sum into the f32 accumulator after each 32
/// products of k (Hopper's fp8 tensor cores accumulate in fewer bits than
/// f32; on an H200 the e5m2 GEMM preset was at 2.9x its tolerance without
/// it); other dots leave Triton's default.
#[test]
fn fp8_dots_promote_their_sum_every_32_products() {
    for name in ["fp8_gemm", "fp8_gemm_e5m2_gelu_residual", "matmul_bf16_f32"] {
        let k = kernels::preset(name)
            .map(|p| p.build().unwrap())
            .unwrap_or_else(|| {
                let e = kernels::find(name).unwrap();
                e.build_at_default_shapes(&Config::parse(e, &[]).unwrap())
                    .unwrap()
            });
        let p = lowering::triton(&k).unwrap();
        let dots: Vec<&str> = p.source.lines().filter(|l| l.contains("tl.dot(")).collect();
        assert!(!dots.is_empty(), "{name}");
        let fp8 = name.starts_with("fp8");
        for d in dots {
            assert_eq!(d.contains("max_num_imprecise_acc=32"), fp8, "{name}: {d}");
        }
    }
}

/// A sum of two dots (MLA's latent and RoPE scores, a two-matrix fusion)
/// fuses the later dot into `tl.dot(a, b, acc)` with the earlier one as
/// its accumulator, which is emitted: both were once deferred to the add
/// and the accumulator was never written (`NameError` in the interpreter).
/// Every path against the f64 sum.
#[test]
fn a_sum_of_two_dots_keeps_both() {
    use kernel_ir::prelude::*;
    let mut k = KernelBuilder::new("two_dots");
    k.grid([2], [Parallel]);
    let a = k.input("a", F32, [32, 64]).block([16, 64], |[i]| (i, 0));
    let b = k.input("b", F32, [64, 32]).block([64, 32], |[_]| (0, 0));
    let c = k.input("c", F32, [32, 16]).block([16, 16], |[i]| (i, 0));
    let d = k.input("d", F32, [16, 32]).block([16, 32], |[_]| (0, 0));
    let o = k.output("o", F32, [32, 32]).block([16, 32], |[i]| (i, 0));
    o.store(
        ..,
        dot(a.load(..), b.load(..)) + dot(c.load(..), d.load(..)),
    );
    let k = k.build().unwrap();
    let src = lowering::triton(&k).unwrap().source;
    assert_eq!(src.matches("tl.dot(").count(), 2, "{src}");
    let xs: Vec<Array> = [[32, 64], [64, 32], [32, 16], [16, 32]]
        .iter()
        .enumerate()
        .map(|(i, s)| Array::random(DType::F32, s.to_vec(), 40 + i as u64, -1.0, 1.0))
        .collect();
    let ab = kernels::reference::matmul(&xs[0], &xs[1]);
    let cd = kernels::reference::matmul(&xs[2], &xs[3]);
    let want: Vec<f64> = ab.iter().zip(&cd).map(|(x, y)| x + y).collect();
    tessera_testing::check_every_path(
        &k,
        &xs,
        &[want],
        &[kernels::check::Tolerance::matmul(80, DType::F32)],
    )
    .unwrap();
}

/// Every op's location names the kernel file, and a file name is outside
/// text: written into the Triton program it must stay one comment. For
/// names with newlines (and the other line ends Python's `splitlines`
/// knows), quotes, backslashes, NUL, non-ASCII and 10,000 characters, the
/// program is the one a plain name gives, comment text aside: the same
/// code lines, each with its comment on its own line, so it parses and
/// runs as the kernel does and nothing else.
mod file_names {
    use proptest::prelude::*;

    const KERNEL: &str = "kernel @double {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = add %0, %0 : f32[8, 128]
  store @o[0:8, 0:128], %1 : f32[8, 128]
}
";

    fn program(file: &str) -> String {
        let k = kernel_ir::for_platform(kernel_ir::Platform::Gpu, || {
            kernel_ir::parse_file(file, KERNEL)
                .map_err(|e| e.to_string())?
                .verify()
                .map_err(|e| e.to_string())
        })
        .unwrap();
        lowering::triton(&k).unwrap().source
    }

    /// The code of each line, its comment cut off.
    fn code(source: &str) -> Vec<String> {
        source
            .lines()
            .map(|l| l.split("  # ").next().unwrap_or(l).to_string())
            .collect()
    }

    fn name() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("\n".to_string()),
            Just("\r".to_string()),
            Just("\u{2028}".to_string()),
            Just("\u{b}".to_string()),
            Just("\0".to_string()),
            Just("\"".to_string()),
            Just("'".to_string()),
            Just("\\".to_string()),
            Just("#".to_string()),
            Just("import os; os._exit(3)".to_string()),
            any::<char>().prop_map(String::from),
            "[a-z/._ ]{0,12}",
        ];
        prop_oneof![
            proptest::collection::vec(piece, 0..16).prop_map(|v| v.concat()),
            Just("\n".repeat(10_000)),
            Just("é\u{1F600}".repeat(2_500)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn a_file_name_is_a_comment_and_changes_no_code(file in name()) {
            let plain = program("plain.kir");
            let hostile = program(&file);
            prop_assert!(hostile.is_ascii(), "a non-ASCII byte in the program");
            prop_assert_eq!(code(&hostile), code(&plain));
            prop_assert_eq!(hostile.lines().count(), plain.lines().count());
        }
    }
}
