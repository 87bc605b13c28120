//! A pending subgraph as one StableHLO module.
//!
//! Nodes are numbered in a deterministic topological order (inputs before
//! users, first use first), so the same program always prints the same
//! module: the module text *is* the canonical form, and the compile-cache
//! key is its hash (with the plugin, options and Tessera versions).
//! Materialized nodes become parameters; so do scalar constants other than
//! 0 and ±1, so that a constant that varies per call does not split the
//! cache. Kernel calls become `func.call`s of a private function holding
//! the kernel in the form the caller names.
//!
//! The graph's meaning (masks, means, softmax) is composed here; the
//! StableHLO is spelled by `lowering::program`, the crate's one home for
//! it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kernel_ir::{DType, ReduceOp, VerifiedKernel};
use lowering::program::{CallForm, ProgramBuilder, Value};

use super::RuntimeError;
use super::node::{KernelCall, Node, Op, State};

/// What the module's parameters are bound to at execution.
#[derive(Debug)]
pub(crate) enum Param {
    /// A materialized node's buffers.
    Node(Arc<Node>),
    /// A scalar constant, uploaded per call.
    Scalar(f64, DType),
}

/// A lowered subgraph.
#[derive(Debug)]
pub(crate) struct Program {
    /// The module (`func.func @main` plus kernel functions).
    pub text: String,
    pub params: Vec<Param>,
    /// The nodes `@main` returns, in order.
    pub outputs: Vec<Arc<Node>>,
    /// Kernels called (their host code must be registered before a run).
    pub kernels: Vec<VerifiedKernel>,
    /// Layout changes the kernels' layout hints cost: count and bytes.
    pub transposes: (u64, u64),
}

/// How each kernel call is built: its form, by kernel.
pub(crate) type KernelForms<'a> = dyn Fn(&VerifiedKernel) -> Result<CallForm, RuntimeError> + 'a;

/// Constants that are part of the program rather than parameters.
pub(crate) fn is_structural(v: f64) -> bool {
    v == 0.0 || v == 1.0 || v == -1.0
}

/// The walk's state beside the builder.
struct Walk<'f> {
    /// Each lowered node's value, by node id.
    names: HashMap<u64, Value>,
    params: Vec<Param>,
    /// Each kernel call's outputs, by call.
    kernel_calls: HashMap<usize, Vec<Value>>,
    kernels: Vec<VerifiedKernel>,
    forms: &'f KernelForms<'f>,
    transposes: (u64, u64),
    /// Every constant in the program text (an exported module has no
    /// per-call scalar parameters).
    inline_constants: bool,
}

type Built<T> = Result<T, RuntimeError>;

