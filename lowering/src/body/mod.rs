//! Kernel body ops → vector/arith/math/scf (and a few tpu ops in the Mosaic
//! flavor).
//!
//! Tiles of rank ≥ 1 are vectors, rank-0 tiles are scalars, bool is `i1`.

use melior::ir::{Block, Type};

use kernel_ir::{
    BinaryOp, CompareOp, DType, Index, IndexValue, Kernel, Op, OpKind, Region, TileType, ValueId,
};

use crate::LoweringError;
use crate::convention::{ArgLayout, Flavor, Window};
use crate::lowered_values::LoweredValues;
use crate::mlir::{Ir, Raw};

mod dma;
mod dot;
mod element;
mod elementwise;
mod memory;
mod shape;

pub(crate) struct BodyEmitter<'a, 'c> {
    ir: &'a Ir<'c>,
    k: &'a Kernel,
    flavor: Flavor,
    layout: &'a ArgLayout,
    args: &'a [Raw],
    windows: &'a [Window],
    values: LoweredValues<Raw>,
    /// Results of `vector.transpose` this emitter made: source and
    /// permutation, so that a transpose undoing one yields the source (the
    /// transposed view of a layout-hinted operand, then `.t()` in the body).
    transposes: std::cell::RefCell<Vec<(Raw, Raw, Vec<usize>)>>,
    /// Buffers allocated by the scope being emitted (Mosaic).
    scoped: std::collections::HashMap<kernel_ir::BufferRef, Raw>,
    /// Semaphore arrays allocated by the scope being emitted (Mosaic).
    scoped_semaphores: std::collections::HashMap<usize, Raw>,
}

/// One dim of an indexed buffer access.
struct Access {
    start: Raw,
    len: usize,
    keep: bool,
}

impl<'a, 'c> BodyEmitter<'a, 'c> {
    pub fn new(
        ir: &'a Ir<'c>,
        k: &'a Kernel,
        flavor: Flavor,
        layout: &'a ArgLayout,
        args: &'a [Raw],
        windows: &'a [Window],
    ) -> Self {
        BodyEmitter {
            ir,
            k,
            flavor,
            layout,
            args,
            windows,
            values: LoweredValues::new(k),
            transposes: std::cell::RefCell::new(Vec::new()),
            scoped: Default::default(),
            scoped_semaphores: Default::default(),
        }
    }

    /// Emits the top-level region into the kernel function's entry block.
    pub fn top(&mut self, block: &Block<'c>) -> Result<(), LoweringError> {
        // The barrier semaphore is the chip's: fetched, not passed.
        for (i, s) in self.k.semaphores.iter().enumerate() {
            if s.kind == kernel_ir::SemaphoreKind::Barrier {
                let ty = crate::convention::semaphore_type(self.ir, s.kind, &[]);
                let v = self.ir.op1(block, "tpu.sem_barrier", &[], ty, Vec::new())?;
                self.scoped_semaphores.insert(i, v);
            }
        }
        let region = &self.k.body.region;
        self.region(block, region)?;
        Ok(())
    }

    /// The memref a load (`write == false`) or store of `b` reaches.
    fn base(&self, b: kernel_ir::BufferRef, write: bool) -> Raw {
        match self.scoped.get(&b) {
            Some(&v) => v,
            None => self.args[self.layout.arg(b, write)],
        }
    }

    /// The memref of semaphore array `i`.
    fn semaphore_base(&self, i: usize) -> Raw {
        match self.scoped_semaphores.get(&i) {
            Some(&v) => v,
            None => self.args[self.layout.semaphores[i]],
        }
    }

    fn v(&self, id: ValueId) -> Result<Raw, LoweringError> {
        self.values.get(id)
    }

    fn ty(&self, id: ValueId) -> &TileType {
        &self.k.body.values[id.index()]
    }

    fn set(&mut self, id: ValueId, raw: Raw) {
        self.values.set(id, raw);
    }

