use kernel_ir::prelude::*;

/// A group whose block has the wrong rank: the error points here, at the
/// group's field, not at the kernel that takes it.
#[operands]
struct Rows<T> {
    #[shape(m, 128)]
    #[block([8], |i| (i, 0))]
    x: In<T>,
}

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn copy(
    #[operands] _: Rows<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., x.load(..));
}

fn main() {}
