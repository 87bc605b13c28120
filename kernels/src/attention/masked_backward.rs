//! The backward of [`super::masked::masked_attention`](mod@super::masked::masked_attention), driven by the same
//! block tables as its forward:
//!
//! * [`masked_attention_dq`](mod@masked_attention_dq): grid (batch, head, q block, k block) over
//!   the forward's tables (`kind`, `fetch`, `mask_fetch`); `dq = scale ·
//!   Σ_k dS·K`;
//! * [`masked_attention_dkv`](mod@masked_attention_dkv): grid (batch, kv head, k block, group head,
//!   q block) over the transposed tables
//!   ([`super::block_table::BlockTables::transposed_arrays`]), whose fetch
//!   column names query blocks; `dV = Σ Pᵀ·dO`, `dK = scale · Σ dSᵀ·Q`
//!   summed over the query heads sharing the kv head.
//!
//! Both recompute `P = exp(S − lse)` where the mask, the segment ids and
//! the sequence ends leave a pair visible, and exactly 0 elsewhere (so a
//! dead row, whose lse is −∞, contributes nothing), and `dS = P ∘ (dO·Vᵀ −
//! delta)` (times `1 − tanh²` under a soft-cap), `delta` from
//! [`super::backward::attention_delta`](mod@super::backward::attention_delta). Empty steps compute nothing and
//! fetch nothing new.

use kernel_ir::prelude::*;

use super::backward::zero_tail;
use super::group;
use super::masked::{MaskedConfig, Segments, TablesQkv, visible_pairs};

/// What one backward step reads: the forward's inputs, the output
/// cotangent, the saved logsumexp and delta, the element mask and the
/// segment ids.
#[derive(Clone, Copy)]
struct Saved {
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    masks: Ref,
    q_seg: Ref,
    kv_seg: Ref,
}

/// `P` and `dS` of one computed (head `hi`, q block `qi`, k block `ki`) step, both
/// exactly 0 at hidden or padded pairs; also the q, k and dO blocks it
/// loaded, with their padding rows (past `sq`, `skv`) zeroed.
#[kernel_fn]
fn probs_and_dscores(
    cfg: &MaskedConfig,
    (sq, skv): (usize, usize),
    ins: Saved,
    step: Tile,
    (hi, qi, ki): (Tile, Tile, Tile),
) -> (Tile, Tile, Tile, Tile, Tile) {
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    let qb = zero_tail(ins.q.load((0, 0, .., ..)), qi, bq, sq);
    let dob = zero_tail(ins.d_o.load((0, 0, .., ..)), qi, bq, sq);
    let kb = zero_tail(ins.k.load((0, 0, .., ..)), ki, bk, skv);
    let vb = zero_tail(ins.v.load((0, 0, .., ..)), ki, bk, skv);
    let mut s = dot(qb, kb.t()) * cfg.sm_scale;
    if let Some(cap) = cfg.softcap {
        s = (s * (1.0 / cap)).tanh() * cap;
    }
    let visible = visible_pairs(
        cfg,
        (sq, skv),
        (ins.q_seg, ins.kv_seg, ins.masks),
        step,
        (hi, qi, ki),
    );
    let lse = ins.lse.load((0, 0, .., ..));
    let delta = ins.delta.load((0, 0, .., ..));
    let p = select(visible, (s - lse).exp(), 0.0);
    let mut ds = p * (dot(dob, vb.t()) - delta);
    if let Some(cap) = cfg.softcap {
        // d(cap · tanh(x / cap))/dx = 1 − tanh², from the capped scores.
        let t = s * (1.0 / cap);
        ds *= 1.0 - t * t;
    }
    (p, select(visible, ds, 0.0), qb, kb, dob)
}

/// `dq` of masked attention, `[b, h, sq, d]`. Arguments: the forward's
/// tables, `q`, `k`, `v`, `d_o`, `lse`, `delta`, `masks`, `q_seg`,
/// `kv_seg` (shapes as in [`super::masked::masked_attention`]).
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary),
    check = {
        crate::attention::check_heads(h, hkv)?;
        crate::attention::masked::check_tables(cfg, (h, nq, nk), (sq, skv), false)
    }
)]
pub fn masked_attention_dq<T: Float>(
    cfg: &MaskedConfig,
    #[operands] _: TablesQkv<T>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hi, i, _j| (bi, hi, i, 0))]
    d_o: In<T>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, cfg.block_q, 1], |bi, hi, i, _j| (bi, hi, i, 0))]
    lse: In<f32>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, cfg.block_q, 1], |bi, hi, i, _j| (bi, hi, i, 0))]
    delta: In<f32>,
    #[operands] _: Segments,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hi, i, _j| (bi, hi, i, 0))]
    dq: Out<T>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (hi, qi, ki) = (program_id(1), program_id(2), program_id(3));
    if ki == 0 {
        acc.store(.., 0.0);
    }
    let step = kind.load([hi, qi, ki]);
    if step != 0 {
        let ins = Saved {
            q,
            k,
            v,
            d_o,
            lse,
            delta,
            masks,
            q_seg,
            kv_seg,
        };
        let (_p, ds, _qb, kb, _dob) = probs_and_dscores(cfg, (sq, skv), ins, step, (hi, qi, ki));
        acc.store(
            ..,
            acc.load(..) + dot(ds.convert(kb.dtype()), kb) * cfg.sm_scale,
        );
    }
    if ki == num_programs(3) - 1 {
        dq.store((0, 0, .., ..), acc.load(..).cast::<T>());
    }
}

