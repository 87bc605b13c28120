//! `dot`: the register-blocked micro-kernel (MR rows × NR lanes of
//! accumulators, `vector.fma` with broadcast lhs elements).

use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{DType, DotDims, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::mlir::Raw;

impl<'c> HostEmitter<'_, 'c> {
    pub(super) fn dot(
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
    pub(super) fn reshape_buf(
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
    pub(super) fn micro_kernel(
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
            // The k loop unrolled by `unroll` (LLVM does not unroll a loop
            // carrying vector accumulators): fewer loop-carried moves and
            // index updates per FMA.
            let unroll = [4usize, 2, 1]
                .into_iter()
                .find(|u| k.is_multiple_of(*u))
                .unwrap_or(1);
            let one = self.idx(blk, unroll as i64)?;
            let mut types = vec![ir.index()];
            types.extend(std::iter::repeat_n(vty, mr));
            let inner = ir.block(&types);
            let args = ir.args(&inner);
            let rows: Vec<Raw> = (0..mr)
                .map(|r| {
                    let rc = self.idx(&inner, r as i64)?;
                    ir.op1(&inner, "arith.addi", &[i0, rc], ir.index(), Vec::new())
                })
                .collect::<Result<_, _>>()?;
            let mut accs: Vec<Raw> = args[1..].to_vec();
            for u in 0..unroll {
                let kk = if u == 0 {
                    args[0]
                } else {
                    let uc = self.idx(&inner, u as i64)?;
                    ir.op1(&inner, "arith.addi", &[args[0], uc], ir.index(), Vec::new())?
                };
                let bv = ir.op1(&inner, "vector.load", &[bm, bi, kk, j0], vty, Vec::new())?;
                for (r, &i) in rows.iter().enumerate() {
                    let s = ir.op1(
                        &inner,
                        "memref.load",
                        &[a, bi, i, kk],
                        ir.elem(d),
                        Vec::new(),
                    )?;
                    let av = ir.op1(&inner, "vector.broadcast", &[s], vty, Vec::new())?;
                    accs[r] = if float {
                        ir.op1(&inner, "vector.fma", &[av, bv, accs[r]], vty, Vec::new())?
                    } else {
                        let p = ir.op1(&inner, "arith.muli", &[av, bv], vty, Vec::new())?;
                        ir.op1(&inner, "arith.addi", &[p, accs[r]], vty, Vec::new())?
                    };
                }
            }
            let next = accs;
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
}
