//! Block-scaled FP8 GEMM, the recipe TorchTPU ships as a Pallas kernel
//! (`scaled_mm_1x128_128x128`): activations `a[m, k]` with one scale per
//! row per 128-wide k block (`scale_a[m, k/128]`), weights `b[k, n]` with
//! one scale per 128×128 tile (`scale_b[k/128, n/128]`). Each k block's
//! f32 partial product is scaled by its scales before it joins the f32
//! accumulator: `o[i, j] = Σ_kb (a[i, kb] · b[kb, j]) · scale_a[i, kb] ·
//! scale_b[kb, j/128]`.
//!
//! A grid step sees its rows' whole `scale_a` block (`[bm, k/128]`) and
//! the whole (small) `scale_b`, and picks its k block's scales by masking:
//! the TPU tiling rules allow a block of the full lane dim, not one column.
//!
//! ```
//! use kernels::scaled_mm::scaled_mm;
//! use kernel_ir::DType;
//! let dims = scaled_mm::Dims { m: 256, k: 512, n: 256, kb: 4, nb: 2 };
//! let k = scaled_mm::build_for(DType::F8E4M3FN, DType::BF16, 128, dims).unwrap();
//! assert_eq!(k.arguments().count(), 4); // a, scale_a, b, scale_b
//! ```

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{Config, Entry, EntryError, ParamKind, Preset, dims, no_check, param};
use crate::tolerance::Tolerance;
use kernel_ir::cdiv;

/// The scale block: 128 along k and n.
pub const SCALE_BLOCK: usize = 128;

/// `o = Σ_kb (a · b)_kb ⊙ scale_a ⊙ scale_b` (see the module docs).
#[tpu_kernel(
    grid = (cdiv(m, bm), n / SCALE_BLOCK, k / SCALE_BLOCK),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn scaled_mm<T: Fp8, O: Float>(
    bm: usize,
    #[shape(m, k)]
    #[block([bm, SCALE_BLOCK], |i, _, l| (i, l))]
    a: In<T>,
    #[shape(m, kb)]
    #[block([bm, kb], |i, _, _| (i, 0))]
    scale_a: In<f32>,
    #[shape(k, n)]
    #[block([SCALE_BLOCK, SCALE_BLOCK], |_, j, l| (l, j))]
    b: In<T>,
    #[shape(kb, nb)] scale_b: In<f32>,
    #[shape(m, n)]
    #[block([bm, SCALE_BLOCK], |i, j, _| (i, j))]
    o: Out<O>,
    #[shape(bm, SCALE_BLOCK)] acc: Scratch<f32>,
) {
    let (j, l) = (program_id(1), program_id(2));
    if l == 0 {
        acc.store(.., 0.0);
    }
    let part = dot(a.load(..), b.load(..));
    // This k block's scales: column l of the rows' scale_a, and scale_b[l, j].
    let sa = select(iota(I32, [bm, kb], 1) == l, scale_a.load(..), 0.0).sum_keep(1);
    let at_lj = (iota(I32, [kb, nb], 0) == l) && (iota(I32, [kb, nb], 1) == j);
    let sb = select(at_lj, scale_b.load(..), 0.0).sum_all();
    acc.store(.., acc.load(..) + part * sa * sb);
    if l == num_programs(2) - 1 {
        o.store(.., acc.load(..).cast::<O>());
    }
}

/// The f64 reference (inputs in the kernel's order).
pub fn reference(a: &Array, scale_a: &Array, b: &Array, scale_b: &Array) -> Vec<f64> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let (kb, nb) = (k / SCALE_BLOCK, n / SCALE_BLOCK);
    let (ad, bd, sa, sb) = (a.data(), b.data(), scale_a.data(), scale_b.data());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut total = 0.0;
            for blk in 0..kb {
                let part: f64 = (blk * SCALE_BLOCK..(blk + 1) * SCALE_BLOCK)
                    .map(|t| ad[i * k + t] * bd[t * n + j])
                    .sum();
                total += part * sa[i * kb + blk] * sb[blk * nb + j / SCALE_BLOCK];
            }
            out[i * n + j] = total;
        }
    }
    out
}

fn fp8_of(c: &Config) -> Result<DType, EntryError> {
    Ok(if c.choice("fp8")? == "e5m2" {
        DType::F8E5M2
    } else {
        DType::F8E4M3FN
    })
}

/// [`scaled_mm`](mod@scaled_mm) in the library.
pub const SCALED_MM: Entry = Entry {
    name: "scaled_mm",
    fixed_inputs: None,
    backward: None,
    about: "block-scaled FP8 GEMM (TorchTPU's scaled_mm_1x128_128x128): a scale per row per 128 k for a, per 128x128 tile for b, applied per k block in f32",
    params: &[
        param(
            "fp8",
            ParamKind::Choice(&["e4m3", "e5m2"]),
            "e4m3",
            "fp8 format of a and b: e4m3 (f8e4m3fn) or e5m2",
        ),
        param(
            "out_dtype",
            ParamKind::FloatDType,
            "bf16",
            "output element type: bf16 or f32",
        ),
        param("bm", ParamKind::Positive, "128", "block rows"),
    ],
    inputs: |_| {
        let (m, k, n) = (256, 512, 256);
        Ok(vec![
            ("a", vec![m, k]),
            ("scale_a", vec![m, k / SCALE_BLOCK]),
            ("b", vec![k, n]),
            ("scale_b", vec![k / SCALE_BLOCK, n / SCALE_BLOCK]),
        ])
    },
    build: |c, s| {
        let [m, k] = dims(&s[0], "a")?;
        let [k2, n] = dims(&s[2], "b")?;
        let (kb, nb) = (k / SCALE_BLOCK, n / SCALE_BLOCK);
        if k != k2 || k % SCALE_BLOCK != 0 || n % SCALE_BLOCK != 0 {
            return Err(EntryError::Shape(format!(
                "a is [{m}, {k}] and b [{k2}, {n}]: the inner dims must agree and k and n be multiples of {SCALE_BLOCK}"
            )));
        }
        if s[1] != [m, kb] || s[3] != [kb, nb] {
            return Err(EntryError::Shape(format!(
                "scale_a must be [{m}, {kb}] and scale_b [{kb}, {nb}] (one per 128 along k and n), got {:?} and {:?}",
                s[1], s[3]
            )));
        }
        Ok(scaled_mm::build_for(
            fp8_of(c)?,
            c.dtype("out_dtype")?,
            c.usize("bm")?.min(m),
            scaled_mm::Dims { m, k, n, kb, nb },
        )?)
    },
    reference: |_, a| Ok(vec![reference(&a[0], &a[1], &a[2], &a[3])]),
    check: no_check,
    tolerance: |c, k| {
        let depth = k.arguments().next().map_or(1, |a| a.shape[1]);
        vec![Tolerance::matmul(
            depth,
            c.dtype("out_dtype").unwrap_or(DType::F32),
        )]
    },
    sample: |_, k, seed| {
        k.arguments()
            .enumerate()
            .map(|(i, a)| {
                let s = seed + i as u64;
                if a.name.starts_with("scale") {
                    Array::random(DType::F32, a.shape.to_vec(), s, 0.002, 0.01)
                } else {
                    Array::random(a.dtype, a.shape.to_vec(), s, -8.0, 8.0)
                }
            })
            .collect()
    },
    presets: &[Preset {
        name: "scaled_mm_1x128_128x128",
        about: "block-scaled FP8 GEMM (e4m3): 1x128 activation scales, 128x128 weight scales, bf16 out",
        config: &[],
        shapes: &[],
    }],
};
