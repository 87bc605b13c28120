//! The gated delta rule (Gated DeltaNet, the linear attention of hybrid
//! models such as Qwen3-Next), forward, in its chunked form.
//!
//! Per batch and head, a state `S: [dk, dv]` runs over the tokens: with
//! decay `α_t = exp(g_t)` and write strength `β_t`,
//!
//! `S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `o_t = S_tᵀ (scale · q_t)`.
//!
//! The kernel walks chunks of `c` tokens (grid `(b, h, chunks)`, the chunk
//! axis sequential, `S` in f32 scratch) and does each chunk with matrix
//! products, as the chunked algorithm of the Gated DeltaNet paper and
//! fla-org's kernels do: with `γ_r` the chunk's running log decay, the
//! delta rule's triangular system `(I − L)` (`L = −tril(β K Kᵀ ⊙ e^{γ_i −
//! γ_j}, −1)`) is inverted as the product `(I + L)(I + L²)(I + L⁴)…` (L is
//! nilpotent; ⌈log₂ c⌉ squarings, all on the matrix unit), which gives the
//! WY factors `W = T (β K ⊙ e^γ)`, `U = T (β V)`; then `V' = U − W S`,
//! `O = (Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ) V'` and `S ← e^{γ_c} S + (K ⊙ e^{γ_c −
//! γ})ᵀ V'`. Tokens past the end of a ragged last chunk get `k = v = q =
//! 0`, `β = 0`, `g = 0`: they leave `S` as it is. The final state is an
//! output, for decoding on from it.
//!
//! The reference ([`reference()`]) runs the recurrence token by token in f64.
//! The backward and the causal conv1d fused in front of it (tokamax's
//! `CausalConv1dGatedDeltaRule`) are not here yet; `crate::conv1d` is the
//! conv1d on its own.

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param, uniform_inputs,
};
use crate::tolerance::Tolerance;

/// The chunked gated delta rule forward: `o[b, h, t, dv]` and the final
/// state `state[b, h, dk, dv]` (f32) from `q, k: [b, h, t, dk]`, `v: [b, h,
/// t, dv]` and per token `g` (log decay, ≤ 0) and `beta`, each `[b, h, t,
/// 1]` f32.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(t, c)),
    semantics = (parallel, parallel, arbitrary)
)]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule<T: Float>(
    c: usize,
    scale: f32,
    #[shape(b, h, t, dk)]
    #[block([1, 1, c, dk], |bi, hi, i| (bi, hi, i, 0))]
    q: In<T>,
    #[shape(b, h, t, dk)]
    #[block([1, 1, c, dk], |bi, hi, i| (bi, hi, i, 0))]
    k: In<T>,
    #[shape(b, h, t, dv)]
    #[block([1, 1, c, dv], |bi, hi, i| (bi, hi, i, 0))]
    v: In<T>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, i, 0))]
    g: In<f32>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, i, 0))]
    beta: In<f32>,
    #[shape(b, h, t, dv)]
    #[block([1, 1, c, dv], |bi, hi, i| (bi, hi, i, 0))]
    o: Out<T>,
    #[shape(b, h, dk, dv)]
    #[block([1, 1, dk, dv], |bi, hi, _| (bi, hi, 0, 0))]
    state: Out<f32>,
    #[shape(dk, dv)] s: Scratch<f32>,
) {
    let i = program_id(2);
    if i == 0 {
        s.store(.., 0.0);
    }
    // Rows past the sequence: zero, so they change nothing.
    let real = iota(I32, [c, 1], 0) + i * (c as i32) < t as i32;
    let (qb, kb, vb) = (
        chunk_rows(q, real) * scale,
        chunk_rows(k, real),
        chunk_rows(v, real),
    );
    let (gb, bb) = (chunk_rows(g, real), chunk_rows(beta, real));
    // γ: the running log decay within the chunk; Γ[i, j] = e^{γ_i − γ_j}
    // on and below the diagonal.
    let gamma = gb.cumsum(0);
    let (row, col) = (iota(I32, [c, c], 0), iota(I32, [c, c], 1));
    let across = gamma.broadcast_to([c, c]);
    let decay = select(row >= col, (across - across.t()).exp(), 0.0);
    let kbeta = kb * bb;
    let l = select(row > col, -(dot(kbeta, kb.t()) * decay), 0.0);
    let eye = select(row == col, 1.0, 0.0);
    let mut inverse = eye + l;
    let mut power = l;
    // ⌈log₂ c⌉ factors in all (L^c = 0).
    let factors = (usize::BITS - c.saturating_sub(1).leading_zeros()) as usize;
    #[unroll]
    for _ in 1..factors {
        power = dot(power, power);
        inverse = dot(inverse, eye + power);
    }
    let w = dot(inverse, kbeta * gamma.exp());
    let u = dot(inverse, vb * bb);
    let st = s.load(..);
    let fresh = u - dot(w, st);
    let attn = select(row >= col, dot(qb, kb.t()) * decay, 0.0);
    let out = dot(qb * gamma.exp(), st) + dot(attn, fresh);
    o.store((0, 0, .., ..), out.cast::<T>());
    let last = select(iota(I32, [c, 1], 0) == (c as i32) - 1, gamma, 0.0).sum_keep(0);
    let carried = (kb * (last - gamma).exp()).t();
    s.store(.., st * last.exp() + dot(carried, fresh));
    if i == num_programs(2) - 1 {
        state.store((0, 0, .., ..), s.load(..));
    }
}

