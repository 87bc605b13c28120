//! Graph nodes: what a `Tensor` handle points at.

use std::cell::Cell;
use std::sync::{Arc, Mutex, Weak};

use kernel_ir::{BinaryOp, CompareOp, DType, DotDims, ReduceOp, UnaryOp, VerifiedKernel};

use super::RuntimeError;
use runtime::pjrt::Buffer;

/// The valid length of a padded (bucketed) dim.
#[derive(Debug)]
pub(crate) struct DynLen {
    /// The scalar-prefetch-shaped length: `i32[1]`, materialized.
    pub node: Arc<Node>,
    /// Its value.
    pub valid: usize,
}

/// A dim's valid length when the dim is padded to a bucket.
pub(crate) type Dyn = Option<Arc<DynLen>>;

/// A Tessera kernel call shared by the nodes of its outputs.
pub(crate) struct KernelCall {
    pub kernel: VerifiedKernel,
    /// Its declared backward, if any.
    pub vjp: Option<Arc<dyn super::autodiff::KernelVjp>>,
    /// Its output nodes (weak: they own the call).
    pub outputs: Mutex<Vec<Weak<Node>>>,
}

impl std::fmt::Debug for KernelCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCall")
            .field("kernel", &self.kernel.name)
            .field("vjp", &self.vjp.is_some())
            .finish()
    }
}

/// What a deferred node computes from its inputs.
#[derive(Clone, Debug)]
pub(crate) enum Op {
    /// A scalar constant of the node's dtype.
    Constant(f64),
    /// Indices along dim `n` of the node's shape.
    Iota(usize),
    /// An array that is part of the program (a table a backward builds on
    /// the host): a dense constant in the program text, exported with it.
    Literal(Arc<kernel_ir::Array>),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `select(cond, on_true, on_false)`.
    Select,
    Convert,
    Dot(DotDims),
    /// Reduces `axes`; `masked[i]` is the input index of the valid length
    /// of a padded reduced axis (its padding is replaced by the identity).
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        mean: bool,
        masked: Vec<(usize, usize)>,
    },
    Reshape,
    Transpose(Vec<usize>),
    /// Output dim `dims[i]` comes from input dim `i`.
    Broadcast(Vec<usize>),
    Slice {
        start: Vec<usize>,
        limit: Vec<usize>,
    },
    Concat(usize),
    /// Softmax along `axis`; `masked` as for `Reduce`.
    Softmax {
        axis: usize,
        masked: Option<usize>,
    },
    /// Output `output` of a kernel call (the inputs are the call's).
    Kernel {
        call: Arc<KernelCall>,
        output: usize,
    },
    /// Sum over all devices.
    AllReduce,
    /// Concatenation over all devices along `axis`.
    AllGather(usize),
    /// Sum over all devices, device `d` keeping the `d`-th part along
    /// `axis` (the transpose of `AllGather`).
    ReduceScatter(usize),
}

impl Op {
    /// A short name, for traces.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Constant(_) => "constant",
            Op::Iota(_) => "iota",
            Op::Literal(_) => "literal",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::Compare(_) => "compare",
            Op::Select => "select",
            Op::Convert => "convert",
            Op::Dot(_) => "dot_general",
            Op::Reduce { .. } => "reduce",
            Op::Reshape => "reshape",
            Op::Transpose(_) => "transpose",
            Op::Broadcast(_) => "broadcast",
            Op::Slice { .. } => "slice",
            Op::Concat(_) => "concat",
            Op::Softmax { .. } => "softmax",
            Op::Kernel { .. } => "kernel",
            Op::AllReduce => "all_reduce",
            Op::AllGather(_) => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
        }
    }

    /// Collectives synchronize devices: once recorded they always run.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Op::AllReduce | Op::AllGather(_) | Op::ReduceScatter(_)
        )
    }
}

/// A node's storage.
#[derive(Debug)]
pub(crate) enum State {
    /// Not computed yet.
    Deferred { op: Op, inputs: Vec<Arc<Node>> },
    /// Computed: one buffer per device.
    Ready(Arc<Vec<Buffer>>),
    /// Computing it failed; reported at every sync that reads it.
    Failed(RuntimeError),
}

