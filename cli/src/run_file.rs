//! `tessera run FILE.kir`: a kernel file on `.npy` inputs named by its
//! arguments. A kernel across chips runs on every device of its mesh: each
//! input file holds every device's shard stacked along a new leading axis
//! (`[devices, ..shard]`), and so does each output.

use std::path::Path;

use kernel_ir::{Array, DType, InterpOptions, VerifiedKernel};
use runtime::across_devices::PreparedMesh;
use runtime::backend::{Backend, Prepared};

use crate::Failure;
use crate::args::Args;

/// The kernel's arguments (prefetch, then inputs) from `--input NAME=FILE`,
/// each stacked over `devices` when the kernel has a mesh.
fn inputs(k: &VerifiedKernel, a: &Args, devices: Option<usize>) -> Result<Vec<Array>, String> {
    let names: Vec<(String, DType, Vec<usize>)> = k
        .arguments()
        .map(|x| (x.name.to_string(), x.dtype, x.shape.to_vec()))
        .collect();
    let mut files: Vec<Option<Array>> = vec![None; names.len()];
    for (n, path) in a.pairs("input")? {
        let i = names.iter().position(|x| x.0 == n).ok_or_else(|| {
            let all: Vec<&str> = names.iter().map(|x| x.0.as_str()).collect();
            format!(
                "kernel `{}` has no input `{n}`; its inputs are: {}",
                k.name,
                all.join(", ")
            )
        })?;
        if files[i].is_some() {
            return Err(format!("--input {n} is given twice"));
        }
        files[i] = Some(tooling::npy::read(Path::new(&path)).map_err(|e| e.to_string())?);
    }
    let mut out = Vec::new();
    for ((name, dtype, shape), f) in names.iter().zip(files) {
        let f = f.ok_or_else(|| format!("missing --input {name}=FILE.npy"))?;
        let mut want = shape.clone();
        if let Some(d) = devices {
            want.insert(0, d);
        }
        if f.shape() != want.as_slice() {
            let per = if devices.is_some() {
                " (every device's shard stacked along a leading axis)"
            } else {
                ""
            };
            return Err(format!(
                "input `{name}` has shape {:?}; kernel `{}` takes {want:?}{per}",
                f.shape(),
                k.name
            ));
        }
        let arg = crate::kernel_args::for_argument(f, *dtype, &want);
        // Checked here, before anything compiles, as for catalog kernels.
        if arg.dtype() != *dtype {
            return Err(format!(
                "input `{name}` is {} but kernel `{}` takes {dtype} there; convert the file",
                arg.dtype(),
                k.name
            ));
        }
        out.push(arg);
    }
    Ok(out)
}

/// Device `d`'s shard of each stacked array.
fn shards(stacked: &[Array], devices: usize) -> Vec<Vec<Array>> {
    (0..devices)
        .map(|d| {
            stacked
                .iter()
                .map(|a| {
                    let n = a.len() / devices.max(1);
                    let data = a.data()[d * n..(d + 1) * n].to_vec();
                    Array::new(a.dtype(), a.shape()[1..].to_vec(), data)
                        .unwrap_or_else(|_| a.clone())
                })
                .collect()
        })
        .collect()
}

/// Each output stacked over the devices.
fn stack(per_device: &[Vec<Array>]) -> Vec<Array> {
    let Some(first) = per_device.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let mut shape = vec![per_device.len()];
            shape.extend_from_slice(first[i].shape());
            let data: Vec<f64> = per_device
                .iter()
                .flat_map(|outs| outs[i].data().iter().copied())
                .collect();
            Array::new(first[i].dtype(), shape, data).unwrap_or_else(|_| first[i].clone())
        })
        .collect()
}

/// The kernel file's outputs on `backend` (stacked over its devices when
/// it has a mesh).
pub fn run_file(
    k: &VerifiedKernel,
    a: &Args,
    backend: Backend,
    seed: u64,
) -> Result<Vec<Array>, Failure> {
    let usage = |m: String| Failure::Usage(m);
    let Some(mesh) = &k.mesh else {
        let args = inputs(k, a, None).map_err(usage)?;
        return Prepared::new(backend, k)
            .and_then(|p| p.run(&args))
            .map_err(|e| Failure::Run(format!("{backend}: {e}")));
    };
    let devices = mesh.devices();
    let args = shards(&inputs(k, a, Some(devices)).map_err(usage)?, devices);
    let outs = match backend {
        Backend::Interpreter => {
            let opts = InterpOptions {
                mesh_seed: seed,
                ..Default::default()
            };
            kernel_ir::interpret_mesh(k, &args, &opts)
                .map(|r| r.outputs)
                .map_err(|e| Failure::Run(format!("{backend}: {e}")))?
        }
        Backend::Decomposed => PreparedMesh::new(k)
            .and_then(|p| p.run(&args))
            .map_err(|e| Failure::Run(format!("{backend}: {e}")))?,
        other => {
            return Err(usage(format!(
                "kernel `{}` runs on the {devices} devices of its mesh; {other} runs one device: use --backend interp or pjrt",
                k.name
            )));
        }
    };
    Ok(stack(&outs))
}
