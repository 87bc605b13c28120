//! Reference ops: plain host code in f64, written for clarity, not speed.
//!
//! Inputs are [`Array`]s (whose values the kernel also sees); outputs are
//! row-major f64 vectors, compared against kernel outputs with
//! [`crate::check::ErrorStats`].

use kernel_ir::{Array, DType};

/// `x + y`.
pub fn add(x: &Array, y: &Array) -> Vec<f64> {
    x.data().iter().zip(y.data()).map(|(a, b)| a + b).collect()
}

/// `x[m, k] · y[k, n]`.
pub fn matmul(x: &Array, y: &Array) -> Vec<f64> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    matmul_rows(x.data(), y.data(), m, k, y.shape()[1])
}

/// `a[m, k] · b[k, n]` over row-major slices.
pub fn matmul_rows(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
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

/// Softmax of one row and its logsumexp.
pub fn softmax_lse(s: &[f64]) -> (Vec<f64>, f64) {
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
    let total: f64 = e.iter().sum();
    (e.into_iter().map(|v| v / total).collect(), m + total.ln())
}

/// Softmax of each row of a `[rows, cols]` array.
pub fn softmax_rows(x: &Array) -> Vec<f64> {
    let cols = *x.shape().last().unwrap_or(&1);
    x.data()
        .chunks(cols.max(1))
        .flat_map(|row| softmax_lse(row).0)
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

/// What [`attention_full`] computes: the options of
/// [`crate::attention::AttnConfig`] plus a valid key length.
#[derive(Clone, Debug, PartialEq)]
pub struct AttnSpec {
    /// Key `j` visible to query `i` only when `j ≤ i`.
    pub causal: bool,
    /// Score scale.
    pub scale: f64,
    /// Keys more than `window − 1` positions away are hidden.
    pub window: Option<usize>,
    /// Scores become `cap · tanh(s / cap)`.
    pub softcap: Option<f64>,
    /// Only the first `kv_len` keys exist.
    pub kv_len: Option<usize>,
}

impl AttnSpec {
    /// Plain attention with `scale`, causal or not.
    pub fn new(causal: bool, scale: f64) -> AttnSpec {
        AttnSpec {
            causal,
            scale,
            window: None,
            softcap: None,
            kv_len: None,
        }
    }

    /// Whether key `j` is visible to query `i`.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        let (i, j) = (i as i64, j as i64);
        (!self.causal || j <= i)
            && self.window.is_none_or(|w| {
                let w = w as i64;
                if self.causal {
                    i - j < w
                } else {
                    (i - j).abs() < w
                }
            })
            && self.kv_len.is_none_or(|n| j < n as i64)
    }

    fn scoring<'a>(&self, visible: &'a dyn Fn(usize, usize, usize, usize) -> bool) -> Scoring<'a> {
        Scoring {
            scale: self.scale,
            softcap: self.softcap,
            visible,
        }
    }
}

/// Attention over `[b, h, sq, d]` queries and `[b, hkv, skv, d]` keys and
/// values (query head `i` uses kv head `i / (h / hkv)`): returns the output
/// `[b, h, sq, d]` and the row logsumexp `[b, h, sq, 1]` of the scores. A
/// row with no visible key gets output 0 and logsumexp −∞.
pub fn attention_full(q: &Array, k: &Array, v: &Array, spec: &AttnSpec) -> (Vec<f64>, Vec<f64>) {
    forward(q, k, v, &spec.scoring(&|_, _, i, j| spec.visible(i, j)))
}

