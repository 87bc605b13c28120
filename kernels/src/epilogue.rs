//! Matmul with a fused epilogue, the CUTLASS pattern:
//! `o = act(x · w + bias) [+ residual]`, with the activation applied to the
//! f32 accumulator before the single store, so the pre-activation never
//! goes to memory.

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{Config, EntryError};
use crate::entry::{
    DTYPE, Entry, ParamKind, Preset, matmul_shapes, matmul_tolerance, no_check, param,
    uniform_inputs,
};
use crate::foundation::accumulate_k_step;
use crate::reference;
#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor, VjpCall};

/// The activation of the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// None: `o = x·w + bias`.
    Identity,
    /// `gelu(y) = y · Φ(y)` (exact, with erf).
    Gelu,
    /// `silu(y) = y · σ(y)`.
    Silu,
}

/// Config of [`matmul_epilogue()`].
#[derive(Clone, Debug, PartialEq)]
pub struct EpilogueConfig {
    /// Rows of x and o.
    pub m: usize,
    /// Columns of w and o.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// Block rows.
    pub bm: usize,
    /// Block columns.
    pub bn: usize,
    /// Block depth along k.
    pub bk: usize,
    /// The activation.
    pub activation: Activation,
    /// Add a `[m, n]` residual after the activation.
    pub residual: bool,
    /// Input dtype (x, w); the output and residual have `out_dtype`.
    pub dtype: DType,
    /// Output dtype.
    pub out_dtype: DType,
}

/// `act(y)` in f32.
#[kernel_fn]
pub(crate) fn activate(y: Tile, act: Activation) -> Tile {
    if act == Activation::Gelu {
        y * 0.5 * ((y * std::f32::consts::FRAC_1_SQRT_2).erf() + 1.0)
    } else if act == Activation::Silu {
        y * y.logistic()
    } else {
        y
    }
}

/// `o = act(x·w + bias) [+ residual]`; the kernel takes `residual` when
/// `with_residual` (and is then called `matmul_bias_act_residual`).
#[tpu_kernel(
    grid = (kernel_ir::cdiv(m, bm), kernel_ir::cdiv(n, bn), kernel_ir::cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary),
    name = if with_residual { "matmul_bias_act_residual" } else { "matmul_bias_act" }
)]
#[allow(clippy::too_many_arguments)]
pub fn matmul_bias_act<T: Float, O: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    act: Activation,
    with_residual: bool,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    w: In<T>,
    #[shape(1, n)]
    #[block([1, bn], |_, j, _| (0, j))]
    bias: In<f32>,
    #[present(with_residual)]
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    residual: Option<In<O>>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    o: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let l = program_id(2);
    accumulate_k_step(k, bk, x, w, acc, l);
    if l == num_programs(2) - 1 {
        let mut y = activate(acc.load(..) + bias.load(..), act);
        if let Some(r) = residual {
            y = y + r.load(..).convert(F32);
        }
        o.store(.., y.cast::<O>());
    }
}

/// The epilogue kernel for a config ([`matmul_bias_act`](mod@matmul_bias_act)).
/// Arguments: `x, w, bias[1, n]` (f32) and, with `residual`, `residual`.
pub fn matmul_epilogue(c: &EpilogueConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = matmul_bias_act::Dims {
        m: c.m,
        k: c.k,
        n: c.n,
    };
    matmul_bias_act::build_for(
        c.dtype,
        c.out_dtype,
        c.bm,
        c.bn,
        c.bk,
        c.activation,
        c.residual,
        dims,
    )
}

