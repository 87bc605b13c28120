//! Steps that the attention kernels skip fetch nothing new: every K/V (or,
//! for dk/dv, Q) block the interpreter's pipeline fetches is one that a
//! computed step of that sweep needs. The need is decided here from the
//! f64 reference's visibility rule (`AttnSpec::visible`) on positions, not
//! from the kernels' block geometry, for causal, window and valid-length
//! masks and their mixes.

use kernel_ir::prelude::*;
use kernel_ir::{FetchTrace, InterpOptions, interpret_traced};
use kernels::attention::backward::{flash_attention_dkv, flash_attention_dq};
use kernels::attention::{AttnConfig, flash_attention, flash_attention_kv_len};
use kernels::reference::AttnSpec;
use proptest::prelude::*;

/// Whether any (query in q block `qb`, key in k block `kb`) pair is
/// visible.
fn needed(
    spec: &AttnSpec,
    qb: usize,
    kb: usize,
    bq: usize,
    bk: usize,
    sq: usize,
    skv: usize,
) -> bool {
    (qb * bq..((qb + 1) * bq).min(sq))
        .any(|i| (kb * bk..((kb + 1) * bk).min(skv)).any(|j| spec.visible(i, j)))
}

/// Checks the fetches of `operand`, whose block index along the sequence
/// is `block_dim`, in sweeps keyed by grid dims `sweep` with `fixed(point)`
/// the block of the other side: every fetch is of a needed block, or the
/// sweep needs none (then one fetch at most). Returns the fetch count.
fn check_fetches(
    trace: &FetchTrace,
    operand: &str,
    block_dim: usize,
    fixed: impl Fn(&[i64]) -> usize,
    need: impl Fn(usize, usize) -> bool,
    n_blocks: usize,
) -> usize {
    let mut count = 0;
    let mut per_sweep: std::collections::HashMap<Vec<i64>, usize> = Default::default();
    for f in trace.of(operand) {
        count += 1;
        let other = fixed(&f.point);
        let blk = f.block[block_dim] as usize;
        let any_needed = (0..n_blocks).any(|b| need(other, b));
        assert!(
            need(other, blk) || !any_needed,
            "`{operand}` fetched block {blk} at grid step {:?}, which no computed step of block {other} needs",
            f.point
        );
        *per_sweep
            .entry(f.point[..f.point.len() - 1].to_vec())
            .or_default() += 1;
        if !any_needed {
            assert!(
                per_sweep[&f.point[..f.point.len() - 1]] <= 1,
                "{operand}: an empty sweep fetched twice"
            );
        }
    }
    count
}