/// What reverse mode needs of a node: whether gradients flow through it
/// and, for a tracked op, how it was computed. Unlike [`State`], this is
/// kept after the node is materialized, so a graph can be differentiated
/// after its forward ran; only tracked nodes keep it, so untracked
/// programs (inference, optimizer updates) still free their history.
#[derive(Debug)]
pub(crate) enum Tape {
    /// No parameter reaches it.
    Off,
    /// A parameter ([`crate::Tensor::requires_grad`]).
    Leaf,
    /// An op with at least one tracked input; a kernel output also holds
    /// the call's later outputs (`siblings`), so the values its backward
    /// reads stay alive as long as the first output does.
    Op {
        op: Op,
        inputs: Vec<Arc<Node>>,
        siblings: Vec<Arc<Node>>,
    },
}

thread_local! {
    /// Whether recording tracks gradients on this thread ([`no_grad`]).
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` with gradient tracking off on this thread (restored after,
/// also on a panic), returning its result.
pub(crate) fn without_grad<R>(f: impl FnOnce() -> R) -> R {
    with_tracking(false, f)
}

/// Runs `f` with gradient tracking on this thread set to `on` (restored
/// after, also on a panic), returning its result.
pub(crate) fn with_tracking<R>(on: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(on)));
    f()
}

impl Tape {
    /// The record of a new node computing `op` from `inputs`.
    pub fn of(op: &Op, inputs: &[Arc<Node>]) -> Tape {
        if GRAD_ENABLED.with(Cell::get) && inputs.iter().any(|n| n.tape.tracked()) {
            Tape::Op {
                op: op.clone(),
                inputs: inputs.to_vec(),
                siblings: Vec::new(),
            }
        } else {
            Tape::Off
        }
    }

    /// Whether gradients flow through the node.
    pub fn tracked(&self) -> bool {
        !matches!(self, Tape::Off)
    }
}

/// A value in the graph. Handles share it, so materializing it replaces its
/// state in place and every handle sees the result.
#[derive(Debug)]
pub(crate) struct Node {
    /// Creation order within the runtime.
    pub id: u64,
    /// Shape (padded dims at their bucket size).
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Per dim: the valid length when the dim is padded.
    pub dims: Vec<Dyn>,
    /// Where the user recorded it (named when computing it fails).
    pub loc: String,
    pub state: Mutex<State>,
    /// Its reverse-mode record.
    pub tape: Tape,
}

impl Node {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffers if ready, the error if failed, `None` if deferred.
    pub fn ready(&self) -> Option<Result<Arc<Vec<Buffer>>, RuntimeError>> {
        match &*self.lock() {
            State::Ready(b) => Some(Ok(b.clone())),
            State::Failed(e) => Some(Err(e.clone())),
            State::Deferred { .. } => None,
        }
    }

    /// The op and inputs of a deferred node.
    pub fn deferred(&self) -> Option<(Op, Vec<Arc<Node>>)> {
        match &*self.lock() {
            State::Deferred { op, inputs } => Some((op.clone(), inputs.clone())),
            _ => None,
        }
    }
}

impl Drop for Node {
    /// Drops a chain of deferred nodes iteratively: a program that records
    /// a million ops without a sync must not overflow the stack when the
    /// chain is freed.
    fn drop(&mut self) {
        let mut stack = Vec::new();
        take_inputs(self, &mut stack);
        while let Some(n) = stack.pop() {
            if let Ok(mut owned) = Arc::try_unwrap(n) {
                take_inputs(&mut owned, &mut stack);
                // `owned` drops here with no inputs left.
            }
        }
    }
}

/// Moves a node's input references (deferred and taped) onto `stack`.
fn take_inputs(node: &mut Node, stack: &mut Vec<Arc<Node>>) {
    let st = node.state.get_mut().unwrap_or_else(|p| p.into_inner());
    if let State::Deferred { inputs, .. } = st {
        stack.append(inputs);
    }
    if let Tape::Op {
        inputs, siblings, ..
    } = &mut node.tape
    {
        stack.append(inputs);
        stack.append(siblings);
    }
}
