//! Rotary position embedding (RoPE), "rotate half" form: with
//! `x = [x₁, x₂]` split along the head dim,
//! `rope(x) = [x₁·cos − x₂·sin, x₂·cos + x₁·sin]`, where `cos` and `sin`
//! are `[seq, head_dim / 2]` tables (f32) the caller computes once.

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;

use crate::entry::{
    DTYPE, Entry, ParamKind, Preset, dtype_tolerance, no_check, param, refs, uniform_inputs,
};
#[cfg(feature = "graph")]
use crate::recording::backward_error;
use crate::reference;
#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor, VjpCall};

/// RoPE over `x: [b, h, s, d]` (`d` even), `block_s` positions per step.
#[tpu_kernel(grid = (b, h, kernel_ir::cdiv(s, block_s)), semantics = (parallel, parallel, parallel))]
pub fn rope<T: Float>(
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

/// [`rope`](mod@rope) in the library.
pub const ROPE: Entry = Entry {
    name: "rope",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let dims = rope::Dims::from_shapes(&refs(s))?;
        let block_s = c.usize("block_s")?.min(dims.s);
        Ok(Arc::new(move |call: &VjpCall<'_>| {
            rope_backward(block_s, call)
        }))
    }),
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
        Ok(rope::build_for(
            c.dtype("dtype")?,
            c.usize("block_s")?.min(dims.s),
            dims,
        )?)
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
        name: "rope_bf16",
        about: "rotary position embedding, bf16[1, 4, 200, 128], 32 positions per step",
        config: &[("dtype", "bf16")],
        shapes: &[],
    }],
};

/// The backward of `rope`: a rotation's transpose is the rotation by the
/// opposite angle, so `dx = rope(g, cos, −sin)` (the kernel itself); the
/// tables' gradients, summed over batch and heads, are
/// `dcos = g₁x₁ + g₂x₂` and `dsin = g₂x₁ − g₁x₂` (tensor ops).
#[cfg(feature = "graph")]
fn rope_backward(block_s: usize, call: &VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let (x, cos, sin) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
    let g = call.cotangent(0)?;
    let neg_sin = sin.neg()?;
    let dims = rope::Dims::from_shapes(&[g.shape(), cos.shape(), neg_sin.shape()])
        .map_err(|e| backward_error("rope", e.into()))?;
    let kernel =
        rope::build_for(g.dtype(), block_s, dims).map_err(|e| backward_error("rope", e.into()))?;
    let dx = x.runtime().call(&kernel, &[&g, cos, &neg_sin])?.remove(0);
    let [b, h, s, d] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let half = d / 2;
    let part = |t: &Tensor, lo: usize| -> Result<Tensor, RuntimeError> {
        t.slice(&[0, 0, 0, lo], &[b, h, s, lo + half])?
            .cast(DType::F32)
    };
    let (x1, x2, g1, g2) = (part(x, 0)?, part(x, half)?, part(&g, 0)?, part(&g, half)?);
    let dcos = g1.mul(&x1)?.add(&g2.mul(&x2)?)?.sum(&[0, 1])?;
    let dsin = g2.mul(&x1)?.sub(&g1.mul(&x2)?)?.sum(&[0, 1])?;
    Ok(vec![Some(dx), Some(dcos), Some(dsin)])
}
