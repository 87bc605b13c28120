//! A transformer block forward on the graph runtime, and its f64 host
//! reference: ordinary tensor ops around a hand-written kernel.
//!
//! `y = x + Wo · attention(rms_norm(x)·Wq, rms_norm(x)·Wk, rms_norm(x)·Wv)`,
//! with `x: [s, d_model]` (one sequence) and multi-head attention as the
//! [`kernels::attention::flash_attention_kv_len()`] kernel. The sequence may be
//! padded to a bucket ([`graph::Runtime::dynamic`]): the kernel
//! masks keys past the valid length, which it gets as scalar prefetch.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tooling::transformer::{BlockWeights, block_forward, block_reference};
//! use graph::{Buckets, Runtime};
//!
//! let rt = Runtime::cpu()?;
//! let w = BlockWeights::random(128, 2, 7);
//! let on_device = w.upload(&rt)?;
//! let x = kernel_ir::Array::random(kernel_ir::DType::F32, [100, 128], 1, -1.0, 1.0);
//! let xt = rt.dynamic(&x, 0, &Buckets::new([64, 128, 256])?)?;
//! let y = block_forward(&w, &on_device, &xt)?.to_host()?; // [100, 128]
//! let want = block_reference(&w, &x);
//! # Ok(()) }
//! ```

use graph::{Runtime, RuntimeError, Tensor};
use kernel_ir::{Array, DType};

use kernels::attention::{AttnConfig, call_flash_attention_kv_len};
use kernels::reference::{matmul_rows, rms_norm, softmax_lse};

/// Weights and shape of one block.
#[derive(Clone, Debug)]
pub struct BlockWeights {
    /// Model width.
    pub d_model: usize,
    /// Attention heads (`d_model` must divide by it).
    pub heads: usize,
    /// RMS norm gain, `[d_model]`.
    pub gamma: Array,
    /// Projections, `[d_model, d_model]` each.
    pub wq: Array,
    /// Key projection.
    pub wk: Array,
    /// Value projection.
    pub wv: Array,
    /// Output projection.
    pub wo: Array,
    /// RMS norm epsilon.
    pub eps: f64,
    /// Causal attention.
    pub causal: bool,
}

/// The weights on a runtime's devices.
#[derive(Clone, Debug)]
pub struct BlockTensors {
    gamma: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
}

impl BlockWeights {
    /// Random weights scaled so activations stay O(1).
    pub fn random(d_model: usize, heads: usize, seed: u64) -> BlockWeights {
        let r = 1.0 / (d_model as f64).sqrt();
        let w = |s| Array::random(DType::F32, [d_model, d_model], seed + s, -r, r);
        BlockWeights {
            d_model,
            heads,
            gamma: Array::random(DType::F32, [d_model], seed, 0.5, 1.5),
            wq: w(1),
            wk: w(2),
            wv: w(3),
            wo: w(4),
            eps: 1e-5,
            causal: true,
        }
    }

    /// Uploads the weights.
    pub fn upload(&self, rt: &Runtime) -> Result<BlockTensors, RuntimeError> {
        Ok(BlockTensors {
            gamma: rt.tensor(&self.gamma)?,
            wq: rt.tensor(&self.wq)?,
            wk: rt.tensor(&self.wk)?,
            wv: rt.tensor(&self.wv)?,
            wo: rt.tensor(&self.wo)?,
        })
    }

    /// Uploads the weights as parameters ([`Tensor::requires_grad`]), for
    /// gradients with [`graph::grad`].
    pub fn upload_params(&self, rt: &Runtime) -> Result<BlockTensors, RuntimeError> {
        let t = self.upload(rt)?;
        Ok(BlockTensors {
            gamma: t.gamma.requires_grad()?,
            wq: t.wq.requires_grad()?,
            wk: t.wk.requires_grad()?,
            wv: t.wv.requires_grad()?,
            wo: t.wo.requires_grad()?,
        })
    }

