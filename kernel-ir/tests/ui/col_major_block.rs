use kernel_ir::prelude::*;

// Column-major makes dim 0 the lane dim: 64 is not a multiple of 128.
#[tpu_kernel(grid = (4,), semantics = (parallel,))]
fn transpose_in(
    #[shape(256, 64)]
    #[block([64, 64], |i| (i, 0))]
    #[col_major]
    k: In<f32>,
    #[shape(256, 64)]
    #[block([64, 64], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., k.load(..));
}

fn main() {}
