//! Ops that only move elements: roll, slice and concat. Roll and slice
//! stay lazy (an index offset); concat writes its parts into one buffer.

use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{DType, ValueId};

use super::{Expr, HostEmitter, Node, Val};
use crate::LoweringError;

impl<'c> HostEmitter<'_, 'c> {
    pub(super) fn roll(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        x: ValueId,
        shift: usize,
        axis: usize,
    ) -> Result<(), LoweringError> {
        let mut src = self.node(x)?;
        let d = src.ty.dtype;
        if shift != 0 && axis + 1 == src.ty.shape.len() && !d.is_fp8() && d != DType::Bool {
            // Along the vector the roll gathers from memory: the source is
            // computed once, not once per lane.
            let mem = self.materialize(b, &src)?;
            src = Rc::new(Node {
                ty: src.ty.clone(),
                e: Expr::Buf { mem },
            });
        }
        let t = if shift == 0 {
            src
        } else {
            Rc::new(Node {
                ty: src.ty.clone(),
                e: Expr::Roll { src, shift, axis },
            })
        };
        self.set(r, Val::Tile(t));
        self.maybe_materialize(b, r)
    }

    pub(super) fn slice(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        x: ValueId,
        axis: usize,
        start: usize,
    ) -> Result<(), LoweringError> {
        let src = self.node(x)?;
        self.lazy(r, Expr::Slice { src, axis, start });
        self.maybe_materialize(b, r)
    }

    /// Written into one buffer part by part: a chunk of the result may
    /// straddle the join.
    pub(super) fn concat(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        lhs: ValueId,
        rhs: ValueId,
        axis: usize,
    ) -> Result<(), LoweringError> {
        let (first, second) = (self.node(lhs)?, self.node(rhs)?);
        let mem = self.alloc(b, &self.ty(r))?;
        self.write_at(b, &first, mem, axis, 0)?;
        self.write_at(b, &second, mem, axis, first.ty.shape[axis])?;
        self.lazy(r, Expr::Buf { mem });
        Ok(())
    }
}
