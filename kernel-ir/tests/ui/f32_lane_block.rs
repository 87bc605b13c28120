use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8, 4), semantics = (parallel, parallel))]
fn copy(
    #[shape(m, 256)]
    #[block([8, 64], |i, j| (i, j))]
    x: In<f32>,
    #[shape(m, 256)]
    #[block([8, 128], |i, j| (i, j / 2))]
    o: Out<f32>,
) {
    o.store((.., 0..64), x.load(..));
}

fn main() {}
