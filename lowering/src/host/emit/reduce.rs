//! Reductions over any axes, as loops of chunk accumulators.

use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{DType, ReduceOp, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::mlir::Raw;

impl<'c> HostEmitter<'_, 'c> {
    pub(super) fn reduce(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        op: ReduceOp,
        x: ValueId,
        axes: &[usize],
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let mut n = self.node(x)?;
        let out_d = n.ty.dtype;
        if is_half(out_d) {
            // Accumulate half floats in f32; round the result once.
            n = Rc::new(Node {
                ty: TileType::new(DType::F32, n.ty.shape.clone()),
                e: Expr::Convert(n),
            });
        }
        let d = n.ty.dtype;
        let shape = n.ty.shape.clone();
        let rank = shape.len();
        let out_ty = TileType::new(d, self.ty(r).shape.clone());
        let float = d.is_float();
        let (combine, kind) = match (op, float) {
            (ReduceOp::Sum, true) => ("arith.addf", "add"),
            (ReduceOp::Sum, false) => ("arith.addi", "add"),
            (ReduceOp::Max, true) => ("arith.maximumf", "maximumf"),
            (ReduceOp::Min, true) => ("arith.minimumf", "minimumf"),
            (ReduceOp::Max, false) => ("arith.maxsi", "maxsi"),
            (ReduceOp::Min, false) => ("arith.minsi", "minsi"),
        };
        let init = op.identity(d);
        let last_reduced = axes.contains(&(rank - 1));
        // The result buffer (a one-element buffer for a scalar result),
        // filled with the identity.
        let buf_ty = if out_ty.shape.is_empty() {
            TileType::new(d, vec![1])
        } else {
            out_ty.clone()
        };
        let out = self.alloc(b, &buf_ty)?;
        let ident = Node {
            e: Expr::Const(init),
            ty: buf_ty.clone(),
        };
        self.write(b, &ident, out)?;
        let out_index = |idx: &[Raw], zero: Raw| -> Vec<Raw> {
            let v: Vec<Raw> = idx
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, r)| *r)
                .collect();
            if v.is_empty() { vec![zero] } else { v }
        };
        if last_reduced {
            // One row at a time: vector partial results, then one
            // horizontal reduction. Up to four independent partials, so
            // that the combine's latency (4 cycles for a float add) does
            // not serialize the row.
            let w = chunk(shape[rank - 1]);
            let chunks = shape[rank - 1] / w;
            let parts = [4usize, 2, 1]
                .into_iter()
                .find(|p| chunks.is_multiple_of(*p))
                .unwrap_or(1);
            let lead = &shape[..rank - 1];
            let vty = self.vec_ty(w, d);
            self.for_each_chunk(b, lead, 1, &mut |blk, lidx| {
                let acc0 = ir.op1(
                    blk,
                    "arith.constant",
                    &[],
                    vty,
                    vec![("value", ir.literal(init, d, vty)?)],
                )?;
                let init = vec![acc0; parts];
                let mut accs = self.carried_loop(
                    blk,
                    (shape[rank - 1], w * parts),
                    &init,
                    vty,
                    &mut |inner, j0, carried| {
                        let mut accs = Vec::with_capacity(parts);
                        for (p, &acc) in carried.iter().enumerate() {
                            let mut full = lidx.to_vec();
                            let off = self.idx(inner, (p * w) as i64)?;
                            full.push(ir.op1(
                                inner,
                                "arith.addi",
                                &[j0, off],
                                ir.index(),
                                Vec::new(),
                            )?);
                            let v = self.eval(inner, &n, &full, w)?;
                            accs.push(ir.op1(inner, combine, &[acc, v], vty, Vec::new())?);
                        }
                        Ok(accs)
                    },
                )?;
                while accs.len() > 1 {
                    let (x, y) = (accs.remove(0), accs.remove(0));
                    accs.push(ir.op1(blk, combine, &[x, y], vty, Vec::new())?);
                }
                let acc = accs[0];
                let s = ir.op1(
                    blk,
                    "vector.reduction",
                    &[acc],
                    ir.elem(d),
                    vec![("kind", ir.parse_attr(&format!("#vector.kind<{kind}>"))?)],
                )?;
                let zero = self.idx(blk, 0)?;
                let mut at = vec![out];
                let oi = out_index(lidx, zero);
                at.extend(&oi);
                let old = ir.op1(blk, "memref.load", &at, ir.elem(d), Vec::new())?;
                let new = ir.op1(blk, combine, &[old, s], ir.elem(d), Vec::new())?;
                let mut st_ops = vec![new, out];
                st_ops.extend(oi);
                ir.op(blk, "memref.store", &st_ops, &[], Vec::new(), Vec::new())?;
                Ok(())
            })?;
        } else {
            // The last dim is kept: combine chunk by chunk into the result.
            let w = chunk(shape[rank - 1]);
            let vty = self.vec_ty(w, d);
            self.for_each_chunk(b, &shape, w, &mut |blk, idx| {
                let v = self.eval(blk, &n, idx, w)?;
                let zero = self.idx(blk, 0)?;
                let oi = out_index(idx, zero);
                let mut at = vec![out];
                at.extend(&oi);
                let old = ir.op1(blk, "vector.load", &at, vty, Vec::new())?;
                let new = ir.op1(blk, combine, &[old, v], vty, Vec::new())?;
                let mut ops = vec![new, out];
                ops.extend(oi);
                ir.op(blk, "vector.store", &ops, &[], Vec::new(), Vec::new())?;
                Ok(())
            })?;
        }
        if out_ty.shape.is_empty() {
            let z = self.idx(b, 0)?;
            let s = ir.op1(b, "memref.load", &[out, z], ir.elem(d), Vec::new())?;
            let s = self.round_scalar(b, s, d, out_d)?;
            self.set(r, Val::Scalar(s));
        } else if d == out_d {
            self.set(
                r,
                Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem: out },
                    ty: out_ty,
                })),
            );
        } else {
            let buf = Rc::new(Node {
                e: Expr::Buf { mem: out },
                ty: out_ty,
            });
            self.set(
                r,
                Val::Tile(Rc::new(Node {
                    e: Expr::Convert(buf),
                    ty: self.ty(r),
                })),
            );
            self.maybe_materialize(b, r)?;
        }
        Ok(())
    }

    /// Writes `n` into a new buffer whose dims are `n`'s dims permuted by
    /// `order` (result dim i = operand dim `order[i]`), in dtype `to`.
    pub(super) fn canonical(
        &mut self,
        b: &Block<'c>,
        n: &Rc<Node>,
        order: &[usize],
        to: DType,
    ) -> Result<Raw, LoweringError> {
        let src = Self::permuted(n, order);
        if src.ty.dtype == to {
            return self.materialize(b, &src);
        }
        let conv = Node {
            ty: TileType::new(to, src.ty.shape.clone()),
            e: Expr::Convert(src),
        };
        self.materialize(b, &conv)
    }
}
