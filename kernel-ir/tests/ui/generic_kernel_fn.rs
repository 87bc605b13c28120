use kernel_ir::prelude::*;

#[kernel_fn]
fn scale<const N: usize>(t: Tile) -> Tile {
    t * N as f32
}

fn main() {}
