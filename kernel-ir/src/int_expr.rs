//! Integer arithmetic that both a kernel body and an index map compute.
//!
//! A block geometry (which blocks a mask hides) decides two things: which
//! grid steps skip their compute (the body, on i32 scalar [`Tile`]s) and
//! which block a step fetches (the index map, on [`IndexExpr`]s). Written
//! once over [`IntExpr`], the two cannot drift apart.

use std::ops::{Add, Mul, Sub};

use crate::{IndexExpr, Tile};

/// An integer expression of a kernel body ([`Tile`], i32 scalars) or of an
/// index map ([`IndexExpr`]).
///
/// ```
/// use kernel_ir::{IndexExpr, IntExpr};
///
/// /// The last block of `bk` keys that query block `qi` (of `bq` rows) may see
/// /// under a causal mask.
/// fn last_key_block<E: IntExpr>(qi: E, bq: i64, bk: i64) -> E {
///     (qi * bq + (bq - 1)).div_nonneg(bk)
/// }
/// let e = last_key_block(IndexExpr::grid(0), 64, 128);
/// assert_eq!(e.eval_static(&[3]).unwrap(), 1); // rows 192..256 see keys < 256
/// ```
pub trait IntExpr:
    Clone
    + Add<i64, Output = Self>
    + Sub<i64, Output = Self>
    + Mul<i64, Output = Self>
    + Add<Self, Output = Self>
    + Sub<Self, Output = Self>
{
    /// `min(self, other)`.
    fn min(self, other: Self) -> Self;
    /// `max(self, other)`.
    fn max(self, other: Self) -> Self;
    /// `min(self, c)`.
    fn min_const(self, c: i64) -> Self;
    /// `max(self, c)`.
    fn max_const(self, c: i64) -> Self;
    /// `self / d` for `self ≥ 0` and `d > 0`: one op on both sides. For a
    /// negative `self` the two round differently (a tile toward zero, an
    /// index map toward −∞), so a geometry clamps to 0 before dividing.
    fn div_nonneg(self, d: i64) -> Self;
}

impl IntExpr for IndexExpr {
    fn min(self, other: Self) -> Self {
        IndexExpr::min(self, other)
    }
    fn max(self, other: Self) -> Self {
        IndexExpr::max(self, other)
    }
    fn min_const(self, c: i64) -> Self {
        IndexExpr::min(self, c)
    }
    fn max_const(self, c: i64) -> Self {
        IndexExpr::max(self, c)
    }
    fn div_nonneg(self, d: i64) -> Self {
        self / d
    }
}

impl IntExpr for Tile {
    #[track_caller]
    fn min(self, other: Self) -> Self {
        Tile::min(self, other)
    }
    #[track_caller]
    fn max(self, other: Self) -> Self {
        Tile::max(self, other)
    }
    #[track_caller]
    fn min_const(self, c: i64) -> Self {
        Tile::min(self, c)
    }
    #[track_caller]
    fn max_const(self, c: i64) -> Self {
        Tile::max(self, c)
    }
    #[track_caller]
    fn div_nonneg(self, d: i64) -> Self {
        self / d
    }
}
