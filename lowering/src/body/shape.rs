//! Shape ops and reductions: broadcast, reshape, transpose, reduce.

use melior::ir::Block;

use kernel_ir::{DType, ReduceOp, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::convention::Flavor;
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    pub(super) fn broadcast_in_dim(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: TileType,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let elem = ir.elem(from.dtype);
        if from.shape == shape {
            return Ok(x);
        }
        if shape.is_empty() {
            return Ok(x);
        }
        // Insert unit dims so operand dims sit at `dims`, then broadcast.
        let mut v = x;
        if !from.shape.is_empty() {
            let mut unit = vec![1usize; shape.len()];
            for (i, &d) in dims.iter().enumerate() {
                unit[d] = from.shape[i];
            }
            if unit != from.shape {
                v = ir.op1(
                    block,
                    "vector.shape_cast",
                    &[v],
                    ir.shaped_vector(&unit, elem),
                    Vec::new(),
                )?;
            }
            if unit == shape {
                return Ok(v);
            }
        }
        ir.op1(
            block,
            "vector.broadcast",
            &[v],
            ir.shaped_vector(shape, elem),
            Vec::new(),
        )
    }

    pub(super) fn reshape(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: &TileType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let elem = ir.elem(from.dtype);
        if from.shape == shape {
            return Ok(x);
        }
        if from.shape.is_empty() {
            return ir.op1(
                block,
                "vector.broadcast",
                &[x],
                ir.shaped_vector(shape, elem),
                Vec::new(),
            );
        }
        if shape.is_empty() {
            let zeros = vec![0i64; from.shape.len()];
            return ir.op1(
                block,
                "vector.extract",
                &[x],
                elem,
                vec![("static_position", ir.i64_array(&zeros))],
            );
        }
        ir.op1(
            block,
            "vector.shape_cast",
            &[x],
            ir.shaped_vector(shape, elem),
            Vec::new(),
        )
    }

    pub(super) fn transpose(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: &TileType,
        perm: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let undone = self.transposes.borrow().iter().find_map(|(out, src, p1)| {
            let inverse = out.ptr == x.ptr
                && p1.len() == perm.len()
                && perm.iter().enumerate().all(|(i, &p2)| p1[p2] == i);
            inverse.then_some(*src)
        });
        if let Some(src) = undone {
            return Ok(src);
        }
        let shape: Vec<usize> = perm.iter().map(|&p| from.shape[p]).collect();
        let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        let out = ir.op1(
            block,
            "vector.transpose",
            &[x],
            ir.shaped_vector(&shape, ir.elem(from.dtype)),
            vec![("permutation", ir.i64_array(&p))],
        )?;
        self.transposes.borrow_mut().push((out, x, perm.to_vec()));
        Ok(out)
    }

    pub(super) fn reduce(
        &self,
        block: &Block<'c>,
        r: ReduceOp,
        x: ValueId,
        axes: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let t = self.ty(x).clone();
        let mut xv = self.v(x)?;
        // Mosaic reduces narrow floats only in some layouts ("Non-32-bit
        // reductions over replicated axes" on v6e/v7x, no scalar extract of
        // bf16): reduce bf16 in f32 and round once, as the reference does.
        let wide = self.flavor == Flavor::Mosaic && t.dtype == DType::BF16;
        let t = if wide {
            xv = self.convert(block, xv, t.clone(), DType::F32)?;
            TileType::new(DType::F32, t.shape.clone())
        } else {
            t
        };
        let out_shape: Vec<usize> = t
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let out = TileType::new(t.dtype, out_shape);
        let float = t.dtype.is_float();
        let kind = match (r, float) {
            (ReduceOp::Sum, _) => "add",
            (ReduceOp::Max, true) => "maximumf",
            (ReduceOp::Min, true) => "minimumf",
            (ReduceOp::Max, false) => "maxsi",
            (ReduceOp::Min, false) => "minsi",
        };
        let init = r.identity(t.dtype);
        let acc = self.constant(block, init, &out)?;
        let a: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let reduced = ir.op1(
            block,
            "vector.multi_reduction",
            &[xv, acc],
            ir.tile(&out),
            vec![
                ("kind", ir.parse_attr(&format!("#vector.kind<{kind}>"))?),
                ("reduction_dims", ir.i64_array(&a)),
            ],
        )?;
        if wide {
            self.convert(block, reduced, out, DType::BF16)
        } else {
            Ok(reduced)
        }
    }
}
