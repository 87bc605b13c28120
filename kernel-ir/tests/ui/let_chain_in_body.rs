use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn maybe_scale(
    factor: Option<f32>,
    double: bool,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut v = x.load(..);
    if let Some(f) = factor
        && double
    {
        v = v * f * 2.0;
    }
    o.store(.., v);
}

fn main() {}