/// [`attention_full`] with each probability times `weight(batch, head,
/// query, key)` where it weighs the values (dropout's `keep / (1 −
/// rate)`); the logsumexp is the softmax's, over every visible key.
pub fn attention_weighted(
    q: &Array,
    k: &Array,
    v: &Array,
    spec: &AttnSpec,
    weight: &dyn Fn(usize, usize, usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let [b, h, sq, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let mut out = vec![0.0; b * h * sq * d];
    let mut lse = vec![f64::NEG_INFINITY; b * h * sq];
    let visible = |_, _, i, j| spec.visible(i, j);
    let sc = spec.scoring(&visible);
    for_each_query_row(q, k, &sc, |mut r| {
        let (bh, i) = (r.row / sq, r.row % sq);
        for (p, &j) in r.probs.iter_mut().zip(&r.keys) {
            *p *= weight(bh / h, bh % h, i, j);
        }
        out[r.q_at..r.q_at + d].copy_from_slice(&r.output(v.data(), d));
        lse[r.row] = r.lse;
    });
    (out, lse)
}

fn forward(q: &Array, k: &Array, v: &Array, sc: &Scoring<'_>) -> (Vec<f64>, Vec<f64>) {
    let [b, h, sq, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let mut out = vec![0.0; b * h * sq * d];
    let mut lse = vec![f64::NEG_INFINITY; b * h * sq];
    for_each_query_row(q, k, sc, |r| {
        out[r.q_at..r.q_at + d].copy_from_slice(&r.output(v.data(), d));
        lse[r.row] = r.lse;
    });
    (out, lse)
}

/// One query row that sees at least one key, as the attention references
/// visit it.
struct QueryRow {
    /// Index of the row in `[b, h, sq]`.
    row: usize,
    /// Offset of the row in q (and in o, dO, dq).
    q_at: usize,
    /// Offset of its kv head in k and v (and dk, dv).
    kv_at: usize,
    /// The keys it sees, ascending.
    keys: Vec<usize>,
    /// `q·k · scale` per visible key, before the soft-cap.
    scaled: Vec<f64>,
    /// Softmax of the capped scores.
    probs: Vec<f64>,
    /// Logsumexp of the capped scores.
    lse: f64,
}

impl QueryRow {
    /// The row's output `Σ_j p_j · v_j` from v's data.
    fn output(&self, vd: &[f64], d: usize) -> Vec<f64> {
        (0..d)
            .map(|t| {
                self.keys
                    .iter()
                    .zip(&self.probs)
                    .map(|(&j, p)| p * vd[self.kv_at + j * d + t])
                    .sum()
            })
            .collect()
    }
}

/// How scores are formed and who sees whom: `visible(batch, head, query,
/// key)`, then `scale · q·k`, then the soft-cap.
struct Scoring<'a> {
    scale: f64,
    softcap: Option<f64>,
    visible: &'a dyn Fn(usize, usize, usize, usize) -> bool,
}

impl Scoring<'_> {
    fn cap(&self, s: f64) -> f64 {
        match self.softcap {
            Some(c) => c * (s / c).tanh(),
            None => s,
        }
    }
}

/// Calls `visit` for every query row of `q: [b, h, sq, d]` against
/// `k: [b, hkv, skv, d]` that sees at least one key under `sc`.
fn for_each_query_row(q: &Array, k: &Array, sc: &Scoring<'_>, mut visit: impl FnMut(QueryRow)) {
    let [b, h, sq, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (hkv, skv) = (k.shape()[1], k.shape()[2]);
    let group = h / hkv.max(1);
    let (qd, kd) = (q.data(), k.data());
    for bi in 0..b {
        for hi in 0..h {
            let kv_at = (bi * hkv + hi / group) * skv * d;
            for i in 0..sq {
                let keys: Vec<usize> = (0..skv).filter(|&j| (sc.visible)(bi, hi, i, j)).collect();
                if keys.is_empty() {
                    continue;
                }
                let row = (bi * h + hi) * sq + i;
                let q_at = row * d;
                let scaled: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..d)
                            .map(|t| qd[q_at + t] * kd[kv_at + j * d + t])
                            .sum::<f64>()
                            * sc.scale
                    })
                    .collect();
                let capped: Vec<f64> = scaled.iter().map(|&z| sc.cap(z)).collect();
                let (probs, lse) = softmax_lse(&capped);
                visit(QueryRow {
                    row,
                    q_at,
                    kv_at,
                    keys,
                    scaled,
                    probs,
                    lse,
                });
            }
        }
    }
}

