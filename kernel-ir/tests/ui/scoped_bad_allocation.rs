use kernel_ir::prelude::*;

#[tpu_kernel(grid = (1,), semantics = (arbitrary,))]
fn k(
    #[any]
    #[shape(8, 128)]
    x: In<f32>,
    #[shape(8, 128)] o: Out<f32>,
) {
    scoped(|#[shape(8, 128)] tmp: Scratch<f32>| {
        o.store(.., tmp.load(..));
    });
    let _ = x;
}

fn main() {}
