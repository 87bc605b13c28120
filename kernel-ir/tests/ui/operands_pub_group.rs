use kernel_ir::prelude::*;

/// A `pub` group: groups serve the kernels of their own crate.
#[operands]
pub struct Rows<T> {
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<T>,
}

fn main() {}
