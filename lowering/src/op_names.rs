//! How each kernel-IR elementwise op is spelled in each dialect Tessera
//! emits, in one table per op kind.
//!
//! The upstream kernel module and the host JIT (`math.*` on floats) and
//! both StableHLO emitters (the decomposed kernel lowering here and the
//! graph runtime's module text) take op names from here, so a kernel op
//! and the same graph op can never lower to different ops, and adding an
//! op is one row. Ops a dialect lacks are `None` and expanded by the
//! emitter (`logistic` is `1 / (1 + exp(−x))` in `math`).

use kernel_ir::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

/// One unary op: its `math` op on floats and its StableHLO (or CHLO) op.
struct Unary {
    op: UnaryOp,
    math: Option<&'static str>,
    stablehlo: Option<&'static str>,
}

const fn row(op: UnaryOp, math: Option<&'static str>, stablehlo: Option<&'static str>) -> Unary {
    Unary {
        op,
        math,
        stablehlo,
    }
}

/// Every unary op. `neg`, `abs` and `not` have integer forms the
/// emitters pick by dtype; `exp2` has no StableHLO op
/// (`exponential(x * ln 2)`), `logistic` no `math` op.
const UNARY: &[Unary] = &[
    row(UnaryOp::Neg, Some("arith.negf"), Some("stablehlo.negate")),
    row(UnaryOp::Abs, Some("math.absf"), Some("stablehlo.abs")),
    row(
        UnaryOp::Exp,
        Some("math.exp"),
        Some("stablehlo.exponential"),
    ),
    row(UnaryOp::Exp2, Some("math.exp2"), None),
    row(UnaryOp::Log, Some("math.log"), Some("stablehlo.log")),
    row(
        UnaryOp::Log1p,
        Some("math.log1p"),
        Some("stablehlo.log_plus_one"),
    ),
    row(UnaryOp::Tanh, Some("math.tanh"), Some("stablehlo.tanh")),
    row(UnaryOp::Sqrt, Some("math.sqrt"), Some("stablehlo.sqrt")),
    row(UnaryOp::Rsqrt, Some("math.rsqrt"), Some("stablehlo.rsqrt")),
    row(UnaryOp::Sin, Some("math.sin"), Some("stablehlo.sine")),
    row(UnaryOp::Cos, Some("math.cos"), Some("stablehlo.cosine")),
    row(UnaryOp::Erf, Some("math.erf"), Some("chlo.erf")),
    row(UnaryOp::Logistic, None, Some("stablehlo.logistic")),
    row(UnaryOp::Floor, Some("math.floor"), Some("stablehlo.floor")),
    row(UnaryOp::Ceil, Some("math.ceil"), Some("stablehlo.ceil")),
    row(UnaryOp::Not, None, Some("stablehlo.not")),
];

fn unary_row(u: UnaryOp) -> Option<&'static Unary> {
    UNARY.iter().find(|r| r.op == u)
}

/// The StableHLO (or CHLO) op computing `u`, or `None` for ops StableHLO
/// lacks and callers expand (`exp2(x)` is `exponential(x * ln 2)`).
pub fn unary(u: UnaryOp) -> Option<&'static str> {
    unary_row(u).and_then(|r| r.stablehlo)
}

/// The upstream op computing `u` on floats (`math.tanh`, `arith.negf`), or
/// `None` where the emitter expands it.
pub fn unary_math(u: UnaryOp) -> Option<&'static str> {
    unary_row(u).and_then(|r| r.math)
}

/// The StableHLO op computing `b`.
pub fn binary(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::Add => "stablehlo.add",
        BinaryOp::Sub => "stablehlo.subtract",
        BinaryOp::Mul => "stablehlo.multiply",
        BinaryOp::Div => "stablehlo.divide",
        BinaryOp::Rem => "stablehlo.remainder",
        BinaryOp::Max => "stablehlo.maximum",
        BinaryOp::Min => "stablehlo.minimum",
        BinaryOp::Pow => "stablehlo.power",
        BinaryOp::And => "stablehlo.and",
        BinaryOp::Or => "stablehlo.or",
        BinaryOp::Xor => "stablehlo.xor",
        // The amount is masked to the bit width first (`BinaryOp::ShiftLeft`).
        BinaryOp::ShiftLeft => "stablehlo.shift_left",
        BinaryOp::ShiftRightLogical => "stablehlo.shift_right_logical",
        BinaryOp::ShiftRightArithmetic => "stablehlo.shift_right_arithmetic",
    }
}

/// The `comparison_direction` of `stablehlo.compare` for `c`.
pub fn comparison_direction(c: CompareOp) -> &'static str {
    match c {
        CompareOp::Eq => "EQ",
        CompareOp::Ne => "NE",
        CompareOp::Lt => "LT",
        CompareOp::Le => "LE",
        CompareOp::Gt => "GT",
        CompareOp::Ge => "GE",
    }
}

/// The binary op in the body of a `stablehlo.reduce` computing `r`.
pub fn reduction(r: ReduceOp) -> &'static str {
    match r {
        ReduceOp::Sum => "stablehlo.add",
        ReduceOp::Max => "stablehlo.maximum",
        ReduceOp::Min => "stablehlo.minimum",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unary op has exactly one row.
    #[test]
    fn every_unary_op_has_one_row() {
        for u in UnaryOp::ALL {
            assert_eq!(
                UNARY.iter().filter(|r| r.op == u).count(),
                1,
                "{}",
                u.name()
            );
        }
        assert_eq!(UNARY.len(), UnaryOp::ALL.len());
    }
}
