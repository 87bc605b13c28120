//! `slice` and `concat` of tiles (bool tiles too) on every path against
//! references written from the definitions (`x[a:b]` along an axis,
//! `jnp.concatenate`), at aligned and unaligned offsets on both axes;
//! libtpu compiles them for every generation.

use kernel_ir::prelude::*;
use kernel_ir::{VerifiedKernel, constant};
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

const ROWS: usize = 16;
const COLS: usize = 128;

/// A `[rows, cols]` row-major matrix as a function of `(r, c)`.
struct Mat<'a> {
    d: &'a [f64],
    cols: usize,
}

impl Mat<'_> {
    fn at(&self, r: usize, c: usize) -> f64 {
        self.d[r * self.cols + c]
    }
}

/// `f(r, c)` over a `[rows, cols]` result, row-major.
fn each(rows: usize, cols: usize, f: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    (0..rows * cols).map(|i| f(i / cols, i % cols)).collect()
}

/// A kernel whose outputs are slices and concatenations of `x` and `y`.
fn slices_and_concats(dtype: DType) -> Result<VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("slices_and_concats");
    k.grid([1], [Parallel]);
    let x = k
        .input("x", dtype, [ROWS, COLS])
        .block([ROWS, COLS], |[_]| (0, 0));
    let y = k
        .input("y", dtype, [ROWS, COLS])
        .block([ROWS, COLS], |[_]| (0, 0));
    let shapes: [[usize; 2]; 6] = [
        [8, COLS],
        [ROWS, 64],
        [ROWS, COLS],
        [ROWS, 2 * COLS],
        [ROWS, COLS],
        [ROWS, COLS],
    ];
    let o: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, &s)| k.output(format!("o{i}"), dtype, s).block(s, |[_]| (0, 0)))
        .collect();
    let (xv, yv) = (x.load(..), y.load(..));
    let one = if dtype.is_float() {
        constant(1.0, dtype, [ROWS, COLS])
    } else {
        constant(1, dtype, [ROWS, COLS])
    };
    // Unaligned starts on both axes.
    o[0].store(.., xv.slice(0, 3..11));
    o[1].store(.., xv.slice(1, 5..69));
    // The rows' halves swapped (aligned), and two tiles side by side.
    o[2].store(.., concat([xv.slice(0, 8..), xv.slice(0, ..8)], 0));
    o[3].store(.., xv.concat(yv, 1));
    // A join inside a vector: the last 3 rows of y over x's first 13, and
    // 7 lanes of y before x's first 121.
    o[4].store(.., concat([yv.slice(0, 13..), xv.slice(0, ..13)], 0));
    let mask = concat([yv.ge(one).slice(1, 121..), xv.ge(one).slice(1, ..121)], 1);
    o[5].store(.., select(mask, xv, yv));
    k.build()
}

fn wants(x: &[f64], y: &[f64]) -> Vec<Vec<f64>> {
    let (x, y) = (Mat { d: x, cols: COLS }, Mat { d: y, cols: COLS });
    let before = |m: &Mat, r: usize, c: usize| {
        if c < 7 {
            m.at(r, COLS - 7 + c) >= 1.0
        } else {
            false
        }
    };
    vec![
        each(8, COLS, |r, c| x.at(r + 3, c)),
        each(ROWS, 64, |r, c| x.at(r, c + 5)),
        each(ROWS, COLS, |r, c| x.at((r + 8) % ROWS, c)),
        each(ROWS, 2 * COLS, |r, c| {
            if c < COLS {
                x.at(r, c)
            } else {
                y.at(r, c - COLS)
            }
        }),
        each(ROWS, COLS, |r, c| {
            if r < 3 {
                y.at(r + 13, c)
            } else {
                x.at(r - 3, c)
            }
        }),
        each(ROWS, COLS, |r, c| {
            let m = if c < 7 {
                before(&y, r, c)
            } else {
                x.at(r, c - 7) >= 1.0
            };
            if m { x.at(r, c) } else { y.at(r, c) }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn slices_and_concats_match_their_definitions_on_every_path(
        seed in any::<u64>(),
        which in 0usize..3,
    ) {
        let dtype = [F32, BF16, I32][which];
        let x = Array::random(dtype, [ROWS, COLS], seed, -2.0, 3.0);
        let y = Array::random(dtype, [ROWS, COLS], seed ^ 0x9e37, -2.0, 3.0);
        let want = wants(x.data(), y.data());
        // Only moves: exact.
        let tols = [Tolerance { abs: 0.0, rel: 0.0 }; 6];
        all_paths(slices_and_concats(dtype), &[x, y], want, &tols)?;
    }
}

#[test]
fn slice_and_concat_print_parse_and_check_their_bounds() {
    let kernel = slices_and_concats(F32).unwrap();
    let text = kernel.to_string();
    assert!(text.contains("axis 0, start 3, len 8"), "{text}");
    assert!(text.contains("concat %"), "{text}");
    let back = kernel_ir::parse(&text).unwrap();
    assert_eq!(back.to_string(), text);
    for (from, to, says) in [
        (
            "axis 0, start 3, len 8",
            "axis 0, start 10, len 8",
            "elements 10..18 of an axis of 16",
        ),
        (
            "axis 0, start 3, len 8",
            "axis 2, start 3, len 8",
            "axis 2 of a rank-2 tile",
        ),
    ] {
        let err = match kernel_ir::parse(&text.replacen(from, to, 1)) {
            Err(e) => e.to_string(),
            Ok(k) => k.verify().map(|_| ()).unwrap_err().to_string(),
        };
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn a_bad_slice_or_concat_is_an_error_at_the_callers_line() {
    let mut k = KernelBuilder::new("bad");
    k.grid([1], [Parallel]);
    let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
    let o = k.output("o", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
    let xv = x.load(..);
    let empty = xv.slice(0, 4..4);
    let line = line!() - 1;
    let joined = xv.concat(xv.slice(1, ..64).convert(BF16), 0);
    o.store(.., xv + empty.broadcast_to([8, 128]) + joined.slice(0, ..8));
    let err = k.build().unwrap_err().to_string();
    assert!(err.contains(&format!("slice.rs:{line}")), "{err}");
    assert!(err.contains("a slice keeps 1 to 8 elements"), "{err}");
    assert!(err.contains("do not join along axis 0"), "{err}");
}

#[test]
fn slices_and_concats_compile_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    for dtype in [F32, BF16] {
        let kernel = slices_and_concats(dtype).unwrap();
        for t in kernel_ir::Target::ALL {
            if let Err(e) = tpu.compile_kernel(&kernel, t) {
                panic!("{dtype} on {t}: {e}");
            }
        }
    }
}
