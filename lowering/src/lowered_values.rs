//! What each kernel-IR value lowered to, for one emitter.
//!
//! Every emitter walks the body in order and records one lowering per
//! value (an MLIR value, or the host JIT's lazy expression); a use before
//! its definition is a lowering bug, reported as an internal error.

use kernel_ir::{Kernel, ValueId};

use crate::LoweringError;

/// One slot per value of a kernel body, filled as the body is emitted.
pub(crate) struct LoweredValues<T> {
    /// Indexed by [`ValueId::index`].
    pub slots: Vec<Option<T>>,
}

impl<T: Clone> LoweredValues<T> {
    /// Empty slots for every value of `k`'s body.
    pub fn new(k: &Kernel) -> Self {
        LoweredValues {
            slots: vec![None; k.body.values.len()],
        }
    }

    /// The lowering of `id`.
    pub fn get(&self, id: ValueId) -> Result<T, LoweringError> {
        self.slots
            .get(id.index())
            .cloned()
            .flatten()
            .ok_or_else(|| LoweringError::Internal(format!("value %{} has no lowering", id.0)))
    }

    /// Records the lowering of `id`.
    pub fn set(&mut self, id: ValueId, v: T) {
        if let Some(s) = self.slots.get_mut(id.index()) {
            *s = Some(v);
        }
    }
}
