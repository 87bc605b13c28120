//! `Tensor`: a handle on a graph node, and the ops that record new nodes.
//!
//! Every op checks its inputs when it is recorded and returns
//! [`RuntimeError::Record`] naming the caller's line and the fix; nothing
//! is computed until a sync.

use std::panic::Location;
use std::sync::{Arc, Mutex};

use kernel_ir::{Array, BinaryOp, CompareOp, DType, DotDims, ReduceOp, UnaryOp, VerifiedKernel};

use super::node::{Dyn, KernelCall, Node, Op, State};
use super::{Runtime, RuntimeError};

/// A lazy tensor: a handle on a node of the runtime's graph. Clones share
/// the node; when it is materialized, every handle sees the result.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) rt: Runtime,
    pub(crate) node: Arc<Node>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor({}{:?}, {})",
            self.node.dtype,
            self.node.shape,
            if self.is_materialized() {
                "materialized"
            } else {
                "deferred"
            }
        )
    }
}

fn err(message: impl Into<String>, loc: &Location<'_>) -> RuntimeError {
    RuntimeError::Record {
        message: message.into(),
        loc: loc.to_string(),
    }
}

fn same_dyn(a: &Dyn, b: &Dyn) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x.valid == y.valid,
        _ => true,
    }
}

/// Elementwise combination of the padded-dim information of two shapes.
fn merge_dims(a: &[Dyn], b: &[Dyn], loc: &Location<'_>) -> Result<Vec<Dyn>, RuntimeError> {
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(d, (x, y))| {
            if !same_dyn(x, y) {
                return Err(err(
                    format!(
                        "dim {d} is padded to a bucket with different valid lengths ({} and {}); \
                         combine tensors of the same length",
                        x.as_ref().map_or(0, |v| v.valid),
                        y.as_ref().map_or(0, |v| v.valid)
                    ),
                    loc,
                ));
            }
            Ok(x.clone().or_else(|| y.clone()))
        })
        .collect()
}

impl Tensor {
    pub(crate) fn from_node(rt: Runtime, node: Arc<Node>) -> Tensor {
        Tensor { rt, node }
    }

    /// Shape (a dim padded to a bucket has its bucket size).
    pub fn shape(&self) -> &[usize] {
        &self.node.shape
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.node.dtype
    }

    /// The shape with padded dims at their valid lengths.
    pub fn valid_shape(&self) -> Vec<usize> {
        self.node
            .shape
            .iter()
            .zip(&self.node.dims)
            .map(|(&s, d)| d.as_ref().map_or(s, |v| v.valid))
            .collect()
    }

    /// True once computed (or uploaded).
    pub fn is_materialized(&self) -> bool {
        matches!(&*self.node.lock(), State::Ready(_))
    }

    /// The runtime it belongs to.
    pub fn runtime(&self) -> &Runtime {
        &self.rt
    }

    /// The valid length of `dim` as an `i32[1]` tensor: the scalar-prefetch
    /// operand a kernel uses to mask the padding of a bucketed dim (a
    /// static dim gives its size).
    #[track_caller]
    pub fn valid_length(&self, dim: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let d = self.node.dims.get(dim).ok_or_else(|| {
            err(
                format!(
                    "dim {dim} is out of range for rank {}",
                    self.node.shape.len()
                ),
                loc,
            )
        })?;
        let node = match d {
            Some(v) => v.node.clone(),
            None => super::bucket::length_node(&self.rt, self.node.shape[dim], loc.to_string())?,
        };
        Ok(Tensor::from_node(self.rt.clone(), node))
    }

    // ---- sync points ----

    /// Materializes this tensor and copies device 0's value to the host
    /// (padded dims cut to their valid lengths).
    pub fn to_host(&self) -> Result<Array, RuntimeError> {
        Ok(self.to_host_all()?.swap_remove(0))
    }