    fn tile_type(&self, id: ValueId) -> Type<'c> {
        self.ir.tile(self.ty(id))
    }

    /// Emits a region's ops into `block`; returns the yielded values.
    fn region(&mut self, block: &Block<'c>, r: &Region) -> Result<Vec<Raw>, LoweringError> {
        // The op that owns the region (and its terminator) keeps its own
        // location once the region's ops have set theirs.
        let owner = self.ir.loc();
        for op in &r.ops {
            self.op(block, op)?;
        }
        self.ir.restore_loc(owner);
        r.yields.iter().map(|y| self.v(*y)).collect()
    }

    fn constant(&self, block: &Block<'c>, v: f64, t: &TileType) -> Result<Raw, LoweringError> {
        let ty = self.ir.tile(t);
        let attr = self.ir.literal(v, t.dtype, ty)?;
        self.ir
            .op1(block, "arith.constant", &[], ty, vec![("value", attr)])
    }

    fn index_const(&self, block: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.ir.op1(
            block,
            "arith.constant",
            &[],
            self.ir.index(),
            vec![("value", self.ir.index_attr(v))],
        )
    }

    /// A value of the body with its type.
    fn typed(&self, id: ValueId) -> Result<(Raw, TileType), LoweringError> {
        Ok((self.v(id)?, self.ty(id).clone()))
    }

    /// An op that only moves elements (`f`, given the operands and the
    /// result type), on bool tiles too: Mosaic moves no i1 vector, so
    /// masks move as i32 and compare back.
    fn rearranged(
        &self,
        block: &Block<'c>,
        xs: &[(Raw, TileType)],
        out: &TileType,
        f: impl FnOnce(&[Raw], &TileType) -> Result<Raw, LoweringError>,
    ) -> Result<Raw, LoweringError> {
        if out.dtype != DType::Bool {
            let vs: Vec<Raw> = xs.iter().map(|(v, _)| *v).collect();
            return f(&vs, out);
        }
        let mut wide = Vec::with_capacity(xs.len());
        for (v, t) in xs {
            wide.push(self.convert(block, *v, t.clone(), DType::I32)?);
        }
        let wide_out = TileType::new(DType::I32, out.shape.clone());
        let moved = f(&wide, &wide_out)?;
        self.convert(block, moved, wide_out, DType::Bool)
    }

    /// `vector.extract_strided_slice` of `v` at `offsets`, `sizes` long,
    /// stride 1, as a value of type `out`.
    fn strided_slice(
        &self,
        block: &Block<'c>,
        v: Raw,
        offsets: &[i64],
        sizes: &[i64],
        out: &TileType,
    ) -> Result<Raw, LoweringError> {
        // Each an `I64ArrayAttr` (integers in an array), not a dense array.
        let list = |v: &[i64]| {
            let items: Vec<_> = v.iter().map(|&i| self.ir.i64_attr(i)).collect();
            self.ir.array_attr(&items)
        };
        self.ir.op1(
            block,
            "vector.extract_strided_slice",
            &[v],
            self.ir.tile(out),
            vec![
                ("offsets", list(offsets)),
                ("sizes", list(sizes)),
                ("strides", list(&vec![1; sizes.len()])),
            ],
        )
    }

    fn i32_const(&self, block: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.ir.op1(
            block,
            "arith.constant",
            &[],
            self.ir.i32(),
            vec![("value", self.ir.i32_attr(v))],
        )
    }

    fn index_value(&self, block: &Block<'c>, iv: &IndexValue) -> Result<Raw, LoweringError> {
        match iv {
            IndexValue::Static(s) => self.index_const(block, *s),
            IndexValue::Dynamic(v) => self.ir.op1(
                block,
                "arith.index_cast",
                &[self.v(*v)?],
                self.ir.index(),
                Vec::new(),
            ),
        }
    }

    fn i32_value(&self, block: &Block<'c>, iv: &IndexValue) -> Result<Raw, LoweringError> {
        match iv {
            IndexValue::Static(s) => self.i32_const(block, *s),
            IndexValue::Dynamic(v) => self.v(*v),
        }
    }

    fn unsupported(&self, op: &Op, reason: &str) -> LoweringError {
        LoweringError::Unsupported {
            op: op.kind.mnemonic().to_string(),
            loc: op.loc.clone(),
            target: match self.flavor {
                Flavor::Upstream => "kernel module",
                Flavor::Mosaic => "Mosaic",
            },
            reason: reason.to_string(),
        }
    }

    fn op(&mut self, block: &Block<'c>, op: &Op) -> Result<(), LoweringError> {
        let ir = self.ir;
        ir.set_loc(op.loc.as_ref());
        let res = op.results.first().copied();
        let out = match &op.kind {
            OpKind::DmaStart(c) => {
                self.check_not_rebased(op, c)?;
                self.dma(block, op, c, true)?;
                None
            }
            OpKind::DmaWait(c) => {
                self.dma(block, op, c, false)?;
                None
            }
            OpKind::DmaWaitSend(c) => {
                self.dma_wait_send(block, op, c)?;
                None
            }
            OpKind::DeviceId => Some(self.device_id(block, op)?),
            OpKind::AxisIndex { axis } => {
                let mesh = self
                    .k
                    .mesh
                    .as_ref()
                    .ok_or_else(|| self.unsupported(op, "no mesh"))?;
                let id = self.device_id(block, op)?;
                let stride = self.i32_const(block, mesh.stride(*axis) as i64)?;
                let size = self.i32_const(block, mesh.axes[*axis].1 as i64)?;
                let i32 = self.ir.i32();
                let q = self
                    .ir
                    .op1(block, "arith.divsi", &[id, stride], i32, Vec::new())?;
                Some(
                    self.ir
                        .op1(block, "arith.remsi", &[q, size], i32, Vec::new())?,
                )
            }
            OpKind::RemoteSignal {
                sem,
                amount,
                device,
            } => {
                self.remote_signal(block, op, sem, amount, device)?;
                None
            }
            OpKind::SemSignal { sem, amount } => self.sem_op(block, op, sem, Some(amount), true)?,
            OpKind::SemWait { sem, amount } => self.sem_op(block, op, sem, Some(amount), false)?,
            OpKind::SemRead { sem } => self.sem_op(block, op, sem, None, false)?,
            OpKind::Scope {
                scratch,
                semaphores,
                body,
            } => {
                self.scope(block, op, scratch, semaphores, body)?;
                None
            }
            OpKind::Constant { value, ty } => Some(self.constant(block, value.as_f64(), ty)?),
            OpKind::ProgramId { dim } => Some(self.args[*dim]),
            OpKind::NumPrograms { dim } => {
                Some(self.i32_const(block, self.k.grid.dims[*dim].bound as i64)?)
            }
            OpKind::Iota { ty, dim } => Some(self.iota(block, ty, *dim)?),
            OpKind::Load {
                buffer,
                indices,
                mask,
            } => {
                let rt = res
                    .map(|r| self.ty(r).clone())
                    .unwrap_or_else(|| TileType::scalar(DType::F32));
                self.check_reachable(op, *buffer)?;
                let v = match self.load_rebased(op, block, *buffer, indices, &rt)? {
                    Some(v) => v,
                    None => self.load(block, *buffer, indices, &rt)?,
                };
                Some(match mask {
                    Some(m) => {
                        let zero = self.constant(block, 0.0, &rt)?;
                        self.select(block, self.v(*m)?, v, zero, &rt)?
                    }
                    None => v,
                })
            }
            OpKind::Store {
                buffer,
                indices,
                value,
                mask,
            } => {
                self.check_reachable(op, *buffer)?;
                self.store(op, block, *buffer, indices, *value, *mask)?;
                None
            }
            OpKind::Unary { op: u, x } => Some(self.unary(block, *u, *x)?),
            OpKind::Binary { op: b, lhs, rhs } => Some(self.binary(block, *b, *lhs, *rhs)?),
            OpKind::Compare { op: c, lhs, rhs } => {
                let t = self.ty(*lhs).clone();
                Some(self.compare(block, *c, self.v(*lhs)?, self.v(*rhs)?, &t)?)
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                let t = self.ty(*on_true).clone();
                Some(self.select(
                    block,
                    self.v(*cond)?,
                    self.v(*on_true)?,
                    self.v(*on_false)?,
                    &t,
                )?)
            }
            OpKind::Convert { x, dtype } => {
                Some(self.convert(block, self.v(*x)?, self.ty(*x).clone(), *dtype)?)
            }
            OpKind::Bitcast { x, dtype } => {
                let t = self.ty(*x).clone();
                if t.dtype == *dtype {
                    Some(self.v(*x)?)
                } else {
                    let to = TileType::new(*dtype, t.shape.clone());
                    Some(self.ir.op1(
                        block,
                        "arith.bitcast",
                        &[self.v(*x)?],
                        self.ir.tile(&to),
                        Vec::new(),
                    )?)
                }
            }
            OpKind::BroadcastInDim { x, shape, dims } => {
                Some(self.broadcast_in_dim(block, self.v(*x)?, self.ty(*x).clone(), shape, dims)?)
            }
            OpKind::Reshape { x, shape } => {
                let t = self.ty(*x).clone();
                Some(self.reshape(block, self.v(*x)?, &t, shape)?)
            }
            OpKind::Transpose { x, perm } => {
                let t = self.ty(*x).clone();
                Some(self.transpose(block, self.v(*x)?, &t, perm)?)
            }
            OpKind::Roll { x, shift, axis } => {
                // Pallas's `pltpu.roll`: a rotate by an i32 amount, jnp.roll's
                // direction.
                let amount = self.i32_const(block, *shift as i64)?;
                let dimension = self.ir.parse_attr(&format!("{axis} : si32"))?;
                let t = self.ty(*x).clone();
                Some(self.rearranged(block, &[self.typed(*x)?], &t, |xs, rt| {
                    self.ir.op1(
                        block,
                        "tpu.dynamic_rotate",
                        &[xs[0], amount],
                        self.ir.tile(rt),
                        vec![("dimension", dimension)],
                    )
                })?)
            }
            OpKind::Slice {
                x,
                axis,
                start,
                len,
            } => {
                let t = self.ty(*x).clone();
                let mut offsets = vec![0i64; t.shape.len()];
                offsets[*axis] = *start as i64;
                let mut sizes: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
                sizes[*axis] = *len as i64;
                let rt = res.map(|r| self.ty(r).clone()).unwrap_or(t);
                Some(self.rearranged(block, &[self.typed(*x)?], &rt, |xs, rt| {
                    self.strided_slice(block, xs[0], &offsets, &sizes, rt)
                })?)
            }
            OpKind::Concat { lhs, rhs, axis } => {
                let rt = res
                    .map(|r| self.ty(r).clone())
                    .unwrap_or_else(|| self.ty(*lhs).clone());
                let dimension = self.ir.parse_attr(&format!("{axis} : i32"))?;
                let parts = [self.typed(*lhs)?, self.typed(*rhs)?];
                Some(self.rearranged(block, &parts, &rt, |xs, rt| {
                    self.ir.op1(
                        block,
                        "tpu.concatenate",
                        xs,
                        self.ir.tile(rt),
                        vec![("dimension", dimension)],
                    )
                })?)
            }
            OpKind::Reduce { op: r, x, axes } => Some(self.reduce(block, *r, *x, axes)?),
            OpKind::Dot {
                lhs,
                rhs,
                dims,
                acc,
            } => {
                let rt = res
                    .map(|r| self.ty(r).clone())
                    .unwrap_or_else(|| TileType::scalar(*acc));
                Some(self.dot(block, *lhs, *rhs, dims, &rt)?)
            }
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                ..
            } => {
                let lo = self.i32_value(block, lower)?;
                let hi = self.i32_value(block, upper)?;
                let st = self.i32_const(block, *step)?;
                let mut types = vec![ir.i32()];
                types.extend(init.iter().map(|v| self.tile_type(*v)));
                let inner = ir.block(&types);
                let bargs = ir.args(&inner);
                for (a, raw) in body.args.iter().zip(&bargs) {
                    self.set(*a, *raw);
                }
                let yields = self.region(&inner, body)?;
                ir.op(&inner, "scf.yield", &yields, &[], Vec::new(), Vec::new())?;
                let mut operands = vec![lo, hi, st];
                operands.extend(
                    init.iter()
                        .map(|v| self.v(*v))
                        .collect::<Result<Vec<_>, _>>()?,
                );
                let results = ir.op(
                    block,
                    "scf.for",
                    &operands,
                    &types[1..],
                    Vec::new(),
                    vec![ir.region(inner)],
                )?;
                for (r, raw) in op.results.iter().zip(results) {
                    self.set(*r, raw);
                }
                return Ok(());
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let types: Vec<Type<'c>> = op.results.iter().map(|r| self.tile_type(*r)).collect();
                let then_block = ir.block(&[]);
                let ty = self.region(&then_block, then_region)?;
                ir.op(&then_block, "scf.yield", &ty, &[], Vec::new(), Vec::new())?;
                let else_reg = if else_region.ops.is_empty() && types.is_empty() {
                    melior::ir::Region::new()
                } else {
                    let else_block = ir.block(&[]);
                    let ey = self.region(&else_block, else_region)?;
                    ir.op(&else_block, "scf.yield", &ey, &[], Vec::new(), Vec::new())?;
                    ir.region(else_block)
                };
                let results = ir.op(
                    block,
                    "scf.if",
                    &[self.v(*cond)?],
                    &types,
                    Vec::new(),
                    vec![ir.region(then_block), else_reg],
                )?;
                for (r, raw) in op.results.iter().zip(results) {
                    self.set(*r, raw);
                }
                return Ok(());
            }
        };
        if let (Some(r), Some(raw)) = (res, out) {
            self.set(r, raw);
        }
        Ok(())
    }

    // ---- memory ----
}

