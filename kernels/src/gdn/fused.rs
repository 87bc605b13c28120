//! The gated delta rule with what a Gated DeltaNet layer runs in front of
//! it fused in (tokamax's `CausalConv1dGatedDeltaRule`, for a dense batch):
//! the causal depthwise conv1d + SiLU of the q, k and v projections, the
//! L2 normalization of q and k, and the gates from their projections,
//! `g = −e^{a_log} · softplus(a + dt_bias)` and `β = σ(b)`.
//!
//! The projections come as the layer makes them, heads side by side in
//! the channels (`q, k: [batch, t, h · dk]`, `v: [batch, t, h · dv]`, `a,
//! b: [batch, t, h]`), and `o` leaves the same way (`[batch, t, h · dv]`):
//! no transposes around the kernel. Each grid step `(batch, head, chunk)`
//! reads its chunk's rows of its head's channels and the rows before them
//! the conv needs, through an element window (the `causal_conv1d` kernel's
//! halo), convolves, normalizes and gates them in VMEM, and runs the
//! chunk's step of [`gated_delta_rule`](mod@super::gated_delta_rule); the
//! convolved q, k, v and the gates never go to memory. Its backward (the
//! entry's) recomputes the layer unfused and pulls back through the
//! pieces' backwards (module `composed`).

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::{ChunkTerms, chunk_math, chunk_output, next_state};
use crate::entry::{Config, DTYPE, Entry, EntryError, Preset, dims, no_check};

/// The fused layer: `o[batch, t, h · dv]` and the final state `[batch, h,
/// dk, dv]` (f32) from the projections `q, k: [batch, t, h · dk]`, `v:
/// [batch, t, h · dv]`, their conv weights `wq, wk: [taps, h · dk]`, `wv:
/// [taps, h · dv]`, the gate projections `a, b: [batch, t, h]` (f32) and
/// per head `a_log`, `dt_bias: [1, h]` (f32). Chunks of `c` tokens; each
/// step's window holds `window` rows, the first `halo ≥ taps − 1` of them
/// before the chunk.
#[tpu_kernel(
    grid = (batch, h, kernel_ir::cdiv(t, c)),
    semantics = (parallel, parallel, arbitrary)
)]
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_gated_delta_rule<T: Float>(
    c: usize,
    dk: usize,
    dv: usize,
    halo: usize,
    window: usize,
    scale: f32,
    #[shape(batch, t, hk)]
    #[block([1, window, dk], |bi, hi, i| (bi, i * c, hi * dk))]
    #[element([0, halo, 0], [0, window - halo - c + kernel_ir::cdiv(t, c) * c - t, 0])]
    q: In<T>,
    #[shape(batch, t, hk)]
    #[block([1, window, dk], |bi, hi, i| (bi, i * c, hi * dk))]
    #[element([0, halo, 0], [0, window - halo - c + kernel_ir::cdiv(t, c) * c - t, 0])]
    k: In<T>,
    #[shape(batch, t, hv)]
    #[block([1, window, dv], |bi, hi, i| (bi, i * c, hi * dv))]
    #[element([0, halo, 0], [0, window - halo - c + kernel_ir::cdiv(t, c) * c - t, 0])]
    v: In<T>,
    #[shape(taps, hk)]
    #[block([taps, dk], |_, hi, _| (0, hi))]
    wq: In<T>,
    #[shape(taps, hk)]
    #[block([taps, dk], |_, hi, _| (0, hi))]
    wk: In<T>,
    #[shape(taps, hv)]
    #[block([taps, dv], |_, hi, _| (0, hi))]
    wv: In<T>,
    #[shape(batch, t, h)]
    #[block([1, c, h], |bi, _, i| (bi, i, 0))]
    a: In<f32>,
    #[shape(batch, t, h)]
    #[block([1, c, h], |bi, _, i| (bi, i, 0))]
    b: In<f32>,
    #[shape(1, h)]
    #[block([1, h], |_, _, _| (0, 0))]
    a_log: In<f32>,
    #[shape(1, h)]
    #[block([1, h], |_, _, _| (0, 0))]
    dt_bias: In<f32>,
    #[shape(batch, t, hv)]
    #[block([1, c, dv], |bi, hi, i| (bi, i, hi))]
    o: Out<T>,
    #[shape(batch, h, dk, dv)]
    #[block([1, 1, dk, dv], |bi, hi, _| (bi, hi, 0, 0))]
    state: Out<f32>,
    #[shape(dk, dv)] s: Scratch<f32>,
) {
    let (hi, i) = (program_id(1), program_id(2));
    if i == 0 {
        s.store(.., 0.0);
    }
    let real = iota(I32, [c, 1], 0) + i * (c as i32) < t as i32;
    let row = iota(I32, [c, 1], 0) + i * (c as i32);
    let qc = unit_rows(conv_silu(q, wq, row, taps, halo, c));
    let kc = unit_rows(conv_silu(k, wk, row, taps, halo, c));
    let vc = conv_silu(v, wv, row, taps, halo, c);
    // This head's lane of the per-token and per-head gate inputs.
    let lane = iota(I32, [1, h], 1) == hi;
    let z = head(lane, a.load((0, .., ..))) + head(lane, dt_bias.load(..));
    let softplus = z.max(0.0) + (-z.abs()).exp().log1p();
    let g = -(head(lane, a_log.load(..)).exp()) * softplus;
    let beta = head(lane, b.load((0, .., ..))).logistic();
    let x: ChunkTerms = chunk_math(
        select(real, qc, 0.0) * scale,
        select(real, kc, 0.0),
        select(real, vc, 0.0),
        select(real, g, 0.0),
        select(real, beta, 0.0),
        c,
    );
    let st = s.load(..);
    let fresh = x.u - dot(x.w, st);
    o.store((0, .., ..), chunk_output(&x, st, fresh).cast::<T>());
    s.store(.., next_state(&x, st, fresh));
    if i == num_programs(2) - 1 {
        state.store((0, 0, .., ..), s.load(..));
    }
}

