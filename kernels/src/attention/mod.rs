//! Flash attention: forward (with logsumexp), backward, and paged decode.
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
pub mod decode;
pub mod decode_dma;
pub mod decode_fp8;
pub mod mask;
pub mod masked;
pub mod masked_backward;
mod masked_entries;
#[cfg(feature = "graph")]
mod masked_vjp;
pub mod ragged;
#[cfg(feature = "graph")]
mod vjp;

use band::Band;

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, Target, VerifiedKernel};
#[cfg(feature = "graph")]
use runtime::graph::{RuntimeError, Tensor};

#[cfg(feature = "graph")]
use crate::graph::build_error;

/// Config of [`flash_attention()`] and the backward kernels.
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

    /// Whether any key can be hidden from a query (mask needed).
    fn masked(&self) -> bool {
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

/// Added to masked scores: far below any real score, yet finite so that a
/// row never computes `−∞ − (−∞)`.
pub const MASK_VALUE: f32 = -1e30;

/// Which operand's rows a score tile's rows are: the queries (`q·kᵀ`,
/// `[block_q, block_k]`) or the keys (`k·qᵀ`, `[block_k, block_q]`).
///
/// The forward and `dq` kernels reduce over keys, so their scores have
/// query rows on every platform. The dk/dv kernels reduce over queries:
/// on the TPU they keep query rows and transpose `P` and `dS` into the MXU
/// (Pallas's layout: the saved logsumexp is a column there, broadcast
/// along lanes); on the GPU they compute `k·qᵀ` directly, as Triton's
/// fused-attention tutorial does, so every product has the k block as its
/// M dimension (128 rows, where the q block's 32 would leave Hopper's
/// warpgroup MMA unused) and nothing is transposed but two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScoreRows {
    /// `[block_q, block_k]`: row `i` is query `i`.
    Queries,
    /// `[block_k, block_q]`: row `j` is key `j`.
    Keys,
}

impl ScoreRows {
    /// The dk/dv kernels' layout for the platform being built for
    /// ([`kernel_ir::current_platform`]).
    pub(crate) fn for_dkv() -> ScoreRows {
        match kernel_ir::current_platform() {
            kernel_ir::Platform::Tpu => ScoreRows::Queries,
            kernel_ir::Platform::Gpu => ScoreRows::Keys,
        }
    }

    /// A score tile's shape.
    pub(crate) fn shape(self, cfg: &AttnConfig) -> [usize; 2] {
        match self {
            ScoreRows::Queries => [cfg.block_q, cfg.block_k],
            ScoreRows::Keys => [cfg.block_k, cfg.block_q],
        }
    }

    /// The axis of a score tile along which the query changes.
    fn query_axis(self) -> usize {
        match self {
            ScoreRows::Queries => 0,
            ScoreRows::Keys => 1,
        }
    }

    /// A per-query column `[block_q, 1]` (the logsumexp, delta) shaped to
    /// broadcast over a score tile.
    pub(crate) fn per_query(self, column: Tile) -> Tile {
        match self {
            ScoreRows::Queries => column,
            ScoreRows::Keys => column.t(),
        }
    }

    /// `a·bᵀ` of a query-side block `a` (q, dO) and a key-side block `b`
    /// (k, v) with the score tile's rows: `b·aᵀ` with key rows.
    pub(crate) fn outer(self, a: Tile, b: Tile) -> Tile {
        match self {
            ScoreRows::Queries => dot(a, b.t()),
            ScoreRows::Keys => dot(b, a.t()),
        }
    }

    /// A score tile with key rows (`[block_k, block_q]`), transposed if
    /// it has query rows.
    pub(crate) fn with_key_rows(self, s: Tile) -> Tile {
        match self {
            ScoreRows::Queries => s.t(),
            ScoreRows::Keys => s,
        }
    }

    /// A score tile with query rows (`[block_q, block_k]`), transposed if
    /// it has key rows.
    pub(crate) fn with_query_rows(self, s: Tile) -> Tile {
        match self {
            ScoreRows::Queries => s,
            ScoreRows::Keys => s.t(),
        }
    }

    /// The query and key positions of every score of block (`qi`, `ki`).
    pub(crate) fn positions(self, cfg: &AttnConfig, qi: Tile, ki: Tile) -> (Tile, Tile) {
        let shape = self.shape(cfg);
        let qa = self.query_axis();
        let q_pos = iota(I32, shape, qa) + qi * cfg.block_q;
        let k_pos = iota(I32, shape, 1 - qa) + ki * cfg.block_k;
        (q_pos, k_pos)
    }
}

