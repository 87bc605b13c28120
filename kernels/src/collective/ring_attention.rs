//! Ring attention, forward: each device holds a block of queries and a
//! block of keys and values; the kv blocks travel around the ring, one
//! hop per step, while each device folds the block it holds into its
//! online softmax (running max, sum and accumulator carried from step to
//! step). After `devices` steps every query has seen every key. The kv
//! slots use the same "slot free" handshake as the collective matmul.

use kernel_ir::prelude::*;

/// `o = softmax(scale · q kᵀ) v` over the keys of every device, and the
/// rows' logsumexp `lse` (what a backward needs), non-causal.
#[tpu_kernel(grid = (1,), semantics = (arbitrary,), mesh = (x = devices))]
pub fn ring_attention_kernel<T: Float>(
    devices: usize,
    scale: f32,
    #[operands] _: crate::collective::RingQkv<T>,
    #[shape(sq, d)]
    #[block([sq, d], |_| (0, 0))]
    o: Out<T>,
    #[shape(sq, 128)]
    #[block([sq, 128], |_| (0, 0))]
    lse: Out<f32>,
    #[shape(2, skv, d)] kbuf: Scratch<T>,
    #[shape(2, skv, d)] vbuf: Scratch<T>,
    #[shape(2, 2)] send: DmaSemaphores,
    #[shape(2, 2)] recv: DmaSemaphores,
    #[shape(2)] local: DmaSemaphores,
    free: Semaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let left = (me + devices - 1) % devices;
    crate::collective::own_kv_block(k, v, kbuf, vbuf, local);
    let qs = q.load(..).convert(F32) * scale;
    let mut m = constant(f32::NEG_INFINITY, F32, [sq, 1]);
    let mut l = constant(0.0f32, F32, [sq, 1]);
    let mut acc = constant(0.0f32, F32, [sq, d]);
    #[unroll]
    for s in 0..devices {
        let slot = s % 2;
        let more = s + 1 < devices;
        let fk = crate::collective::ring_hop(kbuf, slot, send, recv, 0, right);
        let fv = crate::collective::ring_hop(vbuf, slot, send, recv, 1, right);
        if more {
            if s > 0 {
                free.at(()).wait(1);
            }
            fk.start();
            fv.start();
        }
        let scores = dot(qs, kbuf.load((slot, .., ..)).convert(F32).t());
        let m_new = m.max(scores.max_keep(1));
        let p = (scores - m_new).exp();
        let alpha = (m - m_new).exp();
        l = l * alpha + p.sum_keep(1);
        acc = acc * alpha + dot(p, vbuf.load((slot, .., ..)).convert(F32));
        m = m_new;
        if more {
            fk.wait_send();
            fv.wait_send();
            fk.wait();
            fv.wait();
        }
        if s + 2 < devices {
            free.at(()).signal_remote(1, left);
        }
    }
    o.store(.., (acc / l).cast::<T>());
    lse.store(.., (m + l.log()).broadcast_to([sq, 128]));
}
