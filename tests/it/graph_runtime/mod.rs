//! The deferred graph runtime: ops, gradients, kernels with their backwards, traces, training.
pub(crate) mod grad;
mod grad_kernels;
mod graph;
mod routing;
mod trace;
mod train;
