//! What the TPU compiler (Mosaic, in libtpu) rejects beyond the tiling
//! rules, so a kernel author hears it at build time, at their line, in
//! words about the kernel rather than about the compiler's internals.
//!
//! Every rule here was found by compiling with libtpu 0.0.48 for v5e, v6e,
//! v5p and v7x (the differential test `tests/it/targets/tpu_compile.rs` and the
//! support matrix it came from) and holds on all four unless it says so:
//!
//! * `f16`: no f16 vectors on any generation ("Invalid vector type for
//!   load"), Pallas' f16 kernels included;
//! * `i8-arith`: i8 vectors are loaded, stored, converted, selected,
//!   reshaped, transposed and multiplied on the MXU, but no elementwise
//!   arithmetic, comparison, iota or reduction takes them ("Only `vector<i16>`
//!   and `vector<i32>` are supported");
//! * `fp8-arith`: fp8 vectors are loaded, stored, converted (to wider
//!   floats and to the other fp8 format), selected, reshaped and multiplied
//!   on the MXU on all four generations, but no elementwise arithmetic,
//!   comparison or reduction takes them;
//! * `masked-store`: masked stores of elements narrower than 32 bits
//!   (bf16, i8) are not implemented;
//! * `bf16-rem`: `%` on bf16 vectors does not legalize;
//! * `dot-operands`, `dot-acc`: the MXU multiplies f32, bf16, fp8
//!   (`f8e4m3fn`, `f8e5m2`) and i8 (not i32) and accumulates in 32 bits.
//!   libtpu compiles fp8 × fp8 and i8 × i8 dots on all four generations,
//!   also where jax's `tpu_info` lists no native MXU path for the type
//!   (fp8 before v7x, i8 on v7x): the compiler converts, so there is no
//!   per-generation operand rule, only a difference in speed;
//! * `dot-k1` (v6e and v7x only): a dot contracting over size 1 (an outer
//!   product) can fail libtpu's register allocator or abort it in the MXU
//!   latch packer;
//! * `smem-vector`: SMEM holds scalars; a load or store that moves a vector
//!   from or to it is rejected ("Expected vmem memory space");
//! * `bool-carry`: bool vectors carried by a loop or returned by a branch
//!   do not legalize;
//! * `rank1-select`: selecting (or mask-loading) a rank-1 vector narrower
//!   than 32 bits needs a relayout Mosaic lacks ("Sublane broadcast");
//! * `rank1-carry`: a loop carrying (or a branch returning) a rank-1
//!   vector fails layout inference in some layouts ("Invalid input
//!   layout"), and for bf16 aborts the compiler;
//! * `core-parallel`: at most one `core_parallel` grid dim, and its bound
//!   is the target's TensorCores per device ([`crate::Target::tensor_cores`]:
//!   "Core-parallel dimension 0 has iteration bound: 2, which is greater
//!   than the number of active cores: 1", "Only one core-parallel dimension
//!   is supported"; a bound below the core count fails too);
//! * `buffering`: a window has one or two pipeline buffers (Pallas: "Only
//!   single (1) and double (2) buffering are supported"), and an `any`
//!   operand has no window to buffer;
//! * `dma-window` (its own module, `dma_window`): the windows a copy can
//!   move, in whole lane tiles and, for packed types, sublane tiles.
//!
//! Where a lowering can avoid a limit, it does instead of a rule here: bool
//! buffers are i32 in memory, bool selects and comparisons are bitwise,
//! float `!=` is the negation of ordered `==`, rank-1 iotas are rows of 2-D
//! ones, bf16 reductions and bf16 sine and cosine run in f32.

use crate::error::{ErrorKind, KernelError};
use crate::{BinaryOp, BufferRef, DType, Index, Kernel, MemorySpace, Op, OpKind, Region, TileType};

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let mut c = Checker {
        k,
        errors: Vec::new(),
        f16_op_reported: false,
    };
    c.declarations();
    c.region(&k.body.region);
    c.errors
}

struct Checker<'a> {
    k: &'a Kernel,
    errors: Vec<KernelError>,
    /// The f16 rule is reported at the declarations and the first op only.
    f16_op_reported: bool,
}

/// A rank-1 vector of a packed type (narrower than 32 bits; bools are i32
/// in Mosaic).
fn packed_rank1(t: &TileType) -> bool {
    t.shape.len() == 1 && t.dtype.bits() < 32 && t.dtype != DType::Bool
}

