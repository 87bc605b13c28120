//! Tiles: SSA values with operators and methods.

use super::state::{self, State};
use crate::error::ErrorKind;
use crate::{
    BinaryOp, CompareOp, DType, DotDims, Element, Literal, Loc, OpKind, ReduceOp, TileType,
    UnaryOp, ValueId,
};

/// A value of the kernel being built: a typed, shaped tile (rank 0 for a
/// scalar). `Copy`; operators and methods record ops.
///
/// Binary operators broadcast numpy-style (a `[8, 1]` tile combines with a
/// `[8, 128]` one) and accept Rust numbers on either side, which take the
/// tile's dtype.
#[derive(Clone, Copy, Debug)]
pub struct Tile {
    pub(super) id: ValueId,
    pub(super) builder: u32,
}

/// Runs `f` on the tile's builder; a failed op yields a value with no type,
/// which later ops pass through silently (the error was reported once).
pub(super) fn record(builder: u32, f: impl FnOnce(&mut State) -> Option<ValueId>) -> Tile {
    let id = state::with(builder, |st| f(st).unwrap_or_else(|| st.new_value(None)))
        .unwrap_or(ValueId(u32::MAX));
    Tile { id, builder }
}

fn current_builder() -> u32 {
    state::current().unwrap_or(0)
}

/// `x` with a narrow float dtype as f32 (exact; every target compares
/// and accumulates in it), any other dtype as it is.
#[track_caller]
pub(super) fn widened(x: Tile) -> Tile {
    if x.dtype().is_float() {
        x.convert(DType::F32)
    } else {
        x
    }
}

/// A tile or a Rust number, as an operand of a tile op.
#[derive(Clone, Copy, Debug)]
pub enum Operand {
    /// A tile.
    Tile(Tile),
    /// A number or bool; takes the dtype of the other side.
    Literal(Literal),
}

/// Converts tiles and Rust numbers into operands of tile ops.
pub trait IntoOperand {
    /// The operand.
    fn into_operand(self) -> Operand;
}

impl IntoOperand for Tile {
    fn into_operand(self) -> Operand {
        Operand::Tile(self)
    }
}
impl IntoOperand for Operand {
    fn into_operand(self) -> Operand {
        self
    }
}
macro_rules! lit_operand {
    ($($t:ty => $v:ident),*) => {$(
        impl IntoOperand for $t {
            fn into_operand(self) -> Operand {
                Operand::Literal(Literal::$v(self.into()))
            }
        }
    )*};
}
lit_operand!(f32 => Float, f64 => Float, i32 => Int, i64 => Int, bool => Bool);

impl IntoOperand for usize {
    fn into_operand(self) -> Operand {
        Operand::Literal(Literal::Int(i64::try_from(self).unwrap_or(i64::MAX)))
    }
}

impl Operand {
    fn tile(self) -> Option<Tile> {
        match self {
            Operand::Tile(t) => Some(t),
            Operand::Literal(_) => None,
        }
    }

    /// The operand as a value of type `ty`: a literal becomes a constant, a
    /// tile is broadcast to `ty`'s shape if needed.
    pub(super) fn materialize(
        self,
        st: &mut State,
        _builder: u32,
        ty: &TileType,
        loc: &Loc,
    ) -> Option<ValueId> {
        match self {
            Operand::Literal(value) => st
                .push_op(
                    OpKind::Constant {
                        value: held(value, ty.dtype),
                        ty: ty.clone(),
                    },
                    loc.clone(),
                )
                .first()
                .copied(),
            Operand::Tile(t) => {
                let v = st.own(t, loc)?;
                broadcast(st, v, &ty.shape, loc)
            }
        }
    }
}

/// A literal as an f32 constant holds it: the printed IR shows an f32
/// constant as its f32 and reads it back so, and a kernel built from a
/// literal such as `1e-6` must be the kernel its text reads back as.
fn held(value: Literal, dtype: DType) -> Literal {
    match value {
        Literal::Float(x) if dtype == DType::F32 => Literal::Float(f64::from(x as f32)),
        v => v,
    }
}

