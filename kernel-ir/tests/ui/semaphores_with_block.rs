use kernel_ir::prelude::*;

#[tpu_kernel(grid = (1,), semantics = (arbitrary,))]
fn k(
    #[shape(8, 128)] o: Out<f32>,
    #[shape(2)]
    #[block([1], |i| (i,))]
    sems: DmaSemaphores,
) {
    o.store(.., 0.0);
    let _ = sems;
}

fn main() {}
