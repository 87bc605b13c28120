//! Tessera's integration tests, one binary (see the crate docs).

mod attention;
mod block_fetches;
mod builder_kernels;
mod common;
mod dma;

mod dsl;
mod dsl_vs_builder;
mod foundation;
mod graph;
mod invalid;
mod lib_attention;
mod lib_moe;
mod lib_ops;
mod lib_ragged;
mod library_paths;
mod lowered;
mod native;
mod paths;
mod random_kernels;
mod snapshots_ir;
mod structure;
mod tpu_compile;
mod tpu_dma;
