//! A kernel across chips on the CPU: its decomposed SPMD program (one
//! replica per device of the kernel's mesh) on a PJRT CPU client with that
//! many devices, each device given its own shard's arguments.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let kernel: kernel_ir::VerifiedKernel = unimplemented!();
//! # let shards: Vec<Vec<kernel_ir::Array>> = Vec::new();
//! use runtime::across_devices::PreparedMesh;
//! // shards[d]: device d's scalar prefetch and inputs, as for one device.
//! let outputs = PreparedMesh::new(&kernel)?.run(&shards)?;
//! // outputs[d]: device d's outputs.
//! # Ok(()) }
//! ```

use std::sync::Mutex;

use kernel_ir::{Array, VerifiedKernel};

use crate::backend::BackendError;
use crate::pjrt::{Buffer, Client, CompileOptions, Executable, PjrtError};

/// The process's CPU client with `devices` devices, created on first use
/// (one per mesh size, so at most a handful).
pub fn mesh_client(devices: usize) -> Result<&'static Client, PjrtError> {
    static CLIENTS: Mutex<Vec<(usize, &'static Client)>> = Mutex::new(Vec::new());
    let mut clients = CLIENTS
        .lock()
        .map_err(|_| PjrtError::Usage("the CPU client table was poisoned".into()))?;
    if let Some((_, c)) = clients.iter().find(|(n, _)| *n == devices) {
        return Ok(c);
    }
    // Leaked on purpose: a client lives as long as the process, as the
    // one-device client does.
    let c: &'static Client = Box::leak(Box::new(Client::cpu(devices)?));
    clients.push((devices, c));
    Ok(c)
}

/// A kernel across chips compiled for the CPU devices of its mesh.
pub struct PreparedMesh {
    executable: Executable,
    client: &'static Client,
    kernel: VerifiedKernel,
    devices: usize,
}

impl PreparedMesh {
    /// Lowers `kernel` (which must declare a mesh) to its decomposed SPMD
    /// program and compiles it for as many CPU devices as the mesh has.
    pub fn new(kernel: &VerifiedKernel) -> Result<PreparedMesh, BackendError> {
        let devices = match &kernel.mesh {
            Some(m) => m.devices(),
            None => {
                return Err(PjrtError::Usage(format!(
                    "kernel `{}` declares no mesh; run it with runtime::backend::Prepared",
                    kernel.name
                ))
                .into());
            }
        };
        let client = mesh_client(devices)?;
        let module = lowering::decomposed(kernel)?;
        let options = CompileOptions::of_module(&module);
        let executable = client.compile(module.as_bytes(), &options)?;
        Ok(PreparedMesh {
            executable,
            client,
            kernel: kernel.clone(),
            devices,
        })
    }

    /// Runs with `shards[d]` as device `d`'s arguments (scalar prefetch,
    /// then inputs) and returns each device's outputs.
    pub fn run(&self, shards: &[Vec<Array>]) -> Result<Vec<Vec<Array>>, BackendError> {
        if shards.len() != self.devices {
            return Err(PjrtError::Usage(format!(
                "kernel `{}` runs on {} devices but got arguments for {}; pass one list per device",
                self.kernel.name,
                self.devices,
                shards.len()
            ))
            .into());
        }
        let mut bufs: Vec<Vec<Buffer>> = Vec::with_capacity(self.devices);
        for (d, args) in shards.iter().enumerate() {
            self.kernel
                .check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
                .map_err(|e| BackendError::Arguments(Box::new(e)))?;
            if !self.kernel.prefetch.is_empty() {
                self.kernel
                    .check_block_indices(&args[..self.kernel.prefetch.len()])?;
            }
            bufs.push(
                args.iter()
                    .map(|a| self.client.upload(a, d))
                    .collect::<Result<_, _>>()?,
            );
        }
        let refs: Vec<Vec<&Buffer>> = bufs.iter().map(|v| v.iter().collect()).collect();
        let outs = self.executable.execute_replicated(&refs)?;
        outs.iter()
            .map(|dev| {
                dev.iter()
                    .map(|b| b.to_host().map_err(BackendError::from))
                    .collect()
            })
            .collect()
    }
}