fn attn_inputs(
    b: usize,
    h: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    d: usize,
    seed: u64,
) -> Vec<Array> {
    vec![
        Array::random(F32, [b, h, sq, d], seed, -1.0, 1.0),
        Array::random(F32, [b, hkv, skv, d], seed + 1, -1.0, 1.0),
        Array::random(F32, [b, hkv, skv, d], seed + 2, -1.0, 1.0),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn skipped_forward_and_dq_steps_fetch_nothing_new(
        sq in 8usize..400, skv in 100usize..450,
        bq in prop::sample::select(vec![8usize, 16, 32]),
        causal in any::<bool>(), window in proptest::option::of(1usize..200),
        kv_len in proptest::option::of(0usize..460), seed in any::<u64>(),
    ) {
        // K is column-major: its key blocks are 128 lanes (or all keys).
        let (b, h, hkv, d) = (1, 2, 1, 32);
        let (bq, bk) = (bq.min(sq), 128.min(skv));
        let cfg = AttnConfig { causal, sm_scale: 0.2, block_q: bq, block_k: bk, window, softcap: None, dropout: None };
        let dims = kernels::attention::flash_attention::Dims { b, h, hkv, sq, skv, d };
        let kv_len = kv_len.map(|l| l.min(skv));
        let spec = AttnSpec { causal, scale: 0.2, window, softcap: None, kv_len };
        let mut args = attn_inputs(b, h, hkv, sq, skv, d, seed);
        let kernel = match kv_len {
            Some(l) => {
                args.insert(0, Array::new(I32, [1], vec![l as f64]).unwrap());
                flash_attention_kv_len(&cfg, F32, dims)
            }
            None => flash_attention(&cfg, F32, dims),
        }.unwrap();
        let (_, trace) = interpret_traced(&kernel, &args, &InterpOptions::default()).unwrap();
        let nk = skv.div_ceil(bk);
        let need = |qb: usize, kb: usize| needed(&spec, qb, kb, bq, bk, sq, skv);
        for op in ["k", "v"] {
            let n = check_fetches(&trace, op, 2, |p| p[2] as usize, need, nk);
            // At most one fetch per needed (q block, k block) pair, plus
            // one per sweep that needs none.
            let pairs: usize = (0..sq.div_ceil(bq))
                .map(|qb| (0..nk).filter(|&kb| need(qb, kb)).count().max(1))
                .sum::<usize>() * b * h;
            prop_assert!(n <= pairs, "{op}: {n} fetches for {pairs} needed blocks");
        }

        // dq has the forward's grid and K/V maps (no valid length).
        if kv_len.is_none() {
            let dq = flash_attention_dq(&cfg, F32, kernels::attention::backward::flash_attention_dq::Dims { b, h, hkv, sq, skv, d }).unwrap();
            let mut dq_args = attn_inputs(b, h, hkv, sq, skv, d, seed);
            dq_args.push(Array::random(F32, [b, h, sq, d], seed + 3, -1.0, 1.0));
            dq_args.push(Array::random(F32, [b, h, sq, 1], seed + 4, 0.0, 1.0));
            dq_args.push(Array::random(F32, [b, h, sq, 1], seed + 5, -1.0, 1.0));
            let (_, trace) = interpret_traced(&dq, &dq_args, &InterpOptions::default()).unwrap();
            check_fetches(&trace, "k", 2, |p| p[2] as usize, need, nk);
        }
    }

    #[test]
    fn skipped_dkv_steps_fetch_nothing_new(
        sq in 8usize..300, skv in 100usize..300,
        bq in prop::sample::select(vec![16usize, 32, 64]),
        causal in any::<bool>(), window in proptest::option::of(1usize..200), seed in any::<u64>(),
    ) {
        let (b, h, hkv, d) = (1, 1, 1, 32);
        let (bq, bk) = (bq.min(sq), 128.min(skv));
        let cfg = AttnConfig { causal, sm_scale: 0.2, block_q: bq, block_k: bk, window, softcap: None, dropout: None };
        let spec = AttnSpec { causal, scale: 0.2, window, softcap: None, kv_len: None };
        let k = flash_attention_dkv(&cfg, F32, kernels::attention::backward::flash_attention_dkv::Dims { b, h, hkv, sq, skv, d }).unwrap();
        let mut args = attn_inputs(b, h, hkv, sq, skv, d, seed);
        args.push(Array::random(F32, [b, h, sq, d], seed + 3, -1.0, 1.0));
        args.push(Array::random(F32, [b, h, sq, 1], seed + 4, 0.0, 1.0));
        args.push(Array::random(F32, [b, h, sq, 1], seed + 5, -1.0, 1.0));
        let (_, trace) = interpret_traced(&k, &args, &InterpOptions::default()).unwrap();
        // Grid (b, hkv, k block, group head, q block): the sweep over q
        // blocks belongs to k block p[2].
        let need = |kb: usize, qb: usize| needed(&spec, qb, kb, bq, bk, sq, skv);
        for op in ["q", "d_o", "lse", "delta"] {
            check_fetches(&trace, op, 2, |p| p[2] as usize, need, sq.div_ceil(bq));
        }
    }
}

/// The trace counts what it should: a plain (unmasked) forward fetches
/// every K block of every sweep once, and a causal one only those at or
/// before the diagonal.
#[test]
fn the_trace_counts_block_changes() {
    let (b, h, hkv, sq, skv, d) = (1, 1, 1, 512, 512, 32);
    let dims = kernels::attention::flash_attention::Dims {
        b,
        h,
        hkv,
        sq,
        skv,
        d,
    };
    let args = attn_inputs(b, h, hkv, sq, skv, d, 1);
    let mut cfg = AttnConfig {
        causal: false,
        sm_scale: 0.2,
        block_q: 128,
        block_k: 128,
        window: None,
        softcap: None,
        dropout: None,
    };
    let plain = flash_attention(&cfg, F32, dims).unwrap();
    let (_, t) = interpret_traced(&plain, &args, &InterpOptions::default()).unwrap();
    assert_eq!(t.of("k").count(), 4 * 4);
    assert_eq!(t.of("q").count(), 4);
    cfg.causal = true;
    let causal = flash_attention(&cfg, F32, dims).unwrap();
    let (_, t) = interpret_traced(&causal, &args, &InterpOptions::default()).unwrap();
    // Sweep i needs k blocks 0..=i and maps the steps after i to block i:
    // [0 0 0 0] [0 1 1 1] [0 1 2 2] [0 1 2 3]. A fetch is a change from
    // the step before: 1 + 1 (0 stays) + 3 + 4.
    assert_eq!(t.of("k").count(), 9);
}