/// The causal conv1d + SiLU of a window's chunk rows (`row`: their token
/// indices): tap `k` reads the rows `taps − 1 − k` back, zero before the
/// sequence.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn conv_silu(x: Ref, w: Ref, row: Tile, taps: usize, halo: usize, c: usize) -> Tile {
    let rows = x.load((0, .., ..)).convert(F32);
    let mut acc = rows.slice(0, halo..halo + c) * w.load((taps - 1..taps, ..)).convert(F32);
    #[unroll]
    for k in 0..taps - 1 {
        let back = taps - 1 - k;
        let tap = select(
            row.ge(back as i32),
            rows.slice(0, halo - back..halo - back + c),
            0.0,
        );
        acc += tap * w.load((k..k + 1, ..)).convert(F32);
    }
    acc * acc.logistic()
}

/// Lane `lane` of each row of `x`, `[rows, 1]`.
#[kernel_fn]
fn head(lane: Tile, x: Tile) -> Tile {
    select(lane, x, 0.0).sum_keep(1)
}

/// Rows scaled to unit L2 norm (`x / √(Σx² + 10⁻⁶)`, tokamax's epsilon).
#[kernel_fn]
fn unit_rows(x: Tile) -> Tile {
    x * ((x * x).sum_keep(1) + 1e-6).rsqrt()
}

