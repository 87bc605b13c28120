//! Errors of building, verifying and interpreting kernels.
//!
//! Every error is a value: it names the rule that was broken, the values
//! found and what would fit, and carries the source location of the op or
//! declaration when there is one.

use std::fmt;

use crate::budget::VmemBudget;
use crate::ops::ShapeDisplay;
use crate::{DType, Loc, Target};

/// One diagnostic: what went wrong and where.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelError {
    /// What rule was broken.
    pub kind: ErrorKind,
    /// Where the user wrote the offending op or declaration.
    pub loc: Option<Loc>,
}

impl KernelError {
    /// An error at a location.
    pub fn new(kind: ErrorKind, loc: Option<Loc>) -> KernelError {
        KernelError { kind, loc }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(loc) = &self.loc {
            write!(f, "{loc}: ")?;
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for KernelError {}

impl From<ErrorKind> for KernelError {
    fn from(kind: ErrorKind) -> Self {
        KernelError { kind, loc: None }
    }
}

/// All the errors found in one kernel, in the order found.
///
/// Its `Debug` form is its messages (each rule broken and its fix), so a
/// build's `.unwrap()`, which prints `Debug`, reads like a compiler error;
/// `{:#?}` gives the fields.
///
/// ```
/// use kernel_ir::prelude::*;
/// let mut k = KernelBuilder::new("bad");
/// k.grid([2], [Parallel]);
/// let x = k.input("x", F32, [16, 100]).block([8, 100], |[i]| (i, 0));
/// let o = k.output("x", F32, [16, 100]).block([8, 100], |[i]| (i, 0));
/// o.store(.., x.load(..));
/// let e = k.build().unwrap_err();
/// assert!(format!("{e:?}").contains("[duplicate-name] `x` is declared twice"));
/// assert!(format!("{e:#?}").contains("DuplicateName"));
/// ```
#[derive(Clone, PartialEq)]
pub struct KernelErrors(pub Vec<KernelError>);

impl fmt::Debug for KernelErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f.debug_tuple("KernelErrors").field(&self.0).finish();
        }
        // After `unwrap`'s "called `Result::unwrap()` on an `Err` value: ".
        writeln!(f)?;
        fmt::Display::fmt(self, f)
    }
}

impl KernelErrors {
    /// True if any error's kind satisfies `f`.
    pub fn any(&self, f: impl Fn(&ErrorKind) -> bool) -> bool {
        self.0.iter().any(|e| f(&e.kind))
    }

    /// The first error.
    pub fn first(&self) -> Option<&KernelError> {
        self.0.first()
    }
}

impl fmt::Display for KernelErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for KernelErrors {}

impl From<KernelError> for KernelErrors {
    fn from(e: KernelError) -> Self {
        KernelErrors(vec![e])
    }
}

/// Prints an optional list of indices.
fn idx(v: &[i64]) -> String {
    let parts: Vec<String> = v.iter().map(i64::to_string).collect();
    format!("({})", parts.join(", "))
}

