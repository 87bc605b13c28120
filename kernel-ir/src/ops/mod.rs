//! The kernel body: SSA values over typed, shaped tiles.
//!
//! A body is a tree of [`Region`]s. Every value is defined once, by an op
//! result or a region argument, and is visible in its region after its
//! definition and in regions nested there. Shapes are static.

use std::fmt;

use crate::{DType, Loc};

mod element;
pub use element::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

/// The id of an SSA value; an index into [`Body::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    /// The index into [`Body::values`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// The type of a value: an element type and a static shape (rank 0 for a
/// scalar).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TileType {
    /// Element type.
    pub dtype: DType,
    /// Shape; empty for scalars.
    pub shape: Vec<usize>,
}

impl TileType {
    /// A tile type.
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> TileType {
        TileType {
            dtype,
            shape: shape.into(),
        }
    }

    /// A rank-0 type.
    pub fn scalar(dtype: DType) -> TileType {
        TileType {
            dtype,
            shape: Vec::new(),
        }
    }

    /// Number of elements (saturating).
    pub fn elements(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

impl fmt::Display for TileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dtype)?;
        if !self.shape.is_empty() {
            write!(f, "{}", ShapeDisplay(&self.shape))?;
        }
        Ok(())
    }
}

/// Prints a shape as `[a, b, c]`.
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A buffer the body reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferRef {
    /// The window (or whole array, for `any`) of operand `n`.
    Operand(usize),
    /// Scratch buffer `n`.
    Scratch(usize),
    /// Scalar-prefetch operand `n`.
    Prefetch(usize),
}

/// A static index or a rank-0 i32 value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexValue {
    /// Known when the kernel is built.
    Static(i64),
    /// Known when the kernel runs.
    Dynamic(ValueId),
}

/// How one dimension of a buffer is indexed by a load or store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Index {
    /// `len` elements from `start`; the dim stays in the tile.
    Slice {
        /// First element.
        start: IndexValue,
        /// Number of elements.
        len: usize,
    },
    /// One element; the dim is dropped from the tile.
    Point(IndexValue),
}

/// A constant's value, splatted over its type's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Literal {
    /// A float (stored exactly, rounded to the dtype when used).
    Float(f64),
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl Literal {
    /// The value as f64 (bool as 0/1).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(v) => v,
            Literal::Int(v) => v as f64,
            Literal::Bool(b) => b as u8 as f64,
        }
    }
}

/// Dimension numbers of a `dot_general`, StableHLO style: the result has the
/// batch dims, then lhs free dims, then rhs free dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct DotDims {
    /// Batch dims of the lhs.
    pub lhs_batch: Vec<usize>,
    /// Batch dims of the rhs, paired with `lhs_batch`.
    pub rhs_batch: Vec<usize>,
    /// Contracting dims of the lhs.
    pub lhs_contract: Vec<usize>,
    /// Contracting dims of the rhs, paired with `lhs_contract`.
    pub rhs_contract: Vec<usize>,
}

