//! Prefix sums in a tile (`Tile::cumsum`, on the matrix unit) on every
//! path against f64 running sums, and a scan across sequential grid steps
//! with its carry in scratch; libtpu compiles both.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

/// Running sums of `data` (row-major `[rows, cols]`) along `axis`.
fn running(data: &[f64], rows: usize, cols: usize, axis: usize, exclusive: bool) -> Vec<f64> {
    let mut out = vec![0.0; rows * cols];
    let (outer, inner) = if axis == 1 {
        (rows, cols)
    } else {
        (cols, rows)
    };
    for o in 0..outer {
        let mut acc = 0.0;
        for i in 0..inner {
            let at = if axis == 1 {
                o * cols + i
            } else {
                i * cols + o
            };
            if exclusive {
                out[at] = acc;
                acc += data[at];
            } else {
                acc += data[at];
                out[at] = acc;
            }
        }
    }
    out
}

/// A kernel whose outputs are `x`'s inclusive and exclusive prefix sums
/// along rows and its inclusive prefix sum down columns.
fn scans(
    dtype: DType,
    rows: usize,
    cols: usize,
) -> Result<kernel_ir::VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("scans");
    k.grid([1], [Parallel]);
    let x = k
        .input("x", dtype, [rows, cols])
        .block([rows, cols], |[_]| (0, 0));
    let outs: Vec<_> = ["rows", "rows_exclusive", "cols"]
        .iter()
        .map(|n| {
            k.output(*n, dtype, [rows, cols])
                .block([rows, cols], |[_]| (0, 0))
        })
        .collect();
    let xv = x.load(..);
    outs[0].store(.., xv.cumsum(1));
    outs[1].store(.., xv.cumsum_exclusive(1));
    outs[2].store(.., xv.cumsum(0));
    k.build()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn cumsum_matches_running_sums_on_every_path(seed in any::<u64>(), which in 0usize..2) {
        // (i32 sums need an i32 dot, which TPUs lack: the verifier refuses it.)
        let dtype = [F32, BF16][which];
        let (rows, cols) = (16usize, 128usize);
        let x = Array::random(dtype, [rows, cols], seed, -1.0, 1.0);
        let d = x.data().to_vec();
        let want = vec![
            running(&d, rows, cols, 1, false),
            running(&d, rows, cols, 1, true),
            running(&d, rows, cols, 0, false),
        ];
        // Sums of up to 128 terms of size 1, rounded once to the dtype.
        let tol = match dtype {
            F32 => Tolerance { abs: 1e-4, rel: 1e-5 },
            _ => Tolerance { abs: 0.06, rel: 1e-2 },
        };
        all_paths(scans(dtype, rows, cols), &[x], want, &[tol])?;
    }

    #[test]
    fn a_scan_carries_its_total_across_sequential_grid_steps(seed in any::<u64>()) {
        // Row prefix sums of a [8, 512] array in four 128-column steps:
        // each block's own cumsum plus the carry, then the carry grows by
        // the block's total.
        let (rows, cols, bn) = (8usize, 512usize, 128usize);
        let mut k = KernelBuilder::new("carried_scan");
        k.grid([cols / bn], [Arbitrary]);
        let x = k.input("x", F32, [rows, cols]).block([rows, bn], |[j]| (0, j));
        let o = k.output("o", F32, [rows, cols]).block([rows, bn], |[j]| (0, j));
        let carry = k.scratch("carry", F32, [rows, 1]);
        when(program_id(0).eq(0), || carry.store(.., 0.0));
        let xv = x.load(..);
        let before = carry.load(..);
        o.store(.., xv.cumsum(1) + before);
        carry.store(.., before + xv.sum_keep(1));
        let x = Array::random(F32, [rows, cols], seed, -1.0, 1.0);
        let want = vec![running(x.data(), rows, cols, 1, false)];
        all_paths(k.build(), &[x], want, &[Tolerance { abs: 2e-4, rel: 1e-5 }])?;
    }
}

#[test]
fn cumsum_compiles_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    for dtype in [F32, BF16] {
        let kernel = scans(dtype, 16, 128).unwrap();
        for t in kernel_ir::Target::ALL {
            if let Err(e) = tpu.compile_kernel(&kernel, t) {
                panic!("{dtype} on {t}: {e}");
            }
        }
    }
}
