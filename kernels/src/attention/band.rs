//! Which (query, key) pairs the causal mask and the sliding window leave
//! visible, written once.
//!
//! Both masks keep a band of diagonals, `lo ≤ q − k ≤ hi`: causal is
//! `0 ≤ q − k`, a window `w` adds `q − k ≤ w − 1` (and `−(w − 1) ≤ q − k`
//! when not causal). From the band come the element mask of a block
//! ([`Band::visible`]), and the range of key blocks a query block sees
//! ([`Band::key_blocks`]) or of query blocks a key block is seen by
//! ([`Band::query_blocks`]). One range answers both questions a skipped
//! step asks: is there work here ([`BlockRange::contains`], in the body),
//! and which block should the index map name ([`BlockRange::clamp`]): one
//! that a computed step needs, so a skipped step fetches nothing new.
//!
//! The ranges divide only values they first make non-negative, so a tile
//! (which divides toward zero) and an index map (toward −∞) compute the
//! same blocks.

use kernel_ir::dsl::Predicate;
use kernel_ir::{IndexExpr, IntExpr, Tile};

use super::AttnConfig;

/// The visible diagonals `lo ≤ q − k ≤ hi`; `None` leaves that side open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    /// The lowest visible `q − k`.
    pub lo: Option<i64>,
    /// The highest visible `q − k`.
    pub hi: Option<i64>,
}

impl Band {
    /// The band of `cfg`'s causal flag and window.
    pub fn of(cfg: &AttnConfig) -> Band {
        let w = cfg.window.map(|w| w as i64 - 1);
        Band {
            lo: if cfg.causal { Some(0) } else { w.map(|w| -w) },
            hi: w,
        }
    }

    /// True when every key is visible to every query.
    pub fn is_full(&self) -> bool {
        self.lo.is_none() && self.hi.is_none()
    }

    /// Element mask of positions `q_pos`, `k_pos` (i32 tiles of one
    /// shape); `None` when the band is full.
    pub fn visible(&self, q_pos: Tile, k_pos: Tile) -> Option<Tile> {
        if self.is_full() {
            return None;
        }
        let d = q_pos - k_pos;
        Some(match (self.lo, self.hi) {
            (Some(lo), None) => d.ge(lo),
            (None, Some(hi)) => d.le(hi),
            (Some(lo), Some(hi)) => d.ge(lo) & d.le(hi),
            (None, None) => unreachable!("the full band returned above"),
        })
    }

    /// Whether every (query, key) pair of block (`qi` of `bq` queries, `ki`
    /// of `bk` keys) is in the band (known true when the band is full):
    /// such a block needs no element mask. Its `q − k` runs from
    /// `qi·bq − ki·bk − (bk − 1)` to `qi·bq + bq − 1 − ki·bk`.
    pub fn block_inside(&self, qi: Tile, ki: Tile, bq: usize, bk: usize) -> Predicate {
        if self.is_full() {
            return Predicate::Known(true);
        }
        let (bq, bk) = (bq as i32, bk as i32);
        let base = qi * bq - ki * bk;
        let above = |lo: i64| (base - (bk - 1)).ge(lo as i32);
        let below = |hi: i64| (base + (bq - 1)).le(hi as i32);
        Predicate::Tile(match (self.lo, self.hi) {
            (Some(lo), None) => above(lo),
            (None, Some(hi)) => below(hi),
            (Some(lo), Some(hi)) => above(lo) & below(hi),
            (None, None) => unreachable!("the full band returned above"),
        })
    }

    /// The blocks of `bk` keys that query block `qi` (of `bq` rows, of
    /// `sq` queries) sees, also bounded by a valid key count `kv_len`
    /// (keys `≥ kv_len` hidden).
    pub fn key_blocks<E: IntExpr>(
        &self,
        qi: E,
        (bq, sq): (usize, usize),
        bk: usize,
        kv_len: Option<E>,
    ) -> BlockRange<E> {
        let q0 = || qi.clone() * bq as i64;
        let (bq, bk) = (bq as i64, bk as i64);
        // Keys k ≥ q0 − hi and k < q_end − lo (and k < kv_len), q_end
        // one past the block's last real query.
        let first = self
            .hi
            .map(|hi| Quotient::new(offset(q0(), -hi).max_const(0), bk));
        let ragged = sq as i64 % bq.max(1) != 0;
        let end_key = |lo: i64| {
            if ragged {
                offset(offset(q0(), bq).min_const(sq as i64), -lo)
            } else {
                offset(q0(), bq - lo)
            }
        };
        // ⌈end_key / bk⌉ as (end_key + bk − 1) / bk: end_key ≥ 0 unless
        // kv_len < 0, and then the end is ≤ 0 either way: no block.
        let end = match (self.lo, kv_len.clone()) {
            (Some(lo), Some(len)) => Some(offset(end_key(lo).min(len), bk - 1)),
            (Some(lo), None) if ragged => Some(offset(end_key(lo), bk - 1)),
            (Some(lo), None) => Some(offset(q0(), bq - lo + bk - 1)),
            (None, Some(len)) => Some(offset(len, bk - 1)),
            (None, None) => None,
        };
        BlockRange {
            first,
            end: end.map(|e| Quotient::new(e, bk)),
            may_be_empty: kv_len.is_some(),
        }
    }

