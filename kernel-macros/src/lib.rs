//! The `#[tpu_kernel]` attribute macro.
//!
//! This crate will hold the kernel DSL: it parses a Rust function into a small
//! AST with spans, checks at compile time what it can (unsupported syntax,
//! tiling of literal block shapes), and expands to a function that builds a
//! `kernel_ir::Kernel` through the builder API. Users reach it through the
//! `kernel-ir` re-export, so a kernel crate depends on one crate.
