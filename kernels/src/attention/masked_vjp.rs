//! The backward masked attention declares in its entry: delta from the
//! saved output, then dq over the forward's tables and dk/dv over their
//! transpose (built from the mask when the call is recorded). A cotangent
//! on the logsumexp enters as `delta − ct_lse`, as in flash attention's.

use std::sync::Arc;

use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};

use super::backward::attention_delta;
use super::masked::MaskedConfig;
use super::masked_backward::{masked_attention_dkv, masked_attention_dq};
use crate::entry::refs;
use crate::recording::backward_error;

/// The backward of a forward call at `cfg`, with the dk/dv pass's tables
/// (the transpose of the call's, from the mask).
pub(crate) fn vjp(cfg: MaskedConfig, transposed: [kernel_ir::Array; 3]) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| backward(&cfg, &transposed, call))
}

/// Inputs `kind, fetch, mask_fetch, q, k, v, masks, q_seg, kv_seg`; the
/// cotangents of q, k and v (the tables, masks and ids have none).
fn backward(
    cfg: &MaskedConfig,
    transposed: &[kernel_ir::Array; 3],
    call: &VjpCall<'_>,
) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let name = call.kernel.name.as_str();
    let err = |e: crate::EntryError| backward_error(name, e);
    let ins = call.inputs;
    let rt = ins[3].runtime();
    let (o, lse) = super::vjp::saved_outputs(call)?;
    let d_o = call.cotangent(0)?;
    let dtype = ins[3].dtype();
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
    let [kind_t, fetch_t, mask_fetch_t] = transposed
        .iter()
        .map(|a| rt.constant(a))
        .collect::<Result<Vec<_>, _>>()?
        .try_into()
        .expect("three tables");
    let rest: [&Tensor; 9] = [
        &ins[3], &ins[4], &ins[5], &d_o, &lse, &delta, &ins[6], &ins[7], &ins[8],
    ];
    let dq_args: Vec<&Tensor> = [&ins[0], &ins[1], &ins[2]]
        .into_iter()
        .chain(rest)
        .collect();
    let dkv_args: Vec<&Tensor> = [&kind_t, &fetch_t, &mask_fetch_t]
        .into_iter()
        .chain(rest)
        .collect();
    let shapes =
        |ts: &[&Tensor]| -> Vec<Vec<usize>> { ts.iter().map(|t| t.shape().to_vec()).collect() };
    let (dq_shapes, dkv_shapes) = (shapes(&dq_args), shapes(&dkv_args));
    let dq_k = masked_attention_dq::build_for(
        dtype,
        cfg,
        super::masked_backward::masked_attention_dq::Dims::from_shapes(&refs(&dq_shapes))
            .map_err(|e| err(e.into()))?,
    )
    .map_err(|e| err(e.into()))?;
    let dkv_k = masked_attention_dkv::build_for(
        dtype,
        cfg,
        super::masked_backward::masked_attention_dkv::Dims::from_shapes(&refs(&dkv_shapes))
            .map_err(|e| err(e.into()))?,
    )
    .map_err(|e| err(e.into()))?;
    let dq = rt.call(&dq_k, &dq_args)?.remove(0);
    let mut dkv = rt.call(&dkv_k, &dkv_args)?;
    let dv = dkv.remove(1);
    let dk = dkv.remove(0);
    Ok(vec![
        None,
        None,
        None,
        Some(dq),
        Some(dk),
        Some(dv),
        None,
        None,
        None,
    ])
}