    /// The blocks of `bq` queries that see key block `ki` (of `bk` keys,
    /// of `skv`).
    pub fn query_blocks<E: IntExpr>(
        &self,
        ki: E,
        bq: usize,
        (bk, skv): (usize, usize),
    ) -> BlockRange<E> {
        let k0 = || ki.clone() * bk as i64;
        let (bq, bk) = (bq as i64, bk as i64);
        // Queries q ≥ k0 + lo and q < k_end + hi, k_end one past the
        // block's last real key.
        let end = |hi: i64| {
            if skv as i64 % bk.max(1) != 0 {
                offset(offset(k0(), bk).min_const(skv as i64), hi + bq - 1)
            } else {
                offset(k0(), bk + hi + bq - 1)
            }
        };
        BlockRange {
            first: self
                .lo
                .map(|lo| Quotient::new(offset(k0(), lo).max_const(0), bq)),
            end: self.hi.map(|hi| Quotient::new(end(hi), bq)),
            may_be_empty: false,
        }
    }
}

/// Blocks `first..end` along one grid dim; `None` leaves a side open
/// (block 0, past the last block).
#[derive(Clone, Debug)]
pub struct BlockRange<E> {
    /// The first block with work, if bounded (≥ 0).
    pub first: Option<Quotient<E>>,
    /// One past the last block with work, if bounded.
    pub end: Option<Quotient<E>>,
    /// Whether `end` can be 0 (no block has work: a valid length of 0).
    pub may_be_empty: bool,
}

/// A block bound `⌊num / by⌋`, kept as its numerator so that a kernel body
/// can test a block against it without dividing: libtpu's static profiler
/// cannot evaluate a division of grid indices, and an `if` on one ran no
/// work in its replay (the causal forward's trace had 0 of its 1,152
/// MXU passes), while the same test by multiplication is followed.
/// `num ≥ 0` for a first block; a negative `num` for an end means no
/// block, either way.
#[derive(Clone, Debug)]
pub struct Quotient<E> {
    /// The numerator.
    pub num: E,
    /// The divisor (> 0).
    pub by: i64,
}

impl<E: IntExpr> Quotient<E> {
    fn new(num: E, by: i64) -> Quotient<E> {
        Quotient { num, by }
    }

    /// The bound itself (for index maps).
    pub fn value(self) -> E {
        self.num.div_nonneg(self.by)
    }
}

impl BlockRange<Tile> {
    /// Whether block `j` has work (known true when every block has). By
    /// multiplication only: `j ≥ ⌊f / b⌋ ⇔ j·b + b − 1 ≥ f` and
    /// `j < ⌊e / b⌋ ⇔ j·b + b ≤ e`, for `j ≥ 0` (see [`Quotient`]).
    pub fn contains(self, j: Tile) -> Predicate {
        let at_or_after = |f: Quotient<Tile>| (j * f.by as i32 + (f.by - 1) as i32).ge(f.num);
        let before = |e: Quotient<Tile>| (j * e.by as i32 + e.by as i32).le(e.num);
        let first = self
            .first
            .map_or(Predicate::Known(true), |f| at_or_after(f).into());
        let end = self
            .end
            .map_or(Predicate::Known(true), |e| before(e).into());
        first & end
    }
}

impl BlockRange<IndexExpr> {
    /// The block grid step `j` of `n` fetches: `j` inside the range, the
    /// nearest end of it outside (a block a computed step uses, so the
    /// pipeline keeps it), and always a block of the array.
    pub fn clamp(self, j: IndexExpr, n: usize) -> IndexExpr {
        let n = n as i64;
        let j = match self.end.map(Quotient::value) {
            None => j,
            Some(e) if self.may_be_empty => j.min(e - 1i64).max(0i64),
            Some(e) => j.min(e - 1i64),
        };
        match self.first.map(Quotient::value) {
            None => j,
            // first may lie past the array (queries past every key).
            Some(f) => j.max(f).min(n - 1),
        }
    }
}

/// `e + c`, without a `+ 0` in the printed IR.
fn offset<E: IntExpr>(e: E, c: i64) -> E {
    match c {
        0 => e,
        c if c > 0 => e + c,
        c => e - c.saturating_neg(),
    }
}
