use kernel_ir::prelude::*;

#[tpu_kernel(grid = (16,), semantics = (parallel,))]
fn copy(
    #[shape(64, 128)]
    #[block([4, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(64, 128)]
    #[block([4, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
