//! Index arguments of `load` and `store`.

use std::ops::{Range, RangeFrom, RangeFull, RangeTo};

use super::Tile;

/// Where a dynamic slice starts: a constant or an i32 scalar tile.
#[derive(Clone, Copy, Debug)]
pub enum Start {
    /// Known now.
    Static(i64),
    /// Known at run time.
    Dynamic(Tile),
}

impl From<i64> for Start {
    fn from(v: i64) -> Self {
        Start::Static(v)
    }
}
impl From<i32> for Start {
    fn from(v: i32) -> Self {
        Start::Static(v as i64)
    }
}
impl From<usize> for Start {
    fn from(v: usize) -> Self {
        Start::Static(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<Tile> for Start {
    fn from(t: Tile) -> Self {
        Start::Dynamic(t)
    }
}

/// How one buffer dim is indexed.
#[derive(Clone, Copy, Debug)]
pub enum Idx {
    /// The whole dim (`..`).
    Full,
    /// A static range; `end: None` means to the end of the dim.
    Range {
        /// First element.
        start: i64,
        /// One past the last, or the dim's end.
        end: Option<i64>,
    },
    /// One element; the dim is dropped from the tile.
    Point(Start),
    /// `len` elements from a (possibly dynamic) start: [`ds`].
    Dyn(Start, usize),
}

/// A slice of `len` elements starting at `start`, which may be a tile
/// (Pallas' `pl.ds`).
pub fn ds(start: impl Into<Start>, len: usize) -> Idx {
    Idx::Dyn(start.into(), len)
}

impl From<RangeFull> for Idx {
    fn from(_: RangeFull) -> Self {
        Idx::Full
    }
}
impl From<Tile> for Idx {
    fn from(t: Tile) -> Self {
        Idx::Point(Start::Dynamic(t))
    }
}
impl From<Start> for Idx {
    fn from(s: Start) -> Self {
        Idx::Point(s)
    }
}

macro_rules! int_idx {
    ($($t:ty),*) => {$(
        impl From<$t> for Idx {
            fn from(v: $t) -> Self {
                Idx::Point(Start::Static(v as i64))
            }
        }
        impl From<Range<$t>> for Idx {
            fn from(r: Range<$t>) -> Self {
                Idx::Range { start: r.start as i64, end: Some(r.end as i64) }
            }
        }
        impl From<RangeFrom<$t>> for Idx {
            fn from(r: RangeFrom<$t>) -> Self {
                Idx::Range { start: r.start as i64, end: None }
            }
        }
        impl From<RangeTo<$t>> for Idx {
            fn from(r: RangeTo<$t>) -> Self {
                Idx::Range { start: 0, end: Some(r.end as i64) }
            }
        }
    )*};
}
int_idx!(usize, i32, i64);

/// Anything that indexes a whole buffer: `..` (everything), `()` (a
/// scalar buffer), a tuple or array of [`Idx`]-convertible items, or a
/// `Vec<Idx>`.
pub trait IntoIndices {
    /// The indices; `None` stands for "every dim in full".
    fn into_indices(self) -> Option<Vec<Idx>>;
}

impl IntoIndices for RangeFull {
    fn into_indices(self) -> Option<Vec<Idx>> {
        None
    }
}
impl IntoIndices for () {
    fn into_indices(self) -> Option<Vec<Idx>> {
        Some(Vec::new())
    }
}
macro_rules! single_index {
    ($($t:ty),*) => {$(
        impl IntoIndices for $t {
            fn into_indices(self) -> Option<Vec<Idx>> {
                Some(vec![self.into()])
            }
        }
    )*};
}
// One index of a rank-1 buffer or semaphore array: `sems.at(slot)`.
single_index!(i32, i64, usize, Tile);

impl IntoIndices for Vec<Idx> {
    fn into_indices(self) -> Option<Vec<Idx>> {
        Some(self)
    }
}
impl<T: Into<Idx>, const N: usize> IntoIndices for [T; N] {
    fn into_indices(self) -> Option<Vec<Idx>> {
        Some(self.into_iter().map(Into::into).collect())
    }
}

macro_rules! tuple_indices {
    ($($name:ident),+) => {
        impl<$($name: Into<Idx>),+> IntoIndices for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_indices(self) -> Option<Vec<Idx>> {
                let ($($name,)+) = self;
                Some(vec![$($name.into()),+])
            }
        }
    };
}
tuple_indices!(A);
tuple_indices!(A, B);
tuple_indices!(A, B, C);
tuple_indices!(A, B, C, D);
tuple_indices!(A, B, C, D, E);
tuple_indices!(A, B, C, D, E, F);
