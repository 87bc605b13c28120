//! The rules of the GPU target: what one Triton program cannot express.
//!
//! Checked by [`VerifiedKernel::check_gpu`] when a kernel is lowered for
//! GPUs, not by [`crate::Kernel::verify`]: a TPU kernel need not fit a GPU,
//! and the GPU lowering asks for these before it writes anything, so a
//! kernel it cannot take is one `[gpu]` error at the author's line.
//!
//! * **One device**: a kernel across chips (a mesh) runs on the devices of
//!   its mesh; a Triton program runs on one GPU.
//! * **Power-of-two tiles**: every value the body computes is a Triton
//!   tensor, and Triton's tensors (`tl.arange`, every block) have
//!   power-of-two dims, as Pallas's Triton back end requires of its blocks.
//!   Buffers may have any shape (they are memory, indexed by pointers);
//!   what is loaded from them may not.
//! * **At most 2^20 elements per tensor**: Triton's `TRITON_MAX_TENSOR_NUMEL`.
//! * **Per architecture**: `f8e4m3fn` needs an architecture whose Triton
//!   has `fp8e4nv` ([`GpuTarget::has_f8e4m3fn`]).

use super::VerifiedKernel;
use crate::ops::ShapeDisplay;
use crate::{DType, ErrorKind, GpuRule, GpuTarget, Kernel, KernelError, KernelErrors, Op, Region};

/// Triton's largest tensor, in elements (`TRITON_MAX_TENSOR_NUMEL`).
pub(crate) const MAX_TENSOR_ELEMENTS: usize = 1 << 20;

impl VerifiedKernel {
    /// Checks the GPU target's rules (see the module docs); with a
    /// `target`, also that architecture's. Every broken rule is one
    /// `[gpu]` error at the op or declaration that breaks it.
    ///
    /// ```
    /// use kernel_ir::prelude::*;
    /// let mut k = KernelBuilder::new("odd");
    /// k.grid([1], [Parallel]);
    /// let x = k.input("x", F32, [8, 96]).block([8, 96], |[_]| (0, 0));
    /// let o = k.output("o", F32, [8, 96]).block([8, 96], |[_]| (0, 0));
    /// o.store(.., x.load(..) * 2.0);
    /// let k = k.build().unwrap();
    /// let e = k.check_gpu(None).unwrap_err().to_string();
    /// assert!(e.contains("[gpu]") && e.contains("power-of-two"), "{e}");
    /// ```
    pub fn check_gpu(&self, target: Option<GpuTarget>) -> Result<(), KernelErrors> {
        let errors = check(self, target);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(KernelErrors(errors))
        }
    }
}

/// The GPU rules (and `target`'s), as a verifier pass: a kernel built for
/// [`crate::Platform::Gpu`] is verified with these instead of the TPU's.
pub(super) fn check(k: &Kernel, target: Option<GpuTarget>) -> Vec<KernelError> {
    let mut errors = Vec::new();
    {
        let this = k;
        if let Some(m) = &this.mesh {
            errors.push(KernelError::new(
                ErrorKind::Gpu(GpuRule::Mesh {
                    kernel: this.name.to_string(),
                    devices: m.devices(),
                }),
                this.grid_loc.clone(),
            ));
            return errors;
        }
        check_region(this, &this.body.region, target, &mut errors);
        if let Some(t) = target.filter(|t| !t.has_f8e4m3fn()) {
            let declared = this
                .operands
                .iter()
                .map(|o| (o.dtype, &o.name, &o.loc))
                .chain(this.scratch.iter().map(|s| (s.dtype, &s.name, &s.loc)));
            for (dtype, name, loc) in declared {
                if dtype == DType::F8E4M3FN {
                    errors.push(KernelError::new(
                        ErrorKind::Gpu(GpuRule::NoF8e4m3fn {
                            what: format!("`{name}` is f8e4m3fn"),
                            target: t,
                        }),
                        loc.clone(),
                    ));
                }
            }
        }
    }
    errors
}

fn check_region(k: &Kernel, r: &Region, target: Option<GpuTarget>, errors: &mut Vec<KernelError>) {
    for op in &r.ops {
        check_op(k, op, target, errors);
        for sub in op.kind.regions() {
            check_region(k, sub, target, errors);
        }
    }
}

fn check_op(k: &Kernel, op: &Op, target: Option<GpuTarget>, errors: &mut Vec<KernelError>) {
    for &v in &op.results {
        let Some(ty) = k.body.ty(v) else { continue };
        let what = || {
            format!(
                "`{v} = {}` makes a {}{} tile",
                op.kind.mnemonic(),
                ty.dtype,
                ShapeDisplay(&ty.shape)
            )
        };
        if let Some(&dim) = ty.shape.iter().find(|d| !d.is_power_of_two()) {
            errors.push(KernelError::new(
                ErrorKind::Gpu(GpuRule::NotPowerOfTwo { what: what(), dim }),
                op.loc.clone(),
            ));
        } else if ty.elements() > MAX_TENSOR_ELEMENTS {
            errors.push(KernelError::new(
                ErrorKind::Gpu(GpuRule::TooLarge {
                    what: what(),
                    elements: ty.elements(),
                    max: MAX_TENSOR_ELEMENTS,
                }),
                op.loc.clone(),
            ));
        }
        if ty.dtype == DType::F8E4M3FN
            && let Some(t) = target.filter(|t| !t.has_f8e4m3fn())
        {
            errors.push(KernelError::new(
                ErrorKind::Gpu(GpuRule::NoF8e4m3fn {
                    what: what(),
                    target: t,
                }),
                op.loc.clone(),
            ));
        }
    }
}
