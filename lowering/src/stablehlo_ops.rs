//! StableHLO spellings of kernel-IR element-wise ops.
//!
//! Both StableHLO emitters (the decomposed kernel lowering here and the graph
//! runtime's module text) take op names from this one table, so a kernel op
//! and the same graph op can never lower to different StableHLO.

use kernel_ir::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

/// The StableHLO (or CHLO) op computing `u`, or `None` for ops StableHLO
/// lacks and callers expand (`exp2(x)` is `exponential(x * ln 2)`).
pub fn unary(u: UnaryOp) -> Option<&'static str> {
    Some(match u {
        UnaryOp::Neg => "stablehlo.negate",
        UnaryOp::Abs => "stablehlo.abs",
        UnaryOp::Exp => "stablehlo.exponential",
        UnaryOp::Exp2 => return None,
        UnaryOp::Log => "stablehlo.log",
        UnaryOp::Log1p => "stablehlo.log_plus_one",
        UnaryOp::Tanh => "stablehlo.tanh",
        UnaryOp::Sqrt => "stablehlo.sqrt",
        UnaryOp::Rsqrt => "stablehlo.rsqrt",
        UnaryOp::Sin => "stablehlo.sine",
        UnaryOp::Cos => "stablehlo.cosine",
        UnaryOp::Erf => "chlo.erf",
        UnaryOp::Logistic => "stablehlo.logistic",
        UnaryOp::Floor => "stablehlo.floor",
        UnaryOp::Ceil => "stablehlo.ceil",
        UnaryOp::Not => "stablehlo.not",
    })
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