/// What rule a kernel broke.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ErrorKind {
    // ---- signature ----
    /// Two declarations share a name.
    #[error(
        "[duplicate-name] `{name}` is declared twice; give every operand, scratch buffer and scalar-prefetch operand its own name"
    )]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A name that is empty or not an identifier.
    #[error(
        "[bad-name] `{name}` is not a valid name; use letters, digits and `_`, not starting with a digit"
    )]
    BadName {
        /// The name.
        name: String,
    },
    /// A zero-sized array, block, scratch or grid dim.
    #[error("[zero-size] {what} has a zero-sized dim in {}; every dim must be at least 1", ShapeDisplay(.shape))]
    ZeroSize {
        /// What it is (`operand x`, `grid`, ...).
        what: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// An array too large to index: more than 2^40 elements, or a dim past
    /// `i32::MAX`.
    #[error("[too-large] {what} has shape {}: arrays hold at most 2^40 elements and 2147483647 per dim (kernels index in i32); check the shape", ShapeDisplay(.shape))]
    TooLarge {
        /// What it is (`operand x`, ...).
        what: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Over one of Tessera's limits ([`crate::limits`]).
    #[error(
        "[limit] {what} is {value}, over Tessera's limit of {limit} (kernel_ir::limits::{name}); {fix}"
    )]
    Limit {
        /// What is too large.
        what: String,
        /// How large it is.
        value: String,
        /// The limit.
        limit: u64,
        /// The limit's name in [`crate::limits`].
        name: &'static str,
        /// What to do instead.
        fix: String,
    },
    /// An element-offset window that cannot be: on an output, or with
    /// padding of the wrong rank.
    #[error("[element-window] operand `{operand}`: {detail}")]
    ElementWindow {
        /// Operand name.
        operand: String,
        /// What is wrong and the fix.
        detail: String,
    },
    /// The block shape has a different rank than the array.
    #[error("[block-rank] operand `{operand}` is rank {array_rank} but its block {} is rank {block_rank}; give one block dim per array dim (use 1 for dims you index one at a time)", ShapeDisplay(.block))]
    BlockRank {
        /// Operand name.
        operand: String,
        /// Block shape.
        block: Vec<usize>,
        /// Its rank.
        block_rank: usize,
        /// The array's rank.
        array_rank: usize,
    },
    /// A block dim larger than the array dim.
    #[error(
        "[block-too-large] operand `{operand}`: block dim {dim} is {block} but the array dim is only {array}; use at most {array}"
    )]
    BlockTooLarge {
        /// Operand name.
        operand: String,
        /// Logical dim.
        dim: usize,
        /// Block size.
        block: usize,
        /// Array size.
        array: usize,
    },
    /// The index map returns the wrong number of block indices.
    #[error(
        "[index-map-arity] operand `{operand}`: the index map returns {found} block indices but the block has rank {expected}"
    )]
    IndexMapArity {
        /// Operand name.
        operand: String,
        /// Entries returned.
        found: usize,
        /// Block rank.
        expected: usize,
    },
    /// The index map names a grid dim or prefetch operand that does not
    /// exist.
    #[error("[index-map-ref] operand `{operand}`: the index map {detail}")]
    IndexMapRef {
        /// Operand name.
        operand: String,
        /// What it referenced.
        detail: String,
    },
    /// A general layout order that is not a permutation.
    #[error(
        "[bad-layout] operand `{operand}`: minor-to-major order {order:?} is not a permutation of 0..{rank}"
    )]
    BadLayout {
        /// Operand name.
        operand: String,
        /// The order given.
        order: Vec<usize>,
        /// The array rank.
        rank: usize,
    },
    /// An alignment that is not a power of two.
    #[error(
        "[bad-align] operand `{operand}`: align = {align} is not a power of two; use 128 for MXU operands"
    )]
    BadAlign {
        /// Operand name.
        operand: String,
        /// The alignment.
        align: u64,
    },
    /// A scalar-prefetch operand that is not i32.
    #[error(
        "[prefetch-dtype] scalar-prefetch `{name}` is {dtype}; scalar prefetch holds i32 values"
    )]
    PrefetchDType {
        /// Name.
        name: String,
        /// Its dtype.
        dtype: DType,
    },
    /// An operand in `any` memory with a block spec.
    #[error(
        "[any-block] operand `{operand}` is in memory space `any`, which passes the whole array; drop its block spec or use vmem"
    )]
    AnyWithBlock {
        /// Operand name.
        operand: String,
    },
    /// A scratch buffer in `any` memory.
    #[error("[scratch-space] scratch `{name}` must live in vmem or smem, not `any`")]
    ScratchSpace {
        /// Name.
        name: String,
    },
    /// The VMEM limit is above the target's physical VMEM.
    #[error(
        "[vmem-limit] vmem_limit = {limit} bytes exceeds the {target} VMEM of {physical} bytes; use at most {physical}"
    )]
    VmemLimitTooLarge {
        /// The limit asked for.
        limit: u64,
        /// Target.
        target: Target,
        /// Physical VMEM.
        physical: u64,
    },

    // ---- TPU rules ----
    /// A VMEM block shape that breaks the (sublane, lane) tiling.
    #[error(
        "[tiling] {dtype} operand `{operand}` ({layout}): block dim {dim} is {block}, the physical {which} dim; it must be {rule} or the full array dim {array}; {suggest}"
    )]
    Tiling {
        /// Operand name.
        operand: String,
        /// Its dtype.
        dtype: DType,
        /// Its layout, printed.
        layout: String,
        /// Logical dim.
        dim: usize,
        /// `minor (lane)` or `second-minor (sublane)` or `only`.
        which: &'static str,
        /// Block size found.
        block: usize,
        /// Array size.
        array: usize,
        /// The rule, e.g. `a multiple of 128 lanes`.
        rule: String,
        /// What would fit.
        suggest: String,
    },
    /// Something the TPU compiler (Mosaic) rejects on every generation,
    /// found by compiling with libtpu (see `verify::mosaic`).
    #[error("[tpu-{rule}] {what}: {why}; {fix}")]
    TpuUnsupported {
        /// The rule's short name (`f16`, `i8-arith`, ...).
        rule: &'static str,
        /// What the kernel does.
        what: String,
        /// What Mosaic supports instead.
        why: String,
        /// What to write instead.
        fix: String,
    },
    /// A block start that breaks the operand's alignment.
    #[error("[align] operand `{operand}` has align = {align} but at grid index {} block {} starts at byte {offset}: each block along dim {dim} advances {step_bytes} bytes; make block dim {dim} a multiple of {elements} elements", idx(.grid), idx(.block_index))]
    Misaligned {
        /// Operand name.
        operand: String,
        /// Required alignment.
        align: u64,
        /// Grid point.
        grid: Vec<i64>,
        /// Block index there.
        block_index: Vec<i64>,
        /// Byte offset of the block start.
        offset: u64,
        /// The logical dim at fault.
        dim: usize,
        /// Bytes one block step along that dim moves the start.
        step_bytes: u64,
        /// Block dim multiple that would keep every start aligned.
        elements: u64,
    },
    /// Windows and scratch do not fit in the scoped VMEM limit.
    #[error("[vmem-budget] {0}")]
    VmemOverflow(Box<VmemBudget>),
    /// An index map selects a block outside the array.
    #[error("[block-bounds] operand `{operand}`: at grid index {} the index map selects block {}, but dim {dim} has only {blocks} blocks of {block_size} (array dim {array}); valid block indices are 0..{blocks}", idx(.grid), idx(.block_index))]
    BlockOutOfBounds {
        /// Operand name.
        operand: String,
        /// Grid point.
        grid: Vec<i64>,
        /// Block index found.
        block_index: Vec<i64>,
        /// Dim at fault.
        dim: usize,
        /// Number of blocks along it.
        blocks: usize,
        /// Block size along it.
        block_size: usize,
        /// Array size along it.
        array: usize,
    },
    /// An element-offset window reaches outside its padded array.
    #[error("[block-bounds] operand `{operand}`: at grid index {} the element window starts at {} and dim {dim} covers elements {start}..{end} of the padded array, which has {low} + {array} + {high} = {padded}; keep windows inside it (raise the padding or shrink the window)", idx(.grid), idx(.index))]
    WindowOutOfBounds {
        /// Operand name.
        operand: String,
        /// Grid point.
        grid: Vec<i64>,
        /// The index map's element offsets.
        index: Vec<i64>,
        /// Dim at fault.
        dim: usize,
        /// First element of the window along it (padded coordinates).
        start: i64,
        /// One past its last.
        end: i64,
        /// Padding before.
        low: usize,
        /// Array size.
        array: usize,
        /// Padding after.
        high: usize,
        /// Padded size.
        padded: usize,
    },
    /// The index map cannot be evaluated.
    #[error("[index-map-eval] operand `{operand}` at grid index {}: {reason}", idx(.grid))]
    IndexMapEval {
        /// Operand name.
        operand: String,
        /// Grid point.
        grid: Vec<i64>,
        /// Why.
        reason: String,
    },
    /// Scratch state that flows across a parallel grid dim.
    #[error(
        "[parallel-carry] `{scratch}` (scratch, or an output block read back) is read before it is written in a grid step, so it carries state from the previous step, but grid dim {dim} is parallel and its steps may run in any order or on another core; mark dim {dim} `arbitrary`, or initialize `{scratch}` under `when(program_id(d) == 0)` for an arbitrary dim d inner to every parallel dim; if it is working memory of one step, write all of it before reading it or allocate it per step with `scoped(..)`"
    )]
    ParallelCarry {
        /// The scratch buffer's or output operand's name.
        scratch: String,
        /// The parallel grid dim.
        dim: usize,
    },

    // ---- body ----
    /// A value id that does not exist or is not visible here.
    #[error(
        "[undefined-value] %{id} is not defined at this point (a value from another region, a later op, or another kernel)"
    )]
    UndefinedValue {
        /// The id.
        id: u32,
    },
    /// A value defined by two ops (or twice by one).
    #[error(
        "[redefined-value] %{id} is already defined above; values are defined once: give this one a new number"
    )]
    RedefinedValue {
        /// The id.
        id: u32,
    },
    /// An operand of the wrong dtype.
    #[error("[dtype] {op}: {detail}")]
    DType {
        /// The op.
        op: &'static str,
        /// What was found and expected.
        detail: String,
    },
    /// Operands of incompatible shapes.
    #[error("[shape] {op}: {detail}")]
    Shape {
        /// The op.
        op: &'static str,
        /// What was found and expected.
        detail: String,
    },
    /// `dot_general` operands with different dtypes or a bad accumulator.
    #[error("[dot-dtype] dot_general: {detail}")]
    DotDType {
        /// What was found and expected.
        detail: String,
    },
    /// An axis, dim or permutation entry out of range.
    #[error("[axis] {op}: {detail}")]
    Axis {
        /// The op.
        op: &'static str,
        /// What was found and expected.
        detail: String,
    },
    /// A buffer reference that does not exist.
    #[error("[unknown-buffer] {0}")]
    UnknownBuffer(String),
    /// A load/store with the wrong number of indices or a static slice out
    /// of range.
    #[error("[index] {op} `{buffer}`: {detail}")]
    Index {
        /// `load` or `store`.
        op: &'static str,
        /// Buffer name.
        buffer: String,
        /// What was found and expected.
        detail: String,
    },
    /// A store to an input operand or to scalar prefetch.
    #[error(
        "[read-only] `{buffer}` is {what} and cannot be written; declare it as an output or in-out operand"
    )]
    ReadOnly {
        /// Buffer name.
        buffer: String,
        /// Its role.
        what: &'static str,
    },
    /// A region that yields the wrong values.
    #[error("[yield] {op}: {detail}")]
    Yield {
        /// `for` or `if`.
        op: &'static str,
        /// What was found and expected.
        detail: String,
    },
    /// A condition or bound that is not a scalar of the right dtype.
    #[error("[scalar] {op}: {detail}")]
    NotScalar {
        /// The op.
        op: &'static str,
        /// What was found and expected.
        detail: String,
    },
    /// A tile that was not built by the kernel being built.
    #[error(
        "[foreign-tile] a tile or ref from another kernel builder (or one that was already finished) was used here; build every value of a kernel inside its own builder"
    )]
    ForeignTile,
    /// The builder API used out of order or on the wrong thing.
    #[error("[builder] {0}")]
    Builder(BuilderMisuse),
    /// A generic kernel asked for a dtype it has no instance for (a
    /// `build_for` or a library builder).
    #[error(
        "[dtype] {what} is instantiated for {}, not {dtype}",
        or_list(supported)
    )]
    UnsupportedDtype {
        /// The kernel (and which operand, where it matters).
        what: String,
        /// The dtype asked for.
        dtype: crate::DType,
        /// The dtypes it has.
        supported: Vec<crate::DType>,
    },
    /// A kernel's configuration that does not fit its shapes, found by its
    /// own rules before anything is built (heads that must divide, block
    /// tables of other sizes).
    #[error("[config] {0}")]
    Config(String),

    // ---- execution (interpreter) ----
    /// Input shapes that bind no consistent shape symbols, or an operand
    /// that does not exist.
    #[error("[inputs] {0}")]
    Inputs(String),
    /// A kernel across several devices where a path runs one, or a
    /// device id outside the kernel's mesh.
    #[error("[mesh] {0}")]
    Mesh(String),
    /// What a Triton program (the GPU target) cannot express: checked when
    /// a kernel is lowered for GPUs (`VerifiedKernel::check_gpu`), not by
    /// `Kernel::verify`, since a TPU kernel need not fit a GPU.
    #[error("[gpu] {0}")]
    Gpu(GpuRule),
    /// The devices of a mesh all wait and nothing in flight can wake one.
    #[error(
        "[deadlock] every device is waiting and no copy or signal in flight can wake one: {}{}; on a TPU this kernel hangs. Check that each wait has a matching signal or copy on the device it names",
        .waiting.join("; "),
        if .finished.is_empty() { String::new() } else {
            format!("; devices that finished: {}", .finished.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
        }
    )]
    Deadlock {
        /// Each waiting device's op, with its location: `device 0 waits at
        /// file:line: ..`.
        waiting: Vec<String>,
        /// The devices that had already finished.
        finished: Vec<usize>,
    },
    /// An error on one device of a mesh run.
    #[error("[device {device}] {error}")]
    OnDevice {
        /// The device's logical id.
        device: usize,
        /// What went wrong there.
        error: Box<ErrorKind>,
    },
    /// Wrong number, dtype or shape of a call's arrays.
    #[error("[inputs] {0}")]
    Arguments(crate::ArgumentError),
    /// Read of a scratch or output element that holds no value.
    #[error("[poison] {buffer} `{name}` element {} is read before anything was written to it{why}", idx(.element))]
    PoisonRead {
        /// `scratch` or `output`.
        buffer: &'static str,
        /// Buffer name.
        name: String,
        /// Element index within the buffer (or window).
        element: Vec<i64>,
        /// Extra explanation (e.g. scratch is reset when a parallel index
        /// changes).
        why: String,
    },
    /// Output elements never written.
    #[error("[unwritten-output] output `{operand}`: {count} of {total} elements were never written (first at {}); check that the grid and index map cover the whole array", idx(.first))]
    UnwrittenOutput {
        /// Operand name.
        operand: String,
        /// Elements never written.
        count: usize,
        /// Elements in total.
        total: usize,
        /// Index of the first one.
        first: Vec<i64>,
    },
    /// A dynamic index outside the buffer or the array.
    #[error("[dynamic-bounds] {op} `{buffer}`: {detail}")]
    DynamicOutOfBounds {
        /// `load` or `store`.
        op: &'static str,
        /// Buffer name.
        buffer: String,
        /// What was found and what fits.
        detail: String,
    },
    /// Integer division or remainder by zero.
    #[error("[div-by-zero] integer {op} by zero")]
    DivisionByZero {
        /// `div` or `rem`.
        op: &'static str,
    },
    /// A copy, semaphore or scope the kernel declares wrongly: mismatched
    /// views, a destination that cannot be written, a semaphore of the
    /// wrong kind, a scoped buffer used outside its scope.
    #[error("[dma] {op}: {detail}")]
    Dma {
        /// The op (`dma_start`, `sem_wait`, `scope`, ...).
        op: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// A DMA bug found while running: a copy's destination touched before
    /// its wait, a wait with nothing in flight, a kernel ending with
    /// copies in flight or a semaphore not back to zero. Hardware runs
    /// such kernels silently (or hangs); the interpreter stops at the op.
    #[error("[dma-race] {op}: {detail}")]
    DmaRace {
        /// The op where it was found.
        op: &'static str,
        /// What happened, where the other copy was started, and the fix.
        detail: String,
    },
    /// A loop with more iterations than the interpreter allows.
    #[error(
        "[loop-limit] for loop would run {trips} iterations, more than the interpreter's limit of {limit}; raise `InterpOptions::max_loop_trips` if this is intended"
    )]
    LoopLimit {
        /// Iterations asked for.
        trips: i64,
        /// The limit.
        limit: u64,
    },
    /// A grid with more steps than the interpreter runs.
    #[error(
        "[grid-limit] the grid has {steps} steps, more than the interpreter's limit of {limit} (kernel_ir::limits::MAX_INTERP_STEPS); run it on the native JIT (`--backend jit`), or raise `InterpOptions::max_grid_steps`"
    )]
    GridLimit {
        /// Grid steps.
        steps: u64,
        /// The limit.
        limit: u64,
    },
}

