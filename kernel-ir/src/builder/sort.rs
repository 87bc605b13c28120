//! Sorting along an axis of a tile: a bitonic network of
//! compare-and-exchange stages, each element's partner fetched with two
//! rolls and chosen with selects, so every path runs it (the TPU compiler
//! takes it as compare-and-select code; `lax.sort` does not lower inside
//! Pallas TPU kernels).
//!
//! One order everywhere, as `top_k`'s: ascending, NaN after every number,
//! equal values in their original order (the network compares (value,
//! index) pairs, so it is stable).
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! let mut k = KernelBuilder::new("sorted");
//! k.grid([1], [Parallel]);
//! let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let s = k.output("s", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let i = k.output("i", I32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let xv = x.load(..);
//! // The sorted rows and, from a second network, where each value was.
//! s.store(.., xv.sort(1));
//! i.store(.., xv.argsort(1));
//! let kernel = k.build().unwrap();
//! let data: Vec<f64> = (0..8 * 128).map(|i| ((i * 37) % 128) as f64).collect();
//! let out = interpret(&kernel, &[Array::new(F32, [8, 128], data).unwrap()]).unwrap();
//! assert_eq!(&out[0].data()[..3], &[0.0, 1.0, 2.0]);
//! // 0 sits at column 0, 1 at column 45 (45 · 37 = 13 · 128 + 1).
//! assert_eq!(&out[1].data()[..2], &[0.0, 45.0]);
//! ```

use super::state;
use super::tile::{Tile, iota, select, widened};
use crate::error::ErrorKind;
use crate::{DType, Loc};

impl Tile {
    /// The elements along `axis` in ascending order, NaN last (the axis
    /// size must be a power of two).
    #[track_caller]
    pub fn sort(self, axis: usize) -> Tile {
        sort_by_key(self, &[], axis).0
    }

    /// The indices (`i32`) that sort `self` along `axis`: element `j` is
    /// the index of the `j`-th smallest, equal values by index.
    #[track_caller]
    pub fn argsort(self, axis: usize) -> Tile {
        // The network carries each element's index already.
        match network(self, &[], axis) {
            Some(sorted) => sorted.index,
            None => iota(DType::I32, self.shape(), axis),
        }
    }
}

/// Sorts `keys` along `axis` (ascending, NaN last, stable) and moves each
/// of `values` (tiles of the keys' shape) the same way: returns the sorted
/// keys and the values in their order. The axis size must be a power of
/// two; a network of `log₂ n · (log₂ n + 1) / 2` stages, each two rolls
/// and a select per tile.
#[track_caller]
pub fn sort_by_key(keys: Tile, values: &[Tile], axis: usize) -> (Tile, Vec<Tile>) {
    match network(keys, values, axis) {
        Some(sorted) => (sorted.keys, sorted.values),
        None => (keys, values.to_vec()),
    }
}

/// What the network leaves: the keys in order, where each came from, and
/// the values moved with them.
struct Sorted {
    keys: Tile,
    index: Tile,
    values: Vec<Tile>,
}

/// The bitonic network over `keys` and `values`, or `None` where the axis
/// is not a power of two (an error at the caller) or not there (the roll
/// reports it).
#[track_caller]
fn network(keys: Tile, values: &[Tile], axis: usize) -> Option<Sorted> {
    let loc = Loc::caller();
    let shape = keys.shape();
    let Some(&n) = shape.get(axis) else {
        // Recorded for its error: the roll names the bad axis at the caller.
        keys.roll(0, axis);
        return None;
    };
    if !n.is_power_of_two() {
        state::with(keys.builder, |st| {
            st.error(
                ErrorKind::Axis {
                    op: "sort",
                    detail: format!(
                        "a bitonic sort needs a power-of-two axis, and axis {axis} has {n} \
                         elements; pad it (with NaN or +inf, which sort last) to {}",
                        n.next_power_of_two()
                    ),
                },
                Some(loc),
            )
        });
        return None;
    }
    // Narrow floats compare in f32 (exact), as top_k's do.
    let mut key = widened(keys);
    let position = iota(DType::I32, shape, axis);
    let mut index = position;
    let mut moved = values.to_vec();
    let mut block = 2;
    while block <= n {
        let ascending = (position & block as i32).eq(0);
        let mut span = block / 2;
        while span >= 1 {
            let lower = (position & span as i32).eq(0);
            // The partner is `span` above a lower element, below an upper.
            let partner = |t: Tile| {
                select(
                    lower,
                    t.roll(-(span as i64), axis),
                    t.roll(span as i64, axis),
                )
            };
            let (other_key, other_index) = (partner(key), partner(index));
            let first = comes_first(key, index, other_key, other_index);
            // A lower element of an ascending block keeps the smaller pair.
            let keep = lower ^ ascending ^ first;
            key = select(keep, key, other_key);
            for v in &mut moved {
                *v = select(keep, *v, partner(*v));
            }
            index = select(keep, index, other_index);
            span /= 2;
        }
        block *= 2;
    }
    Some(Sorted {
        keys: key.convert(keys.dtype()),
        index,
        values: moved,
    })
}

/// Whether `(a, ia)` sorts before `(b, ib)`: the smaller value first, NaN
/// after every number, equal values (NaN with NaN) by index.
#[track_caller]
fn comes_first(a: Tile, ia: Tile, b: Tile, ib: Tile) -> Tile {
    let by_index = ia.lt(ib);
    if a.dtype().is_float() {
        let (a_nan, b_nan) = (a.ne(a), b.ne(b));
        let equal = a.eq(b) | (a_nan & b_nan);
        a.lt(b) | (!a_nan & b_nan) | (equal & by_index)
    } else {
        a.lt(b) | (a.eq(b) & by_index)
    }
}
