//! Copies, semaphores and scoped buffers in the builder API.
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // Each step copies its rows of an HBM array into VMEM by hand.
//! let mut k = KernelBuilder::new("dma_rows");
//! k.grid([4], [Arbitrary]);
//! let x = k.input("x", F32, [32, 128]).space(MemorySpace::Any);
//! let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
//! let buf = k.scratch("buf", F32, [8, 128]);
//! let sem = k.dma_semaphores("sem", [1]);
//! let i = program_id(0);
//! let copy = make_async_copy(x.slice((ds(i * 8, 8), ..)), buf, sem.at(0));
//! copy.start();
//! copy.wait();
//! o.store(.., buf.load(..) * 2.0);
//! let kernel = k.build().unwrap();
//!
//! let input = Array::random(F32, [32, 128], 1, -1.0, 1.0);
//! let out = interpret(&kernel, &[input.clone()]).unwrap();
//! assert_eq!(out[0].data()[5], input.data()[5] * 2.0);
//! ```

use super::index::{Idx, IntoIndices, Start};
use super::refs::{Ref, resolve};
use super::state::{self, State};
use super::tile::Tile;
use super::{KernelBuilder, control};
use crate::error::ErrorKind;
use crate::{
    BufferSlice, CopyDescriptor, DType, IndexValue, Loc, MemorySpace, OpKind, Region, Scratch,
    SemaphoreDecl, SemaphoreKind, SemaphoreSlot,
};

/// An array of semaphores of the kernel being built. `Copy`.
#[derive(Clone, Copy, Debug)]
pub struct SemArray {
    array: usize,
    builder: u32,
}

/// One semaphore: an element of a [`SemArray`].
#[derive(Clone, Debug)]
pub struct Sem {
    array: usize,
    at: Vec<Start>,
    builder: u32,
}

/// A view of a buffer for a copy: [`Ref::slice`], or a whole [`Ref`].
#[derive(Clone, Debug)]
pub struct View {
    buffer: Ref,
    indices: Option<Vec<Idx>>,
}

impl From<Ref> for View {
    fn from(r: Ref) -> View {
        View {
            buffer: r,
            indices: None,
        }
    }
}

/// An asynchronous copy (Pallas's `make_async_copy`): [`AsyncCopy::start`]
/// enqueues it, [`AsyncCopy::wait`] waits for it. The descriptor is plain
/// data: rebuild it (same shape, same semaphore) to wait in a later grid
/// step on a copy started in this one.
#[derive(Clone, Debug)]
pub struct AsyncCopy {
    src: View,
    dst: View,
    sem: Sem,
    /// For a remote copy: the destination's device and the send semaphore.
    remote: Option<(Start, Sem)>,
}

fn semaphore_array(
    k: &mut KernelBuilder,
    name: String,
    kind: SemaphoreKind,
    shape: Vec<usize>,
    scoped: bool,
    loc: Loc,
) -> SemArray {
    let array = state::with(k.id, |st| {
        push_semaphores(st, name, kind, shape, scoped, loc)
    })
    .unwrap_or(usize::MAX);
    SemArray {
        array,
        builder: k.id,
    }
}

fn push_semaphores(
    st: &mut State,
    name: String,
    kind: SemaphoreKind,
    shape: Vec<usize>,
    scoped: bool,
    loc: Loc,
) -> usize {
    st.sig.semaphores.push(SemaphoreDecl {
        name,
        kind,
        shape,
        scoped,
        loc: Some(loc),
    });
    st.sig.semaphores.len() - 1
}

impl KernelBuilder {
    /// Declares an array of DMA semaphores (Pallas's
    /// `SemaphoreType.DMA(shape)`), signalled by copies and waited by
    /// [`AsyncCopy::wait`]. `[]` is a single semaphore.
    #[track_caller]
    pub fn dma_semaphores(
        &mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<usize>>,
    ) -> SemArray {
        let loc = Loc::caller();
        semaphore_array(
            self,
            name.into(),
            SemaphoreKind::Dma,
            shape.into(),
            false,
            loc,
        )
    }