/// `scale · q·kᵀ` (or `k·qᵀ`, as `rows` says), soft-capped, unmasked.
#[kernel_fn]
fn raw_scores(cfg: &AttnConfig, rows: ScoreRows, q: Ref, k: Ref) -> Tile {
    // The MXU multiplies in the input dtype and accumulates in f32.
    let mut s = rows.outer(q.load((0, 0, .., ..)), k.load((0, 0, .., ..))) * cfg.sm_scale;
    if let Some(cap) = cfg.softcap {
        s = (s * (1.0 / cap)).tanh() * cap;
    }
    s
}

/// Scores hidden by the causal mask or the window set to [`MASK_VALUE`].
#[kernel_fn]
fn mask_scores(cfg: &AttnConfig, rows: ScoreRows, s: Tile, qi: Tile, ki: Tile) -> Tile {
    if cfg.masked() {
        select(visible_keys(cfg, rows, qi, ki), s, MASK_VALUE)
    } else {
        s
    }
}

/// Bools laid out as `rows` says: which keys the causal mask and the
/// window leave visible to which queries (all, when neither applies).
/// Computed from positions only, so padding cannot poison it.
#[kernel_fn]
fn visible_keys(cfg: &AttnConfig, rows: ScoreRows, qi: Tile, ki: Tile) -> Tile {
    let (q_pos, k_pos) = rows.positions(cfg, qi, ki);
    if let Some(v) = Band::of(cfg).visible(q_pos, k_pos) {
        v
    } else {
        k_pos >= 0
    }
}