/// The chunk's rows of `r` in f32, those past the sequence zero.
#[kernel_fn]
fn chunk_rows(r: Ref, real: Tile) -> Tile {
    select(real, r.load((0, 0, .., ..)).convert(F32), 0.0)
}

/// The f64 reference: the recurrence token by token, from the definition
/// in the module docs. Returns `o` (`[b, h, t, dv]`) and the final state
/// (`[b, h, dk, dv]`).
pub fn reference(a: &[Array], scale: f64) -> (Vec<f64>, Vec<f64>) {
    let [b, h, t, dk] = [
        a[0].shape()[0],
        a[0].shape()[1],
        a[0].shape()[2],
        a[0].shape()[3],
    ];
    let dv = a[2].shape()[3];
    let (q, k, v, g, beta) = (
        a[0].data(),
        a[1].data(),
        a[2].data(),
        a[3].data(),
        a[4].data(),
    );
    let (mut o, mut states) = (vec![0.0; b * h * t * dv], Vec::new());
    for bh in 0..b * h {
        let mut s = vec![0.0; dk * dv];
        for tok in 0..t {
            let row = bh * t + tok;
            let (qr, kr, vr) = (
                &q[row * dk..(row + 1) * dk],
                &k[row * dk..(row + 1) * dk],
                &v[row * dv..(row + 1) * dv],
            );
            let (alpha, bt) = (g[row].exp(), beta[row]);
            // S ← α (S − β k (kᵀ S)) + β k vᵀ
            let kts: Vec<f64> = (0..dv)
                .map(|j| (0..dk).map(|i| kr[i] * s[i * dv + j]).sum())
                .collect();
            for i in 0..dk {
                for j in 0..dv {
                    let x = &mut s[i * dv + j];
                    *x = alpha * (*x - bt * kr[i] * kts[j]) + bt * kr[i] * vr[j];
                }
            }
            for j in 0..dv {
                o[row * dv + j] = (0..dk).map(|i| s[i * dv + j] * qr[i] * scale).sum();
            }
        }
        states.extend(s);
    }
    (o, states)
}

