//! A pending subgraph as one StableHLO module.
//!
//! Nodes are numbered in a deterministic topological order (inputs before
//! users, first use first), so the same program always prints the same
//! module: the module text *is* the canonical form, and the compile-cache
//! key is its hash (with the plugin, options and Tessera versions).
//! Materialized nodes become parameters; so do scalar constants other than
//! 0 and ±1, so that a constant that varies per call does not split the
//! cache. Kernel calls become `func.call`s of a private function holding
//! the kernel lowered for the platform.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

use kernel_ir::{DType, ReduceOp, UnaryOp, VerifiedKernel};

use lowering::op_names;

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

/// How kernels are embedded: a function `(kernel, name) -> func.func text`.
pub(crate) type KernelText<'a> = dyn Fn(&VerifiedKernel, &str) -> Result<String, RuntimeError> + 'a;

pub(crate) fn type_name(shape: &[usize], d: DType) -> String {
    let elem = match d {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I32 => "i32",
        DType::I8 => "i8",
        DType::Bool => "i1",
        DType::F8E4M3FN => "f8E4M3FN",
        DType::F8E5M2 => "f8E5M2",
    };
    let mut s = String::from("tensor<");
    for d in shape {
        let _ = write!(s, "{d}x");
    }
    s + elem + ">"
}

fn array(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    if items.is_empty() {
        "array<i64>".into()
    } else {
        format!("array<i64: {}>", items.join(", "))
    }
}

fn list(v: &[usize]) -> String {
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// Constants that are part of the program rather than parameters.
pub(crate) fn is_structural(v: f64) -> bool {
    v == 0.0 || v == 1.0 || v == -1.0
}

struct Emitter<'a> {
    body: String,
    next: usize,
    /// SSA name of each lowered node, by node id.
    names: HashMap<u64, String>,
    params: Vec<Param>,
    param_types: Vec<String>,
    kernel_funcs: Vec<String>,
    kernel_calls: HashMap<usize, String>,
    kernels: Vec<VerifiedKernel>,
    kernel_text: &'a KernelText<'a>,
    devices: usize,
    transposes: (u64, u64),
    /// Every constant in the program text (an exported module has no
    /// per-call scalar parameters).
    inline_constants: bool,
}

