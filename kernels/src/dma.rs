//! Manual copies in their smallest form: every construct of the DMA model
//! in one kernel, mirrored by a Pallas kernel in the conformance check.
//!
//! `x: [n, 2r, c]` stays in HBM (`#[any]`); step `i` computes
//! `o[i] = x[i, :r] + x[i, r:] + 1`:
//!
//! * the top halves are double-buffered across grid steps: step 0 starts
//!   the copy of its own rows, every step starts the copy of the next
//!   step's rows into the other slot before waiting on its own, so the
//!   next copy overlaps this step's work;
//! * the bottom half is copied into a buffer allocated for a `scoped`
//!   block, with a DMA semaphore of its own;
//! * the `+ 1` is read from a regular semaphore, signalled and waited.
//!
//! ```
//! use kernels::dma::double_buffered_rows;
//! use kernel_ir::{Array, DType, interpret};
//! let k = double_buffered_rows::build_for(DType::F32, double_buffered_rows::Dims { n: 3, two_r: 16, c: 128 }).unwrap();
//! let x = Array::random(DType::F32, [3, 16, 128], 1, -1.0, 1.0);
//! let o = interpret(&k, &[x.clone()]).unwrap();
//! let want = x.data()[0] + x.data()[8 * 128] + 1.0;
//! assert!((o[0].data()[0] - want).abs() < 1e-6);
//! ```

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{
    DTYPE, Entry, EntryError, Preset, dims, dtype_tolerance, no_check, uniform_inputs,
};

/// Rows of the top half copied per step, from `2r` rows.
fn half(two_r: usize) -> usize {
    two_r / 2
}

/// `o[i] = x[i, :r] + x[i, r:] + 1` with hand-made copies from HBM.
#[tpu_kernel(grid = (n), semantics = (arbitrary))]
pub fn double_buffered_rows<T: Float>(
    #[any]
    #[shape(n, two_r, c)]
    x: In<T>,
    #[shape(n, half(two_r), c)]
    #[block([1, half(two_r), c], |i| (i, 0, 0))]
    o: Out<T>,
    #[shape(2, half(two_r), c)] buf: Scratch<T>,
    #[shape(2)] sems: DmaSemaphores,
    #[shape(1)] counter: Semaphores,
) {
    let r = two_r / 2;
    let i = program_id(0);
    let slot = i % 2;
    if i == 0 {
        make_async_copy(x.slice((0, 0..r, ..)), buf.slice((0, .., ..)), sems.at(0)).start();
    }
    if i + 1 < num_programs(0) {
        let next = (i + 1) % 2;
        make_async_copy(
            x.slice((i + 1, 0..r, ..)),
            buf.slice((next, .., ..)),
            sems.at(next),
        )
        .start();
    }
    make_async_copy(
        x.slice((i, 0..r, ..)),
        buf.slice((slot, .., ..)),
        sems.at(slot),
    )
    .wait();
    counter.at(0).signal(1);
    let one = counter.at(0).read();
    counter.at(0).wait(1);
    scoped(|#[shape(r, c)] bottom: Vmem<T>, sem: DmaSemaphores| {
        let copy = make_async_copy(x.slice((i, r..2 * r, ..)), bottom, sem.at(()));
        copy.start();
        copy.wait();
        let top = buf.load((slot, .., ..));
        o.store((0, .., ..), top + bottom.load(..) + one.cast::<T>());
    });
}

/// [`double_buffered_rows`](mod@double_buffered_rows) in the library.
pub const DOUBLE_BUFFERED_ROWS: Entry = Entry {
    name: "double_buffered_rows",
    fixed_inputs: None,
    backward: None,
    about: "manual DMA in its smallest form: rows copied from HBM, double-buffered across steps, a scoped buffer, a regular semaphore",
    params: &[DTYPE],
    inputs: |_| Ok(vec![("x", vec![4, 16, 128])]),
    build: |c, s| {
        let [n, two_r, c2] = dims(&s[0], "x")?;
        if two_r % 2 != 0 {
            return Err(EntryError::Shape(format!(
                "x is [{n}, {two_r}, {c2}]: dim 1 holds two halves, so it must be even"
            )));
        }
        Ok(double_buffered_rows::build_for(
            c.dtype("dtype")?,
            double_buffered_rows::Dims { n, two_r, c: c2 },
        )?)
    },
    reference: |_, a| Ok(vec![reference(&a[0])]),
    check: no_check,
    tolerance: dtype_tolerance,
    sample: uniform_inputs,
    presets: &[Preset {
        name: "double_buffered_rows_f32",
        about: "manual DMA: f32 rows from HBM, double-buffered across 4 steps, with a scoped buffer and a regular semaphore",
        config: &[],
        shapes: &[],
    }],
};

/// `o[i] = x[i, :r] + x[i, r:] + 1`, in f64.
pub fn reference(x: &Array) -> Vec<f64> {
    let s = x.shape();
    let (n, r, c) = (s[0], s[1] / 2, s[2]);
    let d = x.data();
    let mut out = Vec::with_capacity(n * r * c);
    for i in 0..n {
        for j in 0..r * c {
            out.push(d[i * 2 * r * c + j] + d[i * 2 * r * c + r * c + j] + 1.0);
        }
    }
    out
}
