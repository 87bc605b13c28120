//! Normalization: RMS norm and layer norm, forward and backward.
//!
//! Rows are normalized over their last dim, one block of whole rows per
//! grid step, in f32 whatever the storage dtype. The backward kernels
//! recompute the row statistics from `x` instead of saving them (a few
//! flops against a round trip through memory), and reduce the parameter
//! gradients over the whole array: their grid is `arbitrary`, accumulating
//! in scratch and writing `[1, cols]` at the last step. The padding rows of
//! a ragged last block are masked out of those sums.

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, Shapes, dims, dtype_tolerance, no_check,
    param, uniform_inputs,
};
#[cfg(feature = "graph")]
use crate::recording::{backward_error, build_error};
use crate::reference;
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};

/// The config parameters of the norm kernels.
pub(crate) const NORM_PARAMS: &[crate::Param] = &[
    DTYPE,
    param("block_rows", ParamKind::Positive, "8", "rows per block"),
    param(
        "eps",
        ParamKind::Number,
        "1e-5",
        "added to the mean square or variance",
    ),
];

/// Gammas near 1 and betas near 0, as trained norms have; the rest
/// uniform.
pub(crate) fn norm_inputs(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    for (a, arg) in v.iter_mut().zip(k.arguments()) {
        match arg.name {
            "gamma" => *a = Array::random(arg.dtype, arg.shape.to_vec(), seed + 100, 0.5, 1.5),
            "beta" => *a = Array::random(arg.dtype, arg.shape.to_vec(), seed + 101, -0.5, 0.5),
            _ => {}
        }
    }
    v
}

/// Shapes and blocking of a norm kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct NormConfig {
    /// Array rows.
    pub rows: usize,
    /// Array columns (normalized over).
    pub cols: usize,
    /// Rows per block.
    pub block_rows: usize,
    /// Added to the mean square (RMS) or variance (layer norm).
    pub eps: f32,
    /// Element type of x, dy, y and dx (gamma, beta and their gradients
    /// are f32).
    pub dtype: DType,
}

/// `[rows, cols]` f32 `x` with rows past `rows` zeroed (block `i`).
#[kernel_fn]
fn valid_rows(x: Tile, i: Tile, block_rows: usize, rows: usize) -> Tile {
    if rows.is_multiple_of(block_rows) {
        x
    } else {
        let row = iota(I32, x.shape(), 0) + i * block_rows;
        select(row < rows as i32, x, 0.0)
    }
}

/// `1 / sqrt(mean(x²) + eps)` of each row, `[block_rows, 1]`.
#[kernel_fn]
fn rms_rstd(v: Tile, cols: usize, eps: f32) -> Tile {
    ((v * v).sum_keep(1) / cols as f32 + eps).rsqrt()
}

/// What every norm kernel reads first: a block of `x`'s rows and the
/// per-column scale `gamma`, whole.
#[operands]
pub(crate) struct RowsAndScale<T> {
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    x: In<T>,
    #[shape(cols)]
    #[block([cols], |_| 0)]
    gamma: In<f32>,
}

/// What every norm backward reads and writes besides `x` and `gamma`:
/// the block's `dy` and `dx`, and `gamma`'s gradient, written once.
#[operands]
pub(crate) struct RowGrads<T> {
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    dy: In<T>,
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    dx: Out<T>,
    #[shape(1, cols)]
    #[block([1, cols], |_| (0, 0))]
    dgamma: Out<f32>,
}

/// RMS norm: `x / sqrt(mean(x²) + eps) · gamma`.
#[tpu_kernel(grid = (kernel_ir::cdiv(rows, block_rows),), semantics = (parallel,))]
pub fn rms_norm<T: Float>(
    block_rows: usize,
    eps: f32,
    #[operands] _: RowsAndScale<T>,
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    o: Out<T>,
) {
    let v = x.load(..).convert(F32);
    let y = v * rms_rstd(v, cols, eps) * gamma.load(..);
    o.store(.., y.cast::<T>());
}

/// The [`rms_norm`](mod@rms_norm) kernel for a config.
pub fn rms_norm(c: &NormConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = rms_norm::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    rms_norm::build_for(c.dtype, c.block_rows, c.eps, dims)
}

