//! Elementwise math on chunk vectors: conversions, unary and binary ops,
//! the polynomial `exp`, rounding to half floats.

use melior::ir::Block;

use kernel_ir::{BinaryOp, DType, UnaryOp};

use super::*;
use crate::LoweringError;
use crate::mlir::Raw;

impl<'c> HostEmitter<'_, 'c> {
    pub(super) fn convert_vec(
        &self,
        b: &Block<'c>,
        x: Raw,
        from: DType,
        to: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(x);
        }
        // fp8 is f16 in registers: widen from there, round to it directly.
        if to.is_fp8() {
            let f = self.convert_vec(b, x, from, DType::F32, w)?;
            let bits = self.fp8_encode(b, f, to, w)?;
            return self.fp8_decode(b, bits, to, w);
        }
        let from = if from.is_fp8() { DType::F16 } else { from };
        // An integer (or bool) straight to bf16 is an LLVM `sitofp`/`uitofp .. to bfloat`,
        // which x86 without AVX512-BF16 (Zen 3, Ice Lake) lowers to a
        // `__truncsfbf2` call the process does not have (the engine then
        // finds no entry point); through f32 the narrowing is one
        // `truncf`, which the pipeline's `arith-expand` turns into integer
        // ops.
        if to == DType::BF16 && !from.is_float() {
            let f = crate::body::convert_values(self.ir, b, x, &[w], from, DType::F32)?;
            return crate::body::convert_values(self.ir, b, f, &[w], DType::F32, to);
        }
        crate::body::convert_values(self.ir, b, x, &[w], from, to)
    }

    pub(super) fn unary(
        &self,
        b: &Block<'c>,
        u: UnaryOp,
        x: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        if is_half(d) {
            // Half floats compute in f32 and round once per op, as the
            // interpreter does (and LLVM has no native bf16 arithmetic).
            let x = self.convert_vec(b, x, d, DType::F32, w)?;
            let y = self.unary(b, u, x, DType::F32, w)?;
            return self.convert_vec(b, y, DType::F32, d, w);
        }
        let ir = self.ir;
        let ty = self.vec_ty(w, d);
        let c = |v: f64| -> Result<Raw, LoweringError> {
            ir.op1(
                b,
                "arith.constant",
                &[],
                ty,
                vec![("value", ir.literal(v, d, ty)?)],
            )
        };
        let ops = VecOps { e: self, b, d, w };
        // exp, and what is built from it here, is the polynomial below
        // (`HostEmitter::exp`), not a `math` op.
        match u {
            UnaryOp::Exp => self.exp(b, x, d, w),
            UnaryOp::Exp2 => {
                let ln2 = c(std::f64::consts::LN_2)?;
                let y = ir.op1(b, "arith.mulf", &[x, ln2], ty, Vec::new())?;
                self.exp(b, y, d, w)
            }
            UnaryOp::Rsqrt => {
                let s = ir.op1(b, "math.sqrt", &[x], ty, Vec::new())?;
                let one = c(1.0)?;
                ir.op1(b, "arith.divf", &[one, s], ty, Vec::new())
            }
            u => crate::unary::expand(&ops, u, d, x),
        }
    }

    /// eˣ by range reduction and a degree-6 polynomial (Cephes' expf
    /// coefficients, about 1 ulp in f32), computed in f32.
    pub(super) fn exp(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let f = DType::F32;
        let x = self.convert_vec(b, x, d, f, w)?;
        let ty = self.vec_ty(w, f);
        let c = |v: f64| -> Result<Raw, LoweringError> {
            ir.op1(
                b,
                "arith.constant",
                &[],
                ty,
                vec![("value", ir.literal(v, f, ty)?)],
            )
        };
        let bin = |name: &str, a: Raw, c: Raw| ir.op1(b, name, &[a, c], ty, Vec::new());
        let fma = |a: Raw, m: Raw, add: Raw| ir.op1(b, "math.fma", &[a, m, add], ty, Vec::new());
        let lo = c(-87.336_544)?;
        // ln(f32::MAX): above it eˣ overflows to +∞.
        let hi = c(88.722_84)?;
        // maxnumf/minnumf: a NaN input is clamped too, so the exponent
        // converted below is never NaN (`fptosi` of NaN is poison, which
        // LLVM folds away with the store of a constant NaN's result);
        // NaN is put back at the end.
        let xc = bin("arith.maxnumf", x, lo)?;
        let xc = bin("arith.minnumf", xc, hi)?;
        let log2e = c(std::f64::consts::LOG2_E)?;
        let half = c(0.5)?;
        let t = fma(xc, log2e, half)?;
        let n = ir.op1(b, "math.floor", &[t], ty, Vec::new())?;
        let ln2_hi = c(-0.693_359_375)?;
        let ln2_lo = c(2.121_944_4e-4)?;
        let r = fma(n, ln2_hi, xc)?;
        let r = fma(n, ln2_lo, r)?;
        let mut p = c(1.987_569_150_0e-4)?;
        for coeff in [
            1.398_199_950_7e-3,
            8.333_451_907_3e-3,
            4.166_579_589_4e-2,
            1.666_666_545_9e-1,
            5.000_000_120_1e-1,
        ] {
            let k = c(coeff)?;
            p = fma(p, r, k)?;
        }
        let r2 = bin("arith.mulf", r, r)?;
        let one = c(1.0)?;
        let rp1 = bin("arith.addf", r, one)?;
        let y = fma(p, r2, rp1)?;
        // 2ⁿ as 2^⌊n/2⌋ · 2^(n-⌊n/2⌋), each from the exponent bits: n
        // reaches 128 just below ln(f32::MAX), one past the exponent range.
        let i32v = self.vec_ty(w, DType::I32);
        let ci = |v: f64| -> Result<Raw, LoweringError> {
            ir.op1(
                b,
                "arith.constant",
                &[],
                i32v,
                vec![("value", ir.literal(v, DType::I32, i32v)?)],
            )
        };
        let ni = ir.op1(b, "arith.fptosi", &[n], i32v, Vec::new())?;
        let one_i = ci(1.0)?;
        let half_n = ir.op1(b, "arith.shrsi", &[ni, one_i], i32v, Vec::new())?;
        let rest_n = ir.op1(b, "arith.subi", &[ni, half_n], i32v, Vec::new())?;
        let bias = ci(127.0)?;
        let sh = ci(23.0)?;
        let mut y = y;
        for part in [half_n, rest_n] {
            let e = ir.op1(b, "arith.addi", &[part, bias], i32v, Vec::new())?;
            let bits = ir.op1(b, "arith.shli", &[e, sh], i32v, Vec::new())?;
            let pow2 = ir.op1(b, "arith.bitcast", &[bits], ty, Vec::new())?;
            y = bin("arith.mulf", y, pow2)?;
        }
        // Above the range the result is +∞ (as +∞ gives).
        let inf = c(f64::INFINITY)?;
        let over = ir.op1(
            b,
            "arith.cmpf",
            &[x, hi],
            self.vec_ty(w, DType::Bool),
            vec![("predicate", ir.i64_attr(2))],
        )?;
        let y = ir.op1(b, "arith.select", &[over, inf, y], ty, Vec::new())?;
        // Below the range the result is 0 (and -inf gives 0).
        let zero = c(0.0)?;
        let under = ir.op1(
            b,
            "arith.cmpf",
            &[x, lo],
            self.vec_ty(w, DType::Bool),
            vec![("predicate", ir.i64_attr(4))],
        )?;
        let y = ir.op1(b, "arith.select", &[under, zero, y], ty, Vec::new())?;
        let nan = ir.op1(
            b,
            "arith.cmpf",
            &[x, x],
            self.vec_ty(w, DType::Bool),
            vec![("predicate", ir.i64_attr(14))],
        )?;
        let y = ir.op1(b, "arith.select", &[nan, x, y], ty, Vec::new())?;
        self.convert_vec(b, y, f, d, w)
    }

    pub(super) fn binary(
        &self,
        b: &Block<'c>,
        op: BinaryOp,
        x: Raw,
        y: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        if is_half(d) {
            let x = self.convert_vec(b, x, d, DType::F32, w)?;
            let y = self.convert_vec(b, y, d, DType::F32, w)?;
            let r = self.binary(b, op, x, y, DType::F32, w)?;
            return self.convert_vec(b, r, DType::F32, d, w);
        }
        let float = d.is_float();
        let name = crate::body::binary_op_name(op, float);
        let ty = self.vec_ty(w, d);
        let mut y = y;
        if op.is_shift() {
            // The amount modulo the width (`BinaryOp::ShiftLeft`).
            let lit = self.ir.literal(f64::from(d.bits() - 1), d, ty)?;
            let width = self
                .ir
                .op1(b, "arith.constant", &[], ty, vec![("value", lit)])?;
            y = self.ir.op1(b, "arith.andi", &[y, width], ty, Vec::new())?;
        }
        self.ir.op1(b, name, &[x, y], ty, Vec::new())
    }

    /// A scalar of dtype `from` converted to `to`.
    pub(super) fn round_scalar(
        &self,
        b: &Block<'c>,
        s: Raw,
        from: DType,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(s);
        }
        let v = self.splat(b, s, 1, from)?;
        let v = self.convert_vec(b, v, from, to, 1)?;
        self.lane0(b, v, to)
    }

    // ---- reductions, matmul, control flow ----
}

/// The host JIT's ops on vectors of `w` elements of `d`, for the shared
/// unary expansion (its `exp` is the polynomial).
struct VecOps<'a, 'e, 'c> {
    e: &'a HostEmitter<'e, 'c>,
    b: &'a Block<'c>,
    d: DType,
    w: usize,
}

impl crate::unary::UnaryEmitter for VecOps<'_, '_, '_> {
    fn op(&self, name: &str, args: &[Raw]) -> Result<Raw, LoweringError> {
        let ty = self.e.vec_ty(self.w, self.d);
        self.e.ir.op1(self.b, name, args, ty, Vec::new())
    }
    fn constant(&self, v: f64) -> Result<Raw, LoweringError> {
        let ty = self.e.vec_ty(self.w, self.d);
        let lit = self.e.ir.literal(v, self.d, ty)?;
        self.e
            .ir
            .op1(self.b, "arith.constant", &[], ty, vec![("value", lit)])
    }
    fn exp(&self, x: Raw) -> Result<Raw, LoweringError> {
        self.e.exp(self.b, x, self.d, self.w)
    }
}