impl DotDims {
    /// A plain matrix product `[m, k] x [k, n]`.
    pub fn matmul() -> DotDims {
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![0],
            ..DotDims::default()
        }
    }

    /// `[m, k] x [n, k]ᵀ`: contract the last dims of both.
    pub fn matmul_transposed_rhs() -> DotDims {
        DotDims {
            lhs_contract: vec![1],
            rhs_contract: vec![1],
            ..DotDims::default()
        }
    }

    /// The dims of a rank-`rank` lhs that are neither batch nor
    /// contracted, in order.
    pub fn lhs_free(&self, rank: usize) -> Vec<usize> {
        free_dims(rank, &self.lhs_batch, &self.lhs_contract)
    }

    /// The dims of a rank-`rank` rhs that are neither batch nor
    /// contracted, in order.
    pub fn rhs_free(&self, rank: usize) -> Vec<usize> {
        free_dims(rank, &self.rhs_batch, &self.rhs_contract)
    }

    /// The lhs dims in the order `[batch, free, contract]` (the lhs as
    /// `[b, m, k]`).
    pub fn lhs_order(&self, rank: usize) -> Vec<usize> {
        let free = self.lhs_free(rank);
        [&self.lhs_batch, &free, &self.lhs_contract]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The rhs dims in the order `[batch, contract, free]` (the rhs as
    /// `[b, k, n]`).
    pub fn rhs_order(&self, rank: usize) -> Vec<usize> {
        let free = self.rhs_free(rank);
        [&self.rhs_batch, &self.rhs_contract, &free]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }

    /// The product's `[b, m, k, n]`: batch, lhs free, contracted and rhs
    /// free elements, for operands of these shapes.
    ///
    /// ```
    /// use kernel_ir::DotDims;
    /// // [2, 8, 16] x [2, 16, 4], batched over dim 0.
    /// let d = DotDims {
    ///     lhs_batch: vec![0],
    ///     rhs_batch: vec![0],
    ///     lhs_contract: vec![2],
    ///     rhs_contract: vec![1],
    /// };
    /// assert_eq!(d.sizes(&[2, 8, 16], &[2, 16, 4]), [2, 8, 16, 4]);
    /// assert_eq!(d.lhs_order(3), [0, 1, 2]);
    /// // q·kᵀ with k stored [n, k]: the rhs read as [k, n].
    /// let t = DotDims::matmul_transposed_rhs();
    /// assert_eq!(t.rhs_order(2), [1, 0]);
    /// assert_eq!(t.sizes(&[8, 64], &[128, 64]), [1, 8, 64, 128]);
    /// ```
    pub fn sizes(&self, lhs: &[usize], rhs: &[usize]) -> [usize; 4] {
        let size = |shape: &[usize], ds: &[usize]| ds.iter().map(|&d| shape[d]).product();
        [
            size(lhs, &self.lhs_batch),
            size(lhs, &self.lhs_free(lhs.len())),
            size(lhs, &self.lhs_contract),
            size(rhs, &self.rhs_free(rhs.len())),
        ]
    }
}

/// The dims below `rank` in neither `batch` nor `contract`.
fn free_dims(rank: usize, batch: &[usize], contract: &[usize]) -> Vec<usize> {
    (0..rank)
        .filter(|d| !batch.contains(d) && !contract.contains(d))
        .collect()
}

/// What an op does.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// A splat constant of type `ty`.
    Constant {
        /// Value of every element.
        value: Literal,
        /// Result type.
        ty: TileType,
    },
    /// The current index of grid dim `dim` (i32 scalar).
    ProgramId {
        /// Grid dim.
        dim: usize,
    },
    /// The bound of grid dim `dim` (i32 scalar).
    NumPrograms {
        /// Grid dim.
        dim: usize,
    },
    /// Element indices along `dim` of a tile of type `ty`.
    Iota {
        /// Result type.
        ty: TileType,
        /// The dim whose index each element holds.
        dim: usize,
    },
    /// Reads a (sub)block of a buffer. Elements where `mask` is false are
    /// not read and are 0.
    Load {
        /// The buffer.
        buffer: BufferRef,
        /// One index per buffer dim.
        indices: Vec<Index>,
        /// Optional bool tile of the result shape.
        mask: Option<ValueId>,
    },
    /// Writes a (sub)block of a buffer. Elements where `mask` is false are
    /// not written.
    Store {
        /// The buffer.
        buffer: BufferRef,
        /// One index per buffer dim.
        indices: Vec<Index>,
        /// The tile to write; its type is the indexed view's.
        value: ValueId,
        /// Optional bool tile of the value's shape.
        mask: Option<ValueId>,
    },
    /// Elementwise unary op.
    Unary {
        /// The op.
        op: UnaryOp,
        /// Operand.
        x: ValueId,
    },
    /// Elementwise binary op; both operands have the same type.
    Binary {
        /// The op.
        op: BinaryOp,
        /// Left operand.
        lhs: ValueId,
        /// Right operand.
        rhs: ValueId,
    },
    /// Elementwise comparison; result is bool.
    Compare {
        /// Direction.
        op: CompareOp,
        /// Left operand.
        lhs: ValueId,
        /// Right operand.
        rhs: ValueId,
    },
    /// Elementwise `cond ? on_true : on_false`.
    Select {
        /// Bool tile.
        cond: ValueId,
        /// Chosen where `cond` is true.
        on_true: ValueId,
        /// Chosen where `cond` is false.
        on_false: ValueId,
    },
    /// Elementwise conversion to `dtype`.
    Convert {
        /// Operand.
        x: ValueId,
        /// Result dtype.
        dtype: DType,
    },
    /// The same bits read as `dtype`: `f32` ↔ `i32` (StableHLO's
    /// `bitcast_convert`; the identity on either is allowed too). A NaN's
    /// payload is not kept on every path (the interpreter holds values, not
    /// bits): bits that make a NaN read back as some NaN pattern.
    Bitcast {
        /// Operand.
        x: ValueId,
        /// Result dtype.
        dtype: DType,
    },
    /// StableHLO `broadcast_in_dim`: operand dim i becomes result dim
    /// `dims[i]` (size equal, or 1 and broadcast).
    BroadcastInDim {
        /// Operand.
        x: ValueId,
        /// Result shape.
        shape: Vec<usize>,
        /// Result dim of each operand dim, increasing.
        dims: Vec<usize>,
    },
    /// Row-major reshape to `shape` (same element count).
    Reshape {
        /// Operand.
        x: ValueId,
        /// Result shape.
        shape: Vec<usize>,
    },
    /// Result dim i is operand dim `perm[i]`.
    Transpose {
        /// Operand.
        x: ValueId,
        /// Permutation.
        perm: Vec<usize>,
    },
    /// Rotates along `axis` as `jnp.roll`: result element `i` is operand
    /// element `(i - shift) mod n` (`n` the dim's size), so elements move
    /// toward higher indices and wrap around.
    Roll {
        /// Operand.
        x: ValueId,
        /// Places moved, in `0..n` (the builder reduces any shift mod `n`).
        shift: usize,
        /// The dim rotated.
        axis: usize,
    },
    /// Elements `start..start + len` of `axis` (static, stride 1): the
    /// other dims are kept whole.
    Slice {
        /// Operand.
        x: ValueId,
        /// The dim cut.
        axis: usize,
        /// First element kept.
        start: usize,
        /// Elements kept (at least 1).
        len: usize,
    },
    /// `lhs` then `rhs` along `axis` (the other dims and the element type
    /// agree).
    Concat {
        /// The first part.
        lhs: ValueId,
        /// The part after it.
        rhs: ValueId,
        /// The dim joined.
        axis: usize,
    },
    /// Reduces `axes` away.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Operand.
        x: ValueId,
        /// Axes removed, increasing.
        axes: Vec<usize>,
    },
    /// `dot_general`, accumulating (and returning) `acc`.
    Dot {
        /// Left operand.
        lhs: ValueId,
        /// Right operand (same dtype as lhs).
        rhs: ValueId,
        /// Dimension numbers.
        dims: DotDims,
        /// Accumulation and result dtype.
        acc: DType,
    },
    /// `for iv in (lower..upper).step_by(step)` with carried values. The
    /// body's args are `[iv, carried...]`; it yields the next carried values;
    /// the results are the final ones.
    For {
        /// First index.
        lower: IndexValue,
        /// One past the last index.
        upper: IndexValue,
        /// Positive step.
        step: i64,
        /// Initial carried values.
        init: Vec<ValueId>,
        /// Loop body.
        body: Region,
        /// Lowering hint: unroll fully (only with static bounds).
        unroll: bool,
    },
    /// Runs `then_region` if the bool scalar `cond` holds, else
    /// `else_region`; both yield values of the result types.
    If {
        /// Bool scalar.
        cond: ValueId,
        /// Taken when `cond` is true.
        then_region: Region,
        /// Taken when `cond` is false.
        else_region: Region,
    },
    /// Starts an asynchronous copy (Pallas's `copy.start()`).
    DmaStart(crate::CopyDescriptor),
    /// Waits until the bytes of a copy like this one (same semaphore, same
    /// size) have arrived (Pallas's `copy.wait()`).
    DmaWait(crate::CopyDescriptor),
    /// Waits until the bytes of a remote copy like this one have left this
    /// device (its `send_sem`), so its source may be overwritten (Pallas's
    /// `copy.wait_send()`).
    DmaWaitSend(crate::CopyDescriptor),
    /// This device's logical id in the kernel's mesh (i32 scalar).
    DeviceId,
    /// This device's coordinate along mesh axis `axis` (i32 scalar).
    AxisIndex {
        /// The axis, by position in the mesh.
        axis: usize,
    },
    /// Adds `amount` to a regular (or the barrier) semaphore on device
    /// `device` of the mesh (Pallas's `semaphore_signal(.., device_id=)`).
    RemoteSignal {
        /// The semaphore (its copy on `device`).
        sem: crate::SemaphoreSlot,
        /// What to add (≥ 0).
        amount: IndexValue,
        /// The logical id of the device signalled.
        device: IndexValue,
    },
    /// Adds `amount` to a regular semaphore.
    SemSignal {
        /// The semaphore.
        sem: crate::SemaphoreSlot,
        /// What to add (≥ 0).
        amount: IndexValue,
    },
    /// Waits until a regular semaphore holds at least `amount`, then
    /// subtracts it.
    SemWait {
        /// The semaphore.
        sem: crate::SemaphoreSlot,
        /// What to take (≥ 0).
        amount: IndexValue,
    },
    /// The value of a regular semaphore (i32 scalar).
    SemRead {
        /// The semaphore.
        sem: crate::SemaphoreSlot,
    },
    /// Allocates the scoped scratch buffers and semaphores listed for the
    /// body, which runs once (Pallas's `run_scoped`).
    Scope {
        /// Indices into [`crate::Kernel::scratch`] of the buffers it
        /// allocates (each marked `scoped`).
        scratch: Vec<usize>,
        /// Indices into [`crate::Kernel::semaphores`] of the semaphores it
        /// allocates (each marked `scoped`).
        semaphores: Vec<usize>,
        /// The body; it takes no args and yields nothing.
        body: Region,
    },
}

