//! One training step's forward and backward as a StableHLO module for a
//! TPU (`tessera train --step-module FILE`): the loss and every
//! parameter's gradient from the parameters and a batch, the kernels as
//! `tpu_custom_call`s. `tessera compile --module FILE --tpu v6e` then
//! reports what libtpu says the step needs (its peak HBM), which is how
//! the dense and MoE models are compared (the optimizer's update adds
//! the same three copies of the parameters to both, so it is left out).

use std::path::Path;

use graph::{KernelForm, Runtime, RuntimeOptions, Tensor, grad};

use super::data::CopyTask;
use super::{TrainError, TrainOptions, err, model};

/// The step of `opts`'s model at its first batch, exported as `form`.
pub fn step_module(opts: &TrainOptions, form: KernelForm) -> Result<String, TrainError> {
    let c = &opts.model;
    let rt = Runtime::new(RuntimeOptions::default()).map_err(err("starting the runtime"))?;
    let params: Vec<Tensor> = model::init_params(c, opts.seed)
        .iter()
        .map(|(_, a)| rt.tensor(a).and_then(|t| t.requires_grad()))
        .collect::<Result<_, _>>()
        .map_err(err("uploading the parameters"))?;
    let batch = CopyTask::new(opts.seed)
        .next_batch(&rt, c)
        .map_err(err("uploading a batch"))?;
    let loss = model::loss(c, &params, &batch).map_err(err("recording the model"))?;
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).map_err(err("recording the gradients"))?;
    let mut inputs = refs.clone();
    inputs.extend([
        &batch.inputs,
        &batch.targets,
        &batch.mask,
        &batch.labels,
        &batch.dropout_key,
    ]);
    let mut outputs = vec![&loss];
    outputs.extend(grads.iter());
    rt.export_as(&inputs, &outputs, form)
        .map_err(err("exporting the step"))
}

/// Writes [`step_module`] for a TPU to `path`, whole or not at all (a
/// temporary file beside it, renamed).
pub fn write_step_module(opts: &TrainOptions, path: &Path) -> Result<(), TrainError> {
    let text = step_module(opts, KernelForm::TpuCustomCall)?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let io = |source| TrainError::StepModule {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}
