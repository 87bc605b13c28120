//! A small causal transformer language model on the graph runtime, built
//! from the library's kernels (RMS norm, flash attention, SwiGLU) through
//! their entries, so its gradients run their backward kernels.
//!
//! Tokens enter as one-hot rows (the embedding is a matmul, whose gradient
//! is a matmul); positions are a learned table. Each layer is
//! `h += Wo·attention(rms_norm(h))`, `h += W_down·swiglu(rms_norm(h))`;
//! the loss is the masked mean cross-entropy of the next token.
//!
//! With [`MoeConfig`] (`tessera train --model moe`) each layer's FFN is a
//! routed mixture of SwiGLU experts, built from the MoE kernels: router
//! top-k, permute into expert order, three grouped matmuls, unpermute with
//! the router's weights; the routing tables are made on the device
//! ([`kernels::routing`]), so the step stays one program. Its attention
//! has a learned sink per head and dropout on its probabilities (a key per
//! step, the mask drawn inside the kernels), and its loss is the fused
//! linear cross-entropy (the logits never materialize). Every kernel's backward
//! is declared, so `grad` runs the weight gradient (tgmm), the unpermute's
//! backward and the router's.

use graph::{RuntimeError, Tensor};
use kernel_ir::{Array, DType};

use kernels::attention::{AttnConfig, call_flash_attention, call_flash_attention_dropout};
use kernels::cross_entropy::{LinearCrossEntropyConfig, call_linear_cross_entropy};
use kernels::moe::{GroupedMatmulConfig, call_grouped_matmul};
use kernels::norm::{NormConfig, call_rms_norm};
use kernels::permute::{call_moe_permute, call_moe_unpermute};
use kernels::router::call_router_top_k;
use kernels::routing::route;
use kernels::swiglu::{SwigluConfig, call_swiglu};

/// The model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct LmConfig {
    /// Token ids `0..vocab`.
    pub vocab: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Transformer layers.
    pub layers: usize,
    /// SwiGLU hidden width.
    pub ffn: usize,
    /// Sequence length.
    pub seq: usize,
    /// Sequences per step.
    pub batch: usize,
    /// A mixture of experts in place of each layer's FFN (with sinks in
    /// attention and the fused loss); `None`: the dense model.
    pub moe: Option<MoeConfig>,
}

/// The MoE model's experts.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub top_k: usize,
    /// Each expert's SwiGLU hidden width.
    pub expert_ffn: usize,
    /// Dropout on the attention probabilities (inside the flash kernels,
    /// a fresh mask each step).
    pub attention_dropout: f32,
}

impl Default for MoeConfig {
    fn default() -> Self {
        MoeConfig {
            experts: 4,
            top_k: 2,
            expert_ffn: 64,
            attention_dropout: 0.05,
        }
    }
}

impl Default for LmConfig {
    fn default() -> Self {
        LmConfig {
            vocab: 16,
            d_model: 64,
            heads: 2,
            layers: 2,
            ffn: 128,
            seq: 16,
            batch: 16,
            moe: None,
        }
    }
}

/// Parameter names and shapes, in the order the optimizer and the
/// checkpoints keep them.
pub fn param_shapes(c: &LmConfig) -> Vec<(String, Vec<usize>)> {
    let (v, d, f) = (c.vocab, c.d_model, c.ffn);
    let mut p = vec![
        ("embed".to_string(), vec![v, d]),
        ("pos".to_string(), vec![c.seq, d]),
    ];
    for l in 0..c.layers {
        let mut layer = vec![
            ("norm1", vec![d]),
            ("wq", vec![d, d]),
            ("wk", vec![d, d]),
            ("wv", vec![d, d]),
            ("wo", vec![d, d]),
        ];
        match &c.moe {
            None => layer.extend([
                ("norm2", vec![d]),
                ("w_gate", vec![d, f]),
                ("w_up", vec![d, f]),
                ("w_down", vec![f, d]),
            ]),
            Some(m) => {
                let (e, f) = (m.experts, m.expert_ffn);
                layer.extend([
                    ("sinks", vec![c.heads]),
                    ("norm2", vec![d]),
                    ("router", vec![d, e]),
                    ("w_gate", vec![e, d, f]),
                    ("w_up", vec![e, d, f]),
                    ("w_down", vec![e, f, d]),
                ]);
            }
        }
        for (n, s) in layer {
            p.push((format!("layer{l}.{n}"), s));
        }
    }
    p.push(("norm_f".to_string(), vec![d]));
    p.push(("unembed".to_string(), vec![d, v]));
    p
}

