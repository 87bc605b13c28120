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
    BinaryOp, BufferRef, CompareOp, DType, DotDims, Index, IndexValue, Kernel, Op, OpKind,
    ReduceOp, Region, TileType, UnaryOp, ValueId,
};

use crate::LoweringError;
use crate::lowered_values::LoweredValues;
use crate::mlir::{Ir, Raw};

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
    /// A reshape that only inserts or removes unit dims: output dim `i`
    /// comes from source dim `map[i]` (`None` for an inserted unit dim).
    Squeeze {
        src: Rc<Node>,
        map: Vec<Option<usize>>,
    },
}

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
    /// For each operand whose layout is not row-major, its logical dims in
    /// physical major-to-minor order: the window memref is in that order,
    /// with unit stride on its last dim.
    physical: Vec<Option<Vec<usize>>>,
    values: LoweredValues<Val>,
    /// Bytes of workspace used so far (buffers are 64-byte aligned).
    pub workspace_bytes: usize,
    /// Walk-order position of every use of every value.
    uses: Vec<Vec<usize>>,
    pos: usize,
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
    pub fn new(
        ir: &'a Ir<'c>,
        k: &'a Kernel,
        args: HostArgs,
        physical: Vec<Option<Vec<usize>>>,
    ) -> Self {
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
            physical,
            values: LoweredValues::new(k),
            workspace_bytes: 0,
            uses,
            pos: 0,
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
        let t = self.ir.elem(d);
        let attr = self.ir.literal(v, d, t)?;
        self.ir
            .op1(b, "arith.constant", &[], t, vec![("value", attr)])
    }

    fn vec_ty(&self, w: usize, d: DType) -> Type<'c> {
        self.ir.shaped_vector(&[w], self.ir.elem(d))
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
            self.ir.elem(d),
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
                                ir.elem(rt.dtype),
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
                self.lazy(
                    op.results[0],
                    Expr::Transpose {
                        src: self.node(*x)?,
                        perm: perm.clone(),
                    },
                );
                self.maybe_materialize(b, op.results[0])?;
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
        if let BufferRef::Operand(i) = bref
            && let Some(Some(order)) = self.physical.get(i)
        {
            // The window memref is in physical order.
            start = order.iter().map(|&d| start[d]).collect();
            out_of = order.iter().map(|&d| out_of[d]).collect();
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

    fn elementwise(&mut self, b: &Block<'c>, op: &Op, e: Expr) -> Result<(), LoweringError> {
        let r = op.results[0];
        if self.ty(r).shape.is_empty() {
            // Scalars compute now, with chunks of one lane.
            let n = Rc::new(Node { e, ty: self.ty(r) });
            let v = self.eval(b, &n, &[], 1)?;
            let s = self.lane0(b, v, n.ty.dtype)?;
            self.set(r, Val::Scalar(s));
            return Ok(());
        }
        self.lazy(r, e);
        self.maybe_materialize(b, r)
    }

    /// Values used more than once are computed once, into a buffer, unless
    /// they are cheap to recompute.
    fn maybe_materialize(&mut self, b: &Block<'c>, r: ValueId) -> Result<(), LoweringError> {
        let uses = self.uses.get(r.index()).map_or(0, Vec::len);
        let Val::Tile(n) = self.v(r)? else {
            return Ok(());
        };
        let cheap = matches!(
            n.e,
            Expr::Buf { .. }
                | Expr::Const(_)
                | Expr::Scalar(_)
                | Expr::Iota { .. }
                | Expr::Window { .. }
        ) || matches!(&n.e, Expr::Broadcast { src, .. } | Expr::Squeeze { src, .. } if matches!(src.e, Expr::Buf { .. } | Expr::Const(_) | Expr::Scalar(_)));
        if uses > 1 && !cheap {
            let mem = self.materialize(b, &n)?;
            self.set(
                r,
                Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem },
                    ty: n.ty.clone(),
                })),
            );
        }
        Ok(())
    }

    /// Does an expression read memref `mem`?
    fn reads(n: &Node, mem: Raw) -> bool {
        match &n.e {
            Expr::Window { mem: m, .. } => m.ptr == mem.ptr,
            Expr::Buf { .. } | Expr::Const(_) | Expr::Scalar(_) | Expr::Iota { .. } => false,
            Expr::Unary(_, a) | Expr::Convert(a) => Self::reads(a, mem),
            Expr::Broadcast { src, .. }
            | Expr::Transpose { src, .. }
            | Expr::Squeeze { src, .. } => Self::reads(src, mem),
            Expr::Binary(_, a, c) | Expr::Compare(_, a, c) => {
                Self::reads(a, mem) || Self::reads(c, mem)
            }
            Expr::Select(a, c, d) => {
                Self::reads(a, mem) || Self::reads(c, mem) || Self::reads(d, mem)
            }
        }
    }

    /// Before memref `mem` is written, every lazy value that reads it and is
    /// still needed is computed into a buffer.
    fn freeze_readers(&mut self, b: &Block<'c>, mem: Raw) -> Result<(), LoweringError> {
        for i in 0..self.values.slots.len() {
            let Some(Val::Tile(n)) = self.values.slots[i].clone() else {
                continue;
            };
            if matches!(n.e, Expr::Buf { .. }) || !Self::reads(&n, mem) {
                continue;
            }
            let later = self.uses[i].iter().any(|&u| u > self.pos);
            if later {
                let m = self.materialize(b, &n)?;
                self.values.slots[i] = Some(Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem: m },
                    ty: n.ty.clone(),
                })));
            }
        }
        Ok(())
    }

    // ---- evaluation ----

    /// The value of `n` at `idx` (one index per dim; the last is the first
    /// of `w` lanes), as `vector<w x T>`.
    fn eval(&self, b: &Block<'c>, n: &Node, idx: &[Raw], w: usize) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let d = n.ty.dtype;
        let vty = self.vec_ty(w, d);
        let rank = n.ty.shape.len();
        Ok(match &n.e {
            Expr::Const(v) => {
                let attr = ir.literal(*v, d, vty)?;
                ir.op1(b, "arith.constant", &[], vty, vec![("value", attr)])?
            }
            Expr::Scalar(s) => self.splat(b, *s, w, d)?,
            Expr::Buf { mem } => {
                if rank == 0 {
                    let s = self.load_scalar(b, *mem, &[], d)?;
                    self.splat(b, s, w, d)?
                } else {
                    self.load_vec(b, *mem, idx, w, d)?
                }
            }
            Expr::Window {
                mem,
                start,
                out_of,
                contiguous,
            } => {
                let mut at = Vec::new();
                for (m, s) in start.iter().enumerate() {
                    at.push(match out_of[m] {
                        Some(o) => {
                            ir.op1(b, "arith.addi", &[*s, idx[o]], ir.index(), Vec::new())?
                        }
                        None => *s,
                    });
                }
                if *contiguous && w > 1 {
                    self.load_vec(b, *mem, &at, w, d)?
                } else if w == 1 {
                    let s = self.load_scalar(b, *mem, &at, d)?;
                    self.splat(b, s, 1, d)?
                } else {
                    // Lane by lane: the last output dim is not unit stride.
                    let last = out_of.iter().position(|o| *o == Some(rank - 1));
                    let mut v = ir.op1(
                        b,
                        "arith.constant",
                        &[],
                        vty,
                        vec![("value", ir.literal(0.0, d, vty)?)],
                    )?;
                    for lane in 0..w {
                        let mut ops = Vec::new();
                        for (m, a) in at.iter().enumerate() {
                            if Some(m) == last {
                                let l = self.idx(b, lane as i64)?;
                                ops.push(ir.op1(
                                    b,
                                    "arith.addi",
                                    &[*a, l],
                                    ir.index(),
                                    Vec::new(),
                                )?);
                            } else {
                                ops.push(*a);
                            }
                        }
                        let s = self.load_scalar(b, *mem, &ops, d)?;
                        v = ir.op1(
                            b,
                            "vector.insert",
                            &[s, v],
                            vty,
                            vec![("static_position", ir.i64_array(&[lane as i64]))],
                        )?;
                    }
                    v
                }
            }
            Expr::Iota { dim } => {
                let i32v = self.vec_ty(w, DType::I32);
                let ints = if *dim == rank - 1 {
                    let step = ir.op1(
                        b,
                        "vector.step",
                        &[],
                        ir.shaped_vector(&[w], ir.index()),
                        Vec::new(),
                    )?;
                    let base = ir.op1(
                        b,
                        "vector.broadcast",
                        &[idx[*dim]],
                        ir.shaped_vector(&[w], ir.index()),
                        Vec::new(),
                    )?;
                    let s = ir.op1(
                        b,
                        "arith.addi",
                        &[base, step],
                        ir.shaped_vector(&[w], ir.index()),
                        Vec::new(),
                    )?;
                    ir.op1(b, "arith.index_cast", &[s], i32v, Vec::new())?
                } else {
                    let s = ir.op1(b, "arith.index_cast", &[idx[*dim]], ir.i32(), Vec::new())?;
                    self.splat(b, s, w, DType::I32)?
                };
                self.convert_vec(b, ints, DType::I32, d, w)?
            }
            Expr::Unary(u, a) => {
                let x = self.eval(b, a, idx, w)?;
                self.unary(b, *u, x, d, w)?
            }
            Expr::Binary(op, a, c) => {
                let x = self.eval(b, a, idx, w)?;
                let y = self.eval(b, c, idx, w)?;
                self.binary(b, *op, x, y, d, w)?
            }
            Expr::Compare(c, a, e) => {
                let mut od = a.ty.dtype;
                let mut x = self.eval(b, a, idx, w)?;
                let mut y = self.eval(b, e, idx, w)?;
                if is_half(od) {
                    x = self.convert_vec(b, x, od, DType::F32, w)?;
                    y = self.convert_vec(b, y, od, DType::F32, w)?;
                    od = DType::F32;
                }
                let (name, pred) = crate::body::compare_predicate(*c, od);
                ir.op1(
                    b,
                    name,
                    &[x, y],
                    vty,
                    vec![("predicate", ir.i64_attr(pred))],
                )?
            }
            Expr::Select(c, t, f) => {
                let cv = self.eval(b, c, idx, w)?;
                let tv = self.eval(b, t, idx, w)?;
                let fv = self.eval(b, f, idx, w)?;
                ir.op1(b, "arith.select", &[cv, tv, fv], vty, Vec::new())?
            }
            Expr::Convert(a) => {
                let x = self.eval(b, a, idx, w)?;
                self.convert_vec(b, x, a.ty.dtype, d, w)?
            }
            Expr::Broadcast { src, dims } => {
                let srank = src.ty.shape.len();
                let zero = self.idx(b, 0)?;
                let mut sidx = Vec::with_capacity(srank);
                for (i, &od) in dims.iter().enumerate() {
                    sidx.push(if src.ty.shape[i] == 1 { zero } else { idx[od] });
                }
                let vectorized =
                    srank > 0 && dims[srank - 1] == rank - 1 && src.ty.shape[srank - 1] != 1;
                if vectorized {
                    self.eval(b, src, &sidx, w)?
                } else {
                    let one = self.eval(b, src, &sidx, 1)?;
                    self.lane0_splat(b, one, w, d)?
                }
            }
            Expr::Squeeze { src, map } => {
                let srank = src.ty.shape.len();
                let zero = self.idx(b, 0)?;
                let mut sidx = vec![zero; srank];
                for (o, m) in map.iter().enumerate() {
                    if let Some(s) = m {
                        sidx[*s] = idx[o];
                    }
                }
                let vectorized = srank > 0
                    && map.get(rank - 1).copied().flatten() == Some(srank - 1)
                    && src.ty.shape[srank - 1] > 1;
                if vectorized || w == 1 {
                    self.eval(b, src, &sidx, w)?
                } else {
                    let one = self.eval(b, src, &sidx, 1)?;
                    self.lane0_splat(b, one, w, d)?
                }
            }
            Expr::Transpose { src, perm } => {
                let srank = src.ty.shape.len();
                let mut sidx = vec![idx[0]; srank];
                for (i, &p) in perm.iter().enumerate() {
                    sidx[p] = idx[i];
                }
                if perm[rank - 1] == srank - 1 {
                    self.eval(b, src, &sidx, w)?
                } else {
                    // Lane by lane along the source dim that becomes last.
                    let src_dim = perm[rank - 1];
                    let mut v = ir.op1(
                        b,
                        "arith.constant",
                        &[],
                        vty,
                        vec![("value", ir.literal(0.0, d, vty)?)],
                    )?;
                    for lane in 0..w {
                        let mut li = sidx.clone();
                        let l = self.idx(b, lane as i64)?;
                        li[src_dim] =
                            ir.op1(b, "arith.addi", &[sidx[src_dim], l], ir.index(), Vec::new())?;
                        let one = self.eval(b, src, &li, 1)?;
                        let s = self.lane0(b, one, d)?;
                        v = ir.op1(
                            b,
                            "vector.insert",
                            &[s, v],
                            vty,
                            vec![("static_position", ir.i64_array(&[lane as i64]))],
                        )?;
                    }
                    v
                }
            }
        })
    }

    /// Loops over `shape` (the last dim in chunks of `w`), calling `body`
    /// with the block and the indices.
    fn for_each_chunk(
        &self,
        b: &Block<'c>,
        shape: &[usize],
        w: usize,
        body: &mut ChunkBody<'_, 'c>,
    ) -> Result<(), LoweringError> {
        self.nest(b, shape, w, 0, &mut Vec::new(), body)
    }

    fn nest(
        &self,
        b: &Block<'c>,
        shape: &[usize],
        w: usize,
        d: usize,
        idx: &mut Vec<Raw>,
        body: &mut ChunkBody<'_, 'c>,
    ) -> Result<(), LoweringError> {
        if d == shape.len() {
            return body(b, idx);
        }
        let step = if d + 1 == shape.len() { w } else { 1 };
        if shape[d] == step {
            idx.push(self.idx(b, 0)?);
            let r = self.nest(b, shape, w, d + 1, idx, body);
            idx.pop();
            return r;
        }
        let ir = self.ir;
        let lo = self.idx(b, 0)?;
        let hi = self.idx(b, shape[d] as i64)?;
        let st = self.idx(b, step as i64)?;
        let inner = ir.block(&[ir.index()]);
        let iv = ir.args(&inner)[0];
        idx.push(iv);
        let r = self.nest(&inner, shape, w, d + 1, idx, body);
        idx.pop();
        r?;
        ir.op(&inner, "scf.yield", &[], &[], Vec::new(), Vec::new())?;
        ir.op(
            b,
            "scf.for",
            &[lo, hi, st],
            &[],
            Vec::new(),
            vec![ir.region(inner)],
        )?;
        Ok(())
    }

    /// Computes `n` into a new buffer.
    fn materialize(&mut self, b: &Block<'c>, n: &Node) -> Result<Raw, LoweringError> {
        if let Expr::Buf { mem } = n.e {
            return Ok(mem);
        }
        let mem = self.alloc(b, &n.ty)?;
        self.write(b, n, mem)?;
        Ok(mem)
    }

    /// Writes `n` into a buffer of its shape.
    fn write(&self, b: &Block<'c>, n: &Node, mem: Raw) -> Result<(), LoweringError> {
        let w = chunk(*n.ty.shape.last().unwrap_or(&1));
        self.for_each_chunk(b, &n.ty.shape.clone(), w, &mut |blk, idx| {
            let v = self.eval(blk, n, idx, w)?;
            self.store_vec(blk, v, mem, idx, w, n.ty.dtype)
        })
    }

    fn store(
        &mut self,
        b: &Block<'c>,
        bref: BufferRef,
        indices: &[Index],
        value: ValueId,
        mask: Option<ValueId>,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let mem = self.buffer(bref);
        self.freeze_readers(b, mem)?;
        let (start, out_of) = self.starts(b, bref, indices)?;
        let vt = self.ty(value);
        if vt.shape.is_empty() {
            let mut s = self.scalar(value)?;
            if let Some(m) = mask {
                let old = self.load_scalar(b, mem, &start, vt.dtype)?;
                s = ir.op1(
                    b,
                    "arith.select",
                    &[self.scalar(m)?, s, old],
                    ir.elem(vt.dtype),
                    Vec::new(),
                )?;
            }
            return self.store_scalar(b, s, mem, &start, vt.dtype);
        }
        let mut n = self.node(value)?;
        if Self::reads(&n, mem) {
            // The value reads the buffer it overwrites: compute it first.
            let m = self.materialize(b, &n)?;
            n = Rc::new(Node {
                e: Expr::Buf { mem: m },
                ty: n.ty.clone(),
            });
        }
        let mask = match mask {
            Some(m) => Some(self.node(m)?),
            None => None,
        };
        let rank = vt.shape.len();
        let vector_ok = out_of.last() == Some(&Some(rank - 1));
        let w = if vector_ok {
            chunk(vt.shape[rank - 1])
        } else {
            1
        };
        let d = vt.dtype;
        self.for_each_chunk(b, &vt.shape, w, &mut |blk, idx| {
            let mut at = Vec::new();
            for (m, s) in start.iter().enumerate() {
                at.push(match out_of[m] {
                    Some(o) => ir.op1(blk, "arith.addi", &[*s, idx[o]], ir.index(), Vec::new())?,
                    None => *s,
                });
            }
            let mut v = self.eval(blk, &n, idx, w)?;
            if let Some(mk) = &mask {
                let mv = self.eval(blk, mk, idx, w)?;
                let old = if w > 1 {
                    self.load_vec(blk, mem, &at, w, d)?
                } else {
                    let s = self.load_scalar(blk, mem, &at, d)?;
                    self.splat(blk, s, 1, d)?
                };
                v = ir.op1(
                    blk,
                    "arith.select",
                    &[mv, v, old],
                    self.vec_ty(w, d),
                    Vec::new(),
                )?;
            }
            if w > 1 {
                self.store_vec(blk, v, mem, &at, w, d)
            } else {
                let s = self.lane0(blk, v, d)?;
                self.store_scalar(blk, s, mem, &at, d)
            }
        })
    }

    // ---- arithmetic ----

    fn convert_vec(
        &self,
        b: &Block<'c>,
        x: Raw,
        from: DType,
        to: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        crate::body::convert_values(self.ir, b, x, &[w], from, to)
    }

    fn unary(
        &self,
        b: &Block<'c>,
        u: UnaryOp,
        x: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        if is_half(d) {
            // Half floats compute in f32 and round once per op, as the
            // interpreter does (and LLVM has no native bf16 arithmetic).
            let x = self.convert_vec(b, x, d, DType::F32, w)?;
            let y = self.unary(b, u, x, DType::F32, w)?;
            return self.convert_vec(b, y, DType::F32, d, w);
        }
        let ir = self.ir;
        let ty = self.vec_ty(w, d);
        let c = |v: f64| -> Result<Raw, LoweringError> {
            ir.op1(
                b,
                "arith.constant",
                &[],
                ty,
                vec![("value", ir.literal(v, d, ty)?)],
            )
        };
        let simple = |name: &str| ir.op1(b, name, &[x], ty, Vec::new());
        match u {
            UnaryOp::Neg if d.is_float() => simple("arith.negf"),
            UnaryOp::Neg => {
                let z = c(0.0)?;
                ir.op1(b, "arith.subi", &[z, x], ty, Vec::new())
            }
            UnaryOp::Abs if d.is_float() => simple("math.absf"),
            UnaryOp::Abs => simple("math.absi"),
            UnaryOp::Exp => self.exp(b, x, d, w),
            UnaryOp::Exp2 => {
                let ln2 = c(std::f64::consts::LN_2)?;
                let y = ir.op1(b, "arith.mulf", &[x, ln2], ty, Vec::new())?;
                self.exp(b, y, d, w)
            }
            UnaryOp::Logistic => {
                let n = simple("arith.negf")?;
                let e = self.exp(b, n, d, w)?;
                let one = c(1.0)?;
                let den = ir.op1(b, "arith.addf", &[one, e], ty, Vec::new())?;
                ir.op1(b, "arith.divf", &[one, den], ty, Vec::new())
            }
            UnaryOp::Rsqrt => {
                let s = simple("math.sqrt")?;
                let one = c(1.0)?;
                ir.op1(b, "arith.divf", &[one, s], ty, Vec::new())
            }
            UnaryOp::Log => simple("math.log"),
            UnaryOp::Log1p => simple("math.log1p"),
            UnaryOp::Tanh => simple("math.tanh"),
            UnaryOp::Sqrt => simple("math.sqrt"),
            UnaryOp::Sin => simple("math.sin"),
            UnaryOp::Cos => simple("math.cos"),
            UnaryOp::Erf => simple("math.erf"),
            UnaryOp::Floor => simple("math.floor"),
            UnaryOp::Ceil => simple("math.ceil"),
            UnaryOp::Not => {
                let ones = c(if d == DType::Bool { 1.0 } else { -1.0 })?;
                ir.op1(b, "arith.xori", &[x, ones], ty, Vec::new())
            }
        }
    }

    /// eˣ by range reduction and a degree-6 polynomial (Cephes' expf
    /// coefficients, about 1 ulp in f32), computed in f32.
    fn exp(&self, b: &Block<'c>, x: Raw, d: DType, w: usize) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let f = DType::F32;
        let x = self.convert_vec(b, x, d, f, w)?;
        let ty = self.vec_ty(w, f);
        let c = |v: f64| -> Result<Raw, LoweringError> {
            ir.op1(
                b,
                "arith.constant",
                &[],
                ty,
                vec![("value", ir.literal(v, f, ty)?)],
            )
        };
        let bin = |name: &str, a: Raw, c: Raw| ir.op1(b, name, &[a, c], ty, Vec::new());
        let fma = |a: Raw, m: Raw, add: Raw| ir.op1(b, "math.fma", &[a, m, add], ty, Vec::new());
        let lo = c(-87.336_544)?;
        let hi = c(88.376_26)?;
        let xc = bin("arith.maximumf", x, lo)?;
        let xc = bin("arith.minimumf", xc, hi)?;
        let log2e = c(std::f64::consts::LOG2_E)?;
        let half = c(0.5)?;
        let t = fma(xc, log2e, half)?;
        let n = ir.op1(b, "math.floor", &[t], ty, Vec::new())?;
        let ln2_hi = c(-0.693_359_375)?;
        let ln2_lo = c(2.121_944_4e-4)?;
        let r = fma(n, ln2_hi, xc)?;
        let r = fma(n, ln2_lo, r)?;
        let mut p = c(1.987_569_150_0e-4)?;
        for coeff in [
            1.398_199_950_7e-3,
            8.333_451_907_3e-3,
            4.166_579_589_4e-2,
            1.666_666_545_9e-1,
            5.000_000_120_1e-1,
        ] {
            let k = c(coeff)?;
            p = fma(p, r, k)?;
        }
        let r2 = bin("arith.mulf", r, r)?;
        let one = c(1.0)?;
        let rp1 = bin("arith.addf", r, one)?;
        let y = fma(p, r2, rp1)?;
        // 2ⁿ from the exponent bits.
        let i32v = self.vec_ty(w, DType::I32);
        let ni = ir.op1(b, "arith.fptosi", &[n], i32v, Vec::new())?;
        let bias = ir.op1(
            b,
            "arith.constant",
            &[],
            i32v,
            vec![("value", ir.literal(127.0, DType::I32, i32v)?)],
        )?;
        let e = ir.op1(b, "arith.addi", &[ni, bias], i32v, Vec::new())?;
        let sh = ir.op1(
            b,
            "arith.constant",
            &[],
            i32v,
            vec![("value", ir.literal(23.0, DType::I32, i32v)?)],
        )?;
        let bits = ir.op1(b, "arith.shli", &[e, sh], i32v, Vec::new())?;
        let pow2 = ir.op1(b, "arith.bitcast", &[bits], ty, Vec::new())?;
        let y = bin("arith.mulf", y, pow2)?;
        // Below the range the result is 0 (and -inf gives 0); NaN stays NaN.
        let zero = c(0.0)?;
        let under = ir.op1(
            b,
            "arith.cmpf",
            &[x, lo],
            self.vec_ty(w, DType::Bool),
            vec![("predicate", ir.i64_attr(4))],
        )?;
        let y = ir.op1(b, "arith.select", &[under, zero, y], ty, Vec::new())?;
        self.convert_vec(b, y, f, d, w)
    }

    fn binary(
        &self,
        b: &Block<'c>,
        op: BinaryOp,
        x: Raw,
        y: Raw,
        d: DType,
        w: usize,
    ) -> Result<Raw, LoweringError> {
        if is_half(d) {
            let x = self.convert_vec(b, x, d, DType::F32, w)?;
            let y = self.convert_vec(b, y, d, DType::F32, w)?;
            let r = self.binary(b, op, x, y, DType::F32, w)?;
            return self.convert_vec(b, r, DType::F32, d, w);
        }
        let float = d.is_float();
        let name = crate::body::binary_op_name(op, float);
        self.ir.op1(b, name, &[x, y], self.vec_ty(w, d), Vec::new())
    }

    /// A scalar of dtype `from` converted to `to`.
    fn round_scalar(
        &self,
        b: &Block<'c>,
        s: Raw,
        from: DType,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(s);
        }
        let v = self.splat(b, s, 1, from)?;
        let v = self.convert_vec(b, v, from, to, 1)?;
        self.lane0(b, v, to)
    }

    // ---- reductions, matmul, control flow ----

    fn reduce(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        op: ReduceOp,
        x: ValueId,
        axes: &[usize],
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let mut n = self.node(x)?;
        let out_d = n.ty.dtype;
        if is_half(out_d) {
            // Accumulate half floats in f32; round the result once.
            n = Rc::new(Node {
                ty: TileType::new(DType::F32, n.ty.shape.clone()),
                e: Expr::Convert(n),
            });
        }
        let d = n.ty.dtype;
        let shape = n.ty.shape.clone();
        let rank = shape.len();
        let out_ty = TileType::new(d, self.ty(r).shape.clone());
        let float = d.is_float();
        let (combine, kind) = match (op, float) {
            (ReduceOp::Sum, true) => ("arith.addf", "add"),
            (ReduceOp::Sum, false) => ("arith.addi", "add"),
            (ReduceOp::Max, true) => ("arith.maximumf", "maximumf"),
            (ReduceOp::Min, true) => ("arith.minimumf", "minimumf"),
            (ReduceOp::Max, false) => ("arith.maxsi", "maxsi"),
            (ReduceOp::Min, false) => ("arith.minsi", "minsi"),
        };
        let init = op.identity(d);
        let last_reduced = axes.contains(&(rank - 1));
        // The result buffer (a one-element buffer for a scalar result),
        // filled with the identity.
        let buf_ty = if out_ty.shape.is_empty() {
            TileType::new(d, vec![1])
        } else {
            out_ty.clone()
        };
        let out = self.alloc(b, &buf_ty)?;
        let ident = Node {
            e: Expr::Const(init),
            ty: buf_ty.clone(),
        };
        self.write(b, &ident, out)?;
        let out_index = |idx: &[Raw], zero: Raw| -> Vec<Raw> {
            let v: Vec<Raw> = idx
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, r)| *r)
                .collect();
            if v.is_empty() { vec![zero] } else { v }
        };
        if last_reduced {
            // One row at a time: vector partial results, then one
            // horizontal reduction.
            let w = chunk(shape[rank - 1]);
            let lead = &shape[..rank - 1];
            let vty = self.vec_ty(w, d);
            self.for_each_chunk(b, lead, 1, &mut |blk, lidx| {
                let acc0 = ir.op1(
                    blk,
                    "arith.constant",
                    &[],
                    vty,
                    vec![("value", ir.literal(init, d, vty)?)],
                )?;
                let lo = self.idx(blk, 0)?;
                let hi = self.idx(blk, shape[rank - 1] as i64)?;
                let st = self.idx(blk, w as i64)?;
                let inner = ir.block(&[ir.index(), vty]);
                let a = ir.args(&inner);
                let mut full = lidx.to_vec();
                full.push(a[0]);
                let v = self.eval(&inner, &n, &full, w)?;
                let acc = ir.op1(&inner, combine, &[a[1], v], vty, Vec::new())?;
                ir.op(&inner, "scf.yield", &[acc], &[], Vec::new(), Vec::new())?;
                let acc = ir.op(
                    blk,
                    "scf.for",
                    &[lo, hi, st, acc0],
                    &[vty],
                    Vec::new(),
                    vec![ir.region(inner)],
                )?[0];
                let s = ir.op1(
                    blk,
                    "vector.reduction",
                    &[acc],
                    ir.elem(d),
                    vec![("kind", ir.parse_attr(&format!("#vector.kind<{kind}>"))?)],
                )?;
                let zero = self.idx(blk, 0)?;
                let mut at = vec![out];
                let oi = out_index(lidx, zero);
                at.extend(&oi);
                let old = ir.op1(blk, "memref.load", &at, ir.elem(d), Vec::new())?;
                let new = ir.op1(blk, combine, &[old, s], ir.elem(d), Vec::new())?;
                let mut st_ops = vec![new, out];
                st_ops.extend(oi);
                ir.op(blk, "memref.store", &st_ops, &[], Vec::new(), Vec::new())?;
                Ok(())
            })?;
        } else {
            // The last dim is kept: combine chunk by chunk into the result.
            let w = chunk(shape[rank - 1]);
            let vty = self.vec_ty(w, d);
            self.for_each_chunk(b, &shape, w, &mut |blk, idx| {
                let v = self.eval(blk, &n, idx, w)?;
                let zero = self.idx(blk, 0)?;
                let oi = out_index(idx, zero);
                let mut at = vec![out];
                at.extend(&oi);
                let old = ir.op1(blk, "vector.load", &at, vty, Vec::new())?;
                let new = ir.op1(blk, combine, &[old, v], vty, Vec::new())?;
                let mut ops = vec![new, out];
                ops.extend(oi);
                ir.op(blk, "vector.store", &ops, &[], Vec::new(), Vec::new())?;
                Ok(())
            })?;
        }
        if out_ty.shape.is_empty() {
            let z = self.idx(b, 0)?;
            let s = ir.op1(b, "memref.load", &[out, z], ir.elem(d), Vec::new())?;
            let s = self.round_scalar(b, s, d, out_d)?;
            self.set(r, Val::Scalar(s));
        } else if d == out_d {
            self.set(
                r,
                Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem: out },
                    ty: out_ty,
                })),
            );
        } else {
            let buf = Rc::new(Node {
                e: Expr::Buf { mem: out },
                ty: out_ty,
            });
            self.set(
                r,
                Val::Tile(Rc::new(Node {
                    e: Expr::Convert(buf),
                    ty: self.ty(r),
                })),
            );
            self.maybe_materialize(b, r)?;
        }
        Ok(())
    }

    /// Writes `n` into a new buffer whose dims are `n`'s dims permuted by
    /// `order` (result dim i = operand dim `order[i]`), in dtype `to`.
    fn canonical(
        &mut self,
        b: &Block<'c>,
        n: &Rc<Node>,
        order: &[usize],
        to: DType,
    ) -> Result<Raw, LoweringError> {
        let identity = order.iter().enumerate().all(|(i, &o)| i == o);
        let src = if identity {
            n.clone()
        } else {
            Rc::new(Node {
                ty: TileType::new(
                    n.ty.dtype,
                    order.iter().map(|&o| n.ty.shape[o]).collect::<Vec<_>>(),
                ),
                e: Expr::Transpose {
                    src: n.clone(),
                    perm: order.to_vec(),
                },
            })
        };
        if src.ty.dtype == to {
            return self.materialize(b, &src);
        }
        let conv = Node {
            ty: TileType::new(to, src.ty.shape.clone()),
            e: Expr::Convert(src),
        };
        self.materialize(b, &conv)
    }

    fn dot(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
        l: ValueId,
        rh: ValueId,
        dims: &DotDims,
        acc: DType,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let (ln, rn) = (self.node(l)?, self.node(rh)?);
        let (lt, rt) = (ln.ty.clone(), rn.ty.clone());
        let free = |rank: usize, bt: &[usize], c: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !bt.contains(d) && !c.contains(d))
                .collect()
        };
        let lf = free(lt.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
        let rf = free(rt.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
        // A[batch, free, contract] and B[batch, contract, free], row-major.
        let lorder: Vec<usize> = dims
            .lhs_batch
            .iter()
            .chain(&lf)
            .chain(&dims.lhs_contract)
            .copied()
            .collect();
        let rorder: Vec<usize> = dims
            .rhs_batch
            .iter()
            .chain(&dims.rhs_contract)
            .chain(&rf)
            .copied()
            .collect();
        // Half-float accumulation runs in f32 and rounds at the end.
        let out_acc = acc;
        let acc = if is_half(acc) { DType::F32 } else { acc };
        let a = self.canonical(b, &ln, &lorder, acc)?;
        let bm = self.canonical(b, &rn, &rorder, acc)?;
        let size = |t: &TileType, ds: &[usize]| ds.iter().map(|&d| t.shape[d]).product::<usize>();
        let bt = size(&lt, &dims.lhs_batch);
        let m = size(&lt, &lf);
        let kk = size(&lt, &dims.lhs_contract);
        let nn = size(&rt, &rf);
        // Flat views: A[bt, m, k], B[bt, k, n], C[bt, m, n].
        let out_ty = self.ty(r);
        let c = self.alloc(b, &TileType::new(acc, vec![bt, m, nn]))?;
        let a3 = self.reshape_buf(b, a, &[bt, m, kk], acc)?;
        let b3 = self.reshape_buf(b, bm, &[bt, kk, nn], acc)?;
        self.micro_kernel(b, a3, b3, c, bt, m, kk, nn, acc)?;
        let out = self.reshape_buf(b, c, &out_ty.shape, acc)?;
        if out_ty.shape.is_empty() {
            let z = self.idx(b, 0)?;
            let s = ir.op1(b, "memref.load", &[out, z], ir.elem(acc), Vec::new())?;
            let s = self.round_scalar(b, s, acc, out_acc)?;
            self.set(r, Val::Scalar(s));
        } else {
            let buf = Rc::new(Node {
                e: Expr::Buf { mem: out },
                ty: TileType::new(acc, out_ty.shape.clone()),
            });
            let e = if acc == out_acc {
                Expr::Buf { mem: out }
            } else {
                Expr::Convert(buf)
            };
            self.set(r, Val::Tile(Rc::new(Node { e, ty: out_ty })));
            self.maybe_materialize(b, r)?;
        }
        Ok(())
    }

    /// The same contiguous buffer with another shape.
    fn reshape_buf(
        &self,
        b: &Block<'c>,
        mem: Raw,
        shape: &[usize],
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let shape: Vec<usize> = if shape.is_empty() {
            vec![1]
        } else {
            shape.to_vec()
        };
        let t = ir.memref(&shape, Self::mem_dtype(d), None, None);
        let flat = ir.op1(
            b,
            "memref.reinterpret_cast",
            &[mem],
            t,
            vec![
                ("static_offsets", ir.i64_array(&[0])),
                (
                    "static_sizes",
                    ir.i64_array(&shape.iter().map(|&x| x as i64).collect::<Vec<_>>()),
                ),
                ("static_strides", ir.i64_array(&row_major_strides(&shape))),
                ("operandSegmentSizes", ir.i32_array(&[1, 0, 0, 0])),
            ],
        )?;
        Ok(flat)
    }

    /// C[b] = A[b] · B[b] with MR × NR register blocks.
    #[allow(clippy::too_many_arguments)]
    fn micro_kernel(
        &self,
        b: &Block<'c>,
        a: Raw,
        bm: Raw,
        c: Raw,
        bt: usize,
        m: usize,
        k: usize,
        n: usize,
        d: DType,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let mr = [8, 4, 2, 1]
            .into_iter()
            .find(|r| m.is_multiple_of(*r))
            .unwrap_or(1);
        let nr = [32, 16, 8, 4, 2, 1]
            .into_iter()
            .find(|r| n.is_multiple_of(*r))
            .unwrap_or(1);
        let vty = self.vec_ty(nr, d);
        let float = d.is_float();
        let outer = [bt, m / mr, n / nr];
        self.for_each_chunk(b, &outer, 1, &mut |blk, oidx| {
            let (bi, ib, jb) = (oidx[0], oidx[1], oidx[2]);
            let mrc = self.idx(blk, mr as i64)?;
            let nrc = self.idx(blk, nr as i64)?;
            let i0 = ir.op1(blk, "arith.muli", &[ib, mrc], ir.index(), Vec::new())?;
            let j0 = ir.op1(blk, "arith.muli", &[jb, nrc], ir.index(), Vec::new())?;
            let zero = ir.op1(
                blk,
                "arith.constant",
                &[],
                vty,
                vec![("value", ir.literal(0.0, d, vty)?)],
            )?;
            let lo = self.idx(blk, 0)?;
            let hi = self.idx(blk, k as i64)?;
            let one = self.idx(blk, 1)?;
            let mut types = vec![ir.index()];
            types.extend(std::iter::repeat_n(vty, mr));
            let inner = ir.block(&types);
            let args = ir.args(&inner);
            let kk = args[0];
            let bv = ir.op1(&inner, "vector.load", &[bm, bi, kk, j0], vty, Vec::new())?;
            let mut next = Vec::with_capacity(mr);
            for r in 0..mr {
                let rc = self.idx(&inner, r as i64)?;
                let i = ir.op1(&inner, "arith.addi", &[i0, rc], ir.index(), Vec::new())?;
                let s = ir.op1(
                    &inner,
                    "memref.load",
                    &[a, bi, i, kk],
                    ir.elem(d),
                    Vec::new(),
                )?;
                let av = ir.op1(&inner, "vector.broadcast", &[s], vty, Vec::new())?;
                next.push(if float {
                    ir.op1(
                        &inner,
                        "vector.fma",
                        &[av, bv, args[1 + r]],
                        vty,
                        Vec::new(),
                    )?
                } else {
                    let p = ir.op1(&inner, "arith.muli", &[av, bv], vty, Vec::new())?;
                    ir.op1(&inner, "arith.addi", &[p, args[1 + r]], vty, Vec::new())?
                });
            }
            ir.op(&inner, "scf.yield", &next, &[], Vec::new(), Vec::new())?;
            let mut ops = vec![lo, hi, one];
            ops.extend(std::iter::repeat_n(zero, mr));
            let accs = ir.op(
                blk,
                "scf.for",
                &ops,
                &types[1..],
                Vec::new(),
                vec![ir.region(inner)],
            )?;
            for (r, acc) in accs.into_iter().enumerate() {
                let rc = self.idx(blk, r as i64)?;
                let i = ir.op1(blk, "arith.addi", &[i0, rc], ir.index(), Vec::new())?;
                ir.op(
                    blk,
                    "vector.store",
                    &[acc, c, bi, i, j0],
                    &[],
                    Vec::new(),
                    Vec::new(),
                )?;
            }
            Ok(())
        })
    }

    /// Binds the results of a loop or branch: tiles to the buffers they
    /// were written to, scalars to the op's SSA results in order.
    fn bind_results(&mut self, results: &[ValueId], bufs: &[Option<Raw>], scalars: &[Raw]) {
        let mut next = scalars.iter();
        for (r, buf) in results.iter().zip(bufs) {
            let v = match buf {
                Some(mem) => Val::Tile(Rc::new(Node {
                    e: Expr::Buf { mem: *mem },
                    ty: self.ty(*r),
                })),
                None => match next.next() {
                    Some(s) => Val::Scalar(*s),
                    None => continue,
                },
            };
            self.set(*r, v);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn for_loop(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        lower: &IndexValue,
        upper: &IndexValue,
        step: i64,
        init: &[ValueId],
        body: &Region,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let bound = |this: &Self, iv: &IndexValue| -> Result<Raw, LoweringError> {
            match iv {
                IndexValue::Static(s) => this.i32c(b, *s),
                IndexValue::Dynamic(v) => this.scalar(*v),
            }
        };
        let lo = bound(self, lower)?;
        let hi = bound(self, upper)?;
        let st = self.i32c(b, step)?;
        // Tiles carried by the loop live in fixed buffers; scalars are
        // loop-carried SSA values.
        let mut tile_bufs: Vec<Option<Raw>> = Vec::new();
        let mut scalar_init = Vec::new();
        let mut scalar_types = Vec::new();
        for v in init {
            match self.v(*v)? {
                Val::Scalar(s) => {
                    tile_bufs.push(None);
                    scalar_init.push(s);
                    scalar_types.push(ir.elem(self.ty(*v).dtype));
                }
                Val::Tile(n) => {
                    let buf = self.alloc(b, &n.ty)?;
                    self.write(b, &n, buf)?;
                    tile_bufs.push(Some(buf));
                }
            }
        }
        let mut types = vec![ir.i32()];
        types.extend(&scalar_types);
        let inner = ir.block(&types);
        let a = ir.args(&inner);
        self.set(body.args[0], Val::Scalar(a[0]));
        let mut si = 1;
        for (i, arg) in body.args[1..].iter().enumerate() {
            match tile_bufs[i] {
                Some(buf) => {
                    let ty = self.ty(*arg);
                    self.set(
                        *arg,
                        Val::Tile(Rc::new(Node {
                            e: Expr::Buf { mem: buf },
                            ty,
                        })),
                    );
                }
                None => {
                    self.set(*arg, Val::Scalar(a[si]));
                    si += 1;
                }
            }
        }
        let yields = self.region(&inner, body)?;
        // New carried tiles go to temporaries first: a yield may read a
        // carried buffer another yield overwrites.
        let mut temps = Vec::new();
        let mut scalar_next = Vec::new();
        for (i, y) in yields.iter().enumerate() {
            match (y, tile_bufs[i]) {
                (Val::Tile(n), Some(_)) => temps.push(Some(self.materialize(&inner, n)?)),
                (Val::Scalar(s), None) => {
                    temps.push(None);
                    scalar_next.push(*s);
                }
                _ => return Err(LoweringError::Internal("loop yield kind".into())),
            }
        }
        for (i, t) in temps.iter().enumerate() {
            if let (Some(t), Some(buf)) = (t, tile_bufs[i]) {
                let ty = self.ty(op.results[i]);
                self.write(
                    &inner,
                    &Node {
                        e: Expr::Buf { mem: *t },
                        ty,
                    },
                    buf,
                )?;
            }
        }
        ir.op(
            &inner,
            "scf.yield",
            &scalar_next,
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        let mut ops = vec![lo, hi, st];
        ops.extend(scalar_init);
        let res = ir.op(
            b,
            "scf.for",
            &ops,
            &scalar_types,
            Vec::new(),
            vec![ir.region(inner)],
        )?;
        self.bind_results(&op.results, &tile_bufs, &res);
        Ok(())
    }

    fn conditional(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        cond: ValueId,
        then_r: &Region,
        else_r: &Region,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        // Tile results land in buffers both branches write.
        let mut bufs = Vec::new();
        let mut scalar_types = Vec::new();
        for r in &op.results {
            let ty = self.ty(*r);
            if ty.shape.is_empty() {
                bufs.push(None);
                scalar_types.push(ir.elem(ty.dtype));
            } else {
                bufs.push(Some(self.alloc(b, &ty)?));
            }
        }
        let branch =
            |this: &mut Self, r: &Region| -> Result<melior::ir::Region<'c>, LoweringError> {
                let blk = ir.block(&[]);
                let ys = this.region(&blk, r)?;
                let mut scalars = Vec::new();
                for (i, y) in ys.iter().enumerate() {
                    match (y, bufs[i]) {
                        (Val::Tile(n), Some(buf)) => this.write(&blk, n, buf)?,
                        (Val::Scalar(s), None) => scalars.push(*s),
                        _ => return Err(LoweringError::Internal("branch yield kind".into())),
                    }
                }
                ir.op(&blk, "scf.yield", &scalars, &[], Vec::new(), Vec::new())?;
                Ok(ir.region(blk))
            };
        let t = branch(self, then_r)?;
        let f = branch(self, else_r)?;
        let res = ir.op(
            b,
            "scf.if",
            &[self.scalar(cond)?],
            &scalar_types,
            Vec::new(),
            vec![t, f],
        )?;
        self.bind_results(&op.results, &bufs, &res);
        Ok(())
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

fn is_half(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16)
}
