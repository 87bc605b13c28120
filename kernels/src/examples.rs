//! Named example instances of the kernels, with shapes and configs fixed:
//! what `tessera lower` and `tessera demo` show, and what the lowering
//! snapshots and the Pallas conformance check cover.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

use crate::attention::backward::{attention_delta, flash_attention_dkv, flash_attention_dq};
use crate::attention::decode::{DecodeConfig, paged_decode_attention};
use crate::attention::{AttnConfig, flash_attention, flash_attention_kv_len};
use crate::epilogue::{Activation, EpilogueConfig, matmul_epilogue};
use crate::foundation::*;
use crate::norm::{NormConfig, layer_norm_bwd, rms_norm, rms_norm_bwd};
use crate::swiglu::{SwigluConfig, swiglu};

/// The attention config of the GQA examples: causal, sliding window 96,
/// soft-cap 30.
fn gqa_config() -> AttnConfig {
    AttnConfig {
        causal: true,
        sm_scale: 0.125,
        block_q: 64,
        block_k: 128,
        window: Some(96),
        softcap: Some(30.0),
    }
}

fn gqa_config_plain() -> AttnConfig {
    AttnConfig {
        window: None,
        softcap: None,
        ..gqa_config()
    }
}

fn norm_config(dtype: DType) -> NormConfig {
    NormConfig {
        rows: 40,
        cols: 256,
        block_rows: 16,
        eps: 1e-6,
        dtype,
    }
}

/// A named kernel instance.
pub struct Example {
    /// Name, as `tessera lower` takes it.
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
    /// Builds and verifies it.
    pub build: fn() -> Result<VerifiedKernel, KernelErrors>,
}

fn attn(
    causal: bool,
    block_q: usize,
    dtype: DType,
    sq: usize,
    skv: usize,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = crate::attention::flash_attention::Dims {
        b: 1,
        h: 2,
        sq,
        skv,
        d: 64,
        hkv: 2,
    };
    let cfg = AttnConfig {
        causal,
        sm_scale: 0.125,
        block_q,
        block_k: 128,
        window: None,
        softcap: None,
    };
    flash_attention(&cfg, dtype, dims)
}