    fn head_dim(&self) -> usize {
        self.d_model / self.heads
    }
}

impl BlockTensors {
    /// The weights in the order gamma, wq, wk, wv, wo.
    pub fn params(&self) -> [&Tensor; 5] {
        [&self.gamma, &self.wq, &self.wk, &self.wv, &self.wo]
    }
}

/// Attention block size for a (bucketed) sequence length: the whole
/// sequence up to 128, else 128 where it divides (K is column-major, so
/// its block spans 128 lanes or the whole sequence).
fn block_for(s: usize) -> usize {
    if s > 128 && s.is_multiple_of(128) {
        128
    } else {
        s
    }
}

/// The block on the runtime; `x` is `[s, d_model]` f32, possibly bucketed
/// along the sequence.
pub fn block_forward(
    w: &BlockWeights,
    t: &BlockTensors,
    x: &Tensor,
) -> Result<Tensor, RuntimeError> {
    let s = x.shape()[0];
    let (d, h, dh) = (w.d_model, w.heads, w.head_dim());
    // rms_norm
    let ms = x.mul(x)?.mean(&[1])?;
    let r = ms.add_scalar(w.eps)?.rsqrt()?;
    let xn = x
        .mul(&r.broadcast_in_dim(&[s, d], &[0])?)?
        .mul(&t.gamma.broadcast_in_dim(&[s, d], &[1])?)?;
    // QKV projection, heads split out: [s, d] → [1, h, s, dh]
    let heads = |m: &Tensor| -> Result<Tensor, RuntimeError> {
        xn.matmul(m)?
            .reshape(&[s, h, dh])?
            .transpose(&[1, 0, 2])?
            .reshape(&[1, h, s, dh])
    };
    let (q, k, v) = (heads(&t.wq)?, heads(&t.wk)?, heads(&t.wv)?);
    let b = block_for(s);
    // Through the library's typed call, so gradients flow through the
    // kernel's own backward (dq and dk/dv masked at the same valid length).
    let cfg = AttnConfig {
        causal: w.causal,
        sm_scale: 1.0 / (dh as f32).sqrt(),
        block_q: b,
        block_k: b,
        window: None,
        softcap: None,
        dropout: None,
    };
    let len = x.valid_length(0)?;
    let [attn, _] = call_flash_attention_kv_len(&cfg, &len, &q, &k, &v)?;
    // Heads merged back, output projection, residual.
    let o = attn
        .reshape(&[h, s, dh])?
        .transpose(&[1, 0, 2])?
        .reshape(&[s, d])?;
    o.matmul(&t.wo)?.add(x)
}

/// The block in f64 on the host, for `x: [s, d_model]` (unpadded).
pub fn block_reference(w: &BlockWeights, x: &Array) -> Vec<f64> {
    let (s, d, h, dh) = (x.shape()[0], w.d_model, w.heads, w.head_dim());
    let xn = rms_norm(x, &w.gamma, w.eps);
    let q = matmul_rows(&xn, w.wq.data(), s, d, d);
    let k = matmul_rows(&xn, w.wk.data(), s, d, d);
    let v = matmul_rows(&xn, w.wv.data(), s, d, d);
    let scale = 1.0 / (dh as f64).sqrt();
    let mut o = vec![0.0; s * d];
    for head in 0..h {
        for i in 0..s {
            let visible = if w.causal { i + 1 } else { s };
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    (0..dh)
                        .map(|t| q[i * d + head * dh + t] * k[j * d + head * dh + t])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let (p, _) = softmax_lse(&scores);
            for t in 0..dh {
                o[i * d + head * dh + t] = p
                    .iter()
                    .enumerate()
                    .map(|(j, p)| p * v[j * d + head * dh + t])
                    .sum::<f64>();
            }
        }
    }
    let y = matmul_rows(&o, w.wo.data(), s, d, d);
    y.iter().zip(x.data()).map(|(a, b)| a + b).collect()
}
