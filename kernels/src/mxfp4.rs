//! MXFP4 weight-only matmul: `y = x · W` with 16-bit activations `x` and
//! weights in the OCP MX FP4 format, `float4_e2m1fn` values with one
//! `float8_e8m0fnu` scale per 32 values along `k` (`W[k, n] =
//! e2m1(w) · 2^(scale[k / 32, n] − 127)`), the format tpu-inference's fused
//! MoE and Triton's `tl.dot_scaled` take. The weights stay packed in HBM,
//! two per byte (`w: i8[k / 2, n]`, each group of 32 values along `k` in
//! the halves layout of [`kernel_ir::fp4`]: its first 16 in the low
//! nibbles of 16 bytes, the next 16 in the high), and dequantize in VMEM to
//! the activation type, exactly (an e2m1 value times a power of two is a
//! bf16); the MXU multiplies in it, accumulating in f32. libtpu multiplies
//! `float4_e2m1fn` operands natively only on v7x (a Pallas dot of them
//! compiles there and is refused on v5e, v5p and v6e:
//! `tests/conformance/fp4.py`), so dequantizing works on every generation;
//! a native v7x dot is a later fast path, which would need a 4-bit dtype in
//! the IR.
//!
//! ```
//! use kernels::mxfp4::mxfp4_matmul;
//! use kernel_ir::DType;
//! let dims = mxfp4_matmul::Dims { m: 128, k: 1024, n: 128 };
//! let k = mxfp4_matmul::build_for(DType::BF16, DType::BF16, 128, 128, 1024, dims).unwrap();
//! assert_eq!(k.arguments().count(), 3); // x, w, scale
//! ```

use kernel_ir::prelude::*;
use kernel_ir::{Array, SplitMix64, fp4};

use crate::entry::{
    DTYPE, Entry, EntryError, ParamKind, Preset, dims, matmul_tolerance, no_check, param,
};

/// Values per MX scale along `k`.
pub const GROUP: usize = 32;

/// `y = x · W` with MXFP4 `W` (see the module docs); `bk` is a multiple of
/// 32 dividing `k`.
#[tpu_kernel(
    grid = (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn mxfp4_matmul<T: Float, O: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k / 2, n)]
    #[block([bk / 2, bn], |_, j, l| (l, j))]
    w: In<i8>,
    #[shape(k / 32, n)]
    #[block([bk / 32, bn], |_, j, l| (l, j))]
    scale: In<i8>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    y: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let l = program_id(2);
    if l == 0 {
        acc.store(.., 0.0);
    }
    // Each group's 16 bytes hold its 32 codes: low nibbles, then high.
    let groups = bk / 32;
    let bytes = w.load(..).convert(I32).reshape([groups, 16, bn]);
    let codes = bytes.unpack_nibbles(1);
    let scales = scale.load(..).decode_e8m0().reshape([groups, 1, bn]);
    let weights = (codes.decode_e2m1() * scales).reshape([bk, bn]);
    acc.store(.., acc.load(..) + dot(x.load(..), weights.cast::<T>()));
    if l == num_programs(2) - 1 {
        y.store(.., acc.load(..).cast::<O>());
    }
}

/// The f64 reference from the format's definition: `x · W` with
/// `W[k, n] = e2m1(code) · 2^(scale − 127)`, the code of `W[k, n]` in the
/// low nibble of byte `16 · (k / 32) + k % 16` when `k % 32 < 16`, else its
/// high nibble.
pub fn reference(x: &Array, w: &Array, scale: &Array) -> Vec<f64> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = w.shape()[1];
    let weight = |kk: usize, j: usize| -> f64 {
        let byte = w.data()[(GROUP / 2 * (kk / GROUP) + kk % (GROUP / 2)) * n + j] as i8 as u8;
        let code = if kk % GROUP < GROUP / 2 {
            byte & 15
        } else {
            byte >> 4
        };
        let s = scale.data()[kk / GROUP * n + j] as i8 as u8;
        f64::from(fp4::e2m1_value(code)) * f64::from(fp4::e8m0_value(s))
    };
    let wd: Vec<f64> = (0..k * n).map(|i| weight(i / n, i % n)).collect();
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for kk in 0..k {
            let a = x.data()[r * k + kk];
            for j in 0..n {
                out[r * n + j] += a * wd[kk * n + j];
            }
        }
    }
    out
}

