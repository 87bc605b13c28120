//! Loads from element windows with low padding, on Mosaic.
//!
//! libtpu takes element windows (`#tpu.element_window`) but no low padding
//! ("Low padding not supported yet"). So the window Mosaic fetches starts
//! at `max(v − low, 0)` in the array padded only after
//! (`kernel_module`'s transform): `δ = max(low − v, 0)` elements after
//! the window the kernel means, which starts in the low padding. The
//! kernel's window is then Mosaic's rotated down by `δ` (`jnp.roll`): every
//! element inside the array lands where the kernel expects it, and what
//! lands on the first `δ` is the padding, undefined as promised. A load
//! rotates the whole window and cuts out its part.

use melior::ir::Block;

use kernel_ir::{BufferRef, Index, IndexValue, Op, TileType};

use super::BodyEmitter;
use crate::LoweringError;
use crate::convention::Flavor;
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    /// A DMA would see Mosaic's window, not the kernel's: refused.
    pub(super) fn check_not_rebased(
        &self,
        op: &Op,
        c: &kernel_ir::CopyDescriptor,
    ) -> Result<(), LoweringError> {
        for s in [&c.src, &c.dst] {
            if let BufferRef::Operand(i) = s.buffer
                && self.flavor == Flavor::Mosaic
                && let Some(pad) = &self.k.operands[i].block.element
                && pad.low.iter().any(|&l| l > 0)
            {
                return Err(self.unsupported(
                    op,
                    &format!(
                        "operand `{}` is an element window with low padding, which the TPU fetches shifted and rotates into place at each load: load it and store the tile where the copy should go",
                        self.k.operands[i].name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The load of `indices` from `b` when it is an element window with
    /// low padding on Mosaic; `None` for every other load.
    pub(super) fn load_rebased(
        &mut self,
        op: &Op,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
        rt: &TileType,
    ) -> Result<Option<Raw>, LoweringError> {
        let BufferRef::Operand(i) = b else {
            return Ok(None);
        };
        let o = &self.k.operands[i];
        let Some(pad) = &o.block.element else {
            return Ok(None);
        };
        if self.flavor != Flavor::Mosaic || pad.low.iter().all(|&l| l == 0) {
            return Ok(None);
        }
        if self.window(b).is_some_and(|w| !w.physical.is_empty()) {
            return Err(self.unsupported(
                op,
                &format!(
                    "operand `{}` is an element window with low padding in a transposed layout; give it the row-major layout",
                    o.name
                ),
            ));
        }
        let (mut offsets, mut sizes, mut kept) = (Vec::new(), Vec::new(), Vec::new());
        for ix in indices {
            let (start, len, keep) = match ix {
                Index::Slice { start, len } => (start, *len, true),
                Index::Point(p) => (p, 1, false),
            };
            let IndexValue::Static(s) = start else {
                return Err(self.unsupported(
                    op,
                    &format!(
                        "operand `{}` is an element window with low padding, which the TPU reads rotated into place: index it with static starts (load the window and slice the tile)",
                        o.name
                    ),
                ));
            };
            offsets.push(*s);
            sizes.push(len as i64);
            if keep {
                kept.push(len);
            }
        }
        let (shape, exprs, low) = (
            o.block.shape.clone(),
            o.block.index_map.exprs.clone(),
            pad.low.clone(),
        );
        let whole: Vec<Index> = shape
            .iter()
            .map(|&len| Index::Slice {
                start: IndexValue::Static(0),
                len,
            })
            .collect();
        let whole_ty = TileType::new(rt.dtype, shape.clone());
        let window = self.load(block, b, &whole, &whole_ty)?;
        let ir = self.ir;
        let grid = self.args[..self.k.grid.rank()].to_vec();
        let prefetch: Vec<Raw> = (0..self.k.prefetch.len())
            .map(|p| self.base(BufferRef::Prefetch(p), false))
            .collect();
        let mut deltas = Vec::new();
        for (d, &l) in low.iter().enumerate().filter(|(_, l)| **l > 0) {
            let at = crate::index_expr::index_expr(ir, block, &exprs[d], &grid, &prefetch)?;
            let l = self.i32_const(block, l as i64)?;
            let zero = self.i32_const(block, 0)?;
            let back = ir.op1(block, "arith.subi", &[l, at], ir.i32(), Vec::new())?;
            let delta = ir.op1(block, "arith.maxsi", &[back, zero], ir.i32(), Vec::new())?;
            deltas.push((d, delta));
        }
        let kept_ty = TileType::new(rt.dtype, kept);
        let v = self.rearranged(block, &[(window, whole_ty)], &kept_ty, |xs, out| {
            // In the type the move runs in (bools as i32).
            let at = |shape: Vec<usize>| TileType::new(out.dtype, shape);
            let mut v = xs[0];
            for &(d, delta) in &deltas {
                v = ir.op1(
                    block,
                    "tpu.dynamic_rotate",
                    &[v, delta],
                    ir.tile(&at(shape.clone())),
                    vec![("dimension", ir.parse_attr(&format!("{d} : si32"))?)],
                )?;
            }
            let cut: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
            if offsets.iter().any(|&o| o != 0) || cut != shape {
                v = self.strided_slice(block, v, &offsets, &sizes, &at(cut.clone()))?;
            }
            if out.shape != cut {
                v = ir.op1(block, "vector.shape_cast", &[v], ir.tile(out), Vec::new())?;
            }
            Ok(v)
        })?;
        Ok(Some(v))
    }
}