/// Every example, in a fixed order.
pub fn examples() -> Vec<Example> {
    vec![
        Example {
            name: "add_f32",
            about: "tiled elementwise add, f32[64, 256] in 16x128 blocks",
            build: || {
                add(&AddConfig {
                    rows: 64,
                    cols: 256,
                    block_rows: 16,
                    block_cols: 128,
                    dtype: F32,
                })
            },
        },
        Example {
            name: "add_bf16_ragged",
            about: "tiled add with partial last blocks, bf16[40, 200] in 16x128 blocks",
            build: || {
                add(&AddConfig {
                    rows: 40,
                    cols: 200,
                    block_rows: 16,
                    block_cols: 128,
                    dtype: BF16,
                })
            },
        },
        Example {
            name: "matmul_bf16_f32",
            about: "tiled matmul 256x256x512, bf16 in, f32 accumulator in scratch",
            build: || {
                matmul(&MatmulConfig {
                    m: 256,
                    n: 256,
                    k: 512,
                    bm: 128,
                    bn: 128,
                    bk: 128,
                    dtype: BF16,
                    out_dtype: F32,
                })
            },
        },
        Example {
            name: "matmul_ragged_k",
            about: "tiled matmul 64x128x200 with the k tail masked",
            build: || {
                matmul(&MatmulConfig {
                    m: 64,
                    n: 128,
                    k: 200,
                    bm: 64,
                    bn: 128,
                    bk: 128,
                    dtype: F32,
                    out_dtype: F32,
                })
            },
        },
        Example {
            name: "softmax_bf16",
            about: "row softmax, bf16[64, 512], 16 rows per step",
            build: || {
                softmax(&SoftmaxConfig {
                    rows: 64,
                    cols: 512,
                    block_rows: 16,
                    dtype: BF16,
                })
            },
        },
        Example {
            name: "layer_norm",
            about: "layer norm, f32[64, 256], 8 rows per step",
            build: || {
                layer_norm(&LayerNormConfig {
                    rows: 64,
                    cols: 256,
                    block_rows: 8,
                    eps: 1e-5,
                    dtype: F32,
                })
            },
        },
        Example {
            name: "flash_attention_causal_bf16",
            about: "flash attention forward, causal, bf16[1, 2, 256, 64], K col-major",
            build: || attn(true, 64, BF16, 256, 256),
        },
        Example {
            name: "flash_attention_f32",
            about: "flash attention forward, f32, 128 queries over 256 keys",
            build: || attn(false, 32, F32, 128, 256),
        },
        Example {
            name: "flash_attention_gqa_window_bf16",
            about: "flash attention forward, bf16, 4 query heads on 2 kv heads, causal, window 96, soft-cap 30, ragged 200 keys",
            build: || {
                let dims = crate::attention::flash_attention::Dims {
                    b: 1,
                    h: 4,
                    hkv: 2,
                    sq: 200,
                    skv: 200,
                    d: 64,
                };
                flash_attention(&gqa_config(), BF16, dims)
            },
        },
        Example {
            name: "flash_attention_kv_len",
            about: "flash attention forward over a bucket of 256 keys, valid length as scalar prefetch",
            build: || {
                let dims = crate::attention::flash_attention::Dims {
                    b: 1,
                    h: 2,
                    hkv: 2,
                    sq: 256,
                    skv: 256,
                    d: 64,
                };
                let cfg = AttnConfig {
                    causal: true,
                    ..gqa_config_plain()
                };
                flash_attention_kv_len(&cfg, F32, dims)
            },
        },
        Example {
            name: "attention_delta",
            about: "flash attention backward, delta = rowsum(dO * O), bf16[1, 4, 200, 64]",
            build: || {
                attention_delta(
                    64,
                    BF16,
                    crate::attention::backward::attention_delta::Dims {
                        b: 1,
                        h: 4,
                        sq: 200,
                        d: 64,
                    },
                )
            },
        },
        Example {
            name: "flash_attention_dq",
            about: "flash attention backward, dq, GQA 4/2 heads, causal, window, soft-cap",
            build: || {
                let dims = crate::attention::backward::flash_attention_dq::Dims {
                    b: 1,
                    h: 4,
                    hkv: 2,
                    sq: 200,
                    skv: 200,
                    d: 64,
                };
                flash_attention_dq(&gqa_config(), BF16, dims)
            },
        },
        Example {
            name: "flash_attention_dkv",
            about: "flash attention backward, dk and dv summed over the 2 query heads of each kv head",
            build: || {
                let dims = crate::attention::backward::flash_attention_dkv::Dims {
                    b: 1,
                    h: 4,
                    hkv: 2,
                    sq: 200,
                    skv: 200,
                    d: 64,
                };
                flash_attention_dkv(&gqa_config(), BF16, dims)
            },
        },
        Example {
            name: "paged_decode_attention",
            about: "decode attention over a paged KV cache: 4 sequences, 8 pages of 16 each, block tables in scalar prefetch",
            build: || {
                let dims = crate::attention::decode::paged_decode_attention::Dims {
                    b: 4,
                    hkv: 2,
                    g: 4,
                    d: 128,
                    pages: 40,
                    page: 16,
                    pages_per_seq: 8,
                };
                paged_decode_attention(&DecodeConfig { sm_scale: 0.088 }, BF16, dims)
            },
        },
        Example {
            name: "rms_norm_bf16",
            about: "RMS norm, bf16[40, 256] (ragged last block of 16 rows)",
            build: || rms_norm(&norm_config(BF16)),
        },
        Example {
            name: "rms_norm_bwd",
            about: "RMS norm backward: dx, and dgamma reduced over an arbitrary grid",
            build: || rms_norm_bwd(&norm_config(F32)),
        },
        Example {
            name: "layer_norm_bwd",
            about: "layer norm backward: dx, dgamma, dbeta",
            build: || layer_norm_bwd(&norm_config(F32)),
        },
        Example {
            name: "matmul_gelu_residual",
            about: "matmul with the epilogue fused: gelu(x*w + bias) + residual, bf16 in, f32 out, ragged k",
            build: || {
                matmul_epilogue(&EpilogueConfig {
                    m: 128,
                    n: 256,
                    k: 320,
                    bm: 128,
                    bn: 128,
                    bk: 128,
                    activation: Activation::Gelu,
                    residual: true,
                    dtype: BF16,
                    out_dtype: F32,
                })
            },
        },
        Example {
            name: "rope",
            about: "rotary position embedding, bf16[1, 4, 200, 128], 32 positions per step",
            build: || {
                crate::rope::rope(
                    32,
                    BF16,
                    crate::rope::rope::Dims {
                        b: 1,
                        h: 4,
                        s: 200,
                        d: 128,
                        half: 64,
                    },
                )
            },
        },
        Example {
            name: "swiglu",
            about: "fused SwiGLU: silu(x*w_gate) * (x*w_up), bf16[64, 256] x [256, 512]",
            build: || {
                swiglu(&SwigluConfig {
                    m: 64,
                    n: 512,
                    k: 256,
                    bm: 64,
                    bn: 256,
                    bk: 128,
                    dtype: BF16,
                })
            },
        },
    ]
}

/// The example called `name`.
pub fn example(name: &str) -> Option<Example> {
    examples().into_iter().find(|e| e.name == name)
}