/// Initial parameters from `seed`: norm gains 1, sinks 0, matrices (and
/// each expert's) uniform with variance 1/fan_in (embeddings 1).
pub fn init_params(c: &LmConfig, seed: u64) -> Vec<(String, Array)> {
    param_shapes(c)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let a = if name.ends_with("sinks") {
                Array::zeros(DType::F32, shape.clone())
            } else if shape.len() == 1 {
                Array::new(DType::F32, shape.clone(), vec![1.0; shape[0]])
                    .unwrap_or_else(|_| Array::zeros(DType::F32, shape.clone()))
            } else {
                let fan_in = if name == "embed" || name == "pos" {
                    1
                } else {
                    shape[shape.len() - 2]
                };
                let r = (3.0 / fan_in as f64).sqrt();
                let r = if name == "pos" || name == "embed" {
                    r * 0.5
                } else {
                    r
                };
                Array::random(DType::F32, shape, seed.wrapping_add(1 + i as u64), -r, r)
            };
            (name, a)
        })
        .collect()
}

/// One batch on the device: inputs and targets as one-hot rows
/// `[batch·seq, vocab]`, and the loss mask `[batch·seq]` (1 where the
/// target counts).
pub struct Batch {
    /// One-hot input tokens.
    pub inputs: Tensor,
    /// One-hot next tokens.
    pub targets: Tensor,
    /// Which positions the loss counts.
    pub mask: Tensor,
    /// The next tokens as ids, `[batch·seq, 1]` i32, −100 where the loss
    /// does not count (the fused loss's ignored label).
    pub labels: Tensor,
    /// This step's dropout key, `[2]` i32 (a Threefry key's words).
    pub dropout_key: Tensor,
    /// How many positions it counts.
    pub counted: usize,
}

/// The typed configs of the kernels the model calls, for its shapes.
struct Kernels {
    norm: NormConfig,
    attention: AttnConfig,
    swiglu: SwigluConfig,
}

fn kernels(c: &LmConfig) -> Kernels {
    let rows = c.batch * c.seq;
    let dh = c.d_model / c.heads;
    Kernels {
        norm: NormConfig {
            rows,
            cols: c.d_model,
            block_rows: rows.min(64),
            eps: 1e-5,
            dtype: DType::F32,
        },
        attention: AttnConfig {
            causal: true,
            sm_scale: 1.0 / (dh as f32).sqrt(),
            block_q: c.seq,
            block_k: c.seq,
            window: None,
            softcap: None,
            dropout: c.moe.as_ref().map(|m| m.attention_dropout),
        },
        swiglu: SwigluConfig {
            m: rows,
            n: c.ffn,
            k: c.d_model,
            bm: rows.min(64),
            bn: c.ffn.min(128),
            bk: c.d_model.min(128),
            dtype: DType::F32,
        },
    }
}