fn unsupported(rule: &'static str, what: impl Into<String>, why: &str, fix: &str) -> ErrorKind {
    ErrorKind::TpuUnsupported {
        rule,
        what: what.into(),
        why: why.into(),
        fix: fix.into(),
    }
}

const F16_WHY: &str =
    "TPUs have no f16 vectors (Mosaic rejects f16 loads on v5e, v6e, v5p and v7x)";
const F16_FIX: &str = "use bf16, or f32, and convert outside the kernel";

impl Checker<'_> {
    fn push(&mut self, kind: ErrorKind, op: &Op) {
        self.errors.push(KernelError::new(kind, op.loc.clone()));
    }

    fn ty(&self, v: crate::ValueId) -> Option<&TileType> {
        self.k.body.ty(v)
    }

    fn declarations(&mut self) {
        let k = self.k;
        let cores = k.target.tensor_cores();
        let core_dims: Vec<usize> = (0..k.grid.rank())
            .filter(|&d| k.grid.dims[d].semantics == crate::DimSemantics::CoreParallel)
            .collect();
        if core_dims.len() > 1 {
            self.errors.push(KernelError::new(
                unsupported(
                    "core-parallel",
                    format!("grid dims {core_dims:?} are all core_parallel"),
                    "Mosaic splits one grid dim across a chip's TensorCores",
                    "mark one dim core_parallel and the others parallel",
                ),
                k.grid_loc.clone(),
            ));
        }
        for &d in &core_dims {
            let bound = k.grid.dims[d].bound;
            if bound != cores {
                self.errors.push(KernelError::new(
                    unsupported(
                        "core-parallel",
                        format!("core_parallel grid dim {d} has {bound} steps"),
                        &format!(
                            "a core_parallel dim has one step per TensorCore, and {} runs a kernel on {cores}",
                            k.target
                        ),
                        &if cores > 1 {
                            format!("give dim {d} {cores} steps, or mark it parallel")
                        } else {
                            format!("mark dim {d} parallel: {} has one TensorCore per device", k.target)
                        },
                    ),
                    k.grid_loc.clone(),
                ));
            }
        }
        for o in &k.operands {
            if o.dtype == DType::F16 {
                self.errors.push(KernelError::new(
                    unsupported(
                        "f16",
                        format!("operand `{}` is f16", o.name),
                        F16_WHY,
                        F16_FIX,
                    ),
                    o.loc.clone(),
                ));
            }
        }
        for o in &k.operands {
            let Some(n) = o.block.buffers else { continue };
            if o.space == MemorySpace::Any || !(1..=2).contains(&n) {
                self.errors.push(KernelError::new(
                    unsupported(
                        "buffering",
                        format!(
                            "operand `{}` asks for {n} pipeline buffers{}",
                            o.name,
                            if o.space == MemorySpace::Any {
                                " but is an `any` operand, which has no window"
                            } else {
                                ""
                            }
                        ),
                        "Mosaic pipelines a window with one buffer (synchronous) or two (double-buffered)",
                        "use buffered(1) or buffered(2) on a VMEM or SMEM operand",
                    ),
                    o.loc.clone(),
                ));
            }
        }
        for s in &k.scratch {
            if s.dtype == DType::F16 {
                self.errors.push(KernelError::new(
                    unsupported(
                        "f16",
                        format!("scratch `{}` is f16", s.name),
                        F16_WHY,
                        F16_FIX,
                    ),
                    s.loc.clone(),
                ));
            }
        }
    }

    fn region(&mut self, r: &Region) {
        for op in &r.ops {
            self.op(op);
            for inner in op.kind.regions() {
                self.region(inner);
            }
        }
    }

    /// The memory space of a buffer.
    fn space(&self, b: BufferRef) -> Option<MemorySpace> {
        match b {
            BufferRef::Operand(i) => self.k.operands.get(i).map(|o| o.space),
            BufferRef::Scratch(i) => self.k.scratch.get(i).map(|s| s.space),
            BufferRef::Prefetch(_) => Some(MemorySpace::Smem),
        }
    }

    fn name(&self, b: BufferRef) -> String {
        match b {
            BufferRef::Operand(i) => self.k.operands.get(i).map(|o| o.name.clone()),
            BufferRef::Scratch(i) => self.k.scratch.get(i).map(|s| s.name.clone()),
            BufferRef::Prefetch(i) => self.k.prefetch.get(i).map(|p| p.name.clone()),
        }
        .unwrap_or_else(|| "?".into())
    }

    fn op(&mut self, op: &Op) {
        let result = op.results.first().and_then(|&r| self.ty(r)).cloned();
        if !self.f16_op_reported
            && op
                .results
                .iter()
                .any(|&r| self.ty(r).is_some_and(|t| t.dtype == DType::F16))
        {
            self.f16_op_reported = true;
            let kind = unsupported(
                "f16",
                format!("`{}` makes an f16 value", op.kind.mnemonic()),
                F16_WHY,
                F16_FIX,
            );
            self.push(kind, op);
        }
        let is_i8_vector =
            |t: Option<&TileType>| t.is_some_and(|t| t.dtype == DType::I8 && !t.shape.is_empty());
        match &op.kind {
            OpKind::Unary { x, .. } | OpKind::Reduce { x, .. } if is_i8_vector(self.ty(*x)) => {
                self.i8_arith(op)
            }
            OpKind::Binary { lhs, .. } | OpKind::Compare { lhs, .. }
                if is_i8_vector(self.ty(*lhs)) =>
            {
                self.i8_arith(op)
            }
            OpKind::Iota { ty, .. } if ty.dtype == DType::I8 && !ty.shape.is_empty() => {
                self.i8_arith(op)
            }
            _ => {}
        }
        let is_fp8 = |t: Option<&TileType>| t.is_some_and(|t| t.dtype.is_fp8());
        match &op.kind {
            OpKind::Unary { x, .. } | OpKind::Reduce { x, .. } if is_fp8(self.ty(*x)) => {
                self.fp8_arith(op)
            }
            OpKind::Binary { lhs, .. } | OpKind::Compare { lhs, .. } if is_fp8(self.ty(*lhs)) => {
                self.fp8_arith(op)
            }
            OpKind::Iota { ty, .. } if ty.dtype.is_fp8() => self.fp8_arith(op),
            _ => {}
        }
        match &op.kind {
            OpKind::Store {
                buffer,
                mask: Some(_),
                value,
                ..
            } => {
                if let Some(t) = self.ty(*value)
                    && t.dtype != DType::Bool
                    && t.dtype.bits() != 32
                {
                    let kind = unsupported(
                        "masked-store",
                        format!(
                            "a masked store of {} into `{}`",
                            t.dtype,
                            self.name(*buffer)
                        ),
                        "Mosaic masks stores of 32-bit elements only",
                        "load the old block, `select(mask, new, old)` and store it whole, or keep the buffer in f32/i32",
                    );
                    self.push(kind, op);
                }
            }
            OpKind::Binary {
                op: BinaryOp::Rem,
                lhs,
                ..
            } if self
                .ty(*lhs)
                .is_some_and(|t| t.dtype == DType::BF16 && !t.shape.is_empty()) =>
            {
                let kind = unsupported(
                    "bf16-rem",
                    "`%` on bf16 vectors",
                    "Mosaic has no bf16 remainder",
                    "convert to f32 first",
                );
                self.push(kind, op);
            }
            OpKind::Dot { lhs, acc, dims, .. }
                if matches!(self.k.target, crate::Target::V6e | crate::Target::V7x)
                    && self.ty(*lhs).is_some_and(|t| {
                        dims.lhs_contract
                            .iter()
                            .all(|&d| t.shape.get(d) == Some(&1))
                    }) =>
            {
                let kind = unsupported(
                    "dot-k1",
                    format!("a dot contracting over size 1 on {}", self.k.target),
                    "libtpu's 256-wide MXU path miscompiles these outer products (its register allocator and MXU latch checks fail)",
                    "multiply with broadcasts instead (`a.broadcast_to(..) * b.broadcast_to(..)`)",
                );
                self.push(kind, op);
            }
            OpKind::Dot { lhs, acc, .. } => {
                if let Some(t) = self.ty(*lhs)
                    && !matches!(
                        t.dtype,
                        DType::F32
                            | DType::BF16
                            | DType::I8
                            | DType::F16
                            | DType::F8E4M3FN
                            | DType::F8E5M2
                    )
                {
                    let kind = unsupported(
                        "dot-operands",
                        format!("a dot of {} operands", t.dtype),
                        "the MXU multiplies f32, bf16, fp8 and i8",
                        "convert the operands to f32 or bf16 (or i8 with i32 accumulation)",
                    );
                    self.push(kind, op);
                }
                if acc.bits() != 32 {
                    let kind = unsupported(
                        "dot-acc",
                        format!("a dot accumulating in {acc}"),
                        "the MXU accumulates in 32 bits",
                        "accumulate in f32 (or i32 for i8) and convert the result",
                    );
                    self.push(kind, op);
                }
            }
            OpKind::Load {
                buffer, indices, ..
            }
            | OpKind::Store {
                buffer, indices, ..
            } if self.space(*buffer) == Some(MemorySpace::Smem)
                && indices.iter().any(|i| matches!(i, Index::Slice { .. })) =>
            {
                let verb = if matches!(op.kind, OpKind::Load { .. }) {
                    "a vector load from"
                } else {
                    "a vector store to"
                };
                let kind = unsupported(
                    "smem-vector",
                    format!("{verb} `{}`, which lives in SMEM", self.name(*buffer)),
                    "SMEM holds scalars: Mosaic moves vectors only between registers and VMEM",
                    "index every dim with a single element (`t.load([i])`), or put the data in VMEM",
                );
                self.push(kind, op);
            }
            OpKind::For { init, .. } => {
                if init.iter().any(|&v| self.is_bool_vector(v)) {
                    self.bool_carry(op, "a loop carries");
                }
                self.rank1_carry(op, init, "a loop carries");
            }
            OpKind::Select { on_true, .. } => {
                if let Some(t) = self.ty(*on_true).filter(|t| packed_rank1(t)) {
                    let what = format!("a select of rank-1 {} vectors", t.dtype);
                    self.rank1_select(
                        op,
                        what,
                        "work on a [1, n] tile (`.reshape([1, n])`), or select in f32",
                    );
                }
            }
            OpKind::Load { mask: Some(_), .. } => {
                if let Some(t) = result.as_ref().filter(|t| packed_rank1(t)) {
                    let what = format!("a masked load of a rank-1 {} vector", t.dtype);
                    self.rank1_select(
                        op,
                        what,
                        "load it whole and select in f32, or use a 2-D block",
                    );
                }
            }
            OpKind::If { .. } => {
                if op.results.iter().any(|&v| self.is_bool_vector(v)) {
                    self.bool_carry(op, "a branch returns");
                }
                self.rank1_carry(op, &op.results, "a branch returns");
            }
            _ => {}
        }
    }

    fn is_bool_vector(&self, v: crate::ValueId) -> bool {
        self.ty(v)
            .is_some_and(|t| t.dtype == DType::Bool && !t.shape.is_empty())
    }

    fn rank1_select(&mut self, op: &Op, what: String, fix: &str) {
        let kind = unsupported(
            "rank1-select",
            what,
            "Mosaic cannot apply a mask to a packed rank-1 vector (no sublane broadcast)",
            fix,
        );
        self.push(kind, op);
    }

    fn rank1_carry(&mut self, op: &Op, values: &[crate::ValueId], what: &str) {
        if let Some(t) = values
            .iter()
            .filter_map(|&v| self.ty(v))
            .find(|t| t.shape.len() == 1)
        {
            let kind = unsupported(
                "rank1-carry",
                format!("{what} a rank-1 {} vector", t.dtype),
                "Mosaic's layout inference takes rank-1 vectors through loops and branches only in some layouts",
                "carry it as a [1, n] tile (`.reshape([1, n])`) and reshape after",
            );
            self.push(kind, op);
        }
    }

    fn i8_arith(&mut self, op: &Op) {
        let kind = unsupported(
            "i8-arith",
            format!("`{}` on i8 vectors", op.kind.mnemonic()),
            "Mosaic loads, stores, converts, selects, reshapes, transposes and multiplies (dot) i8 vectors, but has no i8 elementwise arithmetic, comparisons, iota or reductions",
            "convert to i32 (or f32) first and back to i8 before storing",
        );
        self.push(kind, op);
    }

    fn fp8_arith(&mut self, op: &Op) {
        let kind = unsupported(
            "fp8-arith",
            format!("`{}` on fp8 values", op.kind.mnemonic()),
            "Mosaic loads, stores, converts, selects, reshapes and multiplies (dot) fp8 vectors on every generation, but has no fp8 elementwise arithmetic, comparisons or reductions",
            "convert to bf16 or f32 first (`.convert(F32)`), and back to fp8 before storing",
        );
        self.push(kind, op);
    }

    fn bool_carry(&mut self, op: &Op, what: &str) {
        let kind = unsupported(
            "bool-carry",
            format!("{what} a bool vector"),
            "Mosaic does not carry i1 vectors through loops or branches",
            "carry it as i32 (`.convert(I32)`) and compare with 0 after",
        );
        self.push(kind, op);
    }
}
