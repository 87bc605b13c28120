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
//! The backward (module `backward`: a states pass, then the chunks last to
//! first) is the entry's, so `graph::grad` and `tessera export` reach it.
//! The causal conv1d fused in front of it (tokamax's
//! `CausalConv1dGatedDeltaRule`) is not here yet; `crate::conv1d` is the
//! conv1d on its own.

mod backward;
#[cfg(feature = "graph")]
mod calls;
#[cfg(feature = "graph")]
mod composed;
mod fused;

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

pub use backward::{
    GATED_DELTA_RULE_BACKWARD, GATED_DELTA_RULE_STATES, backward_reference,
    gated_delta_rule_backward, gated_delta_rule_states, states_reference,
};
#[cfg(feature = "graph")]
pub use calls::{LayerInputs, call_causal_conv1d_gated_delta_rule, call_gated_delta_rule};
pub use fused::{
    CAUSAL_CONV1D_GATED_DELTA_RULE, causal_conv1d_gated_delta_rule, reference as fused_reference,
};

use crate::entry::{
    Config, DTYPE, Entry, Param, ParamKind, Preset, no_check, param, uniform_inputs,
};
use crate::tolerance::Tolerance;

/// What the forward and the states pass read at grid step `(bi, hi, i)`:
/// chunk `i` of each input.
#[operands]
pub(crate) struct Chunks<T> {
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
}

/// The chunked gated delta rule forward: `o[b, h, t, dv]` and the final
/// state `state[b, h, dk, dv]` (f32) from `q, k: [b, h, t, dk]`, `v: [b, h,
/// t, dv]` and per token `g` (log decay, ≤ 0) and `beta`, each `[b, h, t,
/// 1]` f32.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(t, c)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn gated_delta_rule<T: Float>(
    c: usize,
    scale: f32,
    #[operands] _: Chunks<T>,
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
    let x = chunk_terms(q, k, v, g, beta, i, c, t, scale);
    let st = s.load(..);
    let fresh = x.u - dot(x.w, st);
    o.store((0, 0, .., ..), chunk_output(&x, st, fresh).cast::<T>());
    s.store(.., next_state(&x, st, fresh));
    if i == num_programs(2) - 1 {
        state.store((0, 0, .., ..), s.load(..));
    }
}

/// One chunk's terms in f32, as the forward and the backward both need
/// them (the names of the module docs).
pub(crate) struct ChunkTerms {
    /// `scale · Q`, `K`, `V`, `β`: `[c, dk]`, `[c, dk]`, `[c, dv]`, `[c, 1]`.
    pub q: Tile,
    pub k: Tile,
    pub v: Tile,
    pub beta: Tile,
    /// `γ` and `e^γ`, `[c, 1]`; `γ_c`, `[1, 1]`.
    pub gamma: Tile,
    pub eg: Tile,
    pub last: Tile,
    /// `Γ` (zero above the diagonal), `Q Kᵀ ⊙ Γ`, `β K Kᵀ`, `[c, c]`.
    pub decay: Tile,
    pub attn: Tile,
    pub kk: Tile,
    /// `T = (I − L)⁻¹` and the WY factors `W`, `U`.
    pub inverse: Tile,
    pub w: Tile,
    pub u: Tile,
}

/// Chunk `chunk`'s terms: rows past the sequence zero, so they change
/// nothing.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_terms(
    q: Ref,
    k: Ref,
    v: Ref,
    g: Ref,
    beta: Ref,
    chunk: Tile,
    c: usize,
    t: usize,
    scale: f32,
) -> ChunkTerms {
    let real = iota(I32, [c, 1], 0) + chunk * (c as i32) < t as i32;
    chunk_math(
        chunk_rows(q, real) * scale,
        chunk_rows(k, real),
        chunk_rows(v, real),
        chunk_rows(g, real),
        chunk_rows(beta, real),
        c,
    )
}

/// The terms of a chunk of `c` rows in f32 (`qb` scaled; rows past the
/// sequence zero in every input).
#[kernel_fn]
pub(crate) fn chunk_math(qb: Tile, kb: Tile, vb: Tile, gb: Tile, bb: Tile, c: usize) -> ChunkTerms {
    // γ: the running log decay within the chunk; Γ[i, j] = e^{γ_i − γ_j}
    // on and below the diagonal.
    let gamma = gb.cumsum(0);
    let (row, col) = (iota(I32, [c, c], 0), iota(I32, [c, c], 1));
    let across = gamma.broadcast_to([c, c]);
    let decay = select(row >= col, (across - across.t()).exp(), 0.0);
    let kbeta = kb * bb;
    let kk = dot(kbeta, kb.t());
    let l = select(row > col, -(kk * decay), 0.0);
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
    let eg = gamma.exp();
    let last = select(iota(I32, [c, 1], 0) == (c as i32) - 1, gamma, 0.0).sum_keep(0);
    ChunkTerms {
        w: dot(inverse, kbeta * eg),
        u: dot(inverse, vb * bb),
        attn: select(row >= col, dot(qb, kb.t()) * decay, 0.0),
        q: qb,
        k: kb,
        v: vb,
        beta: bb,
        gamma,
        eg,
        last,
        decay,
        kk,
        inverse,
    }
}

