use kernel_ir::prelude::*;

#[tpu_kernel(grid = (4,), semantics = (parallel,))]
fn copy(
    #[block([8, 128], |i| (i, 0))] x: In<f32>,
    #[shape(32, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
