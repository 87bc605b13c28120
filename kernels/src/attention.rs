//! Flash attention, forward: softmax(q·kᵀ·scale)·v without ever forming the
//! whole score matrix.
//!
//! The grid walks (batch, head, q block, k block); the k dim is `arbitrary`
//! and carries an online softmax in scratch: the running row max `m`, the
//! running denominator `l` and the unnormalized output `acc`. Each k block
//! rescales what was accumulated by `exp(m_prev − m_new)`. With `causal`,
//! blocks entirely above the diagonal are skipped, not computed.
//!
//! K is given a column-major hint: each head's `[s, d]` matrix is stored as
//! kᵀ, the layout the MXU wants for `q·kᵀ`, so its block's lane dim is the
//! key dim.

use kernel_ir::prelude::*;
use kernel_ir::{Element, KernelErrors, VerifiedKernel};

/// Config of [`flash_attention()`].
#[derive(Clone, Debug, PartialEq)]
pub struct AttnConfig {
    /// Query `i` attends to keys `j ≤ i` only.
    pub causal: bool,
    /// Scale of the scores, usually `1/√d`.
    pub sm_scale: f32,
    /// Query rows per block.
    pub block_q: usize,
    /// Keys per block.
    pub block_k: usize,
}

/// Added to masked scores: far below any real score, yet finite so that a
/// row never computes `−∞ − (−∞)`.
pub const MASK_VALUE: f32 = -1e30;

/// One k block of the online softmax for one q block: scores, mask, new
/// running max and sum, rescaled accumulator.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn attend_block(
    cfg: &AttnConfig,
    q: Ref,
    k: Ref,
    v: Ref,
    m: Ref,
    l: Ref,
    acc: Ref,
    qi: Tile,
    ki: Tile,
) {
    let vb = v.load((0, 0, .., ..));
    let s = block_scores(cfg, q, k, qi, ki);
    online_softmax_update(cfg, m, l, acc, s, vb);
}

/// Scaled scores of one (q block, k block), causal mask applied.
#[kernel_fn]
fn block_scores(cfg: &AttnConfig, q: Ref, k: Ref, qi: Tile, ki: Tile) -> Tile {
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    // The MXU multiplies in the input dtype and accumulates in f32.
    let mut s = dot(q.load((0, 0, .., ..)), k.load((0, 0, .., ..)).t()) * cfg.sm_scale;
    if cfg.causal {
        let q_pos = iota(I32, [bq, bk], 0) + qi * bq;
        let k_pos = iota(I32, [bq, bk], 1) + ki * bk;
        s = select(k_pos <= q_pos, s, MASK_VALUE);
    }
    s
}

/// The online-softmax step: new running max and sum, rescaled accumulator.
#[kernel_fn]
fn online_softmax_update(cfg: &AttnConfig, m: Ref, l: Ref, acc: Ref, s: Tile, vb: Tile) {
    let bq = cfg.block_q;
    let m_prev = m.load((.., 0..1));
    let l_prev = l.load((.., 0..1));
    let m_new = m_prev.max(s.max_keep(1));
    let p = (s - m_new).exp();
    let alpha = (m_prev - m_new).exp();
    acc.store(.., acc.load(..) * alpha + dot(p.convert(vb.dtype()), vb));
    m.store(.., m_new.broadcast_to([bq, 128]));
    l.store(.., (l_prev * alpha + p.sum_keep(1)).broadcast_to([bq, 128]));
}