/// `dk` and `dv` of masked attention, `[b, hkv, skv, d]` each. Arguments:
/// the transposed tables (`kind_t`, `fetch_t`, `mask_fetch_t`, `[h, nk,
/// nq]`), then `q`, `k`, `v`, `d_o`, `lse`, `delta`, `masks`, `q_seg`,
/// `kv_seg` as for [`masked_attention_dq`].
#[tpu_kernel(
    grid = (b, hkv, kernel_ir::cdiv(skv, cfg.block_k), group(h, hkv), kernel_ir::cdiv(sq, cfg.block_q)),
    semantics = (parallel, parallel, parallel, arbitrary, arbitrary),
    check = {
        crate::attention::check_heads(h, hkv)?;
        crate::attention::masked::check_tables(cfg, (h, nk, nq), (sq, skv), true)
    }
)]
pub fn masked_attention_dkv<T: Float>(
    cfg: &MaskedConfig,
    #[shape(h, nk, nq)] kind_t: Prefetch,
    #[shape(h, nk, nq)] fetch_t: Prefetch,
    #[shape(h, nk, nq)] mask_fetch_t: Prefetch,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hk, i, g, j| (bi, hk * group(h, hkv) + g, fetch_t[(hk * group(h, hkv) + g, i, j)], 0))]
    q: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hk, i, _g, _j| (bi, hk, i, 0))]
    k: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hk, i, _g, _j| (bi, hk, i, 0))]
    v: In<T>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hk, i, g, j| (bi, hk * group(h, hkv) + g, fetch_t[(hk * group(h, hkv) + g, i, j)], 0))]
    d_o: In<T>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, cfg.block_q, 1], |bi, hk, i, g, j| (bi, hk * group(h, hkv) + g, fetch_t[(hk * group(h, hkv) + g, i, j)], 0))]
    lse: In<f32>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, cfg.block_q, 1], |bi, hk, i, g, j| (bi, hk * group(h, hkv) + g, fetch_t[(hk * group(h, hkv) + g, i, j)], 0))]
    delta: In<f32>,
    #[shape(n, cfg.block_q, cfg.block_k)]
    #[block([1, cfg.block_q, cfg.block_k], |_bi, hk, i, g, j| (mask_fetch_t[(hk * group(h, hkv) + g, i, j)], 0, 0))]
    masks: In<i32>,
    #[shape(b, sq, 1)]
    #[block([1, cfg.block_q, 1], |bi, hk, i, g, j| (bi, fetch_t[(hk * group(h, hkv) + g, i, j)], 0))]
    q_seg: In<i32>,
    #[shape(b, 1, skv)]
    #[block([1, 1, cfg.block_k], |bi, _hk, i, _g, _j| (bi, 0, i))]
    kv_seg: In<i32>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hk, i, _g, _j| (bi, hk, i, 0))]
    dk: Out<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hk, i, _g, _j| (bi, hk, i, 0))]
    dv: Out<T>,
    #[shape(cfg.block_k, d)] dk_acc: Scratch<f32>,
    #[shape(cfg.block_k, d)] dv_acc: Scratch<f32>,
) {
    let (hk, ki, g, qj) = (program_id(1), program_id(2), program_id(3), program_id(4));
    if g == 0 && qj == 0 {
        dk_acc.store(.., 0.0);
        dv_acc.store(.., 0.0);
    }
    let hi = hk * (h / hkv) + g;
    let step = kind_t.load([hi, ki, qj]);
    if step != 0 {
        let ins = Saved {
            q,
            k,
            v,
            d_o,
            lse,
            delta,
            masks,
            q_seg,
            kv_seg,
        };
        let (p, ds, qb, _kb, dob) = probs_and_dscores(cfg, (sq, skv), ins, step, (hi, qj, ki));
        dv_acc.store(.., dv_acc.load(..) + dot(p.convert(dob.dtype()).t(), dob));
        dk_acc.store(
            ..,
            dk_acc.load(..) + dot(ds.convert(qb.dtype()).t(), qb) * cfg.sm_scale,
        );
    }
    if g == num_programs(3) - 1 && qj == num_programs(4) - 1 {
        dk.store((0, 0, .., ..), dk_acc.load(..).cast::<T>());
        dv.store((0, 0, .., ..), dv_acc.load(..).cast::<T>());
    }
}
