//! A whole kernel: signature plus body.

use crate::{Body, BufferRef, DType, Grid, Operand, ScalarPrefetch, Scratch, Target};

/// A kernel as data: what it iterates over, what it touches and what it does.
///
/// Build one with [`crate::KernelBuilder`] (or the `#[tpu_kernel]` macro),
/// check it with [`Kernel::verify`], run it with [`crate::interpret`].
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Name, used for the lowered function.
    pub name: String,
    /// The TPU generation whose rules apply.
    pub target: Target,
    /// Scoped VMEM limit in bytes; `None` means the target's default.
    pub vmem_limit: Option<u64>,
    /// Iteration space.
    pub grid: Grid,
    /// Scalar-prefetch operands, passed first.
    pub prefetch: Vec<ScalarPrefetch>,
    /// Array operands, in call order.
    pub operands: Vec<Operand>,
    /// Scratch buffers.
    pub scratch: Vec<Scratch>,
    /// What each grid step does.
    pub body: Body,
}

impl Kernel {
    /// The scoped VMEM limit that applies: explicit or the target default.
    pub fn effective_vmem_limit(&self) -> u64 {
        self.vmem_limit
            .unwrap_or_else(|| self.target.default_scoped_vmem_limit())
    }

    /// Name, dtype and view shape of a buffer, if it exists.
    pub fn buffer(&self, b: BufferRef) -> Option<(&str, DType, &[usize])> {
        match b {
            BufferRef::Operand(i) => self
                .operands
                .get(i)
                .map(|o| (o.name.as_str(), o.dtype, o.view_shape())),
            BufferRef::Scratch(i) => self
                .scratch
                .get(i)
                .map(|s| (s.name.as_str(), s.dtype, s.shape.as_slice())),
            BufferRef::Prefetch(i) => self
                .prefetch
                .get(i)
                .map(|p| (p.name.as_str(), p.dtype, p.shape.as_slice())),
        }
    }

    /// Operands the kernel reads from the caller (in and in-out), in order.
    pub fn inputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role.is_input())
    }

    /// Operands the kernel returns (out and in-out), in order.
    pub fn outputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role.is_output())
    }
}
