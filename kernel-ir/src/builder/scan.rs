//! Prefix sums along an axis of a tile, on the matrix unit: the sum over
//! `i ≤ j` (or `i < j`) is a product with a triangular matrix of ones made
//! from two iotas, as TPU kernels for chunked linear attention and
//! state-space layers compute them. A scan across grid steps carries its
//! running total in scratch (see `tests/it/language/scan.rs`).

use super::tile::{Tile, dot, iota};
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

#[track_caller]
fn prefix_sum(x: Tile, axis: usize, exclusive: bool) -> Tile {
    let shape = x.shape();
    let rank = shape.len();
    if rank == 0 || axis >= rank {
        // An out-of-range axis: the reduction reports it at the caller.
        return x.reduce(crate::ReduceOp::Sum, &[axis]);
    }
    let dtype = x.dtype();
    let wide = if dtype.is_float() {
        x.convert(DType::F32)
    } else {
        x
    };
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
    if back.dtype() == dtype {
        back
    } else {
        back.convert(dtype)
    }
}
