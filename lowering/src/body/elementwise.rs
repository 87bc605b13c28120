//! Elementwise ops: iota, unary and binary math, select, compare and
//! conversion (op names from `op_names`).

use melior::ir::Block;

use kernel_ir::{BinaryOp, CompareOp, DType, TileType, UnaryOp, ValueId};

use super::*;
use crate::LoweringError;
use crate::convention::Flavor;
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    pub(super) fn iota(
        &self,
        block: &Block<'c>,
        ty: &TileType,
        dim: usize,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let i32v = ir.tile(&TileType::new(DType::I32, ty.shape.clone()));
        let ints = match self.flavor {
            // `tpu.iota` makes vectors of rank 2 and up: a rank-1 iota is
            // the row of a [1, n] one.
            Flavor::Mosaic if ty.shape.len() == 1 => {
                let row = ir.op1(
                    block,
                    "tpu.iota",
                    &[],
                    ir.shaped_vector(&[1, ty.shape[0]], ir.i32()),
                    vec![("dimensions", ir.i32_array(&[1]))],
                )?;
                ir.op1(block, "vector.shape_cast", &[row], i32v, Vec::new())?
            }
            Flavor::Mosaic => ir.op1(
                block,
                "tpu.iota",
                &[],
                i32v,
                vec![("dimensions", ir.i32_array(&[dim as i32]))],
            )?,
            Flavor::Upstream => {
                // vector.step along `dim`, broadcast with `dim` last, then
                // moved into place.
                let n = ty.shape[dim];
                let step = ir.op1(
                    block,
                    "vector.step",
                    &[],
                    ir.shaped_vector(&[n], ir.index()),
                    Vec::new(),
                )?;
                let step = ir.op1(
                    block,
                    "arith.index_cast",
                    &[step],
                    ir.shaped_vector(&[n], ir.i32()),
                    Vec::new(),
                )?;
                let rank = ty.shape.len();
                let mut moved: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
                moved.push(dim);
                let moved_shape: Vec<usize> = moved.iter().map(|&d| ty.shape[d]).collect();
                let b = if rank > 1 {
                    ir.op1(
                        block,
                        "vector.broadcast",
                        &[step],
                        ir.shaped_vector(&moved_shape, ir.i32()),
                        Vec::new(),
                    )?
                } else {
                    step
                };
                if dim == rank - 1 {
                    b
                } else {
                    // Result dim i is moved dim position of i.
                    let perm: Vec<usize> = (0..rank)
                        .map(|d| moved.iter().position(|&m| m == d).unwrap_or(0))
                        .collect();
                    self.transpose(block, b, &TileType::new(DType::I32, moved_shape), &perm)?
                }
            }
        };
        if ty.dtype == DType::I32 {
            Ok(ints)
        } else {
            self.convert(
                block,
                ints,
                TileType::new(DType::I32, ty.shape.clone()),
                ty.dtype,
            )
        }
    }

    pub(super) fn unary(
        &self,
        block: &Block<'c>,
        u: UnaryOp,
        x: ValueId,
    ) -> Result<Raw, LoweringError> {
        let t = self.ty(x).clone();
        let xv = self.v(x)?;
        match u {
            // On the generations with a bf16 VPU (v6e, v7x), libtpu's bf16
            // sine and cosine fail a type check on computed (packed)
            // operands; in f32 they compile everywhere, and are closer to
            // the reference too.
            UnaryOp::Sin | UnaryOp::Cos
                if self.flavor == Flavor::Mosaic && t.dtype == DType::BF16 =>
            {
                let wide = TileType::new(DType::F32, t.shape.clone());
                let x32 = self.convert(block, xv, t.clone(), DType::F32)?;
                let r = crate::unary::expand(
                    &TileOps {
                        l: self,
                        block,
                        t: &wide,
                    },
                    u,
                    DType::F32,
                    x32,
                )?;
                self.convert(block, r, wide, DType::BF16)
            }
            u => crate::unary::expand(
                &TileOps {
                    l: self,
                    block,
                    t: &t,
                },
                u,
                t.dtype,
                xv,
            ),
        }
    }

    pub(super) fn binary(
        &self,
        block: &Block<'c>,
        b: BinaryOp,
        l: ValueId,
        r: ValueId,
    ) -> Result<Raw, LoweringError> {
        let t = self.ty(l).clone();
        let float = t.dtype.is_float();
        let name = binary_op_name(b, float);
        let mut amount = self.v(r)?;
        if b.is_shift() {
            // The amount modulo the width (`BinaryOp::ShiftLeft`).
            let width = self.constant(block, f64::from(t.dtype.bits() - 1), &t)?;
            amount = self.ir.op1(
                block,
                "arith.andi",
                &[amount, width],
                self.ir.tile(&t),
                Vec::new(),
            )?;
        }
        self.ir.op1(
            block,
            name,
            &[self.v(l)?, amount],
            self.ir.tile(&t),
            Vec::new(),
        )
    }

    /// `cond ? a : b` for values of type `t`. Mosaic selects no i1 vectors,
    /// so bools are selected bitwise: `(cond & a) | (!cond & b)`.
    pub(super) fn select(
        &self,
        block: &Block<'c>,
        cond: Raw,
        a: Raw,
        b: Raw,
        t: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let ty = ir.tile(t);
        if self.flavor == Flavor::Mosaic && t.dtype == DType::Bool && !t.shape.is_empty() {
            let not_cond = self.not(block, cond, t)?;
            let x = ir.op1(block, "arith.andi", &[cond, a], ty, Vec::new())?;
            let y = ir.op1(block, "arith.andi", &[not_cond, b], ty, Vec::new())?;
            return ir.op1(block, "arith.ori", &[x, y], ty, Vec::new());
        }
        ir.op1(block, "arith.select", &[cond, a, b], ty, Vec::new())
    }

    /// Logical not of a bool tile of `t`'s shape.
    pub(super) fn not(
        &self,
        block: &Block<'c>,
        x: Raw,
        t: &TileType,
    ) -> Result<Raw, LoweringError> {
        let bool_t = TileType::new(DType::Bool, t.shape.clone());
        let all = self.constant(block, 1.0, &bool_t)?;
        self.ir.op1(
            block,
            "arith.xori",
            &[x, all],
            self.ir.tile(&bool_t),
            Vec::new(),
        )
    }

    /// `lhs <c> rhs` on values of type `t`, as a bool tile.
    pub(super) fn compare(
        &self,
        block: &Block<'c>,
        c: CompareOp,
        lhs: Raw,
        rhs: Raw,
        t: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let bool_t = TileType::new(DType::Bool, t.shape.clone());
        let bool_ty = ir.tile(&bool_t);
        if self.flavor == Flavor::Mosaic && c == CompareOp::Ne && t.dtype.is_float() {
            // Mosaic has only ordered float predicates; `!=` (true on NaN)
            // is the negation of ordered `==`.
            let eq = self.compare(block, CompareOp::Eq, lhs, rhs, t)?;
            return self.not(block, eq, t);
        }
        if self.flavor == Flavor::Mosaic && t.dtype == DType::Bool && !t.shape.is_empty() {
            // Mosaic compares no i1 vectors; with false < true each
            // comparison is a bitwise formula.
            let and = |a: Raw, b: Raw| ir.op1(block, "arith.andi", &[a, b], bool_ty, Vec::new());
            let or = |a: Raw, b: Raw| ir.op1(block, "arith.ori", &[a, b], bool_ty, Vec::new());
            let xor = ir.op1(block, "arith.xori", &[lhs, rhs], bool_ty, Vec::new())?;
            return match c {
                CompareOp::Ne => Ok(xor),
                CompareOp::Eq => self.not(block, xor, t),
                CompareOp::Gt => and(lhs, self.not(block, rhs, t)?),
                CompareOp::Ge => or(lhs, self.not(block, rhs, t)?),
                CompareOp::Lt => and(self.not(block, lhs, t)?, rhs),
                CompareOp::Le => or(self.not(block, lhs, t)?, rhs),
            };
        }
        let (name, pred) = compare_predicate(c, t.dtype);
        ir.op1(
            block,
            name,
            &[lhs, rhs],
            bool_ty,
            vec![("predicate", ir.i64_attr(pred))],
        )
    }

    pub(super) fn convert(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: TileType,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        if to == DType::Bool && from.dtype != DType::Bool {
            // Nonzero is true, through the one comparison rule.
            let zero = self.constant(block, 0.0, &from)?;
            return self.compare(block, CompareOp::Ne, x, zero, &from);
        }
        convert_values(self.ir, block, x, &from.shape, from.dtype, to)
    }
}

/// The kernel module's ops on tiles of one type, for the shared unary
/// expansion.
struct TileOps<'a, 'e, 'c> {
    l: &'a BodyEmitter<'e, 'c>,
    block: &'a Block<'c>,
    t: &'a TileType,
}

impl crate::unary::UnaryEmitter for TileOps<'_, '_, '_> {
    fn op(&self, name: &str, args: &[Raw]) -> Result<Raw, LoweringError> {
        self.l
            .ir
            .op1(self.block, name, args, self.l.ir.tile(self.t), Vec::new())
    }
    fn constant(&self, v: f64) -> Result<Raw, LoweringError> {
        self.l.constant(self.block, v, self.t)
    }
}
