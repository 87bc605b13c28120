//! The collectives in plain f64 over per-device arrays (index `d` is
//! device `d`'s array): what the ring kernels must produce.

use kernel_ir::Array;

use crate::reference::matmul_rows as matmul;

/// Every device's `[m, n]` rows, concatenated: `[devices * m, n]`.
pub fn all_gather(x: &[Array]) -> Vec<f64> {
    x.iter().flat_map(|a| a.data().iter().copied()).collect()
}

/// `all_gather(x) @ w`, `x[d]` being `[m, k]` and `w` `[k, n]`.
pub fn all_gather_matmul(x: &[Array], w: &Array) -> Vec<f64> {
    let g = all_gather(x);
    let (k, n) = (w.shape()[0], w.shape()[1]);
    matmul(&g, w.data(), g.len() / k.max(1), k, n)
}

/// Device `d`'s rows block of `Σ_e x[e] @ w[e]` (`x[e]` is
/// `[devices * m, k]`, `w[e]` `[k, n]`): `[m, n]` per device.
pub fn matmul_reduce_scatter(x: &[Array], w: &[Array]) -> Vec<Vec<f64>> {
    let devices = x.len();
    let (rows, k) = (x[0].shape()[0], x[0].shape()[1]);
    let n = w[0].shape()[1];
    let mut total = vec![0.0; rows * n];
    for (xe, we) in x.iter().zip(w) {
        for (t, p) in total
            .iter_mut()
            .zip(matmul(xe.data(), we.data(), rows, k, n))
        {
            *t += p;
        }
    }
    let m = rows / devices.max(1);
    (0..devices)
        .map(|d| total[d * m * n..(d + 1) * m * n].to_vec())
        .collect()
}

/// Per device, `softmax(scale · q kᵀ) v` over the keys of all devices and
/// each row's logsumexp: `(o [sq, d], lse [sq])`.
pub fn ring_attention(
    q: &[Array],
    k: &[Array],
    v: &[Array],
    scale: f64,
) -> Vec<(Vec<f64>, Vec<f64>)> {
    let keys: Vec<f64> = all_gather(k);
    let values: Vec<f64> = all_gather(v);
    let d = q[0].shape()[1];
    let total = keys.len() / d.max(1);
    q.iter()
        .map(|qd| {
            let sq = qd.shape()[0];
            let mut o = vec![0.0; sq * d];
            let mut lse = vec![0.0; sq];
            for i in 0..sq {
                let row = &qd.data()[i * d..(i + 1) * d];
                let s: Vec<f64> = (0..total)
                    .map(|j| {
                        scale
                            * row
                                .iter()
                                .zip(&keys[j * d..(j + 1) * d])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                    })
                    .collect();
                let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for c in 0..d {
                        o[i * d + c] += w / sum * values[j * d + c];
                    }
                }
                lse[i] = mx + sum.ln();
            }
            (o, lse)
        })
        .collect()
}

/// Per device `d`, `o[j] = x[j][d]` (`x[j]` is device `j`'s
/// `[devices, c, dim]`).
pub fn all_to_all(x: &[Array]) -> Vec<Vec<f64>> {
    let devices = x.len();
    let chunk = x.first().map_or(0, |a| a.len() / devices.max(1));
    (0..devices)
        .map(|d| {
            x.iter()
                .flat_map(|xj| xj.data()[d * chunk..(d + 1) * chunk].iter().copied())
                .collect()
        })
        .collect()
}

/// Per device: `(dq, dk, dv)` of [`ring_attention`] for the output
/// cotangents `do_[d]` (`[sq, dim]`; the `lse` output's cotangent is 0),
/// each `[rows, dim]` flat: `dq` of device `d`'s queries, `dk`, `dv` of
/// its keys and values (summed over every device's queries).
pub fn ring_attention_bwd(
    q: &[Array],
    k: &[Array],
    v: &[Array],
    do_: &[Array],
    scale: f64,
) -> Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let keys = all_gather(k);
    let values = all_gather(v);
    let d = q[0].shape()[1];
    let total = keys.len() / d.max(1);
    let mut dk_all = vec![0.0; keys.len()];
    let mut dv_all = vec![0.0; values.len()];
    let mut dqs = Vec::with_capacity(q.len());
    for (qd, dod) in q.iter().zip(do_) {
        let sq = qd.shape()[0];
        let mut dq = vec![0.0; sq * d];
        for i in 0..sq {
            let row = &qd.data()[i * d..(i + 1) * d];
            let drow = &dod.data()[i * d..(i + 1) * d];
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
            let s: Vec<f64> = (0..total)
                .map(|j| scale * dot(row, &keys[j * d..(j + 1) * d]))
                .collect();
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
            // o = p V, D = do · o.
            let mut o = vec![0.0; d];
            for (j, pj) in p.iter().enumerate() {
                for c in 0..d {
                    o[c] += pj * values[j * d + c];
                }
            }
            let delta = dot(drow, &o);
            for (j, pj) in p.iter().enumerate() {
                let dp = dot(drow, &values[j * d..(j + 1) * d]);
                let ds = pj * (dp - delta);
                for c in 0..d {
                    dq[i * d + c] += scale * ds * keys[j * d + c];
                    dk_all[j * d + c] += scale * ds * row[c];
                    dv_all[j * d + c] += pj * drow[c];
                }
            }
        }
        dqs.push(dq);
    }
    let mut out = Vec::with_capacity(q.len());
    let mut at = 0;
    for (dev, dq) in dqs.into_iter().enumerate() {
        let n = k[dev].len();
        out.push((dq, dk_all[at..at + n].to_vec(), dv_all[at..at + n].to_vec()));
        at += n;
    }
    out
}
