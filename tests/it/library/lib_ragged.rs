//! Ragged paged attention on every CPU path against its f64 reference:
//! random mixed batches (prefills, decodes, sequences with no new token,
//! padding tokens), GQA, windows and soft-caps, pages per step; and the
//! schedule and its input checks.

use kernel_ir::prelude::*;
use kernels::attention::ragged::{
    RaggedBatch, RaggedConfig, ragged_metadata, ragged_paged_attention, reference, visits,
};
use kernels::check::{ErrorStats, Tolerance};
use proptest::prelude::*;

use crate::common::all_paths;

fn ints(shape: Vec<usize>, v: &[usize]) -> Array {
    Array::new(I32, shape, v.iter().map(|&x| x as f64).collect()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn ragged_paged_attention_on_every_path(
        seqs in 1usize..5, hkv in 1usize..3, g in 1usize..3, blocks in 1usize..4,
        ppb in prop::sample::select(vec![1usize, 2]), kv_blocks in 1usize..3,
        window in prop::option::of(1usize..40), softcap in prop::option::of(5.0f64..50.0),
        bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let (bq, page, d) = (8 * dtype.packing(), 8 * dtype.packing(), 32);
        let t = blocks * bq;
        let pps = kv_blocks * ppb;
        let cap = pps * page;
        let mut rng = kernel_ir::SplitMix64(seed);
        // Query lengths: decodes (1), prefills (many), none; at most t.
        let mut cu = vec![0usize];
        let mut kv = Vec::new();
        for s in 0..seqs {
            let want = match rng.below(3) { 0 => 1, 1 => 1 + rng.below(cap), _ => rng.below(2) };
            let ql = want.min(t - cu[s]).min(cap);
            cu.push(cu[s] + ql);
            kv.push(ql + rng.below(cap - ql + 1));
        }
        let pool = seqs * pps + rng.below(3);
        let mut perm: Vec<usize> = (0..pool).collect();
        for i in (1..pool).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let tables: Vec<Vec<usize>> = (0..seqs).map(|s| perm[s * pps..(s + 1) * pps].to_vec()).collect();
        let meta = ragged_metadata(&cu, t, bq);
        prop_assert_eq!(meta.seq_ids.len(), visits(t, bq, seqs));
        let h = hkv * g;
        let q = Array::random(dtype, [h, t, d], seed, -1.0, 1.0);
        let kp = Array::random(dtype, [hkv, pool, page, d], seed + 1, -1.0, 1.0);
        let vp = Array::random(dtype, [hkv, pool, page, d], seed + 2, -1.0, 1.0);
        let scale = 1.0 / (d as f64).sqrt();
        let cfg = RaggedConfig { sm_scale: scale as f32, block_q: bq, pages_per_block: ppb, window, softcap: softcap.map(|c| c as f32) };
        let batch = RaggedBatch { cu_q_lens: &cu, kv_lens: &kv, tables: &tables };
        let want = reference(&q, (&kp, &vp), &batch, &cfg);
        let flat: Vec<usize> = tables.iter().flatten().copied().collect();
        let to_i32 = |v: &[i32]| v.iter().map(|&x| x as usize).collect::<Vec<_>>();
        let args = [
            ints(vec![seqs + 1], &cu),
            ints(vec![seqs], &kv),
            ints(vec![seqs, pps], &flat),
            ints(vec![meta.seq_ids.len()], &to_i32(&meta.seq_ids)),
            ints(vec![meta.qblk_ids.len()], &to_i32(&meta.qblk_ids)),
            q, kp, vp,
        ];
        let dims = kernels::attention::ragged::ragged_paged_attention::Dims {
            seqs_plus_one: seqs + 1, seqs, pages_per_seq: pps, visits: meta.seq_ids.len(),
            h, t, d, hkv, pages: pool, page,
        };
        let tol = Tolerance::attention(dtype);
        let k = ragged_paged_attention::build_for(dtype, &cfg, dims).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let shuffled = kernel_ir::InterpOptions { dma_seed: Some(seed), ..Default::default() };
        let out = kernel_ir::interpret_with(&k, &args, &shuffled).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let r = ErrorStats::between(&out[0], &want, tol);
        prop_assert!(r.passes(), "random completion order: {r}");
        all_paths(Ok(k), &args, vec![want], &[tol])?;
    }
}

/// The reference is what attention means: one decode token attends to its
/// whole context, a prefill's first token to itself only, padding is 0.
#[test]
fn the_reference_attends_causally_within_each_sequence() {
    let (d, page) = (4, 4);
    // Sequence 0: a 2-token prefill (kv 2); sequence 1: a decode with 3
    // tokens of context before it (kv 4). One padding token.
    let cu = [0, 2, 3];
    let kv = [2, 4];
    let tables = vec![vec![0], vec![1]];
    let q = Array::random(F32, [1, 4, d], 1, -1.0, 1.0);
    let kp = Array::random(F32, [1, 2, page, d], 2, -1.0, 1.0);
    let vp = Array::random(F32, [1, 2, page, d], 3, -1.0, 1.0);
    let batch = RaggedBatch {
        cu_q_lens: &cu,
        kv_lens: &kv,
        tables: &tables,
    };
    let mut cfg = RaggedConfig {
        sm_scale: 1.0,
        block_q: 8,
        pages_per_block: 1,
        window: None,
        softcap: None,
    };
    let out = reference(&q, (&kp, &vp), &batch, &cfg);
    // Token 0 sees key 0 of page 0 only: its output is that value row.
    for (o, v) in out[..d].iter().zip(vp.data()) {
        assert!((o - v).abs() < 1e-12);
    }
    // Token 2 (the decode) sees all 4 keys of page 1: a convex mix.
    let row = &out[2 * d..3 * d];
    for (x, &r) in row.iter().enumerate() {
        let vals: Vec<f64> = (0..4).map(|j| vp.data()[(page + j) * d + x]).collect();
        let (lo, hi) = vals
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        assert!(r >= lo - 1e-12 && r <= hi + 1e-12);
    }
    // A window of 1: every token sees only itself.
    cfg.window = Some(1);
    let out = reference(&q, (&kp, &vp), &batch, &cfg);
    for x in 0..d {
        assert!((out[2 * d + x] - vp.data()[(page + 3) * d + x]).abs() < 1e-12);
    }
    assert!(out[3 * d..].iter().all(|&v| v == 0.0), "padding is 0");
}

/// A schedule that is not `ragged_metadata`'s, lengths that do not fit, or
/// pages outside the pool are refused before anything runs.
#[test]
fn bad_batches_are_input_errors() {
    let e = kernels::find("ragged_paged_attention").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let k = e.build_at_default_shapes(&cfg).unwrap();
    let good = e.sample_inputs(&cfg, &k, 9);
    e.check_inputs(&cfg, &k, &good).unwrap();
    let edit = |i: usize, f: &dyn Fn(&mut Vec<f64>)| {
        let mut a = good.clone();
        let mut v = a[i].data().to_vec();
        f(&mut v);
        a[i] = Array::new(I32, a[i].shape().to_vec(), v).unwrap();
        e.check_inputs(&cfg, &k, &a).unwrap_err().to_string()
    };
    assert!(edit(3, &|v| v[0] = (v[0] + 1.0) % 4.0).contains("ragged_metadata"));
    assert!(edit(0, &|v| v[1] = 1000.0).contains("cu_q_lens must rise"));
    assert!(edit(1, &|v| v[0] = 10_000.0).contains("kv_lens[0]"));
    assert!(edit(2, &|v| v[0] = -1.0).contains("page_tables"));
    let m = ragged_metadata(&[0, 20, 21, 22], 32, 16);
    assert_eq!(
        (m.seq_ids, m.qblk_ids),
        (vec![0, 0, 1, 2], vec![0, 1, 1, 1])
    );
}

/// The variant that writes the step's new keys and values into the cache
/// first: the pools come back with exactly the new rows written (every
/// other slot untouched) and the output attends over them, on every path,
/// for sampled mixed batches (prefills and decodes, GQA), windowed and
/// soft-capped too, f32 and bf16.
#[test]
fn the_fused_cache_write_updates_the_pools_and_attends_over_them() {
    let e = kernels::find("ragged_paged_attention_update").unwrap();
    for (seed, config) in [
        (1, vec![]),
        (2, vec![("dtype", "bf16")]),
        (3, vec![("window", "24"), ("softcap", "30")]),
    ] {
        let pairs: Vec<(String, String)> = config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let cfg = kernels::Config::parse(e, &pairs).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        let inputs = e.sample_inputs(&cfg, &k, seed);
        e.check_inputs(&cfg, &k, &inputs).unwrap();
        let wants = e.reference(&cfg, &inputs).unwrap();
        // The written rows differ from the old pool's (else the check
        // below proves nothing).
        assert_ne!(wants[0], inputs[8].data(), "seed {seed}: nothing written");
        let tols = e.tolerances(&cfg, &k);
        all_paths(Ok(k), &inputs, wants, &tols).unwrap();
    }
}

/// Two sequences writing one slot, or one reading a slot another writes
/// in the same step, are input errors naming the fix.
#[test]
fn a_slot_written_by_two_sequences_is_an_input_error() {
    let e = kernels::find("ragged_paged_attention_update").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let k = e.build_at_default_shapes(&cfg).unwrap();
    let mut a = e.sample_inputs(&cfg, &k, 4);
    e.check_inputs(&cfg, &k, &a).unwrap();
    // Every sequence's pages made sequence 0's.
    let pps = a[2].shape()[1];
    let first: Vec<f64> = a[2].data()[..pps].to_vec();
    let shared: Vec<f64> = first.iter().cycle().take(a[2].len()).cloned().collect();
    a[2] = Array::new(I32, a[2].shape().to_vec(), shared).unwrap();
    let err = e.check_inputs(&cfg, &k, &a).unwrap_err().to_string();
    assert!(
        err.contains("pages of their own") || err.contains("belong to one sequence"),
        "{err}"
    );
}
