//! Flash attention forward (DSL) in the interpreter against an f64
//! reference attention.

use kernel_ir::prelude::*;
use kernel_ir::{InterpOptions, interpret_with};
use kernels::attention::{AttnConfig, flash_attention};
use kernels::check::{ErrorStats, Tolerance};
use kernels::reference;
use proptest::prelude::*;

struct Case {
    b: usize,
    h: usize,
    sq: usize,
    skv: usize,
    d: usize,
    cfg: AttnConfig,
    dtype: DType,
}

fn run(c: &Case, seed: u64, shuffle: Option<u64>) -> Result<ErrorStats, String> {
    let dims = kernels::attention::flash_attention::Dims {
        b: c.b,
        h: c.h,
        sq: c.sq,
        skv: c.skv,
        d: c.d,
        hkv: c.h,
    };
    let k = flash_attention(&c.cfg, c.dtype, dims).map_err(|e| e.to_string())?;
    let q = Array::random(c.dtype, [c.b, c.h, c.sq, c.d], seed, -1.0, 1.0);
    let kk = Array::random(c.dtype, [c.b, c.h, c.skv, c.d], seed + 1, -1.0, 1.0);
    let v = Array::random(c.dtype, [c.b, c.h, c.skv, c.d], seed + 2, -1.0, 1.0);
    let opts = InterpOptions {
        shuffle_seed: shuffle,
        ..InterpOptions::default()
    };
    let out = interpret_with(&k, &[q.clone(), kk.clone(), v.clone()], &opts)
        .map_err(|e| e.to_string())?;
    let want = reference::attention(&q, &kk, &v, c.cfg.causal, c.cfg.sm_scale as f64);
    let tol = match c.dtype {
        DType::F32 => Tolerance {
            abs: 2e-5,
            rel: 1e-4,
        },
        d => Tolerance::for_dtype(d),
    };
    Ok(ErrorStats::between(&out[0], &want, tol))
}

#[test]
fn causal_and_full_attention_match_f64() {
    for causal in [false, true] {
        let c = Case {
            b: 2,
            h: 2,
            sq: 64,
            skv: 256,
            d: 64,
            cfg: AttnConfig {
                causal,
                sm_scale: 0.125,
                block_q: 16,
                block_k: 128,
                window: None,
                softcap: None,
                dropout: None,
            },
            dtype: F32,
        };
        let s = run(&c, 11, None).unwrap();
        assert!(s.passes(), "causal={causal}: {s}");
    }
}

#[test]
fn bf16_inputs_accumulate_in_f32() {
    let c = Case {
        b: 1,
        h: 2,
        sq: 128,
        skv: 256,
        d: 128,
        cfg: AttnConfig {
            causal: true,
            sm_scale: 1.0 / 128f32.sqrt(),
            block_q: 32,
            block_k: 128,
            window: None,
            softcap: None,
            dropout: None,
        },
        dtype: BF16,
    };
    let s = run(&c, 12, None).unwrap();
    assert!(s.passes(), "{s}");
}

#[test]
fn causal_skips_blocks_above_the_diagonal() {
    // A q block of rows 0..16 never needs the second k block (keys
    // 128..256): the kernel must not touch it, which a poisoned
    // (all-NaN) second k block shows.
    let dims = kernels::attention::flash_attention::Dims {
        b: 1,
        h: 1,
        sq: 128,
        skv: 256,
        d: 32,
        hkv: 1,
    };
    let cfg = AttnConfig {
        causal: true,
        sm_scale: 0.2,
        block_q: 16,
        block_k: 128,
        window: None,
        softcap: None,
        dropout: None,
    };
    let k = flash_attention(&cfg, F32, dims).unwrap();
    let q = Array::random(F32, [1, 1, 128, 32], 1, -1.0, 1.0);
    let mut kv: Vec<f64> = Array::random(F32, [1, 1, 256, 32], 2, -1.0, 1.0)
        .data()
        .to_vec();
    kv[128 * 32..].iter_mut().for_each(|x| *x = f64::NAN);
    let kk = Array::new(F32, [1, 1, 256, 32], kv.clone()).unwrap();
    let v = Array::new(F32, [1, 1, 256, 32], kv).unwrap();
    let out = interpret(&k, &[q.clone(), kk.clone(), v.clone()]).unwrap();
    // All 128 query rows see only keys 0..128, so nothing is NaN.
    let want = reference::attention(&q, &kk, &v, true, 0.2);
    let s = ErrorStats::between(
        &out[0],
        &want,
        Tolerance {
            abs: 2e-5,
            rel: 1e-4,
        },
    );
    assert!(s.passes(), "{s}");
}

