//! The four foundation kernels in the interpreter against f64 references.

use kernel_ir::prelude::*;
use kernel_ir::{InterpOptions, interpret_with};
use kernels::check::{ErrorStats, Tolerance};
use kernels::foundation::*;
use kernels::norm::{NormConfig, layer_norm};
use kernels::reference;
use proptest::prelude::*;

fn assert_close(out: &Array, want: &[f64], tol: Tolerance) {
    let s = ErrorStats::between(out, want, tol);
    assert!(s.passes(), "{s}");
}

fn run_add(c: &AddConfig, seed: u64) -> Result<(), TestCaseError> {
    let k = add(c).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let x = Array::random(c.dtype, [c.rows, c.cols], seed, -4.0, 4.0);
    let y = Array::random(c.dtype, [c.rows, c.cols], seed + 1, -4.0, 4.0);
    let out =
        interpret(&k, &[x.clone(), y.clone()]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let s = ErrorStats::between(
        &out[0],
        &reference::add(&x, &y),
        Tolerance::for_dtype(c.dtype),
    );
    prop_assert!(s.passes(), "{s}");
    Ok(())
}

#[test]
fn add_matches_reference() {
    let c = AddConfig {
        rows: 64,
        cols: 256,
        block_rows: 16,
        block_cols: 128,
        dtype: F32,
    };
    run_add(&c, 1).unwrap();
}

#[test]
fn add_handles_partial_last_blocks() {
    // 40 x 200 with 16 x 128 bf16 blocks: the last row block and column
    // block are partial; their padding is computed and dropped.
    let c = AddConfig {
        rows: 40,
        cols: 200,
        block_rows: 16,
        block_cols: 128,
        dtype: BF16,
    };
    run_add(&c, 2).unwrap();
}

fn run_matmul(c: &MatmulConfig, seed: u64, shuffle: Option<u64>) -> Result<(), TestCaseError> {
    let k = matmul(c).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let x = Array::random(c.dtype, [c.m, c.k], seed, -1.0, 1.0);
    let y = Array::random(c.dtype, [c.k, c.n], seed + 1, -1.0, 1.0);
    let opts = InterpOptions {
        shuffle_seed: shuffle,
        ..InterpOptions::default()
    };
    let out = interpret_with(&k, &[x.clone(), y.clone()], &opts)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    // f32 accumulation over k terms of size ≤ 1: allow k roundoffs.
    let tol = Tolerance {
        abs: 1e-6 * c.k as f64,
        rel: 1e-5,
    };
    let tol = if c.out_dtype == F32 {
        tol
    } else {
        Tolerance::for_dtype(c.out_dtype)
    };
    let s = ErrorStats::between(&out[0], &reference::matmul(&x, &y), tol);
    prop_assert!(s.passes(), "{s}");
    Ok(())
}

#[test]
fn matmul_accumulates_over_arbitrary_k() {
    let c = MatmulConfig {
        m: 64,
        n: 256,
        k: 384,
        bm: 32,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    };
    run_matmul(&c, 3, None).unwrap();
    run_matmul(&c, 3, Some(99)).unwrap();
}

#[test]
fn matmul_masks_a_ragged_k_tail() {
    let c = MatmulConfig {
        m: 16,
        n: 128,
        k: 200,
        bm: 16,
        bn: 128,
        bk: 128,
        dtype: BF16,
        out_dtype: F32,
    };
    run_matmul(&c, 4, None).unwrap();
}

#[test]
fn softmax_matches_reference() {
    for dtype in [F32, BF16] {
        let c = SoftmaxConfig {
            rows: 48,
            cols: 384,
            block_rows: 16,
            dtype,
        };
        let k = softmax(&c).unwrap();
        let x = Array::random(dtype, [c.rows, c.cols], 5, -6.0, 6.0);
        let out = interpret(&k, std::slice::from_ref(&x)).unwrap();
        assert_close(
            &out[0],
            &reference::softmax_rows(&x),
            Tolerance::for_dtype(dtype),
        );
    }
}

#[test]
fn layer_norm_matches_reference() {
    let c = NormConfig {
        rows: 40,
        cols: 256,
        block_rows: 8,
        eps: 1e-5,
        dtype: F32,
    };
    let k = layer_norm(&c).unwrap();
    let x = Array::random(F32, [c.rows, c.cols], 6, -3.0, 5.0);
    let g = Array::random(F32, [c.cols], 7, 0.5, 1.5);
    let b = Array::random(F32, [c.cols], 8, -1.0, 1.0);
    let out = interpret(&k, &[x.clone(), g.clone(), b.clone()]).unwrap();
    let want = reference::layer_norm(&x, &g, &b, c.eps as f64);
    assert_close(
        &out[0],
        &want,
        Tolerance {
            abs: 2e-5,
            rel: 2e-5,
        },
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn add_over_random_legal_shapes(
        rb in 1usize..4, cb in 1usize..3, extra_r in 0usize..8, extra_c in 0usize..128,
        seed in any::<u64>(), bf in any::<bool>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let rows_tile = 8 * dtype.packing();
        let c = AddConfig {
            rows: rb * rows_tile + extra_r,
            cols: cb * 128 + extra_c,
            block_rows: rows_tile,
            block_cols: 128,
            dtype,
        };
        run_add(&c, seed)?;
    }

    #[test]
    fn matmul_over_random_legal_shapes(
        mb in 1usize..3, nb in 1usize..3, kb in 1usize..4, seed in any::<u64>(),
        shuffle in proptest::option::of(any::<u64>()),
    ) {
        let c = MatmulConfig {
            m: mb * 8, n: nb * 128, k: kb * 128, bm: 8, bn: 128, bk: 128,
            dtype: F32, out_dtype: F32,
        };
        run_matmul(&c, seed, shuffle)?;
    }
}
