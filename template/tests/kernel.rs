//! The kernel tested as Tessera tests its own, through the public API
//! only: every CPU path (Triton's interpreter among them) against the f64
//! reference over generated shapes and values, its lowered IR pinned per
//! target, libtpu compiles for every TPU generation, Triton compiles for
//! NVIDIA and AMD GPUs, and its export for JAX.

use kernel_ir::{Array, DType, GpuTarget, Target};
use my_kernels::{RmsNormMatmul, reference, rms_norm_matmul};
use tessera_testing::proptest::prelude::*;
use tessera_testing::{
    Tolerance, assert_lowered_snapshots, check_every_path, compile_for_gpu, compile_for_tpu,
    estimate_for_tpu,
};

// The test through which libtpu's schedule estimates run in a child
// process of this binary (see `estimate_is_near_its_roofline`).
tessera_testing::tpu_child!();

const CFG: RmsNormMatmul = RmsNormMatmul {
    block_m: 16,
    block_n: 128,
    eps: 1e-6,
};

fn kernel(dtype: DType, m: usize, k: usize, n: usize) -> kernel_ir::VerifiedKernel {
    rms_norm_matmul::build_for(dtype, &CFG, rms_norm_matmul::Dims { m, k, n }).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Interpreter, native JIT, PJRT decomposed, PJRT FFI and the Triton
    /// program under Triton's interpreter against f64 on fresh random
    /// inputs; a failure names the path and shrinks to
    /// the smallest failing shape.
    #[test]
    fn matches_f64_on_every_path(
        row_blocks in 1usize..3,
        col_blocks in 1usize..3,
        k in prop::sample::select(vec![128usize, 256]),
        bf16 in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dtype = if bf16 { DType::BF16 } else { DType::F32 };
        let (m, n) = (row_blocks * CFG.block_m, col_blocks * CFG.block_n);
        let x = Array::random(dtype, [m, k], seed, -2.0, 2.0);
        let gamma = Array::random(DType::F32, [k], seed ^ 1, 0.5, 1.5);
        let w = Array::random(dtype, [k, n], seed ^ 2, -1.0, 1.0);
        let want = reference(&x, &gamma, &w, CFG.eps as f64);
        // In bf16 the kernel rounds the normalized row to bf16 before the
        // dot (the MXU's input type), which the f64 reference does not: k
        // products each off by up to 2^-9, a random walk of about
        // sqrt(k) * 2^-9 * |x̂||w| (6e-3 * sqrt(k) is five of its sigmas).
        let tol = match dtype {
            DType::BF16 => Tolerance {
                abs: 6e-3 * (k as f64).sqrt(),
                ..Tolerance::matmul(k, dtype)
            },
            _ => Tolerance::matmul(k, dtype),
        };
        let report = check_every_path(&kernel(dtype, m, k, n), &[x, gamma, w], &[want], &[tol])?;
        prop_assert_eq!(report.paths.len(), 5);
    }
}

/// The printed IR and every lowering target, pinned
/// (`tests/snapshots/<target>/rms_norm_matmul_*.snap`; review changes
/// with `cargo insta review`).
#[test]
fn lowered_ir_is_pinned() {
    assert_lowered_snapshots!("rms_norm_matmul_f32", &kernel(DType::F32, 32, 256, 256));
    assert_lowered_snapshots!("rms_norm_matmul_bf16", &kernel(DType::BF16, 32, 256, 256));
}

/// The TPU compiler (libtpu, compile-only) takes it for every generation.
#[test]
fn compiles_with_libtpu_for_every_generation() {
    for dtype in [DType::F32, DType::BF16] {
        if let Err(e) = compile_for_tpu(&kernel(dtype, 256, 512, 512), &Target::ALL) {
            panic!("{e}");
        }
    }
}

/// Triton's compiler (no GPU needed) takes it for an NVIDIA H100/H200
/// and an AMD MI300X: no spills, and the dot runs on tensor cores
/// (HGMMA or HMMA on sm_90, MFMA on gfx942). The kernel keeps `w`'s whole
/// `[k, block_n]` block in shared memory: at k = 512 that is 128 KiB,
/// over the 64 KiB an MI300X program may have, and the check says so
/// (a GPU-first kernel would add a k grid dim).
#[test]
fn compiles_with_triton_for_gpus() {
    let k = kernel(DType::BF16, 256, 128, 512);
    let targets = [GpuTarget::Sm90, GpuTarget::Gfx942];
    let stats = compile_for_gpu(&k, &targets).unwrap_or_else(|e| panic!("{e}"));
    for (t, s) in targets.iter().zip(&stats) {
        eprintln!(
            "{t}: {} registers, {} B spilled, tensor cores {:?}",
            s.registers, s.spill_bytes, s.tensor_core
        );
        assert_eq!(s.spill_bytes, 0, "{t} spills");
        assert!(
            s.tensor_core_total() > 0,
            "{t}: the dot is not on tensor cores"
        );
    }
    let wide = kernel(DType::BF16, 256, 512, 512);
    let e = compile_for_gpu(&wide, &[GpuTarget::Gfx942])
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory") && e.contains("64 KiB"), "{e}");
}

/// libtpu's static schedule estimate on v6e (the TPU's time, without a
/// TPU): the work is all there, and the fused kernel stays within a small
/// factor of its roofline (the bound of its HBM traffic and MXU work).
#[test]
fn estimate_is_near_its_roofline() {
    let (m, k, n) = (256, 512, 512);
    let args = [
        Array::random(DType::BF16, [m, k], 1, -2.0, 2.0),
        Array::random(DType::F32, [k], 2, 0.5, 1.5),
        Array::random(DType::BF16, [k, n], 3, -1.0, 1.0),
    ];
    // TPU-sized blocks: 256 rows of x per step, 256 columns of w.
    let cfg = RmsNormMatmul {
        block_m: 256,
        block_n: 256,
        ..CFG
    };
    let dims = my_kernels::rms_norm_matmul::Dims { m, k, n };
    let tpu_kernel = rms_norm_matmul::build_for(DType::BF16, &cfg, dims).unwrap();
    let e = estimate_for_tpu(&tpu_kernel, &args, Target::V6e).unwrap();
    let over = e.over_roofline().expect("v6e has a clock");
    eprintln!(
        "v6e: {} cycles, {over:.2}x the roofline, guards: {}",
        e.cycles(),
        e.verdict.reasons()
    );
    assert!(e.cycles() > 0);
    // The profiler ran all the MXU work (its trace's matmuls cover the
    // kernel's); a memory-bound kernel's time is reported as at least its
    // bytes over the bandwidth, which the guard notes.
    assert!(!e.verdict.work_in_doubt(), "{}", e.verdict.reasons());
    assert!(over < 4.0, "{over:.2}x the roofline");
}

/// Exported for JAX: `tessera_jax.load(dir)` takes the directory (see the
/// README); here, that it is whole and names the inputs.
#[test]
fn exports_for_jax() {
    let dir = std::env::temp_dir().join(format!("my-kernels-export-{}", std::process::id()));
    let k = kernel(DType::F32, 32, 256, 256);
    tooling::export::write_kernel(&k, "rms_norm_matmul", &[], &dir).unwrap();
    let manifest = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    for name in ["\"x\"", "\"gamma\"", "\"w\"", "module.mlir"] {
        assert!(manifest.contains(name), "{name} missing from {manifest}");
    }
    assert!(
        std::fs::read_to_string(dir.join("module.mlir"))
            .unwrap()
            .contains("tpu_custom_call")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
