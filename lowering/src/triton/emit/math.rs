//! Element math: widening to f32 and rounding back, conversions,
//! unary and binary ops, reductions, and `tl.dot` with its fused
//! accumulation.

use super::*;

impl<'a> Emitter<'a> {
    /// `v` in f32 when it is a narrow float.
    pub(super) fn up(&mut self, v: ValueId, dtype: DType) -> String {
        self.widen(&Self::v(v), dtype)
    }

    /// Code `x` of a narrow float `dtype` in f32 (exactly).
    pub(super) fn widen(&mut self, x: &str, dtype: DType) -> String {
        match dtype {
            DType::F8E4M3FN => {
                self.helpers.insert("_tsr_from_f8e4m3fn");
                format!("_tsr_from_f8e4m3fn({x})")
            }
            DType::F8E5M2 => {
                self.helpers.insert("_tsr_from_f8e5m2");
                format!("_tsr_from_f8e5m2({x})")
            }
            d if narrow(d) => format!("{x}.to(tl.float32)"),
            _ => x.to_string(),
        }
    }

    /// An f32 expression rounded to `dtype` (a narrow float).
    pub(super) fn down(&mut self, f32: &str, dtype: DType) -> String {
        match dtype {
            DType::F8E4M3FN => {
                self.helpers.insert("_tsr_to_f8e4m3fn");
                format!("_tsr_to_f8e4m3fn({f32})")
            }
            DType::F8E5M2 => {
                self.helpers.insert("_tsr_to_f8e5m2");
                format!("_tsr_to_f8e5m2({f32})")
            }
            DType::BF16 | DType::F16 => format!("({f32}).to({})", tl_dtype(dtype)),
            _ => f32.to_string(),
        }
    }

    /// `x` (of `from`) converted to `to` by `DType::round`'s rules.
    pub(super) fn convert_code(&mut self, x: &str, from: DType, to: DType) -> String {
        if from == to {
            return x.to_string();
        }
        match (from, to) {
            (DType::Bool, _) => {
                let one = if to.is_float() { "1.0" } else { "1" };
                let zero = if to.is_float() { "0.0" } else { "0" };
                let f = format!("tl.where({x}, {one}, {zero})");
                match to {
                    DType::F32 => format!("({f}).to(tl.float32)"),
                    d if narrow(d) => self.down(&format!("({f}).to(tl.float32)"), d),
                    d => format!("({f}).to({})", tl_dtype(d)),
                }
            }
            (_, DType::Bool) => {
                let f = self.widen(x, from);
                if from.is_float() {
                    format!("(({f}) != 0) & (({f}) == ({f}))")
                } else {
                    format!("({f}) != 0")
                }
            }
            (f, t) if f.is_float() && t.is_float() => {
                let f32 = self.widen(x, f);
                self.down(&f32, t)
            }
            // `tl.cast`, not `.to`: a loop index is a Python int under the
            // interpreter (a tensor only when compiled).
            (f, t) if f.is_int() && t.is_float() => {
                let f32 = format!("tl.cast({x}, tl.float32)");
                self.down(&f32, t)
            }
            (f, t) if f.is_float() && t.is_int() => {
                self.helpers.insert("_tsr_to_int");
                let f32 = self.widen(x, f);
                let (lo, hi) = t.float_to_int_clamp();
                let imax = -lo as i64 - 1;
                format!(
                    "_tsr_to_int({f32}, {}, {lo:?}, {hi:?}, {imax})",
                    tl_dtype(t)
                )
            }
            (_, t) => format!("tl.cast({x}, {})", tl_dtype(t)),
        }
    }

    pub(super) fn unary(
        &mut self,
        op: &Op,
        u: UnaryOp,
        x: ValueId,
        dtype: DType,
    ) -> Result<String, LoweringError> {
        let a = self.up(x, dtype);
        let f = match u {
            UnaryOp::Neg => format!("-{a}"),
            UnaryOp::Abs => format!("tl.abs({a})"),
            UnaryOp::Not => format!("~{a}"),
            _ if !dtype.is_float() => {
                return Err(Self::unsupported(op, format!("{} of {dtype}", u.name())));
            }
            UnaryOp::Exp => format!("tl.exp({a})"),
            UnaryOp::Exp2 => format!("tl.exp2({a})"),
            UnaryOp::Log => format!("tl.log({a})"),
            UnaryOp::Log1p => format!("libdevice.log1p({a})"),
            UnaryOp::Tanh => format!("libdevice.tanh({a})"),
            UnaryOp::Sqrt => format!("tl.sqrt_rn({a})"),
            UnaryOp::Rsqrt => format!("tl.rsqrt({a})"),
            UnaryOp::Sin => format!("tl.sin({a})"),
            UnaryOp::Cos => format!("tl.cos({a})"),
            UnaryOp::Erf => format!("tl.erf({a})"),
            UnaryOp::Logistic => format!("tl.sigmoid({a})"),
            UnaryOp::Floor => format!("tl.floor({a})"),
            UnaryOp::Ceil => format!("tl.ceil({a})"),
        };
        Ok(if narrow(dtype) {
            self.down(&f, dtype)
        } else {
            f
        })
    }

