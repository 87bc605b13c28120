//! Scans along an axis of a tile. Prefix sums run on the matrix unit: the
//! sum over `i ≤ j` (or `i < j`) is a product with a triangular matrix of
//! ones made from two iotas, as TPU kernels for chunked linear attention
//! and state-space layers compute them. Any other associative op scans in
//! `⌈log₂ n⌉` rolls (Hillis and Steele's scan): [`Tile::scan`], with
//! `cumprod`, `cummax` and `cummin` built on it. A scan across grid steps
//! carries its running total in scratch (see `tests/it/language/scan.rs`).
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // Running products and running maxima along each row.
//! let mut k = KernelBuilder::new("running");
//! k.grid([1], [Parallel]);
//! let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let p = k.output("p", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let m = k.output("m", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let xv = x.load(..);
//! p.store(.., xv.cumprod(1));
//! m.store(.., xv.scan(1, |earlier, later| earlier.max(later)));
//! let kernel = k.build().unwrap();
//! let data: Vec<f64> = (0..8 * 128).map(|i| [1.0, 2.0, 0.5, 3.0][i % 4]).collect();
//! let out = interpret(&kernel, &[Array::new(F32, [8, 128], data).unwrap()]).unwrap();
//! assert_eq!(&out[0].data()[..4], &[1.0, 2.0, 1.0, 3.0]);
//! assert_eq!(&out[1].data()[..4], &[1.0, 2.0, 2.0, 3.0]);
//! ```

use super::tile::{IntoOperand, Tile, dot, iota, select, widened};
use crate::DType;

impl Tile {
    /// Inclusive prefix sum along `axis`: element `j` is the sum of
    /// elements `0..=j`. Floats sum in f32 (the result keeps the tile's
    /// dtype) in the matrix unit's order, so a cumsum is as accurate as
    /// a dot of its length. Integers sum exactly in an i32 dot, which runs
    /// on the CPU and GPU paths; TPUs have no i32 products (the verifier
    /// says so at the call): there, convert to f32 (exact below 2²⁴).
    #[track_caller]
    pub fn cumsum(self, axis: usize) -> Tile {
        prefix_sum(self, axis, false)
    }

    /// Exclusive prefix sum along `axis`: element `j` is the sum of
    /// elements `0..j` (element 0 is 0).
    #[track_caller]
    pub fn cumsum_exclusive(self, axis: usize) -> Tile {
        prefix_sum(self, axis, true)
    }
}

impl Tile {
    /// Inclusive scan along `axis` with an associative `op`: element `j` is
    /// `x[0] ⊕ x[1] ⊕ … ⊕ x[j]`, where `op(earlier, later)` combines two
    /// partial results in index order (so `op` need not commute). It takes
    /// `⌈log₂ n⌉` steps, each a roll, `op` and a select, and groups the
    /// terms as a tree, as `jax.lax.associative_scan` does: a float
    /// product's rounding differs from a left-to-right loop's.
    #[track_caller]
    pub fn scan(self, axis: usize, op: impl Fn(Tile, Tile) -> Tile) -> Tile {
        let shape = self.shape();
        let Some(&n) = shape.get(axis) else {
            // The roll reports the bad axis at the caller.
            return self.roll(0, axis);
        };
        let pos = iota(DType::I32, shape, axis);
        let mut y = self;
        let mut step = 1;
        while step < n {
            let combined = op(y.roll(step as i64, axis), y);
            y = select(pos.ge(step as i32), combined, y);
            step *= 2;
        }
        y
    }

    /// Exclusive scan along `axis`: element `j` combines `x[0..j]`, and
    /// element 0 is `identity` (the op's neutral value: 0 for a sum, 1 for
    /// a product, `-inf` for a max).
    #[track_caller]
    pub fn scan_exclusive(
        self,
        axis: usize,
        identity: impl IntoOperand,
        op: impl Fn(Tile, Tile) -> Tile,
    ) -> Tile {
        self.scan(axis, op).shift(1, axis, identity)
    }

    /// Inclusive running product along `axis`. Narrow floats multiply in
    /// f32 and round once at the end (as `cumsum` sums): rounded to bf16 at
    /// every step, a product of `n` terms drifts by up to ~`n` roundings.
    #[track_caller]
    pub fn cumprod(self, axis: usize) -> Tile {
        widened(self).scan(axis, |a, b| a * b).convert(self.dtype())
    }

    /// Inclusive running maximum along `axis`.
    #[track_caller]
    pub fn cummax(self, axis: usize) -> Tile {
        self.scan(axis, |a, b| a.max(b))
    }

    /// Inclusive running minimum along `axis`.
    #[track_caller]
    pub fn cummin(self, axis: usize) -> Tile {
        self.scan(axis, |a, b| a.min(b))
    }
}

#[track_caller]
fn prefix_sum(x: Tile, axis: usize, exclusive: bool) -> Tile {
    let shape = x.shape();
    let rank = shape.len();
    if rank == 0 || axis >= rank {
        // An out-of-range axis: the reduction reports it at the caller.
        return x.reduce(crate::ReduceOp::Sum, &[axis]);
    }
    let dtype = x.dtype();
    let wide = widened(x);
    // The scanned axis last, the others flattened into rows.
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(axis, rank - 1);
    let moved = if axis == rank - 1 {
        wide
    } else {
        wide.transpose(perm.clone())
    };
    let moved_shape = moved.shape();
    let n = moved_shape[rank - 1];
    let rows: usize = moved_shape[..rank - 1].iter().product();
    let flat = if rank == 2 {
        moved
    } else {
        moved.reshape([rows, n])
    };
    // ones[i, j] = 1 where i contributes to j.
    let (i, j) = (iota(flat.dtype(), [n, n], 0), iota(flat.dtype(), [n, n], 1));
    let ones = if exclusive { i.lt(j) } else { i.le(j) }.convert(flat.dtype());
    let summed = dot(flat, ones);
    let summed = if rank == 2 {
        summed
    } else {
        summed.reshape(moved_shape)
    };
    let back = if axis == rank - 1 {
        summed
    } else {
        summed.transpose(perm)
    };
    back.convert(dtype)
}
