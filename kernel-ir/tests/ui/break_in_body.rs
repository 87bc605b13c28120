use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn sum4(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut acc = x.load(..);
    for i in 0..4 {
        if i == 2 {
            break;
        }
        acc = acc + 1.0;
    }
    o.store(.., acc);
}

fn main() {}
