//! Index maps: data that maps grid indices (and scalar-prefetch values) to
//! block indices.
//!
//! Because an index map is a small expression tree rather than a closure, the
//! verifier can evaluate it over the grid, the printer can show it, the
//! interpreter can run it and the lowering can emit it as `@transform_i`.

use std::fmt;
use std::ops;

/// Reads element `indices` of scalar-prefetch operand `operand`.
pub type PrefetchRead<'a> = dyn Fn(usize, &[i64]) -> Result<i64, IndexEvalError> + 'a;

/// Binary operators of index expressions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// Floor division `a / b` (rounds toward negative infinity).
    FloorDiv,
    /// Remainder with the sign of the divisor (`a.rem_euclid(b)` for b > 0).
    Rem,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
}

impl IndexOp {
    fn symbol(self) -> &'static str {
        match self {
            IndexOp::Add => "+",
            IndexOp::Sub => "-",
            IndexOp::Mul => "*",
            IndexOp::FloorDiv => "/",
            IndexOp::Rem => "%",
            IndexOp::Min => "min",
            IndexOp::Max => "max",
        }
    }
}

/// An integer expression over grid indices, scalar-prefetch values and
/// constants.
///
/// Build them with operators: `i * 2 + 1`, `table.at(i)`, `j.min(3)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IndexExpr {
    /// A constant.
    Const(i64),
    /// The index of grid dimension `n` (`program_id(n)`).
    Grid(usize),
    /// An element of scalar-prefetch operand `operand`, at the given indices.
    Prefetch {
        /// Position of the scalar-prefetch operand.
        operand: usize,
        /// One index per dim of that operand.
        at: Vec<IndexExpr>,
    },
    /// A binary operation.
    Binary(IndexOp, Box<IndexExpr>, Box<IndexExpr>),
}

/// Why an index expression could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexEvalError {
    /// Division or remainder by zero.
    #[error("division by zero in index map")]
    DivisionByZero,
    /// The result does not fit in 64 bits.
    #[error("integer overflow in index map")]
    Overflow,
    /// A grid dim the grid does not have.
    #[error("index map uses grid dim {dim} but the grid has {rank} dims")]
    GridDim {
        /// The dim used.
        dim: usize,
        /// The grid rank.
        rank: usize,
    },
    /// A scalar-prefetch read that failed (unknown operand, wrong arity,
    /// out of bounds, or values unknown because they come at run time).
    #[error("{0}")]
    Prefetch(String),
}

impl IndexExpr {
    /// The index of grid dim `n`.
    pub fn grid(n: usize) -> IndexExpr {
        IndexExpr::Grid(n)
    }

    /// Elementwise minimum.
    pub fn min(self, other: impl Into<IndexExpr>) -> IndexExpr {
        IndexExpr::Binary(IndexOp::Min, Box::new(self), Box::new(other.into()))
    }

    /// Elementwise maximum.
    pub fn max(self, other: impl Into<IndexExpr>) -> IndexExpr {
        IndexExpr::Binary(IndexOp::Max, Box::new(self), Box::new(other.into()))
    }

    /// True when the expression reads scalar-prefetch values (so it can only
    /// be evaluated at run time).
    pub fn uses_prefetch(&self) -> bool {
        match self {
            IndexExpr::Const(_) | IndexExpr::Grid(_) => false,
            IndexExpr::Prefetch { .. } => true,
            IndexExpr::Binary(_, a, b) => a.uses_prefetch() || b.uses_prefetch(),
        }
    }