/// Numpy-style broadcast shape of two shapes.
fn common_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let x = if i + a.len() >= r {
                a[i + a.len() - r]
            } else {
                1
            };
            let y = if i + b.len() >= r {
                b[i + b.len() - r]
            } else {
                1
            };
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// Broadcasts value `v` to `shape` (numpy rules), emitting
/// `broadcast_in_dim` only when the shape changes.
fn broadcast(st: &mut State, v: ValueId, shape: &[usize], loc: &Loc) -> Option<ValueId> {
    let t = st.ty(v)?.clone();
    if t.shape == shape {
        return Some(v);
    }
    if t.shape.len() > shape.len() || common_shape(&t.shape, shape).as_deref() != Some(shape) {
        st.error(
            ErrorKind::Shape {
                op: "broadcast",
                detail: format!(
                    "cannot broadcast {} to {}; numpy rules align trailing dims, which must be equal or 1",
                    crate::ops::ShapeDisplay(&t.shape),
                    crate::ops::ShapeDisplay(shape)
                ),
            },
            Some(loc.clone()),
        );
        return None;
    }
    let offset = shape.len() - t.shape.len();
    let kind = OpKind::BroadcastInDim {
        x: v,
        shape: shape.to_vec(),
        dims: (offset..shape.len()).collect(),
    };
    st.push_op(kind, loc.clone()).first().copied()
}

/// Brings operands to one type: tiles broadcast to their common shape,
/// literals become constants of the tiles' dtype and that shape.
fn unify(st: &mut State, ops: &[Operand], loc: &Loc) -> Option<Vec<ValueId>> {
    let mut dtype = None;
    let mut shape: Vec<usize> = Vec::new();
    for o in ops {
        if let Operand::Tile(t) = o {
            let v = st.own(*t, loc)?;
            let ty = st.ty(v)?.clone();
            dtype.get_or_insert(ty.dtype);
            match common_shape(&shape, &ty.shape) {
                Some(s) => shape = s,
                None => {
                    st.error(
                        ErrorKind::Shape {
                            op: "broadcast",
                            detail: format!(
                                "operand shapes {} and {} are not broadcast-compatible",
                                crate::ops::ShapeDisplay(&shape),
                                crate::ops::ShapeDisplay(&ty.shape)
                            ),
                        },
                        Some(loc.clone()),
                    );
                    return None;
                }
            }
        }
    }
    let ty = TileType::new(dtype?, shape);
    ops.iter().map(|o| o.materialize(st, 0, &ty, loc)).collect()
}

fn builder_of(ops: &[Operand]) -> u32 {
    ops.iter()
        .find_map(|o| o.tile())
        .map(|t| t.builder)
        .unwrap_or_else(current_builder)
}

#[track_caller]
pub(super) fn binary(op: BinaryOp, a: Operand, b: Operand) -> Tile {
    let loc = Loc::caller();
    let ops = [a, b];
    record(builder_of(&ops), |st| {
        let v = unify(st, &ops, &loc)?;
        st.push_op(
            OpKind::Binary {
                op,
                lhs: v[0],
                rhs: v[1],
            },
            loc,
        )
        .first()
        .copied()
    })
}

#[track_caller]
fn compare(op: CompareOp, a: Operand, b: Operand) -> Tile {
    let loc = Loc::caller();
    let ops = [a, b];
    record(builder_of(&ops), |st| {
        let v = unify(st, &ops, &loc)?;
        st.push_op(
            OpKind::Compare {
                op,
                lhs: v[0],
                rhs: v[1],
            },
            loc,
        )
        .first()
        .copied()
    })
}

/// Elementwise `cond ? on_true : on_false`, broadcasting all three.
#[track_caller]
pub fn select(cond: Tile, on_true: impl IntoOperand, on_false: impl IntoOperand) -> Tile {
    let loc = Loc::caller();
    let branches = [on_true.into_operand(), on_false.into_operand()];
    record(cond.builder, |st| {
        let c = st.own(cond, &loc)?;
        let cshape = st.ty(c)?.shape.clone();
        let mut shape = cshape;
        for b in branches.iter().filter_map(|b| b.tile()) {
            let v = st.own(b, &loc)?;
            shape = common_shape(&shape, &st.ty(v)?.shape).unwrap_or(shape);
        }
        let c = broadcast(st, c, &shape, &loc)?;
        let dtype = branches
            .iter()
            .filter_map(|b| b.tile())
            .find_map(|t| st.ty(t.id).map(|t| t.dtype))
            .unwrap_or(match branches[0] {
                Operand::Literal(Literal::Float(_)) => DType::F32,
                Operand::Literal(Literal::Bool(_)) => DType::Bool,
                _ => DType::I32,
            });
        let ty = TileType::new(dtype, shape);
        let a = branches[0].materialize(st, 0, &ty, &loc)?;
        let b = branches[1].materialize(st, 0, &ty, &loc)?;
        st.push_op(
            OpKind::Select {
                cond: c,
                on_true: a,
                on_false: b,
            },
            loc,
        )
        .first()
        .copied()
    })
}