/// The K/V block grid step (q block `i`, k block `j`) fetches: the step's
/// own block when it has work, else the nearest block of `i` that has, so
/// a skipped step fetches nothing new ([`AttnConfig::key_blocks`] decides
/// both).
pub(crate) fn kv_block(
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

/// The online softmax's running state, in scratch: the row max `m` and
/// sum `l` (each row's value in all 128 lanes, `[rows, 128]`) and the
/// unnormalized output `acc` (`[rows, d]`).
#[derive(Clone, Copy)]
pub(crate) struct Online {
    /// Running row max.
    pub(crate) m: Ref,
    /// Running row sum of `exp(s − m)`.
    pub(crate) l: Ref,
    /// Running `Σ exp(s − m) · v`.
    pub(crate) acc: Ref,
}

/// One grid step's q, k and v windows.
#[derive(Clone, Copy)]
pub(crate) struct Qkv {
    /// The q block.
    pub(crate) q: Ref,
    /// The k block.
    pub(crate) k: Ref,
    /// The v block.
    pub(crate) v: Ref,
}

/// The online-softmax step for `rows` query rows: new running max and
/// sum, rescaled accumulator.
#[kernel_fn]
fn online_update(rows: usize, st: Online, s: Tile, vb: Tile) {
    let Online { m, l, acc } = st;
    // `m` and `l` hold each row's value in all 128 lanes. Reading them back
    // as a lane max (not a `[rows, 1]` column load) gives Mosaic a value
    // already replicated across lanes, so broadcasting it over the
    // `[rows, bk]` scores and the `[rows, d]` accumulator is free: a
    // column load is broadcast by a lane permute per vreg, which libtpu's
    // schedule estimate put at 2.4x the whole step's cycles at 512 x 512
    // blocks on v6e (ARCHITECTURE.md, the kernels' invariants).
    let m_prev = m.load(..).max_keep(1);
    let l_prev = l.load(..).max_keep(1);
    let m_new = m_prev.max(s.max_keep(1));
    let p = (s - m_new).exp();
    let alpha = (m_prev - m_new).exp();
    acc.store(.., acc.load(..) * alpha + dot(p.convert(vb.dtype()), vb));
    m.store(.., m_new.broadcast_to([rows, 128]));
    l.store(
        ..,
        (l_prev * alpha + p.sum_keep(1)).broadcast_to([rows, 128]),
    );
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
    online_update(bq, st, s, vb);
}

/// First step: reset the running state. Last step: normalize, write the
/// output and the logsumexp.
#[kernel_fn]
fn online_softmax_init(st: Online) {
    st.m.store(.., f32::NEG_INFINITY);
    st.l.store(.., 0.0);
    st.acc.store(.., 0.0);
}

/// Writes `o = acc / l` and `lse = m + log l`; rows that saw no visible
/// key (see [`no_visible_key`]) get `o = 0` and `lse = −∞`.
#[kernel_fn]
fn online_softmax_finish(st: Online, o: Ref, lse: Ref) {
    let (out, lse_row) = normalized(st);
    o.store((0, 0, .., ..), out.convert(o.dtype()));
    lse.store((0, 0, .., ..), lse_row);
}

/// `acc / l` and `m + log l` of the online softmax, with the rows that saw
/// no visible key set to 0 and −∞.
///
/// A row sees no key when every key is masked (causal with a short K, a
/// window, a valid length of 0): its running max is still −∞ (no block
/// was computed) or [`MASK_VALUE`] (only masked scores were), which no
/// real score reaches. Its softmax is empty: the output is 0 (the sum over
/// no keys) and the logsumexp −∞ (the log of an empty sum), as in the f64
/// reference, on every path; the backward passes give it zero gradients.
#[kernel_fn]
fn normalized(Online { m, l, acc }: Online) -> (Tile, Tile) {
    let m_row = m.load((.., 0..1));
    let dead = no_visible_key(m_row);
    let l_row = select(dead, 1.0, l.load((.., 0..1)));
    let alive = select(dead, 0.0, 1.0);
    let out = acc.load(..) / l_row * alive;
    (out, select(dead, f32::NEG_INFINITY, m_row + l_row.log()))
}

/// Whether rows with running max `m_row` have seen no visible key.
#[kernel_fn]
fn no_visible_key(m_row: Tile) -> Tile {
    m_row < MASK_VALUE * 0.5
}

/// Flash attention forward over `[batch, heads, seq, head_dim]` arrays;
/// k and v have `hkv` heads. With `with_len`, the kernel takes the valid
/// key count as scalar prefetch `kv_len` (see [`flash_attention_kv_len()`]).
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary),
    name = if with_len { "flash_attention_kv_len" } else { "flash_attention" },
    check = check_heads(h, hkv)
)]
pub fn flash_attention<T: Float>(
    cfg: &AttnConfig,
    with_len: bool,
    #[present(with_len)]
    #[shape(1)]
    kv_len: Option<Prefetch>,
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
    if ki == 0 {
        online_softmax_init(st);
    }
    if cfg.key_blocks(qi, sq, len).contains(ki) {
        // A block wholly inside the band needs no element mask (a compare
        // and select per score, and on the CPU a copy of the score tile).
        let qkv = Qkv { q, k, v };
        if Band::of(cfg).block_inside(qi, ki, cfg.block_q, cfg.block_k) {
            attend_step(&cfg.unmasked(), skv, qkv, st, (qi, ki), len);
        } else {
            attend_step(cfg, skv, qkv, st, (qi, ki), len);
        }
    }
    if ki == num_programs(3) - 1 {
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
    flash_attention::build_for(dtype, cfg, false, dims)
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
/// use runtime::graph::{Runtime, grad};
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
    record_forward(cfg, None, [q, k, v])
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
    record_forward(cfg, Some(kv_len), [q, k, v])
}

#[cfg(feature = "graph")]
fn record_forward(
    cfg: &AttnConfig,
    kv_len: Option<&Tensor>,
    [q, k, v]: [&Tensor; 3],
) -> Result<[Tensor; 2], RuntimeError> {
    let name = if kv_len.is_some() {
        "flash_attention_kv_len"
    } else {
        "flash_attention"
    };
    // The dims come from q, k and v (the kv_len operand is `[1]` always).
    let dims = flash_attention::Dims::from_shapes(&[q.shape(), k.shape(), v.shape()])
        .map_err(|e| build_error(name, e))?;
    let kernel = flash_attention::build_for(q.dtype(), cfg, kv_len.is_some(), dims)
        .map_err(|e| build_error(name, e))?;
    let mut args: Vec<&Tensor> = kv_len.into_iter().collect();
    args.extend([q, k, v]);
    let vjp = vjp::vjp(cfg.clone(), kv_len.is_some());
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
    flash_attention::build_for(dtype, cfg, true, dims)
}

pub(crate) mod entries;

pub use decode::PAGED_DECODE_ATTENTION;
pub use decode_dma::PAGED_DECODE_ATTENTION_DMA;
pub use decode_fp8::PAGED_DECODE_ATTENTION_FP8;
pub use entries::{
    ATTENTION_DELTA, FLASH_ATTENTION, FLASH_ATTENTION_DKV, FLASH_ATTENTION_DKV_KV_LEN,
    FLASH_ATTENTION_DQ, FLASH_ATTENTION_DQ_KV_LEN, FLASH_ATTENTION_DQKV,
    FLASH_ATTENTION_DQKV_KV_LEN, FLASH_ATTENTION_KV_LEN,
};
pub use masked_entries::{MASKED_ATTENTION, MASKED_ATTENTION_DKV, MASKED_ATTENTION_DQ};
pub use ragged::RAGGED_PAGED_ATTENTION;