/// The mean next-token cross-entropy of `batch` under `params` (in the
/// order of [`param_shapes`]), recorded.
pub fn loss(c: &LmConfig, params: &[Tensor], batch: &Batch) -> Result<Tensor, RuntimeError> {
    let k = kernels(c);
    let (b, s, d, h) = (c.batch, c.seq, c.d_model, c.heads);
    let dh = d / h;
    let rows = b * s;
    let mut it = params.iter();
    let mut next = || {
        it.next()
            .ok_or_else(|| RuntimeError::Internal("too few parameters".into()))
    };
    let (embed, pos) = (next()?, next()?);
    let pos_rows = pos
        .broadcast_in_dim(&[b, s, d], &[1, 2])?
        .reshape(&[rows, d])?;
    let mut x = batch.inputs.matmul(embed)?.add(&pos_rows)?;
    for _ in 0..c.layers {
        let (n1, wq, wk, wv, wo) = (next()?, next()?, next()?, next()?, next()?);
        let a = call_rms_norm(&k.norm, &x, n1)?;
        let heads = |w: &Tensor| -> Result<Tensor, RuntimeError> {
            a.matmul(w)?
                .reshape(&[b, s, h, dh])?
                .transpose(&[0, 2, 1, 3])
        };
        let (q, kk, v) = (heads(wq)?, heads(wk)?, heads(wv)?);
        let [o, _] = match &c.moe {
            None => call_flash_attention(&k.attention, &q, &kk, &v)?,
            Some(_) => {
                let sinks = next()?;
                call_flash_attention_dropout(
                    &k.attention,
                    &batch.dropout_key,
                    [&q, &kk, &v],
                    Some(sinks),
                )?
            }
        };
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[rows, d])?;
        x = x.add(&o.matmul(wo)?)?;
        let m = call_rms_norm(&k.norm, &x, next()?)?;
        let f = match &c.moe {
            None => {
                let (wg, wu, wd) = (next()?, next()?, next()?);
                call_swiglu(&k.swiglu, &m, wg, wu)?.matmul(wd)?
            }
            Some(moe) => {
                let (router, wg, wu, wd) = (next()?, next()?, next()?, next()?);
                experts(moe, &m, [router, wg, wu, wd])?
            }
        };
        x = x.add(&f)?;
    }
    let (nf, unembed) = (next()?, next()?);
    let last = call_rms_norm(&k.norm, &x, nf)?;
    let per_row = if c.moe.is_some() {
        // Fused: the [rows, vocab] logits never exist; ignored labels
        // (−100) give 0.
        let cfg = LinearCrossEntropyConfig {
            n: rows,
            d,
            v: c.vocab,
            bn: rows.min(64),
            bv: c.vocab.min(256),
            dtype: DType::F32,
        };
        call_linear_cross_entropy(&cfg, &last, unembed, &batch.labels)?
            .0
            .reshape(&[rows])?
    } else {
        let logits = last.matmul(unembed)?;
        // Cross-entropy through a stable log-sum-exp; the shift cancels, so
        // it carries no gradient.
        let shift = logits.max(&[1])?.detach()?;
        let z = logits.sub(&shift.broadcast_in_dim(&[rows, c.vocab], &[0])?)?;
        let lse = z.exp()?.sum(&[1])?.log()?;
        let picked = z.mul(&batch.targets)?.sum(&[1])?;
        lse.sub(&picked)?.mul(&batch.mask)?
    };
    per_row.sum(&[0])?.scale(1.0 / batch.counted.max(1) as f64)
}

/// The mixture of SwiGLU experts on `m[rows, d]`: each row routed to its
/// top-k experts, their outputs summed with the router's (renormalized)
/// weights.
fn experts(
    c: &MoeConfig,
    m: &Tensor,
    [router, wg, wu, wd]: [&Tensor; 4],
) -> Result<Tensor, RuntimeError> {
    let [rows, d] = [m.shape()[0], m.shape()[1]];
    let (e, k, f) = (c.experts, c.top_k, c.expert_ffn);
    let n = rows * k;
    let (weights, ids) = call_router_top_k(&m.matmul(router)?, k, true)?;
    let bm = n.min(128);
    let r = route(&ids, e, bm)?;
    let xs = call_moe_permute(&r.pos, &m.reshape(&[rows, 1, d])?, k)?.reshape(&[n, d])?;
    let gmm = |x: &Tensor, w: &Tensor, (kk, nn): (usize, usize)| {
        let cfg = GroupedMatmulConfig {
            m: n,
            k: kk,
            n: nn,
            e,
            bm,
            bk: kk.min(128),
            bn: nn.min(128),
            transpose_rhs: false,
            dtype: DType::F32,
            out_dtype: DType::F32,
        };
        call_grouped_matmul(&cfg, &r.schedule, x, w)
    };
    let (gate, up) = (gmm(&xs, wg, (d, f))?, gmm(&xs, wu, (d, f))?);
    let act = gate.mul(&gate.logistic()?)?.mul(&up)?;
    let ys = gmm(&act, wd, (f, d))?.reshape(&[n, 1, d])?;
    call_moe_unpermute(&r.pos, &ys, &weights.reshape(&[rows, 1, k])?)?.reshape(&[rows, d])
}
