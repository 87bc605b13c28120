//! The one expansion of each unary op into `arith`/`math` ops, shared by
//! the two lowerings that emit them (the Mosaic kernel module and the host
//! JIT): integer negation and absolute value, `logistic` as
//! `1 / (1 + exp(−x))`, `not` as an xor with all ones, and the rest one
//! `math` op each from the table in [`crate::op_names`]. What differs is
//! behind [`UnaryEmitter`]: how an op or a constant is built and how `exp`
//! is computed (a `math.exp`, or the host JIT's polynomial). Each lowering
//! handles its own special cases first (bf16 sine on Mosaic, `exp2` and
//! `rsqrt` on the host) and hands the rest here.

use kernel_ir::{DType, UnaryOp};

use crate::LoweringError;
use crate::mlir::Raw;

/// How a lowering builds the ops of an expansion; every value has the
/// operand's type.
pub(crate) trait UnaryEmitter {
    /// The op `name` applied to `args`.
    fn op(&self, name: &str, args: &[Raw]) -> Result<Raw, LoweringError>;
    /// The constant `v`, splatted.
    fn constant(&self, v: f64) -> Result<Raw, LoweringError>;
    /// `eˣ`.
    fn exp(&self, x: Raw) -> Result<Raw, LoweringError> {
        self.op("math.exp", &[x])
    }
}

/// `u(x)` for `x` of element type `dtype`.
pub(crate) fn expand(
    e: &impl UnaryEmitter,
    u: UnaryOp,
    dtype: DType,
    x: Raw,
) -> Result<Raw, LoweringError> {
    let float = dtype.is_float();
    match u {
        UnaryOp::Neg if float => e.op("arith.negf", &[x]),
        UnaryOp::Neg => {
            let zero = e.constant(0.0)?;
            e.op("arith.subi", &[zero, x])
        }
        UnaryOp::Abs if !float => e.op("math.absi", &[x]),
        UnaryOp::Logistic => {
            let neg = e.op("arith.negf", &[x])?;
            let ex = e.exp(neg)?;
            let one = e.constant(1.0)?;
            let den = e.op("arith.addf", &[one, ex])?;
            e.op("arith.divf", &[one, den])
        }
        UnaryOp::Not => {
            let ones = e.constant(if dtype == DType::Bool { 1.0 } else { -1.0 })?;
            e.op("arith.xori", &[x, ones])
        }
        u => match crate::op_names::unary_math(u) {
            Some(name) => e.op(name, &[x]),
            None => Err(LoweringError::Internal(format!(
                "no math op for `{}`",
                u.name()
            ))),
        },
    }
}