#[test]
fn k_is_tiled_on_its_physical_minor_dim() {
    // K is col-major: its block's lane dim is the key dim, so block_k = 64
    // (< 128, and not the full 256) is rejected while block_q = 8 is fine.
    let dims = kernels::attention::flash_attention::Dims {
        b: 1,
        h: 1,
        sq: 64,
        skv: 256,
        d: 64,
        hkv: 1,
    };
    let cfg = AttnConfig {
        causal: false,
        sm_scale: 0.125,
        block_q: 8,
        block_k: 64,
        window: None,
        softcap: None,
        dropout: None,
    };
    let e = flash_attention(&cfg, F32, dims).unwrap_err();
    assert!(
        e.any(|k| matches!(k, kernel_ir::ErrorKind::Tiling { operand, dim: 2, which: "minor (lane)", .. } if operand == "k")),
        "{e}"
    );
}

/// Query heads that the kv heads do not divide are refused by each
/// kernel's own `check` before anything is built, forward and backward,
/// as a typed config error naming the fix.
#[test]
fn heads_the_kv_heads_do_not_divide_are_a_config_error() {
    use kernels::attention::backward::{flash_attention_dkv, flash_attention_dq};
    let cfg = AttnConfig {
        causal: false,
        sm_scale: 0.125,
        block_q: 8,
        block_k: 128,
        window: None,
        softcap: None,
        dropout: None,
    };
    let (b, h, hkv, sq, skv, d) = (1, 4, 3, 8, 128, 128);
    let config = |e: &kernel_ir::KernelErrors| {
        e.any(|k| matches!(k, kernel_ir::ErrorKind::Config(m) if m.contains("h = 4 query heads and hkv = 3") && m.contains("use hkv = 1 (MQA)")))
    };
    let fwd = flash_attention(
        &cfg,
        F32,
        kernels::attention::flash_attention::Dims {
            b,
            h,
            hkv,
            sq,
            skv,
            d,
        },
    )
    .unwrap_err();
    assert!(config(&fwd), "{fwd}");
    let dq = flash_attention_dq::build_for(
        F32,
        &cfg,
        false,
        flash_attention_dq::Dims {
            b,
            h,
            hkv,
            sq,
            skv,
            d,
        },
    )
    .unwrap_err();
    assert!(config(&dq), "{dq}");
    let dkv = flash_attention_dkv::build_for(
        F32,
        &cfg,
        false,
        flash_attention_dkv::Dims {
            b,
            h,
            hkv,
            sq,
            skv,
            d,
        },
    )
    .unwrap_err();
    assert!(config(&dkv), "{dkv}");
    // The bounds admit f32, bf16 and f16 only: a typed dtype refusal that
    // names the kernel asked for (`name = ..` of the attribute).
    let i32 = kernels::attention::flash_attention_kv_len(
        &cfg,
        kernel_ir::DType::I32,
        kernels::attention::flash_attention::Dims {
            b,
            h: 3,
            hkv,
            sq,
            skv,
            d,
        },
    )
    .unwrap_err();
    assert!(
        i32.any(|k| matches!(k, kernel_ir::ErrorKind::UnsupportedDtype { what, .. } if what == "flash_attention_kv_len")),
        "{i32}"
    );
    assert!(
        i32.to_string()
            .contains("flash_attention_kv_len is instantiated for f32, bf16 or f16, not i32"),
        "{i32}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn flash_attention_matches_f64_over_shapes_and_blocks(
        b in 1usize..3, h in 1usize..3,
        q_blocks in 1usize..4, bq in prop::sample::select(vec![8usize, 16, 32]),
        skv in prop::sample::select(vec![128usize, 256]), full_k in any::<bool>(),
        d in prop::sample::select(vec![32usize, 64, 128]),
        causal in any::<bool>(), seed in any::<u64>(), shuffle in proptest::option::of(any::<u64>()),
    ) {
        let c = Case {
            b, h, sq: q_blocks * bq, skv, d,
            cfg: AttnConfig {
                causal,
                sm_scale: 1.0 / (d as f32).sqrt(),
                block_q: bq,
                block_k: if full_k { skv } else { 128 },
                window: None,
                softcap: None, dropout: None,
            },
            dtype: F32,
        };
        let s = run(&c, seed, shuffle).map_err(TestCaseError::fail)?;
        prop_assert!(s.passes(), "{s}");
    }
}