    pub(super) fn binary(
        &mut self,
        op: &Op,
        b: BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
        region: &Region,
    ) -> Result<String, LoweringError> {
        let (dtype, shape) = self.ty(lhs);
        if b == BinaryOp::Add {
            for (d, other) in [(lhs, rhs), (rhs, lhs)] {
                if self.fused.contains(&d)
                    && let Some(dot) = find_def(region, d)
                    && let OpKind::Dot {
                        lhs: a,
                        rhs: bb,
                        dims,
                        acc,
                    } = &dot.kind
                {
                    let acc_code = reshape_for_dot(&Self::v(other), &shape, self, dot)?;
                    return self.dot(*a, *bb, dims, *acc, Some(acc_code), Some(d));
                }
            }
        }
        let (x, y) = (self.up(lhs, dtype), self.up(rhs, dtype));
        let f = match b {
            BinaryOp::Add => format!("{x} + {y}"),
            BinaryOp::Sub => format!("{x} - {y}"),
            BinaryOp::Mul => format!("{x} * {y}"),
            BinaryOp::Div if dtype.is_float() => format!("tl.div_rn({x}, {y})"),
            BinaryOp::Div => format!("{x} // {y}"),
            BinaryOp::Rem => format!("{x} % {y}"),
            BinaryOp::Max | BinaryOp::Min if dtype.is_float() => {
                let h = if b == BinaryOp::Max {
                    "_tsr_max"
                } else {
                    "_tsr_min"
                };
                self.helpers.insert(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max if dtype == DType::Bool => format!("{x} | {y}"),
            BinaryOp::Min if dtype == DType::Bool => format!("{x} & {y}"),
            BinaryOp::Max => format!("tl.maximum({x}, {y})"),
            BinaryOp::Min => format!("tl.minimum({x}, {y})"),
            BinaryOp::Pow if dtype.is_float() => format!("libdevice.pow({x}, {y})"),
            BinaryOp::Pow => return Err(Self::unsupported(op, format!("pow of {dtype}"))),
            BinaryOp::And => format!("{x} & {y}"),
            BinaryOp::Or => format!("{x} | {y}"),
            BinaryOp::Xor => format!("{x} ^ {y}"),
            // The amount modulo the width (`BinaryOp::ShiftLeft`); the
            // logical shift reads the bits unsigned.
            BinaryOp::ShiftLeft => format!("{x} << ({y} & {})", dtype.bits() - 1),
            BinaryOp::ShiftRightArithmetic => format!("{x} >> ({y} & {})", dtype.bits() - 1),
            BinaryOp::ShiftRightLogical => {
                let (u, s) = if dtype == DType::I8 {
                    ("tl.uint8", "tl.int8")
                } else {
                    ("tl.uint32", "tl.int32")
                };
                format!(
                    "({x}.to({u}, bitcast=True) >> ({y} & {}).to({u}, bitcast=True)).to({s}, bitcast=True)",
                    dtype.bits() - 1
                )
            }
        };
        Ok(if narrow(dtype) {
            self.down(&f, dtype)
        } else if dtype == DType::I8
            && matches!(
                b,
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::ShiftLeft
            )
        {
            format!("({f}).to(tl.int8)")
        } else {
            f
        })
    }

    pub(super) fn reduce(&mut self, r: ReduceOp, x: ValueId, axes: &[usize]) -> String {
        let (dtype, _) = self.ty(x);
        let mut cur = if dtype == DType::Bool {
            format!("{}.to(tl.int8)", Self::v(x))
        } else {
            self.up(x, dtype)
        };
        for &a in axes.iter().rev() {
            cur = match r {
                ReduceOp::Sum => format!("tl.sum({cur}, axis={a})"),
                ReduceOp::Max | ReduceOp::Min if dtype.is_float() => {
                    let h = if r == ReduceOp::Max {
                        "_tsr_max"
                    } else {
                        "_tsr_min"
                    };
                    self.helpers.insert(h);
                    format!("tl.reduce({cur}, {a}, {h})")
                }
                ReduceOp::Max => format!("tl.max({cur}, axis={a})"),
                ReduceOp::Min => format!("tl.min({cur}, axis={a})"),
            };
        }
        match dtype {
            DType::Bool => format!("({cur}) != 0"),
            DType::I8 | DType::I32 => format!("({cur}).to({})", tl_dtype(dtype)),
            d if narrow(d) => self.down(&cur, d),
            _ => cur,
        }
    }

    /// Whether dot result `r` is added to something once, in the same
    /// region, so the add can be `tl.dot(a, b, acc)`.
    pub(super) fn fusible(&self, r: ValueId, region: &Region) -> bool {
        if self.uses.get(&r) != Some(&1) {
            return false;
        }
        let Some(def) = find_def(region, r) else {
            return false;
        };
        let OpKind::Dot {
            lhs,
            rhs,
            dims,
            acc,
        } = &def.kind
        else {
            return false;
        };
        if *acc != DType::F32 || !self.uses_tensor_cores(*lhs, *rhs, dims) {
            return false;
        }
        // The sum of two dots fuses the later one only: the earlier is
        // emitted as the accumulator (were both deferred to the add, the
        // accumulator would never be written).
        let position = |v: ValueId| region.ops.iter().position(|op| op.results.contains(&v));
        let later_dot = |other: ValueId| {
            find_def(region, other).is_some_and(|d| matches!(d.kind, OpKind::Dot { .. }))
                && position(other) > position(r)
        };
        region.ops.iter().any(|op| match op.kind {
            OpKind::Binary {
                op: BinaryOp::Add,
                lhs,
                rhs,
            } if (lhs == r) != (rhs == r) => !later_dot(if lhs == r { rhs } else { lhs }),
            _ => false,
        })
    }

    /// The `[b?, m, k]` and `[b?, k, n]` sizes of a dot.
    pub(super) fn dot_sizes(
        &self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
    ) -> (usize, usize, usize, usize) {
        let (_, ls) = self.ty(lhs);
        let (_, rs) = self.ty(rhs);
        let [b, m, k, n] = dims.sizes(&ls, &rs);
        (b, m, k, n)
    }

    pub(super) fn uses_tensor_cores(&self, lhs: ValueId, rhs: ValueId, dims: &DotDims) -> bool {
        let (dtype, _) = self.ty(lhs);
        let (_, m, k, n) = self.dot_sizes(lhs, rhs, dims);
        let typed = matches!(
            dtype,
            DType::F32 | DType::BF16 | DType::F16 | DType::I8 | DType::F8E4M3FN | DType::F8E5M2
        );
        typed && m >= 16 && n >= 16 && k >= 16 && dims.lhs_batch.len() <= 1
    }

    /// A dot as code; `acc` (already shaped `[b?, m, n]`) is accumulated
    /// into when given.
    pub(super) fn dot(
        &mut self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
        acc_dtype: DType,
        acc: Option<String>,
        result: Option<ValueId>,
    ) -> Result<String, LoweringError> {
        let (ldt, ls) = self.ty(lhs);
        let (_, rs) = self.ty(rhs);
        let (b, m, k, n) = self.dot_sizes(lhs, rhs, dims);
        let batched = !dims.lhs_batch.is_empty();
        let lorder = dims.lhs_order(ls.len());
        let rorder = dims.rhs_order(rs.len());
        let lshape = if batched { vec![b, m, k] } else { vec![m, k] };
        let rshape = if batched { vec![b, k, n] } else { vec![k, n] };
        let a = arrange(&Self::v(lhs), &ls, &lorder, &lshape, ldt);
        let bb = arrange(&Self::v(rhs), &rs, &rorder, &rshape, ldt);
        let acc_tl = tl_dtype(acc_dtype);
        let product = if self.uses_tensor_cores(lhs, rhs, dims) {
            // f32 products at f32's precision: IEEE in the interpreter, the
            // target's multi-pass tensor-core scheme when compiled (`F32_DOT`).
            let precision = match ldt {
                DType::F32 => ", input_precision=F32_DOT".to_string(),
                // Hopper's fp8 tensor cores accumulate in fewer bits than
                // f32 (Triton's default there); the sum moves into the f32
                // accumulator after every 32 products of k, the tensor
                // cores' step, so the dot keeps f32 accumulation (measured
                // on an H200: e5m2 products over k = 512 at 2.9x the
                // tolerance without this).
                DType::F8E4M3FN | DType::F8E5M2 => {
                    format!(", max_num_imprecise_acc={}", k.min(32))
                }
                _ => String::new(),
            };
            match acc {
                Some(c) => format!("tl.dot({a}, {bb}, {c}{precision}, out_dtype={acc_tl})"),
                None => format!("tl.dot({a}, {bb}{precision}, out_dtype={acc_tl})"),
            }
        } else {
            let (ea, eb, axis) = if batched {
                (
                    format!("({a}).to({acc_tl})[:, :, :, None]"),
                    format!("({bb}).to({acc_tl})[:, None, :, :]"),
                    2,
                )
            } else {
                (
                    format!("({a}).to({acc_tl})[:, :, None]"),
                    format!("({bb}).to({acc_tl})[None, :, :]"),
                    1,
                )
            };
            let s = format!("tl.sum({ea} * {eb}, axis={axis})");
            match acc {
                Some(c) => format!("{c} + {s}"),
                None => s,
            }
        };
        let out_shape = match result {
            Some(r) => self.ty(r).1,
            None => Vec::new(),
        };
        let flat = if batched { vec![b, m, n] } else { vec![m, n] };
        Ok(if out_shape == flat || result.is_none() {
            product
        } else {
            format!("tl.reshape({product}, {})", shape_list(&out_shape))
        })
    }

    // ---- lane-replicated scratch (held as its column) ----
}
