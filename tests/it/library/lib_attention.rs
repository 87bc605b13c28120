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

fn out_tol(d: DType) -> Tolerance {
    Tolerance::attention(d)
}

fn lse_tol(d: DType) -> Tolerance {
    Tolerance::logsumexp(d)
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
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// Dropout on the probabilities: every path against attention whose
    /// probabilities are multiplied by the mask written from jax's
    /// definition (`bernoulli(fold_in(key, b·h + head), 1 − rate, (sq,
    /// skv))`), lse untouched; GQA, causal or not, ragged lengths.
    #[test]
    fn flash_attention_with_dropout_on_every_path(
        b in 1usize..3, hkv in 1usize..3, group in 1usize..3, sq in 1usize..70,
        skv in 1usize..150, causal in any::<bool>(), bf in any::<bool>(),
        rate in prop::sample::select(vec![0.0f32, 0.25, 0.5]), seed in any::<u64>(),
    ) {
        let (h, d) = (hkv * group, 32);
        let dtype = if bf { BF16 } else { F32 };
        let cfg = AttnConfig { causal, sm_scale: 0.2, block_q: 16.min(sq), block_k: 128.min(skv), window: None, softcap: None, dropout: Some(rate) };
        let q = Array::random(dtype, [b, h, sq, d], seed, -1.0, 1.0);
        let k = Array::random(dtype, [b, hkv, skv, d], seed + 1, -1.0, 1.0);
        let v = Array::random(dtype, [b, hkv, skv, d], seed + 2, -1.0, 1.0);
        let words = [seed as u32, (seed >> 32) as u32];
        let key = Array::new(I32, [2], words.iter().map(|&w| f64::from(w as i32)).collect()).unwrap();
        let keep = |bi, hi, i, j| kernels::attention::dropout::keep_reference(words, rate, (h, skv), (bi, hi, i, j));
        let (o, lse) = reference::attention_weighted(&q, &k, &v, &spec(&cfg), &keep);
        let dims = kernels::attention::flash_attention::Dims { b, h, hkv, sq, skv, d };
        all_paths(
            kernels::attention::flash_attention::build_for(dtype, &cfg, false, false, dims),
            &[key, q, k, v],
            vec![o, lse],
            &[out_tol(dtype), lse_tol(dtype)],
        )?;
    }
}

