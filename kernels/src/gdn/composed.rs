//! The fused layer core's backward: the same function recorded unfused on
//! the graph runtime (the `causal_conv1d` kernel for each projection, the
//! normalization and the gates as tensor ops, the `gated_delta_rule`
//! kernel), each piece with its own backward, and pulled back through.
//!
//! Recomputing the forward this way costs one more pass over the layer
//! than saving what the fused kernel never writes (the convolved
//! projections, the gates); the backward kernels are those a training
//! step of the unfused layer runs. In bf16 the composition rounds the
//! convolved projections to bf16 between its kernels where the fused
//! kernel keeps them in f32, so its gradient is that of a function a
//! rounding away from the fused one.

use std::sync::Arc;

use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};
use kernel_ir::DType;

/// The fused kernel's VJP for its chunk and scale: `h` heads.
pub(super) fn vjp(chunk: usize, scale: f32, h: usize) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let (d_o, d_state) = (call.cotangent(0)?, call.cotangent(1)?);
        // Fresh leaves, each an (untracked) op on its input, so a program
        // exported from the backward reads the inputs themselves; tracked
        // from them only, the backward around stays untracked.
        let leaves = call
            .inputs
            .iter()
            .map(|t| t.reshape(t.shape())?.requires_grad())
            .collect::<Result<Vec<_>, _>>()?;
        let grads = graph::with_grad(|| {
            let (o, state) = forward(&leaves, chunk, scale, h)?;
            let params: Vec<&Tensor> = leaves.iter().collect();
            graph::vjp(&[&o, &state], &[&d_o, &d_state], &params)
        })?;
        Ok(grads.into_iter().map(Some).collect())
    })
}

/// `[q, k, v, wq, wk, wv, a, b, a_log, dt_bias]` through the unfused
/// layer: `o` (`[batch, t, h · dv]`) and the final state.
fn forward(
    x: &[Tensor],
    chunk: usize,
    scale: f32,
    h: usize,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let rt = x[0].runtime().clone();
    let f32 = DType::F32;
    let [batch, t] = [x[0].shape()[0], x[0].shape()[1]];
    // Conv + SiLU, then [batch, t, h·d] → [batch, h, t, d] in f32.
    let conv = |p: &Tensor, w: &Tensor| -> Result<Tensor, RuntimeError> {
        let ch = p.shape()[2];
        let bias = rt.scalar(0.0, p.dtype()).broadcast_to(&[1, ch])?;
        let y = crate::conv1d::call_causal_conv1d(p, w, &bias, true)?;
        y.cast(f32)?
            .reshape(&[batch, t, h, ch / h])?
            .transpose(&[0, 2, 1, 3])
    };
    let unit = |y: Tensor| -> Result<Tensor, RuntimeError> {
        let shape = y.shape().to_vec();
        let mut keep = shape.clone();
        keep[3] = 1;
        let norm = y
            .mul(&y)?
            .sum(&[3])?
            .reshape(&keep)?
            .add_scalar(1e-6)?
            .rsqrt()?;
        y.mul(&norm.broadcast_to(&shape)?)
    };
    let dtype = x[0].dtype();
    let q = unit(conv(&x[0], &x[3])?)?.cast(dtype)?;
    let k = unit(conv(&x[1], &x[4])?)?.cast(dtype)?;
    let v = conv(&x[2], &x[5])?.cast(dtype)?;
    // The gates, [batch, t, h] → [batch, h, t, 1].
    let per_head = |p: &Tensor| p.broadcast_to(&[batch, t, h]);
    let z = x[6].add(&per_head(&x[9])?)?;
    let zero = rt.scalar(0.0, f32).broadcast_to(&[batch, t, h])?;
    let softplus = z.maximum(&zero)?.add(&z.abs()?.neg()?.exp()?.log1p()?)?;
    let g = per_head(&x[8])?.exp()?.neg()?.mul(&softplus)?;
    let beta = x[7].logistic()?;
    let column = |y: Tensor| y.transpose(&[0, 2, 1])?.reshape(&[batch, h, t, 1]);
    let (g, beta) = (column(g)?, column(beta)?);
    let (o, state) = super::call_gated_delta_rule([&q, &k, &v, &g, &beta], chunk, Some(scale))?;
    let dv = state.shape()[3];
    let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[batch, t, h * dv])?;
    Ok((o, state))
}
