//! Attention with any mask (splash attention's model): the mask's block
//! tables ([`super::block_table`]) arrive by scalar prefetch; a step whose
//! block is empty computes nothing and its index maps name the block the
//! next computed step needs, a full block needs no element mask, and a
//! partial one reads its deduplicated element mask. Segment ids (packed
//! sequences) apply on top: a query sees only keys of its own segment.

use kernel_ir::KernelErrors;
use kernel_ir::prelude::*;

use super::mask::{Mask, MultiHeadMask};
use super::{MASK_VALUE, Online, group, online_softmax_finish, online_softmax_init, online_update};

/// Config of [`masked_attention`](mod@masked_attention).
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
    /// The mask, when partial steps compute visibility from positions
    /// instead of reading element masks: `Some` exactly when the mask is
    /// [computable](MultiHeadMask::computable), whose tables keep no
    /// element masks ([`MaskedConfig::rule_of`] says which).
    pub rule: Option<MultiHeadMask>,
}

impl MaskedConfig {
    /// The [`MaskedConfig::rule`] that goes with `mask`'s tables.
    pub fn rule_of(mask: &MultiHeadMask) -> Option<MultiHeadMask> {
        mask.computable().then(|| mask.clone())
    }
}

/// A position as the kernels compare it: sequences stay far below 2³⁰,
/// so offsets and windows past that are as good as open.
fn position(v: i128) -> i32 {
    v.clamp(-(1 << 30), 1 << 30) as i32
}

/// `[bq, bk]` bools: which of the pairs of query positions `q` and key
/// positions `k` (i32 tiles) `mask` leaves visible; `None` for all of
/// them. Chunks divide positions, which are never negative, so truncating
/// division is floor division.
fn mask_tile(mask: &Mask, q: Tile, k: Tile) -> Option<Tile> {
    match mask {
        Mask::Full => None,
        Mask::Causal { offset } => Some(k.le(q + position(*offset as i128))),
        Mask::Local { left, right } => {
            let lo = left.map(|l| k.ge(q - position(l as i128)));
            let hi = right.map(|r| k.le(q + position(r as i128)));
            match (lo, hi) {
                (Some(a), Some(b)) => Some(a & b),
                (a, b) => a.or(b),
            }
        }
        Mask::ChunkedCausal { chunk } => {
            let c = position((*chunk).max(1) as i128);
            Some(k.le(q) & (k / c).eq(q / c))
        }
        Mask::Prefix { len } => Some(k.lt(position(*len as i128)) | k.le(q)),
        Mask::Explicit { .. } => unreachable!("an explicit mask is not computable"),
        Mask::And(a, b) => match (mask_tile(a, q, k), mask_tile(b, q, k)) {
            (Some(x), Some(y)) => Some(x & y),
            (x, y) => x.or(y),
        },
        Mask::Or(a, b) => match (mask_tile(a, q, k), mask_tile(b, q, k)) {
            (Some(x), Some(y)) => Some(x | y),
            _ => None,
        },
    }
}

impl MultiHeadMask {
    /// `[bq, bk]` bools: head `hi`'s mask (`hi` an i32 scalar tile) over
    /// query positions `q` and key positions `k` (i32 tiles), one
    /// expression per distinct head mask, chosen by head. Only for a
    /// [computable](MultiHeadMask::computable) mask.
    ///
    /// A method rather than a free function because kernel bodies may call
    /// methods but only `#[kernel_fn]` free functions.
    fn visible_tile(&self, hi: Tile, q: Tile, k: Tile) -> Tile {
        let all = || k.ge(0);
        let mut distinct: Vec<&Mask> = Vec::new();
        for m in &self.heads {
            if !distinct.contains(&m) {
                distinct.push(m);
            }
        }
        let mut out = mask_tile(distinct[0], q, k).unwrap_or_else(all);
        for m in &distinct[1..] {
            let mut mine: Option<Tile> = None;
            for (h, _) in self.heads.iter().enumerate().filter(|(_, x)| x == m) {
                let is = hi.eq(h as i32).broadcast_to(k.shape());
                mine = Some(match mine {
                    Some(x) => x | is,
                    None => is,
                });
            }
            let here = mask_tile(m, q, k).unwrap_or_else(all);
            out = select(mine.expect("a distinct mask has a head"), here, out);
        }
        out
    }
}

