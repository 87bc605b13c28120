use kernel_ir::prelude::*;

// Two double-buffered 16 MiB windows: 64 MiB, over the 32 MiB default.
#[tpu_kernel(grid = (2, 2), semantics = (parallel, parallel))]
fn big_copy(
    #[shape(4096, 4096)]
    #[block([2048, 2048], |i, j| (i, j))]
    x: In<f32>,
    #[shape(4096, 4096)]
    #[block([2048, 2048], |i, j| (i, j))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