/// Shape of the kept dims `kept` (logical dim numbers) of an access.
fn kept_shape_of(kept: &[usize], indices: &[Index]) -> Vec<usize> {
    kept.iter()
        .map(|&d| match indices[d] {
            Index::Slice { len, .. } => len,
            Index::Point(_) => 1,
        })
        .collect()
}

/// `x` (a scalar for an empty `shape`, else a vector of `shape`) converted
/// from `from` to `to` elementwise: `!= 0` for bool, float widening or
/// narrowing (bf16 ↔ f16 through f32), float ↔ int, int widening or
/// narrowing (bool is unsigned).
pub(crate) fn convert_values<'c>(
    ir: &Ir<'c>,
    block: &Block<'c>,
    x: Raw,
    shape: &[usize],
    from: DType,
    to: DType,
) -> Result<Raw, LoweringError> {
    if from == to {
        return Ok(x);
    }
    let ty_of = |d: DType| ir.shaped_vector(shape, ir.elem(d));
    let ty = ty_of(to);
    let one = |name: &str, v: Raw| ir.op1(block, name, &[v], ty, Vec::new());
    if to == DType::Bool {
        let zero_t = ty_of(from);
        let zero = ir.op1(
            block,
            "arith.constant",
            &[],
            zero_t,
            vec![("value", ir.literal(0.0, from, zero_t)?)],
        )?;
        let (name, pred) = compare_predicate(CompareOp::Ne, from);
        return ir.op1(
            block,
            name,
            &[x, zero],
            ty,
            vec![("predicate", ir.i64_attr(pred))],
        );
    }
    match (from.is_float(), to.is_float()) {
        (true, true) if from.bits() < to.bits() => one("arith.extf", x),
        (true, true) if from.bits() > to.bits() => one("arith.truncf", x),
        (true, true) => {
            let mid = ir.op1(block, "arith.extf", &[x], ty_of(DType::F32), Vec::new())?;
            one("arith.truncf", mid)
        }
        (true, false) => saturating_fptosi(ir, block, x, shape, from, to),
        (false, true) if from == DType::Bool => one("arith.uitofp", x),
        (false, true) => one("arith.sitofp", x),
        (false, false) if from == DType::Bool => one("arith.extui", x),
        (false, false) if from.bits() < to.bits() => one("arith.extsi", x),
        (false, false) => one("arith.trunci", x),
    }
}

