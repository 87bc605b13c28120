//! Int8 weight-only matmul (w8a16): `o = (x · w) ⊙ scale`, with 16-bit
//! activations `x`, int8 weights `w` and one f32 scale per output channel
//! (`scale: [1, n]`). The weights dequantize to the activation type in
//! VMEM (exact: every int8 is a bf16) and the MXU multiplies in it,
//! accumulating in f32; the scale multiplies the accumulator once, in the
//! epilogue (it is constant along k).
//!
//! ```
//! use kernels::w8a16::w8a16_matmul;
//! use kernel_ir::DType;
//! let dims = w8a16_matmul::Dims { m: 128, k: 256, n: 128 };
//! let k = w8a16_matmul::build_for(DType::BF16, DType::BF16, 128, 128, 128, dims).unwrap();
//! assert_eq!(k.arguments().count(), 3); // x, w, scale
//! ```

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{
    DTYPE, Entry, EntryError, ParamKind, Preset, dims, matmul_tolerance, no_check, param,
};
use crate::foundation::k_block_operands;

/// `o = (x · w) ⊙ scale` with int8 `w` (see the module docs).
#[tpu_kernel(
    grid = (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn w8a16_matmul<T: Float, O: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    w: In<i8>,
    #[shape(1, n)]
    #[block([1, bn], |_, j, _| (0, j))]
    scale: In<f32>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    o: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let l = program_id(2);
    if l == 0 {
        acc.store(.., 0.0);
    }
    let (xv, wv) = k_block_operands(k, bk, x, w);
    acc.store(.., acc.load(..) + dot(xv, wv.cast::<T>()));
    if l == num_programs(2) - 1 {
        o.store(.., (acc.load(..) * scale.load(..)).cast::<O>());
    }
}

/// The f64 reference: `(x · w) ⊙ scale`.
pub fn reference(x: &Array, w: &Array, scale: &Array) -> Vec<f64> {
    let n = w.shape()[1];
    crate::reference::matmul(x, w)
        .into_iter()
        .enumerate()
        .map(|(i, v)| v * scale.data()[i % n])
        .collect()
}

/// [`w8a16_matmul`](mod@w8a16_matmul) in the library.
pub const W8A16_MATMUL: Entry = Entry {
    name: "w8a16_matmul",
    fixed_inputs: None,
    backward: None,
    about: "int8 weight-only matmul (w8a16): bf16 activations, int8 weights dequantized in VMEM, per-channel f32 scales",
    params: &[
        DTYPE,
        param(
            "out_dtype",
            ParamKind::FloatDType,
            "bf16",
            "output element type",
        ),
        param("bm", ParamKind::Positive, "128", "block rows"),
        param("bn", ParamKind::Positive, "128", "block columns"),
        param("bk", ParamKind::Positive, "128", "block depth along k"),
    ],
    inputs: |_| {
        Ok(vec![
            ("x", vec![128, 384]),
            ("w", vec![384, 256]),
            ("scale", vec![1, 256]),
        ])
    },
    build: |c, s| {
        let [m, k] = dims(&s[0], "x")?;
        let [k2, n] = dims(&s[1], "w")?;
        if k != k2 {
            return Err(EntryError::Shape(format!(
                "x is [{m}, {k}] but w is [{k2}, {n}]: the inner dims differ"
            )));
        }
        Ok(w8a16_matmul::build_for(
            c.dtype("dtype")?,
            c.dtype("out_dtype")?,
            c.usize("bm")?.min(m),
            c.usize("bn")?.min(n),
            c.usize("bk")?.min(k),
            w8a16_matmul::Dims { m, k, n },
        )?)
    },
    reference: |_, a| Ok(vec![reference(&a[0], &a[1], &a[2])]),
    check: no_check,
    tolerance: matmul_tolerance,
    sample: |_, k, seed| {
        k.arguments()
            .enumerate()
            .map(|(i, a)| {
                let s = seed + i as u64;
                match a.name {
                    // Quantized weights use the whole int8 range.
                    "w" => Array::random(DType::I8, a.shape.to_vec(), s, -127.0, 127.0),
                    // ... and scales that bring them back to ~0.05.
                    "scale" => Array::random(DType::F32, a.shape.to_vec(), s, 2e-4, 5e-4),
                    _ => Array::random(a.dtype, a.shape.to_vec(), s, -1.0, 1.0),
                }
            })
            .collect()
    },
    presets: &[Preset {
        name: "w8a16_matmul_bf16",
        about: "int8 weight-only matmul: bf16 activations, int8 weights with per-channel scales, ragged k = 320",
        config: &[("dtype", "bf16")],
        shapes: &[("x", &[128, 320]), ("w", &[320, 256])],
    }],
};
