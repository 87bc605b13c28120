//! `dot`: the register-blocked micro-kernel (MR rows × NR lanes of
//! accumulators, `vector.fma` with broadcast lhs elements).
//!
//! The operands are laid out for it first, the way BLAS libraries do:
//!
//! * the rhs is **packed** into panels `[batch, n / NR, k, NR]`, so that the
//!   NR lanes one k step reads are one contiguous run and a whole panel
//!   (k × NR) stays in L1 while the MR-row tiles of the lhs sweep over it
//!   (a window read in place is one short run per block row instead);
//! * the lhs is read **in place** when it already is a window or buffer of
//!   the accumulator type (its elements are scalar loads, broadcast to the
//!   NR lanes, so its stride does not matter); otherwise it is computed
//!   into a row-major `[batch, m, k]` buffer.

use std::ops::Range;
use std::rc::Rc;

use melior::ir::Block;

use kernel_ir::{DType, DotDims, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::host::tiling::DotTiling;
use crate::mlir::Raw;

/// A dot operand as the micro-kernel reads it: element `(batch, row, col)`
/// of its flat `[batch, rows, cols]` view is element [`FlatView::at`] of
/// `node`.
struct FlatView {
    node: Rc<Node>,
    /// The node dims that carry batch, row and col (`None`: the group has
    /// only unit dims); every other node dim has size 1.
    dims: [Option<usize>; 3],
}

impl FlatView {
    /// The node index of flat element `(batch, row, col)`.
    fn at(&self, zero: Raw, flat: [Raw; 3]) -> Vec<Raw> {
        let mut idx = vec![zero; self.node.ty.shape.len()];
        for (d, v) in self.dims.iter().zip(flat) {
            if let Some(d) = d {
                idx[*d] = v;
            }
        }
        idx
    }
}

/// The one non-unit dim of each group of `shape` (`None` for an all-unit
/// group), or `None` when a group has two: such an operand has no single
/// node dim per flat dim and is computed into a flat buffer instead.
fn flat_dims(shape: &[usize], groups: [Range<usize>; 3]) -> Option<[Option<usize>; 3]> {
    let mut out = [None; 3];
    for (g, range) in groups.into_iter().enumerate() {
        let mut big = range.filter(|&d| shape[d] != 1);
        out[g] = big.next();
        if big.next().is_some() {
            return None;
        }
    }
    Some(out)
}

/// Where a register tile reads its lhs rows.
#[derive(Clone, Copy)]
enum LhsRows {
    /// From the lhs view, rows `i0..`.
    InPlace,
    /// From panel `tile` of the packed lhs `mem` ([`HostEmitter::packed_lhs`]).
    Panel { mem: Raw, tile: Raw },
}

/// The most register tile rows read in place: more rows than an L1 set
/// has ways (8 on the CPUs measured) conflict when the lhs stride is a
/// multiple of 4 KiB, and are packed ([`HostEmitter::packed_lhs`]).
const MAX_ROWS_IN_PLACE: usize = 8;

/// Register tile rows for `m` (a divisor, so no remainder loop).
fn tile_rows(m: usize) -> usize {
    [8, 4, 2, 1]
        .into_iter()
        .find(|r| m.is_multiple_of(*r))
        .unwrap_or(1)
}

/// The main register tile height for `m` rows and the rows left for a
/// tail of smaller tiles: the tuned tile's rows
/// ([`crate::HostTuning`]).
fn row_tiles(m: usize, t: DotTiling) -> (usize, usize) {
    let mr = t.rows;
    if m >= mr {
        (mr, m % mr)
    } else {
        (tile_rows(m), 0)
    }
}

/// Register tile lanes for `n` elements of `d`: up to the tuned tile's
/// width, the widest power of two dividing `n`.
fn tile_lanes(n: usize, d: DType, t: DotTiling) -> usize {
    let most = t.lanes(d.bytes());
    [64, 32, 16, 8, 4, 2, 1]
        .into_iter()
        .filter(|&r| r <= most)
        .find(|r| n.is_multiple_of(*r))
        .unwrap_or(1)
}

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
        let lf = dims.lhs_free(lt.shape.len());
        // A[batch, free, contract] and B[batch, contract, free].
        let lorder = dims.lhs_order(lt.shape.len());
        let rorder = dims.rhs_order(rt.shape.len());
        // Half-float accumulation runs in f32 and rounds at the end.
        let out_acc = acc;
        let acc = if is_half(acc) { DType::F32 } else { acc };
        let [bt, m, kk, nn] = dims.sizes(&lt.shape, &rt.shape);
        let nb = dims.lhs_batch.len();
        let a = self.lhs_view(b, &ln, &lorder, [nb, lf.len()], [bt, m, kk], acc)?;
        let tiling = self.tilings.for_dot(kk, nn);
        let nr = tile_lanes(nn, acc, tiling);
        let bp = self.packed_rhs(
            b,
            &rn,
            &rorder,
            [nb, dims.rhs_contract.len()],
            [bt, kk, nn],
            nr,
            acc,
        )?;
        // C[bt, m, n], row-major.
        let out_ty = self.ty(r);
        let c = self.alloc(b, &TileType::new(acc, vec![bt, m, nn]))?;
        let mr = row_tiles(m, tiling);
        let panels = self.packed_lhs(b, &a, [bt, m, kk], mr, nn / nr)?;
        self.micro_kernel(b, &a, panels, bp, c, [bt, m, kk, nn], mr, nr)?;
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

    /// The lhs as `[batch, m, k]`: in place when it is a window or buffer
    /// of dtype `to` with one node dim per flat dim, else computed into a
    /// row-major buffer.
    fn lhs_view(
        &mut self,
        b: &Block<'c>,
        n: &Rc<Node>,
        order: &[usize],
        [nb, nf]: [usize; 2],
        flat: [usize; 3],
        to: DType,
    ) -> Result<FlatView, LoweringError> {
        let rank = order.len();
        let node = Self::permuted(n, order);
        let readable = matches!(node.e, Expr::Window { .. } | Expr::Buf { .. });
        if node.ty.dtype == to
            && readable
            && let Some(dims) = flat_dims(&node.ty.shape, [0..nb, nb..nb + nf, nb + nf..rank])
        {
            return Ok(FlatView { node, dims });
        }
        // A transposed computed value (`pᵀ` and `dSᵀ` of a backward pass):
        // its source is written in its own order, along its contiguous last
        // dim, and read in place through the transpose, instead of being
        // gathered element by element into the transposed order (one scalar
        // load and insert per element, 7 % of a causal backward here).
        if let Expr::Transpose { src, perm } = &node.e
            && node.ty.dtype == to
            && let Some(dims) = flat_dims(&node.ty.shape, [0..nb, nb..nb + nf, nb + nf..rank])
        {
            let mem = self.materialize(b, src)?;
            return Ok(FlatView {
                node: Rc::new(Node {
                    e: Expr::Buf { mem },
                    ty: src.ty.clone(),
                }),
                dims: dims.map(|d| d.map(|d| perm[d])),
            });
        }
        let mem = self.canonical(b, n, order, to)?;
        self.flat_buffer(b, mem, flat, to)
    }

    /// A contiguous buffer seen as `[batch, rows, cols]`.
    fn flat_buffer(
        &self,
        b: &Block<'c>,
        mem: Raw,
        flat: [usize; 3],
        to: DType,
    ) -> Result<FlatView, LoweringError> {
        let mem = self.reshape_buf(b, mem, &flat, to)?;
        Ok(FlatView {
            node: Rc::new(Node {
                e: Expr::Buf { mem },
                ty: TileType::new(to, flat.to_vec()),
            }),
            dims: [Some(0), Some(1), Some(2)],
        })
    }

    /// The rhs packed into panels `[batch, n / nr, k, nr]` (see the module
    /// docs), converted to `to`.
    #[allow(clippy::too_many_arguments)]
    fn packed_rhs(
        &mut self,
        b: &Block<'c>,
        n: &Rc<Node>,
        order: &[usize],
        [nb, nc]: [usize; 2],
        [bt, k, nn]: [usize; 3],
        nr: usize,
        to: DType,
    ) -> Result<Raw, LoweringError> {
        let rank = order.len();
        let mut node = Self::permuted(n, order);
        if node.ty.dtype != to {
            node = Rc::new(Node {
                ty: TileType::new(to, node.ty.shape.clone()),
                e: Expr::Convert(node),
            });
        }
        // Vector reads along the node's last dim must walk the col dim.
        let direct = flat_dims(&node.ty.shape, [0..nb, nb..nb + nc, nb + nc..rank])
            .filter(|d| d[2].is_none_or(|c| c + 1 == rank) || nr == 1);
        let src = match direct {
            Some(dims) => FlatView { node, dims },
            None => {
                let mem = self.canonical(b, n, order, to)?;
                self.flat_buffer(b, mem, [bt, k, nn], to)?
            }
        };
        let packed = self.alloc(b, &TileType::new(to, vec![bt, nn / nr, k, nr]))?;
        if let Some(along_k) = Self::readable_along_k(&src, k, nr) {
            self.pack_transposed(b, &along_k, packed, [bt, nn / nr, k, nr])?;
            return Ok(packed);
        }
        let ir = self.ir;
        let w = chunk(nr);
        let shape = [bt, nn / nr, k, nr];
        self.for_each_chunk(b, &shape, w, &mut |blk, idx| {
            let (bi, jb, kx, lane) = (idx[0], idx[1], idx[2], idx[3]);
            let nrc = self.idx(blk, nr as i64)?;
            let j0 = ir.op1(blk, "arith.muli", &[jb, nrc], ir.index(), Vec::new())?;
            let j = ir.op1(blk, "arith.addi", &[j0, lane], ir.index(), Vec::new())?;
            let zero = self.idx(blk, 0)?;
            let v = self.eval(blk, &src.node, &src.at(zero, [bi, kx, j]), w)?;
            self.store_vec(blk, v, packed, idx, w, to)
        })?;
        Ok(packed)
    }

    /// When the rhs is contiguous along k rather than n (a transposed
    /// operand: `k` of `q·kᵀ` stored row-major, `qᵀ` in a backward pass),
    /// the same elements viewed with the k dim last, so that 16 k values
    /// of one column are one vector load; `None` when vector loads along n
    /// already work or the tile sizes are not whole 16 × 16 squares.
    fn readable_along_k(src: &FlatView, k: usize, nr: usize) -> Option<FlatView> {
        fn unit_stride_last(n: &Node) -> bool {
            match &n.e {
                Expr::Window { contiguous, .. } => *contiguous,
                Expr::Buf { .. } => true,
                Expr::Convert(a) => unit_stride_last(a),
                _ => false,
            }
        }
        fn swapped(n: &Rc<Node>, perm: &[usize]) -> Rc<Node> {
            match &n.e {
                Expr::Convert(a) => {
                    let inner = swapped(a, perm);
                    Rc::new(Node {
                        ty: TileType::new(n.ty.dtype, inner.ty.shape.clone()),
                        e: Expr::Convert(inner),
                    })
                }
                _ => HostEmitter::permuted(n, perm),
            }
        }
        let (Some(kd), Some(nd)) = (src.dims[1], src.dims[2]) else {
            return None;
        };
        if LANES != 16
            || src.node.ty.dtype.bytes() != 4
            || !k.is_multiple_of(LANES)
            || !nr.is_multiple_of(LANES)
            || unit_stride_last(&src.node)
        {
            return None;
        }
        let mut perm: Vec<usize> = (0..src.node.ty.shape.len()).collect();
        perm.swap(kd, nd);
        let alt = swapped(&src.node, &perm);
        unit_stride_last(&alt).then(|| FlatView {
            node: alt,
            // The swap put k in n's place and n in k's.
            dims: [src.dims[0], Some(nd), Some(kd)],
        })
    }

    /// Packs `[batch, n / nr, k, nr]` panels from a view contiguous along
    /// k: 16 columns × 16 k values are loaded as 16 vectors, transposed in
    /// registers (four rounds of shuffles swapping ever smaller blocks) and
    /// stored as 16 panel rows.
    fn pack_transposed(
        &self,
        b: &Block<'c>,
        src: &FlatView,
        packed: Raw,
        [bt, panels, k, nr]: [usize; 4],
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let d = src.node.ty.dtype;
        let vty = self.vec_ty(LANES, d);
        let shape = [bt, panels, k / LANES, nr / LANES];
        self.for_each_chunk(b, &shape, 1, &mut |blk, idx| {
            let (bi, jb, kb, cb) = (idx[0], idx[1], idx[2], idx[3]);
            let c = |v: i64| self.idx(blk, v);
            let mul = |x: Raw, y: i64| -> Result<Raw, LoweringError> {
                ir.op1(blk, "arith.muli", &[x, c(y)?], ir.index(), Vec::new())
            };
            let add = |x: Raw, y: Raw| ir.op1(blk, "arith.addi", &[x, y], ir.index(), Vec::new());
            let k0 = mul(kb, LANES as i64)?;
            let c0 = mul(cb, LANES as i64)?;
            let j0 = add(mul(jb, nr as i64)?, c0)?;
            let zero = c(0)?;
            let mut rows = Vec::with_capacity(LANES);
            for r in 0..LANES {
                let j = add(j0, c(r as i64)?)?;
                rows.push(self.eval(blk, &src.node, &src.at(zero, [bi, k0, j]), LANES)?);
            }
            let mut s = LANES / 2;
            while s > 0 {
                let lo: Vec<i64> = (0..LANES)
                    .map(|l| if l & s == 0 { l } else { LANES + l - s } as i64)
                    .collect();
                let hi: Vec<i64> = (0..LANES)
                    .map(|l| if l & s == 0 { l + s } else { LANES + l } as i64)
                    .collect();
                for i in (0..LANES).filter(|i| i & s == 0) {
                    let (x, y) = (rows[i], rows[i + s]);
                    let shuffle = |mask: &[i64]| {
                        ir.op1(
                            blk,
                            "vector.shuffle",
                            &[x, y],
                            vty,
                            vec![("mask", ir.i64_array(mask))],
                        )
                    };
                    rows[i] = shuffle(&lo)?;
                    rows[i + s] = shuffle(&hi)?;
                }
                s /= 2;
            }
            for (q, row) in rows.into_iter().enumerate() {
                let kq = add(k0, c(q as i64)?)?;
                self.store_vec(blk, row, packed, &[bi, jb, kq, c0], LANES, d)?;
            }
            Ok(())
        })
    }

    /// `src` with its dims reordered (output dim `i` is source dim
    /// `perm[i]`); a window stays a window, with its index map permuted, so
    /// that reading it along its unit-stride dim is still a vector load.
    pub(super) fn permuted(src: &Rc<Node>, perm: &[usize]) -> Rc<Node> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return src.clone();
        }
        let shape: Vec<usize> = perm.iter().map(|&p| src.ty.shape[p]).collect();
        let ty = TileType::new(src.ty.dtype, shape);
        let e = match &src.e {
            Expr::Window {
                mem, start, out_of, ..
            } => {
                let out_of: Vec<Option<usize>> = out_of
                    .iter()
                    .map(|o| o.and_then(|o| perm.iter().position(|&p| p == o)))
                    .collect();
                Expr::Window {
                    mem: *mem,
                    start: start.clone(),
                    contiguous: out_of.last() == Some(&Some(perm.len() - 1)),
                    out_of,
                    site: None,
                }
            }
            Expr::Transpose {
                src: inner,
                perm: first,
            } => {
                let both: Vec<usize> = perm.iter().map(|&p| first[p]).collect();
                return Self::permuted(inner, &both);
            }
            _ => Expr::Transpose {
                src: src.clone(),
                perm: perm.to_vec(),
            },
        };
        Rc::new(Node { e, ty })
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

    /// The lhs rows the main register tiles read, packed into row panels
    /// `[batch, tiles, k, mr]` (`mr` the tile's rows), so that one k step
    /// broadcasts `mr` consecutive elements; the tail rows stay in place.
    /// Read in place, a tile's rows are one stride apart, and a stride of
    /// a multiple of 4 KiB (a 1024-wide f32 matrix) puts every row in one
    /// L1 set: a tile of more rows than a set has ways misses on every k
    /// step (13 × 8 ran a 1024-deep matmul block 1.7× slower read in place
    /// than packed on an AVX2 EPYC). Packing costs a pass over the lhs
    /// (6 × 16 ran 8–15 % slower packed there), so tiles of at most
    /// [`MAX_ROWS_IN_PLACE`] rows read in place; so do a single panel of
    /// the rhs, which reads each row once anyway, and element types other
    /// than 4-byte ones.
    fn packed_lhs(
        &mut self,
        b: &Block<'c>,
        a: &FlatView,
        [bt, m, k]: [usize; 3],
        (mr, tail): (usize, usize),
        rhs_panels: usize,
    ) -> Result<Option<Raw>, LoweringError> {
        let d = a.node.ty.dtype;
        let tiles = (m - tail) / mr;
        if tiles == 0 || mr <= MAX_ROWS_IN_PLACE || rhs_panels < 2 || d.bytes() != 4 {
            return Ok(None);
        }
        let ir = self.ir;
        let packed = self.alloc(b, &TileType::new(d, vec![bt, tiles, k, mr]))?;
        // Vector reads along k where k is the node's last dim.
        let last = a.node.ty.shape.len().checked_sub(1);
        let w = if a.dims[2].is_some() && a.dims[2] == last {
            chunk(k)
        } else {
            1
        };
        self.for_each_chunk(b, &[bt, tiles, mr, k], w, &mut |blk, idx| {
            let (bi, t, r, kx) = (idx[0], idx[1], idx[2], idx[3]);
            let mrc = self.idx(blk, mr as i64)?;
            let i0 = ir.op1(blk, "arith.muli", &[t, mrc], ir.index(), Vec::new())?;
            let i = ir.op1(blk, "arith.addi", &[i0, r], ir.index(), Vec::new())?;
            let zero = self.idx(blk, 0)?;
            let v = self.eval(blk, &a.node, &a.at(zero, [bi, i, kx]), w)?;
            for j in 0..w {
                let s = ir.op1(
                    blk,
                    "vector.extract",
                    &[v],
                    ir.elem(reg(d)),
                    vec![("static_position", ir.i64_array(&[j as i64]))],
                )?;
                let jc = self.idx(blk, j as i64)?;
                let kj = ir.op1(blk, "arith.addi", &[kx, jc], ir.index(), Vec::new())?;
                ir.op(
                    blk,
                    "memref.store",
                    &[s, packed, bi, t, kj, r],
                    &[],
                    Vec::new(),
                    Vec::new(),
                )?;
            }
            Ok(())
        })?;
        Ok(Some(packed))
    }

    /// `C[b] = A[b] · B[b]` with MR × NR register blocks over the packed
    /// rhs `bp`, the main tiles' lhs rows from `panels` when packed.
    #[allow(clippy::too_many_arguments)]
    fn micro_kernel(
        &self,
        b: &Block<'c>,
        a: &FlatView,
        panels: Option<Raw>,
        bp: Raw,
        c: Raw,
        [bt, m, k, n]: [usize; 4],
        (mr, tail): (usize, usize),
        nr: usize,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        // Row tiles inside column panels: one packed panel (k × NR) stays
        // in L1 while every row tile of the lhs passes over it.
        self.for_each_chunk(b, &[bt, n / nr], 1, &mut |blk, oidx| {
            let (bi, jb) = (oidx[0], oidx[1]);
            let nrc = self.idx(blk, nr as i64)?;
            let j0 = ir.op1(blk, "arith.muli", &[jb, nrc], ir.index(), Vec::new())?;
            let main = m - tail;
            self.for_each_chunk(blk, &[main / mr], 1, &mut |tb, t| {
                let mrc = self.idx(tb, mr as i64)?;
                let i0 = ir.op1(tb, "arith.muli", &[t[0], mrc], ir.index(), Vec::new())?;
                let rows = match panels {
                    Some(mem) => LhsRows::Panel { mem, tile: t[0] },
                    None => LhsRows::InPlace,
                };
                self.register_tile(tb, a, rows, bp, c, [bi, jb, j0, i0], mr, k, nr)
            })?;
            if tail > 0 {
                let tr = tile_rows(tail);
                self.for_each_chunk(blk, &[tail / tr], 1, &mut |tb, t| {
                    let trc = self.idx(tb, tr as i64)?;
                    let off = self.idx(tb, main as i64)?;
                    let i = ir.op1(tb, "arith.muli", &[t[0], trc], ir.index(), Vec::new())?;
                    let i0 = ir.op1(tb, "arith.addi", &[i, off], ir.index(), Vec::new())?;
                    let rows = LhsRows::InPlace;
                    self.register_tile(tb, a, rows, bp, c, [bi, jb, j0, i0], tr, k, nr)
                })?;
            }
            Ok(())
        })
    }

    /// One `mr × nr` block of C at rows `i0..`, columns `j0..` (panel `jb`,
    /// batch `bi`): accumulators in registers over the whole k loop.
    #[allow(clippy::too_many_arguments)]
    fn register_tile(
        &self,
        blk: &Block<'c>,
        a: &FlatView,
        rows_at: LhsRows,
        bp: Raw,
        c: Raw,
        [bi, jb, j0, i0]: [Raw; 4],
        mr: usize,
        k: usize,
        nr: usize,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        // The lhs view is in the accumulator type.
        let d = a.node.ty.dtype;
        let vty = self.vec_ty(nr, d);
        let float = d.is_float();
        let zero = ir.op1(
            blk,
            "arith.constant",
            &[],
            vty,
            vec![("value", ir.literal(0.0, d, vty)?)],
        )?;
        // The k loop unrolled by `unroll` (LLVM does not unroll a loop
        // carrying vector accumulators): fewer loop-carried moves and
        // index updates per FMA.
        let unroll = [4usize, 2, 1]
            .into_iter()
            .find(|u| k.is_multiple_of(*u))
            .unwrap_or(1);
        let init = vec![zero; mr];
        let accs = self.carried_loop(blk, (k, unroll), &init, vty, &mut |inner, k0, carried| {
            let izero = self.idx(inner, 0)?;
            let rows: Vec<Raw> = (0..mr)
                .map(|r| {
                    let rc = self.idx(inner, r as i64)?;
                    ir.op1(inner, "arith.addi", &[i0, rc], ir.index(), Vec::new())
                })
                .collect::<Result<_, _>>()?;
            let mut accs = carried.to_vec();
            for u in 0..unroll {
                let kx = if u == 0 {
                    k0
                } else {
                    let uc = self.idx(inner, u as i64)?;
                    ir.op1(inner, "arith.addi", &[k0, uc], ir.index(), Vec::new())?
                };
                let bv = ir.op1(
                    inner,
                    "vector.load",
                    &[bp, bi, jb, kx, izero],
                    vty,
                    Vec::new(),
                )?;
                for (r, &i) in rows.iter().enumerate() {
                    let s = match rows_at {
                        LhsRows::InPlace => {
                            let one = self.eval(inner, &a.node, &a.at(izero, [bi, i, kx]), 1)?;
                            self.lane0(inner, one, d)?
                        }
                        LhsRows::Panel { mem, tile } => {
                            let rc = self.idx(inner, r as i64)?;
                            ir.op1(
                                inner,
                                "memref.load",
                                &[mem, bi, tile, kx, rc],
                                ir.elem(reg(d)),
                                Vec::new(),
                            )?
                        }
                    };
                    let av = ir.op1(inner, "vector.broadcast", &[s], vty, Vec::new())?;
                    accs[r] = if float {
                        ir.op1(inner, "vector.fma", &[av, bv, accs[r]], vty, Vec::new())?
                    } else {
                        let p = ir.op1(inner, "arith.muli", &[av, bv], vty, Vec::new())?;
                        ir.op1(inner, "arith.addi", &[p, accs[r]], vty, Vec::new())?
                    };
                }
            }
            Ok(accs)
        })?;
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
    }
}
