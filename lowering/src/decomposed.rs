//! Target 3: the kernel as plain StableHLO, runnable on any PJRT back end.
//!
//! * Arrays are padded to whole blocks, so the last (partial) block of a
//!   dim is sliced like any other, and the padding is cut off at the end.
//! * The grid is one `stablehlo.while` over all steps in row-major order;
//!   each step derives its grid indices, evaluates the index maps, and
//!   takes its windows with `dynamic_slice`. Output arrays and scratch are
//!   loop-carried; an output window is read from the carried array (so a
//!   block revisited across steps accumulates) and written back with
//!   `dynamic_update_slice`.
//! * Inside a step, a buffer (window, scratch) is an SSA tensor: a store
//!   makes a new one. Kernel `for` loops become `stablehlo.while` and
//!   conditionals `stablehlo.if`, threading the buffers they write.
//!
//! Ops are generic-form StableHLO (the dialect is not part of upstream
//! MLIR), which PJRT plugins accept.

use std::collections::BTreeSet;

use melior::ir::operation::OperationMutLike;
use melior::ir::{Block, BlockLike, Module, Type};

use kernel_ir::{
    BufferRef, CompareOp, DType, DotDims, Index, IndexExpr, IndexOp, IndexValue, Kernel,
    MemorySpace, Op, OpKind, ReduceOp, Region, TileType, UnaryOp, ValueId, VerifiedKernel,
};

use crate::LoweringError;
use crate::lowered_values::LoweredValues;
use crate::mlir::{Attrs, Ir, Mlir, Raw};
use crate::op_names;

/// Lowers `kernel` to a StableHLO module `@main(prefetch.., inputs..) ->
/// outputs..`, printed.
pub fn decomposed(kernel: &VerifiedKernel) -> Result<String, LoweringError> {
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let module = build(&ir, kernel)?;
    m.verify(&module, "decomposed StableHLO module")?;
    Ok(module.as_operation().to_string())
}

/// Slots of the buffers a step can touch: prefetch, operands, scratch.
#[derive(Clone, Copy)]
struct Slots {
    prefetch: usize,
    operands: usize,
}

impl Slots {
    fn of(&self, b: BufferRef) -> usize {
        match b {
            BufferRef::Prefetch(i) => i,
            BufferRef::Operand(i) => self.prefetch + i,
            BufferRef::Scratch(i) => self.prefetch + self.operands + i,
        }
    }
}

/// Padded extent of each operand dim: whole blocks (the array for `any`).
fn padded_shape(o: &kernel_ir::Operand) -> Vec<usize> {
    if o.space == MemorySpace::Any {
        return o.shape.clone();
    }
    o.shape
        .iter()
        .zip(&o.block.shape)
        .map(|(&n, &b)| n.div_ceil(b) * b)
        .collect()
}