impl Walk<'_> {
    fn param(
        &mut self,
        b: &mut ProgramBuilder<'_, '_>,
        p: Param,
        shape: &[usize],
        d: DType,
    ) -> Built<Value> {
        self.params.push(p);
        Ok(b.param(shape, d)?)
    }

    /// The value of a valid-length node, a parameter on first use.
    fn len_value(&mut self, b: &mut ProgramBuilder<'_, '_>, n: &Arc<Node>) -> Built<Value> {
        if let Some(v) = self.names.get(&n.id) {
            return Ok(*v);
        }
        let v = self.param(b, Param::Node(n.clone()), &[1], DType::I32)?;
        self.names.insert(n.id, v);
        Ok(v)
    }

    fn value_of(&self, n: &Node) -> Built<Value> {
        self.names.get(&n.id).copied().ok_or_else(|| {
            RuntimeError::Internal(format!("node {} used before it is lowered", n.id))
        })
    }

    /// Lowers one deferred node whose inputs are lowered.
    fn node(
        &mut self,
        b: &mut ProgramBuilder<'_, '_>,
        n: &Arc<Node>,
        op: &Op,
        inputs: &[Arc<Node>],
    ) -> Built<Value> {
        let ins: Vec<Value> = inputs
            .iter()
            .map(|i| self.value_of(i))
            .collect::<Result<_, _>>()?;
        Ok(match op {
            Op::Constant(v) => {
                if is_structural(*v) || self.inline_constants {
                    b.constant(*v, &n.shape, n.dtype)?
                } else {
                    self.param(b, Param::Scalar(*v, n.dtype), &n.shape, n.dtype)?
                }
            }
            Op::Literal(a) => b.literal(a)?,
            Op::Iota(d) => b.iota(*d, &n.shape, n.dtype)?,
            Op::Unary(u) => b.unary(*u, ins[0])?,
            Op::Binary(o) => b.binary(*o, ins[0], ins[1])?,
            Op::Compare(c) => b.compare(*c, ins[0], ins[1])?,
            Op::Select => b.select(ins[0], ins[1], ins[2])?,
            Op::Convert => b.convert(ins[0], n.dtype)?,
            Op::Dot(d) => {
                // A padded contracting dim contributes zeros past its
                // valid length.
                let mut lhs = ins[0];
                for &la in &d.lhs_contract {
                    if let Some(dl) = &inputs[0].dims[la] {
                        let len = self.len_value(b, &dl.node)?;
                        lhs = b.mask(lhs, la, len, 0.0)?;
                    }
                }
                b.dot(lhs, ins[1], d, &n.shape, n.dtype)?
            }
            Op::Reduce {
                op: r,
                axes,
                mean,
                masked,
            } => {
                let x = &inputs[0];
                let mut v = ins[0];
                for &(axis, li) in masked {
                    v = b.mask(v, axis, ins[li], r.identity(x.dtype))?;
                }
                let s = b.reduce(v, *r, axes)?;
                if *mean {
                    mean_of(b, s, &n.shape, x, axes, masked, &ins)?
                } else {
                    s
                }
            }
            Op::Reshape => b.reshape(ins[0], &n.shape)?,
            Op::Transpose(p) => b.transpose(ins[0], p)?,
            Op::Broadcast(dims) => b.broadcast(ins[0], &n.shape, dims)?,
            Op::Slice { start, limit } => b.slice(ins[0], start, limit)?,
            Op::Concat(axis) => b.concat(&ins, *axis)?,
            Op::Softmax { axis, masked } => {
                let x = &inputs[0];
                let mut v = ins[0];
                if let Some(li) = masked {
                    v = b.mask(v, *axis, ins[*li], f64::NEG_INFINITY)?;
                }
                let keep: Vec<usize> = (0..x.shape.len()).filter(|d| d != axis).collect();
                let mx = b.reduce(v, ReduceOp::Max, &[*axis])?;
                let mx = b.broadcast(mx, &x.shape, &keep)?;
                let c = b.binary(kernel_ir::BinaryOp::Sub, v, mx)?;
                let e = b.unary(kernel_ir::UnaryOp::Exp, c)?;
                let l = b.reduce(e, ReduceOp::Sum, &[*axis])?;
                let l = b.broadcast(l, &x.shape, &keep)?;
                b.binary(kernel_ir::BinaryOp::Div, e, l)?
            }
            Op::Kernel { call, output } => {
                let key = Arc::as_ptr(call) as usize;
                let outs = match self.kernel_calls.get(&key) {
                    Some(o) => o.clone(),
                    None => self.kernel_call(b, call, &ins)?,
                };
                *outs.get(*output).ok_or_else(|| {
                    RuntimeError::Internal(format!("kernel output {output} of {}", outs.len()))
                })?
            }
            Op::AllReduce => b.all_reduce(ins[0])?,
            Op::ReduceScatter(axis) => b.reduce_scatter(ins[0], *axis)?,
            Op::AllGather(axis) => b.all_gather(ins[0], *axis)?,
        })
    }

    fn kernel_call(
        &mut self,
        b: &mut ProgramBuilder<'_, '_>,
        call: &Arc<KernelCall>,
        ins: &[Value],
    ) -> Built<Vec<Value>> {
        let k = &call.kernel;
        let form = (self.forms)(k)?;
        let outs = b
            .call_kernel(k, &form, ins)
            .map_err(|e| RuntimeError::failed(format!("kernel `{}`", k.name), e))?;
        self.kernels.push(k.clone());
        for o in &k.operands {
            if !o.layout.is_row_major(o.shape.len()) {
                self.transposes.0 += 1;
                self.transposes.1 += (o.shape.iter().product::<usize>() * o.dtype.bytes()) as u64;
            }
        }
        self.kernel_calls
            .insert(Arc::as_ptr(call) as usize, outs.clone());
        Ok(outs)
    }
}

