use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn parse_scale(
    text: &str,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let s: f32 = text.parse().ok()?;
    o.store(.., x.load(..) * s);
}

fn main() {}
