//! SwiGLU feed-forward gate, fused: `o = silu(x·w_gate) ∘ (x·w_up)`. Both
//! products accumulate side by side over the `arbitrary` k dim, so `x` is
//! read once per block and neither product goes to memory.

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    DTYPE, Entry, ParamKind, Preset, matmul_shapes, matmul_tolerance, no_check, param,
    uniform_inputs,
};
use crate::foundation::{k_block_operands, k_block_rhs};
use crate::reference;
#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor, VjpCall};

/// Shapes and blocking: `x[m, k]`, `w_gate, w_up [k, n]`, `o[m, n]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SwigluConfig {
    /// Rows.
    pub m: usize,
    /// Output columns.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// Block rows.
    pub bm: usize,
    /// Block columns.
    pub bn: usize,
    /// Block depth.
    pub bk: usize,
    /// Element type of x, the weights and o.
    pub dtype: DType,
}

/// Fused SwiGLU.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(m, bm), kernel_ir::cdiv(n, bn), kernel_ir::cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn swiglu<T: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    w_gate: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    w_up: In<T>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    o: Out<T>,
    #[shape(bm, bn)] gate: Scratch<f32>,
    #[shape(bm, bn)] up: Scratch<f32>,
) {
    let l = program_id(2);
    if l == 0 {
        gate.store(.., 0.0);
        up.store(.., 0.0);
    }
    let (xv, gv) = k_block_operands(k, bk, x, w_gate);
    let uv = k_block_rhs(k, bk, w_up);
    gate.store(.., gate.load(..) + dot(xv, gv));
    up.store(.., up.load(..) + dot(xv, uv));
    if l == num_programs(2) - 1 {
        let g = gate.load(..);
        o.store(.., (g * g.logistic() * up.load(..)).cast::<T>());
    }
}

/// The [`swiglu`](mod@swiglu) kernel for a config.
pub fn swiglu(c: &SwigluConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = swiglu::Dims {
        m: c.m,
        k: c.k,
        n: c.n,
    };
    swiglu::build_for(c.dtype, c.bm, c.bn, c.bk, dims)
}

/// Records the fused SwiGLU of `x` (`[cfg.m, cfg.k]`) with `w_gate`,
/// `w_up` (`[k, n]`) on the graph runtime, with its backward.
#[cfg(feature = "graph")]
pub fn call_swiglu(
    cfg: &SwigluConfig,
    x: &Tensor,
    w_gate: &Tensor,
    w_up: &Tensor,
) -> Result<Tensor, RuntimeError> {
    let kernel = swiglu(cfg).map_err(|e| crate::recording::build_error("swiglu", e))?;
    let mut out =
        x.runtime()
            .call_with_vjp(&kernel, &[x, w_gate, w_up], Arc::new(swiglu_backward))?;
    Ok(out.remove(0))
}

/// [`swiglu()`] in the library.
pub const SWIGLU: Entry = Entry {
    name: "swiglu",
    fixed_inputs: None,
    backward: crate::entry::backward!(|_, _| Ok(Arc::new(swiglu_backward))),
    about: "fused SwiGLU: silu(x*w_gate) * (x*w_up)",
    params: &[
        DTYPE,
        param("bm", ParamKind::Positive, "64", "block rows"),
        param("bn", ParamKind::Positive, "128", "block columns"),
        param("bk", ParamKind::Positive, "128", "block depth along k"),
    ],
    inputs: |_| {
        Ok(vec![
            ("x", vec![64, 256]),
            ("w_gate", vec![256, 512]),
            ("w_up", vec![256, 512]),
        ])
    },
    build: |c, s| {
        let (m, n, k) = matmul_shapes(s, "w_gate")?;
        Ok(swiglu(&SwigluConfig {
            m,
            n,
            k,
            bm: c.usize("bm")?.min(m),
            bn: c.usize("bn")?.min(n),
            bk: c.usize("bk")?.min(k),
            dtype: c.dtype("dtype")?,
        })?)
    },
    reference: |_, a| Ok(vec![reference::swiglu(&a[0], &a[1], &a[2])]),
    check: no_check,
    tolerance: matmul_tolerance,
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        for (i, w) in v.iter_mut().enumerate().skip(1) {
            *w = Array::random(
                w.dtype(),
                w.shape().to_vec(),
                seed + 50 + i as u64,
                -0.2,
                0.2,
            );
        }
        v
    },
    presets: &[Preset {
        name: "swiglu_bf16",
        about: "fused SwiGLU: silu(x*w_gate) * (x*w_up), bf16[64, 256] x [256, 512]",
        config: &[("dtype", "bf16"), ("bn", "256")],
        shapes: &[],
    }],
};

/// The backward of `swiglu`, as tensor ops in f32: the two products
/// recomputed (the fused kernel never stores them), with `s = σ(a)`,
/// `da = g·u·s·(1 + a·(1 − s))`, `du = g·a·s`, then `dx = da·w_gateᵀ +
/// du·w_upᵀ`, `dw_gate = xᵀ·da`, `dw_up = xᵀ·du`.
#[cfg(feature = "graph")]
fn swiglu_backward(call: &VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let f32 = DType::F32;
    let (x, wg, wu) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
    let (xf, wgf, wuf) = (x.cast(f32)?, wg.cast(f32)?, wu.cast(f32)?);
    let a = xf.matmul(&wgf)?;
    let u = xf.matmul(&wuf)?;
    let g = call.cotangent(0)?.cast(f32)?;
    let s = a.logistic()?;
    let one = x.runtime().scalar(1.0, f32);
    let silu_slope = s.mul(&a.mul(&one.sub(&s)?)?.add(&one)?)?;
    let da = g.mul(&u)?.mul(&silu_slope)?;
    let du = g.mul(&a.mul(&s)?)?;
    let t = |m: &Tensor| m.transpose(&[1, 0]);
    let dx = da.matmul(&t(&wgf)?)?.add(&du.matmul(&t(&wuf)?)?)?;
    let xt = t(&xf)?;
    Ok(vec![
        Some(dx.cast(x.dtype())?),
        Some(xt.matmul(&da)?.cast(wg.dtype())?),
        Some(xt.matmul(&du)?.cast(wu.dtype())?),
    ])
}
