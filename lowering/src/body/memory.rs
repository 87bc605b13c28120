//! Loads and stores through operand windows: which dims an access keeps,
//! physical (transposed) windows, strided layouts, masked stores.

use melior::ir::Block;

use kernel_ir::{BufferRef, DType, Index, Op, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::convention::{Flavor, Window, memory_dtype};
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    /// Mosaic reaches `any` (HBM) memory only by DMA.
    pub(super) fn check_reachable(&self, op: &Op, b: BufferRef) -> Result<(), LoweringError> {
        if let (Flavor::Mosaic, BufferRef::Operand(i)) = (self.flavor, b)
            && self.k.operands[i].space == kernel_ir::MemorySpace::Any
        {
            return Err(self.unsupported(
                op,
                &format!(
                    "operand `{}` is in memory space `any` (HBM), which a TPU kernel reaches only by DMA: copy the part you need into VMEM scratch with `make_async_copy(..).start()` and `.wait()`, or give it a block spec so it arrives in VMEM",
                    self.k.operands[i].name
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn window(&self, b: BufferRef) -> Option<&Window> {
        match b {
            BufferRef::Operand(i) => self.windows.get(i),
            _ => None,
        }
    }

    /// Starts, lengths and kept flags of an access, in memref dim order.
    pub(super) fn accesses(
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
    pub(super) fn kept_physical(&self, b: BufferRef, indices: &[Index]) -> Option<Vec<usize>> {
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

    pub(super) fn strided(&self, b: BufferRef) -> bool {
        self.window(b).is_some_and(|w| w.strides.is_some())
    }

    /// The vector shape a load/store moves: lengths from the first kept dim
    /// on (points before it are plain indices, after it unit dims).
    pub(super) fn moved_shape(acc: &[Access]) -> Vec<usize> {
        match acc.iter().position(|a| a.keep) {
            Some(first) => acc[first..].iter().map(|a| a.len).collect(),
            None => Vec::new(),
        }
    }

    pub(super) fn load(
        &mut self,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let base = self.base(b, false);
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
    pub(super) fn loaded_as(
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

    pub(super) fn store(
        &mut self,
        op: &Op,
        block: &Block<'c>,
        b: BufferRef,
        indices: &[Index],
        value: ValueId,
        mask: Option<ValueId>,
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        let base = self.base(b, true);
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
}
