//! Flash attention backward (FlashAttention-2 style), from the forward's
//! logsumexp and `delta = rowsum(dO ∘ O)`:
//!
//! * [`attention_delta`](mod@attention_delta): `delta` per query row;
//! * [`flash_attention_dq()`]: grid (batch, head, q block, k block); for each
//!   q block, `dq = scale · Σ_k dS·K` accumulated over k blocks;
//! * [`flash_attention_dkv()`]: grid (batch, kv head, k block, group head,
//!   q block); for each k block, `dV = Σ Pᵀ·dO` and `dK = scale · Σ dSᵀ·Q`
//!   accumulated over the query heads sharing the kv head (GQA) and all q
//!   blocks;
//! * [`flash_attention_dqkv()`]: all three in one pass over the
//!   dk/dv kernel's grid, `dq` of the kv head's query heads accumulated over
//!   the whole sequence in scratch: five products per step instead of the
//!   seven of the two kernels above (which each recompute the scores and
//!   `dO·Vᵀ`), at the price of sequential k blocks and `group · sq · d` f32
//!   of scratch.
//!
//! with `P = exp(S − lse)` recomputed from the scores and
//! `dS = P ∘ (dO·Vᵀ − delta)` (times `1 − tanh²` under a soft-cap). Blocks
//! the mask hides entirely are skipped, as in the forward pass; the padding
//! of ragged last blocks is zeroed before it can reach a product.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

use super::band::Band;
use super::{
    AttnConfig, DropMask, QueryKeys, ScoreRows, drop_mask, kept_scale, kv_rows, mask_scores,
    q_rows, raw_scores, visible_keys,
};

/// `delta = rowsum(dO ∘ O)` in f32, `[b, h, sq, 1]`.
#[tpu_kernel(grid = (b, h, kernel_ir::cdiv(sq, bq)), semantics = (parallel, parallel, parallel))]
pub fn attention_delta<T: Float>(
    bq: usize,
    #[shape(b, h, sq, d)]
    #[block([1, 1, bq, d], |bi, hi, i| (bi, hi, i, 0))]
    o: In<T>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, bq, d], |bi, hi, i| (bi, hi, i, 0))]
    d_o: In<T>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, bq, 1], |bi, hi, i| (bi, hi, i, 0))]
    delta: Out<f32>,
) {
    let prod = o.load((0, 0, .., ..)).cast::<f32>() * d_o.load((0, 0, .., ..)).cast::<f32>();
    delta.store((0, 0, .., ..), prod.sum_keep(1));
}

/// `P` and `dS` of one (q block, k block), laid out as `rows` says:
/// probabilities recomputed from the scores and the saved logsumexp (zero
/// where masked or padded), and the score gradient. `vb` has its padding
/// rows zeroed by the caller.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn probs_and_dscores(
    cfg: &AttnConfig,
    rows: ScoreRows,
    (sq, skv): (usize, usize),
    ins: Saved,
    (dob, vb): (Tile, Tile),
    (qi, ki): (Tile, Tile),
    kv_len: Option<Tile>,
) -> (Tile, Tile) {
    let Saved { q, k, .. } = ins;
    let lse = rows.per_query(ins.lse.load((0, 0, .., ..)));
    let delta = rows.per_query(ins.delta.load((0, 0, .., ..)));
    let raw = raw_scores(cfg, rows, q, k);
    let s = mask_scores(cfg, rows, raw, qi, ki);
    let p = (s - lse).exp();
    let mut dp = rows.outer(dob, vb);
    // What weighed v: p, or with dropout the forward's mask again (dropped
    // probabilities weighed nothing, kept ones were scaled).
    let mut weights = p;
    if let Some(d) = ins.drop {
        let (q_pos, k_pos) = rows.positions(cfg, qi, ki);
        let keep = kept_scale(d, q_pos, k_pos);
        dp *= keep;
        weights = p * keep;
    }
    let mut ds = p * (dp - delta);
    if let Some(cap) = cfg.softcap {
        let t = raw * (1.0 / cap);
        ds *= 1.0 - t * t;
    }
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    if cfg.masked() || kv_len.is_some() || !skv.is_multiple_of(bk) || !sq.is_multiple_of(bq) {
        // Exactly zero where hidden or padded (padding may hold anything,
        // and 0 · garbage is garbage), and past a valid kv length.
        let (q_pos, k_pos) = rows.positions(cfg, qi, ki);
        let mut keep = visible_keys(cfg, rows, qi, ki) && k_pos < skv as i32 && q_pos < sq as i32;
        if let Some(len) = kv_len {
            keep = keep && k_pos < len;
        }
        (select(keep, weights, 0.0), select(keep, ds, 0.0))
    } else {
        (weights, ds)
    }
}

