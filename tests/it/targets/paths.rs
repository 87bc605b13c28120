//! Every kernel on every CPU path (interpreter, native JIT, decomposed
//! StableHLO on PJRT, the FFI custom call on PJRT) against the f64
//! reference, on fresh random inputs.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};
use kernels::check::Tolerance;
use kernels::foundation::*;
use kernels::norm::{NormConfig, layer_norm};
use kernels::reference;
use proptest::prelude::*;

use crate::language::builder_kernels;

/// Fails unless every backend ran and matched (one output).
fn all_paths(
    kernel: Result<VerifiedKernel, KernelErrors>,
    args: &[Array],
    want: Vec<f64>,
    tol: Tolerance,
) -> Result<(), TestCaseError> {
    crate::common::all_paths(kernel, args, vec![want], &[tol])
}

fn matmul_tol(k: usize, out: DType) -> Tolerance {
    if out == F32 {
        Tolerance {
            abs: 1e-6 * k as f64,
            rel: 1e-5,
        }
    } else {
        Tolerance::for_dtype(out)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn add_on_every_path(
        rb in 1usize..3, cb in 1usize..3, extra_r in 0usize..8, extra_c in 0usize..128,
        bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let rows_tile = 8 * dtype.packing();
        let c = AddConfig {
            rows: rb * rows_tile + extra_r, cols: cb * 128 + extra_c,
            block_rows: rows_tile, block_cols: 128, dtype,
        };
        let x = Array::random(dtype, [c.rows, c.cols], seed, -4.0, 4.0);
        let y = Array::random(dtype, [c.rows, c.cols], seed + 1, -4.0, 4.0);
        let want = reference::add(&x, &y);
        all_paths(add(&c), &[x, y], want, Tolerance::for_dtype(dtype))?;
    }

    #[test]
    fn matmul_on_every_path(
        mb in 1usize..3, nb in 1usize..3, kb in 1usize..3, k_tail in prop::sample::select(vec![0usize, 72]),
        bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let bm = 8 * dtype.packing();
        let c = MatmulConfig {
            m: mb * bm, n: nb * 128, k: kb * 128 + k_tail, bm, bn: 128, bk: 128,
            dtype, out_dtype: F32,
        };
        let x = Array::random(dtype, [c.m, c.k], seed, -1.0, 1.0);
        let y = Array::random(dtype, [c.k, c.n], seed + 1, -1.0, 1.0);
        let want = reference::matmul(&x, &y);
        all_paths(matmul(&c), &[x, y], want, matmul_tol(c.k, c.out_dtype))?;
    }

    #[test]
    fn softmax_on_every_path(
        rb in 1usize..4, cb in 1usize..4, bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let block_rows = 8 * dtype.packing();
        let c = SoftmaxConfig { rows: rb * block_rows, cols: cb * 128, block_rows, dtype };
        let x = Array::random(dtype, [c.rows, c.cols], seed, -6.0, 6.0);
        let want = reference::softmax_rows(&x);
        all_paths(softmax(&c), &[x], want, Tolerance::for_dtype(dtype))?;
    }

    #[test]
    fn layer_norm_on_every_path(
        rb in 1usize..4, extra in 0usize..8, cb in 1usize..3, bf in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let tile = 8 * dtype.packing();
        let c = NormConfig { rows: rb * tile + extra, cols: cb * 128, block_rows: tile, eps: 1e-5, dtype };
        let x = Array::random(dtype, [c.rows, c.cols], seed, -3.0, 5.0);
        let g = Array::random(F32, [c.cols], seed + 1, 0.5, 1.5);
        let b = Array::random(F32, [c.cols], seed + 2, -1.0, 1.0);
        let want = reference::layer_norm(&x, &g, &b, c.eps as f64);
        let tol = if bf { Tolerance::for_dtype(BF16) } else { Tolerance { abs: 2e-5, rel: 2e-5 } };
        all_paths(layer_norm(&c), &[x, g, b], want, tol)?;
    }
}

#[test]
fn builder_foundation_kernels_on_every_path() {
    let x = Array::random(F32, [40, 200], 11, -4.0, 4.0);
    let y = Array::random(F32, [40, 200], 12, -4.0, 4.0);
    let c = AddConfig {
        rows: 40,
        cols: 200,
        block_rows: 8,
        block_cols: 128,
        dtype: F32,
    };
    let want = reference::add(&x, &y);
    all_paths(
        builder_kernels::add(&c),
        &[x, y],
        want,
        Tolerance::for_dtype(F32),
    )
    .unwrap();

    let c = MatmulConfig {
        m: 16,
        n: 256,
        k: 200,
        bm: 16,
        bn: 128,
        bk: 128,
        dtype: BF16,
        out_dtype: F32,
    };
    let x = Array::random(BF16, [c.m, c.k], 13, -1.0, 1.0);
    let y = Array::random(BF16, [c.k, c.n], 14, -1.0, 1.0);
    let want = reference::matmul(&x, &y);
    all_paths(
        builder_kernels::matmul(&c),
        &[x, y],
        want,
        matmul_tol(c.k, F32),
    )
    .unwrap();

    let c = SoftmaxConfig {
        rows: 48,
        cols: 384,
        block_rows: 16,
        dtype: BF16,
    };
    let x = Array::random(BF16, [c.rows, c.cols], 15, -6.0, 6.0);
    let want = reference::softmax_rows(&x);
    all_paths(
        builder_kernels::softmax(&c),
        &[x],
        want,
        Tolerance::for_dtype(BF16),
    )
    .unwrap();

    let c = NormConfig {
        rows: 40,
        cols: 256,
        block_rows: 8,
        eps: 1e-5,
        dtype: F32,
    };
    let x = Array::random(F32, [c.rows, c.cols], 16, -3.0, 5.0);
    let g = Array::random(F32, [c.cols], 17, 0.5, 1.5);
    let b = Array::random(F32, [c.cols], 18, -1.0, 1.0);
    let want = reference::layer_norm(&x, &g, &b, c.eps as f64);
    all_paths(
        builder_kernels::layer_norm(&c),
        &[x, g, b],
        want,
        Tolerance {
            abs: 2e-5,
            rel: 2e-5,
        },
    )
    .unwrap();
}
