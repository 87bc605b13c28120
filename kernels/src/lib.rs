//! Tessera's kernels, each with its reference op, and the tools around them.
//!
//! Two module trees:
//!
//! * [`library`]: the kernels. Each module holds `#[tpu_kernel]`s, a
//!   builder function from a typed config, and an [`library::Entry`]
//!   (config parameters, default shapes, f64 reference, tolerances,
//!   presets) that every tool and test reads. The library modules are
//!   re-exported here ([`attention`], [`norm`], ...).
//!   - [`attention`]: flash attention forward (GQA/MQA, causal, sliding
//!     window, soft-cap, valid kv length, logsumexp), [`attention::backward`]
//!     (delta, dq, dk/dv), [`attention::decode`] (paged KV cache),
//!     [`attention::decode_dma`] (the same with hand-made, double-buffered
//!     page copies), [`attention::ragged`] (ragged paged attention over
//!     mixed prefill/decode batches);
//!   - [`norm`]: RMS norm forward and backward, layer norm backward
//!     (forward in [`foundation`]);
//!   - [`epilogue`]: matmul with a fused bias + gelu/silu (+ residual)
//!     epilogue; [`rope`]: rotary embeddings; [`swiglu`]: fused SwiGLU;
//!   - [`foundation`]: tiled elementwise add, tiled matmul with an f32
//!     accumulator in scratch, row softmax, layer norm;
//!   - [`library::moe`]: grouped matmul for mixture-of-experts layers;
//!   - [`library::dma`]: every manual-DMA construct in one small kernel;
//!   - [`library::fp8_gemm`] (the CUTLASS FP8 GEMM), [`library::scaled_mm`]
//!     (block-scaled FP8), [`library::w8a16`] (int8 weight-only);
//!   - [`reference`]: the plain f64 host math the entries compare with.
//! * [`tooling`]: what runs the library: [`tooling::paths`] (one kernel on
//!   every CPU path against its reference), [`tooling::check`] (error
//!   statistics), [`tooling::bench`] (benchmarks against XLA baselines),
//!   [`tooling::transformer`] (a transformer block on the graph runtime),
//!   [`tooling::npy`], [`tooling::diff`], [`tooling::numerics`] (the FP8
//!   GEMM's error by accumulation scheme), [`tooling::atomic_file`]; and the
//!   `tessera` command (`src/bin/tessera`).
//!
//! [`guide`]: porting from Triton and CUTLASS.

pub mod library;
pub mod tooling;

pub use library::{attention, epilogue, foundation, norm, reference, rope, swiglu};

/// Guides for kernel authors.
pub mod guide {
    /// Porting a Triton fused attention and a CUTLASS GEMM with a fused
    /// epilogue to Tessera, CUDA async copies, TMA and mbarriers to manual
    /// DMA (paged attention as the worked example), what maps to what, and
    /// where numerics drift.
    pub mod porting {
        #![doc = include_str!("../doc/porting.md")]
    }

    /// Where low-precision GEMMs drift: an FP8 GEMM's measured error by
    /// depth and accumulation scheme, and the command that measures it.
    pub mod numerics {
        #![doc = include_str!("../doc/numerics.md")]
    }
}
