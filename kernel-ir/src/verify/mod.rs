//! The verifier: every rule a kernel must satisfy before it is run or
//! lowered, as small passes over the kernel.
//!
//! * [`signature`]: names, shapes, block specs, index-map references,
//!   layouts, alignment values, memory spaces;
//! * [`body`]: SSA scoping and the type of every op (copies, semaphores);
//! * [`scope`]: scoped buffers and semaphores used only in their scope;
//! * [`tiling`]: the TPU (sublane, lane) tiling of VMEM blocks, applied to
//!   the physical minor dims;
//! * [`grid_walk`]: index maps evaluated over the grid: blocks in bounds
//!   and block starts aligned;
//! * the VMEM budget ([`crate::VmemBudget`]);
//! * [`carry`]: no scratch state across a parallel grid dim;
//! * [`mosaic`]: what the TPU compiler rejects beyond tiling (f16, i8
//!   arithmetic, narrow masked stores, ...), found by compiling with libtpu.
//!
//! A kernel that passes is a [`VerifiedKernel`]; only those are interpreted
//! and lowered.
//!
//! In order; a signature error stops the rest:
//! `signature` (names, shapes, block ranks, index-map references, layout
//! permutations, alignment values, memory spaces) → `body` (scoping, types,
//! including copies: same shape and dtype on both sides, a writable
//! destination, semaphores of the right kind and in bounds) → `scope` (scoped
//! buffers and semaphores used only in their scope) →
//! `tiling` (VMEM blocks: physical minor dim a multiple of 128 lanes or full,
//! second-minor a multiple of 8·packing rows or full; rank 1: full, ×1024 or a
//! power of two ≥ 128·packing) → `grid_walk` (index maps without prefetch
//! evaluated over the grid, or its corners beyond 65 536 steps: blocks in
//! bounds, block starts aligned) → VMEM budget → `carry` (scratch, or a VMEM
//! output block, read before it is written in a step carries state; that is legal only if it is reset under
//! `program_id(d) == 0` for dims `d` inner to every parallel dim). `mosaic`
//! runs after `body` (when the types are sound): what the TPU compiler rejects
//! on every generation beyond tiling, each rule found by compiling with libtpu
//! and tagged `[tpu-<rule>]` (f16, i8 arithmetic, narrow masked stores, bf16
//! `%`, dot operand and accumulator types, outer-product dots on v6e/v7x,
//! vectors in SMEM, bool and rank-1
//! vectors through loops and branches, packed rank-1 selects, `core_parallel`
//! and buffering limits; and `dma_window`, the copy windows a TPU DMA moves,
//! checked against a matrix of copies in `tests/it/targets/tpu_dma.rs`). The module
//! docs list them with the compiler's words; `tests/it/targets/tpu_compile.rs` shows,
//! per rule, that the error points at the offending line and that libtpu
//! rejects the kernel when the rule is skipped
//! (`Kernel::verify_without_mosaic_rules`, hidden, for that test only). Where a
//! lowering can avoid a limit it does, instead of a rule.

mod body;
mod carry;
mod dma_window;
mod gpu;
mod grid_walk;
mod mosaic;
mod scope;
mod signature;
mod tiling;

pub(crate) use grid_walk::{block_in_bounds, element_reach};

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use crate::error::{ErrorKind, KernelError, KernelErrors};
use crate::{Kernel, VmemBudget};

/// A kernel that passed every check of the verifier. The only way to get
/// one is [`Kernel::verify`], so code that takes a `VerifiedKernel` can rely
/// on well-formed shapes, types and index maps.
///
/// Shared, not copied: a clone is a reference count (kernel calls in a
/// graph hold their kernel), and its identity is computed once
/// ([`VerifiedKernel::digest`], what registry and cache keys are made of).
#[derive(Clone, Debug)]
pub struct VerifiedKernel {
    kernel: Arc<Kernel>,
    digest: Arc<OnceLock<String>>,
}

impl PartialEq for VerifiedKernel {
    fn eq(&self, other: &VerifiedKernel) -> bool {
        Arc::ptr_eq(&self.kernel, &other.kernel) || self.kernel == other.kernel
    }
}

impl VerifiedKernel {
    fn new(kernel: Kernel) -> VerifiedKernel {
        VerifiedKernel {
            kernel: Arc::new(kernel),
            digest: Arc::default(),
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Gives the kernel back (for editing and re-verifying); a copy when
    /// it is shared.
    pub fn into_kernel(self) -> Kernel {
        Arc::unwrap_or_clone(self.kernel)
    }

    /// The SHA-256 of the kernel's printed form (lowercase hex), computed
    /// on first use and kept: two kernels print alike exactly when they
    /// are the same kernel, in every process.
    pub fn digest(&self) -> &str {
        self.digest
            .get_or_init(|| crate::sha256_hex(self.kernel.to_string().as_bytes()))
    }

    /// A kernel that a semantics-preserving pass made from a verified one
    /// (the pass's own tests check it against the interpreter).
    pub(crate) fn trusted(kernel: Kernel) -> VerifiedKernel {
        VerifiedKernel::new(kernel)
    }

    /// The VMEM budget (which fits, or the kernel would not verify).
    pub fn vmem_budget(&self) -> VmemBudget {
        VmemBudget::of(&self.kernel)
    }
}

impl Deref for VerifiedKernel {
    type Target = Kernel;
    fn deref(&self) -> &Kernel {
        &self.kernel
    }
}

impl Kernel {
    /// Runs every check; returns the kernel as a [`VerifiedKernel`] or all
    /// the errors found.
    pub fn verify(self) -> Result<VerifiedKernel, KernelErrors> {
        crate::memo::count_verification();
        let errors = self.check();
        if errors.is_empty() {
            Ok(VerifiedKernel::new(self))
        } else {
            Err(KernelErrors(errors))
        }
    }

    /// Verifies with every check but the TPU compiler's own limits (the
    /// `mosaic` pass). Only for showing that each of those rules is needed:
    /// the tests compile kernels that break one with libtpu and expect the
    /// compiler to reject them. Anything else should use
    /// [`Kernel::verify`].
    #[doc(hidden)]
    pub fn verify_without_mosaic_rules(self) -> Result<VerifiedKernel, KernelErrors> {
        let errors = self.check_passes(false);
        if errors.is_empty() {
            Ok(VerifiedKernel::new(self))
        } else {
            Err(KernelErrors(errors))
        }
    }

    /// Runs every check and returns the errors (empty when valid).
    pub fn check(&self) -> Vec<KernelError> {
        self.check_passes(true)
    }

    fn check_passes(&self, mosaic_rules: bool) -> Vec<KernelError> {
        let mut errors = signature::check(self);
        if !errors.is_empty() {
            // Later passes index blocks and maps by the signature; stop here.
            return errors;
        }
        let body_errors = body::check(self);
        let typed = body_errors.is_empty();
        errors.extend(body_errors);
        errors.extend(scope::check(self));
        let tpu = self.platform == crate::Platform::Tpu;
        if typed && mosaic_rules && tpu {
            errors.extend(mosaic::check(self));
            errors.extend(dma_window::check(self));
        }
        if typed && !tpu {
            errors.extend(gpu::check(self, None));
        }
        if tpu {
            errors.extend(tiling::check(self));
        }
        errors.extend(grid_walk::check(self));
        let budget = VmemBudget::of(self);
        if tpu && !budget.fits() {
            errors.push(KernelError::new(
                ErrorKind::VmemOverflow(Box::new(budget)),
                None,
            ));
        }
        if errors.is_empty() {
            errors.extend(carry::check(self));
        }
        errors
    }
}
