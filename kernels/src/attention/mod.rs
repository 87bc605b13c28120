//! Flash attention: forward (with logsumexp), backward, paged decode, and
//! MLA decode over a paged latent cache ([`mla`]).
//!
//! The forward grid walks (batch, head, q block, k block); the k dim is
//! `arbitrary` and carries an online softmax in scratch: the running row
//! max `m`, the running denominator `l` and the unnormalized output `acc`.
//! Each k block rescales what was accumulated by `exp(m_prev − m_new)`.
//! Blocks that the causal mask or the sliding window hide entirely are
//! skipped (not computed), and their K/V index maps are clamped to a block
//! the q block does need, so a skipped step fetches nothing new.
//!
//! * GQA/MQA: `h` query heads share `hkv` key/value heads (`hkv` divides
//!   `h`); query head `i` reads kv head `i / (h / hkv)`.
//! * `window`: query `i` sees keys `j` with `i − j < window` (and `j ≤ i`
//!   when causal; `|i − j| < window` otherwise).
//! * `softcap`: scores become `cap · tanh(s / cap)` (Gemma-style).
//! * [`flash_attention_kv_len()`]: keys at or past a scalar-prefetched valid
//!   length are masked (for bucketed sequences).
//! * Sequence lengths need not be multiples of the blocks: the last q block
//!   computes padding rows that are dropped, the last k block's padding is
//!   masked.
//! * Both return the output and the row logsumexp `lse = m + log l`
//!   (`[b, h, sq, 1]`, f32), which the backward kernels ([`backward`]) use.
//! * A query row that sees no key at all (every key hidden by the causal
//!   mask, the window or the valid length) has an empty softmax: `o = 0`
//!   and `lse = −∞`, on every path and in the reference.
//! * Scores must stay in f32 range: when `|q|·|k|·d·sm_scale` overflows,
//!   the scores are ±∞ and the row's output is NaN (the f64 reference
//!   overflows only much later); `tessera run` refuses such inputs.
//!
//! K is given a column-major hint: each head's `[s, d]` matrix is stored as
//! kᵀ, the layout the MXU wants for `q·kᵀ`, so its block's lane dim is the
//! key dim.
//!
//! # Two rules found with libtpu
//!
//! * **Body conditions on grid indices never divide.** A `BlockRange` bound is
//!   kept as a `Quotient` (numerator and divisor): the index map divides
//!   (`clamp`), the body's `contains` multiplies (`j·b + b − 1 ≥ f`,
//!   `j·b + b ≤ e`). libtpu's static profiler cannot evaluate a division of
//!   grid indices and ran none of the work under such an `if` (the causal
//!   forward's trace had 0 of its 1,152 MXU passes); multiplied, it follows
//!   every branch.
//! * **Online-softmax state is lane-replicated and read back as a lane max.**
//!   `m` and `l` are `[rows, 128]` scratch holding each row's value in every
//!   lane (Pallas's layout); `online_update` reads them as `load(..)
//!   .max_keep(1)`, not a `[rows, 1]` column load. The lane reduction leaves
//!   Mosaic a value already replicated across lanes, so broadcasting it over
//!   scores and accumulator is free; a column load is broadcast by one lane
//!   permute per vreg, which libtpu's estimate put at 2.4× the whole step at
//!   512 × 512 blocks on v6e (28.2k → 11.6k cycles; 125k → 100k at 128 × 128).
//!   The finalize step keeps its column loads (once per q block, measured
//!   cheaper than the reduction there).

pub mod backward;
pub mod band;
pub mod block_table;
mod config;
pub mod decode;
pub mod decode_dma;
pub mod decode_fp8;
pub mod dropout;
pub mod mask;
pub mod masked;
pub mod masked_backward;
mod masked_entries;
#[cfg(feature = "graph")]
mod masked_vjp;
pub mod mla;
mod online;
pub mod ragged;
pub mod ragged_update;
mod scores;
#[cfg(feature = "graph")]
mod vjp;

use band::Band;
pub use config::AttnConfig;
pub(crate) use config::{QueryKeys, check_heads, group, kv_rows, q_rows};
pub(crate) use dropout::{DropMask, drop_mask, kept_scale};
pub(crate) use online::{
    Online, fold_sink, normalized, online_softmax_finish, online_softmax_init, online_update,
    online_update_dropped,
};
pub use scores::MASK_VALUE;
pub(crate) use scores::{ScoreRows, mask_scores, raw_scores, visible_keys};

