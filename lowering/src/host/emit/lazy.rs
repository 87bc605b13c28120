//! Lazy expressions: elementwise ops fuse into a tree that is evaluated
//! chunk by chunk only where it is consumed (stored, reduced, used twice).

use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{BufferRef, DType, Index, Op, ValueId};

use super::*;
use crate::LoweringError;
use crate::mlir::Raw;

impl<'c> HostEmitter<'_, 'c> {
    pub(super) fn elementwise(
        &mut self,
        b: &Block<'c>,
        op: &Op,
        e: Expr,
    ) -> Result<(), LoweringError> {
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
    pub(super) fn maybe_materialize(
        &mut self,
        b: &Block<'c>,
        r: ValueId,
    ) -> Result<(), LoweringError> {
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
        ) || matches!(&n.e, Expr::Broadcast { src, .. } | Expr::Squeeze { src, .. } if matches!(src.e, Expr::Buf { .. } | Expr::Const(_) | Expr::Scalar(_)))
            || Self::one_op_on_memory(&n);
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

    /// One elementwise op between a buffer (or window) and a constant or
    /// scalar, such as a score scale: recomputing it at each use costs one
    /// op per element, less than storing it and loading it back.
    fn one_op_on_memory(n: &Node) -> bool {
        let memory = |x: &Node| matches!(x.e, Expr::Buf { .. } | Expr::Window { .. });
        let splat = |x: &Node| matches!(x.e, Expr::Const(_) | Expr::Scalar(_));
        match &n.e {
            Expr::Binary(_, a, c) => (memory(a) && splat(c)) || (splat(a) && memory(c)),
            Expr::Convert(a) => memory(a),
            _ => false,
        }
    }

    /// Does `n` read `mem` only through the window at `site`, and only
    /// through elementwise ops? Then a store of `n` to that site may run in
    /// place: each chunk is read before it is overwritten, and no other
    /// element is read.
    pub(super) fn reads_only_at(n: &Node, mem: Raw, site: &Site) -> bool {
        let rec = |a: &Node| Self::reads_only_at(a, mem, site);
        match &n.e {
            Expr::Window {
                mem: m, site: s, ..
            } => m.ptr != mem.ptr || s.as_ref().is_some_and(|s| s == site),
            Expr::Buf { .. } | Expr::Const(_) | Expr::Scalar(_) | Expr::Iota { .. } => true,
            Expr::Unary(_, a) | Expr::Convert(a) | Expr::Bitcast(a) => rec(a),
            Expr::Binary(_, a, c) | Expr::Compare(_, a, c) => rec(a) && rec(c),
            Expr::Select(a, c, d) => rec(a) && rec(c) && rec(d),
            Expr::Broadcast { src, .. }
            | Expr::Transpose { src, .. }
            | Expr::Roll { src, .. }
            | Expr::Slice { src, .. }
            | Expr::Squeeze { src, .. } => !Self::reads(src, mem),
        }
    }

    /// Does an expression read memref `mem`?
    pub(super) fn reads(n: &Node, mem: Raw) -> bool {
        match &n.e {
            Expr::Window { mem: m, .. } => m.ptr == mem.ptr,
            Expr::Buf { .. } | Expr::Const(_) | Expr::Scalar(_) | Expr::Iota { .. } => false,
            Expr::Unary(_, a) | Expr::Convert(a) | Expr::Bitcast(a) => Self::reads(a, mem),
            Expr::Broadcast { src, .. }
            | Expr::Transpose { src, .. }
            | Expr::Roll { src, .. }
            | Expr::Slice { src, .. }
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
    pub(super) fn freeze_readers(&mut self, b: &Block<'c>, mem: Raw) -> Result<(), LoweringError> {
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
    pub(super) fn eval(
        &self,
        b: &Block<'c>,
        n: &Node,
        idx: &[Raw],
        w: usize,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let d = n.ty.dtype;
        let vty = self.vec_ty(w, d);
        let rank = n.ty.shape.len();
        Ok(match &n.e {
            Expr::Const(v) => {
                let attr = self.lit(*v, d, vty)?;
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
                ..
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
                    let mut v = self.zeros(b, w, d)?;
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
                        v = self.insert_lane(b, s, v, vty, lane)?;
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
            Expr::Bitcast(a) => {
                let x = self.eval(b, a, idx, w)?;
                if a.ty.dtype == d {
                    x
                } else {
                    ir.op1(b, "arith.bitcast", &[x], vty, Vec::new())?
                }
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
            Expr::Slice { src, axis, start } => {
                let mut sidx = idx.to_vec();
                let off = self.idx(b, *start as i64)?;
                sidx[*axis] =
                    ir.op1(b, "arith.addi", &[idx[*axis], off], ir.index(), Vec::new())?;
                self.eval(b, src, &sidx, w)?
            }
            Expr::Roll { src, shift, axis } => {
                let size = n.ty.shape[*axis];
                // (i + n - shift) mod n: the source index of element i.
                let from = |i: Raw| -> Result<Raw, LoweringError> {
                    let back = self.idx(b, (size - shift) as i64)?;
                    let sum = ir.op1(b, "arith.addi", &[i, back], ir.index(), Vec::new())?;
                    let size = self.idx(b, size as i64)?;
                    ir.op1(b, "arith.remui", &[sum, size], ir.index(), Vec::new())
                };
                if *axis + 1 < rank || w == 1 {
                    let mut sidx = idx.to_vec();
                    sidx[*axis] = from(idx[*axis])?;
                    self.eval(b, src, &sidx, w)?
                } else if let Expr::Buf { mem } = src.e {
                    // Lane l reads (i + l + n - shift) mod n of the row.
                    let i32t = ir.i32();
                    let lanes = self.ir.shaped_vector(&[w], i32t);
                    let back: Vec<String> =
                        (0..w).map(|l| (l + size - shift).to_string()).collect();
                    let offsets = ir.op1(
                        b,
                        "arith.constant",
                        &[],
                        lanes,
                        vec![(
                            "value",
                            ir.parse_attr(&format!(
                                "dense<[{}]> : vector<{w}xi32>",
                                back.join(", ")
                            ))?,
                        )],
                    )?;
                    let start = ir.op1(b, "arith.index_cast", &[idx[*axis]], i32t, Vec::new())?;
                    let start = ir.op1(b, "vector.broadcast", &[start], lanes, Vec::new())?;
                    let sum = ir.op1(b, "arith.addi", &[start, offsets], lanes, Vec::new())?;
                    let n_lanes = ir.op1(
                        b,
                        "arith.constant",
                        &[],
                        lanes,
                        vec![(
                            "value",
                            ir.parse_attr(&format!("dense<{size}> : vector<{w}xi32>"))?,
                        )],
                    )?;
                    let from_lanes =
                        ir.op1(b, "arith.remui", &[sum, n_lanes], lanes, Vec::new())?;
                    let mask = ir.op1(
                        b,
                        "arith.constant",
                        &[],
                        self.ir.shaped_vector(&[w], ir.i1()),
                        vec![(
                            "value",
                            ir.parse_attr(&format!("dense<true> : vector<{w}xi1>"))?,
                        )],
                    )?;
                    let pass = self.zeros(b, w, d)?;
                    let mut base = idx.to_vec();
                    base[*axis] = self.idx(b, 0)?;
                    let mut ops = vec![mem];
                    ops.extend(base);
                    ops.extend([from_lanes, mask, pass]);
                    ir.op1(b, "vector.gather", &ops, vty, Vec::new())?
                } else {
                    // Along the vector: lane by lane, as a chunk may wrap.
                    self.lane_by_lane(b, src, idx, *axis, w, d, from)?
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
                    self.lane_by_lane(b, src, &sidx, perm[rank - 1], w, d, Ok)?
                }
            }
        })
    }

    /// A `w`-lane vector of zeros of dtype `d`.
    fn zeros(&self, b: &Block<'c>, w: usize, d: DType) -> Result<Raw, LoweringError> {
        let vty = self.vec_ty(w, d);
        let zero = self.lit(0.0, d, vty)?;
        self.ir
            .op1(b, "arith.constant", &[], vty, vec![("value", zero)])
    }

    /// `v` with scalar `s` in lane `lane`.
    fn insert_lane(
        &self,
        b: &Block<'c>,
        s: Raw,
        v: Raw,
        vty: Type<'c>,
        lane: usize,
    ) -> Result<Raw, LoweringError> {
        let at = self.ir.i64_array(&[lane as i64]);
        self.ir.op1(
            b,
            "vector.insert",
            &[s, v],
            vty,
            vec![("static_position", at)],
        )
    }

    /// A `w`-lane vector of `src` read one element at a time: lane `l`
    /// at `at` with `dim` replaced by `source(at[dim] + l)`.
    #[allow(clippy::too_many_arguments)]
    fn lane_by_lane(
        &self,
        b: &Block<'c>,
        src: &Node,
        at: &[Raw],
        dim: usize,
        w: usize,
        d: DType,
        source: impl Fn(Raw) -> Result<Raw, LoweringError>,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let vty = self.vec_ty(w, d);
        let mut v = self.zeros(b, w, d)?;
        for lane in 0..w {
            let mut li = at.to_vec();
            let l = self.idx(b, lane as i64)?;
            let i = ir.op1(b, "arith.addi", &[at[dim], l], ir.index(), Vec::new())?;
            li[dim] = source(i)?;
            let one = self.eval(b, src, &li, 1)?;
            let s = self.lane0(b, one, d)?;
            v = self.insert_lane(b, s, v, vty, lane)?;
        }
        Ok(v)
    }

    /// Loops over `shape` (the last dim in chunks of `w`), calling `body`
    /// with the block and the indices.
    pub(super) fn for_each_chunk(
        &self,
        b: &Block<'c>,
        shape: &[usize],
        w: usize,
        body: &mut ChunkBody<'_, 'c>,
    ) -> Result<(), LoweringError> {
        self.nest(b, shape, w, 0, &mut Vec::new(), body)
    }

    pub(super) fn nest(
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

    /// `scf.for iv = 0 to hi step st` carrying `init.len()` vectors of type
    /// `vty` (register accumulators); `body` gets the loop's block, the
    /// induction variable and the carried values and returns their next
    /// values. Returns the final values.
    pub(super) fn carried_loop(
        &self,
        b: &Block<'c>,
        (hi, st): (usize, usize),
        init: &[Raw],
        vty: melior::ir::Type<'c>,
        body: &mut CarriedBody<'_, 'c>,
    ) -> Result<Vec<Raw>, LoweringError> {
        let ir = self.ir;
        let mut types = vec![ir.index()];
        types.extend(std::iter::repeat_n(vty, init.len()));
        let inner = ir.block(&types);
        let args = ir.args(&inner);
        let next = body(&inner, args[0], &args[1..])?;
        ir.op(&inner, "scf.yield", &next, &[], Vec::new(), Vec::new())?;
        let mut ops = vec![
            self.idx(b, 0)?,
            self.idx(b, hi as i64)?,
            self.idx(b, st as i64)?,
        ];
        ops.extend(init);
        ir.op(
            b,
            "scf.for",
            &ops,
            &types[1..],
            Vec::new(),
            vec![ir.region(inner)],
        )
    }

    /// Computes `n` into a new buffer.
    pub(super) fn materialize(&mut self, b: &Block<'c>, n: &Node) -> Result<Raw, LoweringError> {
        if let Expr::Buf { mem } = n.e {
            return Ok(mem);
        }
        let mem = self.alloc(b, &n.ty)?;
        self.write(b, n, mem)?;
        Ok(mem)
    }

    /// Writes `n` into a buffer of its shape.
    pub(super) fn write(&self, b: &Block<'c>, n: &Node, mem: Raw) -> Result<(), LoweringError> {
        self.write_at(b, n, mem, 0, 0)
    }

    /// Writes `n` into a buffer whose dim `axis` is `offset` longer, at
    /// `offset` along it.
    pub(super) fn write_at(
        &self,
        b: &Block<'c>,
        n: &Node,
        mem: Raw,
        axis: usize,
        offset: usize,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let w = chunk(*n.ty.shape.last().unwrap_or(&1));
        self.for_each_chunk(b, &n.ty.shape.clone(), w, &mut |blk, idx| {
            let v = self.eval(blk, n, idx, w)?;
            let mut at = idx.to_vec();
            if offset != 0 {
                let off = self.idx(blk, offset as i64)?;
                at[axis] = ir.op1(blk, "arith.addi", &[idx[axis], off], ir.index(), Vec::new())?;
            }
            self.store_vec(blk, v, mem, &at, w, n.ty.dtype)
        })
    }

    pub(super) fn store(
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
                    ir.elem(reg(vt.dtype)),
                    Vec::new(),
                )?;
            }
            return self.store_scalar(b, s, mem, &start, vt.dtype);
        }
        let mut n = self.node(value)?;
        let site: Site = (bref, indices.to_vec());
        if Self::reads(&n, mem) && !Self::reads_only_at(&n, mem, &site) {
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
}
