//! Reverse mode over the recorded graph.
//!
//! A tensor marked with [`Tensor::requires_grad`] is a parameter; every op
//! recorded from a tracked tensor keeps its op and inputs on the node's
//! tape (see `node::Tape`), also after the node is materialized. [`vjp`]
//! walks the tape from the outputs back, last use first, and records each
//! op's vector-Jacobian product as ordinary deferred ops (`rules.rs`), so
//! the gradient is one more part of the graph: materialized at the next
//! sync with the forward (one module, compiled once per bucket and then a
//! cache hit) or after it.
//!
//! Kernel calls are differentiated by the backward they declare
//! ([`Runtime::call_with_vjp`], [`KernelVjp`]); a kernel called without
//! one is an error naming it, never a silent zero. Gradients are recorded
//! with tracking off: there are no gradients of gradients.
//!
//! Padding of bucketed dims: the rules of reductions and softmax give the
//! padding zero cotangent (it did not take part in the forward), so
//! gradients of valid positions do not depend on the padding.
//!
//! ```no_run
//! # fn main() -> Result<(), graph::RuntimeError> {
//! use kernel_ir::{Array, DType};
//! use graph::{Runtime, grad};
//!
//! let rt = Runtime::cpu()?;
//! let w = rt.tensor(&Array::random(DType::F32, [8, 2], 2, -1.0, 1.0))?.requires_grad()?;
//! let x = rt.tensor(&Array::random(DType::F32, [4, 8], 1, -1.0, 1.0))?;
//! let loss = x.matmul(&w)?.tanh()?.mul(&x.matmul(&w)?)?.sum(&[0, 1])?;
//! let dw = grad(&loss, &[&w])?.remove(0); // recorded, not run
//! let host = dw.to_host()?;               // forward and backward run here
//! # Ok(()) }
//! ```

mod rules;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use kernel_ir::VerifiedKernel;

use super::node::{Node, Op, State, Tape, without_grad};
use super::{Runtime, RuntimeError, Tensor};

/// What a kernel's backward gets: the call's inputs, the outputs still
/// alive (an output the program dropped and that no later output keeps is
/// `None`), and the cotangent of each output (`None`: it does not reach
/// the loss, so it is zero).
pub struct VjpCall<'a> {
    /// The kernel.
    pub kernel: &'a VerifiedKernel,
    /// The call's arguments, in call order (scalar prefetch first).
    pub inputs: &'a [Tensor],
    /// The call's outputs.
    pub outputs: &'a [Option<Tensor>],
    /// The cotangent of each output.
    pub cotangents: &'a [Option<Tensor>],
}

impl VjpCall<'_> {
    /// The cotangent of output `i`, zeros when it does not reach the loss.
    pub fn cotangent(&self, i: usize) -> Result<Tensor, RuntimeError> {
        if let Some(Some(g)) = self.cotangents.get(i) {
            return Ok(g.clone());
        }
        let o = self.kernel.outputs().nth(i).ok_or_else(|| {
            RuntimeError::Internal(format!("kernel `{}` has no output {i}", self.kernel.name))
        })?;
        let rt = self
            .inputs
            .first()
            .map(|t| t.rt.clone())
            .ok_or_else(|| RuntimeError::Internal("a kernel call with no inputs".into()))?;
        rt.scalar(0.0, o.dtype).broadcast_to(&o.shape)
    }
}

