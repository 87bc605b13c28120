//! The MoE dispatch as an all-to-all: device `d` holds one chunk of
//! tokens per destination (`x[j]` goes to device `j`) and receives chunk
//! `d` of every device into `o[j]` (from device `j`). Every chunk goes
//! straight to its destination (one hop on a fully connected slice, or
//! routed by the ICI), all copies in flight at once; each destination
//! slot is written once, with a receive semaphore of its own, so no
//! handshake is needed.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

/// `o[j] = x[me]` of device `j`, for every device `j` of the mesh.
#[tpu_kernel(grid = (), semantics = (), mesh = (x = devices))]
pub fn all_to_all_kernel<T: Float>(
    devices: usize,
    #[any]
    #[shape(devices, c, d)]
    x: In<T>,
    #[any]
    #[shape(devices, c, d)]
    o: Out<T>,
    #[shape(devices)] send: DmaSemaphores,
    #[shape(devices)] recv: DmaSemaphores,
) {
    let me = device_id();
    #[unroll]
    for j in 0..devices {
        make_async_remote_copy(
            x.slice((j, .., ..)),
            o.slice((me, .., ..)),
            send.at(j),
            recv.at(me),
            j,
        )
        .start();
    }
    #[unroll]
    for j in 0..devices {
        // The chunk device j sent here (its `me` is j).
        make_async_remote_copy(
            x.slice((me, .., ..)),
            o.slice((j, .., ..)),
            send.at(me),
            recv.at(j),
            j,
        )
        .wait();
        make_async_remote_copy(
            x.slice((j, .., ..)),
            o.slice((me, .., ..)),
            send.at(j),
            recv.at(me),
            j,
        )
        .wait_send();
    }
}

/// [`all_to_all_kernel`](mod@all_to_all_kernel) for a dtype, `devices`
/// and chunks of `[c, d]`.
pub fn all_to_all(
    dtype: DType,
    devices: usize,
    c: usize,
    d: usize,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = all_to_all_kernel::Dims { c, d };
    all_to_all_kernel::build_for(dtype, devices, dims)
}
