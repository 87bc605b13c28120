//! The backward flash attention declares in its entries: the forward saved
//! `o` and the logsumexp; the backward runs [`attention_delta`](mod@attention_delta), then
//! the one-pass [`flash_attention_dqkv()`] (five products per block pair
//! instead of seven), or, where its whole-sequence `dq` scratch does not
//! fit the generation's VMEM (the verifier refuses it: long sequences,
//! many query heads per kv head), the dq and dk/dv kernels. A cotangent on
//! the logsumexp (a loss that reads it) enters as `delta − ct_lse`, since
//! `∂lse/∂s = p`.

use std::sync::Arc;

use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};
use kernel_ir::DType;

use super::AttnConfig;
use super::backward::{
    attention_delta, flash_attention_dkv, flash_attention_dkv_kv_len, flash_attention_dq,
    flash_attention_dq_kv_len, flash_attention_dqkv, flash_attention_dqkv_kv_len,
};
use crate::entry::refs;
use crate::recording::backward_error;

/// The backward of a forward call at `cfg` (the config it ran with).
pub(crate) fn vjp(cfg: AttnConfig, with_len: bool) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| backward(&cfg, call, with_len, false))
}

/// The backward of a call with sinks (inputs `[kv_len,] [dropout_key,] q, k, v, sinks`).
pub(crate) fn vjp_sinks(cfg: AttnConfig, with_len: bool) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| backward(&cfg, call, with_len, true))
}

/// The backward of `flash_attention` (inputs q, k, v), `_kv_len` (inputs
/// kv_len, q, k, v) or `_sinks` (inputs q, k, v, sinks), each with the
/// dropout key before q when `cfg` has dropout (the backward kernels take
/// it too and draw the forward's mask again). The sinks' `lse`
/// is all dq, dk and dv need (`p = exp(s − lse)` counts the sink);
/// `dsinks[h] = −Σ exp(sinks[h] − lse)·(delta − ct_lse)` over the head's
/// rows, since a sink's only path to the loss is through `lse` and `o`.
fn backward(
    cfg: &AttnConfig,
    call: &VjpCall<'_>,
    with_len: bool,
    sinks: bool,
) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let name = call.kernel.name.as_str();
    let err = |e| backward_error(name, e);
    let ins = call.inputs;
    // Scalar prefetch first: the valid length, the dropout key.
    let off = usize::from(with_len) + usize::from(cfg.dropout.is_some());
    let (q, k, v) = (&ins[off], &ins[off + 1], &ins[off + 2]);
    let rt = q.runtime();
    let (o, lse) = saved_outputs(call)?;
    let d_o = call.cotangent(0)?;
    let dtype = q.dtype();
    let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
    // On GPUs each backward kernel holds q, k, v, dO and a score and a
    // probability block at once: with head dim >= 128 the dk/dv kernel
    // takes 64-row query blocks (128 rows spill 768 B of registers on
    // sm_90, `tessera compile --gpu`) and the dq kernel 64-key blocks
    // (Triton's tutorial's shape of the two: short inner blocks). The
    // forward keeps its blocks.
    let inner = |block: usize| {
        if gpu && q.shape()[3] >= 128 {
            block.min(64)
        } else {
            block
        }
    };
    let dkv_cfg = AttnConfig {
        block_q: inner(cfg.block_q),
        ..*cfg
    };
    let dq_cfg = AttnConfig {
        block_k: inner(cfg.block_k),
        ..*cfg
    };
    let delta_k = attention_delta::build_for(
        dtype,
        cfg.block_q,
        attention_delta::Dims::from_shapes(&[o.shape(), d_o.shape()]).map_err(|e| err(e.into()))?,
    )
    .map_err(|e| err(e.into()))?;
    let mut delta = rt.call(&delta_k, &[&o, &d_o])?.remove(0);
    if let Some(Some(ct_lse)) = call.cotangents.get(1) {
        delta = delta.sub(ct_lse)?;
    }
    let shapes: Vec<Vec<usize>> = [q, k, v, &d_o, &lse, &delta]
        .iter()
        .map(|t| t.shape().to_vec())
        .collect();
    let mut args: Vec<&Tensor> = ins[..off].iter().collect();
    args.extend([q, k, v, &d_o, &lse, &delta]);
    let dqkv_dims =
        flash_attention_dqkv::Dims::from_shapes(&refs(&shapes)).map_err(|e| err(e.into()))?;
    // One pass where it builds, on TPUs: its k blocks run in sequence,
    // which a TPU core does anyway. A GPU runs only the parallel grid dims
    // as programs, (batch, kv head) here, too few for its cores: there dq
    // and dk/dv are two kernels, each parallel over its own blocks.
    let one_pass = if gpu {
        None
    } else if with_len {
        flash_attention_dqkv_kv_len(cfg, dtype, dqkv_dims).ok()
    } else {
        flash_attention_dqkv(cfg, dtype, dqkv_dims).ok()
    };
    let (dq, dk, dv) = if let Some(dqkv_k) = one_pass {
        let mut g = rt.call(&dqkv_k, &args)?;
        let (dv, dk) = (g.remove(2), g.remove(1));
        (g.remove(0), dk, dv)
    } else {
        let dq_dims =
            flash_attention_dq::Dims::from_shapes(&refs(&shapes)).map_err(|e| err(e.into()))?;
        let dkv_dims =
            flash_attention_dkv::Dims::from_shapes(&refs(&shapes)).map_err(|e| err(e.into()))?;
        let (dq_k, dkv_k) = if with_len {
            (
                flash_attention_dq_kv_len(&dq_cfg, dtype, dq_dims),
                flash_attention_dkv_kv_len(&dkv_cfg, dtype, dkv_dims),
            )
        } else {
            (
                flash_attention_dq(&dq_cfg, dtype, dq_dims),
                flash_attention_dkv(&dkv_cfg, dtype, dkv_dims),
            )
        };
        let (dq_k, dkv_k) = (
            dq_k.map_err(|e| err(e.into()))?,
            dkv_k.map_err(|e| err(e.into()))?,
        );
        let dq = rt.call(&dq_k, &args)?.remove(0);
        let mut dkv = rt.call(&dkv_k, &args)?;
        let dv = dkv.remove(1);
        (dq, dkv.remove(0), dv)
    };
    debug_assert!(lse.dtype() == DType::F32);
    let mut out = vec![None; off];
    out.extend([Some(dq), Some(dk), Some(dv)]);
    if sinks {
        let h = ins[off + 3].shape()[0];
        let per_row = ins[off + 3]
            .reshape(&[1, h, 1, 1])?
            .broadcast_to(lse.shape())?
            .sub(&lse)?
            .exp()?
            .mul(&delta)?;
        out.push(Some(per_row.sum(&[0, 2, 3])?.reshape(&[h])?.neg()?));
    }
    Ok(out)
}

/// The forward's saved `o` and `lse`, or the forward again when the
/// program dropped them (a loss on lse alone): what every attention
/// backward starts from.
pub(crate) fn saved_outputs(call: &VjpCall<'_>) -> Result<(Tensor, Tensor), RuntimeError> {
    match (call.outputs.first(), call.outputs.get(1)) {
        (Some(Some(o)), Some(Some(l))) => Ok((o.clone(), l.clone())),
        _ => {
            let refs: Vec<&Tensor> = call.inputs.iter().collect();
            let rt = call.inputs[0].runtime();
            let mut r = rt.call(call.kernel, &refs)?;
            let lse = r.remove(1);
            Ok((r.remove(0), lse))
        }
    }
}
