//! Kernel control flow: `for` loops with carried values and conditional
//! blocks, on the host's `scf` ops.

use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{IndexValue, Op, Region, ValueId};

use super::*;
use crate::LoweringError;
use crate::mlir::Raw;

impl<'c> HostEmitter<'_, 'c> {
    /// Binds the results of a loop or branch: tiles to the buffers they
    /// were written to, scalars to the op's SSA results in order.
    pub(super) fn bind_results(
        &mut self,
        results: &[ValueId],
        bufs: &[Option<Raw>],
        scalars: &[Raw],
    ) {
        let mut next = scalars.iter();
        for (r, buf) in results.iter().zip(bufs) {
            let v = match buf {
                Some(mem) => Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem: *mem },
                    ty: self.ty(*r),
                })),
                None => match next.next() {
                    Some(s) => Val::Scalar(*s),
                    None => continue,
                },
            };
            self.set(*r, v);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_loop(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        lower: &IndexValue,
        upper: &IndexValue,
        step: i64,
        init: &[ValueId],
        body: &Region,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let bound = |this: &Self, iv: &IndexValue| -> Result<Raw, LoweringError> {
            match iv {
                IndexValue::Static(s) => this.i32c(b, *s),
                IndexValue::Dynamic(v) => this.scalar(*v),
            }
        };
        let lo = bound(self, lower)?;
        let hi = bound(self, upper)?;
        let st = self.i32c(b, step)?;
        // Tiles carried by the loop live in fixed buffers; scalars are
        // loop-carried SSA values.
        let mut tile_bufs: Vec<Option<Raw>> = Vec::new();
        let mut scalar_init = Vec::new();
        let mut scalar_types = Vec::new();
        for v in init {
            match self.v(*v)? {
                Val::Scalar(s) => {
                    tile_bufs.push(None);
                    scalar_init.push(s);
                    scalar_types.push(ir.elem(reg(self.ty(*v).dtype)));
                }
                Val::Tile(n) => {
                    let buf = self.alloc(b, &n.ty)?;
                    self.write(b, &n, buf)?;
                    tile_bufs.push(Some(buf));
                }
            }
        }
        let mut types = vec![ir.i32()];
        types.extend(&scalar_types);
        let inner = ir.block(&types);
        let a = ir.args(&inner);
        self.set(body.args[0], Val::Scalar(a[0]));
        let mut si = 1;
        for (i, arg) in body.args[1..].iter().enumerate() {
            match tile_bufs[i] {
                Some(buf) => {
                    let ty = self.ty(*arg);
                    self.set(
                        *arg,
                        Val::Tile(Rc::new(Node {
                            e: Expr::Buf { mem: buf },
                            ty,
                        })),
                    );
                }
                None => {
                    self.set(*arg, Val::Scalar(a[si]));
                    si += 1;
                }
            }
        }
        let yields = self.region(&inner, body)?;
        // New carried tiles go to temporaries first: a yield may read a
        // carried buffer another yield overwrites.
        let mut temps = Vec::new();
        let mut scalar_next = Vec::new();
        for (i, y) in yields.iter().enumerate() {
            match (y, tile_bufs[i]) {
                (Val::Tile(n), Some(_)) => temps.push(Some(self.materialize(&inner, n)?)),
                (Val::Scalar(s), None) => {
                    temps.push(None);
                    scalar_next.push(*s);
                }
                _ => return Err(LoweringError::Internal("loop yield kind".into())),
            }
        }
        for (i, t) in temps.iter().enumerate() {
            if let (Some(t), Some(buf)) = (t, tile_bufs[i]) {
                let ty = self.ty(op.results[i]);
                self.write(
                    &inner,
                    &Node {
                        e: Expr::Buf { mem: *t },
                        ty,
                    },
                    buf,
                )?;
            }
        }
        ir.op(
            &inner,
            "scf.yield",
            &scalar_next,
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        let mut ops = vec![lo, hi, st];
        ops.extend(scalar_init);
        let res = ir.op(
            b,
            "scf.for",
            &ops,
            &scalar_types,
            Vec::new(),
            vec![ir.region(inner)],
        )?;
        self.bind_results(&op.results, &tile_bufs, &res);
        Ok(())
    }

    pub(super) fn conditional(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        cond: ValueId,
        then_r: &Region,
        else_r: &Region,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        // Tile results land in buffers both branches write.
        let mut bufs = Vec::new();
        let mut scalar_types = Vec::new();
        for r in &op.results {
            let ty = self.ty(*r);
            if ty.shape.is_empty() {
                bufs.push(None);
                scalar_types.push(ir.elem(reg(ty.dtype)));
            } else {
                bufs.push(Some(self.alloc(b, &ty)?));
            }
        }
        let branch =
            |this: &mut Self, r: &Region| -> Result<melior::ir::Region<'c>, LoweringError> {
                let blk = ir.block(&[]);
                let ys = this.region(&blk, r)?;
                let mut scalars = Vec::new();
                for (i, y) in ys.iter().enumerate() {
                    match (y, bufs[i]) {
                        (Val::Tile(n), Some(buf)) => this.write(&blk, n, buf)?,
                        (Val::Scalar(s), None) => scalars.push(*s),
                        _ => return Err(LoweringError::Internal("branch yield kind".into())),
                    }
                }
                ir.op(&blk, "scf.yield", &scalars, &[], Vec::new(), Vec::new())?;
                Ok(ir.region(blk))
            };
        let t = branch(self, then_r)?;
        let f = branch(self, else_r)?;
        let res = ir.op(
            b,
            "scf.if",
            &[self.scalar(cond)?],
            &scalar_types,
            Vec::new(),
            vec![t, f],
        )?;
        self.bind_results(&op.results, &bufs, &res);
        Ok(())
    }
}
