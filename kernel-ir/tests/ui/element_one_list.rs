use kernel_ir::prelude::*;

#[tpu_kernel(grid = (2,), semantics = (parallel,))]
fn halo(
    #[shape(16, 128)]
    #[block([16, 128], |i| (i * 8, 0))]
    #[element([8, 0])]
    x: In<f32>,
    #[shape(16, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load((8..16, ..)));
}

fn main() {}
