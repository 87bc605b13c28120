use kernel_ir::prelude::*;

#[tpu_kernel(grid = (1,), semantics = (arbitrary,))]
fn k(
    #[any]
    #[shape(8, 128)]
    x: In<f32>,
    #[shape(8, 128)] o: Out<f32>,
) {
    scoped(|tmp: Vmem<f32>, sem: DmaSemaphores| {
        let c = make_async_copy(x, tmp, sem.at(()));
        c.start();
        c.wait();
        o.store(.., tmp.load(..));
    });
}

fn main() {}