/// `[bq, bk]` bools: the pairs of computed step (`qi`, `ki`) of head
/// `hi` and kind `step` (1 partial, 2 full) that are visible: same
/// segment, in the mask unless the block is full (computed from positions
/// with a [`MaskedConfig::rule`], else the step's element mask), and
/// inside both sequences. The padding of the last blocks (whose segment
/// ids and mask rows are garbage or stale) is never visible.
#[kernel_fn]
pub(crate) fn visible_pairs(
    cfg: &MaskedConfig,
    (sq, skv): (usize, usize),
    (q_seg, kv_seg, masks): (Ref, Ref, Ref),
    step: Tile,
    (hi, qi, ki): (Tile, Tile, Tile),
) -> Tile {
    let (bq, bk) = (cfg.block_q, cfg.block_k);
    // Segment ids of the last blocks' padding are garbage: cleared before
    // they meet each other.
    let kseg_pos = iota(I32, [1, bk], 1) + ki * bk;
    let kseg = select(kseg_pos < skv as i32, kv_seg.load((0, .., ..)), -1);
    let mut qseg = q_seg.load((0, .., ..));
    if !sq.is_multiple_of(bq) {
        let qseg_pos = iota(I32, [bq, 1], 0) + qi * bq;
        qseg = select(qseg_pos < sq as i32, qseg, -2);
    }
    let same = qseg.broadcast_to([bq, bk]) == kseg.broadcast_to([bq, bk]);
    let k_pos = iota(I32, [bq, bk], 1) + ki * bk;
    let elem = if let Some(rule) = &cfg.rule {
        rule.visible_tile(hi, iota(I32, [bq, bk], 0) + qi * bq, k_pos)
    } else {
        masks.load((0, .., ..)) != 0
    };
    let mut visible = same & (elem | (step == 2)) & (k_pos < skv as i32);
    if !sq.is_multiple_of(bq) {
        let q_pos = iota(I32, [bq, bk], 0) + qi * bq;
        visible = visible & (q_pos < sq as i32);
    }
    visible
}

/// Tables of the wrong size for the grid are refused before they can index
/// past their ends: `(h, rows, cols)` must be `(h, nq, nk)` (`(h, nk, nq)`
/// when `transposed`, the dk/dv pass's).
pub(crate) fn check_tables(
    cfg: &MaskedConfig,
    (h, rows, cols): (usize, usize, usize),
    (sq, skv): (usize, usize),
    transposed: bool,
) -> Result<(), KernelErrors> {
    let (nq, nk) = (sq.div_ceil(cfg.block_q), skv.div_ceil(cfg.block_k));
    let want = if transposed { (nk, nq) } else { (nq, nk) };
    if (rows, cols) == want {
        return Ok(());
    }
    Err(KernelErrors::from(kernel_ir::KernelError::from(
        kernel_ir::ErrorKind::Config(format!(
            "the block tables are [{h}, {rows}, {cols}] but {sq} queries and {skv} keys in blocks of {} x {} need [{h}, {}, {}]{}; build them with BlockTables::build for these sizes",
            cfg.block_q,
            cfg.block_k,
            want.0,
            want.1,
            if transposed { " (transposed)" } else { "" }
        )),
    )))
}

/// What the forward and dq kernels read first, per query block: the
/// `[h, nq, nk]` tables (`kind`, `fetch`, `mask_fetch`), q, and the k/v
/// block `fetch` names for each step (GQA: the query head's kv head).
#[operands]
pub(crate) struct TablesQkv<T> {
    #[shape(h, nq, nk)]
    kind: Prefetch,
    #[shape(h, nq, nk)]
    fetch: Prefetch,
    #[shape(h, nq, nk)]
    mask_fetch: Prefetch,
    #[shape(b, h, sq, d)]
    #[block([1, 1, cfg.block_q, d], |bi, hi, i, _j| (bi, hi, i, 0))]
    q: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hi, i, j| (bi, hi / group(h, hkv), fetch[(hi, i, j)], 0))]
    k: In<T>,
    #[shape(b, hkv, skv, d)]
    #[block([1, 1, cfg.block_k, d], |bi, hi, i, j| (bi, hi / group(h, hkv), fetch[(hi, i, j)], 0))]
    v: In<T>,
}

/// The element masks (`mask_fetch` picks one per step) and the segment ids
/// of the q rows and of the fetched k block.
#[operands]
pub(crate) struct Segments {
    #[shape(n, cfg.block_q, cfg.block_k)]
    #[block([1, cfg.block_q, cfg.block_k], |_bi, hi, i, j| (mask_fetch[(hi, i, j)], 0, 0))]
    masks: In<i32>,
    #[shape(b, sq, 1)]
    #[block([1, cfg.block_q, 1], |bi, _hi, i, _j| (bi, i, 0))]
    q_seg: In<i32>,
    #[shape(b, 1, skv)]
    #[block([1, 1, cfg.block_k], |bi, hi, i, j| (bi, 0, fetch[(hi, i, j)]))]
    kv_seg: In<i32>,
}

/// Forward over `[b, h, sq, d]` queries and `[b, hkv, skv, d]` keys and
/// values, driven by the tables of an `h`-head mask at `block_q` ×
/// `block_k`: `kind`, `fetch`, `mask_fetch` (`[h, nq, nk]` i32) and the
/// element masks `masks` (`[n, bq, bk]` i32, nonzero visible); segment ids
/// `q_seg: [b, sq, 1]`, `kv_seg: [b, 1, skv]` (i32). Outputs `o` and
/// `lse: [b, h, sq, 1]`; a row with no visible key gives 0 and −∞.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(sq, cfg.block_q), kernel_ir::cdiv(skv, cfg.block_k)),
    semantics = (parallel, parallel, parallel, arbitrary),
    check = {
        crate::attention::check_heads(h, hkv)?;
        check_tables(cfg, (h, nq, nk), (sq, skv), false)
    }
)]
pub fn masked_attention<T: Float>(
    cfg: &MaskedConfig,
    #[operands] _: TablesQkv<T>,
    #[operands] _: Segments,
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
        let visible = visible_pairs(cfg, (sq, skv), (q_seg, kv_seg, masks), step, (hi, qi, ki));
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
