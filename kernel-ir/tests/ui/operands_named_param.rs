use kernel_ir::prelude::*;

/// `x`, 8 rows per step.
#[operands]
struct Rows<T> {
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<T>,
}

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn copy(
    #[operands] rows: Rows<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