    /// Declares the kernel's mesh: the devices it runs on together, as
    /// named axes with sizes (`[("x", 4)]`, `[("x", 2), ("y", 2)]`).
    #[track_caller]
    pub fn mesh<N: Into<String>>(&mut self, axes: impl IntoIterator<Item = (N, usize)>) {
        let axes = axes.into_iter().map(|(n, s)| (n.into(), s)).collect();
        let loc = Some(Loc::caller());
        state::with(self.id, |st| {
            st.sig.mesh = Some(crate::Mesh { axes, loc });
            Some(())
        });
    }

    /// The barrier semaphore (Pallas's `get_barrier_semaphore`): other
    /// devices [`Sem::signal_remote`] it and this one [`Sem::wait`]s on it
    /// to meet at a barrier. Needs a mesh.
    #[track_caller]
    pub fn barrier_semaphore(&mut self) -> Sem {
        let loc = Loc::caller();
        semaphore_array(
            self,
            "barrier".into(),
            SemaphoreKind::Barrier,
            Vec::new(),
            false,
            loc,
        )
        .at(())
    }

    /// Declares an array of regular semaphores (Pallas's
    /// `SemaphoreType.REGULAR(shape)`): counters the kernel signals and
    /// waits itself ([`Sem::signal`], [`Sem::wait`], [`Sem::read`]).
    #[track_caller]
    pub fn semaphores(
        &mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<usize>>,
    ) -> SemArray {
        let loc = Loc::caller();
        semaphore_array(
            self,
            name.into(),
            SemaphoreKind::Regular,
            shape.into(),
            false,
            loc,
        )
    }
}

impl SemArray {
    /// One semaphore of the array: `sems.at(slot)`, `sems.at((0, i))`, or
    /// `sems.at(())` for a single semaphore. Indices are numbers or i32
    /// scalar tiles.
    #[track_caller]
    pub fn at(self, index: impl IntoIndices) -> Sem {
        let loc = Loc::caller();
        let mut at = Vec::new();
        for i in index.into_indices().unwrap_or_default() {
            match i {
                Idx::Point(s) => at.push(s),
                _ => {
                    state::with(self.builder, |st| {
                        st.error(
                            ErrorKind::Builder(crate::BuilderMisuse::SemaphoreRange),
                            Some(loc.clone()),
                        )
                    });
                }
            }
        }
        Sem {
            array: self.array,
            at,
            builder: self.builder,
        }
    }
}

fn start_value(st: &mut State, s: Start, loc: &Loc) -> Option<IndexValue> {
    Some(match s {
        Start::Static(v) => IndexValue::Static(v),
        Start::Dynamic(t) => IndexValue::Dynamic(st.own(t, loc)?),
    })
}

impl Sem {
    fn resolve(&self, st: &mut State, loc: &Loc) -> Option<SemaphoreSlot> {
        let at = self
            .at
            .iter()
            .map(|s| start_value(st, *s, loc))
            .collect::<Option<Vec<_>>>()?;
        Some(SemaphoreSlot {
            array: self.array,
            at,
        })
    }

    fn counter_op(&self, amount: Start, loc: Loc, make: fn(SemaphoreSlot, IndexValue) -> OpKind) {
        state::with(self.builder, |st| {
            let sem = self.resolve(st, &loc)?;
            let amount = start_value(st, amount, &loc)?;
            st.push_op(make(sem, amount), loc);
            Some(())
        });
    }

    /// Adds `amount` (a number or an i32 scalar) to this regular semaphore.
    #[track_caller]
    pub fn signal(&self, amount: impl Into<Start>) {
        self.counter_op(amount.into(), Loc::caller(), |sem, amount| {
            OpKind::SemSignal { sem, amount }
        })
    }

