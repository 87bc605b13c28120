use kernel_ir::prelude::*;

#[tpu_kernel(grid = (1,), semantics = (parallel,))]
fn copy(
    #[shape(8, 128)]
    #[block([16, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(8, 128)] o: Out<f32>,
) {
    o.store(.., x.load((0..8, ..)));
}

fn main() {}
