//! `roll` and `shift` of a tile (bool tiles too), and the scans built on them (`scan`,
//! `scan_exclusive`, `cumprod`, `cummax`), on every path against
//! references written from the definitions (`jnp.roll`'s direction, running
//! products in f64), in floats and integers; libtpu compiles them for every
//! generation.

use kernel_ir::prelude::*;
use kernel_ir::{ReduceOp, VerifiedKernel, constant};
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

const ROWS: usize = 16;
const COLS: usize = 128;

/// Reads `[ROWS, COLS]` row-major data at `(r, c)`.
fn at(d: &[f64], r: usize, c: usize) -> f64 {
    d[r * COLS + c]
}

/// `f(r, c)` over the whole block, row-major.
fn each(f: impl Fn(usize, usize) -> f64) -> Vec<f64> {
    (0..ROWS * COLS).map(|i| f(i / COLS, i % COLS)).collect()
}

/// `jnp.roll(d, shift, axis)`: element `i` comes from `(i - shift) mod n`.
fn rolled(d: &[f64], shift: i64, axis: usize) -> Vec<f64> {
    each(|r, c| {
        let n = [ROWS, COLS][axis] as i64;
        let from = |i: usize| (i as i64 - shift).rem_euclid(n) as usize;
        if axis == 0 {
            at(d, from(r), c)
        } else {
            at(d, r, from(c))
        }
    })
}

/// Elements moved `by` places along `axis`, `fill` where none arrives.
fn shifted(d: &[f64], by: i64, axis: usize, fill: f64) -> Vec<f64> {
    each(|r, c| {
        let i = [r, c][axis] as i64 - by;
        if i < 0 || i >= [ROWS, COLS][axis] as i64 {
            fill
        } else if axis == 0 {
            at(d, i as usize, c)
        } else {
            at(d, r, i as usize)
        }
    })
}

/// Inclusive running `op` along `axis`, left to right in f64.
fn running(d: &[f64], axis: usize, op: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    each(|r, c| {
        let (line, upto) = if axis == 0 { (c, r) } else { (r, c) };
        let term = |i: usize| {
            if axis == 0 {
                at(d, i, line)
            } else {
                at(d, line, i)
            }
        };
        (1..=upto).fold(term(0), |acc, i| op(acc, term(i)))
    })
}

/// A kernel whose outputs are rolls, shifts and scans of `x`.
fn rolls_and_scans(dtype: DType) -> Result<VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("rolls_and_scans");
    k.grid([1], [Parallel]);
    let x = k
        .input("x", dtype, [ROWS, COLS])
        .block([ROWS, COLS], |[_]| (0, 0));
    let o: Vec<_> = (0..9)
        .map(|i| {
            k.output(format!("o{i}"), dtype, [ROWS, COLS])
                .block([ROWS, COLS], |[_]| (0, 0))
        })
        .collect();
    let xv = x.load(..);
    // Literals of the tile's kind: an f64 is no i32 constant.
    let number = |v: f64| {
        if dtype.is_float() {
            constant(v, dtype, [ROWS, COLS])
        } else {
            constant(v as i64, dtype, [ROWS, COLS])
        }
    };
    let lowest = number(ReduceOp::Max.identity(dtype));
    o[0].store(.., xv.roll(3, 1));
    o[1].store(.., xv.roll(-5, 0));
    o[2].store(.., xv.shift(2, 1, number(1.0)));
    o[3].store(.., xv.shift(-1, 0, number(1.0)));
    o[4].store(.., xv.cumprod(1));
    o[5].store(.., xv.cummax(0));
    o[6].store(.., xv.scan_exclusive(1, lowest, |a, b| a.max(b)));
    // Not commutative: every element becomes the first of its row, which
    // only holds if the earlier partial result comes first.
    o[7].store(.., xv.scan(1, |earlier, _later| earlier));
    // A bool tile rolls too (Triton gathers it as bytes).
    let big = xv.ge(number(1.0)).roll(5, 1);
    o[8].store(.., select(big, xv.roll(5, 1), number(0.0)));
    k.build()
}

fn wants(d: &[f64], dtype: DType) -> Vec<Vec<f64>> {
    let lowest = ReduceOp::Max.identity(dtype);
    let exclusive_max = each(|r, c| (0..c).fold(lowest, |m, i| m.max(at(d, r, i))));
    vec![
        rolled(d, 3, 1),
        rolled(d, -5, 0),
        shifted(d, 2, 1, 1.0),
        shifted(d, -1, 0, 1.0),
        running(d, 1, |a, b| a * b),
        running(d, 0, f64::max),
        exclusive_max,
        each(|r, _| at(d, r, 0)),
        rolled(d, 5, 1)
            .into_iter()
            .map(|v| if v >= 1.0 { v } else { 0.0 })
            .collect(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn rolls_shifts_and_scans_match_their_definitions_on_every_path(
        seed in any::<u64>(),
        which in 0usize..3,
    ) {
        let dtype = [F32, BF16, I32][which];
        // Products of 128 terms near 1 stay in range; integers are -1, 0, 1.
        let x = match dtype {
            I32 => Array::random(I32, [ROWS, COLS], seed, -1.0, 2.0),
            _ => Array::random(dtype, [ROWS, COLS], seed, 0.5, 1.5),
        };
        let want = wants(x.data(), dtype);
        // Rolls, shifts and maxima move values: exact. The products differ
        // from a left-to-right loop by their tree order (f32: ~n·ε); bf16
        // multiplies in f32 and rounds once (≤ 2⁻⁸).
        let exact = Tolerance { abs: 0.0, rel: 0.0 };
        let product = match dtype {
            F32 => Tolerance { abs: 1e-30, rel: 2e-5 },
            BF16 => Tolerance { abs: 1e-30, rel: 5e-3 },
            _ => exact,
        };
        let tols = [exact, exact, exact, exact, product, exact, exact, exact, exact];
        all_paths(rolls_and_scans(dtype), &[x], want, &tols)?;
    }
}

#[test]
fn a_roll_prints_parses_and_checks_its_shift_and_axis() {
    let kernel = rolls_and_scans(F32).unwrap();
    let text = kernel.to_string();
    assert!(text.contains("roll %"), "{text}");
    assert!(text.contains("shift 3, axis 1"), "{text}");
    // -5 mod 16 along the rows.
    assert!(text.contains("shift 11, axis 0"), "{text}");
    let back = kernel_ir::parse(&text).unwrap();
    assert_eq!(back.to_string(), text);
    for (from, to, says) in [
        (
            "shift 3, axis 1",
            "shift 3, axis 2",
            "axis 2 of a rank-2 tile",
        ),
        (
            "shift 3, axis 1",
            "shift 128, axis 1",
            "shift 128 is not below the axis size 128",
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
fn rolls_and_scans_compile_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    for dtype in [F32, BF16] {
        let kernel = rolls_and_scans(dtype).unwrap();
        for t in kernel_ir::Target::ALL {
            if let Err(e) = tpu.compile_kernel(&kernel, t) {
                panic!("{dtype} on {t}: {e}");
            }
        }
    }
}
