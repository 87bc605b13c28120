//! The collective matmul on both directions of the ring: each shard's top
//! half travels right and its bottom half left, so every step moves half
//! the bytes over each of a device's two links and the gather takes half
//! the link time of [`super::all_gather_matmul`] (on a 1-D ring of
//! bidirectional ICI links, as on a v5e or v6e slice's rows).
//!
//! Each direction keeps its own two VMEM slots and its own "slot free"
//! handshake, the same protocol as the one-way kernel: the receiver of
//! the right-going half signals its left neighbour when a slot may be
//! sent into again, the receiver of the left-going half its right one.

use kernel_ir::prelude::*;

/// `o = all_gather(x) @ w` with `x`'s halves sent both ways: at step `s`
/// device `d` multiplies the top half of block `d - s` (arrived from the
/// left) and the bottom half of block `d + s` (arrived from the right)
/// while forwarding both.
#[tpu_kernel(grid = (1,), semantics = (arbitrary,), mesh = (x = devices))]
pub fn all_gather_matmul_bidirectional_kernel<T: Float>(
    devices: usize,
    #[any]
    #[shape(2, h, k)]
    x: In<T>,
    #[shape(k, n)]
    #[block([k, n], |_| (0, 0))]
    w: In<T>,
    #[shape(devices * 2 * h, n)]
    #[block([devices * 2 * h, n], |_| (0, 0))]
    o: Out<T>,
    #[shape(2, h, k)] rightward: Scratch<T>,
    #[shape(2, h, k)] leftward: Scratch<T>,
    #[shape(2)] send_r: DmaSemaphores,
    #[shape(2)] recv_r: DmaSemaphores,
    #[shape(2)] send_l: DmaSemaphores,
    #[shape(2)] recv_l: DmaSemaphores,
    #[shape(2)] local: DmaSemaphores,
    free_r: Semaphores,
    free_l: Semaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let left = (me + devices - 1) % devices;
    let top = make_async_copy(
        x.slice((0, .., ..)),
        rightward.slice((0, .., ..)),
        local.at(0),
    );
    let bottom = make_async_copy(
        x.slice((1, .., ..)),
        leftward.slice((0, .., ..)),
        local.at(1),
    );
    top.start();
    bottom.start();
    top.wait();
    bottom.wait();
    let wv = w.load(..).convert(F32);
    #[unroll]
    for s in 0..devices {
        let (slot, next) = (s % 2, (s + 1) % 2);
        let more = s + 1 < devices;
        let to_right = make_async_remote_copy(
            rightward.slice((slot, .., ..)),
            rightward.slice((next, .., ..)),
            send_r.at(slot),
            recv_r.at(next),
            right,
        );
        let to_left = make_async_remote_copy(
            leftward.slice((slot, .., ..)),
            leftward.slice((next, .., ..)),
            send_l.at(slot),
            recv_l.at(next),
            left,
        );
        if more {
            // The slot each neighbour receives into was in use at its step
            // s - 1; it says when it is free.
            if s > 0 {
                free_r.at(()).wait(1);
                free_l.at(()).wait(1);
            }
            to_right.start();
            to_left.start();
        }
        let from_left = (me + devices - s % devices) % devices;
        let from_right = (me + s) % devices;
        let yt = dot(rightward.load((slot, .., ..)).convert(F32), wv);
        o.store((ds(from_left * 2 * h, h), ..), yt.cast::<T>());
        let yb = dot(leftward.load((slot, .., ..)).convert(F32), wv);
        o.store((ds(from_right * 2 * h + h, h), ..), yb.cast::<T>());
        if more {
            to_right.wait_send();
            to_left.wait_send();
            to_right.wait();
            to_left.wait();
        }
        if s + 2 < devices {
            free_r.at(()).signal_remote(1, left);
            free_l.at(()).signal_remote(1, right);
        }
    }
}