    /// Waits until this regular semaphore holds `amount`, then subtracts it.
    #[track_caller]
    pub fn wait(&self, amount: impl Into<Start>) {
        self.counter_op(amount.into(), Loc::caller(), |sem, amount| {
            OpKind::SemWait { sem, amount }
        })
    }

    /// Adds `amount` to this semaphore's copy on device `device` of the
    /// mesh (Pallas's `semaphore_signal(sem, n, device_id=..)`): a regular
    /// semaphore or the barrier semaphore.
    #[track_caller]
    pub fn signal_remote(&self, amount: impl Into<Start>, device: impl Into<Start>) {
        let (amount, device, loc) = (amount.into(), device.into(), Loc::caller());
        state::with(self.builder, |st| {
            let sem = self.resolve(st, &loc)?;
            let amount = start_value(st, amount, &loc)?;
            let device = start_value(st, device, &loc)?;
            st.push_op(
                OpKind::RemoteSignal {
                    sem,
                    amount,
                    device,
                },
                loc,
            );
            Some(())
        });
    }

    /// The value of this regular semaphore (an i32 scalar).
    #[track_caller]
    pub fn read(&self) -> Tile {
        let loc = Loc::caller();
        let id = state::with(self.builder, |st| {
            let sem = self.resolve(st, &loc)?;
            st.push_op(OpKind::SemRead { sem }, loc).first().copied()
        })
        .flatten();
        Tile::from_parts(id, self.builder)
    }
}

impl Ref {
    /// A part of this buffer for a copy, indexed as loads are:
    /// `pages.slice((head, page, .., ..))`, `buf.slice((slot, ds(i * 8, 8), ..))`.
    pub fn slice(self, indices: impl IntoIndices) -> View {
        View {
            buffer: self,
            indices: indices.into_indices(),
        }
    }
}

/// An asynchronous copy from `src` to `dst` that signals `sem` (a DMA
/// semaphore); nothing happens until [`AsyncCopy::start`]. Named as
/// Pallas's `make_async_copy`, which also builds an unstarted copy; there
/// is deliberately no `async_copy` (Pallas's starts the copy at once), so
/// a port that calls it fails to compile instead of never starting its
/// copy.
pub fn make_async_copy(src: impl Into<View>, dst: impl Into<View>, sem: Sem) -> AsyncCopy {
    AsyncCopy {
        src: src.into(),
        dst: dst.into(),
        sem,
        remote: None,
    }
}

/// A copy from `src` on this device to `dst` on device `device` of the
/// kernel's mesh (a logical id: a number or an i32 scalar), Pallas's
/// `make_async_remote_copy`: `send_sem` (here) counts the bytes leaving,
/// `recv_sem` (there) the bytes arriving. [`AsyncCopy::start`] enqueues
/// it; [`AsyncCopy::wait_send`] waits until the source may be reused,
/// [`AsyncCopy::wait`] (on the receiving device, with the descriptor of
/// the copy coming in) until the destination holds the data.
pub fn make_async_remote_copy(
    src: impl Into<View>,
    dst: impl Into<View>,
    send_sem: Sem,
    recv_sem: Sem,
    device: impl Into<Start>,
) -> AsyncCopy {
    AsyncCopy {
        src: src.into(),
        dst: dst.into(),
        sem: recv_sem,
        remote: Some((device.into(), send_sem)),
    }
}

impl AsyncCopy {
    fn record(&self, loc: Loc, make: fn(CopyDescriptor) -> OpKind) {
        state::with(self.sem.builder, |st| {
            let mut view = |v: &View| -> Option<BufferSlice> {
                let b = v.buffer.buffer();
                Some(BufferSlice {
                    buffer: b,
                    indices: resolve(st, b, v.indices.clone(), &loc)?,
                })
            };
            let src = view(&self.src)?;
            let dst = view(&self.dst)?;
            let sem = self.sem.resolve(st, &loc)?;
            let remote = match &self.remote {
                Some((device, send)) => Some(crate::RemoteTarget {
                    device: start_value(st, *device, &loc)?,
                    send_sem: send.resolve(st, &loc)?,
                }),
                None => None,
            };
            st.push_op(
                make(CopyDescriptor {
                    src,
                    dst,
                    sem,
                    remote,
                }),
                loc,
            );
            Some(())
        });
    }