    /// Materializes and copies every device's value.
    pub fn to_host_all(&self) -> Result<Vec<Array>, RuntimeError> {
        self.rt.sync(&[self])?;
        let bufs = match self.node.ready() {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(e),
            None => {
                return Err(RuntimeError::Internal(
                    "node not materialized after sync".into(),
                ));
            }
        };
        let mut out = Vec::with_capacity(bufs.len());
        for b in bufs.iter() {
            let a = b
                .to_host()
                .map_err(|e| RuntimeError::failed("copying to the host", e))?;
            self.rt.inner.stats().bytes_to_host += (a.len() * a.dtype().bytes()) as u64;
            out.push(crop(&a, &self.valid_shape()));
        }
        Ok(out)
    }

    /// The single element of a one-element tensor.
    #[track_caller]
    pub fn item(&self) -> Result<f64, RuntimeError> {
        let loc = Location::caller();
        let a = self.to_host()?;
        if a.len() != 1 {
            return Err(err(
                format!(
                    "item() needs one element, the tensor has shape {:?}",
                    a.shape()
                ),
                loc,
            ));
        }
        Ok(a.data()[0])
    }

    // ---- recording ----

    fn record(
        &self,
        op: Op,
        inputs: Vec<Arc<Node>>,
        shape: Vec<usize>,
        dtype: DType,
        dims: Vec<Dyn>,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let collective = op.is_collective();
        let node = Arc::new(Node {
            id: self.rt.inner.next_id(),
            shape,
            dtype,
            dims,
            loc: loc.to_string(),
            state: Mutex::new(State::Deferred { op, inputs }),
        });
        if collective {
            self.rt
                .inner
                .pending_collectives
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(node.clone());
        }
        let t = Tensor::from_node(self.rt.clone(), node);
        if self.rt.inner.options.eager {
            self.rt.sync(&[&t])?;
        }
        Ok(t)
    }

    fn same_runtime(&self, other: &Tensor, loc: &Location<'_>) -> Result<(), RuntimeError> {
        if Arc::ptr_eq(&self.rt.inner, &other.rt.inner) {
            Ok(())
        } else {
            Err(err("the tensors belong to different runtimes", loc))
        }
    }

    /// A rank-0 operand broadcast to `shape`.
    fn broadcast_scalar(
        &self,
        shape: &[usize],
        dims: &[Dyn],
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        self.record(
            Op::Broadcast(Vec::new()),
            vec![self.node.clone()],
            shape.to_vec(),
            self.node.dtype,
            dims.to_vec(),
            loc,
        )
    }

    /// The two operands of an elementwise op at a common shape (a rank-0
    /// operand is broadcast).
    fn pair(&self, other: &Tensor, loc: &Location<'_>) -> Result<(Tensor, Tensor), RuntimeError> {
        self.same_runtime(other, loc)?;
        if self.node.dtype != other.node.dtype {
            return Err(err(
                format!(
                    "dtypes differ: {} and {}; convert one with .cast(..)",
                    self.node.dtype, other.node.dtype
                ),
                loc,
            ));
        }
        let (a, b) = (&self.node, &other.node);
        if a.shape == b.shape {
            return Ok((self.clone(), other.clone()));
        }
        if b.shape.is_empty() {
            return Ok((
                self.clone(),
                other.broadcast_scalar(&a.shape, &a.dims, loc)?,
            ));
        }
        if a.shape.is_empty() {
            return Ok((
                self.broadcast_scalar(&b.shape, &b.dims, loc)?,
                other.clone(),
            ));
        }
        Err(err(
            format!(
                "shapes differ: {:?} and {:?}; broadcast one explicitly with .broadcast_to(..)",
                a.shape, b.shape
            ),
            loc,
        ))
    }