/// The index of grid dim `dim` in the current step (an i32 scalar).
#[track_caller]
pub fn program_id(dim: usize) -> Tile {
    let loc = Loc::caller();
    record(current_builder(), |st| {
        st.push_op(OpKind::ProgramId { dim }, loc).first().copied()
    })
}

/// This device's logical id in the kernel's mesh (an i32 scalar; Pallas's
/// `device_id` as a logical id).
#[track_caller]
pub fn device_id() -> Tile {
    let loc = Loc::caller();
    record(current_builder(), |st| {
        st.push_op(OpKind::DeviceId, loc).first().copied()
    })
}

/// This device's coordinate along mesh axis `axis` (an i32 scalar;
/// Pallas's `lax.axis_index`). An axis the mesh lacks is an error when the
/// kernel is built.
#[track_caller]
pub fn axis_index(axis: &str) -> Tile {
    let loc = Loc::caller();
    record(current_builder(), |st| {
        let found = st.sig.mesh.as_ref().and_then(|m| m.axis(axis));
        let a = match found {
            Some(a) => a,
            None => {
                st.error(
                    crate::ErrorKind::Builder(crate::BuilderMisuse::UnknownMeshAxis(
                        axis.to_string(),
                    )),
                    Some(loc),
                );
                return None;
            }
        };
        st.push_op(OpKind::AxisIndex { axis: a }, loc)
            .first()
            .copied()
    })
}

/// The bound of grid dim `dim` (an i32 scalar).
#[track_caller]
pub fn num_programs(dim: usize) -> Tile {
    let loc = Loc::caller();
    record(current_builder(), |st| {
        st.push_op(OpKind::NumPrograms { dim }, loc)
            .first()
            .copied()
    })
}

/// A tile of `shape` whose elements hold their index along `dim`.
#[track_caller]
pub fn iota(dtype: DType, shape: impl Into<Vec<usize>>, dim: usize) -> Tile {
    let loc = Loc::caller();
    let ty = TileType::new(dtype, shape.into());
    record(current_builder(), |st| {
        st.push_op(OpKind::Iota { ty, dim }, loc).first().copied()
    })
}

/// A tile of `shape` with every element `value`.
#[track_caller]
pub fn constant(value: impl IntoOperand, dtype: DType, shape: impl Into<Vec<usize>>) -> Tile {
    let loc = Loc::caller();
    let ty = TileType::new(dtype, shape.into());
    let value = match value.into_operand() {
        Operand::Literal(l) => held(l, dtype),
        Operand::Tile(_) => Literal::Float(f64::NAN),
    };
    record(current_builder(), |st| {
        st.push_op(OpKind::Constant { value, ty }, loc)
            .first()
            .copied()
    })
}

/// Matrix product accumulating in f32 (i32 for integers): `[m, k] × [k, n]`,
/// or batched `[b, m, k] × [b, k, n]`.
#[track_caller]
pub fn dot(lhs: Tile, rhs: Tile) -> Tile {
    let loc = Loc::caller();
    record(lhs.builder, |st| {
        let (l, r) = (st.own(lhs, &loc)?, st.own(rhs, &loc)?);
        let (lt, rt) = (st.ty(l)?.clone(), st.ty(r)?.clone());
        let dims = match (lt.shape.len(), rt.shape.len()) {
            (2, 2) => DotDims::matmul(),
            (3, 3) => DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            },
            _ => {
                st.error(
                    ErrorKind::Shape {
                        op: "dot",
                        detail: format!(
                            "dot takes two rank-2 or two rank-3 (batched) tiles, got {lt} and {rt}; use dot_general for other forms"
                        ),
                    },
                    Some(loc),
                );
                return None;
            }
        };
        let acc = if lt.dtype.is_int() {
            DType::I32
        } else {
            DType::F32
        };
        st.push_op(
            OpKind::Dot {
                lhs: l,
                rhs: r,
                dims,
                acc,
            },
            loc,
        )
        .first()
        .copied()
    })
}

/// StableHLO `dot_general` with explicit dimension numbers and accumulator.
#[track_caller]
pub fn dot_general(lhs: Tile, rhs: Tile, dims: DotDims, acc: DType) -> Tile {
    let loc = Loc::caller();
    record(lhs.builder, |st| {
        let (l, r) = (st.own(lhs, &loc)?, st.own(rhs, &loc)?);
        st.push_op(
            OpKind::Dot {
                lhs: l,
                rhs: r,
                dims,
                acc,
            },
            loc,
        )
        .first()
        .copied()
    })
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[track_caller]
        pub fn $name(self) -> Tile {
            self.unary(UnaryOp::$op, Loc::caller())
        }
    )*};
}

