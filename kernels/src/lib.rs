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
//! * [`moe`]: grouped matmul for mixture-of-experts layers;
//! * [`random`](mod@random): random words and dropout, bit for bit
//!   `jax.random`'s (Threefry-2x32); [`router`]: the MoE router's top-k;
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
pub mod graph;
pub mod reference;
pub mod tolerance;

pub use entry::{Config, Entry, EntryError, Param, ParamKind, Preset};

pub mod attention;
pub mod dma;
pub mod epilogue;
pub mod foundation;
pub mod fp8_gemm;
pub mod moe;
pub mod norm;
pub mod random;
pub mod rope;
pub mod router;
pub mod scaled_mm;
pub mod swiglu;
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
    &attention::RAGGED_PAGED_ATTENTION,
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
    &swiglu::SWIGLU,
    &moe::GROUPED_MATMUL,
    &dma::DOUBLE_BUFFERED_ROWS,
    &fp8_gemm::FP8_GEMM,
    &scaled_mm::SCALED_MM,
    &w8a16::W8A16_MATMUL,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names `tessera list` prints (the kernel's arguments) are the
    /// names `--input` and `--shape` take (the entry's shapes).
    #[test]
    fn input_names_are_the_kernels_argument_names() {
        for e in ENTRIES {
            let cfg = Config::parse(e, &[]).unwrap();
            let shapes = e.default_shapes(&cfg).unwrap();
            let k = e.build_at_default_shapes(&cfg).unwrap();
            let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
            let args: Vec<&str> = k.arguments().map(|a| a.name).collect();
            assert_eq!(names, args, "{}", e.name);
        }
    }

    /// Names are unique across kernels and presets (a preset named like a
    /// kernel could not be reached by name: `lower`, `compile`, `cost` and
    /// `estimate` look kernels up first, and `compile all --out` wrote both
    /// to one file), every preset builds, and every preset's override names
    /// a parameter or an input of its kernel.
    #[test]
    fn presets_build_and_names_are_unique() {
        let mut names = std::collections::HashSet::new();
        for e in ENTRIES {
            assert!(names.insert(e.name), "two kernels are called {}", e.name);
        }
        let mut presets_seen = std::collections::HashSet::new();
        for p in presets() {
            assert!(
                presets_seen.insert(p.name()),
                "two presets are called {}",
                p.name()
            );
            assert!(
                find(p.name()).is_none(),
                "preset {} has a kernel's name, so it cannot be reached by name",
                p.name()
            );
            p.build().unwrap_or_else(|e| panic!("{}: {e}", p.name()));
        }
        // The 20 presets the library started with; more are welcome.
        assert!(presets_seen.len() >= 20, "{}", presets_seen.len());
    }

    /// Values of the wrong kind are refused when parsed, with the kind.
    #[test]
    fn config_values_are_checked_by_kind() {
        let e = find("flash_attention").unwrap();
        let bad = |k: &str, v: &str| {
            Config::parse(e, &[(k.into(), v.into())])
                .unwrap_err()
                .to_string()
        };
        assert!(bad("block_q", "0").contains("a positive integer"));
        assert!(bad("causal", "yes").contains("true or false"));
        assert!(bad("dtype", "i32").contains("f32, bf16 or f16"));
        assert!(bad("window", "-3").contains("none or a positive integer"));
        assert!(bad("softcap", "0").contains("none or a positive number"));
        assert!(bad("sm_scale", "nan").contains("auto or a number"));
        assert!(bad("nope", "1").contains("its keys are: dtype, causal"));
        let e = find("matmul_epilogue").unwrap();
        assert!(
            Config::parse(e, &[("activation".into(), "relu".into())])
                .unwrap_err()
                .to_string()
                .contains("none, gelu, silu")
        );
    }

    /// A zero-size dim in any input of any kernel is an error from the
    /// build (the verifier's `[zero-size]` or a shape error), never a
    /// panic: every path runs only verified kernels, so this is the one
    /// answer on all of them.
    #[test]
    fn zero_size_dims_are_errors_for_every_kernel() {
        let mut tried = 0;
        for e in ENTRIES {
            let cfg = Config::parse(e, &[]).unwrap();
            let shapes: Vec<Vec<usize>> = e
                .default_shapes(&cfg)
                .unwrap()
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            for i in 0..shapes.len() {
                for d in 0..shapes[i].len() {
                    let mut s = shapes.clone();
                    s[i][d] = 0;
                    tried += 1;
                    // Either the build refuses it, or the kernel built
                    // from the other inputs takes another shape there (an
                    // argument error when it is called with this one).
                    match e.build(&cfg, &s) {
                        Err(_) => {}
                        Ok(k) => {
                            let want: Vec<Vec<usize>> =
                                k.arguments().map(|a| a.shape.to_vec()).collect();
                            assert_ne!(want[i], s[i], "{} input {i} dim {d}", e.name);
                        }
                    }
                }
            }
        }
        assert!(tried > 40, "{tried}");
    }
}
