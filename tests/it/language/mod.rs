//! The kernel language and its IR: the DSL, the builder, the text form, the verifier, the interpreter.
pub(crate) mod builder_kernels;
mod dma;
pub(crate) mod dsl;
mod dsl_vs_builder;
mod edge_values;
mod element_window;
mod fp8;
mod invalid;
mod packed;
mod parse;
mod positions;
mod random;
mod random_kernels;
mod roll;
mod scan;
mod slice;
mod sort;
mod top_k;
