//! The JIT's dot register tile is tuned per CPU (`lowering::HostTuning`),
//! so whichever tile a search keeps must compute the same products: every
//! candidate tile of every register file (AVX-512, AVX2, NEON; a tile for
//! another file still compiles here, only slower) is checked against an
//! f64 reference on shapes that leave tails: rows that no tile height
//! divides, columns narrower than a wide tile, a transposed rhs, bf16
//! operands. Tiles of more than 8 rows read their lhs packed into row
//! panels, the rest in place: both ways are checked.

use kernel_ir::{Array, DType, VerifiedKernel};
use lowering::{DotTiling, DotTilings, HostKernel, VectorRegisters};

/// Every candidate tile of the three register files, once each.
fn every_candidate() -> Vec<DotTiling> {
    let files = [
        VectorRegisters {
            bytes: 64,
            count: 32,
            isa: "avx512",
        },
        VectorRegisters {
            bytes: 32,
            count: 16,
            isa: "avx2",
        },
        VectorRegisters {
            bytes: 16,
            count: 32,
            isa: "neon",
        },
    ];
    let mut out: Vec<DotTiling> = Vec::new();
    for r in files {
        for t in DotTiling::candidates(r) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

/// `o = x · y` (or `x · yᵀ` with `y` given as `[n, k]`), one grid step.
fn product(m: usize, k: usize, n: usize, dtype: DType, transposed: bool) -> VerifiedKernel {
    let d = dtype.to_string();
    let (ys, rhs) = if transposed {
        (
            format!("[{n}, {k}]"),
            format!(
                "%t = load @y[0:{n}, 0:{k}] : {d}[{n}, {k}]\n  %1 = transpose %t, perm [1, 0] : {d}[{n}, {k}] -> {d}[{k}, {n}]"
            ),
        )
    } else {
        (
            format!("[{k}, {n}]"),
            format!("%1 = load @y[0:{k}, 0:{n}] : {d}[{k}, {n}]"),
        )
    };
    let text = format!(
        "kernel @tile_check {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: {d}[{m}, {k}] vmem block [{m}, {k}] at (g0, 0) row_major
  in @y: {d}{ys} vmem block {ys} at (g0, 0) row_major
  out @o: f32[{m}, {n}] vmem block [{m}, {n}] at (g0, 0) row_major
body:
  %0 = load @x[0:{m}, 0:{k}] : {d}[{m}, {k}]
  {rhs}
  %2 = dot_general %0, %1, batch []x[], contract [1]x[0] : {d}[{m}, {k}], {d}[{k}, {n}] -> f32[{m}, {n}]
  store @o[0:{m}, 0:{n}], %2 : f32[{m}, {n}]
}}"
    );
    let text = text.replace("%t", "%3");
    kernel_ir::parse(&text)
        .unwrap_or_else(|e| panic!("{e:?}\n{text}"))
        .verify_without_mosaic_rules()
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn every_candidate_tile_computes_the_same_products() {
    // (m, k, n, dtype, transposed): 45 rows leave a tail under every tile
    // height; 48 columns are narrower than a 64-lane tile and not a
    // multiple of 32; 32 × 64 with a transposed rhs takes the in-register
    // transpose packing.
    let cases = [
        (45, 40, 48, DType::F32, false),
        (29, 32, 64, DType::F32, true),
        (19, 24, 40, DType::BF16, false),
    ];
    let tiles = every_candidate();
    assert!(tiles.len() >= 12, "{tiles:?}");
    for (case, &(m, k, n, dtype, transposed)) in cases.iter().enumerate() {
        let kernel = product(m, k, n, dtype, transposed);
        let x = Array::random(dtype, [m, k], 100 + case as u64, -1.0, 1.0);
        let ys = if transposed { [n, k] } else { [k, n] };
        let y = Array::random(dtype, ys, 200 + case as u64, -1.0, 1.0);
        let at = |a: &Array, r: usize, c: usize| a.data()[r * a.shape()[1] + c];
        let reference: Vec<f64> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k)
                    .map(|l| {
                        let yv = if transposed {
                            at(&y, j, l)
                        } else {
                            at(&y, l, j)
                        };
                        at(&x, i, l) * yv
                    })
                    .sum()
            })
            .collect();
        let scale = reference.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        for &t in &tiles {
            let native = HostKernel::compile_tiled(&kernel, DotTilings::uniform(t))
                .unwrap_or_else(|e| panic!("tile {t}, case {case}: {e}"));
            let out = native.run(&[x.clone(), y.clone()]).unwrap();
            let got = out[0].data();
            let nan = got.iter().filter(|v| v.is_nan()).count();
            let max_abs = got
                .iter()
                .zip(&reference)
                .map(|(g, r)| (g - r).abs())
                .fold(0.0f64, f64::max);
            // f32 accumulation over k ≤ 40 products of |x| ≤ 1.
            assert!(
                nan == 0 && max_abs <= 1e-5 * scale.max(1.0),
                "tile {t}, case {case} ({m}x{k}x{n} {dtype}{}): {nan} NaN, max abs error {max_abs:e} (relative {:e})",
                if transposed { ", rhs transposed" } else { "" },
                max_abs / scale
            );
        }
    }
}
