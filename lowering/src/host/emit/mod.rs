//! The host flavor of the kernel module: what the CPU JIT compiles.
//!
//! The TPU-shaped module computes on whole-block vectors (`vector<128x128>`),
//! which LLVM would unroll into tens of thousands of register operations on
//! a CPU. Here a tile is instead either
//!
//! * a **buffer** in the kernel's workspace (a `memref.view` at a static
//!   offset), or
//! * a **lazy expression** over buffers, windows, constants and scalars,
//!   evaluated chunk by chunk (`vector<W>` along the last dim) only where it
//!   is consumed: stored, reduced, fed to a matmul, or used twice. Chains of
//!   elementwise ops, broadcasts and loads therefore fuse into one loop nest.
//!
//! `dot` runs a register-blocked micro-kernel (MR rows × NR lanes of
//! accumulators, `vector.fma` with broadcast lhs elements); `exp` is a
//! polynomial (the libm call LLVM would emit per lane is far slower). The
//! result uses only upstream dialects and lowers with the standard pipeline.

use std::rc::Rc;

use melior::ir::{Block, Type};

use kernel_ir::{
    BinaryOp, BufferRef, CompareOp, DType, Index, IndexValue, Kernel, Op, OpKind, Region, TileType,
    UnaryOp, ValueId,
};

use crate::LoweringError;
use crate::host::tiling::DotTilings;
use crate::lowered_values::LoweredValues;
use crate::mlir::{Ir, Raw};

mod control;
mod dot;
mod fp8;
mod lazy;
mod math;
mod moves;
mod reduce;

/// Lanes of one chunk for `f32`: one AVX-512 register.
const LANES: usize = 16;

/// A lazily evaluated tile.
enum Expr {
    /// A contiguous row-major buffer.
    Buf {
        mem: Raw,
    },
    /// A (sub)window of a kernel buffer: memref dim `m` is read at
    /// `start[m] + idx[out_of[m]]` (or `start[m]` when `out_of[m]` is
    /// `None`).
    Window {
        mem: Raw,
        start: Vec<Raw>,
        out_of: Vec<Option<usize>>,
        /// The memref's last dim has unit stride (vector loads work).
        contiguous: bool,
        /// The load that made it, when its index map is that load's own:
        /// a store to the same site may then overwrite what it reads,
        /// element by element.
        site: Option<Site>,
    },
    Const(f64),
    /// A scalar splat.
    Scalar(Raw),
    /// Element index along `dim`.
    Iota {
        dim: usize,
    },
    Unary(UnaryOp, Rc<Node>),
    Binary(BinaryOp, Rc<Node>, Rc<Node>),
    Compare(CompareOp, Rc<Node>, Rc<Node>),
    Select(Rc<Node>, Rc<Node>, Rc<Node>),
    Convert(Rc<Node>),
    /// The operand's bits read as the node's dtype (same width).
    Bitcast(Rc<Node>),
    /// Output dim `dims[i]` comes from source dim `i` (size 1: broadcast).
    Broadcast {
        src: Rc<Node>,
        dims: Vec<usize>,
    },
    /// Output dim `i` comes from source dim `perm[i]`.
    Transpose {
        src: Rc<Node>,
        perm: Vec<usize>,
    },
    /// Element `i` along `axis` comes from source element `(i - shift) mod n`.
    Roll {
        src: Rc<Node>,
        shift: usize,
        axis: usize,
    },
    /// Element `i` along `axis` is source element `i + start`.
    Slice {
        src: Rc<Node>,
        axis: usize,
        start: usize,
    },
    /// A reshape that only inserts or removes unit dims: output dim `i`
    /// comes from source dim `map[i]` (`None` for an inserted unit dim).
    Squeeze {
        src: Rc<Node>,
        map: Vec<Option<usize>>,
    },
}

/// A buffer and the indices a load or store addresses it with.
type Site = (BufferRef, Vec<Index>);

