use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn halve(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut v = x.load(..);
    let mut n = 0;
    while n < 4 {
        v = v * 0.5;
        n += 1;
    }
    o.store(.., v);
}

fn main() {}
