//! The element ops' kinds: unary, binary, compare and reduce operators,
//! with their names in the text form and what each needs of its dtype.

use crate::DType;

/// Elementwise unary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the names are the math
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Exp2,
    Log,
    Log1p,
    Tanh,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Erf,
    /// `1 / (1 + exp(-x))`
    Logistic,
    Floor,
    Ceil,
    /// Logical not (bool) or bitwise not (integers).
    Not,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 16] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Exp2,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Tanh,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Erf,
        UnaryOp::Logistic,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Not,
    ];

    /// What the op means, exactly, on a value of `dtype` held as f64 (the
    /// interpreter rounds the result to the dtype): the one definition the
    /// back ends are checked against.
    pub fn eval(self, dtype: crate::DType, x: f64) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Exp2 => x.exp2(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Log1p => x.ln_1p(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Erf => libm::erf(x),
            UnaryOp::Logistic => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Not if dtype == crate::DType::Bool => (x == 0.0) as u8 as f64,
            // Bitwise not of the integer (values are exact integers here).
            UnaryOp::Not => !(x as i64) as f64,
        }
    }

    /// The printed name.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Exp2 => "exp2",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Erf => "erf",
            UnaryOp::Logistic => "logistic",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Not => "not",
        }
    }

    /// True for ops defined only on floats.
    pub fn needs_float(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
    }

    /// True for transcendental ops (counted by cost estimates).
    pub fn is_transcendental(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp
                | UnaryOp::Exp2
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Tanh
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::Logistic
        )
    }
}

/// Elementwise binary operators. Both operands have the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division, or integer division truncating toward zero.
    Div,
    /// Remainder with the sign of the dividend (fmod / C `%`).
    Rem,
    /// NaN-propagating maximum.
    Max,
    /// NaN-propagating minimum.
    Min,
    Pow,
    /// Logical (bool) or bitwise (integer) and.
    And,
    /// Logical (bool) or bitwise (integer) or.
    Or,
    /// Logical (bool) or bitwise (integer) exclusive or.
    Xor,
    /// `x << n` on integers. The amount is taken modulo the bit width
    /// (Rust's `wrapping_shl`) on every path: MLIR's `arith.shli` leaves
    /// an amount ≥ the width undefined and StableHLO makes it 0, so each
    /// back end masks it first.
    ShiftLeft,
    /// `x >> n` on integers, filling with zeros (the bits read as
    /// unsigned); the amount modulo the bit width, as [`BinaryOp::ShiftLeft`].
    ShiftRightLogical,
    /// `x >> n` on integers, filling with the sign bit (Rust's `>>` on
    /// signed integers); the amount modulo the bit width.
    ShiftRightArithmetic,
}

impl BinaryOp {
    /// The printed name.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
            BinaryOp::Pow => "pow",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::ShiftLeft => "shift_left",
            BinaryOp::ShiftRightLogical => "shift_right_logical",
            BinaryOp::ShiftRightArithmetic => "shift_right_arithmetic",
        }
    }

    /// True for the shifts, which take integer operands only.
    pub fn is_shift(self) -> bool {
        matches!(
            self,
            BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical | BinaryOp::ShiftRightArithmetic
        )
    }

    /// `a op b` for shifts on a `bits`-wide integer held in an `i64`
    /// (sign-extended), the amount modulo `bits`: the one definition every
    /// path is checked against. `None` for ops that are not shifts.
    pub fn shift(self, a: i64, b: i64, bits: u32) -> Option<i64> {
        let n = (b as u64 % u64::from(bits)) as u32;
        let mask = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        let unsigned = a as u64 & mask;
        let raw = match self {
            BinaryOp::ShiftLeft => (unsigned << n) & mask,
            BinaryOp::ShiftRightLogical => unsigned >> n,
            BinaryOp::ShiftRightArithmetic => return Some(a >> n),
            _ => return None,
        };
        // Back to the signed value of the `bits`-wide pattern.
        let shift = 64 - bits;
        Some(((raw << shift) as i64) >> shift)
    }

    /// True for and/or/xor, which take bool or integer operands.
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)
    }
}

/// Comparison directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    /// The printed name.
    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// Reductions along axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    /// The printed name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// The value a reduction over `dtype` starts from: the op's identity.
    /// Integers have no infinities, so max and min start from the type's
    /// bounds (false and true for booleans).
    ///
    /// ```
    /// use kernel_ir::{DType, ReduceOp};
    /// assert_eq!(ReduceOp::Max.identity(DType::F32), f64::NEG_INFINITY);
    /// assert_eq!(ReduceOp::Min.identity(DType::I8), 127.0);
    /// ```
    pub fn identity(self, dtype: DType) -> f64 {
        let (low, high) = match dtype {
            DType::F32 | DType::BF16 | DType::F16 | DType::F8E5M2 => {
                (f64::NEG_INFINITY, f64::INFINITY)
            }
            // No infinity: the largest finite values.
            DType::F8E4M3FN => (-448.0, 448.0),
            DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX)),
            DType::I8 => (f64::from(i8::MIN), f64::from(i8::MAX)),
            DType::Bool => (0.0, 1.0),
        };
        match self {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => low,
            ReduceOp::Min => high,
        }
    }
}
