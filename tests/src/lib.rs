//! Cross-crate tests of Tessera.
//!
//! The tests live in `tests/it/`, one integration-test binary, so that a
//! build links as few large binaries as possible (MLIR is linked
//! statically). The library holds what they share that is big enough to be
//! its own module: [`random_kernel`], the generator of random kernels for
//! the differential test against the TPU compiler, and [`support_matrix`],
//! one small kernel per op, dtype and rank for the same test, and
//! [`mutation`], the kernel mutator of the never-panic test, whose verified
//! mutants the differential test compiles too.

pub mod mutation;
pub mod random_kernel;
pub mod support_matrix;
