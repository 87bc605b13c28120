//! The kernels on the graph runtime (feature `graph`, on by default):
//! [`Entry::call`] records any entry's call with its backward, and the
//! helpers the typed calls (`call_rms_norm`, `call_flash_attention`, ..)
//! and the backwards share. Everything here needs `graph`, hence MLIR
//! and PJRT; the rest of the crate needs only `kernel-ir`.

use graph::{Runtime, RuntimeError, Tensor};

use crate::entry::{Config, Entry, EntryError};

impl Entry {
    /// Records a call of the kernel on the graph runtime, built for `cfg`
    /// and the shapes of `args` (in the order of
    /// [`Entry::default_shapes`]); with its declared backward, so
    /// gradients flow through it.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use kernel_ir::{Array, DType};
    /// use kernels::{Config, find};
    /// use graph::{Runtime, grad};
    ///
    /// let rt = Runtime::cpu()?;
    /// let entry = find("rms_norm").unwrap();
    /// let cfg = Config::parse(entry, &[])?;
    /// let x = rt.tensor(&Array::random(DType::F32, [16, 128], 1, -1.0, 1.0))?.requires_grad()?;
    /// let g = rt.tensor(&Array::random(DType::F32, [128], 2, 0.5, 1.5))?.requires_grad()?;
    /// let y = entry.call(&rt, &cfg, &[&x, &g])?.remove(0);
    /// let loss = y.mul(&y)?.mean(&[0, 1])?;
    /// let grads = grad(&loss, &[&x, &g])?; // through rms_norm_bwd
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn call(
        &self,
        rt: &Runtime,
        cfg: &Config,
        args: &[&Tensor],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let loc = std::panic::Location::caller();
        let shapes: Vec<Vec<usize>> = args.iter().map(|t| t.shape().to_vec()).collect();
        let refused = |e: EntryError| RuntimeError::Record {
            message: format!("kernel `{}`: {e}", self.name),
            loc: loc.to_string(),
        };
        let kernel = self.build(cfg, &shapes).map_err(refused)?;
        match self.backward {
            Some(make) => rt.call_with_vjp(&kernel, args, make(cfg, &shapes).map_err(refused)?),
            None => rt.call(&kernel, args),
        }
    }
}

/// A kernel that did not build for a typed call (`call_flash_attention`,
/// ...), as a runtime error naming it.
pub fn build_error(kernel: &str, e: impl Into<EntryError>) -> RuntimeError {
    RuntimeError::failed(format!("building `{kernel}`"), e.into().to_string())
}

/// An entry error met inside a backward, as a runtime error.
pub fn backward_error(kernel: &str, e: EntryError) -> RuntimeError {
    RuntimeError::failed(
        format!("building the backward of `{kernel}`"),
        e.to_string(),
    )
}

/// The shapes of `ts`, as [`Entry::build`] takes them.
pub fn shapes_of(ts: &[&Tensor]) -> Vec<Vec<usize>> {
    ts.iter().map(|t| t.shape().to_vec()).collect()
}
