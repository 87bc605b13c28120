//! Asynchronous copies and semaphores: the data movement a kernel does by
//! hand (Pallas's `make_async_copy`, `SemaphoreType`, `run_scoped`).
//!
//! A copy is described by a [`CopyDescriptor`]: a source and a destination view
//! (a buffer with one [`Index`] per dim, as loads and stores take) and the
//! DMA semaphore the copy signals. `dma_start` enqueues it; `dma_wait`
//! with a descriptor of the same size blocks until that many bytes have
//! arrived on the semaphore. The descriptor is plain data, rebuilt for the
//! wait, so a copy started in one grid step can be waited in the next
//! (the double-buffering pattern of paged attention).
//!
//! # Across chips
//!
//! A kernel that declares a mesh ([`crate::KernelBuilder::mesh`], `mesh [x
//! 4]` in the text form) runs once per device of it: `device_id()` and
//! `axis_index("x")` say which; `make_async_remote_copy(src, dst,
//! send_sem, recv_sem, device)` copies to another device's `dst`
//! (`wait_send()` until the source may be reused, `wait()` on the
//! receiver until the data is there); `Sem::signal_remote(n, device)`
//! signals another device's semaphore; `KernelBuilder::barrier_semaphore`
//! is the chip's barrier. Devices are logical ids, row-major over the mesh
//! axes. Such kernels lower and compile for TPU; the CPU paths run single
//! devices and refuse them.
//!
//! These are the IR's records: [`SemaphoreDecl`] (an array the kernel
//! declares), [`SemaphoreSlot`] (one semaphore of it), [`BufferSlice`] (one
//! side of a copy) and [`CopyDescriptor`]. The builder's handles a kernel
//! author holds have the Pallas-like names: `SemArray`, `Sem`, `View`,
//! `AsyncCopy` (from `make_async_copy`); each resolves to one of the records
//! when an op is recorded.

use std::fmt;

use crate::{BufferRef, DType, Index, IndexValue, Loc, ValueId};

/// What a semaphore counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SemaphoreKind {
    /// The chip's barrier semaphore (Pallas's `get_barrier_semaphore`):
    /// one per kernel, shape `[]`, signalled by other devices to meet at a
    /// barrier; a kernel using it needs a collective id when compiled.
    Barrier,
    /// Bytes of finished copies: signalled by the DMA engine, waited by
    /// `dma_wait` (Pallas's `SemaphoreType.DMA`).
    Dma,
    /// A counter the kernel signals and waits itself (Pallas's
    /// `SemaphoreType.REGULAR`).
    Regular,
}

impl fmt::Display for SemaphoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SemaphoreKind::Dma => "dma_semaphore",
            SemaphoreKind::Barrier => "barrier_semaphore",
            SemaphoreKind::Regular => "semaphore",
        })
    }
}

/// An array of semaphores: scratch that starts at zero and must be back at
/// zero when the kernel (or its scope) ends.
#[derive(Clone, Debug, PartialEq)]
pub struct SemaphoreDecl {
    /// Name, unique within the kernel.
    pub name: String,
    /// DMA or regular.
    pub kind: SemaphoreKind,
    /// Shape of the array (empty for a single semaphore).
    pub shape: Vec<usize>,
    /// Allocated by a `scope` op for its body only, not for the whole
    /// kernel.
    pub scoped: bool,
    /// Where it was declared.
    pub loc: Option<Loc>,
}

/// One semaphore of a [`SemaphoreDecl`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SemaphoreSlot {
    /// Index into [`crate::Kernel::semaphores`].
    pub array: usize,
    /// One index per dim of the array.
    pub at: Vec<IndexValue>,
}

impl SemaphoreSlot {
    /// Dynamic values it reads.
    pub fn operands(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.at.iter().filter_map(|i| match i {
            IndexValue::Dynamic(v) => Some(*v),
            IndexValue::Static(_) => None,
        })
    }
}

/// A view of a buffer: what one side of a copy moves.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferSlice {
    /// The buffer.
    pub buffer: BufferRef,
    /// One index per buffer dim; points drop their dim.
    pub indices: Vec<Index>,
}

impl BufferSlice {
    /// The shape of the view: the lengths of its slices.
    pub fn shape(&self) -> Vec<usize> {
        self.indices
            .iter()
            .filter_map(|i| match i {
                Index::Slice { len, .. } => Some(*len),
                Index::Point(_) => None,
            })
            .collect()
    }

    /// Dynamic values it reads.
    pub fn operands(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.indices.iter().filter_map(|i| match i {
            Index::Slice {
                start: IndexValue::Dynamic(v),
                ..
            }
            | Index::Point(IndexValue::Dynamic(v)) => Some(*v),
            _ => None,
        })
    }
}

/// An asynchronous copy: source, destination and the DMA semaphore that
/// counts its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CopyDescriptor {
    /// What is read.
    pub src: BufferSlice,
    /// What is written.
    pub dst: BufferSlice,
    /// The DMA semaphore signalled as bytes arrive (on the destination's
    /// device).
    pub sem: SemaphoreSlot,
    /// For a copy to another device: where the destination is and the
    /// local semaphore counting the bytes sent.
    pub remote: Option<RemoteTarget>,
}

/// The other end of a remote copy (Pallas's `make_async_remote_copy`):
/// the destination view and `sem` live on device `device` of the
/// kernel's mesh (a logical id); `send_sem` is this device's DMA semaphore
/// that counts the bytes as they leave.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteTarget {
    /// The logical id of the destination's device.
    pub device: IndexValue,
    /// The sender's DMA semaphore.
    pub send_sem: SemaphoreSlot,
}

impl CopyDescriptor {
    /// Dynamic values it reads (source indices, destination indices,
    /// semaphore index).
    pub fn operands(&self) -> Vec<ValueId> {
        let mut v: Vec<ValueId> = self
            .src
            .operands()
            .chain(self.dst.operands())
            .chain(self.sem.operands())
            .collect();
        if let Some(r) = &self.remote {
            if let IndexValue::Dynamic(d) = r.device {
                v.push(d);
            }
            v.extend(r.send_sem.operands());
        }
        v
    }

    /// Bytes the copy moves for elements of `dtype`.
    pub fn bytes(&self, dtype: DType) -> u64 {
        let n: u64 = self.dst.shape().iter().map(|&d| d as u64).product();
        n.saturating_mul(dtype.tpu_memory_dtype().bytes() as u64)
    }
}