/// Float to integer by the one rule of every path
/// ([`DType::convert_from`]): truncate, saturate at the bounds, NaN is 0.
/// `arith.fptosi` alone is poison past the range and on NaN (x86 gives
/// the minimum), so the value is clamped and NaN replaced before it, and
/// what is at or past 2^(bits-1) (not an f32 below the maximum) selected
/// to the maximum after.
fn saturating_fptosi<'c>(
    ir: &Ir<'c>,
    block: &Block<'c>,
    x: Raw,
    shape: &[usize],
    from: DType,
    to: DType,
) -> Result<Raw, LoweringError> {
    let f32_t = ir.shaped_vector(shape, ir.elem(DType::F32));
    let x = convert_values(ir, block, x, shape, from, DType::F32)?;
    let splat = |v: f64, d: DType| -> Result<Raw, LoweringError> {
        let t = ir.shaped_vector(shape, ir.elem(d));
        ir.op1(
            block,
            "arith.constant",
            &[],
            t,
            vec![("value", ir.literal(v, d, t)?)],
        )
    };
    let bool_t = ir.shaped_vector(shape, ir.elem(DType::Bool));
    let cmp = |p: CompareOp, a: Raw, b: Raw| -> Result<Raw, LoweringError> {
        let (name, pred) = compare_predicate(p, DType::F32);
        ir.op1(
            block,
            name,
            &[a, b],
            bool_t,
            vec![("predicate", ir.i64_attr(pred))],
        )
    };
    let (lo, hi) = to.float_to_int_clamp();
    let t = ir.op1(
        block,
        "arith.maximumf",
        &[x, splat(lo, DType::F32)?],
        f32_t,
        Vec::new(),
    )?;
    let t = ir.op1(
        block,
        "arith.minimumf",
        &[t, splat(hi, DType::F32)?],
        f32_t,
        Vec::new(),
    )?;
    // `x == x` (oeq) rather than `x != x` (une): Mosaic has no une.
    let number = cmp(CompareOp::Eq, x, x)?;
    let t = ir.op1(
        block,
        "arith.select",
        &[number, t, splat(0.0, DType::F32)?],
        f32_t,
        Vec::new(),
    )?;
    let int_t = ir.shaped_vector(shape, ir.elem(to));
    let r = ir.op1(block, "arith.fptosi", &[t], int_t, Vec::new())?;
    let big = cmp(CompareOp::Ge, x, splat(-lo, DType::F32)?)?;
    ir.op1(
        block,
        "arith.select",
        &[big, splat(-lo - 1.0, to)?, r],
        int_t,
        Vec::new(),
    )
}

