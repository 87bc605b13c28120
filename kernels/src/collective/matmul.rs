//! Matmuls whose operand or result crosses the ring while the MXU works.
//!
//! Both keep two VMEM slots per device: the block being used and the one
//! arriving. A device sends into its right neighbour's slot only after the
//! neighbour said the slot is free (a regular semaphore it signals back
//! once it has read the slot and its own send from it has left), so no
//! copy overwrites data still in use. [`Protocol`] breaks that handshake
//! on purpose, to show what [`kernel_ir::interpret_mesh`] reports.

use kernel_ir::prelude::*;

/// How [`all_gather_matmul_kernel`](mod@all_gather_matmul_kernel) keeps its slots safe. Only
/// [`Protocol::Handshake`] is correct; the others are the classic
/// mistakes, kept so the interpreter's errors can be seen (and tested) on
/// a real kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// The receiver signals "slot free" to its left neighbour, which
    /// waits for it before sending into that slot.
    Handshake,
    /// No handshake: a fast sender overwrites a slot its neighbour is
    /// still using (a race).
    NoHandshake,
    /// The sender also waits for "free" before its first send, which no
    /// one signals (a deadlock; a TPU hangs).
    WaitFirst,
    /// The receiver signals "free" once more than the sender waits (the
    /// semaphore ends at 1).
    ExtraSignal,
}

impl Protocol {
    /// Whether the sender waits for "slot free" before its send at step
    /// `s` (the slot it sends into was used at step `s - 1`).
    fn waits_free(self, s: usize) -> bool {
        match self {
            Protocol::Handshake | Protocol::ExtraSignal => s > 0,
            Protocol::NoHandshake => false,
            Protocol::WaitFirst => true,
        }
    }

    /// Whether the receiver signals "slot free" after step `s` of
    /// `devices`: the left neighbour sends into that slot again at its
    /// step `s + 1` only if `s + 2 < devices`.
    fn signals_free(self, s: usize, devices: usize) -> bool {
        match self {
            Protocol::Handshake | Protocol::WaitFirst => s + 2 < devices,
            Protocol::NoHandshake => false,
            Protocol::ExtraSignal => s + 1 < devices,
        }
    }
}

/// `o = all_gather(x) @ w`: device `d` holds rows block `d` of `x` and the
/// whole `w` (or its own columns, Megatron's column-parallel layer); at
/// step `s` it multiplies the block that came from device `d - s` while
/// forwarding it to device `d + 1`.
#[tpu_kernel(grid = (1,), semantics = (arbitrary,), mesh = (x = devices))]
pub fn all_gather_matmul_kernel<T: Float>(
    devices: usize,
    protocol: Protocol,
    #[any]
    #[shape(m, k)]
    x: In<T>,
    #[shape(k, n)]
    #[block([k, n], |_| (0, 0))]
    w: In<T>,
    #[shape(devices * m, n)]
    #[block([devices * m, n], |_| (0, 0))]
    o: Out<T>,
    #[shape(2, m, k)] buf: Scratch<T>,
    #[shape(2)] send: DmaSemaphores,
    #[shape(2)] recv: DmaSemaphores,
    local: DmaSemaphores,
    free: Semaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let left = (me + devices - 1) % devices;
    let own = make_async_copy(x, buf.slice((0, .., ..)), local.at(()));
    own.start();
    own.wait();
    let wv = w.load(..).convert(F32);
    #[unroll]
    for s in 0..devices {
        let (slot, next) = (s % 2, (s + 1) % 2);
        let more = s + 1 < devices;
        let forward = make_async_remote_copy(
            buf.slice((slot, .., ..)),
            buf.slice((next, .., ..)),
            send.at(slot),
            recv.at(next),
            right,
        );
        if more {
            if protocol.waits_free(s) {
                free.at(()).wait(1);
            }
            forward.start();
        }
        let block = (me + devices - s % devices) % devices;
        let y = dot(buf.load((slot, .., ..)).convert(F32), wv);
        o.store((ds(block * m, m), ..), y.cast::<T>());
        if more {
            forward.wait_send();
            forward.wait();
        }
        if protocol.signals_free(s, devices) {
            free.at(()).signal_remote(1, left);
        }
    }
}

/// `o = reduce_scatter(x @ w)` over rows: device `d` holds `x`'s columns
/// block `d` (`[devices * m, k]`, the contraction sharded) and `w`'s rows
/// block `d` (`[k, n]`), and ends with rows block `d` of the summed
/// product. At step `s` it computes its partial sum of block `d - s - 1`,
/// adds the partial sum that arrived from the left, and sends the total
/// on; the block reaches its owner after visiting every device.
#[tpu_kernel(grid = (1,), semantics = (arbitrary,), mesh = (x = devices))]
pub fn matmul_reduce_scatter_kernel<T: Float>(
    devices: usize,
    #[shape(devices * m, k)]
    #[block([devices * m, k], |_| (0, 0))]
    x: In<T>,
    #[shape(k, n)]
    #[block([k, n], |_| (0, 0))]
    w: In<T>,
    #[shape(m, n)]
    #[block([m, n], |_| (0, 0))]
    o: Out<T>,
    #[shape(2, m, n)] partial: Scratch<f32>,
    #[shape(2, m, n)] arrived: Scratch<f32>,
    #[shape(2)] send: DmaSemaphores,
    #[shape(2)] recv: DmaSemaphores,
    free: Semaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let left = (me + devices - 1) % devices;
    let wv = w.load(..).convert(F32);
    #[unroll]
    for s in 0..devices {
        let block = (me + 2 * devices - s - 1) % devices;
        let mut sum = dot(x.load((ds(block * m, m), ..)).convert(F32), wv);
        if s > 0 {
            // The left neighbour's total for this block, sent at its step
            // s - 1 into slot s % 2.
            let incoming = make_async_remote_copy(
                partial.slice((s % 2, .., ..)),
                arrived.slice((s % 2, .., ..)),
                send.at(s % 2),
                recv.at(s % 2),
                right,
            );
            incoming.wait();
            sum = sum + arrived.load((s % 2, .., ..));
            // Slot s % 2 is read: the left may send into it again (its
            // step s + 1), if it sends that far.
            if s + 2 < devices {
                free.at(()).signal_remote(1, left);
            }
        }
        if s + 1 < devices {
            let slot = s % 2;
            let out = make_async_remote_copy(
                partial.slice((slot, .., ..)),
                arrived.slice(((s + 1) % 2, .., ..)),
                send.at(slot),
                recv.at((s + 1) % 2),
                right,
            );
            partial.store((slot, .., ..), sum);
            if s >= 2 {
                free.at(()).wait(1);
            }
            out.start();
            out.wait_send();
        } else {
            o.store(.., sum.cast::<T>());
        }
    }
}
