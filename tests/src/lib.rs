//! Cross-crate tests of Tessera.
//!
//! The library part is empty on purpose: the tests live in `tests/it/`, one
//! integration-test binary, so that a build links as few large binaries as
//! possible (MLIR is linked statically).
