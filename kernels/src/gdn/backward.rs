//! The gated delta rule's backward, chunked.
//!
//! Two passes, as fla-org's kernels do it: [`gated_delta_rule_states`]
//! runs the forward's state recurrence again and writes the state each
//! chunk starts from (`[b, h, chunks · dk, dv]`, f32: the forward keeps
//! only the last), then [`gated_delta_rule_backward`] walks the chunks last
//! to first with the state's cotangent `dS` in f32 scratch. Each chunk
//! recomputes its terms from the inputs and its start state (the shared
//! `chunk_terms`) and takes the forward's steps in reverse:
//!
//! * `S' = e^{γ_c} S + Cᵀ V'` with `C = K ⊙ e^{γ_c − γ}`: `dC = V' dS'ᵀ`,
//!   `dV' = C dS'`, `dS = e^{γ_c} dS' + …`, `dγ_c = e^{γ_c} ⟨S, dS'⟩`;
//! * `O = (Q ⊙ e^γ) S + P V'` with `P = Q Kᵀ ⊙ Γ`: `dS += (Q ⊙ e^γ)ᵀ dO`,
//!   `dV' += Pᵀ dO`, `dP = dO V'ᵀ`;
//! * `V' = U − W S`: `dU = dV'`, `dW = −dV' Sᵀ`, `dS −= Wᵀ dV'`;
//! * `W = T (βK ⊙ e^γ)`, `U = T (βV)`: `dT = dU (βV)ᵀ + dW (βK ⊙ e^γ)ᵀ`,
//!   and the right factors get `Tᵀ dU`, `Tᵀ dW`;
//! * `T = (I − L)⁻¹`: `dL = Tᵀ dT Tᵀ` below the diagonal, then through
//!   `L = −βK Kᵀ ⊙ Γ` to `K`, `β` and `Γ`;
//! * `Γ_ij = e^{γ_i − γ_j}`: `dγ += rowsum(dΓ ⊙ Γ) − colsum(dΓ ⊙ Γ)`, and
//!   `γ = cumsum(g)`: `dg` is `dγ`'s sum from each row to the chunk's end.
//!
//! The reference ([`backward_reference`]) is the adjoint of the token by
//! token recurrence of the module above, in f64, written separately (and
//! checked against finite differences of the forward's reference).

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::{Chunks, chunk_terms, next_state};
use crate::entry::{Config, DTYPE, Entry, EntryError, Preset, dims, no_check};
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{KernelVjp, VjpCall};

/// The state each chunk starts from, `states[b, h, i · dk .. (i + 1) · dk,
/// :]` for chunk `i` (f32; chunk 0's is zero): the forward's recurrence
/// without its outputs, what the backward reads.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(t, c)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn gated_delta_rule_states<T: Float>(
    c: usize,
    #[operands] _: Chunks<T>,
    #[shape(b, h, kernel_ir::cdiv(t, c) * dk, dv)]
    #[block([1, 1, dk, dv], |bi, hi, i| (bi, hi, i, 0))]
    states: Out<f32>,
    #[shape(dk, dv)] s: Scratch<f32>,
) {
    let i = program_id(2);
    if i == 0 {
        s.store(.., 0.0);
    }
    let st = s.load(..);
    states.store((0, 0, .., ..), st);
    // The scale only reaches the outputs, which this pass does not make.
    let x = chunk_terms(q, k, v, g, beta, i, c, t, 1.0);
    s.store(.., next_state(&x, st, x.u - dot(x.w, st)));
}