impl Emitter<'_> {
    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%v{}", self.next)
    }

    fn line(&mut self, s: String) {
        self.body.push_str("    ");
        self.body.push_str(&s);
        self.body.push('\n');
    }

    fn param(&mut self, p: Param, ty: String) -> String {
        let name = format!("%arg{}", self.params.len());
        self.params.push(p);
        self.param_types.push(ty);
        name
    }

    fn constant(&mut self, v: f64, shape: &[usize], d: DType) -> String {
        let t = type_name(shape, d);
        let n = self.fresh();
        let lit = lowering::literal_text(v, d);
        self.line(format!(
            "{n} = \"stablehlo.constant\"() {{value = dense<{lit}> : {t}}} : () -> {t}"
        ));
        n
    }

    fn op1(&mut self, name: &str, x: &str, xt: &str, rt: &str, attrs: &str) -> String {
        let n = self.fresh();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        self.line(format!("{n} = \"{name}\"({x}){attrs} : ({xt}) -> {rt}"));
        n
    }

    /// A binary op: operands with their types, result type, attributes.
    fn op2(
        &mut self,
        name: &str,
        a: (&str, &str),
        b: (&str, &str),
        rt: &str,
        attrs: &str,
    ) -> String {
        let n = self.fresh();
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!(" {{{attrs}}}")
        };
        self.line(format!(
            "{n} = \"{name}\"({}, {}){attrs} : ({}, {}) -> {rt}",
            a.0, b.0, a.1, b.1
        ));
        n
    }

    /// `stablehlo.reduce` of `x` over `axes` with `op`.
    fn reduce(
        &mut self,
        x: &str,
        shape: &[usize],
        d: DType,
        axes: &[usize],
        op: ReduceOp,
    ) -> String {
        let combine = op_names::reduction(op);
        let init = self.constant(op.identity(d), &[], d);
        let st = type_name(&[], d);
        let out: Vec<usize> = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &s)| s)
            .collect();
        let n = self.fresh();
        let xt = type_name(shape, d);
        let rt = type_name(&out, d);
        self.line(format!(
            "{n} = \"stablehlo.reduce\"({x}, {init}) ({{\n    ^bb0(%a: {st}, %b: {st}):\n      %r = \"{combine}\"(%a, %b) : ({st}, {st}) -> {st}\n      \"stablehlo.return\"(%r) : ({st}) -> ()\n    }}) {{dimensions = {}}} : ({xt}, {st}) -> {rt}",
            array(axes)
        ));
        n
    }

    /// `x` with positions at or past the valid length `len` (an `i32[1]`)
    /// along `axis` replaced by `fill`.
    fn mask(
        &mut self,
        x: &str,
        shape: &[usize],
        d: DType,
        axis: usize,
        len: &str,
        fill: f64,
    ) -> String {
        let it = type_name(shape, DType::I32);
        let bt = type_name(shape, DType::Bool);
        let xt = type_name(shape, d);
        let iota = self.fresh();
        self.line(format!(
            "{iota} = \"stablehlo.iota\"() {{iota_dimension = {axis} : i64}} : () -> {it}"
        ));
        let scalar = self.op1(
            "stablehlo.reshape",
            len,
            &type_name(&[1], DType::I32),
            &type_name(&[], DType::I32),
            "",
        );
        let lb = self.op1(
            "stablehlo.broadcast_in_dim",
            &scalar,
            &type_name(&[], DType::I32),
            &it,
            "broadcast_dimensions = array<i64>",
        );
        let keep = self.op2(
            "stablehlo.compare",
            (&iota, &it),
            (&lb, &it),
            &bt,
            "comparison_direction = #stablehlo<comparison_direction LT>",
        );
        let f = self.constant(fill, &[], d);
        let fb = self.op1(
            "stablehlo.broadcast_in_dim",
            &f,
            &type_name(&[], d),
            &xt,
            "broadcast_dimensions = array<i64>",
        );
        let n = self.fresh();
        self.line(format!(
            "{n} = \"stablehlo.select\"({keep}, {x}, {fb}) : ({bt}, {xt}, {xt}) -> {xt}"
        ));
        n
    }

    /// The SSA name of a valid-length node, a parameter on first use.
    fn len_name(&mut self, n: &Arc<Node>) -> String {
        if let Some(v) = self.names.get(&n.id) {
            return v.clone();
        }
        let v = self.param(Param::Node(n.clone()), type_name(&[1], DType::I32));
        self.names.insert(n.id, v.clone());
        v
    }

    fn name_of(&self, n: &Node) -> Result<String, RuntimeError> {
        self.names.get(&n.id).cloned().ok_or_else(|| {
            RuntimeError::Internal(format!("node {} used before it is lowered", n.id))
        })
    }

    /// Lowers one deferred node whose inputs are lowered.
    fn node(
        &mut self,
        n: &Arc<Node>,
        op: &Op,
        inputs: &[Arc<Node>],
    ) -> Result<String, RuntimeError> {
        let rt = type_name(&n.shape, n.dtype);
        let ins: Vec<String> = inputs
            .iter()
            .map(|i| self.name_of(i))
            .collect::<Result<_, _>>()?;
        let it: Vec<String> = inputs
            .iter()
            .map(|i| type_name(&i.shape, i.dtype))
            .collect();
        Ok(match op {
            Op::Constant(v) => {
                if is_structural(*v) || self.inline_constants {
                    self.constant(*v, &n.shape, n.dtype)
                } else {
                    self.param(Param::Scalar(*v, n.dtype), rt)
                }
            }
            Op::Literal(a) => {
                let v = self.fresh();
                self.line(format!(
                    "{v} = \"stablehlo.constant\"() {{value = {} : {rt}}} : () -> {rt}",
                    lowering::dense_literal(a)
                ));
                v
            }
            Op::Iota(d) => {
                let v = self.fresh();
                self.line(format!(
                    "{v} = \"stablehlo.iota\"() {{iota_dimension = {d} : i64}} : () -> {rt}"
                ));
                v
            }
            Op::Unary(u) => self.unary(*u, &ins[0], &rt, n.dtype)?,
            Op::Binary(b) => self.op2(
                op_names::binary(*b),
                (&ins[0], &it[0]),
                (&ins[1], &it[1]),
                &rt,
                "",
            ),
            Op::Compare(c) => {
                let dir = op_names::comparison_direction(*c);
                self.op2(
                    "stablehlo.compare",
                    (&ins[0], &it[0]),
                    (&ins[1], &it[1]),
                    &rt,
                    &format!("comparison_direction = #stablehlo<comparison_direction {dir}>"),
                )
            }
            Op::Select => {
                let v = self.fresh();
                self.line(format!(
                    "{v} = \"stablehlo.select\"({}, {}, {}) : ({}, {}, {}) -> {rt}",
                    ins[0], ins[1], ins[2], it[0], it[1], it[2]
                ));
                v
            }
            Op::Convert => self.op1("stablehlo.convert", &ins[0], &it[0], &rt, ""),
            Op::Dot(d) => {
                let mut fields = Vec::new();
                for (k, v) in [
                    ("lhs_batching_dimensions", &d.lhs_batch),
                    ("rhs_batching_dimensions", &d.rhs_batch),
                    ("lhs_contracting_dimensions", &d.lhs_contract),
                    ("rhs_contracting_dimensions", &d.rhs_contract),
                ] {
                    if !v.is_empty() {
                        fields.push(format!("{k} = {}", list(v)));
                    }
                }
                // A padded contracting dim contributes zeros past its
                // valid length.
                let mut lhs = ins[0].clone();
                for (&la, _) in d.lhs_contract.iter().zip(&d.rhs_contract) {
                    if let Some(dl) = &inputs[0].dims[la] {
                        let len = self.len_name(&dl.node);
                        lhs = self.mask(&lhs, &inputs[0].shape, inputs[0].dtype, la, &len, 0.0);
                    }
                }
                self.op2(
                    "stablehlo.dot_general",
                    (&lhs, &it[0]),
                    (&ins[1], &it[1]),
                    &rt,
                    &format!(
                        "dot_dimension_numbers = #stablehlo.dot<{}>",
                        fields.join(", ")
                    ),
                )
            }
            Op::Reduce {
                op: r,
                axes,
                mean,
                masked,
            } => {
                let x = &inputs[0];
                let init = r.identity(x.dtype);
                let mut v = ins[0].clone();
                for &(axis, li) in masked {
                    v = self.mask(&v, &x.shape, x.dtype, axis, &ins[li], init);
                }
                let s = self.reduce(&v, &x.shape, x.dtype, axes, *r);
                if *mean {
                    self.mean(&s, n, x, axes, masked, &ins)?
                } else {
                    s
                }
            }
            Op::Reshape => self.op1("stablehlo.reshape", &ins[0], &it[0], &rt, ""),
            Op::Transpose(p) => self.op1(
                "stablehlo.transpose",
                &ins[0],
                &it[0],
                &rt,
                &format!("permutation = {}", array(p)),
            ),
            Op::Broadcast(dims) => self.op1(
                "stablehlo.broadcast_in_dim",
                &ins[0],
                &it[0],
                &rt,
                &format!("broadcast_dimensions = {}", array(dims)),
            ),
            Op::Slice { start, limit } => {
                let strides = vec![1; start.len()];
                self.op1(
                    "stablehlo.slice",
                    &ins[0],
                    &it[0],
                    &rt,
                    &format!(
                        "start_indices = {}, limit_indices = {}, strides = {}",
                        array(start),
                        array(limit),
                        array(&strides)
                    ),
                )
            }
            Op::Concat(axis) => {
                let v = self.fresh();
                self.line(format!(
                    "{v} = \"stablehlo.concatenate\"({}) {{dimension = {axis} : i64}} : ({}) -> {rt}",
                    ins.join(", "),
                    it.join(", ")
                ));
                v
            }
            Op::Softmax { axis, masked } => {
                let x = &inputs[0];
                let mut v = ins[0].clone();
                if let Some(li) = masked {
                    v = self.mask(&v, &x.shape, x.dtype, *axis, &ins[*li], f64::NEG_INFINITY);
                }
                let mx = self.reduce(&v, &x.shape, x.dtype, &[*axis], ReduceOp::Max);
                let keep: Vec<usize> = (0..x.shape.len()).filter(|d| d != axis).collect();
                let red: Vec<usize> = keep.iter().map(|&d| x.shape[d]).collect();
                let redt = type_name(&red, x.dtype);
                let mxb = self.op1(
                    "stablehlo.broadcast_in_dim",
                    &mx,
                    &redt,
                    &rt,
                    &format!("broadcast_dimensions = {}", array(&keep)),
                );
                let c = self.op2("stablehlo.subtract", (&v, &rt), (&mxb, &rt), &rt, "");
                let e = self.op1("stablehlo.exponential", &c, &rt, &rt, "");
                let l = self.reduce(&e, &x.shape, x.dtype, &[*axis], ReduceOp::Sum);
                let lb = self.op1(
                    "stablehlo.broadcast_in_dim",
                    &l,
                    &redt,
                    &rt,
                    &format!("broadcast_dimensions = {}", array(&keep)),
                );
                self.op2("stablehlo.divide", (&e, &rt), (&lb, &rt), &rt, "")
            }
            Op::Kernel { call, output } => {
                let key = Arc::as_ptr(call) as usize;
                let base = match self.kernel_calls.get(&key) {
                    Some(b) => b.clone(),
                    None => self.kernel_call(call, &ins, &it)?,
                };
                if call.kernel.outputs().count() == 1 {
                    base
                } else {
                    format!("{base}#{output}")
                }
            }
            Op::AllReduce => {
                self.summing_collective("stablehlo.all_reduce", &ins[0], &it[0], &rt, n.dtype, "")
            }
            Op::ReduceScatter(axis) => self.summing_collective(
                "stablehlo.reduce_scatter",
                &ins[0],
                &it[0],
                &rt,
                n.dtype,
                &format!(", scatter_dimension = {axis} : i64"),
            ),
            Op::AllGather(axis) => {
                let groups: Vec<String> = (0..self.devices).map(|d| d.to_string()).collect();
                self.op1(
                    "stablehlo.all_gather",
                    &ins[0],
                    &it[0],
                    &rt,
                    &format!(
                        "all_gather_dim = {axis} : i64, replica_groups = dense<[[{}]]> : tensor<1x{}xi64>",
                        groups.join(", "),
                        self.devices
                    ),
                )
            }
        })
    }

    /// A collective that sums over every device (`stablehlo.all_reduce`,
    /// `stablehlo.reduce_scatter`), with `extra` attributes.
    fn summing_collective(
        &mut self,
        name: &str,
        x: &str,
        xt: &str,
        rt: &str,
        d: DType,
        extra: &str,
    ) -> String {
        let st = type_name(&[], d);
        let v = self.fresh();
        let groups: Vec<String> = (0..self.devices).map(|d| d.to_string()).collect();
        self.line(format!(
            "{v} = \"{name}\"({x}) ({{\n    ^bb0(%a: {st}, %b: {st}):\n      %r = \"stablehlo.add\"(%a, %b) : ({st}, {st}) -> {st}\n      \"stablehlo.return\"(%r) : ({st}) -> ()\n    }}) {{replica_groups = dense<[[{}]]> : tensor<1x{}xi64>{extra}}} : ({xt}) -> {rt}",
            groups.join(", "),
            self.devices,
        ));
        v
    }

    /// A mean: the sum divided by the number of valid elements reduced.
    fn mean(
        &mut self,
        sum: &str,
        n: &Node,
        x: &Node,
        axes: &[usize],
        masked: &[(usize, usize)],
        ins: &[String],
    ) -> Result<String, RuntimeError> {
        let rt = type_name(&n.shape, n.dtype);
        let static_count: usize = axes
            .iter()
            .filter(|a| !masked.iter().any(|(m, _)| m == *a))
            .map(|&a| x.shape[a])
            .product();
        let mut count = self.constant(static_count as f64, &[], n.dtype);
        let st = type_name(&[], n.dtype);
        for &(_, li) in masked {
            let s = self.op1(
                "stablehlo.reshape",
                &ins[li],
                &type_name(&[1], DType::I32),
                &type_name(&[], DType::I32),
                "",
            );
            let f = self.op1(
                "stablehlo.convert",
                &s,
                &type_name(&[], DType::I32),
                &st,
                "",
            );
            count = self.op2("stablehlo.multiply", (&count, &st), (&f, &st), &st, "");
        }
        let cb = self.op1(
            "stablehlo.broadcast_in_dim",
            &count,
            &st,
            &rt,
            "broadcast_dimensions = array<i64>",
        );
        Ok(self.op2("stablehlo.divide", (sum, &rt), (&cb, &rt), &rt, ""))
    }

    fn unary(&mut self, u: UnaryOp, x: &str, t: &str, d: DType) -> Result<String, RuntimeError> {
        if let Some(name) = op_names::unary(u) {
            return Ok(self.op1(name, x, t, t, ""));
        }
        // exp2 only: StableHLO has no base-2 exponential.
        let ln2 = self.constant(std::f64::consts::LN_2, &[], d);
        let b = self.op1(
            "stablehlo.broadcast_in_dim",
            &ln2,
            &type_name(&[], d),
            t,
            "broadcast_dimensions = array<i64>",
        );
        let y = self.op2("stablehlo.multiply", (x, t), (&b, t), t, "");
        Ok(self.op1("stablehlo.exponential", &y, t, t, ""))
    }

    fn kernel_call(
        &mut self,
        call: &Arc<KernelCall>,
        ins: &[String],
        it: &[String],
    ) -> Result<String, RuntimeError> {
        let k = &call.kernel;
        let fname = format!("kernel_{}", self.kernel_funcs.len());
        let text = (self.kernel_text)(k, &fname)?;
        self.kernel_funcs.push(text);
        self.kernels.push(k.clone());
        for o in &k.operands {
            if !o.layout.is_row_major(o.shape.len()) {
                self.transposes.0 += 1;
                self.transposes.1 += (o.shape.iter().product::<usize>() * o.dtype.bytes()) as u64;
            }
        }
        let outs: Vec<String> = k.outputs().map(|o| type_name(&o.shape, o.dtype)).collect();
        let v = format!("%k{}", self.kernel_calls.len());
        let lhs = if outs.len() == 1 {
            v.clone()
        } else {
            format!("{v}:{}", outs.len())
        };
        self.line(format!(
            "{lhs} = \"func.call\"({}) {{callee = @{fname}}} : ({}) -> ({})",
            ins.join(", "),
            it.join(", "),
            outs.join(", ")
        ));
        self.kernel_calls
            .insert(Arc::as_ptr(call) as usize, v.clone());
        Ok(v)
    }
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
    kernel_text: &KernelText<'_>,
) -> Result<Program, RuntimeError> {
    lower_with(outputs, &[], false, devices, kernel_text)
}