/// The mask keeps about `1 − rate` of the probabilities and differs
/// between heads and batches (each folds its own key).
#[test]
fn the_dropout_mask_keeps_one_minus_rate_and_differs_per_head() {
    use kernels::attention::dropout::keep_reference;
    let (key, rate, (heads, skv)) = ([3, 9], 0.25, (2, 256));
    let mask = |b, h| -> Vec<bool> {
        (0..64 * skv)
            .map(|e| keep_reference(key, rate, (heads, skv), (b, h, e / skv, e % skv)) > 0.0)
            .collect()
    };
    let m = mask(0, 0);
    let kept = m.iter().filter(|&&k| k).count() as f64 / m.len() as f64;
    assert!((kept - 0.75).abs() < 0.01, "kept {kept}");
    assert_ne!(m, mask(0, 1));
    assert_ne!(m, mask(1, 0));
    assert_eq!(
        keep_reference(key, rate, (heads, skv), (0, 0, 0, 0)) > 0.0,
        m[0]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

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
            block_k: if full_k { skv } else { 128.min(skv) }, window, softcap, dropout: None,
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
        let dims = kernels::attention::flash_attention::Dims { b: 1, h, hkv, sq, skv, d };
        let cfg = AttnConfig { causal, sm_scale: 0.125, block_q: 32, block_k: 128, window: None, softcap: None, dropout: None };
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Query rows that see no key (every key hidden by a valid length, the
    /// window and the causal mask, or past a short K) get o = 0 and
    /// lse = −∞ on every path, as in the reference, and the other rows
    /// their softmax.
    #[test]
    fn rows_with_no_visible_key_are_zero_with_lse_minus_infinity_on_every_path(
        kv_len in 0usize..=100, window in 1usize..8, causal in any::<bool>(),
        short_k in any::<bool>(), seed in any::<u64>(),
    ) {
        let (h, sq, d) = (2, 128, 64);
        let skv = if short_k { 100 } else { 256 };
        let cfg = AttnConfig { causal, sm_scale: 0.125, block_q: 32, block_k: if short_k { skv } else { 128 }, window: Some(window), softcap: None, dropout: None };
        let q = Array::random(F32, [1, h, sq, d], seed, -1.0, 1.0);
        let k = Array::random(F32, [1, 1, skv, d], seed + 1, -1.0, 1.0);
        let v = Array::random(F32, [1, 1, skv, d], seed + 2, -1.0, 1.0);
        let kv_len = kv_len.min(skv);
        let s = AttnSpec { kv_len: Some(kv_len), ..spec(&cfg) };
        let (o, lse) = reference::attention_full(&q, &k, &v, &s);
        // The case is not vacuous: some rows see nothing, and those are
        // exactly 0 and −∞ in the reference.
        let dead: Vec<usize> = (0..h * sq).filter(|&r| lse[r] == f64::NEG_INFINITY).collect();
        prop_assert!(!dead.is_empty(), "no dead rows");
        for &r in &dead {
            prop_assert!(o[r * d..(r + 1) * d].iter().all(|&x| x == 0.0));
        }
        let len = Array::from_elems([1], &[kv_len as i32]).unwrap();
        all_paths(
            flash_attention_kv_len(&cfg, F32, kernels::attention::flash_attention::Dims { b: 1, h, hkv: 1, sq, skv, d }),
            &[len, q.clone(), k.clone(), v.clone()],
            vec![o, lse],
            &[out_tol(F32), lse_tol(F32)],
        )?;
        // Without a valid length, a short K under a causal window still
        // leaves the late queries nothing to see.
        let s = AttnSpec { kv_len: None, ..spec(&cfg) };
        let (o, lse) = reference::attention_full(&q, &k, &v, &s);
        all_paths(
            flash_attention(&cfg, F32, kernels::attention::flash_attention::Dims { b: 1, h, hkv: 1, sq, skv, d }),
            &[q, k, v],
            vec![o, lse],
            &[out_tol(F32), lse_tol(F32)],
        )?;
    }
}

/// An out-of-range page in a block table is the same error on every path:
/// the decomposed StableHLO (whose dynamic slices clamp) is checked before
/// the call, as the interpreter and native code check as they go.
#[test]
fn an_out_of_range_block_table_entry_is_an_error_on_every_path() {
    use kernels::attention::decode::{DecodeConfig, paged_decode_attention};
    let (b, hkv, g, d, pages, page, pages_per_seq) = (1, 1, 8, 32, 4, 8, 2);
    let kernel = paged_decode_attention::build_for(
        F32,
        &DecodeConfig { sm_scale: 0.2 },
        kernels::attention::decode::paged_decode_attention::Dims {
            b,
            hkv,
            g,
            d,
            pages,
            page,
            pages_per_seq,
        },
    )
    .unwrap();
    for bad in [1_000_000, 40, -1] {
        let lens = Array::from_elems([b], &[16i32]).unwrap();
        let tab = Array::from_elems([b, pages_per_seq], &[0i32, bad]).unwrap();
        let args = [
            lens,
            tab,
            Array::random(F32, [b, hkv, g, d], 1, -1.0, 1.0),
            Array::random(F32, [hkv, pages, page, d], 2, -1.0, 1.0),
            Array::random(F32, [hkv, pages, page, d], 3, -1.0, 1.0),
        ];
        let refused = tessera_testing::check_refused_on_every_path(&kernel, &args)
            .unwrap_or_else(|e| panic!("page {bad}: {e}"));
        assert_eq!(refused.len(), runtime::backend::Backend::ALL.len());
        for (backend, e) in refused {
            assert!(e.contains("k_pages"), "{backend}: {e}");
        }
    }
}

#[test]
fn per_target_defaults_verify_for_every_target() {
    for t in kernel_ir::Target::ALL {
        let cfg = AttnConfig::for_target(t, true, 128, 1024, 1024);
        assert_eq!(cfg.block_q, AttnConfig::default_block(t));
        assert_eq!(cfg.block_k, AttnConfig::default_block(t));
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

/// `Σ O ∘ G` of the reference forward.
fn loss(q: &Array, k: &Array, v: &Array, g: &Array, s: &AttnSpec) -> f64 {
    let (o, _) = reference::attention_full(q, k, v, s);
    o.iter().zip(g.data()).map(|(a, b)| a * b).sum()
}

/// `x` with element `i` moved by `by` (f64 arrays only hold values exactly
/// in f32 here, so the inputs are f32 and the steps large enough).
fn nudge(x: &Array, i: usize, by: f64) -> Array {
    let mut d = x.data().to_vec();
    d[i] += by;
    Array::new(F32, x.shape().to_vec(), d).unwrap()
}

#[test]
fn reference_gradients_match_finite_differences() {
    // Tiny shapes; GQA; each option on its own.
    let specs = [
        AttnSpec::new(false, 0.5),
        AttnSpec::new(true, 0.5),
        AttnSpec {
            window: Some(3),
            ..AttnSpec::new(true, 0.5)
        },
        AttnSpec {
            window: Some(2),
            ..AttnSpec::new(false, 0.5)
        },
        AttnSpec {
            softcap: Some(1.5),
            ..AttnSpec::new(false, 0.5)
        },
    ];
    for (n, spec) in specs.iter().enumerate() {
        let seed = 100 + 10 * n as u64;
        let q = Array::random(F32, [1, 2, 5, 4], seed, -1.0, 1.0);
        let k = Array::random(F32, [1, 1, 7, 4], seed + 1, -1.0, 1.0);
        let v = Array::random(F32, [1, 1, 7, 4], seed + 2, -1.0, 1.0);
        let g = Array::random(F32, [1, 2, 5, 4], seed + 3, -1.0, 1.0);
        let (dq, dk, dv) = reference::attention_backward(&q, &k, &v, &g, spec);
        // Steps of 2^-12 are exact in f32 and f64 here.
        let h = 1.0 / 4096.0;
        let check = |which: usize, x: &Array, analytic: &[f64]| {
            for (i, &want) in analytic.iter().enumerate() {
                let (lp, lm) = match which {
                    0 => (
                        loss(&nudge(x, i, h), &k, &v, &g, spec),
                        loss(&nudge(x, i, -h), &k, &v, &g, spec),
                    ),
                    1 => (
                        loss(&q, &nudge(x, i, h), &v, &g, spec),
                        loss(&q, &nudge(x, i, -h), &v, &g, spec),
                    ),
                    _ => (
                        loss(&q, &k, &nudge(x, i, h), &g, spec),
                        loss(&q, &k, &nudge(x, i, -h), &g, spec),
                    ),
                };
                let fd = (lp - lm) / (2.0 * h);
                assert!(
                    (fd - want).abs() <= 1e-5 + 1e-4 * fd.abs(),
                    "spec {spec:?}, input {which} element {i}: finite difference {fd}, analytic {want}"
                );
            }
        };
        check(0, &q, &dq);
        check(1, &k, &dk);
        check(2, &v, &dv);
    }
}

fn grad_tol(d: DType) -> Tolerance {
    Tolerance::attention_grad(d)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn flash_attention_backward_on_every_path(
        hkv in 1usize..3, group in 1usize..3, sq in 1usize..70, extra_kv in 0usize..150,
        bq in prop::sample::select(vec![8usize, 16, 32]), causal in any::<bool>(),
        window in proptest::option::of(1usize..48), softcap in proptest::option::of(5.0f32..30.0),
        bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let (b, d) = (1, 32);
        let h = hkv * group;
        let skv = sq + extra_kv;
        let bq = bq.max(8 * dtype.packing()).min(sq);
        let cfg = AttnConfig {
            causal, sm_scale: 1.0 / (d as f32).sqrt(), block_q: bq, block_k: 128.min(skv), window, softcap, dropout: None,
        };
        let q = Array::random(dtype, [b, h, sq, d], seed, -1.0, 1.0);
        let k = Array::random(dtype, [b, hkv, skv, d], seed + 1, -1.0, 1.0);
        let v = Array::random(dtype, [b, hkv, skv, d], seed + 2, -1.0, 1.0);
        let g = Array::random(dtype, [b, h, sq, d], seed + 3, -1.0, 1.0);
        let sp = spec(&cfg);
        let (o, lse) = reference::attention_full(&q, &k, &v, &sp);
        let (dq, dk, dv) = reference::attention_backward(&q, &k, &v, &g, &sp);
        let delta = reference::attention_delta(&o, &g);
        let o_arr = Array::new(dtype, [b, h, sq, d], o).unwrap();
        let lse_arr = Array::new(F32, [b, h, sq, 1], lse).unwrap();
        // delta from the (rounded) output the forward would have written.
        let delta_rounded = reference::attention_delta(o_arr.data(), &g);
        all_paths(
            kernels::attention::backward::attention_delta::build_for(dtype, bq, kernels::attention::backward::attention_delta::Dims { b, h, sq, d }),
            &[o_arr.clone(), g.clone()],
            vec![delta_rounded.clone()],
            &[Tolerance { abs: 1e-4, rel: 1e-4 }],
        )?;
        let _ = delta;
        let delta_arr = Array::new(F32, [b, h, sq, 1], delta_rounded).unwrap();
        all_paths(
            kernels::attention::backward::flash_attention_dq(&cfg, dtype, kernels::attention::backward::flash_attention_dq::Dims { b, h, hkv, sq, skv, d }),
            &[q.clone(), k.clone(), v.clone(), g.clone(), lse_arr.clone(), delta_arr.clone()],
            vec![dq],
            &[grad_tol(dtype)],
        )?;
        all_paths(
            kernels::attention::backward::flash_attention_dkv(&cfg, dtype, kernels::attention::backward::flash_attention_dkv::Dims { b, h, hkv, sq, skv, d }),
            &[q, k, v, g, lse_arr, delta_arr],
            vec![dk, dv],
            &[grad_tol(dtype)],
        )?;
    }
}

/// A random paged batch: each sequence's pages a slice of a random
/// permutation of the pool (with `spare` pages more), lengths from 0 (an
/// empty sequence, whose output is 0) to full; the kernel arguments in
/// order (lengths, tables, q, k pages, v pages), the f64 reference and the
/// pool size.
#[allow(clippy::too_many_arguments)]
fn paged_batch(
    b: usize,
    hkv: usize,
    g: usize,
    d: usize,
    page: usize,
    pages_per_seq: usize,
    spare: usize,
    dtype: DType,
    seed: u64,
) -> (Vec<Array>, Vec<f64>, usize) {
    let pool = b * pages_per_seq + spare;
    let mut rng = kernel_ir::SplitMix64(seed);
    let mut perm: Vec<usize> = (0..pool).collect();
    for i in (1..pool).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let tables: Vec<Vec<usize>> = (0..b)
        .map(|i| perm[i * pages_per_seq..(i + 1) * pages_per_seq].to_vec())
        .collect();
    let lengths: Vec<usize> = (0..b)
        .map(|_| rng.below(pages_per_seq * page + 1))
        .collect();
    let q = Array::random(dtype, [b, hkv, g, d], seed, -1.0, 1.0);
    let kp = Array::random(dtype, [hkv, pool, page, d], seed + 1, -1.0, 1.0);
    let vp = Array::random(dtype, [hkv, pool, page, d], seed + 2, -1.0, 1.0);
    let scale = 1.0 / (d as f64).sqrt();
    let want = reference::paged_decode_attention(&q, &kp, &vp, &lengths, &tables, scale);
    let lens =
        Array::from_elems([b], &lengths.iter().map(|&l| l as i32).collect::<Vec<_>>()).unwrap();
    let flat: Vec<i32> = tables.iter().flatten().map(|&p| p as i32).collect();
    let tab = Array::from_elems([b, pages_per_seq], &flat).unwrap();
    (vec![lens, tab, q, kp, vp], want, pool)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn paged_decode_attention_on_every_path(
        b in 1usize..4, hkv in 1usize..3, g in 1usize..4, page in prop::sample::select(vec![8usize, 16]),
        pages_per_seq in 1usize..5, spare in 0usize..4, bf in any::<bool>(), seed in any::<u64>(),
    ) {
        use kernels::attention::decode::{DecodeConfig, paged_decode_attention};
        let dtype = if bf { BF16 } else { F32 };
        let page = page.max(8 * dtype.packing());
        let d = 32;
        let (args, want, pool) = paged_batch(b, hkv, g, d, page, pages_per_seq, spare, dtype, seed);
        let scale = 1.0 / (d as f64).sqrt();
        let dims = kernels::attention::decode::paged_decode_attention::Dims {
            b, hkv, g, d, pages: pool, page, pages_per_seq,
        };
        all_paths(
            paged_decode_attention::build_for(dtype, &DecodeConfig { sm_scale: scale as f32 }, dims),
            &args,
            vec![want],
            &[out_tol(dtype)],
        )?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// The manual-DMA paged decode: random pools, tables, lengths from 0 to
    /// full and pages per step, on every CPU path (the interpreter checks
    /// every copy for races; the others run them as synchronous copies),
    /// and also under a random completion order of the copies that share a
    /// semaphore.
    #[test]
    fn paged_decode_attention_dma_on_every_path(
        b in 1usize..4, hkv in 1usize..3, g in 1usize..4, page in prop::sample::select(vec![8usize, 16]),
        blocks in 1usize..4, ppb in prop::sample::select(vec![1usize, 2, 4]), spare in 0usize..4,
        bf in any::<bool>(), seed in any::<u64>(),
    ) {
        use kernels::attention::decode_dma::{DecodeDmaConfig, paged_decode_attention_dma};
        let dtype = if bf { BF16 } else { F32 };
        let page = page.max(8 * dtype.packing());
        let (d, pages_per_seq) = (32, blocks * ppb);
        let (args, want, pool) = paged_batch(b, hkv, g, d, page, pages_per_seq, spare, dtype, seed);
        let scale = 1.0 / (d as f64).sqrt();
        let dims = kernels::attention::decode_dma::paged_decode_attention_dma::Dims {
            b, hkv, g, d, pages: pool, page, pages_per_seq,
        };
        let cfg = DecodeDmaConfig { sm_scale: scale as f32, pages_per_block: ppb };
        let k = paged_decode_attention_dma::build_for(dtype, &cfg, dims).unwrap();
        let shuffled = kernel_ir::InterpOptions { dma_seed: Some(seed), ..Default::default() };
        let out = kernel_ir::interpret_with(&k, &args, &shuffled).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let r = kernels::check::ErrorStats::between(&out[0], &want, out_tol(dtype));
        prop_assert!(r.passes(), "random completion order: {r}");
        all_paths(Ok(k), &args, vec![want], &[out_tol(dtype)])?;
    }
}

/// A block table entry outside the pool, in the manual-DMA decode: the
/// interpreter stops at the copy that would read outside `k_pages`, and
/// the library's input check refuses the table before any path runs (the
/// native paths clamp a copy's dynamic start into the array, as XLA's
/// `dynamic_slice` does, so they never read outside it).
#[test]
fn an_out_of_range_page_in_a_manual_copy_is_refused() {
    let e = kernels::find("paged_decode_attention_dma").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let k = e.build_at_default_shapes(&cfg).unwrap();
    let mut args = e.sample_inputs(&cfg, &k, 5);
    e.check_inputs(&cfg, &k, &args).unwrap();
    let (b, pps) = (args[1].shape()[0], args[1].shape()[1]);
    let mut table: Vec<i32> = args[1].data().iter().map(|&v| v as i32).collect();
    table[0] = 1000;
    args[1] = Array::from_elems([b, pps], &table).unwrap();
    // Sequence 0 needs its first page.
    let mut lens: Vec<i32> = args[0].data().iter().map(|&v| v as i32).collect();
    lens[0] = 1;
    args[0] = Array::from_elems([b], &lens).unwrap();
    let err = e.check_inputs(&cfg, &k, &args).unwrap_err().to_string();
    assert!(err.contains("block_tables"), "{err}");
    let err = kernel_ir::interpret(&k, &args).unwrap_err();
    assert!(
        matches!(err.kind, kernel_ir::ErrorKind::DynamicOutOfBounds { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("dma_start `k_pages`") && text.contains("1000"),
        "{text}"
    );
}