/// Rows `≥ limit` of a block starting at `start · rows` set to 0.
#[kernel_fn]
pub(crate) fn zero_tail(x: Tile, start: Tile, rows: usize, limit: usize) -> Tile {
    if limit.is_multiple_of(rows) {
        x
    } else {
        let row = iota(I32, x.shape(), 0) + start * rows;
        select(row < limit as i32, x, 0.0)
    }
}

/// The windows both backward kernels read at one grid step: the forward's
/// inputs, the output cotangent, and what the forward saved (lse) and the
/// delta kernel computed.
#[derive(Clone, Copy)]
struct Saved {
    q: Ref,
    k: Ref,
    v: Ref,
    d_o: Ref,
    lse: Ref,
    delta: Ref,
    drop: Option<DropMask>,
}

/// One (q block, k block) step of `dq`, without the causal/window element
/// mask when the whole block is inside the band (as the forward kernel
/// does): on a GPU the loop then runs as two branch-free pieces,
/// the blocks left of the diagonal and the diagonal.
#[kernel_fn]
fn dq_step(
    cfg: &AttnConfig,
    dims: (usize, usize),
    ins: Saved,
    acc: Ref,
    (qi, ki): (Tile, Tile),
    kv_len: Option<Tile>,
) {
    if Band::of(cfg).block_inside(qi, ki, cfg.block_q, cfg.block_k) {
        dq_update(&cfg.unmasked(), dims, ins, acc, (qi, ki), kv_len);
    } else {
        dq_update(cfg, dims, ins, acc, (qi, ki), kv_len);
    }
}

/// [`dq_step`] under one mask.
#[kernel_fn]
fn dq_update(
    cfg: &AttnConfig,
    (sq, skv): (usize, usize),
    ins: Saved,
    acc: Ref,
    (qi, ki): (Tile, Tile),
    kv_len: Option<Tile>,
) {
    let vb = zero_tail(ins.v.load((0, 0, .., ..)), ki, cfg.block_k, skv);
    let kb = zero_tail(ins.k.load((0, 0, .., ..)), ki, cfg.block_k, skv);
    let dob = ins.d_o.load((0, 0, .., ..));
    let (_p, ds) = probs_and_dscores(
        cfg,
        ScoreRows::Queries,
        (sq, skv),
        ins,
        (dob, vb),
        (qi, ki),
        kv_len,
    );
    acc.store(
        ..,
        acc.load(..) + dot(ds.convert(kb.dtype()), kb) * cfg.sm_scale,
    );
}

/// One (k block, q block) step of `dk` and `dv`, and with `dq` (the
/// one-pass kernel's scratch and the step's query head within the group)
/// of `dq` too, from the same probabilities and score gradient; without
/// the element mask inside the band, as [`dq_step`].
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn dkv_step(
    cfg: &AttnConfig,
    dims: (usize, usize),
    ins: Saved,
    accs: (Ref, Ref),
    (qj, ki): (Tile, Tile),
    kv_len: Option<Tile>,
    dq: Option<(Ref, Tile)>,
) {
    if Band::of(cfg).block_inside(qj, ki, cfg.block_q, cfg.block_k) {
        dkv_update(&cfg.unmasked(), dims, ins, accs, (qj, ki), kv_len, dq);
    } else {
        dkv_update(cfg, dims, ins, accs, (qj, ki), kv_len, dq);
    }
}

