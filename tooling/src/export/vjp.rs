//! An artifact's VJP: the entry's backward as the graph runtime records
//! it, exported for every platform.

use kernel_ir::{Array, VerifiedKernel};
use kernels::{Config, Entry};

use super::steps::steps_with_fixed;
use super::{Artifact, ExportError, GPU_PLATFORMS, Signature, multi_platform};

/// The VJP artifact of `entry` built as `forward` with `cfg`, in
/// jax.export's VJP convention (the primals and the outputs' cotangents
/// in, the inputs' cotangents out), or `None` when the entry declares no
/// backward. Integer inputs (tables, segment ids, lengths) have no
/// cotangent: the VJP returns those of the float inputs only, and its
/// manifest's `grad_inputs` names them (the loader gives the others
/// none, JAX's float0 zeros).
///
/// It is the backward `grad` runs: the forward call is recorded on a CPU
/// graph runtime through [`Entry::call`], [`graph::vjp`] records
/// the entry's backward, and the program from the inputs and cotangents to
/// the gradients is exported twice, kernel calls decomposed (the CPU
/// branch) and as `tpu_custom_call`s (the TPU branch). A kernel's backward
/// is written once, in its entry.
pub fn vjp_for(
    entry: &Entry,
    cfg: &Config,
    forward: &VerifiedKernel,
) -> Result<Option<Artifact>, ExportError> {
    vjp_fixed(entry, cfg, forward, &[])
}

/// [`vjp_for`] of the artifact [`export_fixed`](super::export_fixed) makes with `fixed`: those
/// primals are constants of the VJP too, and `grad_inputs` counts the
/// forward's free inputs only.
pub fn vjp_fixed(
    entry: &Entry,
    cfg: &Config,
    forward: &VerifiedKernel,
    fixed: &[(usize, Array)],
) -> Result<Option<Artifact>, ExportError> {
    vjp_on(entry, cfg, forward, fixed, false)
}

/// [`vjp_fixed`], with the GPU platforms ([`GPU_PLATFORMS`](super::GPU_PLATFORMS)) when `gpu` is
/// set: the backward's kernel calls as Triton custom calls.
pub fn vjp_on(
    entry: &Entry,
    cfg: &Config,
    forward: &VerifiedKernel,
    fixed: &[(usize, Array)],
    gpu: bool,
) -> Result<Option<Artifact>, ExportError> {
    use graph::{KernelForm, Runtime, Tensor};
    if entry.backward.is_none() {
        return Ok(None);
    }
    let ins: Signature = forward
        .arguments()
        .map(|a| (a.name.to_string(), a.shape.to_vec(), a.dtype))
        .collect();
    let float_ins: Vec<usize> = (0..ins.len()).filter(|&i| ins[i].2.is_float()).collect();
    if float_ins.is_empty() {
        return Ok(None);
    }
    let fail = |what: &'static str| {
        move |e: graph::RuntimeError| ExportError::Vjp {
            kernel: forward.name.clone(),
            what,
            source: Box::new(e),
        }
    };
    let outs: Signature = forward
        .outputs()
        .map(|o| (o.name.clone(), o.shape.clone(), o.dtype))
        .collect();
    // The backward as the graph runtime records it: primals (fixed ones
    // at their values), then cotangents, and the gradients.
    let record = || -> Result<(Runtime, Vec<Tensor>, Vec<Tensor>), ExportError> {
        let rt = Runtime::cpu().map_err(fail("starting the CPU runtime"))?;
        let primals: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(i, (_, s, d))| {
                let value = match fixed.iter().find(|(j, _)| *j == i) {
                    Some((_, a)) => a.clone(),
                    None => kernel_ir::Array::zeros(*d, s.clone()),
                };
                let t = rt.tensor(&value)?;
                if d.is_float() {
                    t.requires_grad()
                } else {
                    Ok(t)
                }
            })
            .collect::<Result<_, _>>()
            .map_err(fail("its inputs"))?;
        let primal_refs: Vec<&Tensor> = primals.iter().collect();
        let wrt: Vec<&Tensor> = float_ins.iter().map(|&i| &primals[i]).collect();
        let outputs = entry
            .call(&rt, cfg, &primal_refs)
            .map_err(fail("recording the forward"))?;
        let cts: Vec<Tensor> = outs
            .iter()
            .map(|(_, s, d)| rt.tensor(&kernel_ir::Array::zeros(*d, s.clone())))
            .collect::<Result<_, _>>()
            .map_err(fail("the cotangents"))?;
        let out_refs: Vec<&Tensor> = outputs.iter().collect();
        let ct_refs: Vec<&Tensor> = cts.iter().collect();
        let grads =
            graph::vjp(&out_refs, &ct_refs, &wrt).map_err(fail("recording the backward"))?;
        let params = primals.into_iter().chain(cts).collect();
        Ok((rt, params, grads))
    };
    let branch = |(rt, params, grads): &(Runtime, Vec<Tensor>, Vec<Tensor>),
                  form: KernelForm,
                  name: &str|
     -> Result<lowering::program::Branch, ExportError> {
        let params: Vec<&Tensor> = params.iter().collect();
        let grads: Vec<&Tensor> = grads.iter().collect();
        let text = rt
            .export_as(&params, &grads, form)
            .map_err(fail("exporting the program"))?;
        Ok(lowering::private_functions(&text, name).map(lowering::program::Branch::Functions)?)
    };
    let recorded = record()?;
    let mut branches = vec![
        (
            "cpu",
            branch(&recorded, KernelForm::Decomposed, "tessera_cpu")?,
        ),
        (
            "tpu",
            branch(&recorded, KernelForm::TpuCustomCall, "tessera_tpu")?,
        ),
    ];
    let mut steps = None;
    if gpu {
        // Recorded again with the kernels built for GPUs: a backward may
        // pick other kernels there (attention's dq and dk/dv apart, whose
        // grids spread over the GPU's cores, for the one-pass kernel).
        let recorded = kernel_ir::for_platform(kernel_ir::Platform::Gpu, record)?;
        for (platform, target) in GPU_PLATFORMS {
            let f = branch(
                &recorded,
                KernelForm::TritonCustomCall(target),
                &format!("tessera_{platform}"),
            )?;
            branches.push((platform, f));
        }
        let (rt, params, grads) = &recorded;
        let params: Vec<&Tensor> = params.iter().collect();
        let grads: Vec<&Tensor> = grads.iter().collect();
        let s = rt
            .export_steps(&params, &grads)
            .map_err(fail("its Triton steps"))?;
        steps = Some(steps_with_fixed(s, fixed));
    }
    let mut vjp_ins = ins.clone();
    vjp_ins.extend(
        outs.iter()
            .map(|(n, s, d)| (format!("ct_{n}"), s.clone(), *d)),
    );
    let vjp_outs: Signature = float_ins
        .iter()
        .map(|&i| {
            let (n, s, d) = &ins[i];
            (format!("d{n}"), s.clone(), *d)
        })
        .collect();
    let mut art = multi_platform(
        &format!("{}_vjp", forward.name),
        &vjp_ins,
        &vjp_outs,
        &branches,
        fixed,
    )?;
    art.steps = steps;
    let free: Vec<usize> = (0..ins.len())
        .filter(|i| !fixed.iter().any(|(j, _)| j == i))
        .collect();
    if float_ins.len() < free.len() {
        // Positions among the forward artifact's (free) inputs.
        art.grad_inputs = Some(
            float_ins
                .iter()
                .filter_map(|i| free.iter().position(|j| j == i))
                .collect(),
        );
    }
    Ok(Some(art))
}