/// [`matmul_epilogue()`] in the library.
pub const MATMUL_EPILOGUE: Entry = Entry {
    name: "matmul_epilogue",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, _| {
        let act = activation(c)?;
        Ok(Arc::new(move |call: &VjpCall<'_>| {
            matmul_epilogue_backward(act, call)
        }))
    }),
    about: "matmul with a fused epilogue: act(x*w + bias) [+ residual]",
    params: &[
        DTYPE,
        param(
            "out_dtype",
            ParamKind::FloatDType,
            "f32",
            "output (and residual) element type",
        ),
        param(
            "activation",
            ParamKind::Choice(&["none", "gelu", "silu"]),
            "gelu",
            "none, gelu or silu",
        ),
        param(
            "residual",
            ParamKind::Bool,
            "false",
            "add a [m, n] residual input",
        ),
        param("bm", ParamKind::Positive, "128", "block rows"),
        param("bn", ParamKind::Positive, "128", "block columns"),
        param("bk", ParamKind::Positive, "128", "block depth along k"),
    ],
    inputs: |c| {
        let mut v = vec![
            ("x", vec![128, 320]),
            ("w", vec![320, 256]),
            ("bias", vec![1, 256]),
        ];
        if c.bool("residual")? {
            v.push(("residual", vec![128, 256]));
        }
        Ok(v)
    },
    build: |c, s| {
        let (m, n, k) = matmul_shapes(s, "w")?;
        let activation = activation(c)?;
        Ok(matmul_epilogue(&EpilogueConfig {
            m,
            n,
            k,
            bm: c.usize("bm")?.min(m),
            bn: c.usize("bn")?.min(n),
            bk: c.usize("bk")?.min(k),
            activation,
            residual: c.bool("residual")?,
            dtype: c.dtype("dtype")?,
            out_dtype: c.dtype("out_dtype")?,
        })?)
    },
    reference: |c, a| {
        Ok(vec![reference::matmul_epilogue(
            &a[0],
            &a[1],
            &a[2],
            c.choice("activation")?,
            a.get(3),
        )])
    },
    check: no_check,
    tolerance: matmul_tolerance,
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        // Weights of a trained layer: small, so the activations stay O(1).
        if let Some(w) = v.get_mut(1) {
            *w = Array::random(w.dtype(), w.shape().to_vec(), seed + 50, -0.2, 0.2);
        }
        v
    },
    presets: &[Preset {
        name: "matmul_gelu_residual",
        about: "matmul with the epilogue fused: gelu(x*w + bias) + residual, bf16 in, f32 out, ragged k",
        config: &[("dtype", "bf16"), ("residual", "true")],
        shapes: &[],
    }],
};

/// `act'(z)` as tensor ops (f32).
#[cfg(feature = "graph")]
fn activation_slope(act: Activation, z: &Tensor) -> Result<Tensor, RuntimeError> {
    Ok(match act {
        // Φ(z) + z·φ(z)
        Activation::Gelu => {
            let cdf = z
                .scale(std::f64::consts::FRAC_1_SQRT_2)?
                .erf()?
                .add_scalar(1.0)?
                .scale(0.5)?;
            let pdf =
                z.mul(z)?.scale(-0.5)?.exp()?.scale(
                    0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2,
                )?;
            cdf.add(&z.mul(&pdf)?)?
        }
        // σ(z)·(1 + z·(1 − σ(z)))
        Activation::Silu => {
            let s = z.logistic()?;
            let one = z.runtime().scalar(1.0, DType::F32);
            s.mul(&z.mul(&one.sub(&s)?)?.add(&one)?)?
        }
        Activation::Identity => z
            .runtime()
            .scalar(1.0, DType::F32)
            .broadcast_to(z.shape())?,
    })
}

/// The `activation` parameter, typed.
fn activation(c: &Config) -> Result<Activation, EntryError> {
    Ok(match c.choice("activation")? {
        "gelu" => Activation::Gelu,
        "silu" => Activation::Silu,
        _ => Activation::Identity,
    })
}

/// The backward of `matmul_epilogue`, as tensor ops: the pre-activation
/// `z = x·w + bias` recomputed in f32 (the kernel never stores it), then
/// `dz = g·act'(z)`, `dx = dz·wᵀ`, `dw = xᵀ·dz`, `dbias = Σ_rows dz`,
/// `dresidual = g`.
#[cfg(feature = "graph")]
fn matmul_epilogue_backward(
    act: Activation,
    call: &VjpCall<'_>,
) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let (x, w, bias) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
    let (xf, wf) = (x.cast(DType::F32)?, w.cast(DType::F32)?);
    let (m, n) = (x.shape()[0], w.shape()[1]);
    let z = xf
        .matmul(&wf)?
        .add(&bias.broadcast_in_dim(&[m, n], &[0, 1])?)?;
    let g = call.cotangent(0)?;
    let dz = g.cast(DType::F32)?.mul(&activation_slope(act, &z)?)?;
    let dx = dz.matmul(&wf.transpose(&[1, 0])?)?.cast(x.dtype())?;
    let dw = xf.transpose(&[1, 0])?.matmul(&dz)?.cast(w.dtype())?;
    let dbias = dz.sum(&[0])?.reshape(&[1, n])?;
    let mut out = vec![Some(dx), Some(dw), Some(dbias)];
    if call.inputs.len() > 3 {
        out.push(Some(g));
    }
    Ok(out)
}
