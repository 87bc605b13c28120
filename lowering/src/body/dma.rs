//! Copies, semaphores and scopes in Mosaic's ops, as Pallas emits them
//! (read from a jax 0.11.2 export of a kernel with `make_async_copy`,
//! semaphores and `run_scoped`):
//!
//! * a view is `tpu.memref_slice` (i32 starts, unit length for points)
//!   then `tpu.memref_squeeze` when points drop dims;
//! * `tpu.enqueue_dma source target target_semaphore`, and
//!   `tpu.wait_dma2 semaphore src dst` rebuilt from the same views;
//! * `tpu.sem_signal`, `tpu.sem_wait`, `tpu.sem_read` on a sliced and
//!   squeezed semaphore;
//! * a scope is `tpu.region` whose block allocates with `memref.alloca`
//!   and `tpu.sem_alloc` and ends in `tpu.yield`.
//!
//! Only the Mosaic flavor sees these ops: the CPU targets lower the
//! kernel after [`kernel_ir::VerifiedKernel::with_synchronous_copies`].

use melior::ir::{Block, Type};

use kernel_ir::{
    BufferRef, BufferSlice, CopyDescriptor, Index, MemorySpace, Op, Region, SemaphoreSlot,
};

use super::BodyEmitter;
use crate::LoweringError;
use crate::convention::{Flavor, memory_dtype, memory_space, semaphore_type};
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    fn mosaic_only(&self, op: &Op) -> Result<(), LoweringError> {
        match self.flavor {
            Flavor::Mosaic => Ok(()),
            Flavor::Upstream => Err(crate::removed_by_synchronous_pass(
                op,
                "upstream kernel module",
            )),
        }
    }

    /// The memref a buffer's view lives in: shape, element type, space.
    fn buffer_memref(&self, b: BufferRef) -> (Vec<usize>, kernel_ir::DType, MemorySpace) {
        match b {
            BufferRef::Operand(i) => {
                let o = &self.k.operands[i];
                (o.view_shape().to_vec(), o.dtype, o.space)
            }
            BufferRef::Scratch(i) => {
                let s = &self.k.scratch[i];
                (s.shape.clone(), s.dtype, s.space)
            }
            BufferRef::Prefetch(i) => {
                let p = &self.k.prefetch[i];
                (p.shape.clone(), p.dtype, MemorySpace::Smem)
            }
        }
    }

    /// Slices `base` (a memref of `shape`) at `indices` and squeezes the
    /// points away; the whole memref when every index is a full slice.
    fn sliced(
        &self,
        block: &Block<'c>,
        base: Raw,
        shape: &[usize],
        indices: &[Index],
        memref: impl Fn(&[usize]) -> Type<'c>,
    ) -> Result<Raw, LoweringError> {
        let whole = indices.iter().zip(shape).all(|(i, &n)| {
            matches!(i, Index::Slice { start: kernel_ir::IndexValue::Static(0), len } if *len == n)
        });
        if whole {
            return Ok(base);
        }
        let ir = self.ir;
        let mut ops = vec![base];
        let mut lens = Vec::with_capacity(indices.len());
        let mut kept = Vec::new();
        for ix in indices {
            let (start, len) = match ix {
                Index::Slice { start, len } => {
                    kept.push(*len);
                    (start, *len)
                }
                Index::Point(start) => (start, 1),
            };
            ops.push(self.i32_value(block, start)?);
            lens.push(len);
        }
        let rank = indices.len() as i32;
        let slice = ir.op1(
            block,
            "tpu.memref_slice",
            &ops,
            memref(&lens),
            vec![("operandSegmentSizes", ir.i32_array(&[1, rank, 0]))],
        )?;
        if kept.len() == lens.len() {
            return Ok(slice);
        }
        ir.op1(
            block,
            "tpu.memref_squeeze",
            &[slice],
            memref(&kept),
            Vec::new(),
        )
    }

    fn view(&self, block: &Block<'c>, v: &BufferSlice, write: bool) -> Result<Raw, LoweringError> {
        let (shape, dtype, space) = self.buffer_memref(v.buffer);
        let space = memory_space(self.ir, space, self.flavor)?;
        let mem = memory_dtype(self.flavor, dtype);
        let base = self.base(v.buffer, write);
        self.sliced(block, base, &shape, &v.indices, |s| {
            self.ir.memref(s, mem, None, space)
        })
    }

    fn semaphore(&self, block: &Block<'c>, s: &SemaphoreSlot) -> Result<Raw, LoweringError> {
        let a = &self.k.semaphores[s.array];
        let base = self.semaphore_base(s.array);
        let indices: Vec<Index> = s.at.iter().map(|i| Index::Point(*i)).collect();
        self.sliced(block, base, &a.shape, &indices, |shape| {
            semaphore_type(self.ir, a.kind, shape)
        })
    }

    pub(super) fn dma(
        &mut self,
        block: &Block<'c>,
        op: &Op,
        c: &CopyDescriptor,
        start: bool,
    ) -> Result<(), LoweringError> {
        self.mosaic_only(op)?;
        // In Pallas's order: the semaphore, the destination, the source.
        let sem = self.semaphore(block, &c.sem)?;
        let dst = self.view(block, &c.dst, true)?;
        let src = self.view(block, &c.src, false)?;
        // Pallas's remote form adds the send semaphore after the source and
        // the device after the target semaphore (a wait: the peer's device).
        let remote = match &c.remote {
            Some(r) => Some((
                self.semaphore(block, &r.send_sem)?,
                self.i32_value(block, &r.device)?,
            )),
            None => None,
        };
        match (start, remote) {
            (true, None) => self.enqueue_dma(block, &[src, dst, sem], &[1, 0, 1, 1, 0, 0, 0]),
            (true, Some((send, device))) => self.enqueue_dma(
                block,
                &[src, send, dst, sem, device],
                &[1, 1, 1, 1, 1, 0, 0],
            ),
            (false, None) => self.wait_dma(block, &[sem, src, dst], &[1, 1, 1, 0, 0]),
            (false, Some((_, device))) => {
                self.wait_dma(block, &[sem, src, dst, device], &[1, 1, 1, 1, 0])
            }
        }
    }

    /// `tpu.enqueue_dma` with its operands and their segment sizes.
    fn enqueue_dma(
        &self,
        block: &Block<'c>,
        operands: &[Raw],
        segments: &[i32],
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        ir.op(
            block,
            "tpu.enqueue_dma",
            operands,
            &[],
            vec![
                ("operandSegmentSizes", ir.i32_array(segments)),
                ("priority", ir.i32_attr(0)),
                ("strict_ordering", ir.parse_attr("false")?),
            ],
            Vec::new(),
        )?;
        Ok(())
    }

    /// `tpu.wait_dma2` with its operands and their segment sizes.
    fn wait_dma(
        &self,
        block: &Block<'c>,
        operands: &[Raw],
        segments: &[i32],
    ) -> Result<(), LoweringError> {
        let ir = self.ir;
        ir.op(
            block,
            "tpu.wait_dma2",
            operands,
            &[],
            vec![
                ("operandSegmentSizes", ir.i32_array(segments)),
                ("strict_ordering", ir.parse_attr("false")?),
            ],
            Vec::new(),
        )?;
        Ok(())
    }

    /// `tpu.wait_dma2` on a remote copy's send semaphore: its bytes have
    /// left this device.
    pub(super) fn dma_wait_send(
        &mut self,
        block: &Block<'c>,
        op: &Op,
        c: &CopyDescriptor,
    ) -> Result<(), LoweringError> {
        self.mosaic_only(op)?;
        let Some(r) = &c.remote else {
            return Err(self.unsupported(op, "a local copy has no send side"));
        };
        let send = self.semaphore(block, &r.send_sem)?;
        let dst = self.view(block, &c.dst, true)?;
        let src = self.view(block, &c.src, false)?;
        self.wait_dma(block, &[send, src, dst], &[1, 1, 1, 0, 0])
    }

    /// `tpu.device_id`: this chip's logical id.
    pub(super) fn device_id(&mut self, block: &Block<'c>, op: &Op) -> Result<Raw, LoweringError> {
        self.mosaic_only(op)?;
        self.ir
            .op1(block, "tpu.device_id", &[], self.ir.i32(), Vec::new())
    }

    /// `tpu.sem_signal %s, %n device_id %d`.
    pub(super) fn remote_signal(
        &mut self,
        block: &Block<'c>,
        op: &Op,
        sem: &SemaphoreSlot,
        amount: &kernel_ir::IndexValue,
        device: &kernel_ir::IndexValue,
    ) -> Result<(), LoweringError> {
        self.mosaic_only(op)?;
        let ir = self.ir;
        let s = self.semaphore(block, sem)?;
        let n = self.i32_value(block, amount)?;
        let d = self.i32_value(block, device)?;
        ir.op(
            block,
            "tpu.sem_signal",
            &[s, n, d],
            &[],
            vec![("operandSegmentSizes", ir.i32_array(&[1, 1, 1, 0, 0]))],
            Vec::new(),
        )?;
        Ok(())
    }

    pub(super) fn sem_op(
        &mut self,
        block: &Block<'c>,
        op: &Op,
        sem: &SemaphoreSlot,
        amount: Option<&kernel_ir::IndexValue>,
        signal: bool,
    ) -> Result<Option<Raw>, LoweringError> {
        self.mosaic_only(op)?;
        let ir = self.ir;
        let s = self.semaphore(block, sem)?;
        let Some(amount) = amount else {
            return Ok(Some(ir.op1(
                block,
                "tpu.sem_read",
                &[s],
                ir.i32(),
                Vec::new(),
            )?));
        };
        let n = self.i32_value(block, amount)?;
        if signal {
            ir.op(
                block,
                "tpu.sem_signal",
                &[s, n],
                &[],
                vec![("operandSegmentSizes", ir.i32_array(&[1, 1, 0, 0, 0]))],
                Vec::new(),
            )?;
        } else {
            ir.op(block, "tpu.sem_wait", &[s, n], &[], Vec::new(), Vec::new())?;
        }
        Ok(None)
    }

    pub(super) fn scope(
        &mut self,
        block: &Block<'c>,
        op: &Op,
        scratch: &[usize],
        semaphores: &[usize],
        body: &Region,
    ) -> Result<(), LoweringError> {
        self.mosaic_only(op)?;
        let ir = self.ir;
        let inner = ir.block(&[]);
        for &i in scratch {
            let s = &self.k.scratch[i];
            let space = memory_space(ir, s.space, self.flavor)?;
            let ty = ir.memref(&s.shape, memory_dtype(self.flavor, s.dtype), None, space);
            let v = ir.op1(
                &inner,
                "memref.alloca",
                &[],
                ty,
                vec![("operandSegmentSizes", ir.i32_array(&[0, 0]))],
            )?;
            self.scoped.insert(BufferRef::Scratch(i), v);
        }
        for &i in semaphores {
            let a = &self.k.semaphores[i];
            let v = ir.op1(
                &inner,
                "tpu.sem_alloc",
                &[],
                semaphore_type(ir, a.kind, &a.shape),
                Vec::new(),
            )?;
            self.scoped_semaphores.insert(i, v);
        }
        self.region(&inner, body)?;
        ir.op(&inner, "tpu.yield", &[], &[], Vec::new(), Vec::new())?;
        ir.op(
            block,
            "tpu.region",
            &[],
            &[],
            Vec::new(),
            vec![ir.region(inner)],
        )?;
        Ok(())
    }
}