    /// Visits every node, parents first.
    pub fn visit(&self, f: &mut impl FnMut(&IndexExpr)) {
        f(self);
        match self {
            IndexExpr::Const(_) | IndexExpr::Grid(_) => {}
            IndexExpr::Prefetch { at, .. } => at.iter().for_each(|e| e.visit(f)),
            IndexExpr::Binary(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
        }
    }

    /// Evaluates the expression at grid point `grid`, reading scalar-prefetch
    /// values through `prefetch(operand, indices)`.
    pub fn eval(&self, grid: &[i64], prefetch: &PrefetchRead<'_>) -> Result<i64, IndexEvalError> {
        Ok(match self {
            IndexExpr::Const(c) => *c,
            IndexExpr::Grid(d) => *grid.get(*d).ok_or(IndexEvalError::GridDim {
                dim: *d,
                rank: grid.len(),
            })?,
            IndexExpr::Prefetch { operand, at } => {
                let idx = at
                    .iter()
                    .map(|e| e.eval(grid, prefetch))
                    .collect::<Result<Vec<_>, _>>()?;
                prefetch(*operand, &idx)?
            }
            IndexExpr::Binary(op, a, b) => {
                let (a, b) = (a.eval(grid, prefetch)?, b.eval(grid, prefetch)?);
                let r = match op {
                    IndexOp::Add => a.checked_add(b),
                    IndexOp::Sub => a.checked_sub(b),
                    IndexOp::Mul => a.checked_mul(b),
                    IndexOp::FloorDiv | IndexOp::Rem if b == 0 => {
                        return Err(IndexEvalError::DivisionByZero);
                    }
                    IndexOp::FloorDiv => a.checked_div(b).map(|q| {
                        if (a % b != 0) && ((a < 0) != (b < 0)) {
                            q - 1
                        } else {
                            q
                        }
                    }),
                    IndexOp::Rem => a.checked_rem(b).map(|r| {
                        if r != 0 && ((r < 0) != (b < 0)) {
                            r + b
                        } else {
                            r
                        }
                    }),
                    IndexOp::Min => Some(a.min(b)),
                    IndexOp::Max => Some(a.max(b)),
                };
                r.ok_or(IndexEvalError::Overflow)?
            }
        })
    }

    /// Evaluates an expression that reads no scalar-prefetch values.
    pub fn eval_static(&self, grid: &[i64]) -> Result<i64, IndexEvalError> {
        self.eval(grid, &|_, _| {
            Err(IndexEvalError::Prefetch(
                "scalar-prefetch values are only known at run time".into(),
            ))
        })
    }
}

impl From<i64> for IndexExpr {
    fn from(v: i64) -> Self {
        IndexExpr::Const(v)
    }
}

impl From<i32> for IndexExpr {
    fn from(v: i32) -> Self {
        IndexExpr::Const(v as i64)
    }
}

impl From<usize> for IndexExpr {
    fn from(v: usize) -> Self {
        IndexExpr::Const(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

macro_rules! index_binop {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<R: Into<IndexExpr>> ops::$trait<R> for IndexExpr {
            type Output = IndexExpr;
            fn $method(self, rhs: R) -> IndexExpr {
                IndexExpr::Binary($op, Box::new(self), Box::new(rhs.into()))
            }
        }
        impl<R: Into<IndexExpr>> ops::$trait<R> for &IndexExpr {
            type Output = IndexExpr;
            fn $method(self, rhs: R) -> IndexExpr {
                IndexExpr::Binary($op, Box::new(self.clone()), Box::new(rhs.into()))
            }
        }
    };
}
index_binop!(Add, add, IndexOp::Add);
index_binop!(Sub, sub, IndexOp::Sub);
index_binop!(Mul, mul, IndexOp::Mul);
index_binop!(Div, div, IndexOp::FloorDiv);
index_binop!(Rem, rem, IndexOp::Rem);

// A size on the left (`chunks - 1 - i`: a grid axis walked backwards).
macro_rules! index_binop_lhs {
    ($($lhs:ty),*) => {$(
        impl ops::Add<IndexExpr> for $lhs {
            type Output = IndexExpr;
            fn add(self, rhs: IndexExpr) -> IndexExpr {
                IndexExpr::from(self) + rhs
            }
        }
        impl ops::Sub<IndexExpr> for $lhs {
            type Output = IndexExpr;
            fn sub(self, rhs: IndexExpr) -> IndexExpr {
                IndexExpr::from(self) - rhs
            }
        }
        impl ops::Mul<IndexExpr> for $lhs {
            type Output = IndexExpr;
            fn mul(self, rhs: IndexExpr) -> IndexExpr {
                IndexExpr::from(self) * rhs
            }
        }
    )*};
}
index_binop_lhs!(usize, i64, i32);

impl From<&IndexExpr> for IndexExpr {
    fn from(e: &IndexExpr) -> Self {
        e.clone()
    }
}

/// A block index map: one expression per block dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct IndexMap {
    /// Block index of each array dim, as a function of the grid indices.
    pub exprs: Vec<IndexExpr>,
}

impl IndexMap {
    /// A map from explicit expressions.
    pub fn new(exprs: Vec<IndexExpr>) -> IndexMap {
        IndexMap { exprs }
    }

