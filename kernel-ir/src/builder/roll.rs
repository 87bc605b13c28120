//! Rotating and shifting a tile along an axis: `roll` is one op on every
//! path (Mosaic's `tpu.dynamic_rotate`, as Pallas's `pltpu.roll`; slices
//! and a concatenate in StableHLO; a gather in Triton); `shift` is a roll
//! whose wrapped-in elements are replaced by a fill value.
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // Each element minus its left neighbour (0 left of the first).
//! let mut k = KernelBuilder::new("diff");
//! k.grid([1], [Parallel]);
//! let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let o = k.output("o", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let xv = x.load(..);
//! o.store(.., xv - xv.shift(1, 1, 0.0));
//! let kernel = k.build().unwrap();
//! let data: Vec<f64> = (0..8 * 128).map(|i| (i % 128 * i % 128) as f64).collect();
//! let out = interpret(&kernel, &[Array::new(F32, [8, 128], data.clone()).unwrap()]).unwrap();
//! assert_eq!(out[0].data()[0], 0.0);
//! assert_eq!(out[0].data()[5], data[5] - data[4]);
//! ```

use super::state::State;
use super::tile::{IntoOperand, Tile, iota, record, select};
use crate::{DType, Loc, OpKind};

impl Tile {
    /// Rotates along `axis` as `jnp.roll`: element `i` of the result is
    /// element `(i - shift) mod n` of `self`, so a positive shift moves
    /// elements toward higher indices and the last `shift` wrap to the
    /// front. Any shift is taken mod `n` (negative ones move the other
    /// way).
    #[track_caller]
    pub fn roll(self, shift: i64, axis: usize) -> Tile {
        let loc = Loc::caller();
        let shift = match self.shape().get(axis) {
            Some(&n) if n > 0 => shift.rem_euclid(n as i64) as usize,
            _ => 0,
        };
        record(self.builder, |st: &mut State| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::Roll { x, shift, axis }, loc)
                .first()
                .copied()
        })
    }

    /// Moves elements `by` places along `axis` (toward higher indices when
    /// `by > 0`) and fills the places left empty with `fill`: element `i`
    /// is `self[i - by]` where that index is in range, else `fill`. A
    /// shift by the axis size or more is all `fill`.
    #[track_caller]
    pub fn shift(self, by: i64, axis: usize, fill: impl IntoOperand) -> Tile {
        let shape = self.shape();
        let Some(&n) = shape.get(axis) else {
            // The roll reports the bad axis at the caller.
            return self.roll(by, axis);
        };
        let n = n as i64;
        if by == 0 {
            return self;
        }
        let pos = iota(DType::I32, shape, axis);
        let kept = if by > 0 {
            pos.ge(by.min(n) as i32)
        } else {
            pos.lt((n + by).max(0) as i32)
        };
        select(kept, self.roll(by, axis), fill)
    }
}
