//! Cutting a tile along an axis and joining tiles along one: static
//! slices and concatenation, one op each on every path (Mosaic's
//! `vector.extract_strided_slice` and `tpu.concatenate`, StableHLO's
//! `slice` and `concatenate`, gathers in Triton, index arithmetic in the
//! JIT).
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // The last 8 rows of a block on top of its first 8: a half swap.
//! let mut k = KernelBuilder::new("swap_halves");
//! k.grid([1], [Parallel]);
//! let x = k.input("x", F32, [16, 128]).block([16, 128], |[_]| (0, 0));
//! let o = k.output("o", F32, [16, 128]).block([16, 128], |[_]| (0, 0));
//! let xv = x.load(..);
//! o.store(.., concat([xv.slice(0, 8..), xv.slice(0, ..8)], 0));
//! let kernel = k.build().unwrap();
//! let data: Vec<f64> = (0..16 * 128).map(|i| i as f64).collect();
//! let out = interpret(&kernel, &[Array::new(F32, [16, 128], data.clone()).unwrap()]).unwrap();
//! assert_eq!(out[0].data()[0], data[8 * 128]);
//! assert_eq!(out[0].data()[8 * 128], data[0]);
//! ```

use std::ops::{Bound, RangeBounds};

use super::state::State;
use super::tile::{Tile, record};
use crate::{Loc, OpKind};

impl Tile {
    /// Elements `range` of `axis` (`x.slice(0, 8..24)`, `x.slice(1, ..64)`),
    /// the other dims whole. The range must keep at least one element and
    /// stay inside the axis; the verifier says so at the caller's line.
    #[track_caller]
    pub fn slice(self, axis: usize, range: impl RangeBounds<usize>) -> Tile {
        let loc = Loc::caller();
        let n = self.shape().get(axis).copied().unwrap_or(0);
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => n,
        };
        record(self.builder, |st: &mut State| {
            let x = st.own(self, &loc)?;
            let kind = OpKind::Slice {
                x,
                axis,
                start,
                len: end.saturating_sub(start),
            };
            st.push_op(kind, loc).first().copied()
        })
    }

    /// `self` then `other` along `axis`; every other dim and the element
    /// type must agree.
    #[track_caller]
    pub fn concat(self, other: Tile, axis: usize) -> Tile {
        let loc = Loc::caller();
        record(self.builder, |st: &mut State| {
            let lhs = st.own(self, &loc)?;
            let rhs = st.own(other, &loc)?;
            st.push_op(OpKind::Concat { lhs, rhs, axis }, loc)
                .first()
                .copied()
        })
    }
}

/// The tiles one after another along `axis` (`concat([a, b, c], 0)`), as
/// `jnp.concatenate`; at least one tile.
#[track_caller]
pub fn concat<const N: usize>(parts: [Tile; N], axis: usize) -> Tile {
    const { assert!(N > 0, "concat needs at least one tile") };
    // `parts[0]` exists: N > 0 is checked when the call compiles.
    parts[1..]
        .iter()
        .fold(parts[0], |out, &p| out.concat(p, axis))
}
