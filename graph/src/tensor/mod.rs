//! `Tensor`: a handle on a graph node, and the ops that record new nodes.
//!
//! Every op checks its inputs when it is recorded and returns
//! [`RuntimeError::Record`] naming the caller's line and the fix; nothing
//! is computed until a sync.

use std::panic::Location;
use std::sync::{Arc, Mutex};

use kernel_ir::{Array, BinaryOp, CompareOp, DType, UnaryOp, VerifiedKernel};

use super::node::{Dyn, KernelCall, Node, Op, State, Tape};
use super::{Runtime, RuntimeError};

mod linalg;
mod movement;

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
            let mut span = self.rt.inner.tracer.span("d2h");
            let a = b
                .to_host()
                .map_err(|e| RuntimeError::failed("copying to the host", e))?;
            let bytes = (a.len() * a.dtype().bytes()) as u64;
            self.rt.inner.stats().bytes_to_host += bytes;
            if let Some(s) = span.as_mut() {
                s.arg("bytes", bytes);
            }
            drop(span);
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

    pub(crate) fn record(
        &self,
        op: Op,
        inputs: Vec<Arc<Node>>,
        shape: Vec<usize>,
        dtype: DType,
        dims: Vec<Dyn>,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let mut span = self.rt.inner.tracer.span("record");
        if let Some(s) = span.as_mut() {
            s.arg("op", op.name());
        }
        let collective = op.is_collective();
        let tape = Tape::of(&op, &inputs);
        let node = Arc::new(Node {
            id: self.rt.inner.next_id(),
            shape,
            dtype,
            dims,
            loc: loc.to_string(),
            state: Mutex::new(State::Deferred { op, inputs }),
            tape,
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
        drop(span);
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
    pub(crate) fn broadcast_scalar(
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

    pub(crate) fn binary(
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

    pub(crate) fn unary(&self, op: UnaryOp, loc: &Location<'_>) -> Result<Tensor, RuntimeError> {
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

    /// The remainder of `self / other` with the sign of `self` (C's
    /// `fmod`).
    #[track_caller]
    pub fn rem(&self, other: &Tensor) -> Result<Tensor, RuntimeError> {
        self.binary(BinaryOp::Rem, other, Location::caller())
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

    /// `2ˣ`.
    #[track_caller]
    pub fn exp2(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Exp2, Location::caller())
    }

    /// `ln(1 + x)`.
    #[track_caller]
    pub fn log1p(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Log1p, Location::caller())
    }

    /// Rounds toward −∞.
    #[track_caller]
    pub fn floor(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Floor, Location::caller())
    }

    /// Rounds toward +∞.
    #[track_caller]
    pub fn ceil(&self) -> Result<Tensor, RuntimeError> {
        self.unary(UnaryOp::Ceil, Location::caller())
    }

    pub(crate) fn compare(
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
    vjp: Option<Arc<dyn super::autodiff::KernelVjp>>,
    loc: String,
) -> Result<Vec<Tensor>, RuntimeError> {
    let e = |m: String| RuntimeError::Record {
        message: m,
        loc: loc.clone(),
    };
    if args.iter().any(|t| !Arc::ptr_eq(&t.rt.inner, &rt.inner)) {
        return Err(e("the arguments belong to another runtime".into()));
    }
    // A kernel across chips runs as one SPMD program on the runtime's
    // devices: they must be its mesh.
    if let Some(mesh) = &kernel.mesh
        && mesh.devices() != rt.devices()
    {
        return Err(e(format!(
            "kernel `{}` runs on the {} devices of its mesh but this runtime has {}; \
                 create the runtime with RuntimeOptions {{ devices: {}, .. }}",
            kernel.name,
            mesh.devices(),
            rt.devices(),
            mesh.devices()
        )));
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
        vjp,
        outputs: Mutex::new(Vec::new()),
    });
    let inputs: Vec<Arc<Node>> = args.iter().map(|t| t.node.clone()).collect();
    let mut outs: Vec<Tensor> = Vec::new();
    // Built last to first: output `i`'s tape holds the later outputs, so
    // the first output keeps every saved value (flash attention's lse)
    // alive for the backward without a reference cycle.
    let n_out = kernel.outputs().count();
    for (i, o) in kernel
        .outputs()
        .enumerate()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        let op = Op::Kernel {
            call: call.clone(),
            output: i,
        };
        let tape = match Tape::of(&op, &inputs) {
            Tape::Op { op, inputs, .. } => Tape::Op {
                op,
                inputs,
                siblings: outs.iter().map(|t| t.node.clone()).collect(),
            },
            t => t,
        };
        let node = Arc::new(Node {
            id: rt.inner.next_id(),
            shape: o.shape.clone(),
            dtype: o.dtype,
            dims: vec![None; o.shape.len()],
            loc: loc.clone(),
            state: Mutex::new(State::Deferred {
                op,
                inputs: inputs.clone(),
            }),
            tape,
        });
        outs.push(Tensor::from_node(rt.clone(), node));
    }
    outs.reverse();
    debug_assert_eq!(outs.len(), n_out);
    *call.outputs.lock().unwrap_or_else(|p| p.into_inner()) =
        outs.iter().map(|t| Arc::downgrade(&t.node)).collect();
    if rt.inner.options.eager {
        let refs: Vec<&Tensor> = outs.iter().collect();
        rt.sync(&refs)?;
    }
    Ok(outs)
}
