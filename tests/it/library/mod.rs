//! The kernel library against f64 references: each family on every CPU path, masks, traffic.
mod attention;
mod block_fetches;
mod catalog;
mod collective;
mod cost;
mod foundation;
mod lib_attention;
mod lib_cross_entropy;
mod lib_gdn;
mod lib_lowp;
mod lib_moe;
mod lib_ops;
mod lib_permute;
mod lib_ragged;
mod library_paths;
mod masks;
