//! One grid step's body: each kernel op on whole-buffer tensors, block
//! accesses as dynamic slices, loops and conditionals as `stablehlo.while`
//! and `stablehlo.case`.

use std::collections::BTreeSet;

use melior::ir::{Block, Type};

use kernel_ir::{
    CompareOp, DType, DotDims, Index, IndexValue, Kernel, Op, OpKind, ReduceOp, Region, TileType,
    UnaryOp, ValueId,
};

use crate::LoweringError;
use crate::lowered_values::LoweredValues;
use crate::mlir::{Attrs, Raw};
use crate::op_names;

use super::*;
use crate::hlo::Hlo;

/// Emits one grid step's body.
pub(super) struct Step<'a, 'c> {
    pub(super) e: Hlo<'a, 'c>,
    pub(super) k: &'a Kernel,
    pub(super) slots: Slots,
    pub(super) grid: Vec<Raw>,
    pub(super) values: LoweredValues<Raw>,
    /// Current tensor of every buffer slot.
    pub(super) bufs: Vec<Raw>,
    /// Values fixed per device (see [`super::remote::per_device_values`]).
    pub(super) per_device: std::collections::HashMap<ValueId, Vec<i64>>,
    /// How devices are numbered.
    pub(super) spmd: super::Spmd,
    /// Channel handles used so far (partitioned collectives need their own).
    pub(super) channels: i64,
}

/// Buffer slots written anywhere in a region.
pub(super) fn written(r: &Region, slots: &Slots, out: &mut BTreeSet<usize>) {
    for op in &r.ops {
        match &op.kind {
            OpKind::Store { buffer, .. } => {
                out.insert(slots.of(*buffer));
            }
            OpKind::DmaStart(c) if c.remote.is_some() => {
                out.insert(slots.of(c.dst.buffer));
            }
            _ => {}
        }
        for sub in op.kind.regions() {
            written(sub, slots, out);
        }
    }
}