/// The chunk's outputs: `(Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ) V'`.
#[kernel_fn]
pub(crate) fn chunk_output(x: &ChunkTerms, st: Tile, fresh: Tile) -> Tile {
    dot(x.q * x.eg, st) + dot(x.attn, fresh)
}

/// The state after a chunk: `e^{γ_c} S + (K ⊙ e^{γ_c − γ})ᵀ V'`.
#[kernel_fn]
pub(crate) fn next_state(x: &ChunkTerms, st: Tile, fresh: Tile) -> Tile {
    let carried = (x.k * (x.last - x.gamma).exp()).t();
    st * x.last.exp() + dot(carried, fresh)
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
    reference_of(backward::Inputs::of(a), scale)
}

/// [`reference()`] of inputs given as values.
fn reference_of(x: backward::Inputs<'_>, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let [b, h, t, ..] = x.dims;
    let (mut o, mut states) = (Vec::new(), Vec::new());
    for bh in 0..b * h {
        let (mut s, out) = backward::walk(x, bh, scale);
        o.extend(out);
        states.extend(s.swap_remove(t));
    }
    (o, states)
}

/// Inputs as a trained model feeds them: q and k with unit-norm rows (the
/// models normalize them), decays `g` in `[−0.5, 0]`, `beta` in `(0, 1)`
/// (inputs after the first five uniform: the backward's cotangents).
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
    if let [_, _, _, g, beta, ..] = v.as_mut_slice() {
        *g = Array::random(DType::F32, g.shape().to_vec(), seed + 10, -0.5, 0.0);
        *beta = Array::random(DType::F32, beta.shape().to_vec(), seed + 11, 0.05, 0.95);
    }
    v
}

/// The chunk parameter, shared with the backward's entries.
const CHUNK: Param = param(
    "chunk",
    ParamKind::Positive,
    "64",
    "tokens per chunk (built for a GPU: 16 unless given)",
);

/// The query scale parameter, shared with the backward's entry.
const SCALE: Param = param(
    "scale",
    ParamKind::Scale,
    "auto",
    "query scale; auto = 1/sqrt(dk)",
);

/// The presets' shapes: 2 heads of 128, 200 tokens (a ragged last chunk).
const PRESET_SHAPES: &[(&str, &[usize])] = &[
    ("q", &[1, 2, 200, 128]),
    ("k", &[1, 2, 200, 128]),
    ("v", &[1, 2, 200, 128]),
    ("g", &[1, 2, 200, 1]),
    ("beta", &[1, 2, 200, 1]),
];

/// `outputs` tolerances: in f32 `abs` and ten times it relative (the
/// chunked algorithm's rounding against the recurrence's), other dtypes
/// their own.
fn tolerances(c: &Config, outputs: usize, abs: f64) -> Vec<Tolerance> {
    let t = match c.dtype("dtype").unwrap_or(DType::F32) {
        DType::F32 => Tolerance {
            abs,
            rel: 10.0 * abs,
        },
        d => Tolerance::for_dtype(d),
    };
    vec![t; outputs]
}

/// [`gated_delta_rule`](mod@gated_delta_rule) in the library.
pub const GATED_DELTA_RULE: Entry = Entry {
    name: "gated_delta_rule",
    fixed_inputs: None,
    backward: crate::entry::backward!(backward::vjp),
    about: "chunked gated delta rule (Gated DeltaNet) forward: the delta rule's triangular system inverted by squarings on the MXU, the state carried across chunks; outputs o and the final state",
    params: &[DTYPE, CHUNK, SCALE],
    inputs: |_| {
        let (b, h, t, d) = (1, 2, 128, 128);
        Ok(vec![
            ("q", vec![b, h, t, d]),
            ("k", vec![b, h, t, d]),
            ("v", vec![b, h, t, d]),
            ("g", vec![b, h, t, 1]),
            ("beta", vec![b, h, t, 1]),
        ])
    },
    build: |c, s| {
        let [b, h, t, dk, dv] = backward::check_shapes(s)?;
        Ok(gated_delta_rule::build_for(
            c.dtype("dtype")?,
            backward::chunk_for(c, t)?,
            c.scale("scale", dk)?,
            gated_delta_rule::Dims { b, h, t, dk, dv },
        )?)
    },
    reference: |c, a| {
        let (o, state) = reference(a, f64::from(c.scale("scale", a[0].shape()[3])?));
        Ok(vec![o, state])
    },
    check: no_check,
    tolerance: |c, _| tolerances(c, 2, 1e-4),
    sample,
    presets: &[Preset {
        name: "gated_delta_rule_bf16",
        about: "chunked gated delta rule, bf16, 2 heads of dk = dv = 128, 200 tokens in chunks of 64 (ragged last chunk)",
        config: &[("dtype", "bf16")],
        shapes: PRESET_SHAPES,
    }],
};
