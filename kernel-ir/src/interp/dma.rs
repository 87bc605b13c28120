//! Copies and semaphores in the interpreter, with the checks hardware does
//! not make.
//!
//! A copy reads its source when it starts and writes its destination when
//! a wait retires it. In between, touching the destination (or writing the
//! source) is a race on a TPU, so it is an error here; so are a wait with
//! no copy of its size in flight on the semaphore (a hang), a copy into a
//! buffer another copy is still writing, a kernel (or scope) ending with
//! copies in flight or a semaphore not back at zero, and a copy in flight
//! or a semaphore not at zero when a parallel grid index changes (the next
//! step may run on another core). By default a wait retires the copy it describes (or the oldest of
//! its size on the semaphore); [`crate::InterpOptions::dma_seed`] makes it
//! retire a random one of that size instead, as hardware may when copies
//! share a semaphore.

use super::UNWRITTEN;
use super::eval::{Machine, R, Ranges, Val};
use crate::array::SplitMix64;
use crate::error::{ErrorKind, KernelError};
use crate::{
    BufferRef, BufferSlice, CopyDescriptor, IndexValue, Loc, Region, SemaphoreKind, SemaphoreSlot,
};

/// Copies in flight and semaphore values of one run.
pub(crate) struct DmaState {
    /// Value of each semaphore, per array, flattened row-major.
    pub(super) sems: Vec<Vec<i64>>,
    inflight: Vec<InFlight>,
    rng: Option<SplitMix64>,
    /// Where each regular semaphore was last signalled.
    pub(super) signalled: std::collections::HashMap<(usize, usize), Option<Loc>>,
    /// Remote copies into this device not yet waited for here.
    pub(super) incoming: Vec<Incoming>,
    /// Remote copies from this device not yet waited for (`wait_send`).
    pub(super) outgoing: Vec<Outgoing>,
}

/// A remote copy into this device: its destination is taken from its
/// start (on the sender) until a receive wait here retires it.
pub(super) struct Incoming {
    pub claim: super::mesh::Claim,
    pub arrived: bool,
}

/// A remote copy from this device: its source may not be written until
/// `wait_send` retires it.
pub(super) struct Outgoing {
    pub id: u64,
    pub to: usize,
    pub src: (BufferRef, Ranges),
    pub send_sem: (usize, usize),
    pub bytes: u64,
    pub started: Option<Loc>,
    pub sent: bool,
}

/// One started, not yet waited copy.
struct InFlight {
    src: (BufferRef, Ranges),
    dst: (BufferRef, Ranges),
    /// The semaphore: array and flat index.
    sem: (usize, usize),
    bytes: u64,
    /// The source as read at the start.
    data: Val,
    started: Option<Loc>,
    grid: Vec<i64>,
}

impl DmaState {
    pub(crate) fn new(k: &crate::Kernel, seed: Option<u64>) -> DmaState {
        DmaState {
            sems: k
                .semaphores
                .iter()
                .map(|s| vec![0; s.shape.iter().product()])
                .collect(),
            inflight: Vec::new(),
            rng: seed.map(SplitMix64),
            signalled: Default::default(),
            incoming: Vec::new(),
            outgoing: Vec::new(),
        }
    }
}

impl DmaState {
    /// Destinations (and start locations) of the local copies in flight.
    pub(super) fn inflight_dst(
        &self,
    ) -> impl Iterator<Item = (&(BufferRef, Ranges), &Option<Loc>)> {
        self.inflight.iter().map(|f| (&f.dst, &f.started))
    }
}

/// Absolute element ranges: the view's ranges moved by its window offset.
pub(super) fn absolute(ranges: &Ranges, offset: &[i64]) -> Ranges {
    ranges
        .iter()
        .zip(offset)
        .map(|(&(s, n), &o)| (s + o, n))
        .collect()
}

pub(super) fn overlaps(a: &(BufferRef, Ranges), b: BufferRef, r: &Ranges) -> bool {
    a.0 == b
        && a.1.len() == r.len()
        && a.1
            .iter()
            .zip(r)
            .all(|(&(s1, n1), &(s2, n2))| s1 < s2 + n2 as i64 && s2 < s1 + n1 as i64)
}

pub(super) fn fmt_ranges(r: &Ranges) -> String {
    let parts: Vec<String> = r
        .iter()
        .map(|(s, n)| format!("{s}..{}", s + *n as i64))
        .collect();
    format!("[{}]", parts.join(", "))
}

pub(super) fn at_loc(l: &Option<Loc>) -> String {
    l.as_ref()
        .map_or("(unknown location)".into(), |l| l.to_string())
}