/// Inputs as a trained model feeds them: q and k with unit-norm rows (the
/// models normalize them), decays `g` in `[−0.5, 0]`, `beta` in `(0, 1)`.
fn sample(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    for x in v.iter_mut().take(2) {
        let d = x.shape()[3];
        let data: Vec<f64> = x
            .data()
            .chunks(d)
            .flat_map(|r| {
                let n = r.iter().map(|e| e * e).sum::<f64>().sqrt().max(1e-6);
                r.iter().map(move |e| e / n).collect::<Vec<_>>()
            })
            .collect();
        *x = Array::new(x.dtype(), x.shape().to_vec(), data)
            .unwrap_or_else(|_| Array::zeros(x.dtype(), x.shape().to_vec()));
    }
    if let [.., g, beta] = v.as_mut_slice() {
        *g = Array::random(DType::F32, g.shape().to_vec(), seed + 10, -0.5, 0.0);
        *beta = Array::random(DType::F32, beta.shape().to_vec(), seed + 11, 0.05, 0.95);
    }
    v
}

/// [`gated_delta_rule`](mod@gated_delta_rule) in the library.
pub const GATED_DELTA_RULE: Entry = Entry {
    name: "gated_delta_rule",
    fixed_inputs: None,
    backward: None,
    about: "chunked gated delta rule (Gated DeltaNet) forward: the delta rule's triangular system inverted by squarings on the MXU, the state carried across chunks; outputs o and the final state",
    params: &[
        DTYPE,
        param(
            "chunk",
            ParamKind::Positive,
            "64",
            "tokens per chunk (built for a GPU: 16 unless given)",
        ),
        param(
            "scale",
            ParamKind::Scale,
            "auto",
            "query scale; auto = 1/sqrt(dk)",
        ),
    ],
    inputs: |_| {
        let (b, h, t, d) = (1, 2, 256, 128);
        Ok(vec![
            ("q", vec![b, h, t, d]),
            ("k", vec![b, h, t, d]),
            ("v", vec![b, h, t, d]),
            ("g", vec![b, h, t, 1]),
            ("beta", vec![b, h, t, 1]),
        ])
    },
    build: |c, s| {
        let [b, h, t, dk] = dims(&s[0], "q")?;
        let [_, _, _, dv] = dims(&s[2], "v")?;
        let want = [
            vec![b, h, t, dk],
            vec![b, h, t, dk],
            vec![b, h, t, dv],
            vec![b, h, t, 1],
            vec![b, h, t, 1],
        ];
        if s != want.as_slice() {
            return Err(EntryError::Shape(format!(
                "q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}: give q and k as [b, h, t, dk], v as [b, h, t, dv], g and beta as [b, h, t, 1]",
                s[0], s[1], s[2], s[3], s[4]
            )));
        }
        // A GPU program holds the chunk's [c, c] matrices and the f32
        // state at once: chunks of 16 launch on every target (64 needs
        // 256 KiB of shared memory on sm_90, 32 80 KiB on gfx942).
        let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
        let chunk = if gpu && !c.is_given("chunk") {
            16
        } else {
            c.usize("chunk")?
        };
        Ok(gated_delta_rule::build_for(
            c.dtype("dtype")?,
            chunk.min(t),
            c.scale("scale", dk)?,
            gated_delta_rule::Dims { b, h, t, dk, dv },
        )?)
    },
    reference: |c, a| {
        let (o, state) = reference(a, f64::from(c.scale("scale", a[0].shape()[3])?));
        Ok(vec![o, state])
    },
    check: no_check,
    tolerance: |c, _| {
        let d = c.dtype("dtype").unwrap_or(DType::F32);
        let t = match d {
            DType::F32 => Tolerance {
                abs: 1e-4,
                rel: 1e-3,
            },
            d => Tolerance::for_dtype(d),
        };
        vec![t, t]
    },
    sample,
    presets: &[Preset {
        name: "gated_delta_rule_bf16",
        about: "chunked gated delta rule, bf16, 2 heads of dk = dv = 128, 200 tokens in chunks of 64 (ragged last chunk)",
        config: &[("dtype", "bf16")],
        shapes: &[
            ("q", &[1, 2, 200, 128]),
            ("k", &[1, 2, 200, 128]),
            ("v", &[1, 2, 200, 128]),
            ("g", &[1, 2, 200, 1]),
            ("beta", &[1, 2, 200, 1]),
        ],
    }],
};