/// `a`, `a or b`, `a, b or c`: the dtypes of an error's list.
fn or_list(dtypes: &[crate::DType]) -> String {
    let names: Vec<String> = dtypes.iter().map(ToString::to_string).collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "no dtype".to_string(),
    }
}

/// A misuse of the builder API ([`ErrorKind::Builder`]): what the
/// `#[tpu_kernel]` macro never writes, but a hand-built kernel can.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuilderMisuse {
    /// `axis_index` of an axis the kernel's mesh does not have.
    #[error("axis_index(\"{0}\"): the kernel's mesh has no axis `{0}`; declare it with `mesh`")]
    UnknownMeshAxis(String),
    /// An index map taking another number of grid indices than the grid has.
    #[error(
        "the index map takes {takes} grid indices but the grid has {grid_rank} dims; set the grid first and take one index per grid dim"
    )]
    IndexMapArity {
        /// The indices the map takes.
        takes: usize,
        /// The grid's rank.
        grid_rank: usize,
    },
    /// A declaration that only operands have (`what`: the method), made on
    /// scratch or a semaphore.
    #[error("{0} applies to operands only")]
    NotAnOperand(&'static str),
    /// Scalar prefetch moved out of SMEM.
    #[error("scalar prefetch always lives in smem")]
    PrefetchOutsideSmem,
    /// A semaphore indexed by a range.
    #[error("a semaphore is indexed by numbers or i32 scalars, not ranges")]
    SemaphoreRange,
    /// A region closed that was never opened.
    #[error("no region is open")]
    NoRegionOpen,
    /// The kernel finished with a region still open.
    #[error("a region was left open")]
    RegionLeftOpen,
    /// The builder's state was taken (finished twice, or from a panic).
    #[error("the builder's state is gone")]
    StateGone,
    /// A value without a type and no error recorded for it (a builder bug).
    #[error("a value has no type but no error was recorded")]
    UntypedValue,
}