/// Attention over `[b, h, s, d]` arrays: `softmax(q·kᵀ·scale)·v`, causal
/// meaning key `j` is visible to query `i` only when `j ≤ i`.
pub fn attention(q: &Array, k: &Array, v: &Array, causal: bool, scale: f64) -> Vec<f64> {
    attention_full(q, k, v, &AttnSpec::new(causal, scale)).0
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
    let spec = AttnSpec {
        kv_len: Some(kv_len),
        ..AttnSpec::new(causal, scale)
    };
    attention_full(q, k, v, &spec).0
}

/// Gradients of [`attention_full`]'s output with respect to `q`, `k` and
/// `v`, given the output gradient `d_o` (`[b, h, sq, d]`): returns
/// `(dq, dk, dv)` in the shapes of `q`, `k`, `v` (kv-head gradients summed
/// over the query heads that share them).
pub fn attention_backward(
    q: &Array,
    k: &Array,
    v: &Array,
    d_o: &Array,
    spec: &AttnSpec,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    backward(
        q,
        k,
        v,
        d_o,
        &spec.scoring(&|_, _, i, j| spec.visible(i, j)),
    )
}

fn backward(
    q: &Array,
    k: &Array,
    v: &Array,
    d_o: &Array,
    sc: &Scoring<'_>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = q.shape()[3];
    let (qd, kd, vd, gd) = (q.data(), k.data(), v.data(), d_o.data());
    let mut dq = vec![0.0; qd.len()];
    let mut dk = vec![0.0; kd.len()];
    let mut dv = vec![0.0; vd.len()];
    for_each_query_row(q, k, sc, |r| {
        let (qa, ka, p) = (r.q_at, r.kv_at, &r.probs);
        let g = &gd[qa..qa + d];
        let delta: f64 = g.iter().zip(r.output(vd, d)).map(|(a, b)| a * b).sum();
        for (n, &j) in r.keys.iter().enumerate() {
            let dp: f64 = (0..d).map(|t| g[t] * vd[ka + j * d + t]).sum();
            let mut dz = p[n] * (dp - delta);
            if let Some(c) = sc.softcap {
                let t = (r.scaled[n] / c).tanh();
                dz *= 1.0 - t * t;
            }
            for t in 0..d {
                dq[qa + t] += sc.scale * dz * kd[ka + j * d + t];
                dk[ka + j * d + t] += sc.scale * dz * qd[qa + t];
                dv[ka + j * d + t] += p[n] * g[t];
            }
        }
    });
    (dq, dk, dv)
}

/// What [`masked_attention`] computes: a mask per query head, segment
/// ids (a query sees only keys of its own segment), the score scale and
/// the soft-cap.
#[derive(Clone, Copy)]
pub struct MaskedSpec<'a> {
    /// The mask: whether query head `h`'s query `i` sees key `j`
    /// (`|h, i, j| m.heads[h].visible(i, j)` of a
    /// `attention::mask::MultiHeadMask`).
    pub mask: &'a dyn Fn(usize, usize, usize) -> bool,
    /// `[b, sq]` segment id of each query.
    pub q_seg: &'a [i32],
    /// `[b, skv]` segment id of each key.
    pub kv_seg: &'a [i32],
    /// Score scale.
    pub scale: f64,
    /// Scores become `cap · tanh(s / cap)`.
    pub softcap: Option<f64>,
}

