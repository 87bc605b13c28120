//! Kernels across the chips of a ring: each device runs the same kernel on
//! its shard and passes blocks to its neighbour with remote copies, so
//! the transfers overlap the work (Pallas's "Distributed computing in
//! Pallas for TPUs"; vLLM's `all_gather_matmul.py`,
//! `reduce_scatter_matmul.py`).
//!
//! * [`all_gather`]: ring all-gather of row shards;
//! * [`all_gather_matmul_kernel`]: the collective matmul, `all_gather(x) @ w`
//!   with each step's matmul overlapping the next block's transfer, and
//!   [`all_gather_matmul_bidirectional_kernel`], its halves sent both ways
//!   around the ring;
//! * [`matmul_reduce_scatter_kernel`]: `reduce_scatter(x @ w)` with the partial
//!   sums passed around the ring as they are computed;
//! * [`ring_attention_kernel`]: attention over kv shards passed around the ring,
//!   the online softmax carried from step to step, and
//!   [`ring_attention_bwd_kernel`], its backward (the blocks' `dk`, `dv` passed
//!   around with them);
//! * [`all_to_all`]: the MoE dispatch, chunk `j` of every device to
//!   device `j`.
//!
//! Every kernel runs on the devices of its mesh (`mesh = (x = devices)`,
//! logical ids around the ring) and is run on the CPU by
//! [`kernel_ir::interpret_mesh`], which checks the protocol: a buffer is
//! sent to only after its receiver said it is free (a regular semaphore
//! signalled back), every copy is waited on both sides, every semaphore
//! ends at zero. Each has an f64 reference over the per-device arrays.
//!
//! ```
//! use kernels::collective::{all_gather, reference};
//! use kernel_ir::{Array, DType, InterpOptions, interpret_mesh};
//! let k = all_gather(DType::F32, 4, 8, 128).unwrap();
//! let x: Vec<Array> = (0..4).map(|d| Array::random(DType::F32, [8, 128], d, -1.0, 1.0)).collect();
//! let args: Vec<Vec<Array>> = x.iter().map(|a| vec![a.clone()]).collect();
//! let run = interpret_mesh(&k, &args, &InterpOptions::default()).unwrap();
//! let want = reference::all_gather(&x);
//! assert_eq!(run.outputs[2][0].data(), want.as_slice());
//! ```

pub mod reference;

use kernel_ir::prelude::*;
use kernel_ir::{AsyncCopy, SemArray};

/// The hop the ring attention kernels make each step: slot `slot` of a
/// double-buffered `[2, ..]` scratch sent to the other slot of the same
/// scratch on device `to`, signalled on `send[row, slot]` here and
/// `recv[row, 1 - slot]` there (one semaphore row per buffer travelling).
#[kernel_fn]
fn ring_hop(
    buf: Ref,
    slot: usize,
    send: SemArray,
    recv: SemArray,
    row: usize,
    to: Tile,
) -> AsyncCopy {
    let next = 1 - slot;
    make_async_remote_copy(
        buf.slice((slot, .., ..)),
        buf.slice((next, .., ..)),
        send.at((row, slot)),
        recv.at((row, next)),
        to,
    )
}

/// What both ring attention kernels take: this device's whole query block,
/// and its k and v blocks where they are (`#[any]`: copied into the
/// travelling buffers by [`own_kv_block`]).
#[operands]
pub(crate) struct RingQkv<T> {
    #[shape(sq, d)]
    #[block([sq, d], |_| (0, 0))]
    q: In<T>,
    #[any]
    #[shape(skv, d)]
    k: In<T>,
    #[any]
    #[shape(skv, d)]
    v: In<T>,
}

/// The ring attention kernels' first step: this device's own k and v
/// block copied into slot 0 of the double-buffered `kbuf` and `vbuf`
/// (signalled on `local[0]` and `local[1]`), both waited for.
#[kernel_fn]
fn own_kv_block(k: Ref, v: Ref, kbuf: Ref, vbuf: Ref, local: SemArray) {
    let own_k = make_async_copy(k, kbuf.slice((0, .., ..)), local.at(0));
    let own_v = make_async_copy(v, vbuf.slice((0, .., ..)), local.at(1));
    own_k.start();
    own_v.start();
    own_k.wait();
    own_v.wait();
}

mod all_to_all;
mod bidirectional;
mod gather;
mod matmul;
mod ring_attention;
mod ring_attention_bwd;

pub use all_to_all::{all_to_all, all_to_all_kernel};
pub use bidirectional::all_gather_matmul_bidirectional_kernel;
pub use gather::{all_gather, all_gather_kernel};
pub use matmul::{Protocol, all_gather_matmul_kernel, matmul_reduce_scatter_kernel};
pub use ring_attention::ring_attention_kernel;
pub use ring_attention_bwd::ring_attention_bwd_kernel;