/// A kernel's backward: records the cotangent of each input (in call
/// order; `None` for inputs without one, such as integer scalar prefetch)
/// from a [`VjpCall`], with any tensor ops and kernel calls.
pub trait KernelVjp: Send + Sync {
    /// The input cotangents.
    fn vjp(&self, call: &VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError>;
}

impl<F> KernelVjp for F
where
    F: Fn(&VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError> + Send + Sync,
{
    fn vjp(&self, call: &VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError> {
        self(call)
    }
}

/// Runs `f` with gradient tracking off on this thread: tensors recorded
/// inside are not tracked even when their inputs are (optimizer updates,
/// metrics).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    without_grad(f)
}

/// Runs `f` with gradient tracking on: inside a kernel's backward (which
/// records with tracking off), a forward recomputed from fresh parameters
/// (`.reshape(shape)?.requires_grad()` of the backward's inputs: an op on
/// each, so a program exported from the backward still reads the inputs)
/// and pulled back through with [`vjp`] —
/// a fused kernel's backward as its unfused composition's. What `f`
/// records from the backward's own tensors stays untracked, so there are
/// still no gradients of gradients.
pub fn with_grad<R>(f: impl FnOnce() -> R) -> R {
    crate::node::with_tracking(true, f)
}

/// The gradient of a rank-0 `loss` with respect to each of `params`
/// (tensors marked with [`Tensor::requires_grad`]), recorded as deferred
/// ops. A parameter the loss does not depend on gets zeros.
#[track_caller]
pub fn grad(loss: &Tensor, params: &[&Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    let loc = std::panic::Location::caller().to_string();
    if !loss.shape().is_empty() {
        return Err(RuntimeError::Record {
            message: format!(
                "grad needs a rank-0 loss, got shape {:?}; reduce it with .sum(..) or .mean(..), or use vjp with a cotangent",
                loss.shape()
            ),
            loc,
        });
    }
    let one = loss.rt.scalar(1.0, loss.dtype());
    vjp(&[loss], &[&one], params)
}

/// The vector-Jacobian product: the gradient of `Σ_i ⟨outputs[i],
/// cotangents[i]⟩` with respect to each of `params`, recorded as deferred
/// ops (each cotangent has its output's shape and dtype).
#[track_caller]
pub fn vjp(
    outputs: &[&Tensor],
    cotangents: &[&Tensor],
    params: &[&Tensor],
) -> Result<Vec<Tensor>, RuntimeError> {
    let loc = std::panic::Location::caller().to_string();
    let bad = |message: String| RuntimeError::Record {
        message,
        loc: loc.clone(),
    };
    if outputs.len() != cotangents.len() {
        return Err(bad(format!(
            "give one cotangent per output: {} outputs, {} cotangents",
            outputs.len(),
            cotangents.len()
        )));
    }
    for (i, (o, c)) in outputs.iter().zip(cotangents).enumerate() {
        if o.shape() != c.shape() || o.dtype() != c.dtype() {
            return Err(bad(format!(
                "cotangent {i} is {}{:?}, its output {}{:?}; give it the output's shape and dtype",
                c.dtype(),
                c.shape(),
                o.dtype(),
                o.shape()
            )));
        }
        if !o.node.tape.tracked() {
            return Err(bad(format!(
                "output {i} does not depend on any parameter; mark parameters with .requires_grad() before recording the ops"
            )));
        }
    }
    for (i, p) in params.iter().enumerate() {
        if !matches!(p.node.tape, Tape::Leaf) {
            return Err(bad(format!(
                "parameter {i} ({}{:?}) is not a leaf marked with .requires_grad(); take gradients with respect to the tensor requires_grad returned",
                p.dtype(),
                p.shape()
            )));
        }
        if !p.dtype().is_float() {
            return Err(bad(format!(
                "parameter {i} is {}; only float tensors have gradients",
                p.dtype()
            )));
        }
    }
    let Some(first) = outputs.first() else {
        return params.iter().map(|p| zeros_like(p)).collect();
    };
    let rt = first.rt.clone();
    without_grad(|| {
        let cot = backward(&rt, outputs, cotangents)?;
        params
            .iter()
            .map(|p| match cot.get(&p.node.id) {
                Some(g) => Ok(g.clone()),
                None => zeros_like(p),
            })
            .collect()
    })
}

/// Zeros of `t`'s shape, dtype and padding.
pub(crate) fn zeros_like(t: &Tensor) -> Result<Tensor, RuntimeError> {
    let z = t.rt.scalar(0.0, t.dtype());
    let loc = std::panic::Location::caller();
    z.broadcast_scalar(&t.node.shape, &t.node.dims, loc)
}

/// A unit of the reverse walk: one node, or every output of one kernel
/// call (their cotangents go to the kernel's backward together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Unit {
    Node(u64),
    Call(usize),
}

fn unit_of(n: &Node) -> Unit {
    match &n.tape {
        Tape::Op {
            op: Op::Kernel { call, .. },
            ..
        } => Unit::Call(Arc::as_ptr(call) as usize),
        _ => Unit::Node(n.id),
    }
}

/// The tape inputs of a node (empty for leaves).
fn tape_inputs(n: &Node) -> &[Arc<Node>] {
    match &n.tape {
        Tape::Op { inputs, .. } => inputs,
        _ => &[],
    }
}

/// Cotangents of every tracked node the outputs depend on, by node id.
fn backward(
    rt: &Runtime,
    outputs: &[&Tensor],
    cotangents: &[&Tensor],
) -> Result<HashMap<u64, Tensor>, RuntimeError> {
    // Discover the units and count, per unit, the uses of its nodes by
    // other units: a unit is processed once all its users have been.
    let mut first_node: HashMap<Unit, Arc<Node>> = HashMap::new();
    let mut pending: HashMap<Unit, usize> = HashMap::new();
    let mut stack: Vec<Arc<Node>> = outputs.iter().map(|t| t.node.clone()).collect();
    while let Some(n) = stack.pop() {
        let u = unit_of(&n);
        if first_node.contains_key(&u) {
            continue;
        }
        for i in tape_inputs(&n) {
            if i.tape.tracked() {
                *pending.entry(unit_of(i)).or_default() += 1;
                stack.push(i.clone());
            }
        }
        first_node.insert(u, n);
    }
    let mut cot: HashMap<u64, Tensor> = HashMap::new();
    for (o, c) in outputs.iter().zip(cotangents) {
        accumulate(&mut cot, &o.node, (*c).clone())?;
    }
    let mut ready: VecDeque<Unit> = first_node
        .keys()
        .filter(|u| pending.get(u).copied().unwrap_or(0) == 0)
        .copied()
        .collect();
    // Deterministic order among ready units: the module text (the cache
    // key) must not depend on hash order.
    let mut sorted: Vec<Unit> = ready.drain(..).collect();
    sorted.sort_by_key(|u| first_node[u].id);
    ready.extend(sorted);
    while let Some(u) = ready.pop_front() {
        let n = first_node[&u].clone();
        let input_cots = rules::unit_vjp(rt, &n, &cot)?;
        let inputs = tape_inputs(&n);
        let mut newly = Vec::new();
        for (i, g) in inputs.iter().zip(input_cots) {
            if !i.tape.tracked() {
                continue;
            }
            if let Some(g) = g
                && i.dtype.is_float()
            {
                accumulate(&mut cot, i, g)?;
            }
            let iu = unit_of(i);
            let left = pending.get_mut(&iu).ok_or_else(|| {
                RuntimeError::Internal("reverse walk: a use was not counted".into())
            })?;
            *left -= 1;
            if *left == 0 {
                newly.push(iu);
            }
        }
        newly.sort_by_key(|u| first_node[u].id);
        newly.dedup();
        ready.extend(newly);
    }
    Ok(cot)
}

/// Adds `g` to the cotangent of `n`.
fn accumulate(cot: &mut HashMap<u64, Tensor>, n: &Node, g: Tensor) -> Result<(), RuntimeError> {
    if g.node.shape != n.shape || g.node.dtype != n.dtype {
        return Err(RuntimeError::Internal(format!(
            "a gradient rule made {}{:?} for a {}{:?} value (recorded at {})",
            g.node.dtype, g.node.shape, n.dtype, n.shape, n.loc
        )));
    }
    let sum = match cot.remove(&n.id) {
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    cot.insert(n.id, sum);
    Ok(())
}

impl Tensor {
    /// This tensor as a parameter: gradients are taken with respect to the
    /// tensor returned (the same values; `self` stays untracked). Already
    /// a parameter: itself. A tensor computed from parameters cannot be
    /// made one; [`Tensor::detach`] it first.
    #[track_caller]
    pub fn requires_grad(&self) -> Result<Tensor, RuntimeError> {
        let loc = std::panic::Location::caller();
        match &self.node.tape {
            Tape::Leaf => Ok(self.clone()),
            Tape::Op { .. } => Err(RuntimeError::Record {
                message: "this tensor is computed from parameters; only a leaf can be a parameter: use .detach().requires_grad()".into(),
                loc: loc.to_string(),
            }),
            Tape::Off => self.alias(Tape::Leaf, loc),
        }
    }

    /// The same values, cut from the tape: gradients do not flow through
    /// the result.
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor, RuntimeError> {
        let loc = std::panic::Location::caller();
        if !self.node.tape.tracked() {
            return Ok(self.clone());
        }
        self.alias(Tape::Off, loc)
    }

    /// Whether gradients flow through this tensor (a parameter or computed
    /// from one).
    pub fn is_tracked(&self) -> bool {
        self.node.tape.tracked()
    }

    /// A new node with this one's value and `tape`: a ready node shares
    /// the buffers; a deferred one is an identity reshape of it.
    fn alias(&self, tape: Tape, loc: &std::panic::Location<'_>) -> Result<Tensor, RuntimeError> {
        let n = &self.node;
        let state = match n.ready() {
            Some(Ok(bufs)) => State::Ready(bufs),
            Some(Err(e)) => return Err(e),
            None => State::Deferred {
                op: Op::Reshape,
                inputs: vec![n.clone()],
            },
        };
        let node = Arc::new(Node {
            id: self.rt.inner.next_id(),
            shape: n.shape.clone(),
            dtype: n.dtype,
            dims: n.dims.clone(),
            loc: loc.to_string(),
            state: std::sync::Mutex::new(state),
            tape,
        });
        Ok(Tensor::from_node(self.rt.clone(), node))
    }
}
