//! Fused kernels.