/// [`dkv_step`] under one mask.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn dkv_update(
    cfg: &AttnConfig,
    (sq, skv): (usize, usize),
    ins: Saved,
    (dk_acc, dv_acc): (Ref, Ref),
    (qj, ki): (Tile, Tile),
    kv_len: Option<Tile>,
    dq: Option<(Ref, Tile)>,
) {
    let vb = zero_tail(ins.v.load((0, 0, .., ..)), ki, cfg.block_k, skv);
    let qb = zero_tail(ins.q.load((0, 0, .., ..)), qj, cfg.block_q, sq);
    let dob = zero_tail(ins.d_o.load((0, 0, .., ..)), qj, cfg.block_q, sq);
    // `P` and `dS` in the platform's layout ([`ScoreRows::for_dkv`]),
    // transposed into the products that need the other.
    let rows = ScoreRows::for_dkv();
    let (p, ds) = probs_and_dscores(cfg, rows, (sq, skv), ins, (dob, vb), (qj, ki), kv_len);
    dv_acc.store(
        ..,
        dv_acc.load(..) + dot(rows.with_key_rows(p.convert(dob.dtype())), dob),
    );
    let ds = ds.convert(qb.dtype());
    dk_acc.store(
        ..,
        dk_acc.load(..) + dot(rows.with_key_rows(ds), qb) * cfg.sm_scale,
    );
    if let Some((dq_acc, g)) = dq {
        let kb = zero_tail(ins.k.load((0, 0, .., ..)), ki, cfg.block_k, skv);
        let q_rows = (
            g,
            kernel_ir::prelude::ds(qj * cfg.block_q as i32, cfg.block_q),
            ..,
        );
        dq_acc.store(
            q_rows,
            dq_acc.load(q_rows) + dot(rows.with_query_rows(ds), kb) * cfg.sm_scale,
        );
    }
}

/// `dq` of flash attention: `[b, h, sq, d]`.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary),
    name = if with_len { "flash_attention_dq_kv_len" } else { "flash_attention_dq" },
    check = crate::attention::check_heads(h, hkv)
)]
pub fn flash_attention_dq<T: Float>(
    cfg: &AttnConfig,
    with_len: bool,
    #[operands] _: QueryKeys<T>,
    #[shape(b, h, sq, d)]
    #[block(q_rows(cfg, d))]
    d_o: In<T>,
    #[shape(b, h, sq, 1)]
    #[block(q_rows(cfg, 1))]
    lse: In<f32>,
    #[shape(b, h, sq, 1)]
    #[block(q_rows(cfg, 1))]
    delta: In<f32>,
    #[shape(b, h, sq, d)]
    #[block(q_rows(cfg, d))]
    dq: Out<T>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (qi, ki) = (program_id(2), program_id(3));
    let len = kv_len.load([0]);
    let drop = drop_mask(cfg, dropout_key, false, h, skv);
    if ki == 0 {
        acc.store(.., 0.0);
    }
    if cfg.key_blocks(qi, sq, len).contains(ki) {
        let ins = Saved {
            q,
            k,
            v,
            d_o,
            lse,
            delta,
            drop,
        };
        dq_step(cfg, (sq, skv), ins, acc, (qi, ki), len);
    }
    if ki == num_programs(3) - 1 {
        dq.store((0, 0, .., ..), acc.load(..).cast::<T>());
    }
}

/// [`flash_attention_dq()`] for a config, dtype and shapes.
pub fn flash_attention_dq(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dq::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dq::build_for(dtype, cfg, false, dims)
}

/// The dq kernel of [`crate::attention::flash_attention_kv_len()`]: keys at
/// or past the scalar-prefetched `kv_len[0]` are masked (and k blocks
/// past it skipped) as in that forward. Arguments: `kv_len`, then those
/// of [`flash_attention_dq()`].
pub fn flash_attention_dq_kv_len(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dq::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dq::build_for(dtype, cfg, true, dims)
}

/// The q block grid step (k block `i`, q block `j`) of `nq` fetches: its
/// own when it has work, else the nearest that has
/// ([`AttnConfig::query_blocks`] decides both), so a skipped step fetches nothing new.
pub(crate) fn q_block(
    cfg: &AttnConfig,
    (i, skv): (IndexExpr, usize),
    j: IndexExpr,
    nq: usize,
) -> IndexExpr {
    cfg.query_blocks(i, skv).clamp(j, nq)
}