/// The arith/math op of a binary op on float or integer operands.
pub(crate) fn binary_op_name(op: BinaryOp, float: bool) -> &'static str {
    match (op, float) {
        (BinaryOp::Add, true) => "arith.addf",
        (BinaryOp::Add, false) => "arith.addi",
        (BinaryOp::Sub, true) => "arith.subf",
        (BinaryOp::Sub, false) => "arith.subi",
        (BinaryOp::Mul, true) => "arith.mulf",
        (BinaryOp::Mul, false) => "arith.muli",
        (BinaryOp::Div, true) => "arith.divf",
        (BinaryOp::Div, false) => "arith.divsi",
        (BinaryOp::Rem, true) => "arith.remf",
        (BinaryOp::Rem, false) => "arith.remsi",
        (BinaryOp::Max, true) => "arith.maximumf",
        (BinaryOp::Max, false) => "arith.maxsi",
        (BinaryOp::Min, true) => "arith.minimumf",
        (BinaryOp::Min, false) => "arith.minsi",
        (BinaryOp::Pow, _) => "math.powf",
        (BinaryOp::And, _) => "arith.andi",
        (BinaryOp::Or, _) => "arith.ori",
        (BinaryOp::Xor, _) => "arith.xori",
        // The amount is masked to the bit width first (`BinaryOp::ShiftLeft`).
        (BinaryOp::ShiftLeft, _) => "arith.shli",
        (BinaryOp::ShiftRightLogical, _) => "arith.shrui",
        (BinaryOp::ShiftRightArithmetic, _) => "arith.shrsi",
    }
}

