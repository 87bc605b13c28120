use kernel_ir::prelude::*;

// A kernel loop can carry tiles only; a Rust counter cannot change per
// iteration of a loop that runs on the device.
#[tpu_kernel(grid = (m / 8,), semantics = (parallel,))]
fn count(
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    x: In<f32>,
    #[shape(m, 128)]
    #[block([8, 128], |i| (i, 0))]
    o: Out<f32>,
) {
    let mut n = 0usize;
    let mut v = x.load(..);
    for _ in 0..4 {
        v = v + 1.0;
        n += 1;
    }
    o.store(.., v * n as f32);
}

fn main() {}