/// The cotangents `dq, dk, dv` (the inputs' dtype) and `dg, dbeta` (f32)
/// of [`gated_delta_rule`](mod@super::gated_delta_rule) from its inputs,
/// the chunks' start `states` (of [`gated_delta_rule_states`]), and the
/// cotangents `d_o` of `o` and `d_state` of the final state. The grid's
/// chunk axis runs the chunks last to first.
#[tpu_kernel(
    grid = (b, h, kernel_ir::cdiv(t, c)),
    semantics = (parallel, parallel, arbitrary)
)]
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule_backward<T: Float>(
    c: usize,
    scale: f32,
    #[shape(b, h, t, d_k)]
    #[block([1, 1, c, d_k], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    q: In<T>,
    #[shape(b, h, t, d_k)]
    #[block([1, 1, c, d_k], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    k: In<T>,
    #[shape(b, h, t, d_v)]
    #[block([1, 1, c, d_v], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    v: In<T>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    g: In<f32>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    beta: In<f32>,
    #[shape(b, h, kernel_ir::cdiv(t, c) * d_k, d_v)]
    #[block([1, 1, d_k, d_v], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    states: In<f32>,
    #[shape(b, h, t, d_v)]
    #[block([1, 1, c, d_v], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    d_o: In<T>,
    #[shape(b, h, d_k, d_v)]
    #[block([1, 1, d_k, d_v], |bi, hi, _| (bi, hi, 0, 0))]
    d_state: In<f32>,
    #[shape(b, h, t, d_k)]
    #[block([1, 1, c, d_k], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    dq: Out<T>,
    #[shape(b, h, t, d_k)]
    #[block([1, 1, c, d_k], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    dk: Out<T>,
    #[shape(b, h, t, d_v)]
    #[block([1, 1, c, d_v], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    dv: Out<T>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    dg: Out<f32>,
    #[shape(b, h, t, 1)]
    #[block([1, 1, c, 1], |bi, hi, i| (bi, hi, kernel_ir::cdiv(t, c) - 1 - i, 0))]
    dbeta: Out<f32>,
    #[shape(d_k, d_v)] ds: Scratch<f32>,
) {
    let i = program_id(2);
    if i == 0 {
        ds.store(.., d_state.load((0, 0, .., ..)));
    }
    let chunk = (kernel_ir::cdiv(t, c) as i32) - 1 - i;
    let x = chunk_terms(q, k, v, g, beta, chunk, c, t, scale);
    let real = iota(I32, [c, 1], 0) + chunk * (c as i32) < t as i32;
    let dout = select(real, d_o.load((0, 0, .., ..)).convert(F32), 0.0);
    let (st, dnext) = (states.load((0, 0, .., ..)), ds.load(..));
    let (row, col) = (iota(I32, [c, c], 0), iota(I32, [c, c], 1));
    let fresh = x.u - dot(x.w, st);
    // The carry to the next chunk.
    let el = x.last.exp();
    let back = (x.last - x.gamma).exp();
    let carried = x.k * back;
    let dc = dot(fresh, dnext.t());
    let dfresh = dot(carried, dnext) + dot(x.attn.t(), dout);
    let across = (dc * carried).sum_keep(1);
    let mut dgamma = -across;
    let dlast = (st * dnext).sum_keep(0).sum_keep(1) * el + across.sum_keep(0);
    let mut dkey = dc * back;
    // The output.
    let dqe = dot(dout, st.t());
    let mut dquery = dqe * x.eg;
    let mut deg = (dqe * x.q).sum_keep(1);
    let dp = dot(dout, fresh.t());
    let dpm = select(row >= col, dp * x.decay, 0.0);
    dquery = dquery + dot(dpm, x.k);
    dkey = dkey + dot(dpm.t(), x.q);
    let mut ddecay = select(row >= col, dp * dot(x.q, x.k.t()), 0.0);
    // V' = U − W S and the WY factors.
    let dw = -dot(dfresh, st.t());
    let vbeta = x.v * x.beta;
    let kbeta = x.k * x.beta;
    let dt = dot(dfresh, vbeta.t()) + dot(dw, (kbeta * x.eg).t());
    let dvbeta = dot(x.inverse.t(), dfresh);
    let dval = dvbeta * x.beta;
    let mut dbe = (dvbeta * x.v).sum_keep(1);
    let dx = dot(x.inverse.t(), dw);
    let mut dkbeta = dx * x.eg;
    deg = deg + (dx * kbeta).sum_keep(1);
    // T = (I − L)⁻¹ and L = −tril(βK Kᵀ ⊙ Γ, −1).
    let dl = dot(dot(x.inverse.t(), dt), x.inverse.t());
    let dkk = select(row > col, -(dl * x.decay), 0.0);
    ddecay = ddecay + select(row > col, -(dl * x.kk), 0.0);
    dkbeta = dkbeta + dot(dkk, x.k);
    dkey = dkey + dot(dkk.t(), kbeta) + dkbeta * x.beta;
    dbe = dbe + (dkbeta * x.k).sum_keep(1);
    // Γ, e^γ and γ_c back to γ, then γ = cumsum(g) back to g.
    let gg = ddecay * x.decay;
    dgamma = dgamma + deg * x.eg + gg.sum_keep(1) - gg.sum_keep(0).t();
    dgamma = dgamma + select(iota(I32, [c, 1], 0) == (c as i32) - 1, dlast, 0.0);
    let dgate = dgamma.sum_keep(0) - dgamma.cumsum(0) + dgamma;
    ds.store(
        ..,
        dnext * el + dot((x.q * x.eg).t(), dout) - dot(x.w.t(), dfresh),
    );
    dq.store((0, 0, .., ..), (dquery * scale).cast::<T>());
    dk.store((0, 0, .., ..), dkey.cast::<T>());
    dv.store((0, 0, .., ..), dval.cast::<T>());
    dg.store((0, 0, .., ..), dgate);
    dbeta.store((0, 0, .., ..), dbe);
}