#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor};
use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

#[cfg(feature = "graph")]
use crate::recording::build_error;

/// One grid step's q, k and v windows.
#[derive(Clone, Copy)]
struct Qkv {
    /// The q block.
    q: Ref,
    /// The k block.
    k: Ref,
    /// The v block.
    v: Ref,
}

/// One (q block, k block) step of the forward pass, the whole of its
/// math: scores, the mask (the causal/window band, a valid kv length, the
/// end of the array in a ragged last k block), the online-softmax update.
#[kernel_fn]
fn attend_step(
    cfg: &AttnConfig,
    skv: usize,
    Qkv { q, k, v }: Qkv,
    st: Online,
    (qi, ki): (Tile, Tile),
    kv_len: Option<Tile>,
    drop: Option<DropMask>,
) {
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    let ragged = !skv.is_multiple_of(bk);
    let mut vb = v.load((0, 0, .., ..));
    let mut s = raw_scores(cfg, ScoreRows::Queries, q, k);
    // Hidden keys score MASK_VALUE; an unmasked step records no position.
    if cfg.masked() || kv_len.is_some() || ragged {
        let k_pos = iota(I32, [bq, bk], 1) + ki * bk;
        if cfg.masked() {
            let q_pos = iota(I32, [bq, bk], 0) + qi * bq;
            if let Some(visible) = Band::of(cfg).visible(q_pos, k_pos) {
                s = select(visible, s, MASK_VALUE);
            }
        }
        if let Some(len) = kv_len {
            s = select(k_pos < len, s, MASK_VALUE);
        }
        if ragged {
            // The last k block runs past the array: its padding must not
            // reach the scores or (as 0 · garbage) the output.
            s = select(k_pos < skv as i32, s, MASK_VALUE);
            let row = iota(I32, vb.shape(), 0) + ki * bk;
            vb = select(row < skv as i32, vb, 0.0);
        }
    }
    if let Some(d) = drop {
        let q_pos = iota(I32, [bq, bk], 0) + qi * bq;
        let k_pos = iota(I32, [bq, bk], 1) + ki * bk;
        online_update_dropped(bq, st, s, vb, kept_scale(d, q_pos, k_pos));
    } else {
        online_update(bq, st, s, vb);
    }
}

/// Flash attention forward over `[batch, heads, seq, head_dim]` arrays;
/// k and v have `hkv` heads. With `with_len`, the kernel takes the valid
/// key count as scalar prefetch `kv_len` (see [`flash_attention_kv_len()`]).
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary),
    name = match (with_len, with_sinks, cfg.dropout.is_some()) {
        (true, _, _) => "flash_attention_kv_len",
        (false, true, _) => "flash_attention_sinks",
        (false, false, true) => "flash_attention_dropout",
        (false, false, false) => "flash_attention",
    },
    check = check_heads(h, hkv)
)]
pub fn flash_attention<T: Float>(
    cfg: &AttnConfig,
    with_len: bool,
    with_sinks: bool,
    #[operands] _: QueryKeys<T>,
    #[present(with_sinks)]
    #[shape(h)]
    #[block([h], |_, _, _, _| 0)]
    sinks: Option<In<f32>>,
    #[shape(b, h, sq, d)]
    #[block(q_rows(cfg, d))]
    o: Out<T>,
    #[shape(b, h, sq, 1)]
    #[block(q_rows(cfg, 1))]
    lse: Out<f32>,
    #[shape(cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(cfg.block_q, d)] acc: Scratch<f32>,
) {
    let (qi, ki) = (program_id(2), program_id(3));
    let (len, st) = (kv_len.load([0]), Online { m, l, acc });
    let drop = drop_mask(cfg, dropout_key, false, h, skv);
    if ki == 0 {
        online_softmax_init(st);
    }
    if cfg.key_blocks(qi, sq, len).contains(ki) {
        // A block wholly inside the band needs no element mask (a compare
        // and select per score, and on the CPU a copy of the score tile).
        let qkv = Qkv { q, k, v };
        if Band::of(cfg).block_inside(qi, ki, cfg.block_q, cfg.block_k) {
            attend_step(&cfg.unmasked(), skv, qkv, st, (qi, ki), len, drop);
        } else {
            attend_step(cfg, skv, qkv, st, (qi, ki), len, drop);
        }
    }
    if ki == num_programs(3) - 1 {
        if let Some(sinks) = sinks {
            fold_sink(st, sinks, h, cfg.block_q);
        }
        online_softmax_finish(st, o, lse);
    }
}

