use kernel_ir::prelude::*;

#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn relu(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
    mode: u8,
) {
    let v = x.load(..);
    let y = match mode {
        0 => v.max(0.0),
        _ => v,
    };
    o.store(.., y);
}

fn main() {}