impl Machine<'_> {
    pub(super) fn race(&self, op: &'static str, detail: String, loc: &Option<Loc>) -> KernelError {
        KernelError::new(ErrorKind::DmaRace { op, detail }, loc.clone())
    }

    pub(super) fn name(&self, b: BufferRef) -> String {
        self.k.buffer(b).map_or("?".into(), |x| x.0.to_string())
    }

    pub(super) fn sem_name(&self, s: (usize, usize)) -> String {
        let a = &self.k.semaphores[s.0];
        let mut idx = Vec::new();
        let mut rest = s.1;
        for d in (0..a.shape.len()).rev() {
            idx.push(rest % a.shape[d]);
            rest /= a.shape[d];
        }
        idx.reverse();
        let idx: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
        format!("{}[{}]", a.name, idx.join(", "))
    }

    /// The error for an access to `b` that races with a copy in flight;
    /// `write` for stores.
    pub(super) fn check_access(
        &self,
        op: &'static str,
        b: BufferRef,
        ranges: &Ranges,
        offset: &[i64],
        write: bool,
        loc: &Option<Loc>,
    ) -> R<()> {
        let abs = absolute(ranges, offset);
        self.check_remote_access(op, b, &abs, write, loc)?;
        if self.dma.inflight.is_empty() {
            return Ok(());
        }
        for c in &self.dma.inflight {
            let (hit, what) = if overlaps(&c.dst, b, &abs) {
                (true, "destination")
            } else if write && overlaps(&c.src, b, &abs) {
                (true, "source")
            } else {
                (false, "")
            };
            if hit {
                let verb = if write { "writes" } else { "reads" };
                return Err(self.race(
                    op,
                    format!(
                        "{verb} `{}` elements {} while they are the {what} of a copy still in flight (started at {} in grid step {:?}); wait on the copy before touching its {what}",
                        self.name(b),
                        fmt_ranges(&abs),
                        at_loc(&c.started),
                        c.grid
                    ),
                    loc,
                ));
            }
        }
        Ok(())
    }

    /// The semaphore a reference names, checked in bounds.
    pub(super) fn sem_slot(
        &self,
        s: &SemaphoreSlot,
        op: &'static str,
        loc: &Option<Loc>,
    ) -> R<(usize, usize)> {
        let a = &self.k.semaphores[s.array];
        let mut flat = 0usize;
        for (d, (i, &n)) in s.at.iter().zip(&a.shape).enumerate() {
            let v = self.index_value(i, "a semaphore index", loc)?;
            if v < 0 || v as usize >= n {
                return Err(KernelError::new(
                    ErrorKind::DynamicOutOfBounds {
                        op,
                        buffer: a.name.clone(),
                        detail: format!(
                            "semaphore index {v} in dim {d} is outside 0..{n} (grid index {:?})",
                            self.grid_point
                        ),
                    },
                    loc.clone(),
                ));
            }
            flat = flat * n + v as usize;
        }
        Ok((s.array, flat))
    }

    /// Ranges of a view, checked in bounds, and its window offset.
    pub(super) fn resolve(
        &self,
        op: &'static str,
        v: &BufferSlice,
        loc: &Option<Loc>,
    ) -> R<(Ranges, Vec<i64>, Vec<usize>)> {
        let (ranges, shape) = self.ranges(op, v.buffer, &v.indices, loc)?;
        let (offset, _) = self.view(v.buffer);
        Ok((ranges, offset, shape))
    }

    pub(super) fn dma_start(&mut self, c: &CopyDescriptor, loc: &Option<Loc>) -> R<()> {
        let op = "dma_start";
        let (sr, so, shape) = self.resolve(op, &c.src, loc)?;
        let (dr, doff, _) = self.resolve(op, &c.dst, loc)?;
        let sem = self.sem_slot(&c.sem, op, loc)?;
        let src_abs = absolute(&sr, &so);
        let dst_abs = absolute(&dr, &doff);
        self.check_remote_access(op, c.src.buffer, &src_abs, false, loc)?;
        self.check_remote_access(op, c.dst.buffer, &dst_abs, true, loc)?;
        for f in &self.dma.inflight {
            let clash = if overlaps(&f.dst, c.dst.buffer, &dst_abs) {
                Some("starts a copy into")
            } else if overlaps(&f.src, c.dst.buffer, &dst_abs) {
                Some("starts a copy that overwrites")
            } else if overlaps(&f.dst, c.src.buffer, &src_abs) {
                Some("starts a copy that reads")
            } else {
                None
            };
            if let Some(what) = clash {
                let role = if what.ends_with("reads") || what.ends_with("into") {
                    "destination"
                } else {
                    "source"
                };
                return Err(self.race(
                    op,
                    format!(
                        "{what} `{}` elements {} while they are the {role} of a copy still in flight (started at {} in grid step {:?}); wait on that copy first, or use another buffer slot",
                        if what.ends_with("reads") { self.name(c.src.buffer) } else { self.name(c.dst.buffer) },
                        fmt_ranges(if what.ends_with("reads") { &src_abs } else { &dst_abs }),
                        at_loc(&f.started),
                        f.grid
                    ),
                    loc,
                ));
            }
        }
        let data = self.read(c.src.buffer, &sr, &so, shape, None, loc)?;
        let dtype = self
            .k
            .buffer(c.dst.buffer)
            .map_or(crate::DType::F32, |b| b.1);
        self.dma.inflight.push(InFlight {
            src: (c.src.buffer, src_abs),
            dst: (c.dst.buffer, dst_abs),
            sem,
            bytes: c.bytes(dtype),
            data,
            started: loc.clone(),
            grid: self.grid_point.clone(),
        });
        Ok(())
    }

    pub(super) fn dma_wait(&mut self, c: &CopyDescriptor, loc: &Option<Loc>) -> R<()> {
        let op = "dma_wait";
        let (sr, so, _) = self.resolve(op, &c.src, loc)?;
        let (dr, doff, _) = self.resolve(op, &c.dst, loc)?;
        let sem = self.sem_slot(&c.sem, op, loc)?;
        let dtype = self
            .k
            .buffer(c.dst.buffer)
            .map_or(crate::DType::F32, |b| b.1);
        let bytes = c.bytes(dtype);
        let on_sem: Vec<usize> = (0..self.dma.inflight.len())
            .filter(|&i| self.dma.inflight[i].sem == sem)
            .collect();
        if on_sem.is_empty() {
            return Err(self.race(
                op,
                format!(
                    "waits on `{}` but no copy on it is in flight (it was never started, or was already waited); on a TPU this wait never returns",
                    self.sem_name(sem)
                ),
                loc,
            ));
        }
        let same_size: Vec<usize> = on_sem
            .iter()
            .copied()
            .filter(|&i| self.dma.inflight[i].bytes == bytes)
            .collect();
        if same_size.is_empty() {
            let sizes: Vec<String> = on_sem
                .iter()
                .map(|&i| self.dma.inflight[i].bytes.to_string())
                .collect();
            return Err(self.race(
                op,
                format!(
                    "waits for {bytes} bytes on `{}` but the copies in flight on it move {} bytes; wait with a descriptor of the same shape as the copy",
                    self.sem_name(sem),
                    sizes.join(", ")
                ),
                loc,
            ));
        }
        let (src_abs, dst_abs) = (absolute(&sr, &so), absolute(&dr, &doff));
        let pick = match &mut self.dma.rng {
            Some(rng) => same_size[rng.below(same_size.len())],
            None => same_size
                .iter()
                .copied()
                .find(|&i| {
                    let f = &self.dma.inflight[i];
                    f.src == (c.src.buffer, src_abs.clone())
                        && f.dst == (c.dst.buffer, dst_abs.clone())
                })
                .unwrap_or(same_size[0]),
        };
        let done = self.dma.inflight.remove(pick);
        let zero = vec![0i64; done.dst.1.len()];
        self.write(done.dst.0, &done.dst.1, &zero, &done.data, None);
        Ok(())
    }

    /// A regular or the barrier semaphore (the verifier checked the kind).
    fn regular(&self, s: &SemaphoreSlot, op: &'static str, loc: &Option<Loc>) -> R<(usize, usize)> {
        debug_assert_ne!(self.k.semaphores[s.array].kind, SemaphoreKind::Dma);
        self.sem_slot(s, op, loc)
    }

    pub(super) fn sem_signal(
        &mut self,
        s: &SemaphoreSlot,
        n: &IndexValue,
        loc: &Option<Loc>,
    ) -> R<()> {
        let slot = self.regular(s, "sem_signal", loc)?;
        let n = self.index_value(n, "a semaphore amount", loc)?;
        if n < 0 {
            return Err(self.race(
                "sem_signal",
                format!(
                    "signals `{}` with {n}; amounts must be ≥ 0",
                    self.sem_name(slot)
                ),
                loc,
            ));
        }
        let v = &mut self.dma.sems[slot.0][slot.1];
        *v = v.saturating_add(n);
        self.dma.signalled.insert(slot, loc.clone());
        Ok(())
    }

    pub(super) fn sem_wait(
        &mut self,
        s: &SemaphoreSlot,
        n: &IndexValue,
        loc: &Option<Loc>,
    ) -> R<()> {
        let slot = self.regular(s, "sem_wait", loc)?;
        let n = self.index_value(n, "a semaphore amount", loc)?;
        if n >= 0 && self.link.is_some() {
            // Other devices may signal it: wait for them.
            self.sync()?;
            while self.dma.sems[slot.0][slot.1] < n {
                let v = self.dma.sems[slot.0][slot.1];
                self.block(
                    format!(
                        "`sem_wait` for {n} on `{}`, which holds {v}",
                        self.sem_name(slot)
                    ),
                    loc,
                )?;
            }
        }
        let v = self.dma.sems[slot.0][slot.1];
        if n < 0 || v < n {
            return Err(self.race(
                "sem_wait",
                format!(
                    "waits for {n} on `{}`, which holds {v}; nothing else signals it in this kernel, so on a TPU this wait never returns; signal it first",
                    self.sem_name(slot)
                ),
                loc,
            ));
        }
        self.dma.sems[slot.0][slot.1] = v - n;
        Ok(())
    }

    pub(super) fn sem_read(&self, s: &SemaphoreSlot, loc: &Option<Loc>) -> R<Val> {
        let slot = self.regular(s, "sem_read", loc)?;
        let v = self.dma.sems[slot.0][slot.1];
        Ok(Val::clean(crate::DType::I32, vec![], vec![v as f64]))
    }

    pub(super) fn scope(
        &mut self,
        scratch: &[usize],
        semaphores: &[usize],
        body: &Region,
        loc: &Option<Loc>,
    ) -> R<()> {
        // A fresh allocation: undefined buffers, semaphores at zero.
        for &i in scratch {
            self.scratch[i].state.fill(UNWRITTEN);
        }
        for &i in semaphores {
            self.dma.sems[i].fill(0);
        }
        self.region(body, Vec::new())?;
        let owned = |b: BufferRef| matches!(b, BufferRef::Scratch(i) if scratch.contains(&i));
        if let Some(f) = self
            .dma
            .inflight
            .iter()
            .find(|f| owned(f.src.0) || owned(f.dst.0) || semaphores.contains(&f.sem.0))
        {
            return Err(self.race(
                "scope",
                format!(
                    "ends while the copy of `{}` into `{}` started at {} is in flight, but its buffers or semaphore are freed here; wait on it inside the scope",
                    self.name(f.src.0),
                    self.name(f.dst.0),
                    at_loc(&f.started)
                ),
                loc,
            ));
        }
        self.sems_at_zero(semaphores, "scope", "the scope ends", loc)
    }

    fn sems_at_zero(
        &self,
        arrays: &[usize],
        op: &'static str,
        when: &str,
        loc: &Option<Loc>,
    ) -> R<()> {
        for &a in arrays {
            if let Some(flat) = self.dma.sems[a].iter().position(|&v| v != 0) {
                let loc = match self.dma.signalled.get(&(a, flat)) {
                    Some(l) if l.is_some() => l,
                    _ => loc,
                };
                return Err(self.race(
                    op,
                    format!(
                        "`{}` holds {} when {when}; every signal needs a matching wait, so that the semaphore is back at zero",
                        self.sem_name((a, flat)),
                        self.dma.sems[a][flat]
                    ),
                    loc,
                ));
            }
        }
        Ok(())
    }

    /// Copies in flight, or regular semaphores not at zero, are an error
    /// when the step's successor may run elsewhere (`why`) or nothing
    /// follows: a count that crosses to another core is a dependence
    /// between parallel steps.
    pub(super) fn none_in_flight(&self, why: &str) -> R<()> {
        self.copies_done(why)?;
        let top: Vec<usize> = (0..self.k.semaphores.len())
            .filter(|&i| !self.k.semaphores[i].scoped)
            .collect();
        self.sems_at_zero(&top, "sem_signal", why, &None)
    }

    fn copies_done(&self, why: &str) -> R<()> {
        if let Some(f) = self.dma.inflight.first() {
            return Err(self.race(
                "dma_start",
                format!(
                    "the copy of `{}` {} into `{}` {} started in grid step {:?} is still in flight when {why}; wait on it (a copy may cross into the next step only along arbitrary grid dims)",
                    self.name(f.src.0),
                    fmt_ranges(&f.src.1),
                    self.name(f.dst.0),
                    fmt_ranges(&f.dst.1),
                    f.grid
                ),
                &f.started,
            ));
        }
        Ok(())
    }

    /// The end-of-kernel checks: nothing in flight, semaphores at zero.
    pub(super) fn finish_dma(&self) -> R<()> {
        self.none_in_flight("the kernel ends")
    }
}