/// The q-row operands' block (q, dO; lse and delta with `cols` 1) at dk/dv
/// grid step (batch, kv head, k block `i`, query head `g` of the group, q
/// block `j`): the group's `g`-th query head, the q block [`q_block`] picks.
fn group_q_rows(
    cfg: &AttnConfig,
    cols: usize,
    (h, hkv): (usize, usize),
    (sq, skv): (usize, usize),
) -> BlockMap<impl FnOnce([IndexExpr; 5]) -> (IndexExpr, IndexExpr, IndexExpr, i64) + '_> {
    BlockMap::new(
        [1, 1, cfg.block_q, cols],
        move |[bi, hk, i, g, j]: [IndexExpr; 5]| {
            let qb = q_block(cfg, (i, skv), j, kernel_ir::cdiv(sq, cfg.block_q));
            (bi, hk * crate::attention::group(h, hkv) + g, qb, 0)
        },
    )
}

/// The k-row operands' block (k, v, dk, dv) at a dk/dv grid step: the
/// step's own k block of its kv head.
fn k_rows(
    cfg: &AttnConfig,
    d: usize,
) -> BlockMap<impl FnOnce([IndexExpr; 5]) -> (IndexExpr, IndexExpr, IndexExpr, i64)> {
    BlockMap::new(
        [1, 1, cfg.block_k, d],
        |[bi, hk, i, _, _]: [IndexExpr; 5]| (bi, hk, i, 0),
    )
}

/// What the dk/dv and one-pass kernels read, tiled per kv head: the valid
/// key count (with `with_len`), k and v by [`k_rows`] (k column-major), and
/// the query-side operands (q, dO, lse, delta) of each of the kv head's
/// query heads by [`group_q_rows`].
#[operands]
struct KvHeadInputs<T> {
    #[present(with_len)]
    #[shape(1)]
    kv_len: Option<Prefetch>,
    #[present(cfg.dropout.is_some())]
    #[shape(2)]
    dropout_key: Option<Prefetch>,
    #[shape(b, h, sq, d)]
    #[block(group_q_rows(cfg, d, (h, hkv), (sq, skv)))]
    q: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    #[col_major]
    k: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    v: In<T>,
    #[shape(b, h, sq, d)]
    #[block(group_q_rows(cfg, d, (h, hkv), (sq, skv)))]
    d_o: In<T>,
    #[shape(b, h, sq, 1)]
    #[block(group_q_rows(cfg, 1, (h, hkv), (sq, skv)))]
    lse: In<f32>,
    #[shape(b, h, sq, 1)]
    #[block(group_q_rows(cfg, 1, (h, hkv), (sq, skv)))]
    delta: In<f32>,
}

/// `dk` and `dv` of flash attention: `[b, hkv, skv, d]` each, summed over
/// the query heads that share each kv head.
#[tpu_kernel(
    grid = (b, hkv, kernel_ir::cdiv(skv, cfg.block_k), crate::attention::group(h, hkv), kernel_ir::cdiv(sq, cfg.block_q)),
    semantics = (parallel, parallel, parallel, arbitrary, arbitrary),
    name = if with_len { "flash_attention_dkv_kv_len" } else { "flash_attention_dkv" },
    check = crate::attention::check_heads(h, hkv)
)]
pub fn flash_attention_dkv<T: Float>(
    cfg: &AttnConfig,
    with_len: bool,
    #[operands] _: KvHeadInputs<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    dk: Out<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    dv: Out<T>,
    #[shape(cfg.block_k, d)] dk_acc: Scratch<f32>,
    #[shape(cfg.block_k, d)] dv_acc: Scratch<f32>,
) {
    let (ki, g, qj) = (program_id(2), program_id(3), program_id(4));
    let len = kv_len.load([0]);
    let drop = drop_mask(cfg, dropout_key, true, h, skv);
    if g == 0 && qj == 0 {
        dk_acc.store(.., 0.0);
        dv_acc.store(.., 0.0);
    }
    if cfg.query_blocks(ki, skv).contains(qj) {
        let ins = Saved {
            q,
            k,
            v,
            d_o,
            lse,
            delta,
            drop,
        };
        dkv_step(cfg, (sq, skv), ins, (dk_acc, dv_acc), (qj, ki), len, None);
    }
    if g == num_programs(3) - 1 && qj == num_programs(4) - 1 {
        dk.store((0, 0, .., ..), dk_acc.load(..).cast::<T>());
        dv.store((0, 0, .., ..), dv_acc.load(..).cast::<T>());
    }
}

