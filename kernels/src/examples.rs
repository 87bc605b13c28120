//! Named example instances of the kernels, with shapes and configs fixed:
//! what `tessera lower` and `tessera demo` show, and what the lowering
//! snapshots and the Pallas conformance check cover.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

use crate::attention::{AttnConfig, flash_attention};
use crate::foundation::*;

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
    ]
}

/// The example called `name`.
pub fn example(name: &str) -> Option<Example> {
    examples().into_iter().find(|e| e.name == name)
}
