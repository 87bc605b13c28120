use kernel_ir::prelude::*;

// 8 rows is a whole f32 tile but half a bf16 one.
#[tpu_kernel(grid = (8,), semantics = (parallel,))]
fn copy(
    #[shape(64, 256)]
    #[block([8, 256], |i| (i, 0))]
    x: In<bf16>,
    #[shape(64, 256)]
    #[block([16, 256], |i| (i / 2, 0))]
    o: Out<bf16>,
) {
    o.store((0..8, ..), x.load(..));
}

fn main() {}
