//! Tessera's kernel library: each kernel with its reference op, in its own
//! module, and an [`Entry`] (config parameters, default shapes, f64
//! reference, tolerances, presets) that every tool and test reads.
//!
//! This crate knows no tool: the comparisons, benchmarks, export and
//! training loop are the `tooling` crate, the command
//! is the `tessera` crate (`cli/`). Cargo keeps it that way: neither
//! is a dependency here.
//!
//! * [`attention`]: flash attention forward (GQA/MQA, causal, sliding
//!   window, soft-cap, valid kv length, logsumexp), [`attention::backward`]
//!   (delta, dq, dk/dv), [`attention::decode`] (paged KV cache),
//!   [`attention::decode_dma`] (the same with hand-made, double-buffered
//!   page copies), [`attention::ragged`] (ragged paged attention over
//!   mixed prefill/decode batches);
//! * [`norm`]: RMS norm and layer norm, forward and backward;
//! * [`epilogue`]: matmul with a fused bias + gelu/silu (+ residual)
//!   epilogue; [`rope`]: rotary embeddings; [`swiglu`]: fused SwiGLU;
//! * [`foundation`]: tiled elementwise add, tiled matmul with an f32
//!   accumulator in scratch, row softmax;
//! * [`moe`]: grouped matmul for mixture-of-experts layers; [`permute`]:
//!   the token permute and weighted unpermute around it; [`tgmm`]: its
//!   weight gradient;
//! * [`cross_entropy`]: fused linear + softmax cross-entropy, forward and
//!   backward, the logits never in memory;
//! * [`random`](mod@random): random words and dropout, bit for bit
//!   `jax.random`'s (Threefry-2x32); [`router`]: the MoE router's top-k;
//! * [`conv1d`]: Mamba's causal depthwise conv1d, its halo rolled in from
//!   the previous sequence block;
//! * [`dma`]: every manual-DMA construct in one small kernel;
//! * [`fp8_gemm`] (the CUTLASS FP8 GEMM), [`scaled_mm`] (block-scaled
//!   FP8), [`w8a16`] (int8 weight-only);
//! * [`reference`](mod@reference): the plain f64 host math the entries compare with.
//!
//! [`ENTRIES`] lists them all, in a fixed order; adding a kernel is its
//! module (the `#[tpu_kernel]`, a builder function, an `Entry` const) plus
//! its line in [`ENTRIES`]. [`guide`]: porting from Triton
//! and CUTLASS.

pub mod check;
pub mod collective;
pub mod entry;
#[cfg(feature = "graph")]
pub mod recording;
pub mod reference;
pub mod tolerance;

pub use entry::{Config, Entry, EntryError, Param, ParamKind, Preset};

pub mod attention;
pub mod conv1d;
pub mod cross_entropy;
pub mod dma;
pub mod epilogue;
pub mod foundation;
pub mod fp8_gemm;
pub mod gdn;
pub mod moe;
pub mod mxfp4;
pub mod norm;
pub mod permute;
pub mod random;
pub mod rope;
pub mod router;
pub mod routing;
pub mod scaled_mm;
pub mod swiglu;
pub mod tgmm;
pub mod w8a16;

