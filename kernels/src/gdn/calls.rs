//! The gated delta rule's typed calls on the graph runtime, each with its
//! backward, so `graph::grad` reaches the kernels without a `Config`.

use graph::{RuntimeError, Tensor};

use super::backward::{check_shapes, vjp_at};
use super::gated_delta_rule;
use crate::recording::{build_error, shapes_of};

/// The projections and weights of one Gated DeltaNet layer core, as
/// [`call_causal_conv1d_gated_delta_rule`] takes them (the shapes of
/// [`causal_conv1d_gated_delta_rule`](mod@super::causal_conv1d_gated_delta_rule)).
#[derive(Clone, Copy, Debug)]
pub struct LayerInputs<'a> {
    /// `[batch, t, h · dk]`.
    pub q: &'a Tensor,
    /// `[batch, t, h · dk]`.
    pub k: &'a Tensor,
    /// `[batch, t, h · dv]`.
    pub v: &'a Tensor,
    /// `[taps, h · dk]`.
    pub wq: &'a Tensor,
    /// `[taps, h · dk]`.
    pub wk: &'a Tensor,
    /// `[taps, h · dv]`.
    pub wv: &'a Tensor,
    /// `[batch, t, h]`, f32.
    pub a: &'a Tensor,
    /// `[batch, t, h]`, f32.
    pub b: &'a Tensor,
    /// `[1, h]`, f32.
    pub a_log: &'a Tensor,
    /// `[1, h]`, f32.
    pub dt_bias: &'a Tensor,
}

/// Records [`gated_delta_rule`](mod@gated_delta_rule) of `q, k: [b, h, t,
/// dk]`, `v: [b, h, t, dv]`, `g, beta: [b, h, t, 1]` (f32) in chunks of
/// `chunk` tokens with its backward: `(o, final state)`. `scale` is the
/// query's (`None`: `1/√dk`).
pub fn call_gated_delta_rule(
    [q, k, v, g, beta]: [&Tensor; 5],
    chunk: usize,
    scale: Option<f32>,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let fail = |e| build_error("gated_delta_rule", e);
    let dims = check_shapes(&shapes_of(&[q, k, v, g, beta])).map_err(fail)?;
    let [b, h, t, dk, dv] = dims;
    let chunk = chunk.min(t).max(1);
    let scale = scale.unwrap_or(1.0 / (dk as f32).sqrt());
    let kernel = gated_delta_rule::build_for(
        q.dtype(),
        chunk,
        scale,
        gated_delta_rule::Dims { b, h, t, dk, dv },
    )
    .map_err(|e| build_error("gated_delta_rule", e))?;
    let vjp = vjp_at(q.dtype(), chunk, scale, dims).map_err(fail)?;
    let mut out = q
        .runtime()
        .call_with_vjp(&kernel, &[q, k, v, g, beta], vjp)?;
    let state = out.remove(1);
    Ok((out.remove(0), state))
}

/// Records the fused layer core
/// [`causal_conv1d_gated_delta_rule`](mod@super::causal_conv1d_gated_delta_rule) in chunks of `chunk`
/// tokens with its backward (the layer recomputed unfused): `(o, final
/// state)`, `o: [batch, t, h · dv]`.
pub fn call_causal_conv1d_gated_delta_rule(
    x: &LayerInputs<'_>,
    chunk: usize,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let entry = &super::CAUSAL_CONV1D_GATED_DELTA_RULE;
    let pairs = [
        ("dtype".to_string(), x.q.dtype().to_string()),
        ("chunk".to_string(), chunk.to_string()),
    ];
    let cfg = crate::Config::parse(entry, &pairs).map_err(|e| build_error(entry.name, e))?;
    let args = [
        x.q, x.k, x.v, x.wq, x.wk, x.wv, x.a, x.b, x.a_log, x.dt_bias,
    ];
    let mut out = entry.call(x.q.runtime(), &cfg, &args)?;
    let state = out.remove(1);
    Ok((out.remove(0), state))
}
