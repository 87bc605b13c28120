//! Kernel body ops → vector/arith/math/scf (and a few tpu ops in the Mosaic
//! flavor).
//!
//! Tiles of rank ≥ 1 are vectors, rank-0 tiles are scalars, bool is `i1`.

use melior::ir::{Block, Type};

use kernel_ir::{
    BinaryOp, BufferRef, CompareOp, DType, DotDims, Index, IndexValue, Kernel, Op, OpKind,
    ReduceOp, Region, TileType, UnaryOp, ValueId,
};

use crate::LoweringError;
use crate::convention::{ArgLayout, Flavor, Window, memory_dtype};
use crate::lowered_values::LoweredValues;
use crate::mlir::{Ir, Raw};

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
        }
    }

    /// Emits the top-level region into the kernel function's entry block.
    pub fn top(&mut self, block: &Block<'c>) -> Result<(), LoweringError> {
        let region = &self.k.body.region;
        self.region(block, region)?;
        Ok(())
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
                let v = self.load(block, *buffer, indices, &rt)?;
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

    /// Mosaic reaches `any` (HBM) memory only by DMA.
    fn check_reachable(&self, op: &Op, b: BufferRef) -> Result<(), LoweringError> {
        if let (Flavor::Mosaic, BufferRef::Operand(i)) = (self.flavor, b)
            && self.k.operands[i].space == kernel_ir::MemorySpace::Any
        {
            return Err(self.unsupported(
                op,
                &format!(
                    "operand `{}` is in memory space `any` (HBM), which a TPU kernel reaches only by DMA, and Tessera does not model DMA yet; give it a block spec so it arrives in VMEM",
                    self.k.operands[i].name
                ),
            ));
        }
        Ok(())
    }

    fn window(&self, b: BufferRef) -> Option<&Window> {
        match b {
            BufferRef::Operand(i) => self.windows.get(i),
            _ => None,
        }
    }

    /// Starts, lengths and kept flags of an access, in memref dim order.
    fn accesses(
        &self,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
    ) -> Result<Vec<Access>, LoweringError> {
        let mut logical = Vec::with_capacity(indices.len());
        for ix in indices {
            logical.push(match ix {
                Index::Slice { start, len } => Access {
                    start: self.index_value(block, start)?,
                    len: *len,
                    keep: true,
                },
                Index::Point(start) => Access {
                    start: self.index_value(block, start)?,
                    len: 1,
                    keep: false,
                },
            });
        }
        Ok(match self.window(b) {
            Some(w) if !w.physical.is_empty() => {
                let mut slots: Vec<Option<Access>> = logical.into_iter().map(Some).collect();
                w.physical
                    .iter()
                    .map(|&d| slots[d].take().expect("a permutation"))
                    .collect()
            }
            _ => logical,
        })
    }

    /// Logical kept dims in memref order, when the memref is permuted.
    fn kept_physical(&self, b: BufferRef, indices: &[Index]) -> Option<Vec<usize>> {
        let w = self.window(b)?;
        if w.physical.is_empty() {
            return None;
        }
        Some(
            w.physical
                .iter()
                .copied()
                .filter(|&d| matches!(indices[d], Index::Slice { .. }))
                .collect(),
        )
    }

    fn strided(&self, b: BufferRef) -> bool {
        self.window(b).is_some_and(|w| w.strides.is_some())
    }

    /// The vector shape a load/store moves: lengths from the first kept dim
    /// on (points before it are plain indices, after it unit dims).
    fn moved_shape(acc: &[Access]) -> Vec<usize> {
        match acc.iter().position(|a| a.keep) {
            Some(first) => acc[first..].iter().map(|a| a.len).collect(),
            None => Vec::new(),
        }
    }

    fn load(
        &mut self,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let base = self.args[self.layout.arg(b, false)];
        let acc = self.accesses(block, b, indices)?;
        let starts: Vec<Raw> = acc.iter().map(|a| a.start).collect();
        let mem = memory_dtype(self.flavor, rt.dtype);
        let elem = ir.elem(mem);
        if acc.iter().all(|a| !a.keep) {
            let mut ops = vec![base];
            ops.extend(starts);
            let v = ir.op1(block, "memref.load", &ops, elem, Vec::new())?;
            return self.loaded_as(block, v, &TileType::scalar(mem), rt.dtype);
        }
        let moved = Self::moved_shape(&acc);
        let moved_ty = ir.shaped_vector(&moved, elem);
        let mut ops = vec![base];
        ops.extend(&starts);
        let mut v = if self.strided(b) {
            let pad = ir.op1(
                block,
                "arith.constant",
                &[],
                elem,
                vec![("value", ir.literal(0.0, rt.dtype, elem)?)],
            )?;
            ops.push(pad);
            let rank = acc.len();
            let (map, in_bounds) = transfer_attrs(ir, rank, moved.len())?;
            ir.op1(
                block,
                "vector.transfer_read",
                &ops,
                moved_ty,
                vec![
                    ("permutation_map", map),
                    ("in_bounds", in_bounds),
                    ("operandSegmentSizes", ir.i32_array(&[1, rank as i32, 1, 0])),
                ],
            )?
        } else {
            ir.op1(block, "vector.load", &ops, moved_ty, Vec::new())?
        };
        // Drop unit dims of points after the first kept dim.
        let kept_shape: Vec<usize> = acc.iter().filter(|a| a.keep).map(|a| a.len).collect();
        if kept_shape != moved {
            v = ir.op1(
                block,
                "vector.shape_cast",
                &[v],
                ir.shaped_vector(&kept_shape, elem),
                Vec::new(),
            )?;
        }
        // Back to logical order for a permuted (Mosaic, layout-hinted) window.
        if let Some(kept) = self.kept_physical(b, indices) {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            if sorted != kept {
                let perm: Vec<usize> = sorted
                    .iter()
                    .map(|d| kept.iter().position(|k| k == d).unwrap_or(0))
                    .collect();
                v = self.transpose(
                    block,
                    v,
                    &TileType::new(mem, kept_shape_of(&kept, indices)),
                    &perm,
                )?;
            }
        }
        self.loaded_as(block, v, &TileType::new(mem, rt.shape.clone()), rt.dtype)
    }

    /// A value loaded as `mem` (its memory type) as a value of `dtype`:
    /// bools are i32 in Mosaic memory, and nonzero is true.
    fn loaded_as(
        &self,
        block: &Block<'c>,
        v: Raw,
        mem: &TileType,
        dtype: DType,
    ) -> Result<Raw, LoweringError> {
        if mem.dtype == dtype {
            return Ok(v);
        }
        self.convert(block, v, mem.clone(), dtype)
    }

    fn store(
        &mut self,
        op: &Op,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
        value: ValueId,
        mask: Option<ValueId>,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let base = self.args[self.layout.arg(b, true)];
        let acc = self.accesses(block, b, indices)?;
        let starts: Vec<Raw> = acc.iter().map(|a| a.start).collect();
        let mut vt = self.ty(value).clone();
        let mut v = self.v(value)?;
        let mem = memory_dtype(self.flavor, vt.dtype);
        if mem != vt.dtype {
            v = self.convert(block, v, vt.clone(), mem)?;
            vt.dtype = mem;
        }
        let elem = ir.elem(vt.dtype);
        let mut m = match mask {
            Some(m) => Some(self.v(m)?),
            None => None,
        };
        if acc.iter().all(|a| !a.keep) {
            let mut ops = vec![v, base];
            ops.extend(starts);
            ir.op(block, "memref.store", &ops, &[], Vec::new(), Vec::new())?;
            return Ok(());
        }
        // To memref order for a permuted window.
        if let Some(kept) = self.kept_physical(b, indices) {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            if sorted != kept {
                let perm: Vec<usize> = kept
                    .iter()
                    .map(|d| sorted.iter().position(|s| s == d).unwrap_or(0))
                    .collect();
                v = self.transpose(block, v, &vt, &perm)?;
                if let Some(mv) = m {
                    m = Some(self.transpose(
                        block,
                        mv,
                        &TileType::new(DType::Bool, vt.shape.clone()),
                        &perm,
                    )?);
                }
            }
        }
        // `tpu.vector_store` wants the vector at the memref's full rank
        // (unit dims for points); upstream `vector.store` takes the minor
        // dims from the first kept one on.
        let moved = match self.flavor {
            Flavor::Mosaic => acc.iter().map(|a| a.len).collect(),
            Flavor::Upstream => Self::moved_shape(&acc),
        };
        let kept_shape: Vec<usize> = acc.iter().filter(|a| a.keep).map(|a| a.len).collect();
        if kept_shape != moved {
            v = ir.op1(
                block,
                "vector.shape_cast",
                &[v],
                ir.shaped_vector(&moved, elem),
                Vec::new(),
            )?;
            if let Some(mv) = m {
                m = Some(ir.op1(
                    block,
                    "vector.shape_cast",
                    &[mv],
                    ir.shaped_vector(&moved, ir.i1()),
                    Vec::new(),
                )?);
            }
        }
        let moved_ty = ir.shaped_vector(&moved, elem);
        let rank = acc.len();
        match self.flavor {
            Flavor::Mosaic => {
                let mut ops = vec![v, base];
                ops.extend(&starts);
                let nmask = m.is_some() as i32;
                ops.extend(m);
                ir.op(
                    block,
                    "tpu.vector_store",
                    &ops,
                    &[],
                    vec![
                        ("strides", ir.i32_array(&[])),
                        (
                            "operandSegmentSizes",
                            ir.i32_array(&[1, 1, rank as i32, nmask]),
                        ),
                    ],
                    Vec::new(),
                )?;
            }
            Flavor::Upstream => {
                if let Some(mv) = m {
                    // Read-modify-write: masked-off elements keep their value.
                    let mut ops = vec![base];
                    ops.extend(&starts);
                    let old = if self.strided(b) {
                        return Err(
                            self.unsupported(op, "a masked store into a non-row-major window")
                        );
                    } else {
                        ir.op1(block, "vector.load", &ops, moved_ty, Vec::new())?
                    };
                    v = ir.op1(block, "arith.select", &[mv, v, old], moved_ty, Vec::new())?;
                }
                let mut ops = vec![v, base];
                ops.extend(&starts);
                if self.strided(b) {
                    let (map, in_bounds) = transfer_attrs(ir, rank, moved.len())?;
                    ir.op(
                        block,
                        "vector.transfer_write",
                        &ops,
                        &[],
                        vec![
                            ("permutation_map", map),
                            ("in_bounds", in_bounds),
                            ("operandSegmentSizes", ir.i32_array(&[1, 1, rank as i32, 0])),
                        ],
                        Vec::new(),
                    )?;
                } else {
                    ir.op(block, "vector.store", &ops, &[], Vec::new(), Vec::new())?;
                }
            }
        }
        Ok(())
    }

    // ---- compute ----

    fn iota(&self, block: &Block<'c>, ty: &TileType, dim: usize) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let i32v = ir.tile(&TileType::new(DType::I32, ty.shape.clone()));
        let ints = match self.flavor {
            // `tpu.iota` makes vectors of rank 2 and up: a rank-1 iota is
            // the row of a [1, n] one.
            Flavor::Mosaic if ty.shape.len() == 1 => {
                let row = ir.op1(
                    block,
                    "tpu.iota",
                    &[],
                    ir.shaped_vector(&[1, ty.shape[0]], ir.i32()),
                    vec![("dimensions", ir.i32_array(&[1]))],
                )?;
                ir.op1(block, "vector.shape_cast", &[row], i32v, Vec::new())?
            }
            Flavor::Mosaic => ir.op1(
                block,
                "tpu.iota",
                &[],
                i32v,
                vec![("dimensions", ir.i32_array(&[dim as i32]))],
            )?,
            Flavor::Upstream => {
                // vector.step along `dim`, broadcast with `dim` last, then
                // moved into place.
                let n = ty.shape[dim];
                let step = ir.op1(
                    block,
                    "vector.step",
                    &[],
                    ir.shaped_vector(&[n], ir.index()),
                    Vec::new(),
                )?;
                let step = ir.op1(
                    block,
                    "arith.index_cast",
                    &[step],
                    ir.shaped_vector(&[n], ir.i32()),
                    Vec::new(),
                )?;
                let rank = ty.shape.len();
                let mut moved: Vec<usize> = (0..rank).filter(|&d| d != dim).collect();
                moved.push(dim);
                let moved_shape: Vec<usize> = moved.iter().map(|&d| ty.shape[d]).collect();
                let b = if rank > 1 {
                    ir.op1(
                        block,
                        "vector.broadcast",
                        &[step],
                        ir.shaped_vector(&moved_shape, ir.i32()),
                        Vec::new(),
                    )?
                } else {
                    step
                };
                if dim == rank - 1 {
                    b
                } else {
                    // Result dim i is moved dim position of i.
                    let perm: Vec<usize> = (0..rank)
                        .map(|d| moved.iter().position(|&m| m == d).unwrap_or(0))
                        .collect();
                    self.transpose(block, b, &TileType::new(DType::I32, moved_shape), &perm)?
                }
            }
        };
        if ty.dtype == DType::I32 {
            Ok(ints)
        } else {
            self.convert(
                block,
                ints,
                TileType::new(DType::I32, ty.shape.clone()),
                ty.dtype,
            )
        }
    }

    fn unary(&self, block: &Block<'c>, u: UnaryOp, x: ValueId) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let t = self.ty(x).clone();
        let ty = ir.tile(&t);
        let xv = self.v(x)?;
        let float = t.dtype.is_float();
        let simple = |name: &str| ir.op1(block, name, &[xv], ty, Vec::new());
        match u {
            UnaryOp::Neg if float => simple("arith.negf"),
            UnaryOp::Neg => {
                let zero = self.constant(block, 0.0, &t)?;
                ir.op1(block, "arith.subi", &[zero, xv], ty, Vec::new())
            }
            UnaryOp::Abs if !float => simple("math.absi"),
            // On the generations with a bf16 VPU (v6e, v7x), libtpu's bf16
            // sine and cosine fail a type check on computed (packed)
            // operands; in f32 they compile everywhere, and are closer to
            // the reference too.
            UnaryOp::Sin | UnaryOp::Cos
                if self.flavor == Flavor::Mosaic && t.dtype == DType::BF16 =>
            {
                let wide = TileType::new(DType::F32, t.shape.clone());
                let x32 = self.convert(block, xv, t.clone(), DType::F32)?;
                let name = crate::op_names::unary_math(u).ok_or_else(|| {
                    LoweringError::Internal(format!("no math op for `{}`", u.name()))
                })?;
                let r = ir.op1(block, name, &[x32], ir.tile(&wide), Vec::new())?;
                self.convert(block, r, wide, DType::BF16)
            }
            UnaryOp::Logistic => {
                // 1 / (1 + exp(-x))
                let neg = simple("arith.negf")?;
                let e = ir.op1(block, "math.exp", &[neg], ty, Vec::new())?;
                let one = self.constant(block, 1.0, &t)?;
                let d = ir.op1(block, "arith.addf", &[one, e], ty, Vec::new())?;
                ir.op1(block, "arith.divf", &[one, d], ty, Vec::new())
            }
            UnaryOp::Not => {
                let ones =
                    self.constant(block, if t.dtype == DType::Bool { 1.0 } else { -1.0 }, &t)?;
                ir.op1(block, "arith.xori", &[xv, ones], ty, Vec::new())
            }
            // The rest are one `math` op each (the table in `op_names`).
            u => match crate::op_names::unary_math(u) {
                Some(name) => simple(name),
                None => Err(LoweringError::Internal(format!(
                    "no math op for `{}`",
                    u.name()
                ))),
            },
        }
    }

    fn binary(
        &self,
        block: &Block<'c>,
        b: BinaryOp,
        l: ValueId,
        r: ValueId,
    ) -> Result<Raw, LoweringError> {
        let t = self.ty(l).clone();
        let float = t.dtype.is_float();
        let name = binary_op_name(b, float);
        self.ir.op1(
            block,
            name,
            &[self.v(l)?, self.v(r)?],
            self.ir.tile(&t),
            Vec::new(),
        )
    }

    /// `cond ? a : b` for values of type `t`. Mosaic selects no i1 vectors,
    /// so bools are selected bitwise: `(cond & a) | (!cond & b)`.
    fn select(
        &self,
        block: &Block<'c>,
        cond: Raw,
        a: Raw,
        b: Raw,
        t: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let ty = ir.tile(t);
        if self.flavor == Flavor::Mosaic && t.dtype == DType::Bool && !t.shape.is_empty() {
            let not_cond = self.not(block, cond, t)?;
            let x = ir.op1(block, "arith.andi", &[cond, a], ty, Vec::new())?;
            let y = ir.op1(block, "arith.andi", &[not_cond, b], ty, Vec::new())?;
            return ir.op1(block, "arith.ori", &[x, y], ty, Vec::new());
        }
        ir.op1(block, "arith.select", &[cond, a, b], ty, Vec::new())
    }

    /// Logical not of a bool tile of `t`'s shape.
    fn not(&self, block: &Block<'c>, x: Raw, t: &TileType) -> Result<Raw, LoweringError> {
        let bool_t = TileType::new(DType::Bool, t.shape.clone());
        let all = self.constant(block, 1.0, &bool_t)?;
        self.ir.op1(
            block,
            "arith.xori",
            &[x, all],
            self.ir.tile(&bool_t),
            Vec::new(),
        )
    }

    /// `lhs <c> rhs` on values of type `t`, as a bool tile.
    fn compare(
        &self,
        block: &Block<'c>,
        c: CompareOp,
        lhs: Raw,
        rhs: Raw,
        t: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let bool_t = TileType::new(DType::Bool, t.shape.clone());
        let bool_ty = ir.tile(&bool_t);
        if self.flavor == Flavor::Mosaic && c == CompareOp::Ne && t.dtype.is_float() {
            // Mosaic has only ordered float predicates; `!=` (true on NaN)
            // is the negation of ordered `==`.
            let eq = self.compare(block, CompareOp::Eq, lhs, rhs, t)?;
            return self.not(block, eq, t);
        }
        if self.flavor == Flavor::Mosaic && t.dtype == DType::Bool && !t.shape.is_empty() {
            // Mosaic compares no i1 vectors; with false < true each
            // comparison is a bitwise formula.
            let and = |a: Raw, b: Raw| ir.op1(block, "arith.andi", &[a, b], bool_ty, Vec::new());
            let or = |a: Raw, b: Raw| ir.op1(block, "arith.ori", &[a, b], bool_ty, Vec::new());
            let xor = ir.op1(block, "arith.xori", &[lhs, rhs], bool_ty, Vec::new())?;
            return match c {
                CompareOp::Ne => Ok(xor),
                CompareOp::Eq => self.not(block, xor, t),
                CompareOp::Gt => and(lhs, self.not(block, rhs, t)?),
                CompareOp::Ge => or(lhs, self.not(block, rhs, t)?),
                CompareOp::Lt => and(self.not(block, lhs, t)?, rhs),
                CompareOp::Le => or(self.not(block, lhs, t)?, rhs),
            };
        }
        let (name, pred) = compare_predicate(c, t.dtype);
        ir.op1(
            block,
            name,
            &[lhs, rhs],
            bool_ty,
            vec![("predicate", ir.i64_attr(pred))],
        )
    }

    fn convert(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: TileType,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        if to == DType::Bool && from.dtype != DType::Bool {
            // Nonzero is true, through the one comparison rule.
            let zero = self.constant(block, 0.0, &from)?;
            return self.compare(block, CompareOp::Ne, x, zero, &from);
        }
        convert_values(self.ir, block, x, &from.shape, from.dtype, to)
    }

    fn broadcast_in_dim(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: TileType,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let elem = ir.elem(from.dtype);
        if from.shape == shape {
            return Ok(x);
        }
        if shape.is_empty() {
            return Ok(x);
        }
        // Insert unit dims so operand dims sit at `dims`, then broadcast.
        let mut v = x;
        if !from.shape.is_empty() {
            let mut unit = vec![1usize; shape.len()];
            for (i, &d) in dims.iter().enumerate() {
                unit[d] = from.shape[i];
            }
            if unit != from.shape {
                v = ir.op1(
                    block,
                    "vector.shape_cast",
                    &[v],
                    ir.shaped_vector(&unit, elem),
                    Vec::new(),
                )?;
            }
            if unit == shape {
                return Ok(v);
            }
        }
        ir.op1(
            block,
            "vector.broadcast",
            &[v],
            ir.shaped_vector(shape, elem),
            Vec::new(),
        )
    }

    fn reshape(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: &TileType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let elem = ir.elem(from.dtype);
        if from.shape == shape {
            return Ok(x);
        }
        if from.shape.is_empty() {
            return ir.op1(
                block,
                "vector.broadcast",
                &[x],
                ir.shaped_vector(shape, elem),
                Vec::new(),
            );
        }
        if shape.is_empty() {
            let zeros = vec![0i64; from.shape.len()];
            return ir.op1(
                block,
                "vector.extract",
                &[x],
                elem,
                vec![("static_position", ir.i64_array(&zeros))],
            );
        }
        ir.op1(
            block,
            "vector.shape_cast",
            &[x],
            ir.shaped_vector(shape, elem),
            Vec::new(),
        )
    }

    fn transpose(
        &self,
        block: &Block<'c>,
        x: Raw,
        from: &TileType,
        perm: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let undone = self.transposes.borrow().iter().find_map(|(out, src, p1)| {
            let inverse = out.ptr == x.ptr
                && p1.len() == perm.len()
                && perm.iter().enumerate().all(|(i, &p2)| p1[p2] == i);
            inverse.then_some(*src)
        });
        if let Some(src) = undone {
            return Ok(src);
        }
        let shape: Vec<usize> = perm.iter().map(|&p| from.shape[p]).collect();
        let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        let out = ir.op1(
            block,
            "vector.transpose",
            &[x],
            ir.shaped_vector(&shape, ir.elem(from.dtype)),
            vec![("permutation", ir.i64_array(&p))],
        )?;
        self.transposes.borrow_mut().push((out, x, perm.to_vec()));
        Ok(out)
    }

    fn reduce(
        &self,
        block: &Block<'c>,
        r: ReduceOp,
        x: ValueId,
        axes: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let t = self.ty(x).clone();
        let mut xv = self.v(x)?;
        // Mosaic reduces narrow floats only in some layouts ("Non-32-bit
        // reductions over replicated axes" on v6e/v7x, no scalar extract of
        // bf16): reduce bf16 in f32 and round once, as the reference does.
        let wide = self.flavor == Flavor::Mosaic && t.dtype == DType::BF16;
        let t = if wide {
            xv = self.convert(block, xv, t.clone(), DType::F32)?;
            TileType::new(DType::F32, t.shape.clone())
        } else {
            t
        };
        let out_shape: Vec<usize> = t
            .shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect();
        let out = TileType::new(t.dtype, out_shape);
        let float = t.dtype.is_float();
        let kind = match (r, float) {
            (ReduceOp::Sum, _) => "add",
            (ReduceOp::Max, true) => "maximumf",
            (ReduceOp::Min, true) => "minimumf",
            (ReduceOp::Max, false) => "maxsi",
            (ReduceOp::Min, false) => "minsi",
        };
        let init = r.identity(t.dtype);
        let acc = self.constant(block, init, &out)?;
        let a: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let reduced = ir.op1(
            block,
            "vector.multi_reduction",
            &[xv, acc],
            ir.tile(&out),
            vec![
                ("kind", ir.parse_attr(&format!("#vector.kind<{kind}>"))?),
                ("reduction_dims", ir.i64_array(&a)),
            ],
        )?;
        if wide {
            self.convert(block, reduced, out, DType::BF16)
        } else {
            Ok(reduced)
        }
    }

    fn dot(
        &self,
        block: &Block<'c>,
        l: ValueId,
        r: ValueId,
        dims: &DotDims,
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let (lt, rtt) = (self.ty(l).clone(), self.ty(r).clone());
        let acc = self.constant(block, 0.0, rt)?;
        let free = |rank: usize, b: &[usize], c: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !b.contains(d) && !c.contains(d))
                .collect()
        };
        let lf = free(lt.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
        let rf = free(rtt.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
        match self.flavor {
            Flavor::Mosaic => {
                let list = |v: &[usize]| {
                    let s: Vec<String> = v.iter().map(usize::to_string).collect();
                    format!("[{}]", s.join(", "))
                };
                let mut order: Vec<String> = Vec::new();
                for &d in &dims.lhs_batch {
                    order.push(format!("0, {d}"));
                }
                for &d in &lf {
                    order.push(format!("0, {d}"));
                }
                for &d in &rf {
                    order.push(format!("1, {d}"));
                }
                let dn = format!(
                    "#tpu.dot_dimension_numbers<{}, {}, {}, {}, [{}], {}, {}>",
                    list(&dims.lhs_contract),
                    list(&dims.rhs_contract),
                    list(&lf),
                    list(&rf),
                    order.join(", "),
                    list(&dims.lhs_batch),
                    list(&dims.rhs_batch)
                );
                ir.op1(
                    block,
                    "tpu.matmul",
                    &[self.v(l)?, self.v(r)?, acc],
                    ir.tile(rt),
                    vec![
                        ("dimension_numbers", ir.parse_attr(&dn)?),
                        ("transpose_lhs_hint", ir.parse_attr("false")?),
                    ],
                )
            }
            Flavor::Upstream => {
                // Iteration space: batch, lhs free, rhs free, contracting.
                let nb = dims.lhs_batch.len();
                let (nl, nr, nc) = (lf.len(), rf.len(), dims.lhs_contract.len());
                let n = nb + nl + nr + nc;
                let d = |i: usize| format!("d{i}");
                let lhs_map: Vec<String> = (0..lt.shape.len())
                    .map(|dim| {
                        if let Some(p) = dims.lhs_batch.iter().position(|&x| x == dim) {
                            d(p)
                        } else if let Some(p) = lf.iter().position(|&x| x == dim) {
                            d(nb + p)
                        } else {
                            d(nb + nl
                                + nr
                                + dims
                                    .lhs_contract
                                    .iter()
                                    .position(|&x| x == dim)
                                    .unwrap_or(0))
                        }
                    })
                    .collect();
                let rhs_map: Vec<String> = (0..rtt.shape.len())
                    .map(|dim| {
                        if let Some(p) = dims.rhs_batch.iter().position(|&x| x == dim) {
                            d(p)
                        } else if let Some(p) = rf.iter().position(|&x| x == dim) {
                            d(nb + nl + p)
                        } else {
                            d(nb + nl
                                + nr
                                + dims
                                    .rhs_contract
                                    .iter()
                                    .position(|&x| x == dim)
                                    .unwrap_or(0))
                        }
                    })
                    .collect();
                let out_map: Vec<String> = (0..nb + nl + nr).map(d).collect();
                let all: Vec<String> = (0..n).map(d).collect();
                let map = |m: &[String]| {
                    format!("affine_map<({}) -> ({})>", all.join(", "), m.join(", "))
                };
                let maps = format!("[{}, {}, {}]", map(&lhs_map), map(&rhs_map), map(&out_map));
                let iters: Vec<&str> = (0..n)
                    .map(|i| {
                        if i < nb + nl + nr {
                            "#vector.iterator_type<parallel>"
                        } else {
                            "#vector.iterator_type<reduction>"
                        }
                    })
                    .collect();
                // Widen the inputs to the accumulator type first: the host
                // lowering handles same-type contractions best.
                let widen = |v: ValueId, t: &TileType| -> Result<Raw, LoweringError> {
                    self.convert(block, self.v(v)?, t.clone(), rt.dtype)
                };
                let (lv, rv) = (widen(l, &lt)?, widen(r, &rtt)?);
                ir.op1(
                    block,
                    "vector.contract",
                    &[lv, rv, acc],
                    ir.tile(rt),
                    vec![
                        ("indexing_maps", ir.parse_attr(&maps)?),
                        (
                            "iterator_types",
                            ir.parse_attr(&format!("[{}]", iters.join(", ")))?,
                        ),
                        ("kind", ir.parse_attr("#vector.kind<add>")?),
                    ],
                )
            }
        }
    }
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
        (true, false) => one("arith.fptosi", x),
        (false, true) if from == DType::Bool => one("arith.uitofp", x),
        (false, true) => one("arith.sitofp", x),
        (false, false) if from == DType::Bool => one("arith.extui", x),
        (false, false) if from.bits() < to.bits() => one("arith.extsi", x),
        (false, false) => one("arith.trunci", x),
    }
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