/// The GPU rule a kernel breaks (an [`ErrorKind::Gpu`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GpuRule {
    /// A kernel across the devices of a mesh: a Triton program runs on one
    /// GPU.
    #[error(
        "kernel `{kernel}` runs across the {devices} devices of its mesh; a Triton program runs on one GPU, so kernels across chips have no GPU form: run it with `tessera run FILE.kir --backend interp` or lower it for TPU"
    )]
    Mesh {
        /// The kernel.
        kernel: String,
        /// Its devices.
        devices: usize,
    },
    /// A tile dim that is not a power of two (Triton's tensors need one).
    #[error(
        "{what}; Triton's tensors have power-of-two dims, and {dim} is not one: use blocks of {} or {} (a ragged last block is masked), or lower this kernel for TPU or CPU only",
        .dim.next_power_of_two() / 2,
        .dim.next_power_of_two()
    )]
    NotPowerOfTwo {
        /// The op or declaration and its tile, in words.
        what: String,
        /// The dim.
        dim: usize,
    },
    /// A tile past the most elements a Triton tensor holds.
    #[error("{what}, {elements} elements; a Triton tensor holds at most {max}: use smaller blocks")]
    TooLarge {
        /// The op and its tile, in words.
        what: String,
        /// Its elements.
        elements: usize,
        /// The most a Triton tensor holds.
        max: usize,
    },
    /// f8e4m3fn on a target whose Triton lacks it.
    #[error(
        "{what}, and Triton has no f8e4m3fn on {target} (its fp8 types there are f8e5m2 and fp8e4b15): compile for sm_90 or later, gfx942 or gfx950, or use f8e5m2"
    )]
    NoF8e4m3fn {
        /// The op or declaration, in words.
        what: String,
        /// The GPU target.
        target: crate::GpuTarget,
    },
}
