use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn maybe_add(
    with_y: bool,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[present(with_y)]
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    y: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..) + y.load(..));
}

fn main() {}
