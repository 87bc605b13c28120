//! Tessera's integration tests, one binary (see the crate docs).

mod foundation;
mod invalid;
mod random_kernels;
mod snapshots_ir;
