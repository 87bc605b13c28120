//! fp8 on the host: LLVM has no fp8 types and MLIR's arith expansion no
//! fp8 conversions, so the host emitter converts itself. An fp8 value is
//! its bit pattern in memory (one byte, as XLA and the interpreter's
//! arrays hold it) and an f16 in registers: every value of both formats
//! is an f16 (E5M2 is the top byte of one; E4M3FN's range and precision
//! fit inside), so comparisons, selects and widening are exact, and
//! arithmetic runs in f32 and rounds once per op like bf16.
//!
//! `encode` rounds f32 to the pattern directly (to nearest even, with
//! subnormals, overflow as `kernel_ir::fp8` documents), so there is no
//! double rounding through f16.

use melior::ir::Block;

use kernel_ir::DType;
use kernel_ir::fp8::Format;

use super::HostEmitter;
use crate::LoweringError;
use crate::mlir::Raw;

fn format(d: DType) -> Format {
    match d {
        DType::F8E5M2 => kernel_ir::fp8::E5M2,
        _ => kernel_ir::fp8::E4M3FN,
    }
}

impl<'c> HostEmitter<'_, 'c> {
    fn ivec(&self, b: &Block<'c>, w: usize, v: i64) -> Result<Raw, LoweringError> {
        let ty = self.vec_ty(w, DType::I32);
        self.ir.op1(
            b,
            "arith.constant",
            &[],
            ty,
            vec![("value", self.ir.literal(v as f64, DType::I32, ty)?)],
        )
    }

    fn fvec(&self, b: &Block<'c>, w: usize, v: f64) -> Result<Raw, LoweringError> {
        let ty = self.vec_ty(w, DType::F32);
        self.ir.op1(
            b,
            "arith.constant",
            &[],
            ty,
            vec![("value", self.ir.literal(v, DType::F32, ty)?)],
        )
    }

    fn i32op(
        &self,
        b: &Block<'c>,
        name: &str,
        x: Raw,
        y: Raw,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        self.ir
            .op1(b, name, &[x, y], self.vec_ty(w, DType::I32), Vec::new())
    }

    /// `x < y` (signed) or another `arith.cmpi` predicate, per lane.
    fn cmpi(
        &self,
        b: &Block<'c>,
        pred: i64,
        x: Raw,
        y: Raw,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        self.ir.op1(
            b,
            "arith.cmpi",
            &[x, y],
            self.vec_ty(w, DType::Bool),
            vec![("predicate", self.ir.i64_attr(pred))],
        )
    }

    fn pick(
        &self,
        b: &Block<'c>,
        c: Raw,
        x: Raw,
        y: Raw,
        ty: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        self.ir.op1(
            b,
            "arith.select",
            &[c, x, y],
            self.vec_ty(w, ty),
            Vec::new(),
        )
    }

    /// The fp8 patterns (as i8) of `w` f32 lanes.
    pub(super) fn fp8_encode(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        let (ir, f) = (self.ir, format(d));
        let m = f.mantissa_bits as i64;
        let (slt, sgt) = (2, 4);
        let bits = ir.op1(
            b,
            "arith.bitcast",
            &[x],
            self.vec_ty(w, DType::I32),
            Vec::new(),
        )?;
        let sign = self.i32op(b, "arith.shrui", bits, self.ivec(b, w, 31)?, w)?;
        let sign = self.i32op(b, "arith.shli", sign, self.ivec(b, w, 7)?, w)?;
        let abs = self.i32op(b, "arith.andi", bits, self.ivec(b, w, 0x7fff_ffff)?, w)?;
        // Normal: rebias the exponent, round the mantissa to nearest even.
        let shift = 23 - m;
        let t = self.i32op(
            b,
            "arith.subi",
            abs,
            self.ivec(b, w, (127 - f.bias as i64) << 23)?,
            w,
        )?;
        let odd = self.i32op(b, "arith.shrsi", t, self.ivec(b, w, shift)?, w)?;
        let odd = self.i32op(b, "arith.andi", odd, self.ivec(b, w, 1)?, w)?;
        let t = self.i32op(
            b,
            "arith.addi",
            t,
            self.ivec(b, w, (1 << (shift - 1)) - 1)?,
            w,
        )?;
        let t = self.i32op(b, "arith.addi", t, odd, w)?;
        let normal = self.i32op(b, "arith.shrsi", t, self.ivec(b, w, shift)?, w)?;
        // Subnormal: the count of least subnormals, to nearest even (a
        // count of 2^m is the least normal's pattern, as it should be).
        let fty = self.vec_ty(w, DType::F32);
        let ax = ir.op1(b, "math.absf", &[x], fty, Vec::new())?;
        let scale = self.fvec(b, w, 2f64.powi(m as i32 - f.min_exponent()))?;
        let q = ir.op1(b, "arith.mulf", &[ax, scale], fty, Vec::new())?;
        let q = ir.op1(b, "math.roundeven", &[q], fty, Vec::new())?;
        // Only subnormals use `sub`, but a large, infinite or NaN `q`
        // would be poison in `fptosi` (foldable into anything): bounded
        // first, NaN included (minnumf returns the number).
        let q = ir.op1(
            b,
            "arith.minnumf",
            &[q, self.fvec(b, w, 16_777_216.0)?],
            fty,
            Vec::new(),
        )?;
        let sub = ir.op1(
            b,
            "arith.fptosi",
            &[q],
            self.vec_ty(w, DType::I32),
            Vec::new(),
        )?;
        let min_normal = self.ivec(b, w, ((f.min_exponent() + 127) as i64) << 23)?;
        let is_sub = self.cmpi(b, slt, abs, min_normal, w)?;
        let code = self.pick(b, is_sub, sub, normal, DType::I32, w)?;
        // Past the largest finite pattern (and ∞): NaN or ∞.
        let max_code = self.ivec(b, w, (f.encode(f.max_finite()) & 0x7f) as i64)?;
        let over = self.cmpi(b, sgt, code, max_code, w)?;
        let overflow = self.ivec(b, w, (f.encode(f64::INFINITY) & 0x7f) as i64)?;
        let code = self.pick(b, over, overflow, code, DType::I32, w)?;
        let is_nan = self.cmpi(b, sgt, abs, self.ivec(b, w, 0x7f80_0000)?, w)?;
        let nan = self.ivec(b, w, f.nan_bits() as i64)?;
        let code = self.pick(b, is_nan, nan, code, DType::I32, w)?;
        let code = self.i32op(b, "arith.ori", code, sign, w)?;
        ir.op1(
            b,
            "arith.trunci",
            &[code],
            self.vec_ty(w, DType::I8),
            Vec::new(),
        )
    }

    /// The f16 values of `w` fp8 patterns (as i8).
    pub(super) fn fp8_decode(
        &self,
        b: &Block<'c>,
        bits: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        let (ir, f) = (self.ir, format(d));
        let m = f.mantissa_bits as i64;
        let emax = (1i64 << f.exponent_bits) - 1;
        let eq = 0;
        let c = ir.op1(
            b,
            "arith.extui",
            &[bits],
            self.vec_ty(w, DType::I32),
            Vec::new(),
        )?;
        let sign = self.i32op(b, "arith.shrui", c, self.ivec(b, w, 7)?, w)?;
        let e = self.i32op(b, "arith.shrui", c, self.ivec(b, w, m)?, w)?;
        let e = self.i32op(b, "arith.andi", e, self.ivec(b, w, emax)?, w)?;
        let frac = self.i32op(b, "arith.andi", c, self.ivec(b, w, (1 << m) - 1)?, w)?;
        // Normal: the f32 with the rebiased exponent and the mantissa on top.
        let ef = self.i32op(b, "arith.addi", e, self.ivec(b, w, 127 - f.bias as i64)?, w)?;
        let ef = self.i32op(b, "arith.shli", ef, self.ivec(b, w, 23)?, w)?;
        let mf = self.i32op(b, "arith.shli", frac, self.ivec(b, w, 23 - m)?, w)?;
        let nb = self.i32op(b, "arith.ori", ef, mf, w)?;
        let fty = self.vec_ty(w, DType::F32);
        let normal = ir.op1(b, "arith.bitcast", &[nb], fty, Vec::new())?;
        // Subnormal: the count of least subnormals.
        let sf = ir.op1(b, "arith.sitofp", &[frac], fty, Vec::new())?;
        let least = self.fvec(b, w, 2f64.powi(f.min_exponent() - m as i32))?;
        let sub = ir.op1(b, "arith.mulf", &[sf, least], fty, Vec::new())?;
        let zero_e = self.cmpi(b, eq, e, self.ivec(b, w, 0)?, w)?;
        let mut v = self.pick(b, zero_e, sub, normal, DType::F32, w)?;
        // The all-ones exponent: NaN (E4M3FN: only with an all-ones
        // mantissa), or ∞ for E5M2 with a zero mantissa.
        let top = self.cmpi(b, eq, e, self.ivec(b, w, emax)?, w)?;
        let nan = self.fvec(b, w, f64::NAN)?;
        if f.finite {
            let all = self.cmpi(b, eq, frac, self.ivec(b, w, (1 << m) - 1)?, w)?;
            let is_nan = ir.op1(
                b,
                "arith.andi",
                &[top, all],
                self.vec_ty(w, DType::Bool),
                Vec::new(),
            )?;
            v = self.pick(b, is_nan, nan, v, DType::F32, w)?;
        } else {
            let zero_f = self.cmpi(b, eq, frac, self.ivec(b, w, 0)?, w)?;
            let inf = self.fvec(b, w, f64::INFINITY)?;
            let special = self.pick(b, zero_f, inf, nan, DType::F32, w)?;
            v = self.pick(b, top, special, v, DType::F32, w)?;
        }
        let neg = self.cmpi(b, eq, sign, self.ivec(b, w, 1)?, w)?;
        let nv = ir.op1(b, "arith.negf", &[v], fty, Vec::new())?;
        let v = self.pick(b, neg, nv, v, DType::F32, w)?;
        ir.op1(
            b,
            "arith.truncf",
            &[v],
            self.vec_ty(w, DType::F16),
            Vec::new(),
        )
    }
}