impl OpKind {
    /// The op's printed mnemonic.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            OpKind::Constant { .. } => "constant",
            OpKind::ProgramId { .. } => "program_id",
            OpKind::NumPrograms { .. } => "num_programs",
            OpKind::Iota { .. } => "iota",
            OpKind::Load { .. } => "load",
            OpKind::Store { .. } => "store",
            OpKind::Unary { op, .. } => op.name(),
            OpKind::Binary { op, .. } => op.name(),
            OpKind::Compare { .. } => "cmp",
            OpKind::Select { .. } => "select",
            OpKind::Convert { .. } => "convert",
            OpKind::Bitcast { .. } => "bitcast",
            OpKind::BroadcastInDim { .. } => "broadcast_in_dim",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Roll { .. } => "roll",
            OpKind::Slice { .. } => "slice",
            OpKind::Concat { .. } => "concat",
            OpKind::Reduce { .. } => "reduce",
            OpKind::Dot { .. } => "dot_general",
            OpKind::For { .. } => "for",
            OpKind::If { .. } => "if",
            OpKind::DmaStart(_) => "dma_start",
            OpKind::DmaWait(_) => "dma_wait",
            OpKind::SemSignal { .. } => "sem_signal",
            OpKind::DmaWaitSend(_) => "dma_wait_send",
            OpKind::DeviceId => "device_id",
            OpKind::AxisIndex { .. } => "axis_index",
            OpKind::RemoteSignal { .. } => "remote_signal",
            OpKind::SemWait { .. } => "sem_wait",
            OpKind::SemRead { .. } => "sem_read",
            OpKind::Scope { .. } => "scope",
        }
    }

    /// Values the op reads directly (not those used inside its regions).
    pub fn operands(&self) -> Vec<ValueId> {
        let idx = |indices: &[Index], out: &mut Vec<ValueId>| {
            for i in indices {
                match i {
                    Index::Slice {
                        start: IndexValue::Dynamic(v),
                        ..
                    }
                    | Index::Point(IndexValue::Dynamic(v)) => out.push(*v),
                    _ => {}
                }
            }
        };
        let mut out = Vec::new();
        match self {
            OpKind::Constant { .. }
            | OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
            | OpKind::DeviceId
            | OpKind::AxisIndex { .. }
            | OpKind::Iota { .. } => {}
            OpKind::Load { indices, mask, .. } => {
                idx(indices, &mut out);
                out.extend(mask);
            }
            OpKind::Store {
                indices,
                value,
                mask,
                ..
            } => {
                idx(indices, &mut out);
                out.push(*value);
                out.extend(mask);
            }
            OpKind::Unary { x, .. }
            | OpKind::Convert { x, .. }
            | OpKind::Bitcast { x, .. }
            | OpKind::BroadcastInDim { x, .. }
            | OpKind::Reshape { x, .. }
            | OpKind::Transpose { x, .. }
            | OpKind::Roll { x, .. }
            | OpKind::Slice { x, .. }
            | OpKind::Reduce { x, .. } => out.push(*x),
            OpKind::Binary { lhs, rhs, .. }
            | OpKind::Concat { lhs, rhs, .. }
            | OpKind::Compare { lhs, rhs, .. }
            | OpKind::Dot { lhs, rhs, .. } => out.extend([*lhs, *rhs]),
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => out.extend([*cond, *on_true, *on_false]),
            OpKind::For {
                lower, upper, init, ..
            } => {
                for b in [lower, upper] {
                    if let IndexValue::Dynamic(v) = b {
                        out.push(*v);
                    }
                }
                out.extend(init);
            }
            OpKind::If { cond, .. } => out.push(*cond),
            OpKind::DmaStart(c) | OpKind::DmaWait(c) | OpKind::DmaWaitSend(c) => {
                out.extend(c.operands())
            }
            OpKind::RemoteSignal {
                sem,
                amount,
                device,
            } => {
                out.extend(sem.operands());
                for v in [amount, device] {
                    if let IndexValue::Dynamic(v) = v {
                        out.push(*v);
                    }
                }
            }
            OpKind::SemSignal { sem, amount } | OpKind::SemWait { sem, amount } => {
                out.extend(sem.operands());
                if let IndexValue::Dynamic(v) = amount {
                    out.push(*v);
                }
            }
            OpKind::SemRead { sem } => out.extend(sem.operands()),
            OpKind::Scope { .. } => {}
        }
        out
    }

    /// The op's nested regions.
    pub fn regions(&self) -> Vec<&Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::If {
                then_region,
                else_region,
                ..
            } => vec![then_region, else_region],
            OpKind::Scope { body, .. } => vec![body],
            _ => Vec::new(),
        }
    }

    /// The op's nested regions, to change.
    pub fn regions_mut(&mut self) -> Vec<&mut Region> {
        match self {
            OpKind::For { body, .. } => vec![body],
            OpKind::If {
                then_region,
                else_region,
                ..
            } => vec![then_region, else_region],
            OpKind::Scope { body, .. } => vec![body],
            _ => Vec::new(),
        }
    }
}

/// One operation with its results and source location.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// Values it defines.
    pub results: Vec<ValueId>,
    /// Where the user wrote it.
    pub loc: Option<Loc>,
}

/// A sequence of ops with arguments and yielded values.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Region {
    /// Values bound on entry.
    pub args: Vec<ValueId>,
    /// Ops in program order.
    pub ops: Vec<Op>,
    /// Values passed to the parent op on exit.
    pub yields: Vec<ValueId>,
}

/// A kernel body: the value table and the top-level region (which has no
/// args and yields nothing).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Body {
    /// Type of every value, by id.
    pub values: Vec<TileType>,
    /// The top-level region.
    pub region: Region,
}

impl Body {
    /// The type of a value, if the id exists.
    pub fn ty(&self, v: ValueId) -> Option<&TileType> {
        self.values.get(v.index())
    }

    /// Visits every op, parents before their regions' ops.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Op)) {
        fn go<'a>(r: &'a Region, f: &mut impl FnMut(&'a Op)) {
            for op in &r.ops {
                f(op);
                for sub in op.kind.regions() {
                    go(sub, f);
                }
            }
        }
        go(&self.region, f)
    }
}
