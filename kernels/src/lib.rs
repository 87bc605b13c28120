//! Tessera's kernels, each with its reference op.
//!
//! Every kernel is a function from a config (block sizes, shapes, flags) to
//! a [`kernel_ir::VerifiedKernel`], next to a plain f64 host implementation
//! of the same math in [`reference`](mod@reference). [`check`] compares the two.
//!
//! The library:
//!
//! * [`attention`]: flash attention forward (GQA/MQA, causal, sliding
//!   window, soft-cap, valid kv length, logsumexp), [`attention::backward`]
//!   (delta, dq, dk/dv), [`attention::decode`] (paged KV cache);
//! * [`norm`]: RMS norm forward and backward, layer norm backward (forward
//!   in [`foundation`]);
//! * [`epilogue`]: matmul with a fused bias + gelu/silu (+ residual)
//!   epilogue; [`rope`]: rotary embeddings; [`swiglu`]: fused SwiGLU;
//! * [`foundation`]: tiled elementwise add, tiled matmul with an f32
//!   accumulator in scratch, row softmax, layer norm.
//!
//! Around it: [`examples`] (named instances: what `tessera lower`, the
//! lowering snapshots and the Pallas conformance check use), [`paths`] (one
//! kernel on every CPU path against its reference), [`transformer`] (a
//! transformer block on the graph runtime), [`bench`](mod@bench) (benchmarks against
//! XLA baselines), [`guide`] (porting from Triton and CUTLASS).

pub mod atomic_file;
pub mod attention;
pub mod bench;
pub mod catalog;
pub mod check;
pub mod diff;
pub mod epilogue;
pub mod examples;
pub mod foundation;
pub mod norm;
pub mod npy;
pub mod paths;
pub mod reference;
pub mod rope;
pub mod swiglu;
pub mod transformer;

/// Guides for kernel authors.
pub mod guide {
    /// Porting a Triton fused attention and a CUTLASS GEMM with a fused
    /// epilogue to Tessera, what maps to what, and where numerics drift.
    pub mod porting {
        #![doc = include_str!("../doc/porting.md")]
    }
}