/// Every kernel of the library, in a fixed order: what `tessera list`
/// prints and every tool and test walks.
pub const ENTRIES: &[&Entry] = &[
    &foundation::ADD,
    &foundation::MATMUL,
    &foundation::SOFTMAX,
    &norm::LAYER_NORM,
    &attention::FLASH_ATTENTION,
    &attention::FLASH_ATTENTION_KV_LEN,
    &attention::FLASH_ATTENTION_SINKS,
    &attention::FLASH_ATTENTION_DROPOUT,
    &attention::ATTENTION_DELTA,
    &attention::FLASH_ATTENTION_DQ,
    &attention::FLASH_ATTENTION_DKV,
    &attention::FLASH_ATTENTION_DQKV,
    &attention::FLASH_ATTENTION_DQ_KV_LEN,
    &attention::FLASH_ATTENTION_DKV_KV_LEN,
    &attention::FLASH_ATTENTION_DQKV_KV_LEN,
    &attention::PAGED_DECODE_ATTENTION,
    &attention::PAGED_DECODE_ATTENTION_DMA,
    &attention::PAGED_DECODE_ATTENTION_FP8,
    &attention::MLA_DECODE_ATTENTION,
    &attention::RAGGED_PAGED_ATTENTION,
    &attention::RAGGED_PAGED_ATTENTION_UPDATE,
    &attention::MASKED_ATTENTION,
    &attention::MASKED_ATTENTION_DQ,
    &attention::MASKED_ATTENTION_DKV,
    &norm::RMS_NORM,
    &norm::RMS_NORM_BWD,
    &norm::LAYER_NORM_BWD,
    &epilogue::MATMUL_EPILOGUE,
    &rope::ROPE,
    &random::RANDOM_BITS,
    &random::DROPOUT,
    &router::ROUTER_TOP_K,
    &router::ROUTER_TOP_K_BACKWARD,
    &conv1d::CAUSAL_CONV1D,
    &gdn::GATED_DELTA_RULE,
    &gdn::GATED_DELTA_RULE_STATES,
    &gdn::GATED_DELTA_RULE_BACKWARD,
    &gdn::CAUSAL_CONV1D_GATED_DELTA_RULE,
    &swiglu::SWIGLU,
    &moe::GROUPED_MATMUL,
    &routing::MOE_POSITIONS,
    &permute::MOE_PERMUTE,
    &permute::MOE_UNPERMUTE,
    &permute::MOE_UNPERMUTE_BACKWARD,
    &tgmm::TGMM,
    &cross_entropy::LINEAR_CROSS_ENTROPY,
    &cross_entropy::LINEAR_CROSS_ENTROPY_DX,
    &cross_entropy::LINEAR_CROSS_ENTROPY_DW,
    &cross_entropy::LINEAR_CROSS_ENTROPY_BACKWARD,
    &dma::DOUBLE_BUFFERED_ROWS,
    &fp8_gemm::FP8_GEMM,
    &scaled_mm::SCALED_MM,
    &w8a16::W8A16_MATMUL,
    &mxfp4::MXFP4_MATMUL,
];

/// The entry called `name`.
pub fn find(name: &str) -> Option<&'static Entry> {
    ENTRIES.iter().copied().find(|e| e.name == name)
}

/// A preset with its entry.
#[derive(Clone, Copy)]
pub struct PresetOf {
    /// The kernel.
    pub entry: &'static Entry,
    /// The instance.
    pub preset: &'static Preset,
}

impl PresetOf {
    /// Its name.
    pub fn name(&self) -> &'static str {
        self.preset.name
    }

    /// Its config.
    pub fn config(&self) -> Result<Config, EntryError> {
        Config::of_preset(self.entry, self.preset)
    }

    /// Builds and verifies it.
    pub fn build(&self) -> Result<kernel_ir::VerifiedKernel, EntryError> {
        self.entry
            .build_with_shapes(&self.config()?, self.preset.shapes)
    }
}

/// Every preset, entry by entry.
pub fn presets() -> impl Iterator<Item = PresetOf> {
    ENTRIES.iter().flat_map(|&entry| {
        entry
            .presets
            .iter()
            .map(move |preset| PresetOf { entry, preset })
    })
}

/// The preset called `name`.
pub fn preset(name: &str) -> Option<PresetOf> {
    presets().find(|p| p.name() == name)
}

/// Guides for kernel authors.
pub mod guide {
    /// Porting a Triton fused attention and a CUTLASS GEMM with a fused
    /// epilogue to Tessera, CUDA async copies, TMA and mbarriers to manual
    /// DMA (paged attention as the worked example), what maps to what, and
    /// where numerics drift.
    pub mod porting {
        #![doc = include_str!("../doc/porting.md")]
    }

    /// Kernels across chips: the mesh, device ids, remote copies and
    /// barriers, the interpreter of N devices and its errors, the
    /// collective matmul as the worked example.
    pub mod across_chips {
        #![doc = include_str!("../doc/across_chips.md")]
    }

    /// Attention with any mask: mask descriptions, their block tables,
    /// the table-driven kernel with segment ids (packed sequences as the
    /// worked example).
    pub mod masks {
        #![doc = include_str!("../doc/masks.md")]
    }

    /// Where low-precision GEMMs drift: an FP8 GEMM's measured error by
    /// depth and accumulation scheme, and the command that measures it.
    pub mod numerics {
        #![doc = include_str!("../doc/numerics.md")]
    }

    /// Kernels for current models: how the library's pieces make a layer
    /// (a mixture-of-experts layer from router, permute, grouped matmul
    /// and unpermute, checked against its definition).
    pub mod current_models {
        #![doc = include_str!("../doc/current_models.md")]
    }
}
