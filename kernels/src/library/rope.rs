//! Rotary position embedding (RoPE), "rotate half" form: with
//! `x = [x₁, x₂]` split along the head dim,
//! `rope(x) = [x₁·cos − x₂·sin, x₂·cos + x₁·sin]`, where `cos` and `sin`
//! are `[seq, head_dim / 2]` tables (f32) the caller computes once.

use kernel_ir::prelude::*;
use kernel_ir::{Element, KernelErrors, VerifiedKernel};

use crate::foundation::with_float;
use crate::library::entry::{
    DTYPE, Entry, ParamKind, Preset, dtype_tolerance, no_check, param, refs, uniform_inputs,
};
use crate::library::reference;

/// RoPE over `x: [b, h, s, d]` (`d` even), `block_s` positions per step.
#[tpu_kernel(grid = (b, h, crate::foundation::cdiv(s, block_s)), semantics = (parallel, parallel, parallel))]
pub fn rope<T: Element>(
    block_s: usize,
    #[shape(b, h, s, d)]
    #[block([1, 1, block_s, d], |bi, hi, i| (bi, hi, i, 0))]
    x: In<T>,
    #[shape(s, half)]
    #[block([block_s, half], |_, _, i| (i, 0))]
    cos: In<f32>,
    #[shape(s, half)]
    #[block([block_s, half], |_, _, i| (i, 0))]
    sin: In<f32>,
    #[shape(b, h, s, d)]
    #[block([1, 1, block_s, d], |bi, hi, i| (bi, hi, i, 0))]
    o: Out<T>,
) {
    let x1 = x.load((0, 0, .., 0..half)).convert(F32);
    let x2 = x.load((0, 0, .., half..d)).convert(F32);
    let (c, sn) = (cos.load(..), sin.load(..));
    o.store((0, 0, .., 0..half), (x1 * c - x2 * sn).cast::<T>());
    o.store((0, 0, .., half..d), (x2 * c + x1 * sn).cast::<T>());
}

/// The [`rope`](mod@rope) kernel for a dtype; `dims.half` is `d / 2`.
pub fn rope(
    block_s: usize,
    dtype: DType,
    dims: rope::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    with_float!("rope", dtype, T => rope::build::<T>(block_s, dims))
}

/// The `[seq, d / 2]` cos and sin tables for `base` (10000 in most
/// models): angle `p · base^(−2i/d)` at position `p`, pair `i`.
pub fn rope_tables(seq: usize, d: usize, base: f64) -> (kernel_ir::Array, kernel_ir::Array) {
    let half = d / 2;
    let mut c = Vec::with_capacity(seq * half);
    let mut s = Vec::with_capacity(seq * half);
    for p in 0..seq {
        for i in 0..half {
            let angle = p as f64 * base.powf(-2.0 * i as f64 / d as f64);
            c.push(angle.cos());
            s.push(angle.sin());
        }
    }
    let mk = |v| {
        kernel_ir::Array::new(DType::F32, [seq, half], v)
            .unwrap_or_else(|_| kernel_ir::Array::zeros(DType::F32, [seq, half]))
    };
    (mk(c), mk(s))
}

/// [`rope()`] in the library.
pub const ROPE: Entry = Entry {
    name: "rope",
    about: "rotary position embedding with [s, d/2] cos and sin tables",
    params: &[
        DTYPE,
        param("block_s", ParamKind::Positive, "32", "positions per block"),
    ],
    inputs: |_| {
        Ok(vec![
            ("x", vec![1, 4, 200, 128]),
            ("cos", vec![200, 64]),
            ("sin", vec![200, 64]),
        ])
    },
    build: |c, s| {
        let dims = rope::Dims::from_shapes(&refs(s))?;
        Ok(rope(c.usize("block_s")?.min(dims.s), c.dtype("dtype")?, dims)?)
    },
    reference: |_, a| Ok(vec![reference::rope(&a[0], &a[1], &a[2])]),
    check: no_check,
    tolerance: dtype_tolerance,
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        let (s, d) = (v[0].shape()[2], v[0].shape()[3]);
        let (cos, sin) = rope_tables(s, d, 10000.0);
        if v[1].shape() == cos.shape() {
            (v[1], v[2]) = (cos, sin);
        }
        v
    },
    presets: &[Preset {
        name: "rope",
        about: "rotary position embedding, bf16[1, 4, 200, 128], 32 positions per step",
        config: &[("dtype", "bf16")],
        shapes: &[],
    }],
};
