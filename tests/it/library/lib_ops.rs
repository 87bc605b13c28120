//! The fused ops of the library on every CPU path against f64 references:
//! RMS norm (forward, backward), layer norm backward, matmul with a fused
//! epilogue, RoPE, SwiGLU. Shapes include ragged tails and the smallest
//! legal tiles; the norm gradients are checked against finite differences.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::epilogue::{Activation, EpilogueConfig, matmul_epilogue};
use kernels::norm::{NormConfig, layer_norm_bwd, rms_norm, rms_norm_bwd};
use kernels::reference;
use kernels::swiglu::{SwigluConfig, swiglu};
use proptest::prelude::*;

use crate::common::all_paths;

fn dtype(bf: bool) -> DType {
    if bf { BF16 } else { F32 }
}

fn grad_tol(d: DType, terms: usize) -> Tolerance {
    Tolerance::sum_grad(d, terms)
}

/// Row/column sizes: a multiple of the native tile plus a ragged tail.
fn norm_case(bf: bool, rb: usize, extra: usize, cols: usize) -> NormConfig {
    let d = dtype(bf);
    let tile = 8 * d.packing();
    NormConfig {
        rows: rb * tile + extra,
        cols,
        block_rows: tile,
        eps: 1e-5,
        dtype: d,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn rms_norm_forward_and_backward_on_every_path(
        bf in any::<bool>(), rb in 1usize..3, extra in 0usize..8,
        cols in prop::sample::select(vec![128usize, 256]), seed in any::<u64>(),
    ) {
        let c = norm_case(bf, rb, extra, cols);
        let x = Array::random(c.dtype, [c.rows, cols], seed, -2.0, 2.0);
        let g = Array::random(F32, [cols], seed + 1, 0.5, 1.5);
        let dy = Array::random(c.dtype, [c.rows, cols], seed + 2, -1.0, 1.0);
        let want = reference::rms_norm(&x, &g, 1e-5);
        all_paths(rms_norm(&c), &[x.clone(), g.clone()], vec![want], &[Tolerance::for_dtype(c.dtype)])?;
        let (dx, dg) = reference::rms_norm_bwd(&x, &g, &dy, 1e-5);
        all_paths(
            rms_norm_bwd(&c),
            &[x, g, dy],
            vec![dx, dg],
            &[grad_tol(c.dtype, 1), grad_tol(c.dtype, c.rows)],
        )?;
    }

    #[test]
    fn layer_norm_backward_on_every_path(
        bf in any::<bool>(), rb in 1usize..3, extra in 0usize..8, seed in any::<u64>(),
    ) {
        let c = norm_case(bf, rb, extra, 128);
        let x = Array::random(c.dtype, [c.rows, 128], seed, -2.0, 3.0);
        let g = Array::random(F32, [128], seed + 1, 0.5, 1.5);
        let dy = Array::random(c.dtype, [c.rows, 128], seed + 2, -1.0, 1.0);
        let (dx, dg, db) = reference::layer_norm_bwd(&x, &g, &dy, 1e-5);
        all_paths(
            layer_norm_bwd(&c),
            &[x, g, dy],
            vec![dx, dg, db],
            &[grad_tol(c.dtype, 1), grad_tol(c.dtype, c.rows), grad_tol(c.dtype, c.rows)],
        )?;
    }

    #[test]
    fn matmul_with_a_fused_epilogue_on_every_path(
        bf in any::<bool>(), mb in 1usize..3, nb in 1usize..3, k_extra in prop::sample::select(vec![0usize, 40]),
        act in prop::sample::select(vec![Activation::Identity, Activation::Gelu, Activation::Silu]),
        residual in any::<bool>(), seed in any::<u64>(),
    ) {
        let d = dtype(bf);
        let bm = 8 * d.packing();
        let c = EpilogueConfig {
            m: mb * bm, n: nb * 128, k: 128 + k_extra, bm, bn: 128, bk: 128,
            activation: act, residual, dtype: d, out_dtype: F32,
        };
        let x = Array::random(d, [c.m, c.k], seed, -1.0, 1.0);
        let w = Array::random(d, [c.k, c.n], seed + 1, -0.2, 0.2);
        let bias = Array::random(F32, [1, c.n], seed + 2, -1.0, 1.0);
        let r = Array::random(F32, [c.m, c.n], seed + 3, -1.0, 1.0);
        let name = match act { Activation::Gelu => "gelu", Activation::Silu => "silu", Activation::Identity => "" };
        let want = reference::matmul_epilogue(&x, &w, &bias, name, residual.then_some(&r));
        let mut args = vec![x, w, bias];
        if residual {
            args.push(r);
        }
        let tol = Tolerance::matmul(c.k, F32);
        all_paths(matmul_epilogue(&c), &args, vec![want], &[tol])?;
    }

    #[test]
    fn rope_on_every_path(
        bf in any::<bool>(), h in 1usize..3, sb in 1usize..3, extra in 0usize..8,
        d in prop::sample::select(vec![64usize, 128]), seed in any::<u64>(),
    ) {
        let dt = dtype(bf);
        let bs = 8 * dt.packing();
        let s = sb * bs + extra;
        let x = Array::random(dt, [1, h, s, d], seed, -1.0, 1.0);
        let (cos, sin) = kernels::rope::rope_tables(s, d, 10000.0);
        let want = reference::rope(&x, &cos, &sin);
        let dims = kernels::rope::rope::Dims { b: 1, h, s, d, half: d / 2 };
        all_paths(kernels::rope::rope::build_for(dt, bs, dims), &[x, cos, sin], vec![want], &[Tolerance::for_dtype(dt)])?;
    }

    #[test]
    fn swiglu_on_every_path(
        bf in any::<bool>(), mb in 1usize..3, m_extra in 0usize..5, k_extra in prop::sample::select(vec![0usize, 24]),
        seed in any::<u64>(),
    ) {
        let d = dtype(bf);
        let bm = 8 * d.packing();
        let c = SwigluConfig { m: mb * bm + m_extra, n: 128, k: 128 + k_extra, bm, bn: 128, bk: 128, dtype: d };
        let x = Array::random(d, [c.m, c.k], seed, -1.0, 1.0);
        let wg = Array::random(d, [c.k, c.n], seed + 1, -0.2, 0.2);
        let wu = Array::random(d, [c.k, c.n], seed + 2, -0.2, 0.2);
        let want = reference::swiglu(&x, &wg, &wu);
        let tol = Tolerance::matmul(c.k, d);
        all_paths(swiglu(&c), &[x, wg, wu], vec![want], &[tol])?;
    }
}

/// Central differences of `f` at each element of `x` (f32 values, steps
/// of 2⁻¹² that stay exact).
fn numeric_grad(x: &Array, f: impl Fn(&Array) -> f64) -> Vec<f64> {
    let h = 1.0 / 4096.0;
    (0..x.len())
        .map(|i| {
            let mut up = x.data().to_vec();
            let mut down = up.clone();
            up[i] += h;
            down[i] -= h;
            let a = Array::new(F32, x.shape().to_vec(), up).unwrap();
            let b = Array::new(F32, x.shape().to_vec(), down).unwrap();
            (f(&a) - f(&b)) / (2.0 * h)
        })
        .collect()
}

fn close(what: &str, numeric: &[f64], analytic: &[f64]) {
    for (i, (n, a)) in numeric.iter().zip(analytic).enumerate() {
        assert!(
            (n - a).abs() <= 1e-6 + 1e-5 * n.abs(),
            "{what} element {i}: finite difference {n}, analytic {a}"
        );
    }
}

#[test]
fn norm_reference_gradients_match_finite_differences() {
    let x = Array::random(F32, [3, 8], 1, -2.0, 2.0);
    let g = Array::random(F32, [8], 2, 0.5, 1.5);
    let b = Array::random(F32, [8], 3, -1.0, 1.0);
    let dy = Array::random(F32, [3, 8], 4, -1.0, 1.0);
    let dot = |y: Vec<f64>| -> f64 { y.iter().zip(dy.data()).map(|(a, b)| a * b).sum() };
    let (dx, dg) = reference::rms_norm_bwd(&x, &g, &dy, 1e-5);
    close(
        "rms dx",
        &numeric_grad(&x, |x| dot(reference::rms_norm(x, &g, 1e-5))),
        &dx,
    );
    close(
        "rms dgamma",
        &numeric_grad(&g, |g| dot(reference::rms_norm(&x, g, 1e-5))),
        &dg,
    );
    let (dx, dg, db) = reference::layer_norm_bwd(&x, &g, &dy, 1e-5);
    close(
        "ln dx",
        &numeric_grad(&x, |x| dot(reference::layer_norm(x, &g, &b, 1e-5))),
        &dx,
    );
    close(
        "ln dgamma",
        &numeric_grad(&g, |g| dot(reference::layer_norm(&x, g, &b, 1e-5))),
        &dg,
    );
    close(
        "ln dbeta",
        &numeric_grad(&b, |b| dot(reference::layer_norm(&x, &g, b, 1e-5))),
        &db,
    );
}