/// Records RMS norm of `x` (`[cfg.rows, cfg.cols]`, `cfg.dtype`) with
/// `gamma` (`[cols]`, f32) on the graph runtime, with its backward (the
/// [`rms_norm_bwd`](mod@rms_norm_bwd) kernel).
#[cfg(feature = "graph")]
pub fn call_rms_norm(cfg: &NormConfig, x: &Tensor, gamma: &Tensor) -> Result<Tensor, RuntimeError> {
    let kernel = rms_norm(cfg).map_err(|e| build_error("rms_norm", e))?;
    let vjp = norm_vjp(rms_norm_bwd, cfg.clone());
    let mut out = x.runtime().call_with_vjp(&kernel, &[x, gamma], vjp)?;
    Ok(out.remove(0))
}

/// RMS norm backward: `dx = r · (dy·γ − x̂ · mean(dy·γ·x̂))` with `r` the
/// row's reciprocal RMS and `x̂ = x·r`; `dgamma = Σ_rows dy·x̂`.
#[tpu_kernel(grid = (kernel_ir::cdiv(rows, block_rows),), semantics = (arbitrary,))]
pub fn rms_norm_bwd<T: Float>(
    block_rows: usize,
    eps: f32,
    #[operands] _: RowsAndScale<T>,
    #[operands] _: RowGrads<T>,
    #[shape(1, cols)] acc: Scratch<f32>,
) {
    let i = program_id(0);
    if i == 0 {
        acc.store(.., 0.0);
    }
    let v = x.load(..).convert(F32);
    let g = dy.load(..).convert(F32);
    let r = rms_rstd(v, cols, eps);
    let xhat = v * r;
    let dyg = g * gamma.load(..);
    let mean_dot = (dyg * xhat).sum_keep(1) / cols as f32;
    dx.store(.., (r * (dyg - xhat * mean_dot)).cast::<T>());
    let contrib = valid_rows(g * xhat, i, block_rows, rows);
    acc.store(.., acc.load(..) + contrib.sum_keep(0));
    if i == num_programs(0) - 1 {
        dgamma.store(.., acc.load(..));
    }
}

/// The [`rms_norm_bwd`](mod@rms_norm_bwd) kernel for a config.
pub fn rms_norm_bwd(c: &NormConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = rms_norm_bwd::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    rms_norm_bwd::build_for(c.dtype, c.block_rows, c.eps, dims)
}

/// Layer norm over the last dim: `(x − mean) / sqrt(var + eps) · gamma +
/// beta`, with rank-1 gamma and beta broadcast over the rows of a block.
#[tpu_kernel(grid = (kernel_ir::cdiv(rows, block_rows),), semantics = (parallel,))]
pub fn layer_norm<T: Float>(
    block_rows: usize,
    eps: f32,
    #[operands] _: RowsAndScale<T>,
    #[shape(cols)]
    #[block([cols], |_| 0)]
    beta: In<f32>,
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    o: Out<T>,
) {
    let v = x.load(..).convert(F32);
    let n = cols as f32;
    let centered = v - v.sum_keep(1) / n;
    let var = (centered * centered).sum_keep(1) / n;
    let y = centered * (var + eps).rsqrt() * gamma.load(..) + beta.load(..);
    o.store(.., y.cast::<T>());
}

/// The [`layer_norm`](mod@layer_norm) kernel for a config.
pub fn layer_norm(c: &NormConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = layer_norm::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    layer_norm::build_for(c.dtype, c.block_rows, c.eps, dims)
}

