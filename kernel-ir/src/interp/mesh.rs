//! The devices of a mesh run together: one thread per device, one baton.
//!
//! Only the device holding the baton runs, so a run is one interleaving
//! chosen by a seed ([`crate::InterpOptions::mesh_seed`]) and replays
//! exactly. The baton moves at communication ops (a remote copy, a wait, a
//! signal) and at grid steps, and whenever a device must wait for
//! something another device has not yet done. Remote copies are delivered
//! in a seeded random order at those hand-offs, or when no device could
//! otherwise run.
//!
//! Nothing crosses between devices except through the network's inboxes:
//! a device reads its inbox (copies claimed or arrived, sends done,
//! signals) each time it takes the baton back, so every effect another
//! device has on it lands at one of its own communication ops, as on
//! hardware where only a semaphore tells a kernel that data has come.
//!
//! When every device is waiting and nothing in flight can wake one, the
//! run is a deadlock: each waiting device's op is reported, where a TPU
//! (and Pallas's interpret mode) would hang.

use std::sync::{Condvar, Mutex, MutexGuard};

use super::value::{Ranges, Val};
use crate::array::SplitMix64;
use crate::error::{ErrorKind, KernelError};
use crate::{BufferRef, Loc};

/// A message one device leaves in another's inbox.
pub(crate) enum Msg {
    /// A remote copy into this device has started: its destination is
    /// taken until this device waits for it.
    Claim(Claim),
    /// The bytes of copy `id` have arrived.
    Arrive {
        /// The copy.
        id: u64,
        /// Its data, as read from the sender's source at the start.
        data: Val,
    },
    /// Copy `id`, started here, has left this device.
    Sent {
        /// The copy.
        id: u64,
    },
    /// A remote signal of a semaphore here.
    Signal {
        /// The semaphore: array and flat index.
        sem: (usize, usize),
        /// What was added.
        amount: i64,
        /// Where it was signalled.
        loc: Option<Loc>,
    },
}

/// A remote copy as its destination device sees it.
pub(crate) struct Claim {
    pub id: u64,
    pub from: usize,
    pub dst: (BufferRef, Ranges),
    /// The receive semaphore here.
    pub sem: (usize, usize),
    pub bytes: u64,
    pub started: Option<Loc>,
}

/// What a device is doing, as the scheduler sees it.
#[derive(Clone)]
enum Status {
    /// May run when given the baton.
    Ready,
    /// Holds the baton.
    Running,
    /// Waits for something another device must do.
    Blocked { what: String, loc: Option<Loc> },
    /// Its grid has ended.
    Done,
}

/// A remote copy whose bytes have not yet arrived.
struct Transfer {
    id: u64,
    from: usize,
    to: usize,
    data: Val,
}

struct State {
    turn: usize,
    status: Vec<Status>,
    inbox: Vec<Vec<Msg>>,
    transfers: Vec<Transfer>,
    rng: SplitMix64,
    /// The first error of the run; every device stops when it is set.
    failed: Option<KernelError>,
    next_id: u64,
}

/// The devices' shared state: the baton, inboxes and copies in flight.
pub(crate) struct Network {
    state: Mutex<State>,
    turn: Condvar,
}

/// The error a device returns when another device's error (or a
/// deadlock) ended the run; the run reports that one instead.
fn stopped() -> KernelError {
    KernelError::from(ErrorKind::Mesh("stopped by another device".into()))
}