fn build<'c>(ir: &Ir<'c>, k: &Kernel) -> Result<Module<'c>, LoweringError> {
    let module = Module::new(ir.loc());
    let inputs: Vec<usize> = (0..k.operands.len())
        .filter(|&i| k.operands[i].role.is_input())
        .collect();
    let outputs: Vec<usize> = (0..k.operands.len())
        .filter(|&i| k.operands[i].role.is_output())
        .collect();
    let mut main_in = Vec::new();
    for p in &k.prefetch {
        main_in.push(ir.tensor(&p.shape, p.dtype));
    }
    for &i in &inputs {
        main_in.push(ir.tensor(&k.operands[i].shape, k.operands[i].dtype));
    }
    let main_out: Vec<Type<'c>> = outputs
        .iter()
        .map(|&i| ir.tensor(&k.operands[i].shape, k.operands[i].dtype))
        .collect();
    let block = ir.block(&main_in);
    let args = ir.args(&block);
    let e = Hlo { ir };

    // Whole arrays, padded to whole blocks.
    let prefetch: Vec<Raw> = args[..k.prefetch.len()].to_vec();
    let mut arrays: Vec<Option<Raw>> = vec![None; k.operands.len()];
    for (n, &i) in inputs.iter().enumerate() {
        let o = &k.operands[i];
        arrays[i] = Some(e.pad(
            &block,
            args[k.prefetch.len() + n],
            o.dtype,
            &o.shape,
            &padded_shape(o),
        )?);
    }
    // Outputs start as zeros (in-out ones as their input).
    let mut carried_types = vec![ir.tensor(&[], DType::I32)];
    let mut init = vec![e.scalar_i32(&block, 0)?];
    for &i in &outputs {
        let o = &k.operands[i];
        let shape = padded_shape(o);
        let v = match arrays[i] {
            Some(v) => v,
            None => e.splat(&block, 0.0, o.dtype, &shape)?,
        };
        carried_types.push(ir.tensor(&shape, o.dtype));
        init.push(v);
    }
    for s in &k.scratch {
        carried_types.push(ir.tensor(&s.shape, s.dtype));
        init.push(e.splat(&block, 0.0, s.dtype, &s.shape)?);
    }
    let steps = k.grid.steps() as i64;

    // cond: step < steps
    let cond = ir.block(&carried_types);
    let cargs = ir.args(&cond);
    let limit = e.scalar_i32(&cond, steps)?;
    let lt = e.compare(&cond, CompareOp::Lt, cargs[0], limit, DType::I32, &[])?;
    ir.op(
        &cond,
        "stablehlo.return",
        &[lt],
        &[],
        Vec::new(),
        Vec::new(),
    )?;

    // body: one grid step
    let body = ir.block(&carried_types);
    let bargs = ir.args(&body);
    let step = bargs[0];
    let mut grid = Vec::new();
    let mut stride = 1i64;
    let bounds = k.grid.bounds();
    let mut strides = vec![0i64; bounds.len()];
    for d in (0..bounds.len()).rev() {
        strides[d] = stride;
        stride *= bounds[d] as i64;
    }
    for d in 0..bounds.len() {
        let s = e.scalar_i32(&body, strides[d])?;
        let q = e.bin(&body, "stablehlo.divide", step, s, DType::I32, &[])?;
        let b = e.scalar_i32(&body, bounds[d] as i64)?;
        grid.push(e.bin(&body, "stablehlo.remainder", q, b, DType::I32, &[])?);
    }
    let slots = Slots {
        prefetch: k.prefetch.len(),
        operands: k.operands.len(),
    };
    let mut bufs: Vec<Raw> = prefetch.clone();
    let mut starts: Vec<Vec<Raw>> = vec![Vec::new(); k.operands.len()];
    for (i, o) in k.operands.iter().enumerate() {
        let source = if o.role.is_output() {
            bargs[1 + outputs.iter().position(|&x| x == i).unwrap_or(0)]
        } else {
            arrays[i].ok_or_else(|| LoweringError::Internal("input array".into()))?
        };
        if o.space == MemorySpace::Any {
            bufs.push(source);
            continue;
        }
        let mut st = Vec::new();
        for (d, ex) in o.block.index_map.exprs.iter().enumerate() {
            let b = e.index_expr(&body, ex, &grid, &prefetch, k)?;
            let size = e.scalar_i32(&body, o.block.shape[d] as i64)?;
            st.push(e.bin(&body, "stablehlo.multiply", b, size, DType::I32, &[])?);
        }
        bufs.push(e.dynamic_slice(&body, source, &st, &o.block.shape, o.dtype)?);
        starts[i] = st;
    }
    let scratch_base = 1 + outputs.len();
    for (n, _) in k.scratch.iter().enumerate() {
        bufs.push(bargs[scratch_base + n]);
    }
    let mut em = Step {
        e: Hlo { ir },
        k,
        slots,
        grid: grid.clone(),
        values: LoweredValues::new(k),
        bufs,
    };
    em.region(&body, &k.body.region)?;
    let one = e.scalar_i32(&body, 1)?;
    let mut next = vec![e.bin(&body, "stablehlo.add", step, one, DType::I32, &[])?];
    for (n, &i) in outputs.iter().enumerate() {
        let o = &k.operands[i];
        let window = em.bufs[slots.of(BufferRef::Operand(i))];
        next.push(if o.space == MemorySpace::Any {
            window
        } else {
            e.dynamic_update_slice(
                &body,
                bargs[1 + n],
                window,
                &starts[i],
                carried_types[1 + n],
            )?
        });
    }
    for n in 0..k.scratch.len() {
        next.push(em.bufs[slots.of(BufferRef::Scratch(n))]);
    }
    ir.op(
        &body,
        "stablehlo.return",
        &next,
        &[],
        Vec::new(),
        Vec::new(),
    )?;
    let results = ir.op(
        &block,
        "stablehlo.while",
        &init,
        &carried_types,
        Vec::new(),
        vec![ir.region(cond), ir.region(body)],
    )?;
    let mut rets = Vec::new();
    for (n, &i) in outputs.iter().enumerate() {
        let o = &k.operands[i];
        rets.push(e.unpad(&block, results[1 + n], o.dtype, &padded_shape(o), &o.shape)?);
    }
    ir.op(&block, "func.return", &rets, &[], Vec::new(), Vec::new())?;
    let func = ir.public_main(block, &main_in, &main_out)?;
    let mut module = module;
    module.body().append_operation(func);
    module.as_operation_mut().set_attribute(
        "sym_name",
        ir.str_attr(&format!("tessera_{}_decomposed", k.name)),
    );
    Ok(module)
}