impl MaskedSpec<'_> {
    /// Whether key `j` of batch `b` is visible to query `i` of head `h`,
    /// for `sq` queries and `skv` keys per batch.
    pub fn visible(
        &self,
        (sq, skv): (usize, usize),
        b: usize,
        h: usize,
        i: usize,
        j: usize,
    ) -> bool {
        self.q_seg[b * sq + i] == self.kv_seg[b * skv + j] && (self.mask)(h, i, j)
    }

    fn with<R>(&self, q: &Array, k: &Array, f: impl FnOnce(&Scoring<'_>) -> R) -> R {
        let sizes = (q.shape()[2], k.shape()[2]);
        let visible = |b, h, i, j| self.visible(sizes, b, h, i, j);
        f(&Scoring {
            scale: self.scale,
            softcap: self.softcap,
            visible: &visible,
        })
    }
}

/// Attention with a mask per head and segment ids ([`MaskedSpec`]) over
/// `[b, h, sq, d]` queries and `[b, hkv, skv, d]` keys and values: the
/// output and the row logsumexp `[b, h, sq, 1]`; a row with no visible key
/// gets 0 and −∞.
pub fn masked_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    spec: &MaskedSpec<'_>,
) -> (Vec<f64>, Vec<f64>) {
    spec.with(q, k, |sc| forward(q, k, v, sc))
}

/// Gradients of [`masked_attention`]'s output for the output gradient
/// `d_o`: `(dq, dk, dv)` (kv-head gradients summed over their query heads).
pub fn masked_attention_backward(
    q: &Array,
    k: &Array,
    v: &Array,
    d_o: &Array,
    spec: &MaskedSpec<'_>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    spec.with(q, k, |sc| backward(q, k, v, d_o, sc))
}

/// `rowsum(dO ∘ O)` over `[b, h, sq, d]` arrays, `[b, h, sq, 1]`.
pub fn attention_delta(o: &[f64], d_o: &Array) -> Vec<f64> {
    let d = *d_o.shape().last().unwrap_or(&1);
    o.chunks(d)
        .zip(d_o.data().chunks(d))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect()
}

/// Decode attention over a paged KV cache: `q: [b, hkv, g, d]` (one token,
/// `g` query heads per kv head), `k_pages, v_pages: [hkv, pages, page, d]`;
/// sequence `i` has `lengths[i]` tokens stored in pool pages
/// `tables[i][0], tables[i][1], …`. Returns `[b, hkv, g, d]`.
pub fn paged_decode_attention(
    q: &Array,
    k_pages: &Array,
    v_pages: &Array,
    lengths: &[usize],
    tables: &[Vec<usize>],
    scale: f64,
) -> Vec<f64> {
    let [b, hkv, g, d] = [q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]];
    let (pages, page) = (k_pages.shape()[1], k_pages.shape()[2]);
    let (qd, kd, vd) = (q.data(), k_pages.data(), v_pages.data());
    let mut out = vec![0.0; qd.len()];
    for bi in 0..b {
        for hk in 0..hkv {
            // Offsets of this sequence's tokens in the pools.
            let slots: Vec<usize> = (0..lengths[bi])
                .map(|t| ((hk * pages + tables[bi][t / page]) * page + t % page) * d)
                .collect();
            for gi in 0..g {
                let qo = ((bi * hkv + hk) * g + gi) * d;
                let s: Vec<f64> = slots
                    .iter()
                    .map(|&o| (0..d).map(|t| qd[qo + t] * kd[o + t]).sum::<f64>() * scale)
                    .collect();
                let (p, _) = softmax_lse(&s);
                for t in 0..d {
                    out[qo + t] = slots.iter().zip(&p).map(|(&o, w)| w * vd[o + t]).sum();
                }
            }
        }
    }
    out
}