/// Layer norm backward: with `x̂ = (x − mean)·r`,
/// `dx = r · (dy·γ − mean(dy·γ) − x̂ · mean(dy·γ·x̂))`,
/// `dgamma = Σ_rows dy·x̂`, `dbeta = Σ_rows dy`.
#[tpu_kernel(grid = (kernel_ir::cdiv(rows, block_rows),), semantics = (arbitrary,))]
pub fn layer_norm_bwd<T: Float>(
    block_rows: usize,
    eps: f32,
    #[operands] _: RowsAndScale<T>,
    #[operands] _: RowGrads<T>,
    #[shape(1, cols)]
    #[block([1, cols], |_| (0, 0))]
    dbeta: Out<f32>,
    #[shape(1, cols)] acc_g: Scratch<f32>,
    #[shape(1, cols)] acc_b: Scratch<f32>,
) {
    let i = program_id(0);
    if i == 0 {
        acc_g.store(.., 0.0);
        acc_b.store(.., 0.0);
    }
    let n = cols as f32;
    let v = x.load(..).convert(F32);
    let g = dy.load(..).convert(F32);
    let centered = v - v.sum_keep(1) / n;
    let r = ((centered * centered).sum_keep(1) / n + eps).rsqrt();
    let xhat = centered * r;
    let dyg = g * gamma.load(..);
    let mean_dyg = dyg.sum_keep(1) / n;
    let mean_dot = (dyg * xhat).sum_keep(1) / n;
    dx.store(.., (r * (dyg - mean_dyg - xhat * mean_dot)).cast::<T>());
    let contrib_g = valid_rows(g * xhat, i, block_rows, rows);
    let contrib_b = valid_rows(g, i, block_rows, rows);
    acc_g.store(.., acc_g.load(..) + contrib_g.sum_keep(0));
    acc_b.store(.., acc_b.load(..) + contrib_b.sum_keep(0));
    if i == num_programs(0) - 1 {
        dgamma.store(.., acc_g.load(..));
        dbeta.store(.., acc_b.load(..));
    }
}

/// The [`layer_norm_bwd`](mod@layer_norm_bwd) kernel for a config.
pub fn layer_norm_bwd(c: &NormConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = layer_norm_bwd::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    layer_norm_bwd::build_for(c.dtype, c.block_rows, c.eps, dims)
}

/// The [`NormConfig`] of a library config for `x` of shape `s`.
pub(crate) fn norm_config(c: &Config, s: &[usize]) -> Result<NormConfig, EntryError> {
    let [rows, cols] = dims(s, "x")?;
    Ok(NormConfig {
        rows,
        cols,
        block_rows: c.usize("block_rows")?.min(rows),
        eps: c.f32("eps")?,
        dtype: c.dtype("dtype")?,
    })
}

/// dx per element; the parameter gradients summed over the rows.
fn norm_grad_tolerance(c: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let d = c.dtype("dtype").unwrap_or(DType::F32);
    let rows = k.arguments().next().map_or(1, |x| x.shape[0]);
    k.outputs()
        .enumerate()
        .map(|(i, _)| Tolerance::sum_grad(d, if i == 0 { 1 } else { rows }))
        .collect()
}

/// x, gamma and dy: the backward kernels' inputs.
fn backward_shapes(_: &Config) -> Result<Shapes, EntryError> {
    Ok(vec![
        ("x", vec![64, 256]),
        ("gamma", vec![256]),
        ("dy", vec![64, 256]),
    ])
}

/// The norm presets: 40 rows (a ragged last block of 16), eps 1e-6.
const NORM_PRESET: &[(&str, &[usize])] = &[("x", &[40, 256]), ("dy", &[40, 256])];

/// [`rms_norm()`] in the library.
pub const RMS_NORM: Entry = Entry {
    name: "rms_norm",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| Ok(norm_vjp(rms_norm_bwd, norm_config(c, &s[0])?))),
    about: "RMS norm over the last dim",
    params: NORM_PARAMS,
    inputs: |_| Ok(vec![("x", vec![64, 256]), ("gamma", vec![256])]),
    build: |c, s| Ok(rms_norm(&norm_config(c, &s[0])?)?),
    reference: |c, a| {
        Ok(vec![reference::rms_norm(
            &a[0],
            &a[1],
            c.f32("eps")? as f64,
        )])
    },
    check: no_check,
    tolerance: dtype_tolerance,
    sample: norm_inputs,
    presets: &[Preset {
        name: "rms_norm_bf16",
        about: "RMS norm, bf16[40, 256] (ragged last block of 16 rows)",
        config: &[("dtype", "bf16"), ("block_rows", "16"), ("eps", "1e-6")],
        shapes: &[("x", &[40, 256])],
    }],
};