/// StableHLO op helpers on tensors.
struct Hlo<'a, 'c> {
    ir: &'a Ir<'c>,
}

impl<'c> Hlo<'_, 'c> {
    fn t(&self, shape: &[usize], d: DType) -> Type<'c> {
        self.ir.tensor(shape, d)
    }

    fn splat(
        &self,
        b: &Block<'c>,
        v: f64,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ty = self.t(shape, d);
        let attr = self.ir.literal(v, d, ty)?;
        self.ir
            .op1(b, "stablehlo.constant", &[], ty, vec![("value", attr)])
    }

    fn scalar_i32(&self, b: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.splat(b, v as f64, DType::I32, &[])
    }

    fn bin(
        &self,
        b: &Block<'c>,
        name: &str,
        x: Raw,
        y: Raw,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        self.ir.op1(b, name, &[x, y], self.t(shape, d), Vec::new())
    }

    fn compare(
        &self,
        b: &Block<'c>,
        c: CompareOp,
        x: Raw,
        y: Raw,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let dir = op_names::comparison_direction(c);
        let kind = if d.is_float() {
            "FLOAT"
        } else if d == DType::Bool {
            "UNSIGNED"
        } else {
            "SIGNED"
        };
        self.ir.op1(
            b,
            "stablehlo.compare",
            &[x, y],
            self.t(shape, DType::Bool),
            vec![
                (
                    "comparison_direction",
                    self.ir
                        .parse_attr(&format!("#stablehlo<comparison_direction {dir}>"))?,
                ),
                (
                    "compare_type",
                    self.ir
                        .parse_attr(&format!("#stablehlo<comparison_type {kind}>"))?,
                ),
            ],
        )
    }

    fn reshape(&self, b: &Block<'c>, x: Raw, d: DType, to: &[usize]) -> Result<Raw, LoweringError> {
        self.ir
            .op1(b, "stablehlo.reshape", &[x], self.t(to, d), Vec::new())
    }

    fn dynamic_slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        starts: &[Raw],
        sizes: &[usize],
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let mut ops = vec![x];
        ops.extend(starts);
        let s: Vec<i64> = sizes.iter().map(|&v| v as i64).collect();
        self.ir.op1(
            b,
            "stablehlo.dynamic_slice",
            &ops,
            self.t(sizes, d),
            vec![("slice_sizes", self.ir.i64_array(&s))],
        )
    }

    fn dynamic_update_slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        update: Raw,
        starts: &[Raw],
        ty: Type<'c>,
    ) -> Result<Raw, LoweringError> {
        let mut ops = vec![x, update];
        ops.extend(starts);
        self.ir
            .op1(b, "stablehlo.dynamic_update_slice", &ops, ty, Vec::new())
    }

    fn pad(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        from: &[usize],
        to: &[usize],
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(x);
        }
        let zero = self.splat(b, 0.0, d, &[])?;
        let lo = vec![0i64; from.len()];
        let hi: Vec<i64> = from.iter().zip(to).map(|(&f, &t)| (t - f) as i64).collect();
        self.ir.op1(
            b,
            "stablehlo.pad",
            &[x, zero],
            self.t(to, d),
            vec![
                ("edge_padding_low", self.ir.i64_array(&lo)),
                ("edge_padding_high", self.ir.i64_array(&hi)),
                ("interior_padding", self.ir.i64_array(&lo)),
            ],
        )
    }

    fn unpad(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        from: &[usize],
        to: &[usize],
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(x);
        }
        self.slice(b, x, d, &vec![0; to.len()], to)
    }

    fn slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        start: &[i64],
        sizes: &[usize],
    ) -> Result<Raw, LoweringError> {
        let limit: Vec<i64> = start
            .iter()
            .zip(sizes)
            .map(|(&s, &n)| s + n as i64)
            .collect();
        self.ir.op1(
            b,
            "stablehlo.slice",
            &[x],
            self.t(sizes, d),
            vec![
                ("start_indices", self.ir.i64_array(start)),
                ("limit_indices", self.ir.i64_array(&limit)),
                ("strides", self.ir.i64_array(&vec![1; sizes.len()])),
            ],
        )
    }

    /// An index expression as an i32 scalar tensor.
    fn index_expr(
        &self,
        b: &Block<'c>,
        e: &IndexExpr,
        grid: &[Raw],
        prefetch: &[Raw],
        k: &Kernel,
    ) -> Result<Raw, LoweringError> {
        let i32t = DType::I32;
        Ok(match e {
            IndexExpr::Const(v) => self.scalar_i32(b, *v)?,
            IndexExpr::Grid(d) => *grid
                .get(*d)
                .ok_or_else(|| LoweringError::Internal(format!("grid dim {d}")))?,
            IndexExpr::Prefetch { operand, at } => {
                let p = k
                    .prefetch
                    .get(*operand)
                    .ok_or_else(|| LoweringError::Internal("prefetch".into()))?;
                let idx = at
                    .iter()
                    .map(|a| self.index_expr(b, a, grid, prefetch, k))
                    .collect::<Result<Vec<_>, _>>()?;
                let one = vec![1usize; p.shape.len()];
                let v = self.dynamic_slice(b, prefetch[*operand], &idx, &one, i32t)?;
                self.reshape(b, v, i32t, &[])?
            }
            IndexExpr::Binary(op, x, y) => {
                let x = self.index_expr(b, x, grid, prefetch, k)?;
                let y = self.index_expr(b, y, grid, prefetch, k)?;
                match op {
                    IndexOp::Add => self.bin(b, "stablehlo.add", x, y, i32t, &[])?,
                    IndexOp::Sub => self.bin(b, "stablehlo.subtract", x, y, i32t, &[])?,
                    IndexOp::Mul => self.bin(b, "stablehlo.multiply", x, y, i32t, &[])?,
                    IndexOp::Min => self.bin(b, "stablehlo.minimum", x, y, i32t, &[])?,
                    IndexOp::Max => self.bin(b, "stablehlo.maximum", x, y, i32t, &[])?,
                    IndexOp::FloorDiv | IndexOp::Rem => {
                        // Truncating division fixed up to floor semantics.
                        let q = self.bin(b, "stablehlo.divide", x, y, i32t, &[])?;
                        let r = self.bin(b, "stablehlo.remainder", x, y, i32t, &[])?;
                        let zero = self.scalar_i32(b, 0)?;
                        let nonzero = self.compare(b, CompareOp::Ne, r, zero, i32t, &[])?;
                        let r_neg = self.compare(b, CompareOp::Lt, r, zero, i32t, &[])?;
                        let y_neg = self.compare(b, CompareOp::Lt, y, zero, i32t, &[])?;
                        let differ =
                            self.bin(b, "stablehlo.xor", r_neg, y_neg, DType::Bool, &[])?;
                        let fix =
                            self.bin(b, "stablehlo.and", differ, nonzero, DType::Bool, &[])?;
                        let t = self.t(&[], i32t);
                        if *op == IndexOp::FloorDiv {
                            let one = self.scalar_i32(b, 1)?;
                            let q1 = self.bin(b, "stablehlo.subtract", q, one, i32t, &[])?;
                            self.ir
                                .op1(b, "stablehlo.select", &[fix, q1, q], t, Vec::new())?
                        } else {
                            let r1 = self.bin(b, "stablehlo.add", r, y, i32t, &[])?;
                            self.ir
                                .op1(b, "stablehlo.select", &[fix, r1, r], t, Vec::new())?
                        }
                    }
                }
            }
        })
    }
}