/// RMS norm of each row of `x: [rows, cols]`: `x / sqrt(mean(x²) + eps) · γ`.
pub fn rms_norm(x: &Array, gamma: &Array, eps: f64) -> Vec<f64> {
    let cols = x.shape()[1];
    x.data()
        .chunks(cols)
        .flat_map(|row| {
            let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
            row.iter()
                .zip(gamma.data())
                .map(move |(v, g)| v * r * g)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Gradients of [`rms_norm`] given `dy`: `(dx, dgamma)`.
pub fn rms_norm_bwd(x: &Array, gamma: &Array, dy: &Array, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let cols = x.shape()[1];
    let g = gamma.data();
    let mut dx = Vec::with_capacity(x.len());
    let mut dgamma = vec![0.0; cols];
    for (row, dyr) in x.data().chunks(cols).zip(dy.data().chunks(cols)) {
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / cols as f64 + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| v * r).collect();
        let dyg: Vec<f64> = dyr.iter().zip(g).map(|(a, b)| a * b).collect();
        let mean_dot = dyg.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / cols as f64;
        for j in 0..cols {
            dx.push(r * (dyg[j] - xhat[j] * mean_dot));
            dgamma[j] += dyr[j] * xhat[j];
        }
    }
    (dx, dgamma)
}

/// Gradients of [`layer_norm`] given `dy`: `(dx, dgamma, dbeta)`.
pub fn layer_norm_bwd(
    x: &Array,
    gamma: &Array,
    dy: &Array,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let cols = x.shape()[1];
    let n = cols as f64;
    let g = gamma.data();
    let mut dx = Vec::with_capacity(x.len());
    let (mut dgamma, mut dbeta) = (vec![0.0; cols], vec![0.0; cols]);
    for (row, dyr) in x.data().chunks(cols).zip(dy.data().chunks(cols)) {
        let mean = row.iter().sum::<f64>() / n;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
        let r = 1.0 / (var + eps).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * r).collect();
        let dyg: Vec<f64> = dyr.iter().zip(g).map(|(a, b)| a * b).collect();
        let mean_dyg = dyg.iter().sum::<f64>() / n;
        let mean_dot = dyg.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / n;
        for j in 0..cols {
            dx.push(r * (dyg[j] - mean_dyg - xhat[j] * mean_dot));
            dgamma[j] += dyr[j] * xhat[j];
            dbeta[j] += dyr[j];
        }
    }
    (dx, dgamma, dbeta)
}

/// `act(x·w + bias) [+ residual]` for `x: [m, k]`, `w: [k, n]`,
/// `bias: [1, n]`; `act` is `"gelu"` (exact), `"silu"` or identity.
pub fn matmul_epilogue(
    x: &Array,
    w: &Array,
    bias: &Array,
    act: &str,
    residual: Option<&Array>,
) -> Vec<f64> {
    epilogue(matmul(x, w), w.shape()[1], bias, act, residual)
}

/// `act(y + bias) [+ residual]` over a row-major `y` with `n` columns
/// (the tail of [`matmul_epilogue`], shared by GEMMs whose product is
/// formed differently, e.g. scaled FP8).
pub fn epilogue(
    y: Vec<f64>,
    n: usize,
    bias: &Array,
    act: &str,
    residual: Option<&Array>,
) -> Vec<f64> {
    y.into_iter()
        .enumerate()
        .map(|(i, v)| {
            let y = v + bias.data()[i % n];
            let a = match act {
                "gelu" => 0.5 * y * (1.0 + libm::erf(y / std::f64::consts::SQRT_2)),
                "silu" => y / (1.0 + (-y).exp()),
                _ => y,
            };
            a + residual.map_or(0.0, |r| r.data()[i])
        })
        .collect()
}

/// Rotary embedding of `x: [b, h, s, d]` with `[s, d/2]` tables.
pub fn rope(x: &Array, cos: &Array, sin: &Array) -> Vec<f64> {
    let [s, d] = [x.shape()[2], x.shape()[3]];
    let half = d / 2;
    let mut out = vec![0.0; x.len()];
    for (r, row) in x.data().chunks(d).enumerate() {
        let p = r % s;
        for i in 0..half {
            let (c, sn) = (cos.data()[p * half + i], sin.data()[p * half + i]);
            let (a, b) = (row[i], row[i + half]);
            out[r * d + i] = a * c - b * sn;
            out[r * d + i + half] = b * c + a * sn;
        }
    }
    out
}

/// `silu(x·w_gate) ∘ (x·w_up)`.
pub fn swiglu(x: &Array, w_gate: &Array, w_up: &Array) -> Vec<f64> {
    matmul(x, w_gate)
        .into_iter()
        .zip(matmul(x, w_up))
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

/// Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers:
/// as easy as 1, 2, 3", SC 2011; the Random123 reference): the block
/// function of `key` on the counter `ctr`, in plain `u32` arithmetic.
pub fn threefry2x32(key: [u32; 2], ctr: [u32; 2]) -> [u32; 2] {
    const R: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
    let ks = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let (mut x0, mut x1) = (ctr[0].wrapping_add(ks[0]), ctr[1].wrapping_add(ks[1]));
    for round in 0..20 {
        x0 = x0.wrapping_add(x1);
        x1 = x1.rotate_left(R[round % 8]) ^ x0;
        if round % 4 == 3 {
            let s = round / 4 + 1;
            x0 = x0.wrapping_add(ks[s % 3]);
            x1 = x1.wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u32);
        }
    }
    [x0, x1]
}

/// `jax.random.fold_in(key, data)` for Threefry keys: the block function
/// on the counter `(0, data)`.
pub fn threefry_fold_in(key: [u32; 2], data: u32) -> [u32; 2] {
    threefry2x32(key, [0, data])
}

/// Element `index` of `jax.random.bits(key, shape, uint32)` for arrays of
/// fewer than 2³² elements (jax's partitionable Threefry: the counter is
/// the flat index's high and low words, the bits the xor of the outputs).
pub fn random_bits(key: [u32; 2], index: u32) -> u32 {
    let [a, b] = threefry2x32(key, [0, index]);
    a ^ b
}

/// Element `index` of `jax.random.uniform(key, shape)` (`f32`, `[0, 1)`):
/// the top 23 bits as the mantissa of a number in `[1, 2)`, minus 1.
pub fn uniform(key: [u32; 2], index: u32) -> f32 {
    f32::from_bits((random_bits(key, index) >> 9) | 0x3F80_0000) - 1.0
}

/// `x` rounded to `to` (a float type narrower than f32) stochastically
/// with the random word `r`, from the math: the two neighbours `lo`, `lo +
/// spacing` of `|x|` in `to`, up when `r`'s low bits (as many as the f32
/// pattern drops: `23 − mantissa`, more in `to`'s subnormal range) reach
/// `2^bits · (1 − fraction)`; below one spacing, up when the top 23 bits of
/// `r` as a fraction are below `|x| / spacing`. Magnitudes under 2⁻¹²⁶
/// give ±0; non-finite and out-of-range values round to nearest.
pub fn stochastic_round(x: f32, to: DType, r: u32) -> f64 {
    let (mantissa, emin) = match to {
        DType::BF16 => (7, -126),
        DType::F16 => (10, -14),
        DType::F8E4M3FN => (3, -6),
        DType::F8E5M2 => (2, -14),
        _ => return to.convert_from(DType::F32, f64::from(x)),
    };
    let a = f64::from(x.abs());
    if !x.is_finite() || a > to.max_finite() {
        return to.convert_from(DType::F32, f64::from(x));
    }
    if a < 2f64.powi(-126) {
        return 0.0f64.copysign(f64::from(x));
    }
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let spacing = 2f64.powi(e.max(emin) - mantissa);
    let lo = (a / spacing).floor() * spacing;
    let fraction = (a - lo) / spacing;
    let up = if e >= emin - mantissa {
        let bits = 23 - mantissa + (emin - e).max(0);
        let low = f64::from(r & ((1u32 << bits) - 1));
        low >= 2f64.powi(bits) * (1.0 - fraction)
    } else {
        f64::from(r >> 9) * 2f64.powi(-23) < a / spacing
    };
    let magnitude = if up { lo + spacing } else { lo };
    to.round(magnitude.copysign(f64::from(x)))
}