/// A mean: the sum divided by the number of valid elements reduced.
fn mean_of(
    b: &mut ProgramBuilder<'_, '_>,
    sum: Value,
    shape: &[usize],
    x: &Node,
    axes: &[usize],
    masked: &[(usize, usize)],
    ins: &[Value],
) -> Built<Value> {
    let d = x.dtype;
    let static_count: usize = axes
        .iter()
        .filter(|a| !masked.iter().any(|(m, _)| m == *a))
        .map(|&a| x.shape[a])
        .product();
    let mut count = b.constant(static_count as f64, &[], d)?;
    for &(_, li) in masked {
        let len = b.reshape(ins[li], &[])?;
        let len = b.convert(len, d)?;
        count = b.binary(kernel_ir::BinaryOp::Mul, count, len)?;
    }
    let count = b.broadcast(count, shape, &[])?;
    Ok(b.binary(kernel_ir::BinaryOp::Div, sum, count)?)
}

/// A deferred node with its op and inputs.
pub(crate) type Pending = (Arc<Node>, Op, Vec<Arc<Node>>);

/// Deferred nodes needed for `outputs`, inputs first (depth-first, inputs
/// in order), and the materialized leaves they read.
pub(crate) fn topo_order(outputs: &[Arc<Node>]) -> Result<Vec<Pending>, RuntimeError> {
    let mut order = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    // Iterative DFS so deep graphs cannot overflow the stack.
    for out in outputs {
        let mut stack: Vec<(Arc<Node>, bool)> = vec![(out.clone(), false)];
        while let Some((n, expanded)) = stack.pop() {
            if seen.contains(&n.id) && !expanded {
                continue;
            }
            let Some((op, inputs)) = n.deferred() else {
                if let Some(Err(e)) = n.ready() {
                    return Err(e);
                }
                seen.insert(n.id);
                continue;
            };
            if expanded {
                if seen.insert(n.id) {
                    order.push((n, op, inputs));
                }
                continue;
            }
            stack.push((n.clone(), true));
            for i in inputs.iter().rev() {
                if !seen.contains(&i.id) {
                    stack.push((i.clone(), false));
                }
            }
        }
    }
    Ok(order)
}

/// Lowers the subgraph that computes `outputs`.
pub(crate) fn lower(
    outputs: &[Arc<Node>],
    devices: usize,
    forms: &KernelForms<'_>,
) -> Result<Program, RuntimeError> {
    lower_with(outputs, &[], false, devices, forms)
}

/// [`lower`] with `inputs` as the first parameters, in order, and with
/// `inline_constants`, no scalar parameters: a module to run elsewhere.
pub(crate) fn lower_with(
    outputs: &[Arc<Node>],
    inputs: &[Arc<Node>],
    inline_constants: bool,
    devices: usize,
    forms: &KernelForms<'_>,
) -> Result<Program, RuntimeError> {
    let order = topo_order(outputs)?;
    let mut w = Walk {
        inline_constants,
        names: HashMap::new(),
        params: Vec::new(),
        kernel_calls: HashMap::new(),
        kernels: Vec::new(),
        forms,
        transposes: (0, 0),
    };
    let text = lowering::program::program("tessera_graph", devices, |b| {
        let leaf = |w: &mut Walk<'_>, b: &mut ProgramBuilder<'_, '_>, i: &Arc<Node>| -> Built<()> {
            if !w.names.contains_key(&i.id) {
                let v = w.param(b, Param::Node(i.clone()), &i.shape, i.dtype)?;
                w.names.insert(i.id, v);
            }
            Ok(())
        };
        for i in inputs {
            leaf(&mut w, b, i)?;
        }
        for (_, _, inputs) in &order {
            for i in inputs {
                if matches!(&*i.lock(), State::Ready(_)) {
                    leaf(&mut w, b, i)?;
                }
            }
        }
        for (n, op, inputs) in &order {
            let v = w.node(b, n, op, inputs)?;
            w.names.insert(n.id, v);
        }
        let mut rets = Vec::new();
        for o in outputs {
            // A materialized node asked for again: return it as is.
            leaf(&mut w, b, o)?;
            rets.push(w.value_of(o)?);
        }
        Ok::<_, RuntimeError>(rets)
    })?;
    Ok(Program {
        text,
        params: w.params,
        outputs: outputs.to_vec(),
        kernels: w.kernels,
        transposes: w.transposes,
    })
}
