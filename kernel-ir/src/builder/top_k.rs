//! Arg-max, arg-min and top-k along an axis of a tile, made of
//! reductions, compares and selects, so they lower on every path and the
//! TPU compiler takes them as compare-and-select code (`lax.top_k` does not
//! lower inside Pallas TPU kernels).
//!
//! One rule everywhere: among equal values the lowest index wins, and NaN
//! counts as larger than every number (`jnp.argmax` returns the first
//! NaN's index; `argmin` likewise prefers NaN, as `jnp.argmin` does).
//!
//! ```
//! use kernel_ir::prelude::*;
//! use kernel_ir::top_k;
//!
//! // The top 2 of each row of router logits: values and expert indices.
//! let mut k = KernelBuilder::new("router");
//! k.grid([1], [Parallel]);
//! let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let v = k.output("v", F32, [8, 2]).block([8, 2], |[_]| (0, 0));
//! let i = k.output("i", I32, [8, 2]).block([8, 2], |[_]| (0, 0));
//! let (values, indices) = top_k(x.load(..), 2, 1);
//! v.store(.., values);
//! i.store(.., indices);
//! let kernel = k.build().unwrap();
//! let mut data = vec![0.0; 8 * 128];
//! data[5] = 3.0;
//! data[9] = 3.0; // a tie: the lower index comes first
//! let out = interpret(&kernel, &[Array::new(F32, [8, 128], data).unwrap()]).unwrap();
//! assert_eq!(&out[0].data()[..2], &[3.0, 3.0]);
//! assert_eq!(&out[1].data()[..2], &[5.0, 9.0]);
//! ```

use super::tile::{IntoOperand, Operand, Tile, constant, iota, select, widened};
use crate::DType;

/// The smallest value of `dtype` (−∞ for floats): what a taken element
/// becomes so it is not picked again.
fn lowest(dtype: DType) -> Operand {
    match dtype {
        DType::I32 => i32::MIN.into_operand(),
        DType::I8 => i32::from(i8::MIN).into_operand(),
        _ => f64::NEG_INFINITY.into_operand(),
    }
}

/// Where `x` equals `m` (its max or min along the axis, broadcast), NaN
/// matching NaN.
#[track_caller]
fn hits(x: Tile, m: Tile) -> Tile {
    if x.dtype().is_float() {
        x.eq(m) | (x.ne(x) & m.ne(m))
    } else {
        x.eq(m)
    }
}

/// The lowest index along `axis` where `hit` is true, keeping the axis as
/// 1 (`n` where none is).
#[track_caller]
fn first(hit: Tile, axis: usize) -> Tile {
    let shape = hit.shape();
    let n = shape.get(axis).copied().unwrap_or(1);
    let index = iota(DType::I32, shape, axis);
    select(hit, index, i32::try_from(n).unwrap_or(i32::MAX)).min_keep(axis)
}

impl Tile {
    /// The index of the largest element along `axis` (`i32`, the axis
    /// kept as 1): the lowest index among equal ones, NaN above every
    /// number.
    #[track_caller]
    pub fn argmax_keep(self, axis: usize) -> Tile {
        let x = widened(self);
        first(hits(x, x.max_keep(axis)), axis)
    }

    /// The index of the smallest element along `axis` (`i32`, the axis
    /// kept as 1): the lowest index among equal ones, NaN first.
    #[track_caller]
    pub fn argmin_keep(self, axis: usize) -> Tile {
        let x = widened(self);
        first(hits(x, x.min_keep(axis)), axis)
    }
}

/// The `k` largest elements along `axis` of `x`, largest first, and their
/// indices (`i32`): tiles of `x`'s shape with `axis` of size `k`. Ties
/// take the lower index first; NaN counts as the largest. `k` passes of a
/// max, a first-index search and a mask, each over the whole tile: meant
/// for small `k` (routers pick 1 to 8 experts).
#[track_caller]
pub fn top_k(x: Tile, k: usize, axis: usize) -> (Tile, Tile) {
    let dtype = x.dtype();
    let rest = widened(x);
    let shape = rest.shape();
    let mut out_shape = shape.clone();
    if let Some(d) = out_shape.get_mut(axis) {
        *d = k;
    }
    let slot = iota(DType::I32, out_shape.clone(), axis);
    let index = iota(DType::I32, shape.clone(), axis);
    let mut values = constant(0, rest.dtype(), out_shape.clone());
    let mut indices = constant(0, DType::I32, out_shape.clone());
    let mut taken = constant(false, DType::Bool, shape);
    for j in 0..k {
        let candidates = select(taken, lowest(rest.dtype()), rest);
        let m = candidates.max_keep(axis);
        let at = first(hits(candidates, m) & !taken, axis);
        let here = slot.eq(j as i64);
        values = select(here, m.broadcast_to(out_shape.clone()), values);
        indices = select(here, at.broadcast_to(out_shape.clone()), indices);
        taken = taken | index.eq(at);
    }
    (values.convert(dtype), indices)
}
