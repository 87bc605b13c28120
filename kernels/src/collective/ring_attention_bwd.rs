//! Ring attention, backward: the kv blocks travel around the ring again,
//! now with their gradients. At step `s` device `d` holds block
//! `d - s` with the `dk`, `dv` its earlier hosts accumulated, adds its own
//! queries' share, and passes all four on; `dq` stays home. After
//! `devices` steps a block's gradients have visited every device and one
//! more hop brings them to their owner.
//!
//! The slots use the forward's "slot free" handshake, with one wait and
//! one signal more: the last step sends gradients only, into a slot the
//! owner used one step before.

use kernel_ir::prelude::*;

/// `dq`, `dk`, `dv` of [`super::ring_attention`] from the forward's `o`,
/// `lse` and the output cotangent `do_`: `dq` of this device's queries
/// over every key, `dk`, `dv` of this device's keys and values over every
/// query.
#[tpu_kernel(grid = (1,), semantics = (arbitrary,), mesh = (x = devices))]
pub fn ring_attention_bwd_kernel<T: Float>(
    devices: usize,
    scale: f32,
    #[operands] _: crate::collective::RingQkv<T>,
    #[shape(sq, d)]
    #[block([sq, d], |_| (0, 0))]
    o: In<T>,
    #[shape(sq, 128)]
    #[block([sq, 128], |_| (0, 0))]
    lse: In<f32>,
    #[shape(sq, d)]
    #[block([sq, d], |_| (0, 0))]
    do_: In<T>,
    #[shape(sq, d)]
    #[block([sq, d], |_| (0, 0))]
    dq: Out<T>,
    #[shape(skv, d)]
    #[block([skv, d], |_| (0, 0))]
    dk: Out<T>,
    #[shape(skv, d)]
    #[block([skv, d], |_| (0, 0))]
    dv: Out<T>,
    #[shape(2, skv, d)] kbuf: Scratch<T>,
    #[shape(2, skv, d)] vbuf: Scratch<T>,
    #[shape(2, skv, d)] dkbuf: Scratch<f32>,
    #[shape(2, skv, d)] dvbuf: Scratch<f32>,
    #[shape(4, 2)] send: DmaSemaphores,
    #[shape(4, 2)] recv: DmaSemaphores,
    #[shape(2)] local: DmaSemaphores,
    free: Semaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let left = (me + devices - 1) % devices;
    crate::collective::own_kv_block(k, v, kbuf, vbuf, local);
    // The own block starts with no gradient.
    dkbuf.store((0, .., ..), constant(0.0f32, F32, [skv, d]));
    dvbuf.store((0, .., ..), constant(0.0f32, F32, [skv, d]));
    let qf = q.load(..).convert(F32);
    let dof = do_.load(..).convert(F32);
    let rows_lse = lse.load((.., ds(0, 1)));
    // D = rowsum(do ∘ o): the softmax's Jacobian term, once per query.
    let delta = (dof * o.load(..).convert(F32)).sum_keep(1);
    let mut dq_acc = constant(0.0f32, F32, [sq, d]);
    #[unroll]
    for s in 0..devices {
        let slot = s % 2;
        let more = s + 1 < devices;
        let fk = crate::collective::ring_hop(kbuf, slot, send, recv, 0, right);
        let fv = crate::collective::ring_hop(vbuf, slot, send, recv, 1, right);
        let fdk = crate::collective::ring_hop(dkbuf, slot, send, recv, 2, right);
        let fdv = crate::collective::ring_hop(dvbuf, slot, send, recv, 3, right);
        // Every step sends into the right neighbour's other slot, which
        // it used at its step s - 1.
        if s > 0 {
            free.at(()).wait(1);
        }
        if more {
            fk.start();
            fv.start();
        }
        let kb = kbuf.load((slot, .., ..)).convert(F32);
        let vb = vbuf.load((slot, .., ..)).convert(F32);
        let p = (dot(qf, kb.t()) * scale - rows_lse).exp();
        let dp = dot(dof, vb.t());
        let ds_ = p * (dp - delta);
        dq_acc = dq_acc + dot(ds_, kb) * scale;
        dkbuf.store(
            (slot, .., ..),
            dkbuf.load((slot, .., ..)) + dot(ds_.t(), qf) * scale,
        );
        dvbuf.store((slot, .., ..), dvbuf.load((slot, .., ..)) + dot(p.t(), dof));
        fdk.start();
        fdv.start();
        if more {
            fk.wait_send();
            fv.wait_send();
            fk.wait();
            fv.wait();
        }
        fdk.wait_send();
        fdv.wait_send();
        fdk.wait();
        fdv.wait();
        // Slot `slot` is read and sent from: the left neighbour sends into
        // it at its step s + 1, if it has one.
        if more {
            free.at(()).signal_remote(1, left);
        }
    }
    let home = devices % 2;
    dq.store(.., dq_acc.cast::<T>());
    dk.store(.., dkbuf.load((home, .., ..)).cast::<T>());
    dv.store(.., dvbuf.load((home, .., ..)).cast::<T>());
}