    /// The map that always selects block 0 in each of `rank` dims.
    pub fn zeros(rank: usize) -> IndexMap {
        IndexMap {
            exprs: vec![IndexExpr::Const(0); rank],
        }
    }

    /// True when any expression reads scalar-prefetch values.
    pub fn uses_prefetch(&self) -> bool {
        self.exprs.iter().any(IndexExpr::uses_prefetch)
    }
}

/// Prints with grid indices as `g0, g1, ...` and scalar-prefetch reads as
/// `@name[...]` given `prefetch_names`.
pub struct IndexExprDisplay<'a> {
    /// The expression.
    pub expr: &'a IndexExpr,
    /// Names of the scalar-prefetch operands, by position.
    pub prefetch_names: &'a [String],
}

impl fmt::Display for IndexExprDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sub = |e| IndexExprDisplay {
            expr: e,
            prefetch_names: self.prefetch_names,
        };
        match self.expr {
            IndexExpr::Const(c) => write!(f, "{c}"),
            IndexExpr::Grid(d) => write!(f, "g{d}"),
            IndexExpr::Prefetch { operand, at } => {
                match self.prefetch_names.get(*operand) {
                    Some(n) => write!(f, "@{n}[")?,
                    None => write!(f, "@prefetch{operand}[")?,
                }
                for (i, e) in at.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}", sub(e))?;
                }
                f.write_str("]")
            }
            IndexExpr::Binary(op @ (IndexOp::Min | IndexOp::Max), a, b) => {
                write!(f, "{}({}, {})", op.symbol(), sub(a), sub(b))
            }
            IndexExpr::Binary(op, a, b) => {
                write!(f, "({} {} {})", sub(a), op.symbol(), sub(b))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_with_floor_semantics() {
        let g = IndexExpr::grid(0);
        let e = (g.clone() - 5) / 2;
        assert_eq!(e.eval_static(&[0]), Ok(-3));
        assert_eq!((g.clone() % 3).eval_static(&[-1]), Ok(2));
        assert_eq!(
            (g.clone() / 0).eval_static(&[1]),
            Err(IndexEvalError::DivisionByZero)
        );
        assert!(matches!(
            IndexExpr::grid(3).eval_static(&[1]),
            Err(IndexEvalError::GridDim { dim: 3, rank: 1 })
        ));
        assert_eq!(
            (g * i64::MAX).eval_static(&[2]),
            Err(IndexEvalError::Overflow)
        );
    }

    #[test]
    fn reads_prefetch_values() {
        let e = IndexExpr::Prefetch {
            operand: 0,
            at: vec![IndexExpr::grid(0) + 1],
        };
        let table = [7, 8, 9];
        let v = e.eval(&[1], &|_, idx| Ok(table[idx[0] as usize]));
        assert_eq!(v, Ok(9));
        assert!(e.uses_prefetch());
        assert!(e.eval_static(&[0]).is_err());
    }
}
