use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8, 2), semantics = (parallel, parallel))]
fn copy(
    #[shape(m, 256)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 256)]
    #[block([8, 128], |i, j| (i, j))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
