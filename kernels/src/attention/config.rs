//! Flash attention's config and its tiling in one place: the blocks, the
//! heads GQA shares, and the block maps (which q, o, lse block and which
//! k/v block each grid step reads; skipped steps fetch nothing new).

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, Target};

use super::band::{self, Band};

/// Config of [`flash_attention()`](super::flash_attention()) and the backward kernels.
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
    /// Sliding window: keys more than `window − 1` positions away are hidden.
    pub window: Option<usize>,
    /// Logit soft-cap: `s ← cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Dropout on the attention probabilities at this rate (in `[0, 1)`):
    /// the kernels then take a Threefry key, `dropout_key: i32[2]`, as
    /// scalar prefetch after `kv_len` (see [`super::dropout`]).
    pub dropout: Option<f32>,
}

impl AttnConfig {
    /// Plain attention (`1/√d` scale, no window, no soft-cap) with the
    /// target's default blocks ([`AttnConfig::default_block`]) for these
    /// sequence lengths, each clamped to the sequence length.
    pub fn for_target(target: Target, causal: bool, d: usize, sq: usize, skv: usize) -> AttnConfig {
        let b = AttnConfig::default_block(target);
        AttnConfig {
            causal,
            sm_scale: 1.0 / (d as f32).sqrt(),
            block_q: b.min(sq),
            block_k: b.min(skv),
            window: None,
            softcap: None,
            dropout: None,
        }
    }

    /// The default query and key block of a generation, from `tessera
    /// tune flash_attention --tpu G` (b = 1, h = 2, s = 2048, d = 128, bf16,
    /// blocks 128/256/512, libtpu 0.0.48.1): 512 × 512 won on v5e (39.3 µs
    /// against 75.5 at 256 × 256 and 215 at 128 × 128) and on v6e (25.4
    /// µs; 65.4 and 220), causal on v6e too. v5p and v7x have no published
    /// clock, so their estimates rank by cycles only and were not tuned:
    /// there the MXU width (128 on v5p, 256 on v7x).
    pub fn default_block(target: Target) -> usize {
        match target {
            Target::V5e | Target::V6e => 512,
            Target::V5p | Target::V7x => target.mxu_width(),
        }
    }

    /// The config without the causal mask and the window: for blocks the
    /// band holds whole, which need no element mask.
    pub(crate) fn unmasked(&self) -> AttnConfig {
        AttnConfig {
            causal: false,
            window: None,
            ..self.clone()
        }
    }

    /// The config with no dropout: the calls that take no key.
    #[cfg(feature = "graph")]
    pub(crate) fn without_dropout(&self) -> AttnConfig {
        AttnConfig {
            dropout: None,
            ..self.clone()
        }
    }

    /// Whether any key can be hidden from a query (mask needed).
    pub(crate) fn masked(&self) -> bool {
        !Band::of(self).is_full()
    }

    /// The k blocks q block `qi` (of `sq` queries) sees, by the mask and
    /// a valid length: the body skips the others, the K/V index maps clamp
    /// to these.
    pub(crate) fn key_blocks<E: kernel_ir::IntExpr>(
        &self,
        qi: E,
        sq: usize,
        kv_len: Option<E>,
    ) -> band::BlockRange<E> {
        Band::of(self).key_blocks(qi, (self.block_q, sq), self.block_k, kv_len)
    }

    /// The q blocks that see k block `ki` (of `skv` keys): the dk/dv
    /// kernel's view.
    pub(crate) fn query_blocks<E: kernel_ir::IntExpr>(
        &self,
        ki: E,
        skv: usize,
    ) -> band::BlockRange<E> {
        Band::of(self).query_blocks(ki, self.block_q, (self.block_k, skv))
    }
}

/// Query heads per kv head (`h / hkv`), for index maps and grids; never a
/// division by zero (a zero `hkv` is the verifier's zero-size error, and
/// the constructors check the head counts first with [`check_heads`]).
pub(crate) fn group(h: usize, hkv: usize) -> usize {
    h / hkv.max(1)
}

/// The head counts GQA needs: `hkv ≥ 1` kv heads, each shared by the same
/// number of query heads (`h` a multiple of `hkv`).
pub(crate) fn check_heads(h: usize, hkv: usize) -> Result<(), KernelErrors> {
    if hkv >= 1 && h >= hkv && h.is_multiple_of(hkv) {
        return Ok(());
    }
    Err(KernelErrors::from(kernel_ir::KernelError::from(
        kernel_ir::ErrorKind::Config(format!(
            "grouped-query attention needs the query heads to be a multiple of the kv heads: \
             got h = {h} query heads and hkv = {hkv} kv heads; use hkv = 1 (MQA), hkv = h (MHA) or a divisor of h"
        )),
    )))
}

/// The K/V block grid step (q block `i`, k block `j`) fetches: the step's
/// own block when it has work, else the nearest block of `i` that has, so
/// a skipped step fetches nothing new ([`AttnConfig::key_blocks`] decides
/// both).
fn kv_block(
    cfg: &AttnConfig,
    (i, sq): (IndexExpr, usize),
    j: IndexExpr,
    kv_len: Option<IndexExpr>,
    skv: usize,
) -> IndexExpr {
    cfg.key_blocks(i, sq, kv_len)
        .clamp(j, kernel_ir::cdiv(skv, cfg.block_k))
}

/// The block of the operands with one row per query (q, o, dO; lse and
/// delta with `cols` 1) at grid step (batch, head, q block, k block).
pub(crate) fn q_rows(
    cfg: &AttnConfig,
    cols: usize,
) -> BlockMap<impl FnOnce([IndexExpr; 4]) -> (IndexExpr, IndexExpr, IndexExpr, i64)> {
    BlockMap::new(
        [1, 1, cfg.block_q, cols],
        |[bi, hi, i, _]: [IndexExpr; 4]| (bi, hi, i, 0),
    )
}

/// The K/V block at grid step (batch, head, q block `i`, k block `j`): the
/// query head's kv head, and the k block [`kv_block`] picks.
pub(crate) fn kv_rows(
    cfg: &AttnConfig,
    d: usize,
    (h, hkv): (usize, usize),
    (sq, skv): (usize, usize),
    kv_len: Option<Ref>,
) -> BlockMap<impl FnOnce([IndexExpr; 4]) -> (IndexExpr, IndexExpr, IndexExpr, i64) + '_> {
    BlockMap::new(
        [1, 1, cfg.block_k, d],
        move |[bi, hi, i, j]: [IndexExpr; 4]| {
            let kv = kv_block(cfg, (i, sq), j, kv_len.map(|t| t.at(0)), skv);
            (bi, hi / group(h, hkv), kv, 0)
        },
    )
}

/// What the forward and dq kernels read alike, tiled per query block: the
/// valid key count (with `with_len`), q by [`q_rows`], and k and v by
/// [`kv_rows`] (k column-major, the MXU's layout for `q · kᵀ`).
#[operands]
pub(crate) struct QueryKeys<T> {
    #[present(with_len)]
    #[shape(1)]
    kv_len: Option<Prefetch>,
    #[present(cfg.dropout.is_some())]
    #[shape(2)]
    dropout_key: Option<Prefetch>,
    #[shape(b, h, sq, d)]
    #[block(q_rows(cfg, d))]
    q: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block(kv_rows(cfg, d, (h, hkv), (sq, skv), kv_len))]
    #[col_major]
    k: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block(kv_rows(cfg, d, (h, hkv), (sq, skv), kv_len))]
    v: In<T>,
}
