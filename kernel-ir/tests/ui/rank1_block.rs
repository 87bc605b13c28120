use kernel_ir::prelude::*;

#[tpu_kernel(grid = (10,), semantics = (parallel,))]
fn copy(
    #[shape(1000)]
    #[block([100], |i| i)]
    x: In<f32>,
    #[shape(1000)]
    #[block([1000], |_| 0)]
    o: Out<f32>,
) {
    o.store(.., x.load(..).broadcast_to([1000]));
}

fn main() {}
