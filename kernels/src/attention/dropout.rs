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

use kernel_ir::Array;
use kernel_ir::prelude::*;
use kernel_ir::random::Key;

use super::entries::{
    BLOCK_K, BLOCK_Q, CAUSAL, GQA_SHAPES, SM_SCALE, SOFTCAP, WINDOW, attn_config, attn_spec,
    check_scores, forward_tolerance, qkv,
};
use super::{AttnConfig, flash_attention};
use crate::entry::{
    Config, DTYPE, Entry, EntryError, Param, ParamKind, Preset, param, refs, uniform_inputs,
};
use crate::reference;

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
/// `dropout_key`). The query head is grid axis 1, or with `grouped` (the
/// dk/dv grids: kv head, then the group's query head on axis 3) their
/// combination. Nothing is recorded without dropout.
#[kernel_fn]
pub(crate) fn drop_mask(
    cfg: &AttnConfig,
    key: Option<Ref>,
    grouped: bool,
    heads: usize,
    skv: usize,
) -> Option<DropMask> {
    if let (Some(rate), Some(key)) = (cfg.dropout, key) {
        let head = if grouped {
            program_id(1) * num_programs(3) + program_id(3)
        } else {
            program_id(1)
        };
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

/// The dropout entry's parameters: the attention's and the rate.
const DROPOUT_PARAMS: &[Param] = &[
    DTYPE,
    CAUSAL,
    BLOCK_Q,
    BLOCK_K,
    SM_SCALE,
    WINDOW,
    SOFTCAP,
    param(
        "rate",
        ParamKind::Number,
        "0.1",
        "probability of dropping an attention probability, in [0, 1)",
    ),
];

/// The dropout entry's [`AttnConfig`]: the attention's with the rate.
fn dropout_config(c: &Config, s: &[Vec<usize>]) -> Result<AttnConfig, EntryError> {
    let [two] = crate::entry::dims(&s[0], "dropout_key")?;
    if two != 2 {
        return Err(EntryError::Shape(format!(
            "dropout_key is [{two}]; a Threefry key is two int32 words, [2]"
        )));
    }
    let dims = flash_attention::Dims::from_shapes(&refs(&s[1..4]))?;
    let rate = c.f32("rate")?;
    if !(0.0..1.0).contains(&rate) {
        return Err(EntryError::BadValue {
            key: "rate",
            value: rate.to_string(),
            expected: "in [0, 1): the probability of dropping a probability (1 drops everything)"
                .into(),
        });
    }
    Ok(AttnConfig {
        dropout: Some(rate),
        ..attn_config(c, dims.sq, dims.skv, dims.d)?
    })
}

/// The f64 reference with dropout: attention whose probabilities are
/// multiplied by the mask written from its definition
/// ([`keep_reference`]) where they weigh v.
fn dropout_reference(c: &Config, a: &[Array]) -> Result<crate::entry::Outputs, EntryError> {
    let word = |i: usize| a[0].data()[i] as i64 as u32;
    let (key, rate) = ([word(0), word(1)], c.f32("rate")?);
    let (q, k, v) = (&a[1], &a[2], &a[3]);
    let (heads, skv, d) = (q.shape()[1], k.shape()[2], q.shape()[3]);
    let keep = |b, h, i, j| keep_reference(key, rate, (heads, skv), (b, h, i, j));
    let (o, lse) = reference::attention_weighted(q, k, v, &attn_spec(c, d)?, &keep);
    Ok(vec![o, lse])
}

/// [`flash_attention()`] with dropout on its probabilities in the library.
pub const FLASH_ATTENTION_DROPOUT: Entry = Entry {
    name: "flash_attention_dropout",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| Ok(super::vjp::vjp(dropout_config(c, s)?, false))),
    about: "flash attention forward with dropout on the probabilities (jax.random.bernoulli's mask per batch and head, from a Threefry key as scalar prefetch): outputs o and lse",
    params: DROPOUT_PARAMS,
    inputs: |_| {
        let mut v = vec![("dropout_key", vec![2])];
        v.extend(qkv());
        Ok(v)
    },
    build: |c, s| {
        let dims = flash_attention::Dims::from_shapes(&refs(&s[1..4]))?;
        Ok(flash_attention::build_for(
            c.dtype("dtype")?,
            &dropout_config(c, s)?,
            false,
            false,
            dims,
        )?)
    },
    reference: dropout_reference,
    check: check_scores,
    tolerance: forward_tolerance,
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        let mut rng = kernel_ir::SplitMix64(seed ^ 0xD0);
        let words = [0, 1].map(|_| f64::from(rng.next_u64() as u32 as i32));
        v[0] = Array::new(DType::I32, [2], words.to_vec())
            .unwrap_or_else(|_| Array::zeros(DType::I32, [2]));
        v
    },
    presets: &[Preset {
        name: "flash_attention_dropout_gqa_bf16",
        about: "flash attention with dropout 0.1, bf16, 4 query heads on 2 kv heads, causal, ragged 200 keys",
        config: &[("dtype", "bf16"), ("causal", "true"), ("rate", "0.1")],
        shapes: GQA_SHAPES,
    }],
};