impl Network {
    pub(crate) fn new(devices: usize, seed: u64) -> Network {
        let mut rng = SplitMix64(seed);
        let first = rng.below(devices.max(1));
        Network {
            state: Mutex::new(State {
                turn: first,
                status: vec![Status::Ready; devices],
                inbox: (0..devices).map(|_| Vec::new()).collect(),
                transfers: Vec::new(),
                rng,
                failed: None,
                next_id: 0,
            }),
            turn: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A device thread that panicked has already recorded a failure
        // (see `PanicGuard`); the state itself stays consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for `me`'s turn.
    fn wait_turn<'g>(
        &self,
        mut st: MutexGuard<'g, State>,
        me: usize,
    ) -> Result<MutexGuard<'g, State>, KernelError> {
        while st.turn != me && st.failed.is_none() {
            st = self.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.failed.is_some() {
            return Err(stopped());
        }
        st.status[me] = Status::Running;
        Ok(st)
    }

    /// Blocks until device `me` first holds the baton.
    pub(crate) fn start(&self, me: usize) -> Result<(), KernelError> {
        let st = self.lock();
        self.wait_turn(st, me).map(drop)
    }

    /// The first error, if the run has failed.
    pub(crate) fn failure(&self) -> Option<KernelError> {
        self.lock().failed.clone()
    }

    /// Records device `me`'s error (the first one wins) and stops all.
    pub(crate) fn fail(&self, me: usize, e: KernelError) {
        let mut st = self.lock();
        if st.failed.is_none() && e != stopped() {
            st.failed = Some(on_device(me, e));
        }
        drop(st);
        self.turn.notify_all();
    }

    /// Device `me` ended its grid; the baton moves on.
    pub(crate) fn finish(&self, me: usize) {
        let mut st = self.lock();
        st.status[me] = Status::Done;
        self.hand_off(&mut st);
        drop(st);
        self.turn.notify_all();
    }

    /// A communication op of device `me`: deliver some copies, maybe let
    /// another device run, and return `me`'s inbox once it runs again.
    pub(crate) fn sync(&self, me: usize) -> Result<Vec<Msg>, KernelError> {
        let mut st = self.lock();
        st.status[me] = Status::Ready;
        deliver_some(&mut st);
        // Stay with probability one half, else any ready device (maybe
        // this one again): a fast device runs ahead as often as not.
        if st.rng.below(2) == 1 {
            self.hand_off(&mut st);
        } else {
            st.turn = me;
        }
        self.resume(st, me)
    }

    /// Device `me` cannot go on until another device acts (`what`, at
    /// `loc`): it waits until something arrives for it.
    pub(crate) fn block(
        &self,
        me: usize,
        what: String,
        loc: &Option<Loc>,
    ) -> Result<Vec<Msg>, KernelError> {
        let mut st = self.lock();
        st.status[me] = Status::Blocked {
            what,
            loc: loc.clone(),
        };
        deliver_some(&mut st);
        self.hand_off(&mut st);
        self.resume(st, me)
    }

    fn resume(&self, st: MutexGuard<'_, State>, me: usize) -> Result<Vec<Msg>, KernelError> {
        self.turn.notify_all();
        let mut st = self.wait_turn(st, me)?;
        Ok(std::mem::take(&mut st.inbox[me]))
    }

    /// Moves the baton to a random ready device, delivering copies in
    /// flight until one is ready; with none ready and nothing in flight,
    /// a waiting device is a deadlock.
    fn hand_off(&self, st: &mut State) {
        loop {
            let ready: Vec<usize> = (0..st.status.len())
                .filter(|&d| matches!(st.status[d], Status::Ready))
                .collect();
            if !ready.is_empty() {
                st.turn = ready[st.rng.below(ready.len())];
                return;
            }
            if st.transfers.is_empty() {
                break;
            }
            let i = st.rng.below(st.transfers.len());
            deliver(st, i);
        }
        let waiting: Vec<(usize, String, Option<Loc>)> = st
            .status
            .iter()
            .enumerate()
            .filter_map(|(d, s)| match s {
                Status::Blocked { what, loc } => Some((d, what.clone(), loc.clone())),
                _ => None,
            })
            .collect();
        if waiting.is_empty() || st.failed.is_some() {
            return;
        }
        let at = waiting[0].2.clone();
        let each: Vec<String> = waiting
            .iter()
            .map(|(d, what, loc)| {
                let l = loc
                    .as_ref()
                    .map_or("(unknown location)".into(), |l| l.to_string());
                format!("device {d} waits at {l}: {what}")
            })
            .collect();
        let finished: Vec<usize> = (0..st.status.len())
            .filter(|&d| matches!(st.status[d], Status::Done))
            .collect();
        st.failed = Some(KernelError::new(
            ErrorKind::Deadlock {
                waiting: each,
                finished,
            },
            at,
        ));
    }

    /// Starts a remote copy from `me`: claims its destination on `to` and
    /// puts its bytes in flight. Returns the copy's id.
    pub(crate) fn send(&self, me: usize, to: usize, mut claim: Claim, data: Val) -> u64 {
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        claim.id = id;
        claim.from = me;
        st.inbox[to].push(Msg::Claim(claim));
        st.transfers.push(Transfer {
            id,
            from: me,
            to,
            data,
        });
        id
    }

    /// Adds `amount` to semaphore `sem` of device `to`.
    pub(crate) fn signal(&self, to: usize, sem: (usize, usize), amount: i64, loc: &Option<Loc>) {
        let mut st = self.lock();
        st.inbox[to].push(Msg::Signal {
            sem,
            amount,
            loc: loc.clone(),
        });
        wake(&mut st, to);
    }

    /// After every device ended: delivers what is still in flight and
    /// returns each device's last inbox.
    pub(crate) fn drain(&self) -> Vec<Vec<Msg>> {
        let mut st = self.lock();
        while !st.transfers.is_empty() {
            deliver(&mut st, 0);
        }
        std::mem::take(&mut st.inbox)
    }
}

fn wake(st: &mut State, d: usize) {
    if matches!(st.status[d], Status::Blocked { .. }) {
        st.status[d] = Status::Ready;
    }
}

fn deliver(st: &mut State, i: usize) {
    let t = st.transfers.remove(i);
    st.inbox[t.to].push(Msg::Arrive {
        id: t.id,
        data: t.data,
    });
    st.inbox[t.from].push(Msg::Sent { id: t.id });
    wake(st, t.to);
    wake(st, t.from);
}

/// Delivers each copy in flight with probability one half, in a random
/// order.
fn deliver_some(st: &mut State) {
    let mut i = 0;
    while i < st.transfers.len() {
        if st.rng.below(2) == 0 {
            let j = i + st.rng.below(st.transfers.len() - i);
            deliver(st, j);
        } else {
            i += 1;
        }
    }
}

/// `e` as an error of device `d`.
pub(crate) fn on_device(d: usize, e: KernelError) -> KernelError {
    match e.kind {
        ErrorKind::Deadlock { .. } | ErrorKind::OnDevice { .. } => e,
        kind => KernelError::new(
            ErrorKind::OnDevice {
                device: d,
                error: Box::new(kind),
            },
            e.loc,
        ),
    }
}

/// Stops the run if a device thread unwinds, so the others never wait
/// for a baton that will not come.
pub(crate) struct PanicGuard<'a> {
    pub net: &'a Network,
    pub device: usize,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.net.fail(
                self.device,
                KernelError::from(ErrorKind::Mesh(
                    "the interpreter panicked on this device (a bug in Tessera; please report it)"
                        .into(),
                )),
            );
        }
    }
}
