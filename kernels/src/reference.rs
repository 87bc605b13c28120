//! Reference ops: plain host code in f64, written for clarity, not speed.
//!
//! Inputs are [`Array`]s (whose values the kernel also sees); outputs are
//! row-major f64 vectors, compared against kernel outputs with
//! [`crate::check::ErrorStats`].

use kernel_ir::Array;

/// `x + y`.
pub fn add(x: &Array, y: &Array) -> Vec<f64> {
    x.data().iter().zip(y.data()).map(|(a, b)| a + b).collect()
}

/// `x[m, k] · y[k, n]`.
pub fn matmul(x: &Array, y: &Array) -> Vec<f64> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = y.shape()[1];
    let (a, b) = (x.data(), y.data());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += av * b[p * n + j];
            }
        }
    }
    out
}

/// Softmax of each row of a `[rows, cols]` array.
pub fn softmax_rows(x: &Array) -> Vec<f64> {
    let cols = *x.shape().last().unwrap_or(&1);
    x.data()
        .chunks(cols.max(1))
        .flat_map(|row| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

/// Layer norm of each row: `(x − mean) / sqrt(var + eps) · gamma + beta`.
pub fn layer_norm(x: &Array, gamma: &Array, beta: &Array, eps: f64) -> Vec<f64> {
    let cols = *x.shape().last().unwrap_or(&1);
    let (g, b) = (gamma.data(), beta.data());
    x.data()
        .chunks(cols.max(1))
        .flat_map(|row| {
            let n = row.len() as f64;
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let inv = 1.0 / (var + eps).sqrt();
            row.iter()
                .enumerate()
                .map(move |(j, v)| (v - mean) * inv * g[j] + b[j])
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Attention over `[b, h, s, d]` arrays: `softmax(q·kᵀ·scale)·v`, causal
/// meaning key `j` is visible to query `i` only when `j ≤ i`.
pub fn attention(q: &Array, k: &Array, v: &Array, causal: bool, scale: f64) -> Vec<f64> {
    attention_kv_len(q, k, v, causal, scale, k.shape()[2])
}

/// [`attention`] over only the first `kv_len` keys (`1 ≤ kv_len`).
pub fn attention_kv_len(
    q: &Array,
    k: &Array,
    v: &Array,
    causal: bool,
    scale: f64,
    kv_len: usize,
) -> Vec<f64> {
    let [b, h, sq, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let skv = k.shape()[2];
    let (qd, kd, vd) = (q.data(), k.data(), v.data());
    let mut out = vec![0.0; b * h * sq * d];
    for bh in 0..b * h {
        let (qo, ko) = (bh * sq * d, bh * skv * d);
        for i in 0..sq {
            let visible = if causal { (i + 1).min(skv) } else { skv }.min(kv_len);
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    (0..d)
                        .map(|t| qd[qo + i * d + t] * kd[ko + j * d + t])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = e.iter().sum();
            for t in 0..d {
                out[qo + i * d + t] = e
                    .iter()
                    .enumerate()
                    .map(|(j, w)| w * vd[ko + j * d + t])
                    .sum::<f64>()
                    / total;
            }
        }
    }
    out
}