/// [`mxfp4_matmul`](mod@mxfp4_matmul) in the library.
pub const MXFP4_MATMUL: Entry = Entry {
    name: "mxfp4_matmul",
    fixed_inputs: None,
    backward: None,
    about: "MXFP4 weight-only matmul: bf16 activations, float4_e2m1fn weights packed two per byte with an e8m0 scale per 32 along k, dequantized in VMEM",
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
        param(
            "bk",
            ParamKind::Positive,
            "1024",
            "block depth along k (a multiple of 32 dividing k; at most 128 on GPUs)",
        ),
    ],
    inputs: |_| {
        Ok(vec![
            ("x", vec![128, 2048]),
            ("w", vec![1024, 256]),
            ("scale", vec![64, 256]),
        ])
    },
    build: |c, s| {
        let [m, k] = dims(&s[0], "x")?;
        let [half, n] = dims(&s[1], "w")?;
        let [groups, n2] = dims(&s[2], "scale")?;
        if k % GROUP != 0 || half * 2 != k || groups * GROUP != k || n2 != n {
            return Err(EntryError::Shape(format!(
                "x is [{m}, {k}], so k must be a multiple of {GROUP}, w [{}, n] (two values per byte) and scale [{}, n] (one per {GROUP}); got w {:?} and scale {:?}",
                k / 2,
                k / GROUP,
                s[1],
                s[2]
            )));
        }
        // A GPU program keeps its blocks in shared memory: at most 128
        // deep there (a [128, 1024] bf16 x block alone is 256 KiB).
        let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
        let bk = c.usize("bk")?.min(if gpu { 128 } else { k }).min(k);
        if bk % GROUP != 0 || k % bk != 0 {
            return Err(EntryError::Shape(format!(
                "bk = {bk} must be a multiple of {GROUP} that divides k = {k} (whole scale groups, no partial k block)"
            )));
        }
        Ok(mxfp4_matmul::build_for(
            c.dtype("dtype")?,
            c.dtype("out_dtype")?,
            c.usize("bm")?.min(m),
            c.usize("bn")?.min(n),
            bk,
            mxfp4_matmul::Dims { m, k, n },
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
                let shape = a.shape.to_vec();
                let n: usize = shape.iter().product();
                let mut rng = SplitMix64(s);
                let mut bytes = |f: &mut dyn FnMut(u64) -> u8| -> Vec<f64> {
                    (0..n).map(|_| f64::from(f(rng.next_u64()) as i8)).collect()
                };
                let data = match a.name {
                    // Every code of every nibble.
                    "w" => bytes(&mut |r| r as u8),
                    // Scales from 1/8 to 8, so sums stay near 1.
                    "scale" => bytes(&mut |r| 124 + (r % 7) as u8),
                    _ => return Array::random(a.dtype, shape, s, -1.0, 1.0),
                };
                Array::new(DType::I8, shape.clone(), data)
                    .unwrap_or_else(|_| Array::zeros(DType::I8, shape))
            })
            .collect()
    },
    presets: &[Preset {
        name: "mxfp4_matmul_bf16",
        about: "MXFP4 weight-only matmul, ragged m and n, one k block: x [100, 512], w [256, 200], scale [16, 200]",
        config: &[("dtype", "bf16")],
        shapes: &[
            ("x", &[100, 512]),
            ("w", &[256, 200]),
            ("scale", &[16, 200]),
        ],
    }],
};