/// The f64 reference, composed from the definitions: each projection
/// through [`crate::conv1d::reference`] (SiLU, no bias), q and k rows to
/// unit norm, the gates, then [`super::reference()`] per head. Returns `o`
/// (`[batch, t, h · dv]`) and the final state.
pub fn reference(a: &[Array], h: usize, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let [batch, t, hk] = [a[0].shape()[0], a[0].shape()[1], a[0].shape()[2]];
    let hv = a[2].shape()[2];
    let (dk, dv) = (hk / h, hv / h);
    let conv = |x: &Array, w: &Array| {
        let bias = Array::zeros(DType::F32, vec![1, x.shape()[2]]);
        crate::conv1d::reference(x, w, &bias, true)
    };
    let (qc, kc, vc) = (conv(&a[0], &a[3]), conv(&a[1], &a[4]), conv(&a[2], &a[5]));
    let unit = |x: &[f64], d: usize| -> Vec<f64> {
        x.chunks(d)
            .flat_map(|r| {
                let n = (r.iter().map(|e| e * e).sum::<f64>() + 1e-6).sqrt();
                r.iter().map(move |e| e / n).collect::<Vec<_>>()
            })
            .collect()
    };
    let (qn, kn) = (unit(&qc, dk), unit(&kc, dk));
    // [batch, t, h·d] → [batch, h, t, d]
    let heads = |x: &[f64], d: usize| -> Vec<f64> {
        let mut out = vec![0.0; x.len()];
        for (e, v) in x.iter().enumerate() {
            let (bt, col) = (e / (h * d), e % (h * d));
            let (bi, ti, hi, di) = (bt / t, bt % t, col / d, col % d);
            out[((bi * h + hi) * t + ti) * d + di] = *v;
        }
        out
    };
    let (ad, bd, alog, dtb) = (a[6].data(), a[7].data(), a[8].data(), a[9].data());
    let mut g = vec![0.0; batch * h * t];
    let mut beta = vec![0.0; batch * h * t];
    for bi in 0..batch {
        for ti in 0..t {
            for hi in 0..h {
                let z = ad[(bi * t + ti) * h + hi] + dtb[hi];
                let softplus = z.max(0.0) + (-z.abs()).exp().ln_1p();
                g[(bi * h + hi) * t + ti] = -alog[hi].exp() * softplus;
                beta[(bi * h + hi) * t + ti] = 1.0 / (1.0 + (-bd[(bi * t + ti) * h + hi]).exp());
            }
        }
    }
    let (q, k, v) = (heads(&qn, dk), heads(&kn, dk), heads(&vc, dv));
    let x = super::backward::Inputs {
        data: [&q, &k, &v, &g, &beta],
        dims: [batch, h, t, dk, dv],
    };
    let (o, state) = super::reference_of(x, scale);
    // o back to [batch, t, h·dv]
    let mut out = vec![0.0; o.len()];
    for (e, v) in o.iter().enumerate() {
        let (bh, rest) = (e / (t * dv), e % (t * dv));
        let (bi, hi, ti, di) = (bh / h, bh % h, rest / dv, rest % dv);
        out[(bi * t + ti) * h * dv + hi * dv + di] = *v;
    }
    (out, state)
}

/// `[batch, t, h, dk, dv, taps]` from the inputs' shapes, each checked.
fn check_shapes(s: &[Vec<usize>]) -> Result<[usize; 6], EntryError> {
    let [batch, t, h] = dims(&s[6], "a")?;
    let [_, _, hk] = dims(&s[0], "q")?;
    let [_, _, hv] = dims(&s[2], "v")?;
    let [taps, _] = dims(&s[3], "wq")?;
    if h == 0 || hk % h != 0 || hv % h != 0 {
        return Err(EntryError::Shape(format!(
            "q has {hk} channels and v {hv}, a has {h} heads: give each head's channels side by side, q and k as [batch, t, heads * dk], v as [batch, t, heads * dv]"
        )));
    }
    let want = [
        vec![batch, t, hk],
        vec![batch, t, hk],
        vec![batch, t, hv],
        vec![taps, hk],
        vec![taps, hk],
        vec![taps, hv],
        vec![batch, t, h],
        vec![batch, t, h],
        vec![1, h],
        vec![1, h],
    ];
    if s != want.as_slice() {
        return Err(EntryError::Shape(format!(
            "got {s:?}; give q, k [batch, t, h * dk], v [batch, t, h * dv], wq, wk [taps, h * dk], wv [taps, h * dv], a, b [batch, t, h], a_log, dt_bias [1, h]: {want:?}"
        )));
    }
    if taps == 0 {
        return Err(EntryError::Shape(
            "the conv weights have 0 taps; give wq, wk, wv at least one row".into(),
        ));
    }
    Ok([batch, t, h, hk / h, hv / h, taps])
}