    fn binary(
        &self,
        op: BinaryOp,
        other: &Tensor,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let (a, b) = self.pair(other, loc)?;
        if matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor) && a.dtype().is_float() {
            return Err(err(
                format!("{} needs integer or bool tensors", op.name()),
                loc,
            ));
        }
        let dims = merge_dims(&a.node.dims, &b.node.dims, loc)?;
        self.record(
            Op::Binary(op),
            vec![a.node.clone(), b.node.clone()],
            a.node.shape.clone(),
            a.node.dtype,
            dims,
            loc,
        )
    }

    fn unary(&self, op: UnaryOp, loc: &Location<'_>) -> Result<Tensor, RuntimeError> {
        let d = self.node.dtype;
        let float_only = !matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not);
        if float_only && !d.is_float() {
            return Err(err(
                format!("{} needs a float tensor, got {d}; cast first", op.name()),
                loc,
            ));
        }
        if op == UnaryOp::Not && d.is_float() {
            return Err(err("not needs an integer or bool tensor", loc));
        }
        self.record(
            Op::Unary(op),
            vec![self.node.clone()],
            self.node.shape.clone(),
            d,
            self.node.dims.clone(),
            loc,
        )
    }

    /// `self + other` (a rank-0 operand broadcasts).
    #[track_caller]
    pub fn add(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Add, other, Location::caller())
    }
    /// `self - other`.
    #[track_caller]
    pub fn sub(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Sub, other, Location::caller())
    }
    /// `self * other`.
    #[track_caller]
    pub fn mul(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Mul, other, Location::caller())
    }
    /// `self / other`.
    #[track_caller]
    pub fn div(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Div, other, Location::caller())
    }
    /// Elementwise maximum.
    #[track_caller]
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Max, other, Location::caller())
    }
    /// Elementwise minimum.
    #[track_caller]
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Min, other, Location::caller())
    }
    /// `self ^ other`.
    #[track_caller]
    pub fn pow(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Pow, other, Location::caller())
    }
    /// `self * c` for a constant `c`.
    #[track_caller]
    pub fn scale(&self, c: f64) -> Result<Tensor, RuntimeError> {
        let s = self.rt.scalar(c, self.node.dtype);
        self.binary(BinaryOp::Mul, &s, Location::caller())
    }
    /// `self + c` for a constant `c`.
    #[track_caller]
    pub fn add_scalar(&self, c: f64) -> Result<Tensor, RuntimeError> {
        let s = self.rt.scalar(c, self.node.dtype);
        self.binary(BinaryOp::Add, &s, Location::caller())
    }

    /// `-self`.
    #[track_caller]
    pub fn neg(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Neg, Location::caller())
    }
    /// `|self|`.
    #[track_caller]
    pub fn abs(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Abs, Location::caller())
    }
    /// `eˣ`.
    #[track_caller]
    pub fn exp(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Exp, Location::caller())
    }
    /// Natural log.
    #[track_caller]
    pub fn log(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Log, Location::caller())
    }
    /// `tanh`.
    #[track_caller]
    pub fn tanh(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Tanh, Location::caller())
    }
    /// `√x`.
    #[track_caller]
    pub fn sqrt(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Sqrt, Location::caller())
    }
    /// `1/√x`.
    #[track_caller]
    pub fn rsqrt(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Rsqrt, Location::caller())
    }
    /// `1/(1+e⁻ˣ)`.
    #[track_caller]
    pub fn logistic(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Logistic, Location::caller())
    }
    /// `sin`.
    #[track_caller]
    pub fn sin(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Sin, Location::caller())
    }
    /// `cos`.
    #[track_caller]
    pub fn cos(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Cos, Location::caller())
    }
    /// The error function.
    #[track_caller]
    pub fn erf(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Erf, Location::caller())
    }

    fn compare(
        &self,
        op: CompareOp,
        other: &Tensor,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let (a, b) = self.pair(other, loc)?;
        let dims = merge_dims(&a.node.dims, &b.node.dims, loc)?;
        self.record(
            Op::Compare(op),
            vec![a.node.clone(), b.node.clone()],
            a.node.shape.clone(),
            DType::Bool,
            dims,
            loc,
        )
    }
    /// `self < other` (bool).
    #[track_caller]
    pub fn lt(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Lt, other, Location::caller())
    }
    /// `self <= other` (bool).
    #[track_caller]
    pub fn le(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Le, other, Location::caller())
    }
    /// `self > other` (bool).
    #[track_caller]
    pub fn gt(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Gt, other, Location::caller())
    }
    /// `self >= other` (bool).
    #[track_caller]
    pub fn ge(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Ge, other, Location::caller())
    }
    /// `self == other` (bool).
    #[track_caller]
    pub fn eq(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Eq, other, Location::caller())
    }
    /// `self != other` (bool).
    #[track_caller]
    pub fn ne(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.compare(CompareOp::Ne, other, Location::caller())
    }

    /// `self ? on_true : on_false` elementwise; `self` is bool.
    #[track_caller]
    pub fn select(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        if self.node.dtype != DType::Bool {
            return Err(err(
                format!("select needs a bool condition, got {}", self.node.dtype),
                loc,
            ));
        }
        let (t, f) = on_true.pair(on_false, loc)?;
        if self.node.shape != t.node.shape {
            return Err(err(
                format!(
                    "the condition has shape {:?}, the values {:?}",
                    self.node.shape, t.node.shape
                ),
                loc,
            ));
        }
        let dims = merge_dims(
            &merge_dims(&self.node.dims, &t.node.dims, loc)?,
            &f.node.dims,
            loc,
        )?;
        self.record(
            Op::Select,
            vec![self.node.clone(), t.node.clone(), f.node.clone()],
            t.node.shape.clone(),
            t.node.dtype,
            dims,
            loc,
        )
    }

    /// Converts to `dtype` (rounding as the dtype does).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        if dtype == self.node.dtype {
            return Ok(self.clone());
        }
        self.record(
            Op::Convert,
            vec![self.node.clone()],
            self.node.shape.clone(),
            dtype,
            self.node.dims.clone(),
            loc,
        )
    }

    /// A general dot product (XLA's `dot_general`): result dims are batch,
    /// lhs free, rhs free; the result has the inputs' dtype.
    #[track_caller]
    pub fn dot_general(&self, rhs: &Tensor, dims: DotDims) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        self.same_runtime(rhs, loc)?;
        let (a, b) = (&self.node, &rhs.node);
        if a.dtype != b.dtype {
            return Err(err(
                format!("dtypes differ: {} and {}; cast one", a.dtype, b.dtype),
                loc,
            ));
        }
        let check = |ds: &[usize], rank: usize, side: &str| -> Result<(), RuntimeError> {
            for &d in ds {
                if d >= rank {
                    return Err(err(
                        format!("{side} dim {d} is out of range for rank {rank}"),
                        loc,
                    ));
                }
            }
            Ok(())
        };
        check(&dims.lhs_batch, a.shape.len(), "lhs batch")?;
        check(&dims.lhs_contract, a.shape.len(), "lhs contracting")?;
        check(&dims.rhs_batch, b.shape.len(), "rhs batch")?;
        check(&dims.rhs_contract, b.shape.len(), "rhs contracting")?;
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contract.len() != dims.rhs_contract.len()
        {
            return Err(err(
                "batch and contracting dims must pair up between lhs and rhs",
                loc,
            ));
        }
        for (&l, &r) in dims
            .lhs_batch
            .iter()
            .zip(&dims.rhs_batch)
            .chain(dims.lhs_contract.iter().zip(&dims.rhs_contract))
        {
            if a.shape[l] != b.shape[r] {
                return Err(err(
                    format!(
                        "lhs dim {l} has size {} but rhs dim {r} has size {}",
                        a.shape[l], b.shape[r]
                    ),
                    loc,
                ));
            }
            if !same_dyn(&a.dims[l], &b.dims[r]) {
                return Err(err(
                    format!("lhs dim {l} and rhs dim {r} have different valid lengths"),
                    loc,
                ));
            }
        }
        let free = |rank: usize, batch: &[usize], con: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !batch.contains(d) && !con.contains(d))
                .collect()
        };
        let lf = free(a.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
        let rf = free(b.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
        let mut shape = Vec::new();
        let mut out_dims = Vec::new();
        for &d in &dims.lhs_batch {
            shape.push(a.shape[d]);
            out_dims.push(a.dims[d].clone());
        }
        for &d in &lf {
            shape.push(a.shape[d]);
            out_dims.push(a.dims[d].clone());
        }
        for &d in &rf {
            shape.push(b.shape[d]);
            out_dims.push(b.dims[d].clone());
        }
        self.record(
            Op::Dot(dims),
            vec![a.clone(), b.clone()],
            shape,
            a.dtype,
            out_dims,
            loc,
        )
    }

    /// Matrix product over the last two dims (`[.., m, k] × [.., k, n]`,
    /// equal leading batch dims; or `[.., m, k] × [k, n]`).
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let (ra, rb) = (self.node.shape.len(), rhs.node.shape.len());
        if ra < 2 || rb < 2 {
            return Err(err(
                format!("matmul needs rank ≥ 2 operands, got ranks {ra} and {rb}"),
                loc,
            ));
        }
        let dims = if rb == 2 {
            DotDims {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![ra - 1],
                rhs_contract: vec![0],
            }
        } else if ra == rb {
            DotDims {
                lhs_batch: (0..ra - 2).collect(),
                rhs_batch: (0..rb - 2).collect(),
                lhs_contract: vec![ra - 1],
                rhs_contract: vec![rb - 2],
            }
        } else {
            return Err(err(
                format!("matmul of ranks {ra} and {rb}: give the rhs rank 2 or the lhs's rank"),
                loc,
            ));
        };
        self.dot_general(rhs, dims).map_err(|e| relocate(e, loc))
    }

    fn reduce(
        &self,
        op: ReduceOp,
        axes: &[usize],
        mean: bool,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let n = &self.node;
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != axes.len() || sorted.iter().any(|&a| a >= n.shape.len()) {
            return Err(err(
                format!(
                    "axes {axes:?} must be distinct dims of a rank-{} tensor",
                    n.shape.len()
                ),
                loc,
            ));
        }
        if mean && !n.dtype.is_float() {
            return Err(err("mean needs a float tensor", loc));
        }
        let mut inputs = vec![n.clone()];
        let mut masked = Vec::new();
        for &a in &sorted {
            if let Some(d) = &n.dims[a] {
                masked.push((a, inputs.len()));
                inputs.push(d.node.clone());
            }
        }
        let keep: Vec<usize> = (0..n.shape.len()).filter(|d| !sorted.contains(d)).collect();
        self.record(
            Op::Reduce {
                op,
                axes: sorted,
                mean,
                masked,
            },
            inputs,
            keep.iter().map(|&d| n.shape[d]).collect(),
            n.dtype,
            keep.iter().map(|&d| n.dims[d].clone()).collect(),
            loc,
        )
    }
    /// Sum over `axes` (padding of bucketed dims excluded).
    #[track_caller]
    pub fn sum(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Sum, axes, false, Location::caller())
    }
    /// Mean over `axes` (over valid elements only).
    #[track_caller]
    pub fn mean(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Sum, axes, true, Location::caller())
    }
    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Max, axes, false, Location::caller())
    }
    /// Minimum over `axes`.
    #[track_caller]
    pub fn min(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Min, axes, false, Location::caller())
    }

    /// Softmax along `axis` (padding of a bucketed axis gets probability 0).
    #[track_caller]
    pub fn softmax(&self, axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() || !n.dtype.is_float() {
            return Err(err(
                format!(
                    "softmax needs a float tensor and an axis below its rank {}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut inputs = vec![n.clone()];
        let masked = n.dims[axis].as_ref().map(|d| {
            inputs.push(d.node.clone());
            1
        });
        self.record(
            Op::Softmax { axis, masked },
            inputs,
            n.shape.clone(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// The same elements in a new shape. A bucketed dim must stay a dim of
    /// its own (same size, same elements before it).
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        let count: usize = shape.iter().product();
        let have: usize = n.shape.iter().product();
        if count != have {
            return Err(err(
                format!(
                    "cannot reshape {:?} ({have} elements) to {shape:?} ({count})",
                    n.shape
                ),
                loc,
            ));
        }
        let mut dims = vec![None; shape.len()];
        for (d, dy) in n.dims.iter().enumerate() {
            let Some(dy) = dy else { continue };
            let before: usize = n.shape[..d].iter().product();
            let target = (0..shape.len()).find(|&e| {
                shape[e] == n.shape[d] && shape[..e].iter().product::<usize>() == before
            });
            match target {
                Some(e) => dims[e] = Some(dy.clone()),
                None => {
                    return Err(err(
                        format!(
                            "dim {d} is padded to a bucket; the reshape to {shape:?} would mix its padding into other dims"
                        ),
                        loc,
                    ));
                }
            }
        }
        self.record(
            Op::Reshape,
            vec![n.clone()],
            shape.to_vec(),
            n.dtype,
            dims,
            loc,
        )
    }

    /// Permutes dims: result dim `i` is input dim `perm[i]`.
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        let mut seen = vec![false; n.shape.len()];
        if perm.len() != n.shape.len()
            || perm
                .iter()
                .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
        {
            return Err(err(
                format!("{perm:?} is not a permutation of {} dims", n.shape.len()),
                loc,
            ));
        }
        self.record(
            Op::Transpose(perm.to_vec()),
            vec![n.clone()],
            perm.iter().map(|&p| n.shape[p]).collect(),
            n.dtype,
            perm.iter().map(|&p| n.dims[p].clone()).collect(),
            loc,
        )
    }

    /// Broadcasts to `shape`, input dim `i` becoming output dim `dims[i]`
    /// (sizes equal or 1).
    #[track_caller]
    pub fn broadcast_in_dim(
        &self,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if dims.len() != n.shape.len() {
            return Err(err(
                format!(
                    "give one output dim per input dim ({}), got {dims:?}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut out_dims = vec![None; shape.len()];
        for (i, &d) in dims.iter().enumerate() {
            if d >= shape.len()
                || (n.shape[i] != 1 && n.shape[i] != shape[d])
                || (i > 0 && dims[i - 1] >= d)
            {
                return Err(err(
                    format!(
                        "cannot broadcast {:?} to {shape:?} with dims {dims:?}: dims must increase and sizes match or be 1",
                        n.shape
                    ),
                    loc,
                ));
            }
            if n.shape[i] == shape[d] {
                out_dims[d] = n.dims[i].clone();
            }
        }
        self.record(
            Op::Broadcast(dims.to_vec()),
            vec![n.clone()],
            shape.to_vec(),
            n.dtype,
            out_dims,
            loc,
        )
    }

    /// Broadcasts trailing-aligned, NumPy style.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let rank = self.node.shape.len();
        if rank > shape.len() {
            return Err(err(
                format!(
                    "cannot broadcast {:?} to the lower-rank {shape:?}",
                    self.node.shape
                ),
                loc,
            ));
        }
        let dims: Vec<usize> = (shape.len() - rank..shape.len()).collect();
        self.broadcast_in_dim(shape, &dims)
            .map_err(|e| relocate(e, loc))
    }

    /// Elements `start[d]..limit[d]` of each dim (not along a bucketed
    /// dim: its valid length is only known at run time).
    #[track_caller]
    pub fn slice(&self, start: &[usize], limit: &[usize]) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if start.len() != n.shape.len() || limit.len() != n.shape.len() {
            return Err(err(
                format!("give a start and a limit per dim ({})", n.shape.len()),
                loc,
            ));
        }
        for d in 0..n.shape.len() {
            if start[d] > limit[d] || limit[d] > n.shape[d] {
                return Err(err(
                    format!(
                        "dim {d}: {}..{} is not inside 0..{}",
                        start[d], limit[d], n.shape[d]
                    ),
                    loc,
                ));
            }
            if n.dims[d].is_some() && (start[d], limit[d]) != (0, n.shape[d]) {
                return Err(err(
                    format!("dim {d} is padded to a bucket; slice it after to_host"),
                    loc,
                ));
            }
        }
        self.record(
            Op::Slice {
                start: start.to_vec(),
                limit: limit.to_vec(),
            },
            vec![n.clone()],
            start.iter().zip(limit).map(|(s, l)| l - s).collect(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// Concatenates `self` and `others` along `axis`.
    #[track_caller]
    pub fn concat(&self, others: &[&Tensor], axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() {
            return Err(err(
                format!("axis {axis} is out of range for rank {}", n.shape.len()),
                loc,
            ));
        }
        let mut shape = n.shape.clone();
        let mut dims = n.dims.clone();
        let mut inputs = vec![n.clone()];
        for o in others {
            self.same_runtime(o, loc)?;
            let m = &o.node;
            let same_other_dims = m.shape.len() == n.shape.len()
                && (0..n.shape.len()).all(|d| d == axis || m.shape[d] == n.shape[d]);
            if m.dtype != n.dtype || !same_other_dims {
                return Err(err(
                    format!(
                        "cannot concatenate {}{:?} to {}{:?} along {axis}",
                        m.dtype, m.shape, n.dtype, n.shape
                    ),
                    loc,
                ));
            }
            dims = merge_dims(&dims, &m.dims, loc)?;
            shape[axis] += m.shape[axis];
            inputs.push(m.clone());
        }
        if inputs.iter().any(|i| i.dims[axis].is_some()) {
            return Err(err(
                format!("dim {axis} is padded to a bucket; concatenate after to_host"),
                loc,
            ));
        }
        self.record(Op::Concat(axis), inputs, shape, n.dtype, dims, loc)
    }

    /// The sum over all devices, on every device.
    #[track_caller]
    pub fn all_reduce_sum(&self) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        self.record(
            Op::AllReduce,
            vec![n.clone()],
            n.shape.clone(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }

    /// Every device's value concatenated along `axis`, on every device.
    #[track_caller]
    pub fn all_gather(&self, axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() || n.dims[axis].is_some() {
            return Err(err(
                format!(
                    "all_gather needs an unpadded axis below rank {}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut shape = n.shape.clone();
        shape[axis] *= self.rt.inner.devices;
        self.record(
            Op::AllGather(axis),
            vec![n.clone()],
            shape,
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }
}

/// Re-points a record error at `loc` (for ops built from other ops).
fn relocate(e: RuntimeError, loc: &Location<'_>) -> RuntimeError {
    match e {
        RuntimeError::Record { message, .. } => RuntimeError::Record {
            message,
            loc: loc.to_string(),
        },
        e => e,
    }
}

/// `a` cut to `valid` (leading elements of each dim).
fn crop(a: &Array, valid: &[usize]) -> Array {
    if a.shape() == valid {
        return a.clone();
    }
    let shape = a.shape();
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let count: usize = valid.iter().product();
    let mut data = Vec::with_capacity(count);
    let mut idx = vec![0usize; valid.len()];
    for _ in 0..count {
        let flat: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        data.push(a.data()[flat]);
        for d in (0..valid.len()).rev() {
            idx[d] += 1;
            if idx[d] < valid[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Array::new(a.dtype(), valid.to_vec(), data).unwrap_or_else(|_| a.clone())
}

/// Records a kernel call.
pub(super) fn call(
    rt: &Runtime,
    kernel: &VerifiedKernel,
    args: &[&Tensor],
    loc: String,
) -> Result<Vec<Tensor>, RuntimeError> {
    let e = |m: String| RuntimeError::Record {
        message: m,
        loc: loc.clone(),
    };
    if args.iter().any(|t| !Arc::ptr_eq(&t.rt.inner, &rt.inner)) {
        return Err(e("the arguments belong to another runtime".into()));
    }
    kernel
        .check_arguments(
            args.iter()
                .map(|t| (Some(t.node.dtype), t.node.shape.as_slice())),
        )
        .map_err(|error| RuntimeError::Arguments {
            error: Box::new(error),
            loc: loc.clone(),
        })?;
    let call = Arc::new(KernelCall {
        kernel: kernel.clone(),
    });
    let inputs: Vec<Arc<Node>> = args.iter().map(|t| t.node.clone()).collect();
    let mut outs = Vec::new();
    for (i, o) in kernel.outputs().enumerate() {
        let node = Arc::new(Node {
            id: rt.inner.next_id(),
            shape: o.shape.clone(),
            dtype: o.dtype,
            dims: vec![None; o.shape.len()],
            loc: loc.clone(),
            state: Mutex::new(State::Deferred {
                op: Op::Kernel {
                    call: call.clone(),
                    output: i,
                },
                inputs: inputs.clone(),
            }),
        });
        outs.push(Tensor::from_node(rt.clone(), node));
    }
    if rt.inner.options.eager {
        let refs: Vec<&Tensor> = outs.iter().collect();
        rt.sync(&refs)?;
    }
    Ok(outs)
}