/// The `permutation_map` (the last `moved` of `rank` memref dims) and the
/// all-true `in_bounds` of a `vector.transfer_read/write` of a window.
fn transfer_attrs<'c>(
    ir: &Ir<'c>,
    rank: usize,
    moved: usize,
) -> Result<(melior::ir::Attribute<'c>, melior::ir::Attribute<'c>), LoweringError> {
    let dims: Vec<String> = (0..rank).map(|d| format!("d{d}")).collect();
    let map = format!(
        "affine_map<({}) -> ({})>",
        dims.join(", "),
        dims[rank - moved..].join(", ")
    );
    let in_bounds: Vec<melior::ir::Attribute<'c>> = (0..moved)
        .map(|_| ir.parse_attr("true"))
        .collect::<Result<_, _>>()?;
    Ok((ir.parse_attr(&map)?, ir.array_attr(&in_bounds)))
}

/// `arith.cmpf`/`arith.cmpi` and the predicate's enum value.
pub(crate) fn compare_predicate(c: CompareOp, d: DType) -> (&'static str, i64) {
    if d.is_float() {
        // oeq=1 ogt=2 oge=3 olt=4 ole=5 une=13 (`!=` is true on NaN)
        let p = match c {
            CompareOp::Eq => 1,
            CompareOp::Gt => 2,
            CompareOp::Ge => 3,
            CompareOp::Lt => 4,
            CompareOp::Le => 5,
            CompareOp::Ne => 13,
        };
        ("arith.cmpf", p)
    } else {
        // eq=0 ne=1 slt=2 sle=3 sgt=4 sge=5
        let p = match c {
            CompareOp::Eq => 0,
            CompareOp::Ne => 1,
            CompareOp::Lt => 2,
            CompareOp::Le => 3,
            CompareOp::Gt => 4,
            CompareOp::Ge => 5,
        };
        ("arith.cmpi", p)
    }
}
