use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantic = (parallel,))]
fn copy(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
