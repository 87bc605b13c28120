use kernel_ir::prelude::*;

fn gelu(t: Tile) -> Tile {
    t * (t * 1.702).logistic()
}

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn act(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    o.store(.., gelu(x.load(..)));
}

fn main() {}