impl<'c> Step<'_, 'c> {
    pub(super) fn v(&self, id: ValueId) -> Result<Raw, LoweringError> {
        self.values.get(id)
    }

    pub(super) fn ty(&self, id: ValueId) -> TileType {
        self.k.body.values[id.index()].clone()
    }

    pub(super) fn set(&mut self, id: ValueId, raw: Raw) {
        self.values.set(id, raw);
    }

    pub(super) fn buffer_type(&self, slot: usize) -> Type<'c> {
        let (d, shape) = if slot < self.slots.prefetch {
            let p = &self.k.prefetch[slot];
            (p.dtype, p.shape.clone())
        } else if slot < self.slots.prefetch + self.slots.operands {
            let o = &self.k.operands[slot - self.slots.prefetch];
            (o.dtype, o.view_shape().to_vec())
        } else {
            let s = &self.k.scratch[slot - self.slots.prefetch - self.slots.operands];
            (s.dtype, s.shape.clone())
        };
        self.e.t(&shape, d)
    }

    pub(super) fn region(&mut self, b: &Block<'c>, r: &Region) -> Result<Vec<Raw>, LoweringError> {
        for op in &r.ops {
            self.op(b, op)?;
        }
        r.yields.iter().map(|y| self.v(*y)).collect()
    }

    pub(super) fn start(&self, b: &Block<'c>, iv: &IndexValue) -> Result<Raw, LoweringError> {
        match iv {
            IndexValue::Static(s) => self.e.scalar_i32(b, *s),
            IndexValue::Dynamic(v) => self.v(*v),
        }
    }

    pub(super) fn op(&mut self, b: &Block<'c>, op: &Op) -> Result<(), LoweringError> {
        let e = &self.e;
        let ir = e.ir;
        let res = op.results.first().copied();
        let rt = res.map(|r| self.ty(r));
        let out = match &op.kind {
            OpKind::DeviceId => Some(self.device_id(b)?),
            OpKind::AxisIndex { axis } => Some(self.axis_index(b, *axis)?),
            OpKind::DmaStart(
                c @ kernel_ir::CopyDescriptor {
                    remote: Some(r), ..
                },
            ) => {
                return self.remote_start(b, op, c, r);
            }
            OpKind::DmaWaitSend(_)
            | OpKind::RemoteSignal { .. }
            | OpKind::DmaStart(_)
            | OpKind::DmaWait(_)
            | OpKind::SemSignal { .. }
            | OpKind::SemWait { .. }
            | OpKind::SemRead { .. }
            | OpKind::Scope { .. } => {
                return Err(crate::removed_by_synchronous_pass(
                    op,
                    "decomposed lowering",
                ));
            }
            OpKind::Constant { value, ty } => {
                Some(e.splat(b, value.as_f64(), ty.dtype, &ty.shape)?)
            }
            OpKind::ProgramId { dim } => Some(self.grid[*dim]),
            OpKind::NumPrograms { dim } => {
                Some(e.scalar_i32(b, self.k.grid.dims[*dim].bound as i64)?)
            }
            OpKind::Iota { ty, dim } => {
                let ints = ir.op1(
                    b,
                    "stablehlo.iota",
                    &[],
                    e.t(&ty.shape, DType::I32),
                    vec![("iota_dimension", ir.i64_attr(*dim as i64))],
                )?;
                Some(self.convert(
                    b,
                    ints,
                    &TileType::new(DType::I32, ty.shape.clone()),
                    ty.dtype,
                )?)
            }
            OpKind::Load {
                buffer,
                indices,
                mask,
            } => {
                let rt = rt.clone().unwrap_or_else(|| TileType::scalar(DType::F32));
                let src = self.bufs[self.slots.of(*buffer)];
                let (starts, sizes) = self.access(b, indices)?;
                let mut v = e.dynamic_slice(b, src, &starts, &sizes, rt.dtype)?;
                if sizes != rt.shape {
                    v = e.reshape(b, v, rt.dtype, &rt.shape)?;
                }
                Some(match mask {
                    Some(m) => {
                        let zero = e.splat(b, 0.0, rt.dtype, &rt.shape)?;
                        ir.op1(
                            b,
                            "stablehlo.select",
                            &[self.v(*m)?, v, zero],
                            e.t(&rt.shape, rt.dtype),
                            Vec::new(),
                        )?
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
                let slot = self.slots.of(*buffer);
                let dst = self.bufs[slot];
                let vt = self.ty(*value);
                let (starts, sizes) = self.access(b, indices)?;
                let mut v = self.v(*value)?;
                if let Some(m) = mask {
                    let old = e.dynamic_slice(b, dst, &starts, &sizes, vt.dtype)?;
                    let old = e.reshape(b, old, vt.dtype, &vt.shape)?;
                    v = ir.op1(
                        b,
                        "stablehlo.select",
                        &[self.v(*m)?, v, old],
                        e.t(&vt.shape, vt.dtype),
                        Vec::new(),
                    )?;
                }
                if sizes != vt.shape {
                    v = e.reshape(b, v, vt.dtype, &sizes)?;
                }
                let ty = self.buffer_type(slot);
                self.bufs[slot] = e.dynamic_update_slice(b, dst, v, &starts, ty)?;
                None
            }
            OpKind::Unary { op: u, x } => Some(self.unary(b, *u, *x)?),
            OpKind::Binary { op: bo, lhs, rhs } => {
                let t = self.ty(*lhs);
                let name = op_names::binary(*bo);
                let (x, mut y) = (self.v(*lhs)?, self.v(*rhs)?);
                if bo.is_shift() {
                    // The amount modulo the width (`BinaryOp::ShiftLeft`).
                    let width = e.splat(b, f64::from(t.dtype.bits() - 1), t.dtype, &t.shape)?;
                    y = e.bin(b, "stablehlo.and", y, width, t.dtype, &t.shape)?;
                }
                let r = e.bin(b, name, x, y, t.dtype, &t.shape)?;
                if matches!(bo, kernel_ir::BinaryOp::Max | kernel_ir::BinaryOp::Min)
                    && t.dtype.is_float()
                {
                    Some(e.nan_wins(b, r, [y, x], t.dtype, &t.shape)?)
                } else {
                    Some(r)
                }
            }
            OpKind::Compare { op: c, lhs, rhs } => {
                let t = self.ty(*lhs);
                Some(e.compare(b, *c, self.v(*lhs)?, self.v(*rhs)?, t.dtype, &t.shape)?)
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                let t = self.ty(*on_true);
                Some(ir.op1(
                    b,
                    "stablehlo.select",
                    &[self.v(*cond)?, self.v(*on_true)?, self.v(*on_false)?],
                    e.t(&t.shape, t.dtype),
                    Vec::new(),
                )?)
            }
            OpKind::Convert { x, dtype } => {
                let t = self.ty(*x);
                Some(self.convert(b, self.v(*x)?, &t, *dtype)?)
            }
            OpKind::Bitcast { x, dtype } => {
                let t = self.ty(*x);
                Some(ir.op1(
                    b,
                    "stablehlo.bitcast_convert",
                    &[self.v(*x)?],
                    e.t(&t.shape, *dtype),
                    Vec::new(),
                )?)
            }
            OpKind::BroadcastInDim { x, shape, dims } => {
                let t = self.ty(*x);
                let d: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
                Some(ir.op1(
                    b,
                    "stablehlo.broadcast_in_dim",
                    &[self.v(*x)?],
                    e.t(shape, t.dtype),
                    vec![("broadcast_dimensions", ir.i64_array(&d))],
                )?)
            }
            OpKind::Reshape { x, shape } => {
                Some(e.reshape(b, self.v(*x)?, self.ty(*x).dtype, shape)?)
            }
            OpKind::Transpose { x, perm } => {
                let t = self.ty(*x);
                let shape: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
                let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
                Some(ir.op1(
                    b,
                    "stablehlo.transpose",
                    &[self.v(*x)?],
                    e.t(&shape, t.dtype),
                    vec![("permutation", ir.i64_array(&p))],
                )?)
            }
            OpKind::Roll { x, shift, axis } => {
                // The last `shift` elements of the axis, then the rest.
                let t = self.ty(*x).clone();
                let xv = self.v(*x)?;
                if *shift == 0 {
                    Some(xv)
                } else {
                    let n = t.shape[*axis];
                    let part = |start: usize, len: usize| {
                        let mut starts = vec![0i64; t.shape.len()];
                        starts[*axis] = start as i64;
                        let mut sizes = t.shape.clone();
                        sizes[*axis] = len;
                        e.slice(b, xv, t.dtype, &starts, &sizes)
                    };
                    let tail = part(n - shift, *shift)?;
                    let head = part(0, n - shift)?;
                    // A barrier keeps XLA from fusing through the roll: a
                    // sort's network of rolls and selects, fused, duplicated
                    // its producers until a 64-wide bf16 sort took minutes
                    // to compile (1.8 s with it).
                    let rolled = ir.op1(
                        b,
                        "stablehlo.concatenate",
                        &[tail, head],
                        e.t(&t.shape, t.dtype),
                        vec![("dimension", ir.i64_attr(*axis as i64))],
                    )?;
                    Some(ir.op1(
                        b,
                        "stablehlo.optimization_barrier",
                        &[rolled],
                        e.t(&t.shape, t.dtype),
                        Vec::new(),
                    )?)
                }
            }
            OpKind::Slice {
                x,
                axis,
                start,
                len,
            } => {
                let t = self.ty(*x).clone();
                let mut starts = vec![0i64; t.shape.len()];
                starts[*axis] = *start as i64;
                let mut sizes = t.shape.clone();
                sizes[*axis] = *len;
                Some(e.slice(b, self.v(*x)?, t.dtype, &starts, &sizes)?)
            }
            OpKind::Concat { lhs, rhs, axis } => {
                let t = self.ty(*lhs).clone();
                let mut shape = t.shape.clone();
                shape[*axis] += self.ty(*rhs).shape[*axis];
                Some(ir.op1(
                    b,
                    "stablehlo.concatenate",
                    &[self.v(*lhs)?, self.v(*rhs)?],
                    e.t(&shape, t.dtype),
                    vec![("dimension", ir.i64_attr(*axis as i64))],
                )?)
            }
            OpKind::Reduce { op: r, x, axes } => {
                let rt = rt.clone().unwrap_or_else(|| TileType::scalar(DType::F32));
                Some(self.reduce(b, *r, *x, axes, &rt)?)
            }
            OpKind::Dot {
                lhs,
                rhs,
                dims,
                acc,
            } => {
                let rt = rt.clone().unwrap_or_else(|| TileType::scalar(*acc));
                Some(self.dot(b, *lhs, *rhs, dims, &rt)?)
            }
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                ..
            } => {
                self.for_loop(b, op, lower, upper, *step, init, body)?;
                return Ok(());
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                self.conditional(b, op, *cond, then_region, else_region)?;
                return Ok(());
            }
        };
        if let (Some(r), Some(v)) = (res, out) {
            self.set(r, v);
        }
        Ok(())
    }

    /// Starts and sizes of an access (points have size 1).
    pub(super) fn access(
        &self,
        b: &Block<'c>,
        indices: &[Index],
    ) -> Result<(Vec<Raw>, Vec<usize>), LoweringError> {
        let mut starts = Vec::new();
        let mut sizes = Vec::new();
        for ix in indices {
            let (s, n) = match ix {
                Index::Slice { start, len } => (start, *len),
                Index::Point(start) => (start, 1),
            };
            starts.push(self.start(b, s)?);
            sizes.push(n);
        }
        Ok((starts, sizes))
    }

    pub(super) fn convert(
        &self,
        b: &Block<'c>,
        x: Raw,
        from: &TileType,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        if from.dtype == to {
            return Ok(x);
        }
        if to == DType::Bool {
            let zero = self.e.splat(b, 0.0, from.dtype, &from.shape)?;
            return self
                .e
                .compare(b, CompareOp::Ne, x, zero, from.dtype, &from.shape);
        }
        self.e.ir.op1(
            b,
            "stablehlo.convert",
            &[x],
            self.e.t(&from.shape, to),
            Vec::new(),
        )
    }

    pub(super) fn unary(
        &self,
        b: &Block<'c>,
        u: UnaryOp,
        x: ValueId,
    ) -> Result<Raw, LoweringError> {
        let t = self.ty(x);
        let xv = self.v(x)?;
        let ty = self.e.t(&t.shape, t.dtype);
        let one = |name: &str, v: Raw| self.e.ir.op1(b, name, &[v], ty, Vec::new());
        match op_names::unary(u) {
            Some(name) => one(name, xv),
            None => {
                // exp2 only: StableHLO has no base-2 exponential.
                let ln2 = self.e.splat(b, std::f64::consts::LN_2, t.dtype, &t.shape)?;
                let y = self
                    .e
                    .bin(b, "stablehlo.multiply", xv, ln2, t.dtype, &t.shape)?;
                one("stablehlo.exponential", y)
            }
        }
    }

    pub(super) fn reduce(
        &self,
        b: &Block<'c>,
        r: ReduceOp,
        x: ValueId,
        axes: &[usize],
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        // NaN wins a float max or min, as on every other path.
        let nan_wins = matches!(r, ReduceOp::Max | ReduceOp::Min) && rt.dtype.is_float();
        self.e
            .reduce(b, self.v(x)?, r, axes, &rt.shape, rt.dtype, nan_wins)
    }

    pub(super) fn dot(
        &self,
        b: &Block<'c>,
        l: ValueId,
        r: ValueId,
        dims: &DotDims,
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let (lt, rtt) = (self.ty(l), self.ty(r));
        // Accumulate in the result type: widen the inputs first.
        let lv = self.convert(b, self.v(l)?, &lt, rt.dtype)?;
        let rv = self.convert(b, self.v(r)?, &rtt, rt.dtype)?;
        self.e.dot_general(b, lv, rv, dims, &rt.shape, rt.dtype)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn for_loop(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        lower: &IndexValue,
        upper: &IndexValue,
        step: i64,
        init: &[ValueId],
        body: &Region,
    ) -> Result<(), LoweringError> {
        let e = Hlo { ir: self.e.ir };
        let ir = e.ir;
        let mut bufs = BTreeSet::new();
        written(body, &self.slots, &mut bufs);
        let bufs: Vec<usize> = bufs.into_iter().collect();
        // State: the index (step 1) or a trip counter, carried values,
        // written buffers. With a step above 1 the counter runs 0, 1, ..
        // trips and the body computes its index lo + t * step: XLA's CPU
        // trip-count analysis drops a loop whose step is larger than its
        // span (`0 to 1 step 3` ran zero times).
        let counter = step != 1;
        let lo = self.start(b, lower)?;
        let hi = self.start(b, upper)?;
        let bound = if !counter {
            hi
        } else {
            let span = e.bin(b, "stablehlo.subtract", hi, lo, DType::I32, &[])?;
            let round_up = e.scalar_i32(b, step - 1)?;
            let num = e.bin(b, "stablehlo.add", span, round_up, DType::I32, &[])?;
            let st = e.scalar_i32(b, step)?;
            let q = e.bin(b, "stablehlo.divide", num, st, DType::I32, &[])?;
            let zero = e.scalar_i32(b, 0)?;
            e.bin(b, "stablehlo.maximum", q, zero, DType::I32, &[])?
        };
        let mut types = vec![e.t(&[], DType::I32)];
        let mut state = vec![if counter { e.scalar_i32(b, 0)? } else { lo }];
        for v in init {
            let t = self.ty(*v);
            types.push(e.t(&t.shape, t.dtype));
            state.push(self.v(*v)?);
        }
        for &s in &bufs {
            types.push(self.buffer_type(s));
            state.push(self.bufs[s]);
        }
        let cond = ir.block(&types);
        let ca = ir.args(&cond);
        let lt = e.compare(&cond, CompareOp::Lt, ca[0], bound, DType::I32, &[])?;
        ir.op(
            &cond,
            "stablehlo.return",
            &[lt],
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        let inner = ir.block(&types);
        let a = ir.args(&inner);
        let iv = if counter {
            let st = e.scalar_i32(&inner, step)?;
            let offset = e.bin(&inner, "stablehlo.multiply", a[0], st, DType::I32, &[])?;
            e.bin(&inner, "stablehlo.add", lo, offset, DType::I32, &[])?
        } else {
            a[0]
        };
        for (arg, raw) in body.args.iter().zip(std::iter::once(&iv).chain(&a[1..])) {
            self.set(*arg, *raw);
        }
        let n = init.len();
        let saved: Vec<Raw> = bufs.iter().map(|&s| self.bufs[s]).collect();
        for (i, &s) in bufs.iter().enumerate() {
            self.bufs[s] = a[1 + n + i];
        }
        let yields = self.region(&inner, body)?;
        let one = e.scalar_i32(&inner, 1)?;
        let mut next = vec![e.bin(&inner, "stablehlo.add", a[0], one, DType::I32, &[])?];
        next.extend(yields);
        next.extend(bufs.iter().map(|&s| self.bufs[s]));
        ir.op(
            &inner,
            "stablehlo.return",
            &next,
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        for (i, &s) in bufs.iter().enumerate() {
            self.bufs[s] = saved[i];
        }
        let results = ir.op(
            b,
            "stablehlo.while",
            &state,
            &types,
            Vec::new(),
            vec![ir.region(cond), ir.region(inner)],
        )?;
        for (r, raw) in op.results.iter().zip(&results[1..]) {
            self.set(*r, *raw);
        }
        for (i, &s) in bufs.iter().enumerate() {
            self.bufs[s] = results[1 + n + i];
        }
        Ok(())
    }

    pub(super) fn conditional(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        cond: ValueId,
        then_r: &Region,
        else_r: &Region,
    ) -> Result<(), LoweringError> {
        let ir = self.e.ir;
        let mut bufs = BTreeSet::new();
        written(then_r, &self.slots, &mut bufs);
        written(else_r, &self.slots, &mut bufs);
        let bufs: Vec<usize> = bufs.into_iter().collect();
        let mut types: Vec<Type<'c>> = op
            .results
            .iter()
            .map(|r| {
                let t = self.ty(*r);
                self.e.t(&t.shape, t.dtype)
            })
            .collect();
        types.extend(bufs.iter().map(|&s| self.buffer_type(s)));
        let saved: Vec<Raw> = bufs.iter().map(|&s| self.bufs[s]).collect();
        let branch =
            |r: &Region, this: &mut Self| -> Result<melior::ir::Region<'c>, LoweringError> {
                let blk = ir.block(&[]);
                let mut rets = this.region(&blk, r)?;
                rets.extend(bufs.iter().map(|&s| this.bufs[s]));
                ir.op(&blk, "stablehlo.return", &rets, &[], Vec::new(), Vec::new())?;
                for (i, &s) in bufs.iter().enumerate() {
                    this.bufs[s] = saved[i];
                }
                Ok(ir.region(blk))
            };
        let t = branch(then_r, self)?;
        let f = branch(else_r, self)?;
        let results = ir.op(
            b,
            "stablehlo.if",
            &[self.v(cond)?],
            &types,
            Attrs::new(),
            vec![t, f],
        )?;
        let n = op.results.len();
        for (r, raw) in op.results.iter().zip(&results) {
            self.set(*r, *raw);
        }
        for (i, &s) in bufs.iter().enumerate() {
            self.bufs[s] = results[n + i];
        }
        Ok(())
    }
}