/// [`rms_norm_bwd()`] in the library.
pub const RMS_NORM_BWD: Entry = Entry {
    name: "rms_norm_bwd",
    fixed_inputs: None,
    backward: None,
    about: "RMS norm backward: dx and dgamma",
    params: NORM_PARAMS,
    inputs: backward_shapes,
    build: |c, s| Ok(rms_norm_bwd(&norm_config(c, &s[0])?)?),
    reference: |c, a| {
        let (dx, dg) = reference::rms_norm_bwd(&a[0], &a[1], &a[2], c.f32("eps")? as f64);
        Ok(vec![dx, dg])
    },
    check: no_check,
    tolerance: norm_grad_tolerance,
    sample: norm_inputs,
    presets: &[Preset {
        name: "rms_norm_bwd_rows",
        about: "RMS norm backward: dx, and dgamma reduced over an arbitrary grid",
        config: &[("block_rows", "16"), ("eps", "1e-6")],
        shapes: NORM_PRESET,
    }],
};

/// [`layer_norm()`] in the library.
pub const LAYER_NORM: Entry = Entry {
    name: "layer_norm",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let cfg = norm_config(c, &s[0])?;
        Ok(norm_vjp(layer_norm_bwd, cfg))
    }),
    about: "layer norm over the last dim",
    params: NORM_PARAMS,
    inputs: |_| {
        Ok(vec![
            ("x", vec![64, 256]),
            ("gamma", vec![256]),
            ("beta", vec![256]),
        ])
    },
    build: |c, s| Ok(layer_norm(&norm_config(c, &s[0])?)?),
    reference: |c, a| {
        Ok(vec![reference::layer_norm(
            &a[0],
            &a[1],
            &a[2],
            c.f32("eps")? as f64,
        )])
    },
    check: no_check,
    tolerance: |_, k| {
        k.outputs()
            .map(|o| match o.dtype {
                DType::F32 => Tolerance {
                    abs: 1e-4,
                    rel: 1e-4,
                },
                d => Tolerance::for_dtype(d),
            })
            .collect()
    },
    sample: norm_inputs,
    presets: &[Preset {
        name: "layer_norm_f32",
        about: "layer norm, f32[64, 256], 8 rows per step",
        config: &[],
        shapes: &[],
    }],
};

/// [`layer_norm_bwd()`] in the library.
pub const LAYER_NORM_BWD: Entry = Entry {
    name: "layer_norm_bwd",
    fixed_inputs: None,
    backward: None,
    about: "layer norm backward: dx, dgamma and dbeta",
    params: NORM_PARAMS,
    inputs: backward_shapes,
    build: |c, s| Ok(layer_norm_bwd(&norm_config(c, &s[0])?)?),
    reference: |c, a| {
        let (dx, dg, db) = reference::layer_norm_bwd(&a[0], &a[1], &a[2], c.f32("eps")? as f64);
        Ok(vec![dx, dg, db])
    },
    check: no_check,
    tolerance: norm_grad_tolerance,
    sample: norm_inputs,
    presets: &[Preset {
        name: "layer_norm_bwd_rows",
        about: "layer norm backward: dx, dgamma, dbeta",
        config: &[("block_rows", "16"), ("eps", "1e-6")],
        shapes: NORM_PRESET,
    }],
};

/// The backward of a norm (`rms_norm`: inputs x, gamma; `layer_norm`: x,
/// gamma, beta): its `_bwd` kernel on x, gamma and the output's
/// cotangent; the parameter gradients come back as `[1, cols]` and are
/// reshaped to the parameters' `[cols]`.
#[cfg(feature = "graph")]
pub(crate) fn norm_vjp(
    bwd: fn(&NormConfig) -> Result<VerifiedKernel, KernelErrors>,
    cfg: NormConfig,
) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| norm_backward(bwd, &cfg, call))
}

#[cfg(feature = "graph")]
fn norm_backward(
    bwd: fn(&NormConfig) -> Result<VerifiedKernel, KernelErrors>,
    cfg: &NormConfig,
    call: &VjpCall<'_>,
) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let (x, gamma) = (&call.inputs[0], &call.inputs[1]);
    let dy = call.cotangent(0)?;
    let kernel = bwd(cfg).map_err(|e| backward_error("a norm", e.into()))?;
    let mut out = x.runtime().call(&kernel, &[x, gamma, &dy])?.into_iter();
    let mut grads = vec![out.next()];
    for (p, g) in call.inputs[1..].iter().zip(out) {
        grads.push(Some(g.reshape(p.shape())?));
    }
    Ok(grads)
}
