//! The bitonic sort (`Tile::sort`, `argsort`, `sort_by_key`) on every path
//! against Rust's stable sort (NaN after every number) on data full of
//! ties, infinities and NaN, along both axes; libtpu compiles it for every
//! generation; a non-power-of-two axis is an error that says to pad.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};
use kernels::check::Tolerance;
use proptest::prelude::*;

use super::top_k::values;
use crate::common::all_paths;

const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };
// The CPU paths' sizes: a 64-wide network has 21 stages (128: 28), and
// the TPU check below sorts full (16, 128) tiles.
const ROWS: usize = 8;
const COLS: usize = 64;
/// What a NaN is stored as (a number the data never holds).
const NAN_MARK: f64 = 4096.0;

fn mark(v: f64) -> f64 {
    if v.is_nan() { NAN_MARK } else { v }
}

/// The indices of `line` in sorted order: ascending, NaN last, ties by
/// index (`sort_by` is stable).
fn order(line: &[f64]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..line.len()).collect();
    idx.sort_by(|&a, &b| match (line[a].is_nan(), line[b].is_nan()) {
        (false, false) => line[a].partial_cmp(&line[b]).unwrap(),
        (x, y) => x.cmp(&y),
    });
    idx
}

/// Outputs: each row sorted, each row's argsort, each column sorted, and
/// `-x` carried along the row sort as a payload.
fn sorts(dtype: DType, rows: usize, cols: usize) -> Result<VerifiedKernel, KernelErrors> {
    let mut k = KernelBuilder::new("sorts");
    k.grid([1], [Parallel]);
    let x = k
        .input("x", dtype, [rows, cols])
        .block([rows, cols], |[_]| (0, 0));
    let out = |k: &mut KernelBuilder, name: &str, d: DType| {
        k.output(name, d, [rows, cols])
            .block([rows, cols], |[_]| (0, 0))
    };
    let rows_out = out(&mut k, "rows", dtype);
    let args = out(&mut k, "args", I32);
    let cols_out = out(&mut k, "cols", dtype);
    let carried = out(&mut k, "carried", dtype);
    let xv = x.load(..);
    // NaN never passes a check: sorted NaNs come out as a marker.
    let marked = |t: Tile| {
        if dtype.is_float() {
            select(t.ne(t), NAN_MARK, t)
        } else {
            t
        }
    };
    // The keys with `-x` carried along; `argsort`'s indices are the ones
    // its own network carries.
    let (sorted, moved) = sort_by_key(xv, &[-xv], 1);
    rows_out.store(.., marked(sorted));
    args.store(.., xv.argsort(1));
    carried.store(.., marked(moved[0]));
    cols_out.store(.., marked(xv.sort(0)));
    k.build()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, ..ProptestConfig::default() })]

    #[test]
    fn sorts_are_stable_with_nan_last_on_every_path(seed in any::<u64>(), which in 0usize..3) {
        let dtype = [F32, BF16, I32][which];
        let data: Vec<f64> = values(seed, ROWS * COLS, dtype.is_float())
            .into_iter()
            .map(|v| if dtype.is_float() { v } else { (v * 2.0).clamp(-1e9, 1e9) })
            .collect();
        let at = |r: usize, c: usize| data[r * COLS + c];
        let (mut rows, mut args, mut carried) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..ROWS {
            let line: Vec<f64> = (0..COLS).map(|c| at(r, c)).collect();
            for i in order(&line) {
                rows.push(mark(line[i]));
                args.push(i as f64);
                carried.push(mark(-line[i]));
            }
        }
        let mut cols = vec![0.0; ROWS * COLS];
        for c in 0..COLS {
            let line: Vec<f64> = (0..ROWS).map(|r| at(r, c)).collect();
            for (r, i) in order(&line).into_iter().enumerate() {
                cols[r * COLS + c] = mark(line[i]);
            }
        }
        let x = Array::new(dtype, [ROWS, COLS], data).unwrap();
        all_paths(sorts(dtype, ROWS, COLS), &[x], vec![rows, args, cols, carried], &[EXACT])?;
    }
}

#[test]
fn a_sort_along_a_non_power_of_two_axis_says_to_pad() {
    let mut k = KernelBuilder::new("sort_12");
    k.grid([1], [Parallel]);
    let x = k.input("x", F32, [12, 128]).block([12, 128], |[_]| (0, 0));
    let o = k.output("o", F32, [12, 128]).block([12, 128], |[_]| (0, 0));
    o.store(.., x.load(..).sort(0));
    let err = k.build().unwrap_err().to_string();
    assert!(err.contains("sort.rs"), "names the caller's line: {err}");
    assert!(err.contains("axis 0 has 12 elements"), "{err}");
    assert!(err.contains("pad it"), "{err}");
}

#[test]
fn sorts_compile_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    for dtype in [F32, BF16] {
        let kernel = sorts(dtype, 16, 128).unwrap();
        for t in kernel_ir::Target::ALL {
            if let Err(e) = tpu.compile_kernel(&kernel, t) {
                panic!("{dtype} on {t}: {e}");
            }
        }
    }
}