fn build(c: &Config, s: &[Vec<usize>]) -> Result<VerifiedKernel, EntryError> {
    let [batch, t, h, dk, dv, taps] = check_shapes(s)?;
    let dtype = c.dtype("dtype")?;
    let chunk = super::backward::chunk_for(c, t)?;
    let (halo, window) = crate::conv1d::window_rows(dtype, taps, chunk);
    Ok(causal_conv1d_gated_delta_rule::build_for(
        dtype,
        chunk,
        dk,
        dv,
        halo,
        window,
        c.scale("scale", dk)?,
        causal_conv1d_gated_delta_rule::Dims {
            batch,
            t,
            hk: h * dk,
            hv: h * dv,
            h,
            taps,
        },
    )?)
}

/// Inputs as a layer feeds them: projections and conv weights of the
/// size a trained layer has, gate inputs spread over the range where the
/// gates move.
fn sample(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = crate::entry::uniform_inputs(c, k, seed);
    let ranges = [
        (-1.0, 1.0),
        (-1.0, 1.0),
        (-1.0, 1.0),
        (-0.5, 0.5),
        (-0.5, 0.5),
        (-0.5, 0.5),
        (-2.0, 2.0),
        (-3.0, 3.0),
        (-1.5, 0.5),
        (-1.0, 1.0),
    ];
    for (i, (x, (lo, hi))) in v.iter_mut().zip(ranges).enumerate() {
        *x = Array::random(x.dtype(), x.shape().to_vec(), seed + 30 + i as u64, lo, hi);
    }
    v
}

/// [`causal_conv1d_gated_delta_rule`](mod@causal_conv1d_gated_delta_rule)
/// in the library.
pub const CAUSAL_CONV1D_GATED_DELTA_RULE: Entry = Entry {
    name: "causal_conv1d_gated_delta_rule",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let [_, t, h, dk, ..] = check_shapes(s)?;
        Ok(super::composed::vjp(
            super::backward::chunk_for(c, t)?,
            c.scale("scale", dk)?,
            h,
        ))
    }),
    about: "a Gated DeltaNet layer's core, fused: causal conv1d + SiLU of the q, k, v projections, L2-normalized q and k, gates from a, b, a_log, dt_bias, then the chunked gated delta rule; heads side by side in the channels",
    params: &[DTYPE, super::CHUNK, super::SCALE],
    inputs: |_| {
        let (batch, t, h, d, taps) = (1, 128, 2, 128, 4);
        Ok(vec![
            ("q", vec![batch, t, h * d]),
            ("k", vec![batch, t, h * d]),
            ("v", vec![batch, t, h * d]),
            ("wq", vec![taps, h * d]),
            ("wk", vec![taps, h * d]),
            ("wv", vec![taps, h * d]),
            ("a", vec![batch, t, h]),
            ("b", vec![batch, t, h]),
            ("a_log", vec![1, h]),
            ("dt_bias", vec![1, h]),
        ])
    },
    build,
    reference: |c, a| {
        let h = a[6].shape()[2];
        let dk = a[0].shape()[2] / h.max(1);
        let (o, state) = reference(a, h, f64::from(c.scale("scale", dk)?));
        Ok(vec![o, state])
    },
    check: no_check,
    tolerance: |c, _| super::tolerances(c, 2, 1e-4),
    sample,
    presets: &[Preset {
        name: "causal_conv1d_gated_delta_rule_bf16",
        about: "the fused Gated DeltaNet core, bf16, 2 heads of dk = dv = 128, 4 taps, 200 tokens in chunks of 64 (ragged last chunk)",
        config: &[("dtype", "bf16")],
        shapes: &[
            ("q", &[1, 200, 256]),
            ("k", &[1, 200, 256]),
            ("v", &[1, 200, 256]),
            ("a", &[1, 200, 2]),
            ("b", &[1, 200, 2]),
        ],
    }],
};