/// Flash attention forward over `[batch, heads, seq, head_dim]` arrays.
#[tpu_kernel(
    grid = (b, h, sq / cfg.block_q, skv / cfg.block_k),
    semantics = (parallel, parallel, parallel, arbitrary)
)]
pub fn flash_attention<T: Element>(
    cfg: &AttnConfig,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |b, h, i, _| (b, h, i, 0))]
    q: In<T>,
    #[shape(b, h, skv, d)]
    #[block([1, 1, cfg.block_k, d], |b, h, _, j| (b, h, j, 0))]
    #[col_major]
    k: In<T>,
    #[shape(b, h, skv, d)]
    #[block([1, 1, cfg.block_k, d], |b, h, _, j| (b, h, j, 0))]
    v: In<T>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |b, h, i, _| (b, h, i, 0))]
    o: Out<T>,
    #[shape(cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (qi, ki) = (program_id(2), program_id(3));
    if ki == 0 {
        m.store(.., f32::NEG_INFINITY);
        l.store(.., 0.0);
        acc.store(.., 0.0);
    }
    if cfg.causal {
        // Skip k blocks that start after this q block's last row.
        if ki * cfg.block_k < (qi + 1) * cfg.block_q {
            attend_block(cfg, q, k, v, m, l, acc, qi, ki);
        }
    } else {
        attend_block(cfg, q, k, v, m, l, acc, qi, ki);
    }
    if ki == num_programs(3) - 1 {
        let out = acc.load(..) / l.load((.., 0..1));
        o.store((0, 0, .., ..), out.cast::<T>());
    }
}

/// Flash attention over keys padded to a bucket: keys at or past
/// `kv_len[0]` are masked out, and k blocks that start past it are skipped
/// (the graph runtime passes the valid length of a bucketed sequence as
/// this scalar-prefetch operand). Queries past it compute finite garbage,
/// which the caller ignores.
#[tpu_kernel(
    grid = (b, h, sq / cfg.block_q, skv / cfg.block_k),
    semantics = (parallel, parallel, parallel, arbitrary)
)]
pub fn flash_attention_kv_len<T: Element>(
    cfg: &AttnConfig,
    #[shape(1)] kv_len: Prefetch,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |b, h, i, _| (b, h, i, 0))]
    q: In<T>,
    #[shape(b, h, skv, d)]
    #[block([1, 1, cfg.block_k, d], |b, h, _, j| (b, h, j, 0))]
    #[col_major]
    k: In<T>,
    #[shape(b, h, skv, d)]
    #[block([1, 1, cfg.block_k, d], |b, h, _, j| (b, h, j, 0))]
    v: In<T>,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |b, h, i, _| (b, h, i, 0))]
    o: Out<T>,
    #[shape(cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (qi, ki) = (program_id(2), program_id(3));
    let len = kv_len.load([0]);
    if ki == 0 {
        m.store(.., f32::NEG_INFINITY);
        l.store(.., 0.0);
        acc.store(.., 0.0);
    }
    let start = ki * cfg.block_k;
    let mut live = start < len;
    if cfg.causal {
        live = live && start < (qi + 1) * cfg.block_q;
    }
    if live {
        let vb = v.load((0, 0, .., ..));
        let s = block_scores(cfg, q, k, qi, ki);
        let k_pos = iota(I32, [cfg.block_q, cfg.block_k], 1) + start;
        let s = select(k_pos < len, s, MASK_VALUE);
        online_softmax_update(cfg, m, l, acc, s, vb);
    }
    if ki == num_programs(3) - 1 {
        let out = acc.load(..) / l.load((.., 0..1));
        o.store((0, 0, .., ..), out.cast::<T>());
    }
}

/// [`flash_attention_kv_len()`] for a config, dtype and shapes.
pub fn flash_attention_kv_len(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention_kv_len::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    match dtype {
        DType::BF16 => flash_attention_kv_len::build::<bf16>(cfg, dims),
        DType::F16 => flash_attention_kv_len::build::<f16>(cfg, dims),
        _ => flash_attention_kv_len::build::<f32>(cfg, dims),
    }
}

/// The flash-attention kernel for a config, dtype and shapes.
pub fn flash_attention(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    match dtype {
        DType::BF16 => flash_attention::build::<bf16>(cfg, dims),
        DType::F16 => flash_attention::build::<f16>(cfg, dims),
        _ => flash_attention::build::<f32>(cfg, dims),
    }
}
