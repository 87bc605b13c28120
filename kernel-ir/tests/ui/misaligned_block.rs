use kernel_ir::prelude::*;

// i8 blocks of 128 lanes start every 128 bytes, not every 256.
#[tpu_kernel(grid = (4,), semantics = (parallel,))]
fn copy(
    #[shape(32, 512)]
    #[block([32, 128], |j| (0, j))]
    #[align(256)]
    x: In<i8>,
    #[shape(32, 512)]
    #[block([32, 128], |j| (0, j))]
    o: Out<i8>,
) {
    o.store(.., x.load(..));
}

fn main() {}
