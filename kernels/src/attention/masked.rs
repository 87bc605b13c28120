//! Attention with any mask (splash attention's model): the mask's block
//! tables ([`super::block_table`]) arrive by scalar prefetch; a step whose
//! block is empty computes nothing and its index maps name the block the
//! next computed step needs, a full block needs no element mask, and a
//! partial one reads its deduplicated element mask. Segment ids (packed
//! sequences) apply on top: a query sees only keys of its own segment.

use kernel_ir::prelude::*;
use kernel_ir::{Element, KernelErrors, VerifiedKernel};

use super::{MASK_VALUE, Online, group, online_softmax_finish, online_softmax_init, online_update};

/// Config of [`masked_attention()`].
#[derive(Clone, Debug, PartialEq)]
pub struct MaskedConfig {
    /// Scale of the scores, usually `1/√d`.
    pub sm_scale: f32,
    /// Logit soft-cap: `s ← cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Query rows per block (the tables' `bq`).
    pub block_q: usize,
    /// Keys per block (the tables' `bk`).
    pub block_k: usize,
}

/// Forward over `[b, h, sq, d]` queries and `[b, hkv, skv, d]` keys and
/// values, driven by the tables of an `h`-head mask at `block_q` ×
/// `block_k`: `kind`, `fetch`, `mask_fetch` (`[h, nq, nk]` i32) and the
/// element masks `masks` (`[n, bq, bk]` i32, nonzero visible); segment ids
/// `q_seg: [b, sq, 1]`, `kv_seg: [b, 1, skv]` (i32). Outputs `o` and
/// `lse: [b, h, sq, 1]`; a row with no visible key gives 0 and −∞.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary)
)]
pub fn masked_attention<T: Element>(
    cfg: &MaskedConfig,
    #[shape(h, nq, nk)] kind: Prefetch,
    #[shape(h, nq, nk)] fetch: Prefetch,
    #[shape(h, nq, nk)] mask_fetch: Prefetch,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hi, i, _j| (bi, hi, i, 0))]
    q: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hi, i, j| (bi, hi / group(h, hkv), fetch[(hi, i, j)], 0))]
    k: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hi, i, j| (bi, hi / group(h, hkv), fetch[(hi, i, j)], 0))]
    v: In<T>,
    #[shape(n, cfg.block_q, cfg.block_k)]
    #[block([1, cfg.block_q, cfg.block_k], |_bi, hi, i, j| (mask_fetch[(hi, i, j)], 0, 0))]
    masks: In<i32>,
    #[shape(b, sq, 1)]
    #[block([1, cfg.block_q, 1], |bi, _hi, i, _j| (bi, i, 0))]
    q_seg: In<i32>,
    #[shape(b, 1, skv)]
    #[block([1, 1, cfg.block_k], |bi, hi, i, j| (bi, 0, fetch[(hi, i, j)]))]
    kv_seg: In<i32>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hi, i, _j| (bi, hi, i, 0))]
    o: Out<T>,
    #[shape(b, h, sq, 1)]
    #[block([1, 1, cfg.block_q, 1], |bi, hi, i, _j| (bi, hi, i, 0))]
    lse: Out<f32>,
    #[shape(cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    let (hi, qi, ki) = (program_id(1), program_id(2), program_id(3));
    let st = Online { m, l, acc };
    if ki == 0 {
        online_softmax_init(st);
    }
    let step = kind.load([hi, qi, ki]);
    if step != 0 {
        let mut s = dot(q.load((0, 0, .., ..)), k.load((0, 0, .., ..)).t()) * cfg.sm_scale;
        if let Some(cap) = cfg.softcap {
            s = (s * (1.0 / cap)).tanh() * cap;
        }
        // Segment ids of the last block's padding are garbage: cleared
        // before they meet the queries'.
        let kseg_pos = iota(I32, [1, bk], 1) + ki * bk;
        let kseg = select(kseg_pos < skv as i32, kv_seg.load((0, .., ..)), -1);
        let same = q_seg.load((0, .., ..)).broadcast_to([bq, bk]) == kseg.broadcast_to([bq, bk]);
        // A full block (kind 2) needs no element mask.
        let elem = masks.load((0, .., ..)) != 0;
        let k_pos = iota(I32, [bq, bk], 1) + ki * bk;
        let visible = same & (elem | (step == 2)) & (k_pos < skv as i32);
        s = select(visible, s, MASK_VALUE);
        let mut vb = v.load((0, 0, .., ..));
        if !skv.is_multiple_of(bk) {
            // The last k block's padding must not reach the output.
            let row = iota(I32, vb.shape(), 0) + ki * bk;
            vb = select(row < skv as i32, vb, 0.0);
        }
        online_update(bq, st, s, vb);
    }
    if ki == num_programs(3) - 1 {
        online_softmax_finish(st, o, lse);
    }
}

/// The kernel for a config, dtype and shapes (see [`masked_attention`]'s
/// docs for the arguments).
pub fn masked_attention(
    cfg: &MaskedConfig,
    dtype: DType,
    dims: masked_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    super::check_heads(dims.h, dims.hkv)?;
    with_float!("masked_attention", dtype, T => masked_attention::build::<T>(cfg, dims))
}
