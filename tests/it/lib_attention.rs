//! The attention kernels of the library on every CPU path against f64
//! references: forward (GQA, window, soft-cap, ragged lengths, lse),
//! backward (against the reference gradient, itself checked against finite
//! differences), paged decode.

use kernel_ir::prelude::*;
use kernels::attention::{AttnConfig, flash_attention, flash_attention_kv_len};
use kernels::check::Tolerance;
use kernels::reference::{self, AttnSpec};
use proptest::prelude::*;

use crate::common::all_paths;

/// Output tolerance per dtype (see `kernels::check::tolerances`).
fn out_tol(d: DType) -> Tolerance {
    kernels::check::Tolerance::attention(d)
}

fn lse_tol(d: DType) -> Tolerance {
    match d {
        F32 => Tolerance {
            abs: 1e-4,
            rel: 1e-5,
        },
        _ => Tolerance {
            abs: 2e-2,
            rel: 1e-2,
        },
    }
}

fn spec(cfg: &AttnConfig) -> AttnSpec {
    AttnSpec {
        causal: cfg.causal,
        scale: cfg.sm_scale as f64,
        window: cfg.window,
        softcap: cfg.softcap.map(f64::from),
        kv_len: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn flash_attention_forward_on_every_path(
        b in 1usize..3, hkv in 1usize..3, group in 1usize..3,
        sq in 1usize..80, extra_kv in 0usize..200, full_k in any::<bool>(),
        bq in prop::sample::select(vec![8usize, 16, 32]), d in prop::sample::select(vec![32usize, 64]),
        causal in any::<bool>(), window in proptest::option::of(1usize..64),
        softcap in proptest::option::of(5.0f32..30.0), bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        // The smallest legal q tile of the dtype, or more.
        let bq = bq.max(8 * dtype.packing()).min(sq);
        // Every query sees a key: no more queries than keys.
        let skv = sq + extra_kv;
        let h = hkv * group;
        let cfg = AttnConfig {
            causal, sm_scale: 1.0 / (d as f32).sqrt(), block_q: bq,
            block_k: if full_k { skv } else { 128.min(skv) }, window, softcap,
        };
        let dims = kernels::attention::flash_attention::Dims { b, h, hkv, sq, skv, d };
        let q = Array::random(dtype, [b, h, sq, d], seed, -1.0, 1.0);
        let k = Array::random(dtype, [b, hkv, skv, d], seed + 1, -1.0, 1.0);
        let v = Array::random(dtype, [b, hkv, skv, d], seed + 2, -1.0, 1.0);
        let (o, lse) = reference::attention_full(&q, &k, &v, &spec(&cfg));
        all_paths(flash_attention(&cfg, dtype, dims), &[q, k, v], vec![o, lse], &[out_tol(dtype), lse_tol(dtype)])?;
    }

    #[test]
    fn flash_attention_with_a_valid_kv_length_on_every_path(
        kv_len in 1usize..=256, causal in any::<bool>(), hkv in 1usize..3, seed in any::<u64>(),
    ) {
        let (h, sq, skv, d) = (2, 64, 256, 64);
        let hkv = hkv.min(h);
        let dims = kernels::attention::flash_attention_kv_len::Dims { b: 1, h, hkv, sq, skv, d };
        let cfg = AttnConfig { causal, sm_scale: 0.125, block_q: 32, block_k: 128, window: None, softcap: None };
        let len = Array::from_elems([1], &[kv_len as i32]).unwrap();
        let q = Array::random(F32, [1, h, sq, d], seed, -1.0, 1.0);
        let k = Array::random(F32, [1, hkv, skv, d], seed + 1, -1.0, 1.0);
        let v = Array::random(F32, [1, hkv, skv, d], seed + 2, -1.0, 1.0);
        let s = AttnSpec { kv_len: Some(kv_len), ..spec(&cfg) };
        let (o, lse) = reference::attention_full(&q, &k, &v, &s);
        all_paths(
            flash_attention_kv_len(&cfg, F32, dims),
            &[len, q, k, v],
            vec![o, lse],
            &[out_tol(F32), lse_tol(F32)],
        )?;
    }
}

#[test]
fn per_target_defaults_verify_for_every_target() {
    for t in kernel_ir::Target::ALL {
        let cfg = AttnConfig::for_target(t, true, 128, 1024, 1024);
        assert_eq!(cfg.block_q, t.mxu_width());
        let dims = kernels::attention::flash_attention::Dims {
            b: 1,
            h: 8,
            hkv: 2,
            sq: 1024,
            skv: 1024,
            d: 128,
        };
        flash_attention(&cfg, BF16, dims).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
    // Clamped to short sequences.
    let cfg = AttnConfig::for_target(kernel_ir::Target::V6e, false, 64, 100, 40);
    assert_eq!((cfg.block_q, cfg.block_k), (100, 40));
}