/// [`lower`] with `inputs` as the first parameters, in order, and with
/// `inline_constants`, no scalar parameters: a module to run elsewhere.
pub(crate) fn lower_with(
    outputs: &[Arc<Node>],
    inputs: &[Arc<Node>],
    inline_constants: bool,
    devices: usize,
    kernel_text: &KernelText<'_>,
) -> Result<Program, RuntimeError> {
    let order = topo_order(outputs)?;
    let mut e = Emitter {
        inline_constants,
        body: String::new(),
        next: 0,
        names: HashMap::new(),
        params: Vec::new(),
        param_types: Vec::new(),
        kernel_funcs: Vec::new(),
        kernel_calls: HashMap::new(),
        kernels: Vec::new(),
        kernel_text,
        devices,
        transposes: (0, 0),
    };
    for i in inputs {
        if !e.names.contains_key(&i.id) {
            let name = e.param(Param::Node(i.clone()), type_name(&i.shape, i.dtype));
            e.names.insert(i.id, name);
        }
    }
    for (_, _, inputs) in &order {
        for i in inputs {
            if !e.names.contains_key(&i.id) && matches!(&*i.lock(), State::Ready(_)) {
                let name = e.param(Param::Node(i.clone()), type_name(&i.shape, i.dtype));
                e.names.insert(i.id, name);
            }
        }
    }
    for (n, op, inputs) in &order {
        let v = e.node(n, op, inputs)?;
        e.names.insert(n.id, v);
    }
    let mut rets = Vec::new();
    let mut rtypes = Vec::new();
    for o in outputs {
        if !e.names.contains_key(&o.id) {
            // A materialized node asked for again: return it as is.
            let name = e.param(Param::Node(o.clone()), type_name(&o.shape, o.dtype));
            e.names.insert(o.id, name);
        }
        rets.push(e.name_of(o)?);
        rtypes.push(type_name(&o.shape, o.dtype));
    }
    let args: Vec<String> = e
        .param_types
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%arg{i}: {t}"))
        .collect();
    let mut text = format!(
        "module @tessera_graph attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = {devices} : i32}} {{\n  func.func public @main({}) -> ({}) {{\n",
        args.join(", "),
        rtypes.join(", ")
    );
    text += &e.body;
    let _ = writeln!(
        text,
        "    \"func.return\"({}) : ({}) -> ()\n  }}",
        rets.join(", "),
        rtypes.join(", ")
    );
    for f in &e.kernel_funcs {
        for line in f.lines() {
            text += "  ";
            text += line;
            text.push('\n');
        }
    }
    text += "}\n";
    Ok(Program {
        text,
        params: e.params,
        outputs: outputs.to_vec(),
        kernels: e.kernels,
        transposes: e.transposes,
    })
}