/// The flash-attention kernel for a config, dtype and shapes. Outputs:
/// `o: T[b, h, sq, d]` and `lse: f32[b, h, sq, 1]`.
pub fn flash_attention(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention::build_for(dtype, cfg, false, false, dims)
}

/// Records flash attention on the graph runtime, with its backward, for a
/// typed config: `[o, lse]` of `q: [b, h, sq, d]` and `k, v: [b, hkv, skv,
/// d]` in q's dtype. What Rust code calls (the training model, the
/// transformer block); `tessera` reaches the same kernel through
/// [`FLASH_ATTENTION`]'s string config.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use kernel_ir::{Array, DType, Target};
/// use kernels::attention::{AttnConfig, call_flash_attention};
/// use graph::{Runtime, grad};
///
/// let rt = Runtime::cpu()?;
/// let t = |seed| Array::random(DType::F32, [1, 2, 128, 64], seed, -1.0, 1.0);
/// let q = rt.tensor(&t(1))?.requires_grad()?;
/// let (k, v) = (rt.tensor(&t(2))?, rt.tensor(&t(3))?);
/// let cfg = AttnConfig::for_target(Target::V5e, true, 64, 128, 128);
/// let [o, _lse] = call_flash_attention(&cfg, &q, &k, &v)?;
/// let dq = grad(&o.sum(&[0, 1, 2, 3])?, &[&q])?; // through dq and dk/dv
/// # Ok(()) }
/// ```
#[cfg(feature = "graph")]
pub fn call_flash_attention(
    cfg: &AttnConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<[Tensor; 2], RuntimeError> {
    record_forward(&cfg.without_dropout(), (None, None), [q, k, v], None)
}

/// [`call_flash_attention`] with dropout on the probabilities at
/// `cfg.dropout` (which must be set), the mask drawn from `key` (an i32
/// `[2]` tensor, `jax.random.key_data` of a Threefry key; see
/// [`dropout`]), with `sinks` (`f32[h]`) when given. Its backward draws
/// the same mask from the key.
#[cfg(feature = "graph")]
pub fn call_flash_attention_dropout(
    cfg: &AttnConfig,
    key: &Tensor,
    [q, k, v]: [&Tensor; 3],
    sinks: Option<&Tensor>,
) -> Result<[Tensor; 2], RuntimeError> {
    if cfg.dropout.is_none() {
        return Err(build_error(
            "flash_attention_dropout",
            crate::entry::EntryError::Shape(
                "the config has no dropout rate; set AttnConfig::dropout (or call call_flash_attention)"
                    .into(),
            ),
        ));
    }
    record_forward(cfg, (None, Some(key)), [q, k, v], sinks)
}

/// [`call_flash_attention`] with keys at or past `kv_len[0]` (an i32
/// `[1]` tensor) masked: [`flash_attention_kv_len()`] and its backward.
#[cfg(feature = "graph")]
pub fn call_flash_attention_kv_len(
    cfg: &AttnConfig,
    kv_len: &Tensor,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<[Tensor; 2], RuntimeError> {
    record_forward(
        &cfg.without_dropout(),
        (Some(kv_len), None),
        [q, k, v],
        None,
    )
}

/// Records a flash-attention forward with its backward: `[o, lse]`. The
/// kernel's scalar prefetch is the valid length (when given), then the
/// dropout key (exactly when `cfg.dropout` is set).
#[cfg(feature = "graph")]
fn record_forward(
    cfg: &AttnConfig,
    (kv_len, key): (Option<&Tensor>, Option<&Tensor>),
    [q, k, v]: [&Tensor; 3],
    sinks: Option<&Tensor>,
) -> Result<[Tensor; 2], RuntimeError> {
    let with_len = kv_len.is_some();
    let name = match (with_len, sinks, cfg.dropout) {
        (true, _, _) => "flash_attention_kv_len",
        (false, Some(_), _) => "flash_attention_sinks",
        (false, None, Some(_)) => "flash_attention_dropout",
        (false, None, None) => "flash_attention",
    };
    // The dims come from q, k and v (kv_len is `[1]`, sinks `[h]`).
    let dims = flash_attention::Dims::from_shapes(&[q.shape(), k.shape(), v.shape()])
        .map_err(|e| build_error(name, e))?;
    let kernel = flash_attention::build_for(q.dtype(), cfg, with_len, sinks.is_some(), dims)
        .map_err(|e| build_error(name, e))?;
    let mut args: Vec<&Tensor> = kv_len.into_iter().chain(key).collect();
    args.extend([q, k, v]);
    args.extend(sinks);
    let vjp = match sinks {
        Some(_) => vjp::vjp_sinks(cfg.clone(), with_len),
        None => vjp::vjp(cfg.clone(), with_len),
    };
    let mut out = q.runtime().call_with_vjp(&kernel, &args, vjp)?.into_iter();
    match (out.next(), out.next()) {
        (Some(o), Some(lse)) => Ok([o, lse]),
        _ => Err(RuntimeError::Internal(format!(
            "`{name}` returned fewer than 2 outputs"
        ))),
    }
}

/// Flash attention over keys padded to a bucket: keys at or past
/// `kv_len[0]` are masked out, and k blocks that start past it are skipped
/// and fetch nothing new (the graph runtime passes the valid length of a
/// bucketed sequence as this scalar-prefetch operand). Queries past it
/// compute finite values, which the caller ignores. Arguments: `kv_len`,
/// then those of [`flash_attention()`]; outputs as it.
pub fn flash_attention_kv_len(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention::build_for(dtype, cfg, true, false, dims)
}

/// Flash attention with a learned sink logit per query head (gpt-oss):
/// each row's softmax runs over its keys and one more logit, `sinks[h]`,
/// that has no value, so `o = Σ_j exp(s_j − lse)·v_j` with `lse =
/// log(exp(sinks[h]) + Σ_j exp(s_j))`. A row may put weight on nothing
/// (a sink far above its scores makes `o` small). Arguments: those of
/// [`flash_attention()`] then `sinks: f32[h]` (finite); outputs as it,
/// `lse` counting the sink. A row that sees no key gets `o = 0`, `lse =
/// sinks[h]`. Its backward is flash attention's (the dq and dk/dv kernels
/// read this `lse`) plus `dsinks[h] = Σ exp(sinks[h] − lse)·(ct_lse −
/// rowsum(dO·o))` over the head's rows.
pub fn flash_attention_sinks(
    cfg: &AttnConfig,
    dtype: DType,
    dims: flash_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    flash_attention::build_for(dtype, cfg, false, true, dims)
}

/// [`call_flash_attention`] with sinks (`f32[h]`): [`flash_attention_sinks()`]
/// and its backward, which gives `sinks` a gradient too.
#[cfg(feature = "graph")]
pub fn call_flash_attention_sinks(
    cfg: &AttnConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    sinks: &Tensor,
) -> Result<[Tensor; 2], RuntimeError> {
    record_forward(&cfg.without_dropout(), (None, None), [q, k, v], Some(sinks))
}

pub(crate) mod entries;

pub use decode::PAGED_DECODE_ATTENTION;
pub use decode_dma::PAGED_DECODE_ATTENTION_DMA;
pub use decode_fp8::PAGED_DECODE_ATTENTION_FP8;
pub use dropout::FLASH_ATTENTION_DROPOUT;
pub use entries::{
    ATTENTION_DELTA, FLASH_ATTENTION, FLASH_ATTENTION_DKV, FLASH_ATTENTION_DKV_KV_LEN,
    FLASH_ATTENTION_DQ, FLASH_ATTENTION_DQ_KV_LEN, FLASH_ATTENTION_DQKV,
    FLASH_ATTENTION_DQKV_KV_LEN, FLASH_ATTENTION_KV_LEN, FLASH_ATTENTION_SINKS,
};
pub use masked_entries::{MASKED_ATTENTION, MASKED_ATTENTION_DKV, MASKED_ATTENTION_DQ};
pub use mla::MLA_DECODE_ATTENTION;
pub use ragged::RAGGED_PAGED_ATTENTION;
pub use ragged_update::RAGGED_PAGED_ATTENTION_UPDATE;