/// [`flash_attention_dkv()`] for a config, dtype and shapes.
pub fn flash_attention_dkv(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dkv::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dkv::build_for(dtype, cfg, false, dims)
}

/// The dk/dv kernel of [`crate::attention::flash_attention_kv_len()`]:
/// keys at or past `kv_len[0]` get zero gradients. Arguments: `kv_len`,
/// then those of [`flash_attention_dkv()`].
pub fn flash_attention_dkv_kv_len(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dkv::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dkv::build_for(dtype, cfg, true, dims)
}

/// `dq`, `dk` and `dv` of flash attention in one pass: grid (batch, kv
/// head, k block, group head, q block), as [`flash_attention_dkv()`], with
/// `dq` of the kv head's `group` query heads summed in an f32 scratch over
/// every k block and written once, at the kv head's last step. The k
/// blocks are therefore sequential (`arbitrary`); batch and kv heads stay
/// parallel.
#[tpu_kernel(
    grid = (b, hkv, kernel_ir::cdiv(skv, cfg.block_k), crate::attention::group(h, hkv), kernel_ir::cdiv(sq, cfg.block_q)),
    semantics = (parallel, parallel, arbitrary, arbitrary, arbitrary),
    name = if with_len { "flash_attention_dqkv_kv_len" } else { "flash_attention_dqkv" },
    check = crate::attention::check_heads(h, hkv)
)]
pub fn flash_attention_dqkv<T: Float>(
    cfg: &AttnConfig,
    with_len: bool,
    #[operands] _: KvHeadInputs<T>,
    #[shape(b, h, sq, d)]
    #[block([1, crate::attention::group(h, hkv), sq, d], |bi, hk, _, _, _| (bi, hk, 0, 0))]
    dq: Out<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    dk: Out<T>,
    #[shape(b, hkv, skv, d)]
    #[block(k_rows(cfg, d))]
    dv: Out<T>,
    #[shape(cfg.block_k, d)] dk_acc: Scratch<f32>,
    #[shape(cfg.block_k, d)] dv_acc: Scratch<f32>,
    #[shape(crate::attention::group(h, hkv), kernel_ir::cdiv(sq, cfg.block_q) * cfg.block_q, d)]
    dq_acc: Scratch<f32>,
) {
    let (ki, g, qj) = (program_id(2), program_id(3), program_id(4));
    let len = kv_len.load([0]);
    let drop = drop_mask(cfg, dropout_key, true, h, skv);
    if ki == 0 && g == 0 && qj == 0 {
        dq_acc.store(.., 0.0);
    }
    if g == 0 && qj == 0 {
        dk_acc.store(.., 0.0);
        dv_acc.store(.., 0.0);
    }
    if cfg.query_blocks(ki, skv).contains(qj) {
        let ins = Saved {
            q,
            k,
            v,
            d_o,
            lse,
            delta,
            drop,
        };
        let accs = (dk_acc, dv_acc);
        dkv_step(cfg, (sq, skv), ins, accs, (qj, ki), len, Some((dq_acc, g)));
    }
    if g == num_programs(3) - 1 && qj == num_programs(4) - 1 {
        dk.store((0, 0, .., ..), dk_acc.load(..).cast::<T>());
        dv.store((0, 0, .., ..), dv_acc.load(..).cast::<T>());
        if ki == num_programs(2) - 1 {
            dq.store((0, .., .., ..), dq_acc.load((.., 0..sq, ..)).cast::<T>());
        }
    }
}

/// [`flash_attention_dqkv()`] for a config, dtype and shapes (those of
/// [`flash_attention_dkv()`]); outputs `dq, dk, dv`.
pub fn flash_attention_dqkv(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dqkv::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dqkv::build_for(dtype, cfg, false, dims)
}

/// [`flash_attention_dqkv()`] for [`crate::attention::flash_attention_kv_len()`]:
/// keys at or past `kv_len[0]` get zero gradients and add nothing to `dq`.
/// Arguments: `kv_len`, then those of [`flash_attention_dqkv()`].
pub fn flash_attention_dqkv_kv_len(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_dqkv::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention_dqkv::build_for(dtype, cfg, true, dims)
}
