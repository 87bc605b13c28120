use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn maybe_add(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    y: Option<In<f32>>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut v = x.load(..);
    if let Some(y) = y {
        v = v + y.load(..);
    }
    o.store(.., v);
}

fn main() {}
