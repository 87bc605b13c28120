//! The low-precision GEMMs on every CPU path against their f64
//! references: the FP8 GEMM (both formats, both scalings, ragged k, every
//! epilogue), the block-scaled FP8 GEMM and the int8 weight-only matmul,
//! on random shapes and values spread over each format's range.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::epilogue::Activation;
use kernels::fp8_gemm::{Fp8GemmConfig, Scaling, fp8_gemm};
use kernels::{scaled_mm, w8a16};
use proptest::prelude::*;

use crate::common::all_paths;

fn positive(shape: &[usize], seed: u64, lo: f64, hi: f64) -> Array {
    Array::random(F32, shape.to_vec(), seed, lo, hi)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn fp8_gemm_on_every_path(
        e5m2 in any::<bool>(), rowwise in any::<bool>(), mt in 1usize..3, nt in 1usize..3,
        k in prop::sample::select(vec![128usize, 256, 200]), act in 0usize..3, residual in any::<bool>(),
        bf16_out in any::<bool>(), seed in any::<u64>(),
    ) {
        let d = if e5m2 { F8E5M2 } else { F8E4M3FN };
        let out = if bf16_out { BF16 } else { F32 };
        let (m, n) = (mt * 32, nt * 128);
        let activation = [Activation::Identity, Activation::Gelu, Activation::Silu][act];
        let cfg = Fp8GemmConfig {
            m, n, k, bm: 32, bn: 128, bk: 128,
            scaling: if rowwise { Scaling::Row } else { Scaling::Tensor },
            activation, residual, bf16_partials: false, dtype: d, out_dtype: out,
        };
        let x = Array::random(d, [m, k], seed, -8.0, 8.0);
        let w = Array::random(d, [k, n], seed + 1, -8.0, 8.0);
        let (sxs, sws) = if rowwise { ([m, 1], [1, n]) } else { ([1, 1], [1, 1]) };
        let sx = positive(&sxs, seed + 2, 0.5 / (k as f64).sqrt(), 1.0 / (k as f64).sqrt());
        let sw = positive(&sws, seed + 3, 0.05, 0.1);
        let bias = Array::random(F32, [1, n], seed + 4, -1.0, 1.0);
        let mut args = vec![x, w, sx, sw, bias];
        if residual {
            args.push(Array::random(out, [m, n], seed + 5, -1.0, 1.0));
        }
        let name = ["none", "gelu", "silu"][act];
        let want = kernels::fp8_gemm::reference(&args[0], &args[1], &args[2], &args[3], &args[4], name, args.get(5));
        all_paths(fp8_gemm(&cfg), &args, vec![want], &[Tolerance::matmul(k, out)])?;
    }

    #[test]
    fn block_scaled_fp8_gemm_on_every_path(
        e5m2 in any::<bool>(), mt in 1usize..3, kb in 1usize..4, nb in 1usize..3, seed in any::<u64>(),
    ) {
        let d = if e5m2 { F8E5M2 } else { F8E4M3FN };
        let (m, k, n) = (mt * 32, kb * 128, nb * 128);
        let a = Array::random(d, [m, k], seed, -8.0, 8.0);
        let b = Array::random(d, [k, n], seed + 1, -8.0, 8.0);
        let sa = positive(&[m, kb], seed + 2, 0.002, 0.01);
        let sb = positive(&[kb, nb], seed + 3, 0.002, 0.01);
        let want = scaled_mm::reference(&a, &sa, &b, &sb);
        let dims = scaled_mm::scaled_mm::Dims { m, k, n, kb, nb };
        all_paths(scaled_mm::scaled_mm::build_for(d, F32, 32, dims), &[a, sa, b, sb], vec![want], &[Tolerance::matmul(k, F32)])?;
    }

    #[test]
    fn w8a16_matmul_on_every_path(
        mt in 1usize..3, nt in 1usize..3, k in prop::sample::select(vec![128usize, 256, 320]),
        bf16_out in any::<bool>(), seed in any::<u64>(),
    ) {
        let (m, n) = (mt * 32, nt * 128);
        let out = if bf16_out { BF16 } else { F32 };
        let x = Array::random(BF16, [m, k], seed, -1.0, 1.0);
        let w = Array::random(I8, [k, n], seed + 1, -127.0, 127.0);
        let scale = positive(&[1, n], seed + 2, 2e-4, 5e-4);
        let want = w8a16::reference(&x, &w, &scale);
        let dims = w8a16::w8a16_matmul::Dims { m, k, n };
        all_paths(w8a16::w8a16_matmul::build_for(BF16, out, 32, 128, 128, dims), &[x, w, scale], vec![want], &[Tolerance::matmul(k, out)])?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Paged decode over an fp8 KV cache: random pools, tables, lengths
    /// from 0 to full, both fp8 formats, against the f64 attention over the
    /// dequantized pages.
    #[test]
    fn fp8_kv_cache_decode_on_every_path(
        b in 1usize..4, hkv in 1usize..3, g in 1usize..4, pages_per_seq in 1usize..4,
        e5m2 in any::<bool>(), bf in any::<bool>(), seed in any::<u64>(),
    ) {
        use kernels::attention::decode_fp8::{paged_decode_attention_fp8, paged_decode_attention_fp8::Dims};
        let (dtype, kv) = (if bf { BF16 } else { F32 }, if e5m2 { F8E5M2 } else { F8E4M3FN });
        let (d, page) = (32, 32);
        let pool = b * pages_per_seq + 1;
        let mut rng = kernel_ir::SplitMix64(seed);
        let mut perm: Vec<usize> = (0..pool).collect();
        for i in (1..pool).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let tables: Vec<Vec<usize>> = (0..b).map(|i| perm[i * pages_per_seq..(i + 1) * pages_per_seq].to_vec()).collect();
        let lengths: Vec<usize> = (0..b).map(|_| rng.below(pages_per_seq * page + 1)).collect();
        let (ks, vs) = (0.25, 0.125);
        let q = Array::random(dtype, [b, hkv, g, d], seed, -1.0, 1.0);
        let kp = Array::random(kv, [hkv, pool, page, d], seed + 1, -4.0, 4.0);
        let vp = Array::random(kv, [hkv, pool, page, d], seed + 2, -8.0, 8.0);
        let dq = |a: &Array, s: f64| Array::new(F32, a.shape().to_vec(), a.data().iter().map(|v| v * s).collect()).unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let want = kernels::reference::paged_decode_attention(&q, &dq(&kp, ks), &dq(&vp, vs), &lengths, &tables, scale);
        let lens = Array::from_elems([b], &lengths.iter().map(|&l| l as i32).collect::<Vec<_>>()).unwrap();
        let flat: Vec<i32> = tables.iter().flatten().map(|&p| p as i32).collect();
        let tab = Array::from_elems([b, pages_per_seq], &flat).unwrap();
        let s = |v: f64| Array::new(F32, [1, 1], vec![v]).unwrap();
        let dims = Dims { b, hkv, g, d, pages: pool, page, pages_per_seq };
        all_paths(
            paged_decode_attention_fp8::build_for(dtype, kv, scale as f32, dims),
            &[lens, tab, q, kp, vp, s(ks), s(vs)],
            vec![want],
            &[Tolerance::attention(dtype)],
        )?;
    }
}