/// One iteration of a loop carrying values: the block, the induction
/// variable and the carried values in; their next values out.
type CarriedBody<'f, 'c> =
    dyn FnMut(&Block<'c>, Raw, &[Raw]) -> Result<Vec<Raw>, LoweringError> + 'f;

/// What runs at each chunk of a loop nest: the block and the indices.
type ChunkBody<'f, 'c> = dyn FnMut(&Block<'c>, &[Raw]) -> Result<(), LoweringError> + 'f;

/// An expression with its type.
struct Node {
    e: Expr,
    ty: TileType,
}

/// What a kernel value is during emission.
#[derive(Clone)]
enum Val {
    Scalar(Raw),
    Tile(Rc<Node>),
}

/// The host kernel function's arguments.
pub(crate) struct HostArgs {
    pub grid: Vec<Raw>,
    pub prefetch: Vec<Raw>,
    /// One window per operand (an in-out operand reads and writes it).
    pub operands: Vec<Raw>,
    pub scratch: Vec<Raw>,
    pub workspace: Raw,
}

pub(crate) struct HostEmitter<'a, 'c> {
    ir: &'a Ir<'c>,
    k: &'a Kernel,
    args: HostArgs,
    values: LoweredValues<Val>,
    /// Bytes of workspace used so far (buffers are 64-byte aligned).
    pub workspace_bytes: usize,
    /// Walk-order position of every use of every value.
    uses: Vec<Vec<usize>>,
    pos: usize,
    /// The dot micro-kernel's register tile.
    tilings: DotTilings,
}

fn elems(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Lanes per chunk for a last dim of `n` elements.
fn chunk(n: usize) -> usize {
    let mut w = LANES;
    while w > 1 && !n.is_multiple_of(w) {
        w /= 2;
    }
    w.max(1)
}

impl<'a, 'c> HostEmitter<'a, 'c> {
    pub fn new(ir: &'a Ir<'c>, k: &'a Kernel, args: HostArgs, tilings: DotTilings) -> Self {
        let mut uses = vec![Vec::new(); k.body.values.len()];
        let mut pos = 0;
        fn collect(r: &Region, uses: &mut [Vec<usize>], pos: &mut usize) {
            for op in &r.ops {
                *pos += 1;
                for v in op.kind.operands() {
                    if let Some(u) = uses.get_mut(v.index()) {
                        u.push(*pos);
                    }
                }
                for sub in op.kind.regions() {
                    collect(sub, uses, pos);
                    *pos += 1;
                    for y in &sub.yields {
                        if let Some(u) = uses.get_mut(y.index()) {
                            u.push(*pos);
                        }
                    }
                }
            }
        }
        collect(&k.body.region, &mut uses, &mut pos);
        HostEmitter {
            ir,
            k,
            args,
            values: LoweredValues::new(k),
            workspace_bytes: 0,
            uses,
            pos: 0,
            tilings,
        }
    }

    pub fn top(&mut self, block: &Block<'c>) -> Result<(), LoweringError> {
        let r = &self.k.body.region;
        self.region(block, r)?;
        Ok(())
    }

    // ---- small helpers ----

    fn idx(&self, b: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.ir.op1(
            b,
            "arith.constant",
            &[],
            self.ir.index(),
            vec![("value", self.ir.index_attr(v))],
        )
    }

    fn i32c(&self, b: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.ir.op1(
            b,
            "arith.constant",
            &[],
            self.ir.i32(),
            vec![("value", self.ir.i32_attr(v))],
        )
    }

    fn scalar_const(&self, b: &Block<'c>, v: f64, d: DType) -> Result<Raw, LoweringError> {
        let t = self.ir.elem(reg(d));
        let attr = self.lit(v, d, t)?;
        self.ir
            .op1(b, "arith.constant", &[], t, vec![("value", attr)])
    }

    fn vec_ty(&self, w: usize, d: DType) -> Type<'c> {
        self.ir.shaped_vector(&[w], self.ir.elem(reg(d)))
    }

    /// A constant attribute of dtype `d` for register type `ty` (an fp8
    /// value is its f16).
    fn lit(
        &self,
        v: f64,
        d: DType,
        ty: Type<'c>,
    ) -> Result<melior::ir::Attribute<'c>, LoweringError> {
        self.ir.literal(d.round(v), reg(d), ty)
    }

    fn splat(&self, b: &Block<'c>, s: Raw, w: usize, d: DType) -> Result<Raw, LoweringError> {
        self.ir
            .op1(b, "vector.broadcast", &[s], self.vec_ty(w, d), Vec::new())
    }

    /// The dtype a value of `d` has in memory: bools are bytes, because
    /// LLVM packs `vector<N x i1>` into bits while memref indexing counts
    /// elements.
    fn mem_dtype(d: DType) -> DType {
        super::host_dtype(d)
    }

    fn load_scalar(
        &self,
        b: &Block<'c>,
        mem: Raw,
        at: &[Raw],
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let mut ops = vec![mem];
        ops.extend(at);
        let s = ir.op1(
            b,
            "memref.load",
            &ops,
            ir.elem(Self::mem_dtype(d)),
            Vec::new(),
        )?;
        if d == DType::Bool {
            return ir.op1(b, "arith.trunci", &[s], ir.elem(d), Vec::new());
        }
        if d.is_fp8() {
            let v = self.splat(b, s, 1, DType::I8)?;
            let v = self.fp8_decode(b, v, d, 1)?;
            return self.lane0(b, v, d);
        }
        Ok(s)
    }

    fn load_vec(
        &self,
        b: &Block<'c>,
        mem: Raw,
        at: &[Raw],
        w: usize,
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let mut ops = vec![mem];
        ops.extend(at);
        let v = ir.op1(
            b,
            "vector.load",
            &ops,
            self.vec_ty(w, Self::mem_dtype(d)),
            Vec::new(),
        )?;
        if d == DType::Bool {
            return ir.op1(b, "arith.trunci", &[v], self.vec_ty(w, d), Vec::new());
        }
        if d.is_fp8() {
            return self.fp8_decode(b, v, d, w);
        }
        Ok(v)
    }

    fn store_scalar(
        &self,
        b: &Block<'c>,
        s: Raw,
        mem: Raw,
        at: &[Raw],
        d: DType,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let s = if d == DType::Bool {
            ir.op1(b, "arith.extui", &[s], ir.elem(DType::I8), Vec::new())?
        } else if d.is_fp8() {
            let v = self.splat(b, s, 1, d)?;
            let v = self.convert_vec(b, v, d, DType::F32, 1)?;
            let v = self.fp8_encode(b, v, d, 1)?;
            self.lane0(b, v, DType::I8)?
        } else {
            s
        };
        let mut ops = vec![s, mem];
        ops.extend(at);
        ir.op(b, "memref.store", &ops, &[], Vec::new(), Vec::new())?;
        Ok(())
    }

    fn store_vec(
        &self,
        b: &Block<'c>,
        v: Raw,
        mem: Raw,
        at: &[Raw],
        w: usize,
        d: DType,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let v = if d == DType::Bool {
            ir.op1(
                b,
                "arith.extui",
                &[v],
                self.vec_ty(w, DType::I8),
                Vec::new(),
            )?
        } else if d.is_fp8() {
            let f = self.convert_vec(b, v, d, DType::F32, w)?;
            self.fp8_encode(b, f, d, w)?
        } else {
            v
        };
        let mut ops = vec![v, mem];
        ops.extend(at);
        ir.op(b, "vector.store", &ops, &[], Vec::new(), Vec::new())?;
        Ok(())
    }

    /// Lane 0 of a vector as a scalar.
    fn lane0(&self, b: &Block<'c>, v: Raw, d: DType) -> Result<Raw, LoweringError> {
        self.ir.op1(
            b,
            "vector.extract",
            &[v],
            self.ir.elem(reg(d)),
            vec![("static_position", self.ir.i64_array(&[0]))],
        )
    }

    /// Lane 0 of a vector broadcast to `w` lanes.
    fn lane0_splat(&self, b: &Block<'c>, v: Raw, w: usize, d: DType) -> Result<Raw, LoweringError> {
        let s = self.lane0(b, v, d)?;
        self.splat(b, s, w, d)
    }

    fn v(&self, id: ValueId) -> Result<Val, LoweringError> {
        self.values.get(id)
    }

    fn ty(&self, id: ValueId) -> TileType {
        self.k.body.values[id.index()].clone()
    }

    fn set(&mut self, id: ValueId, v: Val) {
        self.values.set(id, v);
    }

    fn node(&self, id: ValueId) -> Result<Rc<Node>, LoweringError> {
        match self.v(id)? {
            Val::Tile(n) => Ok(n),
            Val::Scalar(s) => Ok(Rc::new(Node {
                e: Expr::Scalar(s),
                ty: self.ty(id),
            })),
        }
    }

    fn scalar(&self, id: ValueId) -> Result<Raw, LoweringError> {
        match self.v(id)? {
            Val::Scalar(s) => Ok(s),
            Val::Tile(_) => Err(LoweringError::Internal(format!(
                "%{} is not a scalar",
                id.0
            ))),
        }
    }

    /// A new workspace buffer of `ty`.
    fn alloc(&mut self, b: &Block<'c>, ty: &TileType) -> Result<Raw, LoweringError> {
        let bytes = elems(&ty.shape).max(1) * ty.dtype.bytes();
        let offset = self.workspace_bytes;
        self.workspace_bytes += bytes.div_ceil(64) * 64;
        let off = self.idx(b, offset as i64)?;
        let mt = self
            .ir
            .memref(&ty.shape, Self::mem_dtype(ty.dtype), None, None);
        self.ir.op1(
            b,
            "memref.view",
            &[self.args.workspace, off],
            mt,
            Vec::new(),
        )
    }

    // ---- regions and ops ----

    fn region(&mut self, b: &Block<'c>, r: &Region) -> Result<Vec<Val>, LoweringError> {
        for op in &r.ops {
            self.pos += 1;
            self.op(b, op)?;
        }
        self.pos += 1;
        r.yields.iter().map(|y| self.v(*y)).collect()
    }

    fn lazy(&mut self, id: ValueId, e: Expr) {
        let ty = self.ty(id);
        self.set(id, Val::Tile(Rc::new(Node { e, ty })));
    }

    fn op(&mut self, b: &Block<'c>, op: &Op) -> Result<(), LoweringError> {
        let ir = self.ir;
        let res = op.results.first().copied();
        match &op.kind {
            OpKind::DmaWaitSend(_)
            | OpKind::DeviceId
            | OpKind::AxisIndex { .. }
            | OpKind::RemoteSignal { .. } => {
                return Err(crate::reached_single_device(op, "host"));
            }
            OpKind::DmaStart(_)
            | OpKind::DmaWait(_)
            | OpKind::SemSignal { .. }
            | OpKind::SemWait { .. }
            | OpKind::SemRead { .. }
            | OpKind::Scope { .. } => {
                return Err(crate::removed_by_synchronous_pass(op, "host lowering"));
            }
            OpKind::Constant { value, ty } => {
                let r = res.ok_or_else(|| LoweringError::Internal("constant".into()))?;
                if ty.shape.is_empty() {
                    let s = self.scalar_const(b, value.as_f64(), ty.dtype)?;
                    self.set(r, Val::Scalar(s));
                } else {
                    self.lazy(r, Expr::Const(value.as_f64()));
                }
            }
            OpKind::ProgramId { dim } => {
                let g = self.args.grid[*dim];
                self.set(op.results[0], Val::Scalar(g));
            }
            OpKind::NumPrograms { dim } => {
                let c = self.i32c(b, self.k.grid.dims[*dim].bound as i64)?;
                self.set(op.results[0], Val::Scalar(c));
            }
            OpKind::Iota { dim, .. } => self.lazy(op.results[0], Expr::Iota { dim: *dim }),
            OpKind::Load {
                buffer,
                indices,
                mask,
            } => {
                let r = op.results[0];
                let rt = self.ty(r);
                let mem = self.buffer(*buffer);
                let (start, out_of) = self.starts(b, *buffer, indices)?;
                if rt.shape.is_empty() {
                    let s = self.load_scalar(b, mem, &start, rt.dtype)?;
                    let s = match mask {
                        Some(m) => {
                            let zero = self.scalar_const(b, 0.0, rt.dtype)?;
                            ir.op1(
                                b,
                                "arith.select",
                                &[self.scalar(*m)?, s, zero],
                                ir.elem(reg(rt.dtype)),
                                Vec::new(),
                            )?
                        }
                        None => s,
                    };
                    self.set(r, Val::Scalar(s));
                    return Ok(());
                }
                // Vector loads apply when the memref's unit-stride last dim
                // is the tile's last dim.
                let contiguous = out_of.last() == Some(&Some(rt.shape.len() - 1));
                let window = Expr::Window {
                    mem,
                    start,
                    out_of,
                    contiguous,
                    site: Some((*buffer, indices.clone())),
                };
                let e = match mask {
                    Some(m) => Expr::Select(
                        self.node(*m)?,
                        Rc::new(Node {
                            e: window,
                            ty: rt.clone(),
                        }),
                        Rc::new(Node {
                            e: Expr::Const(0.0),
                            ty: rt.clone(),
                        }),
                    ),
                    None => window,
                };
                self.lazy(r, e);
                self.maybe_materialize(b, r)?;
            }
            OpKind::Store {
                buffer,
                indices,
                value,
                mask,
            } => self.store(b, *buffer, indices, *value, *mask)?,
            OpKind::Unary { op: u, x } => {
                self.elementwise(b, op, Expr::Unary(*u, self.node(*x)?))?
            }
            OpKind::Binary { op: bo, lhs, rhs } => {
                self.elementwise(b, op, Expr::Binary(*bo, self.node(*lhs)?, self.node(*rhs)?))?
            }
            OpKind::Compare { op: c, lhs, rhs } => {
                self.elementwise(b, op, Expr::Compare(*c, self.node(*lhs)?, self.node(*rhs)?))?
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => self.elementwise(
                b,
                op,
                Expr::Select(
                    self.node(*cond)?,
                    self.node(*on_true)?,
                    self.node(*on_false)?,
                ),
            )?,
            OpKind::Convert { x, .. } => self.elementwise(b, op, Expr::Convert(self.node(*x)?))?,
            OpKind::Bitcast { x, .. } => self.elementwise(b, op, Expr::Bitcast(self.node(*x)?))?,
            OpKind::BroadcastInDim { x, dims, .. } => {
                let src = self.node(*x)?;
                self.lazy(
                    op.results[0],
                    Expr::Broadcast {
                        src,
                        dims: dims.clone(),
                    },
                );
                self.maybe_materialize(b, op.results[0])?;
            }
            OpKind::Reshape { x, shape } => {
                let from = self.ty(*x);
                let r = op.results[0];
                if shape.is_empty() {
                    // To a scalar: the single element.
                    let n = self.node(*x)?;
                    let zeros: Vec<Raw> = (0..from.shape.len())
                        .map(|_| self.idx(b, 0))
                        .collect::<Result<_, _>>()?;
                    let v = self.eval(b, &n, &zeros, 1)?;
                    let s = self.lane0(b, v, from.dtype)?;
                    self.set(r, Val::Scalar(s));
                } else if let Some(map) = squeeze_map(&from.shape, shape) {
                    self.lazy(
                        r,
                        Expr::Squeeze {
                            src: self.node(*x)?,
                            map,
                        },
                    );
                } else {
                    // A general reshape: the same bytes seen with a new shape.
                    let n = self.node(*x)?;
                    let mem = self.materialize(b, &n)?;
                    let out = self.reshape_buf(b, mem, shape, from.dtype)?;
                    self.lazy(r, Expr::Buf { mem: out });
                }
            }
            OpKind::Transpose { x, perm } => {
                let t = Self::permuted(&self.node(*x)?, perm);
                self.set(op.results[0], Val::Tile(t));
                self.maybe_materialize(b, op.results[0])?;
            }
            OpKind::Roll { x, shift, axis } => self.roll(b, op.results[0], *x, *shift, *axis)?,
            OpKind::Slice { x, axis, start, .. } => {
                self.slice(b, op.results[0], *x, *axis, *start)?
            }
            OpKind::Concat { lhs, rhs, axis } => {
                self.concat(b, op.results[0], *lhs, *rhs, *axis)?
            }
            OpKind::Reduce { op: r, x, axes } => self.reduce(b, op.results[0], *r, *x, axes)?,
            OpKind::Dot {
                lhs,
                rhs,
                dims,
                acc,
            } => self.dot(b, op.results[0], *lhs, *rhs, dims, *acc)?,
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                ..
            } => self.for_loop(b, op, lower, upper, *step, init, body)?,
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => self.conditional(b, op, *cond, then_region, else_region)?,
        }
        Ok(())
    }

    /// The start of each indexed dim of an access to `bref`, and for each
    /// dim which tile dim it comes from (`None` for a point index).
    ///
    /// A dynamic start is clamped into the buffer (as XLA's `dynamic_slice`
    /// does): the interpreter reports an out-of-range start as an error,
    /// native code must never touch memory outside the window.
    #[allow(clippy::type_complexity)]
    fn starts(
        &self,
        b: &Block<'c>,
        bref: BufferRef,
        indices: &[Index],
    ) -> Result<(Vec<Raw>, Vec<Option<usize>>), LoweringError> {
        let ir = self.ir;
        let dims: Vec<usize> = self
            .k
            .buffer(bref)
            .map(|(_, _, s)| s.to_vec())
            .unwrap_or_default();
        let mut start = Vec::new();
        let mut out_of = Vec::new();
        let mut kept = 0usize;
        for (d, ix) in indices.iter().enumerate() {
            let (s, len, keep) = match ix {
                Index::Slice { start, len } => (start, *len, true),
                Index::Point(start) => (start, 1, false),
            };
            let mut v = self.index_value(b, s)?;
            if matches!(s, IndexValue::Dynamic(_)) {
                let hi = dims.get(d).copied().unwrap_or(len).saturating_sub(len);
                let zero = self.idx(b, 0)?;
                let hi = self.idx(b, hi as i64)?;
                v = ir.op1(b, "arith.maxsi", &[v, zero], ir.index(), Vec::new())?;
                v = ir.op1(b, "arith.minsi", &[v, hi], ir.index(), Vec::new())?;
            }
            start.push(v);
            out_of.push(keep.then(|| {
                kept += 1;
                kept - 1
            }));
        }
        Ok((start, out_of))
    }

    fn index_value(&self, b: &Block<'c>, iv: &IndexValue) -> Result<Raw, LoweringError> {
        match iv {
            IndexValue::Static(s) => self.idx(b, *s),
            IndexValue::Dynamic(v) => self.ir.op1(
                b,
                "arith.index_cast",
                &[self.scalar(*v)?],
                self.ir.index(),
                Vec::new(),
            ),
        }
    }

    /// The memref argument of a buffer (its last dim has unit stride).
    fn buffer(&self, bref: BufferRef) -> Raw {
        match bref {
            BufferRef::Operand(i) => self.args.operands[i],
            BufferRef::Scratch(i) => self.args.scratch[i],
            BufferRef::Prefetch(i) => self.args.prefetch[i],
        }
    }
}

/// Strides of a row-major array.
pub(crate) fn row_major_strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as i64;
    }
    s
}

/// When `to` is `from` with unit dims inserted or removed, the source dim
/// of each output dim.
fn squeeze_map(from: &[usize], to: &[usize]) -> Option<Vec<Option<usize>>> {
    let real_from: Vec<(usize, usize)> = from
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, d)| *d != 1)
        .collect();
    let real_to: Vec<usize> = to.iter().copied().filter(|d| *d != 1).collect();
    if real_from.iter().map(|(_, d)| *d).collect::<Vec<_>>() != real_to {
        return None;
    }
    let mut it = real_from.into_iter();
    Some(
        to.iter()
            .map(|&d| {
                if d == 1 {
                    None
                } else {
                    it.next().map(|(i, _)| i)
                }
            })
            .collect(),
    )
}

/// Types that compute in f32 and round once per op: the half floats and
/// fp8 (held as f16, see `fp8`).
fn is_half(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16) || d.is_fp8()
}

/// The type a value of `d` has in registers: an fp8 value is its f16.
fn reg(d: DType) -> DType {
    if d.is_fp8() { DType::F16 } else { d }
}