/// Emits one grid step's body.
struct Step<'a, 'c> {
    e: Hlo<'a, 'c>,
    k: &'a Kernel,
    slots: Slots,
    grid: Vec<Raw>,
    values: LoweredValues<Raw>,
    /// Current tensor of every buffer slot.
    bufs: Vec<Raw>,
}

/// Buffer slots written anywhere in a region.
fn written(r: &Region, slots: &Slots, out: &mut BTreeSet<usize>) {
    for op in &r.ops {
        if let OpKind::Store { buffer, .. } = &op.kind {
            out.insert(slots.of(*buffer));
        }
        for sub in op.kind.regions() {
            written(sub, slots, out);
        }
    }
}

impl<'c> Step<'_, 'c> {
    fn v(&self, id: ValueId) -> Result<Raw, LoweringError> {
        self.values.get(id)
    }

    fn ty(&self, id: ValueId) -> TileType {
        self.k.body.values[id.index()].clone()
    }

    fn set(&mut self, id: ValueId, raw: Raw) {
        self.values.set(id, raw);
    }

    fn buffer_type(&self, slot: usize) -> Type<'c> {
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

    fn region(&mut self, b: &Block<'c>, r: &Region) -> Result<Vec<Raw>, LoweringError> {
        for op in &r.ops {
            self.op(b, op)?;
        }
        r.yields.iter().map(|y| self.v(*y)).collect()
    }

    fn start(&self, b: &Block<'c>, iv: &IndexValue) -> Result<Raw, LoweringError> {
        match iv {
            IndexValue::Static(s) => self.e.scalar_i32(b, *s),
            IndexValue::Dynamic(v) => self.v(*v),
        }
    }

    fn op(&mut self, b: &Block<'c>, op: &Op) -> Result<(), LoweringError> {
        let e = &self.e;
        let ir = e.ir;
        let res = op.results.first().copied();
        let rt = res.map(|r| self.ty(r));
        let out = match &op.kind {
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
                Some(e.bin(b, name, self.v(*lhs)?, self.v(*rhs)?, t.dtype, &t.shape)?)
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
    fn access(
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

    fn convert(
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

    fn unary(&self, b: &Block<'c>, u: UnaryOp, x: ValueId) -> Result<Raw, LoweringError> {
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

    fn reduce(
        &self,
        b: &Block<'c>,
        r: ReduceOp,
        x: ValueId,
        axes: &[usize],
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let e = &self.e;
        let ir = e.ir;
        let d = rt.dtype;
        let name = op_names::reduction(r);
        let init = r.identity(d);
        let init = e.splat(b, init, d, &[])?;
        let scalar = e.t(&[], d);
        let inner = ir.block(&[scalar, scalar]);
        let a = ir.args(&inner);
        let s = ir.op1(&inner, name, &[a[0], a[1]], scalar, Vec::new())?;
        ir.op(
            &inner,
            "stablehlo.return",
            &[s],
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        ir.op(
            b,
            "stablehlo.reduce",
            &[self.v(x)?, init],
            &[e.t(&rt.shape, d)],
            vec![("dimensions", ir.i64_array(&ax))],
            vec![ir.region(inner)],
        )?
        .first()
        .copied()
        .ok_or_else(|| LoweringError::Internal("reduce".into()))
    }

    fn dot(
        &self,
        b: &Block<'c>,
        l: ValueId,
        r: ValueId,
        dims: &DotDims,
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let e = &self.e;
        let (lt, rtt) = (self.ty(l), self.ty(r));
        // Accumulate in the result type: widen the inputs first.
        let lv = self.convert(b, self.v(l)?, &lt, rt.dtype)?;
        let rv = self.convert(b, self.v(r)?, &rtt, rt.dtype)?;
        let list = |v: &[usize]| {
            let s: Vec<String> = v.iter().map(usize::to_string).collect();
            format!("[{}]", s.join(", "))
        };
        let dn = format!(
            "#stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
            list(&dims.lhs_batch),
            list(&dims.rhs_batch),
            list(&dims.lhs_contract),
            list(&dims.rhs_contract)
        );
        e.ir.op1(
            b,
            "stablehlo.dot_general",
            &[lv, rv],
            e.t(&rt.shape, rt.dtype),
            vec![("dot_dimension_numbers", e.ir.parse_attr(&dn)?)],
        )
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
        let e = Hlo { ir: self.e.ir };
        let ir = e.ir;
        let mut bufs = BTreeSet::new();
        written(body, &self.slots, &mut bufs);
        let bufs: Vec<usize> = bufs.into_iter().collect();
        // State: iv, carried values, written buffers.
        let mut types = vec![e.t(&[], DType::I32)];
        let mut state = vec![self.start(b, lower)?];
        for v in init {
            let t = self.ty(*v);
            types.push(e.t(&t.shape, t.dtype));
            state.push(self.v(*v)?);
        }
        for &s in &bufs {
            types.push(self.buffer_type(s));
            state.push(self.bufs[s]);
        }
        let hi = self.start(b, upper)?;
        let cond = ir.block(&types);
        let ca = ir.args(&cond);
        let lt = e.compare(&cond, CompareOp::Lt, ca[0], hi, DType::I32, &[])?;
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
        for (arg, raw) in body.args.iter().zip(&a) {
            self.set(*arg, *raw);
        }
        let n = init.len();
        let saved: Vec<Raw> = bufs.iter().map(|&s| self.bufs[s]).collect();
        for (i, &s) in bufs.iter().enumerate() {
            self.bufs[s] = a[1 + n + i];
        }
        let yields = self.region(&inner, body)?;
        let st = e.scalar_i32(&inner, step)?;
        let mut next = vec![e.bin(&inner, "stablehlo.add", a[0], st, DType::I32, &[])?];
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

    fn conditional(
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
