//! A device's side of remote copies, signals and ids (see `mesh` for the
//! scheduler). A remote copy reads its source when it starts; its
//! destination on the other device is taken from then until a receive
//! wait there retires it, and its source here may not be written until
//! `wait_send` retires it. Touching either in between is a race at the
//! op's line, as is a second copy into a destination still taken.

use super::dma::{Incoming, Outgoing, absolute, at_loc, fmt_ranges, overlaps};
use super::eval::{Machine, R, Ranges, Val};
use super::mesh::{Claim, Msg};
use crate::error::{ErrorKind, KernelError};
use crate::{BufferRef, CopyDescriptor, IndexValue, Loc, SemaphoreSlot};

impl Machine<'_> {
    /// A point where another device may run: read the inbox afterwards.
    pub(super) fn sync(&mut self) -> R<()> {
        let Some(link) = self.link else {
            return Ok(());
        };
        let msgs = link.net.sync(link.device)?;
        self.apply(msgs)
    }

    /// Waits for another device to act (`what` at `loc`, reported if the
    /// run deadlocks).
    pub(super) fn block(&mut self, what: String, loc: &Option<Loc>) -> R<()> {
        let Some(link) = self.link else {
            return Err(KernelError::from(ErrorKind::Mesh(format!(
                "{what}: nothing else can signal it"
            ))));
        };
        let msgs = link.net.block(link.device, what, loc)?;
        self.apply(msgs)
    }

    /// Takes in what other devices did to this one.
    pub(super) fn apply(&mut self, msgs: Vec<Msg>) -> R<()> {
        for m in msgs {
            match m {
                Msg::Claim(c) => self.claim(c)?,
                Msg::Arrive { id, data } => {
                    if let Some(i) = self.dma.incoming.iter().position(|x| x.claim.id == id) {
                        let (b, r) = self.dma.incoming[i].claim.dst.clone();
                        let zero = vec![0i64; r.len()];
                        self.write(b, &r, &zero, &data, None);
                        self.dma.incoming[i].arrived = true;
                    }
                }
                Msg::Sent { id } => {
                    if let Some(o) = self.dma.outgoing.iter_mut().find(|o| o.id == id) {
                        o.sent = true;
                    }
                }
                Msg::Signal { sem, amount, loc } => {
                    let v = &mut self.dma.sems[sem.0][sem.1];
                    *v = v.saturating_add(amount);
                    self.dma.signalled.insert(sem, loc);
                }
            }
        }
        Ok(())
    }

    /// A remote copy into this device starts: its destination must be
    /// free of other copies.
    fn claim(&mut self, c: Claim) -> R<()> {
        let me = self.link.map_or(0, |l| l.device);
        let (b, r) = &c.dst;
        let other = self
            .dma
            .incoming
            .iter()
            .find(|x| overlaps(&x.claim.dst, *b, r))
            .map(|x| {
                format!(
                    "the copy from device {} started at {}, which device {me} has not yet waited for",
                    x.claim.from,
                    at_loc(&x.claim.started)
                )
            })
            .or_else(|| {
                self.dma
                    .inflight_dst()
                    .find(|(d, _)| overlaps(d, *b, r))
                    .map(|(_, l)| format!("a local copy started at {}", at_loc(l)))
            });
        if let Some(other) = other {
            return Err(self.race(
                "dma_start",
                format!(
                    "device {}'s remote copy into `{}` elements {} of device {me} overlaps {other}; the receiver must wait for (and finish using) a buffer before it is sent to again: signal the sender when the slot is free, or use another buffer slot",
                    c.from,
                    self.name(*b),
                    fmt_ranges(r)
                ),
                &c.started,
            ));
        }
        self.dma.incoming.push(Incoming {
            claim: c,
            arrived: false,
        });
        Ok(())
    }

    /// Touching `abs` of `b` while a remote copy claims it is a race.
    pub(super) fn check_remote_access(
        &self,
        op: &'static str,
        b: BufferRef,
        abs: &Ranges,
        write: bool,
        loc: &Option<Loc>,
    ) -> R<()> {
        let verb = if write { "writes" } else { "reads" };
        if let Some(x) = self
            .dma
            .incoming
            .iter()
            .find(|x| overlaps(&x.claim.dst, b, abs))
        {
            let state = if x.arrived {
                "has arrived but was not yet waited for"
            } else {
                "is still arriving"
            };
            return Err(self.race(
                op,
                format!(
                    "{verb} `{}` elements {} while a remote copy from device {} (started at {}) into them {state}; wait for it here (`dma_wait` on its receive semaphore) before touching them",
                    self.name(b),
                    fmt_ranges(abs),
                    x.claim.from,
                    at_loc(&x.claim.started)
                ),
                loc,
            ));
        }
        if write && let Some(o) = self.dma.outgoing.iter().find(|o| overlaps(&o.src, b, abs)) {
            return Err(self.race(
                op,
                format!(
                    "writes `{}` elements {} while they are the source of a remote copy to device {} (started at {}) not yet waited for its send; `dma_wait_send` on it before overwriting its source",
                    self.name(b),
                    fmt_ranges(abs),
                    o.to,
                    at_loc(&o.started)
                ),
                loc,
            ));
        }
        Ok(())
    }

    /// The logical id `v` names, checked inside the mesh.
    fn peer(&self, v: &IndexValue, op: &'static str, loc: &Option<Loc>) -> R<usize> {
        let d = self.index_value(v, "a device id", loc)?;
        let n = self.link.map_or(1, |l| l.devices);
        if d < 0 || d as usize >= n {
            let me = self.link.map_or(0, |l| l.device);
            return Err(KernelError::new(
                ErrorKind::Mesh(format!(
                    "`{op}` on device {me} names device {d}, outside the mesh's devices 0..{n}; compute the peer modulo the axis size"
                )),
                loc.clone(),
            ));
        }
        Ok(d as usize)
    }

    /// This device's logical id (0 off a mesh).
    pub(super) fn device_id(&self) -> Val {
        let d = self.link.map_or(0, |l| l.device);
        Val::clean(crate::DType::I32, vec![], vec![d as f64])
    }

    /// This device's coordinate along mesh axis `axis`.
    pub(super) fn axis_index(&self, axis: usize) -> Val {
        let d = self.link.map_or(0, |l| l.device);
        let c = self.k.mesh.as_ref().map_or(0, |m| {
            let size = m.axes.get(axis).map_or(1, |a| a.1).max(1);
            (d / m.stride(axis).max(1)) % size
        });
        Val::clean(crate::DType::I32, vec![], vec![c as f64])
    }

    pub(super) fn remote_start(&mut self, c: &CopyDescriptor, loc: &Option<Loc>) -> R<()> {
        let op = "dma_start";
        let Some(remote) = &c.remote else {
            return Ok(());
        };
        let to = self.peer(&remote.device, op, loc)?;
        let (sr, so, shape) = self.resolve(op, &c.src, loc)?;
        let (dr, doff, _) = self.resolve(op, &c.dst, loc)?;
        let recv = self.sem_slot(&c.sem, op, loc)?;
        let send_sem = self.sem_slot(&remote.send_sem, op, loc)?;
        let src_abs = absolute(&sr, &so);
        self.check_remote_access(op, c.src.buffer, &src_abs, false, loc)?;
        if let Some((_, l)) = self
            .dma
            .inflight_dst()
            .find(|(d, _)| overlaps(d, c.src.buffer, &src_abs))
        {
            return Err(self.race(
                op,
                format!(
                    "sends `{}` elements {} while they are the destination of a local copy still in flight (started at {}); wait on that copy first",
                    self.name(c.src.buffer),
                    fmt_ranges(&src_abs),
                    at_loc(l)
                ),
                loc,
            ));
        }
        let data = self.read(c.src.buffer, &sr, &so, shape, None, loc)?;
        let dtype = self
            .k
            .buffer(c.dst.buffer)
            .map_or(crate::DType::F32, |b| b.1);
        let bytes = c.bytes(dtype);
        self.ici_bytes += bytes;
        self.sends.push((bytes, self.flops, to));
        let claim = Claim {
            id: 0,
            from: 0,
            dst: (c.dst.buffer, absolute(&dr, &doff)),
            sem: recv,
            bytes,
            started: loc.clone(),
        };
        let Some(link) = self.link else {
            return Ok(());
        };
        let id = link.net.send(link.device, to, claim, data);
        self.dma.outgoing.push(Outgoing {
            id,
            to,
            src: (c.src.buffer, src_abs),
            send_sem,
            bytes,
            started: loc.clone(),
            sent: false,
        });
        self.sync()
    }

    /// Waits here for the bytes of a remote copy like `c` (same receive
    /// semaphore, same size) to arrive.
    pub(super) fn remote_wait_recv(&mut self, c: &CopyDescriptor, loc: &Option<Loc>) -> R<()> {
        let op = "dma_wait";
        let sem = self.sem_slot(&c.sem, op, loc)?;
        let dtype = self
            .k
            .buffer(c.dst.buffer)
            .map_or(crate::DType::F32, |b| b.1);
        let bytes = c.bytes(dtype);
        self.sync()?;
        loop {
            let here = |x: &Incoming| x.claim.sem == sem && x.arrived;
            if let Some(i) = self
                .dma
                .incoming
                .iter()
                .position(|x| here(x) && x.claim.bytes == bytes)
            {
                self.dma.incoming.remove(i);
                return Ok(());
            }
            if let Some(x) = self.dma.incoming.iter().find(|x| here(x)) {
                return Err(self.race(
                    op,
                    format!(
                        "waits for {bytes} bytes on `{}` but the copy from device {} that arrived on it moves {} bytes; wait with a descriptor of the same shape as the copy",
                        self.sem_name(sem),
                        x.claim.from,
                        x.claim.bytes
                    ),
                    loc,
                ));
            }
            self.block(
                format!(
                    "`dma_wait` to receive {bytes} bytes on `{}`",
                    self.sem_name(sem)
                ),
                loc,
            )?;
        }
    }

    /// Waits until a remote copy like `c` from this device has left.
    pub(super) fn remote_wait_send(&mut self, c: &CopyDescriptor, loc: &Option<Loc>) -> R<()> {
        let op = "dma_wait_send";
        let Some(remote) = &c.remote else {
            return Ok(());
        };
        let sem = self.sem_slot(&remote.send_sem, op, loc)?;
        let dtype = self
            .k
            .buffer(c.dst.buffer)
            .map_or(crate::DType::F32, |b| b.1);
        let bytes = c.bytes(dtype);
        self.sync()?;
        let mine = |o: &Outgoing| o.send_sem == sem && o.bytes == bytes;
        if !self.dma.outgoing.iter().any(mine) {
            return Err(self.race(
                op,
                format!(
                    "waits for a send of {bytes} bytes on `{}` but no remote copy of that size on it is in flight (it was never started, or was already waited); on a TPU this wait never returns",
                    self.sem_name(sem)
                ),
                loc,
            ));
        }
        loop {
            if let Some(i) = self.dma.outgoing.iter().position(|o| mine(o) && o.sent) {
                self.dma.outgoing.remove(i);
                return Ok(());
            }
            self.block(
                format!(
                    "`dma_wait_send` for {bytes} bytes on `{}`",
                    self.sem_name(sem)
                ),
                loc,
            )?;
        }
    }

    pub(super) fn remote_signal(
        &mut self,
        s: &SemaphoreSlot,
        n: &IndexValue,
        device: &IndexValue,
        loc: &Option<Loc>,
    ) -> R<()> {
        let op = "remote_signal";
        let slot = self.sem_slot(s, op, loc)?;
        let amount = self.index_value(n, "a semaphore amount", loc)?;
        if amount < 0 {
            return Err(self.race(
                op,
                format!(
                    "signals `{}` with {amount}; amounts must be ≥ 0",
                    self.sem_name(slot)
                ),
                loc,
            ));
        }
        let to = self.peer(device, op, loc)?;
        if let Some(link) = self.link {
            link.net.signal(to, slot, amount, loc);
        }
        self.sync()
    }

    /// The end of a device's run: every remote copy from it waited for
    /// its send, every copy into it waited for here.
    pub(super) fn finish_remote(&self) -> R<()> {
        if let Some(o) = self.dma.outgoing.first() {
            return Err(self.race(
                "dma_start",
                format!(
                    "the remote copy of `{}` {} to device {} is never waited for its send (`dma_wait_send`) before the kernel ends; its source may still be read",
                    self.name(o.src.0),
                    fmt_ranges(&o.src.1),
                    o.to
                ),
                &o.started,
            ));
        }
        if let Some(x) = self.dma.incoming.first() {
            return Err(self.race(
                "dma_start",
                format!(
                    "the remote copy from device {} into `{}` {} is never waited for on the receiving device before the kernel ends; its data may not have arrived",
                    x.claim.from,
                    self.name(x.claim.dst.0),
                    fmt_ranges(&x.claim.dst.1)
                ),
                &x.claim.started,
            ));
        }
        Ok(())
    }
}
