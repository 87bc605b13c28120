//! Ring all-gather: device `d` holds rows block `d`; after `devices - 1`
//! steps every device holds every block. At step `s` each device forwards
//! the block it received at step `s - 1` (its own at step 0) to its right
//! neighbour. Each block lands in its own rows of the output and each step
//! has its own receive semaphore, so no slot is written twice and no wait
//! can be satisfied by another step's bytes.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

/// `o = concat(x of every device)` along rows, on a ring of `devices`.
#[tpu_kernel(grid = (), semantics = (), mesh = (x = devices))]
pub fn all_gather_kernel<T: Float>(
    devices: usize,
    #[any]
    #[shape(m, n)]
    x: In<T>,
    #[any]
    #[shape(devices * m, n)]
    o: Out<T>,
    #[shape(devices)] send: DmaSemaphores,
    #[shape(devices)] recv: DmaSemaphores,
    local: DmaSemaphores,
) {
    let me = device_id();
    let right = (me + 1) % devices;
    let own = make_async_copy(x, o.slice((ds(me * m, m), ..)), local.at(()));
    own.start();
    own.wait();
    for s in 0..devices - 1 {
        // The block forwarded now, and the one arriving from the left.
        let out_block = (me + devices - s) % devices;
        let in_block = (me + 2 * devices - s - 1) % devices;
        let send_now = make_async_remote_copy(
            o.slice((ds(out_block * m, m), ..)),
            o.slice((ds(out_block * m, m), ..)),
            send.at(s),
            recv.at(s),
            right,
        );
        send_now.start();
        let arriving = make_async_remote_copy(
            o.slice((ds(in_block * m, m), ..)),
            o.slice((ds(in_block * m, m), ..)),
            send.at(s),
            recv.at(s),
            right,
        );
        arriving.wait();
        send_now.wait_send();
    }
}

/// [`all_gather_kernel`](mod@all_gather_kernel) for a dtype, `devices`
/// and the shard's `[m, n]`.
pub fn all_gather(
    dtype: DType,
    devices: usize,
    m: usize,
    n: usize,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = all_gather_kernel::Dims { m, n };
    all_gather_kernel::build_for(dtype, devices, dims)
}
