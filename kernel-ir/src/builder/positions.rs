//! Where a block sits in its array, as a tile: `Ref::positions`, the
//! `iota(..) + index * block` every mask is built from, read off the
//! operand's own index map so the tiling is stated once.
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // Zero the rows past a ragged end: rows at or past `n` of the block.
//! let mut k = KernelBuilder::new("ragged");
//! k.grid([2], [Parallel]);
//! let x = k.input("x", F32, [12, 128]).block([8, 128], |[i]| (i, 0));
//! let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
//! o.store(.., select(x.positions(0).lt(12), x.load(..), 0.0));
//! let kernel = k.build().unwrap();
//! let out = interpret(&kernel, &[Array::random(F32, [12, 128], 1, 1.0, 2.0)]).unwrap();
//! assert!(out[0].data()[11 * 128] >= 1.0);
//! assert_eq!(out[0].data()[12 * 128], 0.0);
//! ```

use super::refs::Ref;
use super::state;
use super::tile::{Tile, constant, iota, program_id, select};
use crate::{BufferRef, DType, IndexExpr, IndexOp, MemorySpace};

impl Ref {
    /// The array index of each element of this buffer's block along
    /// `axis`, as an `i32` tile of the block's shape: `iota` plus where
    /// this grid step's block starts, from the operand's index map (block
    /// index × block size; for an element window its offset less the low
    /// padding, negative inside the padding). What masks compare with a
    /// length or another position: `x.positions(0).lt(n)` keeps the rows
    /// before a ragged end, `k.positions(0).le(q_row)` a causal band. For
    /// scratch, scalar prefetch and `any` operands it is the plain `iota`.
    #[track_caller]
    pub fn positions(self, axis: usize) -> Tile {
        let shape = self.shape();
        let spec = match self.buffer() {
            BufferRef::Operand(i) => state::with(self.builder_id(), |st| {
                st.sig
                    .operands
                    .get(i)
                    .filter(|o| o.space != MemorySpace::Any)
                    .map(|o| o.block.clone())
            })
            .flatten(),
            _ => None,
        };
        let at = iota(DType::I32, shape, axis);
        let Some(spec) = spec else {
            return at;
        };
        let Some(e) = spec.index_map.exprs.get(axis) else {
            // The iota reports the bad axis at the caller.
            return at;
        };
        let v = index_tile(self.builder_id(), e);
        let start = match &spec.element {
            Some(pad) => v - pad.low.get(axis).copied().unwrap_or(0) as i32,
            None => v * spec.shape.get(axis).copied().unwrap_or(1) as i32,
        };
        at + start
    }
}

/// An index-map expression as a scalar `i32` tile of the body, with the
/// map's meaning: floor division and a remainder with the divisor's sign.
#[track_caller]
fn index_tile(builder: u32, e: &IndexExpr) -> Tile {
    match e {
        IndexExpr::Const(c) => constant(*c, DType::I32, []),
        IndexExpr::Grid(d) => program_id(*d),
        IndexExpr::Prefetch { operand, at } => {
            let idx: Vec<super::Idx> = at.iter().map(|a| index_tile(builder, a).into()).collect();
            Ref::new(BufferRef::Prefetch(*operand), builder).load(idx)
        }
        IndexExpr::Binary(op, a, b) => {
            let (a, b) = (index_tile(builder, a), index_tile(builder, b));
            match op {
                IndexOp::Add => a + b,
                IndexOp::Sub => a - b,
                IndexOp::Mul => a * b,
                IndexOp::Min => a.min(b),
                IndexOp::Max => a.max(b),
                IndexOp::FloorDiv | IndexOp::Rem => {
                    // `/` and `%` truncate; step back where the remainder's
                    // sign differs from the divisor's.
                    let (q, r) = (a / b, a % b);
                    let off = r.ne(0) & (r.lt(0) ^ b.lt(0));
                    if *op == IndexOp::FloorDiv {
                        select(off, q - 1, q)
                    } else {
                        select(off, r + b, r)
                    }
                }
            }
        }
    }
}