/// The reference's view of `[q, k, v, g, beta]`: their values and
/// `[b, h, t, dk, dv]`.
#[derive(Clone, Copy)]
pub(super) struct Inputs<'a> {
    pub data: [&'a [f64]; 5],
    pub dims: [usize; 5],
}

impl<'a> Inputs<'a> {
    pub fn of(a: &'a [Array]) -> Inputs<'a> {
        let s = a[0].shape();
        Inputs {
            data: [
                a[0].data(),
                a[1].data(),
                a[2].data(),
                a[3].data(),
                a[4].data(),
            ],
            dims: [s[0], s[1], s[2], s[3], a[2].shape()[3]],
        }
    }
}

/// `kᵀ M` for `M: [dk, dv]` row-major (`dv` values).
fn left(k: &[f64], m: &[f64], dv: usize) -> Vec<f64> {
    (0..dv)
        .map(|j| k.iter().enumerate().map(|(i, x)| x * m[i * dv + j]).sum())
        .collect()
}

/// `M v` for `M: [dk, dv]` row-major (`dk` values).
fn right(m: &[f64], v: &[f64]) -> Vec<f64> {
    m.chunks(v.len())
        .map(|r| r.iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

/// The states of one batch-and-head, `S_0 = 0` then after each token (the
/// recurrence of the module docs in f64), and its outputs `[t, dv]`.
pub(super) fn walk(x: Inputs<'_>, bh: usize, scale: f64) -> (Vec<Vec<f64>>, Vec<f64>) {
    let [_, _, t, dk, dv] = x.dims;
    let [q, k, v, g, beta] = x.data;
    let mut s = vec![vec![0.0; dk * dv]];
    let mut o = vec![0.0; t * dv];
    for tok in 0..t {
        let row = bh * t + tok;
        let (kr, vr) = (&k[row * dk..(row + 1) * dk], &v[row * dv..(row + 1) * dv]);
        let (alpha, bt) = (g[row].exp(), beta[row]);
        let prev = &s[tok];
        // S ← α (S − β k (kᵀ S)) + β k vᵀ
        let ks = left(kr, prev, dv);
        let next: Vec<f64> = (0..dk * dv)
            .map(|e| {
                let (i, j) = (e / dv, e % dv);
                alpha * (prev[e] - bt * kr[i] * ks[j]) + bt * kr[i] * vr[j]
            })
            .collect();
        for j in 0..dv {
            o[tok * dv + j] = (0..dk)
                .map(|i| next[i * dv + j] * q[row * dk + i] * scale)
                .sum();
        }
        s.push(next);
    }
    (s, o)
}

/// The f64 states each chunk of `c` tokens starts from, `[b, h, chunks ·
/// dk, dv]` flat.
pub fn states_reference(a: &[Array], c: usize) -> Vec<f64> {
    let x = Inputs::of(a);
    let [b, h, t, ..] = x.dims;
    (0..b * h)
        .flat_map(|bh| {
            let (s, _) = walk(x, bh, 1.0);
            (0..t.div_ceil(c)).flat_map(move |i| s[i * c].clone())
        })
        .collect()
}

/// The f64 cotangents `[dq, dk, dv, dg, dbeta]` (flat) of the forward's
/// reference from `a = [q, k, v, g, beta]` and the cotangents `d_o` of `o`
/// and `d_state` of the final state: the recurrence's adjoint, token by
/// token from the last. With `A = (I − β k kᵀ) S_{t−1}`, `S_t = α A + β k
/// vᵀ`, `o_t = S_tᵀ (scale · q_t)`: `dS_t += scale · q_t d_oᵀ`, then
/// `dv = β dSᵀ k`, `dβ = kᵀ dS v − kᵀ dA (S_{t−1}ᵀ k)`, `dα = ⟨A, dS⟩`,
/// `dA = α dS` and `dS_{t−1} = (I − β k kᵀ) dA`.
pub fn backward_reference(a: &[Array], d_o: &[f64], d_state: &[f64], scale: f64) -> [Vec<f64>; 5] {
    adjoint(Inputs::of(a), d_o, d_state, scale)
}

fn adjoint(x: Inputs<'_>, d_o: &[f64], d_state: &[f64], scale: f64) -> [Vec<f64>; 5] {
    let [b, h, t, dk, dv] = x.dims;
    let [q, k, v, g, beta] = x.data;
    let mut out = [
        vec![0.0; b * h * t * dk],
        vec![0.0; b * h * t * dk],
        vec![0.0; b * h * t * dv],
        vec![0.0; b * h * t],
        vec![0.0; b * h * t],
    ];
    for bh in 0..b * h {
        let (states, _) = walk(x, bh, scale);
        let mut ds = d_state[bh * dk * dv..(bh + 1) * dk * dv].to_vec();
        for tok in (0..t).rev() {
            let row = bh * t + tok;
            let (qr, kr, vr) = (
                &q[row * dk..(row + 1) * dk],
                &k[row * dk..(row + 1) * dk],
                &v[row * dv..(row + 1) * dv],
            );
            let dor = &d_o[row * dv..(row + 1) * dv];
            let (alpha, bt) = (g[row].exp(), beta[row]);
            let (prev, cur) = (&states[tok], &states[tok + 1]);
            let dq = right(cur, dor).into_iter().map(|x| scale * x);
            out[0][row * dk..(row + 1) * dk]
                .iter_mut()
                .zip(dq)
                .for_each(|(o, x)| *o = x);
            for (e, d) in ds.iter_mut().enumerate() {
                *d += scale * qr[e / dv] * dor[e % dv];
            }
            // S_t = α A + β k vᵀ.
            let (dsk, dsv) = (left(kr, &ds, dv), right(&ds, vr));
            for j in 0..dv {
                out[2][row * dv + j] = bt * dsk[j];
            }
            let mut dbeta: f64 = (0..dk).map(|i| kr[i] * dsv[i]).sum();
            let mut dkr: Vec<f64> = dsv.iter().map(|x| bt * x).collect();
            let ks = left(kr, prev, dv);
            let a_of = |i: usize, j: usize| prev[i * dv + j] - bt * kr[i] * ks[j];
            let dalpha: f64 = (0..dk * dv).map(|e| a_of(e / dv, e % dv) * ds[e]).sum();
            out[3][row] = dalpha * alpha;
            // A = S − β k (Sᵀ k)ᵀ with dA = α dS.
            let da: Vec<f64> = ds.iter().map(|x| alpha * x).collect();
            let (dak, daks) = (left(kr, &da, dv), right(&da, &ks));
            dbeta -= (0..dk).map(|i| kr[i] * daks[i]).sum::<f64>();
            for ((d, a), b) in dkr.iter_mut().zip(&daks).zip(right(prev, &dak)) {
                *d -= bt * (a + b);
            }
            out[1][row * dk..(row + 1) * dk].copy_from_slice(&dkr);
            out[4][row] = dbeta;
            for e in 0..dk * dv {
                ds[e] = da[e] - bt * kr[e / dv] * dak[e % dv];
            }
        }
    }
    out
}

/// The chunk the forward's entry builds with for `t` tokens: the config's
/// `chunk`, 16 on a GPU unless given (a GPU program holds the chunk's
/// `[c, c]` matrices and the f32 state at once: chunks of 16 launch on
/// every target; 64 needs 256 KiB of shared memory on sm_90, 32 80 KiB on
/// gfx942).
pub(super) fn chunk_for(c: &Config, t: usize) -> Result<usize, EntryError> {
    let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
    let chunk = if gpu && !c.is_given("chunk") {
        16
    } else {
        c.usize("chunk")?
    };
    Ok(chunk.min(t).max(1))
}

/// `[b, h, t, dk, dv]` of `q` and `v`, the other inputs checked against
/// them (`q, k: [b, h, t, dk]`, `v: [b, h, t, dv]`, `g, beta: [b, h, t,
/// 1]`).
pub(super) fn check_shapes(s: &[Vec<usize>]) -> Result<[usize; 5], EntryError> {
    let [b, h, t, dk] = dims(&s[0], "q")?;
    let [_, _, _, dv] = dims(&s[2], "v")?;
    let want = [
        vec![b, h, t, dk],
        vec![b, h, t, dk],
        vec![b, h, t, dv],
        vec![b, h, t, 1],
        vec![b, h, t, 1],
    ];
    if s[..5] != want {
        return Err(EntryError::Shape(format!(
            "q {:?}, k {:?}, v {:?}, g {:?}, beta {:?}: give q and k as [b, h, t, dk], v as [b, h, t, dv], g and beta as [b, h, t, 1]",
            s[0], s[1], s[2], s[3], s[4]
        )));
    }
    Ok([b, h, t, dk, dv])
}

/// The chunk the two passes' entries build with: the forward's
/// ([`chunk_for`]; on a GPU 16 unless given, and the `states` input's
/// shape follows it).
fn entry_chunk(c: &Config, s: &[Vec<usize>]) -> Result<usize, EntryError> {
    chunk_for(c, dims::<4>(&s[0], "q")?[2])
}

/// The backward kernel for a config at the forward's input shapes.
fn backward_kernel(
    c: &Config,
    s: &[Vec<usize>],
    chunk: usize,
) -> Result<VerifiedKernel, EntryError> {
    let dims = check_shapes(s)?;
    backward_for(c.dtype("dtype")?, chunk, c.scale("scale", dims[3])?, dims)
}

/// The states pass for a config at the forward's input shapes.
fn states_kernel(c: &Config, s: &[Vec<usize>], chunk: usize) -> Result<VerifiedKernel, EntryError> {
    states_for(c.dtype("dtype")?, chunk, check_shapes(s)?)
}

/// The backward kernel at `[b, h, t, dk, dv]`.
fn backward_for(
    dtype: DType,
    chunk: usize,
    scale: f32,
    [b, h, t, d_k, d_v]: [usize; 5],
) -> Result<VerifiedKernel, EntryError> {
    let dims = gated_delta_rule_backward::Dims { b, h, t, d_k, d_v };
    Ok(gated_delta_rule_backward::build_for(
        dtype, chunk, scale, dims,
    )?)
}

/// The states pass at `[b, h, t, dk, dv]`.
fn states_for(
    dtype: DType,
    chunk: usize,
    [b, h, t, dk, dv]: [usize; 5],
) -> Result<VerifiedKernel, EntryError> {
    let dims = gated_delta_rule_states::Dims { b, h, t, dk, dv };
    Ok(gated_delta_rule_states::build_for(dtype, chunk, dims)?)
}

/// The forward's backward on the graph runtime: the states pass, then the
/// backward kernel.
#[cfg(feature = "graph")]
pub(super) fn vjp(c: &Config, s: &[Vec<usize>]) -> Result<Arc<dyn KernelVjp>, EntryError> {
    let dims = check_shapes(s)?;
    vjp_at(
        c.dtype("dtype")?,
        chunk_for(c, dims[2])?,
        c.scale("scale", dims[3])?,
        dims,
    )
}

/// [`vjp`] for a dtype, chunk and scale at `[b, h, t, dk, dv]`.
#[cfg(feature = "graph")]
pub(super) fn vjp_at(
    dtype: DType,
    chunk: usize,
    scale: f32,
    dims: [usize; 5],
) -> Result<Arc<dyn KernelVjp>, EntryError> {
    let (states, backward) = (
        states_for(dtype, chunk, dims)?,
        backward_for(dtype, chunk, scale, dims)?,
    );
    Ok(Arc::new(move |call: &VjpCall<'_>| {
        let x: Vec<&graph::Tensor> = call.inputs.iter().collect();
        let rt = x[0].runtime();
        let st = rt.call(&states, &x)?.remove(0);
        let (d_o, d_state) = (call.cotangent(0)?, call.cotangent(1)?);
        let mut args = x.clone();
        args.extend([&st, &d_o, &d_state]);
        Ok(rt.call(&backward, &args)?.into_iter().map(Some).collect())
    }))
}

/// The forward's shapes at a config's defaults (those of
/// [`super::GATED_DELTA_RULE`]).
fn forward_shapes(c: &Config) -> Result<Vec<(&'static str, Vec<usize>)>, EntryError> {
    (super::GATED_DELTA_RULE.inputs)(c)
}

/// [`gated_delta_rule_states`](mod@gated_delta_rule_states) in the library.
pub const GATED_DELTA_RULE_STATES: Entry = Entry {
    name: "gated_delta_rule_states",
    fixed_inputs: None,
    backward: None,
    about: "gated delta rule backward, first pass: the state each chunk starts from (the forward's recurrence, no outputs)",
    params: &[DTYPE, super::CHUNK],
    inputs: forward_shapes,
    build: |c, s| states_kernel(c, s, entry_chunk(c, s)?),
    reference: |c, a| {
        let t = a[0].shape()[2];
        Ok(vec![states_reference(a, chunk_for(c, t)?)])
    },
    check: no_check,
    tolerance: |_, _| {
        vec![Tolerance {
            abs: 1e-4,
            rel: 1e-3,
        }]
    },
    sample: super::sample,
    presets: &[Preset {
        name: "gated_delta_rule_states_bf16",
        about: "chunk start states of the gated delta rule, bf16, 2 heads of 128, 200 tokens in chunks of 64",
        config: &[("dtype", "bf16")],
        shapes: super::PRESET_SHAPES,
    }],
};

/// [`gated_delta_rule_backward`](mod@gated_delta_rule_backward) in the
/// library.
pub const GATED_DELTA_RULE_BACKWARD: Entry = Entry {
    name: "gated_delta_rule_backward",
    fixed_inputs: None,
    backward: None,
    about: "gated delta rule backward, second pass: dq, dk, dv, dg, dbeta chunk by chunk from the last, the state's cotangent carried in f32",
    params: &[DTYPE, super::CHUNK, super::SCALE],
    inputs: |c| {
        let mut s = forward_shapes(c)?;
        let [b, h, t, dk] = dims(&s[0].1, "q")?;
        let dv = s[2].1[3];
        let chunks = t.div_ceil(chunk_for(c, t)?);
        s.extend([
            ("states", vec![b, h, chunks * dk, dv]),
            ("d_o", vec![b, h, t, dv]),
            ("d_state", vec![b, h, dk, dv]),
        ]);
        Ok(s)
    },
    build: |c, s| {
        let [b, h, t, dk, dv] = check_shapes(s)?;
        let chunk = entry_chunk(c, s)?;
        let chunks = t.div_ceil(chunk);
        let want = [
            vec![b, h, chunks * dk, dv],
            vec![b, h, t, dv],
            vec![b, h, dk, dv],
        ];
        if s[5..] != want {
            return Err(EntryError::Shape(format!(
                "states {:?}, d_o {:?}, d_state {:?}: give states as [b, h, chunks * dk, dv] ({chunks} chunks), d_o as o's shape and d_state as the final state's",
                s[5], s[6], s[7]
            )));
        }
        backward_kernel(c, &s[..5], chunk)
    },
    reference: |c, a| {
        let dk = a[0].shape()[3];
        let [dq, dk_, dv, dg, db] = backward_reference(
            &a[..5],
            a[6].data(),
            a[7].data(),
            f64::from(c.scale("scale", dk)?),
        );
        Ok(vec![dq, dk_, dv, dg, db])
    },
    check: no_check,
    tolerance: |c, _| super::tolerances(c, 5, 2e-4),
    // The forward's inputs, their chunk start states (the reference's:
    // the kernel reads them as given), and random cotangents.
    sample: |c, k, seed| {
        let mut v = super::sample(c, k, seed);
        let t = v[0].shape()[2];
        let chunk = chunk_for(c, t).unwrap_or(t.max(1));
        let shape = v[5].shape().to_vec();
        v[5] = Array::new(DType::F32, shape.clone(), states_reference(&v[..5], chunk))
            .unwrap_or_else(|_| Array::zeros(DType::F32, shape));
        v
    },
    presets: &[Preset {
        name: "gated_delta_rule_backward_bf16",
        about: "gated delta rule backward, bf16, 2 heads of 128, 128 tokens in chunks of 64 (on a GPU 16)",
        config: &[("dtype", "bf16")],
        shapes: &[],
    }],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The adjoint reference against central differences of the
    /// recurrence, on the loss `⟨o, d_o⟩ + ⟨S_T, d_state⟩`, in f64.
    #[test]
    fn the_reference_adjoint_matches_finite_differences() {
        let dims = [1, 2, 7, 3, 4];
        let [b, h, t, dk, dv] = dims;
        let lens = [
            b * h * t * dk,
            b * h * t * dk,
            b * h * t * dv,
            b * h * t,
            b * h * t,
        ];
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut draw = |lo: f64, hi: f64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            lo + (hi - lo) * (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let ranges = [
            (-0.8, 0.8),
            (-0.8, 0.8),
            (-0.8, 0.8),
            (-0.5, 0.0),
            (0.1, 0.9),
        ];
        let data: Vec<Vec<f64>> = lens
            .iter()
            .zip(ranges)
            .map(|(&n, (lo, hi))| (0..n).map(|_| draw(lo, hi)).collect())
            .collect();
        let d_o: Vec<f64> = (0..b * h * t * dv).map(|_| draw(-1.0, 1.0)).collect();
        let d_state: Vec<f64> = (0..b * h * dk * dv).map(|_| draw(-1.0, 1.0)).collect();
        let scale = 0.6;
        fn inputs(d: &[Vec<f64>], dims: [usize; 5]) -> Inputs<'_> {
            Inputs {
                data: [&d[0], &d[1], &d[2], &d[3], &d[4]],
                dims,
            }
        }
        let loss = |d: &[Vec<f64>]| {
            (0..b * h)
                .map(|bh| {
                    let (s, o) = walk(inputs(d, dims), bh, scale);
                    let dot =
                        |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
                    dot(&o, &d_o[bh * t * dv..(bh + 1) * t * dv])
                        + dot(&s[t], &d_state[bh * dk * dv..(bh + 1) * dk * dv])
                })
                .sum::<f64>()
        };
        let grads = adjoint(inputs(&data, dims), &d_o, &d_state, scale);
        let eps = 1e-6;
        let mut worst: f64 = 0.0;
        for (input, grad) in grads.iter().enumerate() {
            for e in 0..data[input].len() {
                let at = |delta: f64| {
                    let mut d = data.clone();
                    d[input][e] += delta;
                    loss(&d)
                };
                let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
                assert!(
                    grad[e].is_finite(),
                    "input {input}, element {e}: {}",
                    grad[e]
                );
                worst = worst.max((numeric - grad[e]).abs() / numeric.abs().max(1.0));
            }
        }
        assert!(
            worst < 1e-6,
            "adjoint against finite differences: {worst:e}"
        );
    }
}
