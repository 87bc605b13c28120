//! Dropout on the attention probabilities, inside the flash kernels: each
//! probability `p[i, j]` of batch `b`, query head `h` is kept with
//! probability `1 − rate` and scaled by `1 / (1 − rate)` before it weighs
//! `v[j]`; the softmax's sum (and `lse`) counts every key. The mask is
//! never stored: it is `jax.random.bernoulli(fold_in(key, b·heads + h),
//! 1 − rate, (sq, skv))[i, j]`, bit for bit (Threefry-2x32 from the
//! element's flat index), so the backward kernels draw the same one from
//! the key:
//!
//! * `dv += (p ⊙ keep)ᵀ·dO`,
//! * `dp = (dO·vᵀ) ⊙ keep`, `ds = p ⊙ (dp − delta)` with `delta =
//!   rowsum(dO ⊙ o)` of the dropped output, as without dropout.
//!
//! (`keep` holds `1 / (1 − rate)` or 0.) The flat index is 32 bits, so
//! `sq · skv` must stay below 2³² for the mask to be jax's.

use kernel_ir::prelude::*;
use kernel_ir::random::Key;

use super::AttnConfig;

/// What a kernel step needs to draw the mask: the key (scalar prefetch
/// `[2]`), this step's query head and the shapes.
#[derive(Clone, Copy)]
pub(crate) struct DropMask {
    key: Ref,
    head: Tile,
    heads: usize,
    rate: f32,
    skv: usize,
}

/// The step's mask source, when `cfg` has dropout (the kernel then has
/// `dropout_key`).
#[kernel_fn]
pub(crate) fn drop_mask(
    cfg: &AttnConfig,
    key: Option<Ref>,
    head: Tile,
    heads: usize,
    skv: usize,
) -> Option<DropMask> {
    if let (Some(rate), Some(key)) = (cfg.dropout, key) {
        Some(DropMask {
            key,
            head,
            heads,
            rate,
            skv,
        })
    } else {
        None
    }
}

/// `1 / (1 − rate)` where the element at (`q_pos`, `k_pos`) is kept, 0
/// where dropped; the batch is grid axis 0.
#[kernel_fn]
pub(crate) fn kept_scale(d: DropMask, q_pos: Tile, k_pos: Tile) -> Tile {
    let key = Key::new(d.key.load([0]), d.key.load([1]));
    let key = key.fold_in(program_id(0) * d.heads as i32 + d.head);
    let keep_prob = 1.0 - d.rate;
    let keep = key.bernoulli(keep_prob, q_pos * d.skv as i32 + k_pos);
    select(keep, 1.0 / keep_prob, 0.0)
}

/// The host's mask, from the definition: the multiplier of element
/// (`b`, `h`, `i`, `j`) of a `[batch, heads, sq, skv]` attention.
pub fn keep_reference(
    key: [u32; 2],
    rate: f32,
    (heads, skv): (usize, usize),
    (b, h, i, j): (usize, usize, usize, usize),
) -> f64 {
    let k = crate::reference::threefry_fold_in(key, (b * heads + h) as u32);
    let keep_prob = 1.0 - rate;
    if crate::reference::uniform(k, (i * skv + j) as u32) < keep_prob {
        1.0 / f64::from(keep_prob)
    } else {
        0.0
    }
}