impl Tile {
    pub(super) fn from_parts(id: Option<ValueId>, builder: u32) -> Tile {
        match id {
            Some(id) => Tile { id, builder },
            None => record(builder, |_| None),
        }
    }

    /// The value id in the kernel body.
    pub fn id(self) -> ValueId {
        self.id
    }

    /// The tile's type, if it was built without error.
    pub fn ty(self) -> Option<TileType> {
        state::with(self.builder, |st| st.ty(self.id).cloned()).flatten()
    }

    /// The shape (empty if unknown because of an earlier error).
    pub fn shape(self) -> Vec<usize> {
        self.ty().map(|t| t.shape).unwrap_or_default()
    }

    /// The dtype (f32 if unknown because of an earlier error).
    pub fn dtype(self) -> DType {
        self.ty().map(|t| t.dtype).unwrap_or(DType::F32)
    }

    /// The unary op `op` (for code that walks [`UnaryOp::ALL`]; the named
    /// methods below are the same).
    #[track_caller]
    pub fn apply(self, op: UnaryOp) -> Tile {
        self.unary(op, Loc::caller())
    }

    pub(super) fn unary(self, op: UnaryOp, loc: Loc) -> Tile {
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::Unary { op, x }, loc).first().copied()
        })
    }

    unary_methods! {
        /// eˣ
        exp => Exp,
        /// 2ˣ
        exp2 => Exp2,
        /// Natural logarithm.
        log => Log,
        /// ln(1 + x), accurate near 0.
        log1p => Log1p,
        /// Hyperbolic tangent.
        tanh => Tanh,
        /// Square root.
        sqrt => Sqrt,
        /// 1 / √x.
        rsqrt => Rsqrt,
        /// Sine.
        sin => Sin,
        /// Cosine.
        cos => Cos,
        /// The error function.
        erf => Erf,
        /// 1 / (1 + e⁻ˣ).
        logistic => Logistic,
        /// |x|.
        abs => Abs,
        /// Round toward −∞.
        floor => Floor,
        /// Round toward +∞.
        ceil => Ceil,
    }

    /// The same bits read as `dtype` (`f32` ↔ `i32`): the float's
    /// encoding as an integer or back, as `f32::to_bits`.
    #[track_caller]
    pub fn bitcast(self, dtype: DType) -> Tile {
        let loc = Loc::caller();
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::Bitcast { x, dtype }, loc)
                .first()
                .copied()
        })
    }

    /// `self >> n` filling with zeros: the bits read as unsigned (`>>` is
    /// the arithmetic shift). The amount is taken modulo the bit width.
    #[track_caller]
    pub fn shr_logical(self, n: impl IntoOperand) -> Tile {
        binary(
            BinaryOp::ShiftRightLogical,
            self.into_operand(),
            n.into_operand(),
        )
    }

    /// Elementwise maximum (NaN-propagating).
    #[track_caller]
    pub fn max(self, other: impl IntoOperand) -> Tile {
        binary(BinaryOp::Max, self.into_operand(), other.into_operand())
    }

    /// Elementwise minimum (NaN-propagating).
    #[track_caller]
    pub fn min(self, other: impl IntoOperand) -> Tile {
        binary(BinaryOp::Min, self.into_operand(), other.into_operand())
    }

    /// Elementwise power.
    #[track_caller]
    pub fn pow(self, other: impl IntoOperand) -> Tile {
        binary(BinaryOp::Pow, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self < other` (bool).
    #[track_caller]
    pub fn lt(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Lt, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self <= other` (bool).
    #[track_caller]
    pub fn le(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Le, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self > other` (bool).
    #[track_caller]
    pub fn gt(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Gt, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self >= other` (bool).
    #[track_caller]
    pub fn ge(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Ge, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self == other` (bool).
    #[track_caller]
    pub fn eq(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Eq, self.into_operand(), other.into_operand())
    }

    /// Elementwise `self != other` (bool).
    #[track_caller]
    pub fn ne(self, other: impl IntoOperand) -> Tile {
        compare(CompareOp::Ne, self.into_operand(), other.into_operand())
    }

    /// `self ? on_true : on_false` for a bool tile.
    #[track_caller]
    pub fn select(self, on_true: impl IntoOperand, on_false: impl IntoOperand) -> Tile {
        select(self, on_true, on_false)
    }

    /// Converts to `dtype` (no op when the dtype is already `dtype`).
    #[track_caller]
    pub fn convert(self, dtype: DType) -> Tile {
        let loc = Loc::caller();
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            if st.ty(x).is_some_and(|t| t.dtype == dtype) {
                return Some(x);
            }
            st.push_op(OpKind::Convert { x, dtype }, loc)
                .first()
                .copied()
        })
    }

    /// Converts to the dtype of Rust type `T`: `x.cast::<bf16>()`.
    #[track_caller]
    pub fn cast<T: Element>(self) -> Tile {
        self.convert(T::DTYPE)
    }

    /// Reduces `axes` away with `op`.
    #[track_caller]
    pub fn reduce(self, op: ReduceOp, axes: &[usize]) -> Tile {
        self.reduce_at(op, axes.to_vec(), false, Loc::caller())
    }

    fn reduce_at(self, op: ReduceOp, axes: Vec<usize>, keep: bool, loc: Loc) -> Tile {
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            let shape = st.ty(x)?.shape.clone();
            let r = st
                .push_op(
                    OpKind::Reduce {
                        op,
                        x,
                        axes: axes.clone(),
                    },
                    loc.clone(),
                )
                .first()
                .copied()?;
            if !keep {
                return Some(r);
            }
            let kept: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
                .collect();
            st.push_op(OpKind::Reshape { x: r, shape: kept }, loc)
                .first()
                .copied()
        })
    }

    /// Sum along `axis`, which is removed.
    #[track_caller]
    pub fn sum(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Sum, vec![axis], false, Loc::caller())
    }

    /// Sum along `axis`, kept with size 1 (numpy `keepdims`).
    #[track_caller]
    pub fn sum_keep(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Sum, vec![axis], true, Loc::caller())
    }

    /// Maximum along `axis`, which is removed.
    #[track_caller]
    pub fn max_along(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Max, vec![axis], false, Loc::caller())
    }

    /// Maximum along `axis`, kept with size 1.
    #[track_caller]
    pub fn max_keep(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Max, vec![axis], true, Loc::caller())
    }

    /// Minimum along `axis`, which is removed.
    #[track_caller]
    pub fn min_along(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Min, vec![axis], false, Loc::caller())
    }

    /// Minimum along `axis`, kept with size 1.
    #[track_caller]
    pub fn min_keep(self, axis: usize) -> Tile {
        self.reduce_at(ReduceOp::Min, vec![axis], true, Loc::caller())
    }

    /// Sum of all elements (a scalar).
    #[track_caller]
    pub fn sum_all(self) -> Tile {
        let axes = (0..self.shape().len()).collect();
        self.reduce_at(ReduceOp::Sum, axes, false, Loc::caller())
    }

    /// Reshapes (row-major) to `shape`.
    #[track_caller]
    pub fn reshape(self, shape: impl Into<Vec<usize>>) -> Tile {
        let loc = Loc::caller();
        let shape = shape.into();
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::Reshape { x, shape }, loc)
                .first()
                .copied()
        })
    }

    /// Permutes dims: result dim i is operand dim `perm[i]`.
    #[track_caller]
    pub fn transpose(self, perm: impl Into<Vec<usize>>) -> Tile {
        let loc = Loc::caller();
        let perm = perm.into();
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::Transpose { x, perm }, loc)
                .first()
                .copied()
        })
    }

    /// Swaps the last two dims.
    #[track_caller]
    pub fn t(self) -> Tile {
        let rank = self.shape().len();
        let mut perm: Vec<usize> = (0..rank).collect();
        if rank >= 2 {
            perm.swap(rank - 1, rank - 2);
        }
        self.transpose(perm)
    }

    /// Broadcasts numpy-style to `shape`.
    #[track_caller]
    pub fn broadcast_to(self, shape: impl Into<Vec<usize>>) -> Tile {
        let loc = Loc::caller();
        let shape = shape.into();
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            broadcast(st, x, &shape, &loc)
        })
    }

    /// StableHLO `broadcast_in_dim`: operand dim i goes to result dim
    /// `dims[i]`.
    #[track_caller]
    pub fn broadcast_in_dim(
        self,
        shape: impl Into<Vec<usize>>,
        dims: impl Into<Vec<usize>>,
    ) -> Tile {
        let loc = Loc::caller();
        let (shape, dims) = (shape.into(), dims.into());
        record(self.builder, |st| {
            let x = st.own(self, &loc)?;
            st.push_op(OpKind::BroadcastInDim { x, shape, dims }, loc)
                .first()
                .copied()
        })
    }

    /// Matrix product with `rhs` (see [`dot`]).
    #[track_caller]
    pub fn dot(self, rhs: Tile) -> Tile {
        dot(self, rhs)
    }
}