    /// Enqueues the copy (Pallas's `.start()`).
    #[track_caller]
    pub fn start(&self) {
        self.record(Loc::caller(), OpKind::DmaStart)
    }

    /// Waits for the copy's bytes on its semaphore (Pallas's `.wait()`;
    /// for a remote copy, `.wait_recv()`: the bytes arriving here).
    #[track_caller]
    pub fn wait(&self) {
        self.record(Loc::caller(), OpKind::DmaWait)
    }

    /// Waits until a remote copy's bytes have left this device, so its
    /// source may be overwritten (Pallas's `.wait_send()`).
    #[track_caller]
    pub fn wait_send(&self) {
        self.record(Loc::caller(), OpKind::DmaWaitSend)
    }
}

/// The allocations of a [`scoped`] block.
pub struct Scope {
    builder: u32,
    scratch: Vec<usize>,
    semaphores: Vec<usize>,
}

impl Scope {
    #[track_caller]
    fn buffer(&mut self, name: String, dtype: DType, shape: Vec<usize>, space: MemorySpace) -> Ref {
        let loc = Loc::caller();
        let idx = state::with(self.builder, |st| {
            st.sig.scratch.push(Scratch {
                name,
                dtype,
                shape,
                space,
                scoped: true,
                loc: Some(loc),
            });
            st.sig.scratch.len() - 1
        })
        .unwrap_or(usize::MAX);
        self.scratch.push(idx);
        Ref::new(crate::BufferRef::Scratch(idx), self.builder)
    }

    /// A VMEM buffer that exists for the block only (undefined at first).
    #[track_caller]
    pub fn vmem(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        self.buffer(name.into(), dtype, shape.into(), MemorySpace::Vmem)
    }

    /// An SMEM buffer that exists for the block only.
    #[track_caller]
    pub fn smem(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        self.buffer(name.into(), dtype, shape.into(), MemorySpace::Smem)
    }

    #[track_caller]
    fn sems(&mut self, name: String, kind: SemaphoreKind, shape: Vec<usize>) -> SemArray {
        let loc = Loc::caller();
        let array = state::with(self.builder, |st| {
            push_semaphores(st, name, kind, shape, true, loc)
        })
        .unwrap_or(usize::MAX);
        self.semaphores.push(array);
        SemArray {
            array,
            builder: self.builder,
        }
    }

    /// DMA semaphores that exist for the block only.
    #[track_caller]
    pub fn dma_semaphores(
        &mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<usize>>,
    ) -> SemArray {
        self.sems(name.into(), SemaphoreKind::Dma, shape.into())
    }

    /// Regular semaphores that exist for the block only.
    #[track_caller]
    pub fn semaphores(
        &mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<usize>>,
    ) -> SemArray {
        self.sems(name.into(), SemaphoreKind::Regular, shape.into())
    }
}

/// Runs `body` with buffers and semaphores allocated for it alone
/// (Pallas's `run_scoped`): VMEM is given back when it ends, so sibling
/// blocks can reuse it. Copies started inside must be waited inside, and
/// tiles computed inside stay inside (store results to a buffer).
#[track_caller]
pub fn scoped(body: impl FnOnce(&mut Scope)) {
    let loc = Loc::caller();
    let builder = state::current().unwrap_or(0);
    state::with(builder, |st| control::open(st, Vec::new(), builder));
    let mut scope = Scope {
        builder,
        scratch: Vec::new(),
        semaphores: Vec::new(),
    };
    body(&mut scope);
    let region: Region = control::close(builder, &[], &loc);
    state::with(builder, |st| {
        st.push_op(
            OpKind::Scope {
                scratch: scope.scratch,
                semaphores: scope.semaphores,
                body: region,
            },
            loc,
        )
    });
}
