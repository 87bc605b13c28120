//! Mamba's causal depthwise conv1d: `y[b, t, c] = act(bias[c] + Σₖ
//! w[k, c] · x[b, t − (K − 1) + k, c])` with `x` zero before the start
//! and `act` SiLU or none. The sequence runs in order (its grid axis is
//! `arbitrary`); each step keeps its `x` block in scratch, and the taps
//! reaching back before the block (the halo, `K − 1` rows) roll in from
//! that previous block: `select(row ≥ s, x.roll(s), prev.roll(s))` is
//! `x` shifted down `s` rows with the previous block's last `s` rows on
//! top.

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param};
use crate::tolerance::Tolerance;

/// Causal depthwise conv1d over `x[batch, seq, channels]` with `w[taps,
/// channels]` and `bias[1, channels]`, SiLU after when `silu`. `taps − 1`
/// must not exceed `bt` (the halo comes from one previous block).
#[tpu_kernel(
    grid = (batch, kernel_ir::cdiv(channels, bc), kernel_ir::cdiv(seq, bt)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn causal_conv1d<T: Float>(
    bt: usize,
    bc: usize,
    silu: bool,
    #[shape(batch, seq, channels)]
    #[block([1, bt, bc], |b, c, t| (b, t, c))]
    x: In<T>,
    #[shape(taps, channels)]
    #[block([taps, bc], |_, c, _| (0, c))]
    w: In<T>,
    #[shape(1, channels)]
    #[block([1, bc], |_, c, _| (0, c))]
    bias: In<T>,
    #[shape(batch, seq, channels)]
    #[block([1, bt, bc], |b, c, t| (b, t, c))]
    y: Out<T>,
    #[shape(bt, bc)] prev: Scratch<f32>,
) {
    if program_id(2) == 0 {
        prev.store(.., 0.0);
    }
    let now = x.load((0, .., ..)).convert(F32);
    let before = prev.load(..);
    let row = iota(I32, [bt, bc], 0);
    let mut acc = bias.load(..).convert(F32).broadcast_to([bt, bc]);
    #[unroll]
    for k in 0..taps {
        // Tap k reads `back` rows earlier.
        let back = taps - 1 - k;
        let tap = if back == 0 {
            now
        } else {
            let back = back as i64;
            select(row.ge(back as i32), now.roll(back, 0), before.roll(back, 0))
        };
        acc = acc + tap * w.load((k..k + 1, ..)).convert(F32);
    }
    let out = if silu { acc * acc.logistic() } else { acc };
    y.store((0, .., ..), out.cast::<T>());
    prev.store(.., now);
}

/// The f64 reference from the definition (`x` is 0 before `t = 0`).
pub fn reference(x: &Array, w: &Array, bias: &Array, silu: bool) -> Vec<f64> {
    let (batch, seq, ch) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let taps = w.shape()[0];
    let (xd, wd, bd) = (x.data(), w.data(), bias.data());
    let mut out = Vec::with_capacity(batch * seq * ch);
    for b in 0..batch {
        for t in 0..seq {
            for c in 0..ch {
                let mut acc = bd[c];
                for k in 0..taps {
                    if let Some(src) = (t + k).checked_sub(taps - 1) {
                        acc += wd[k * ch + c] * xd[(b * seq + src) * ch + c];
                    }
                }
                out.push(if silu {
                    acc / (1.0 + (-acc).exp())
                } else {
                    acc
                });
            }
        }
    }
    out
}

/// [`causal_conv1d`](mod@causal_conv1d) in the library.
pub const CAUSAL_CONV1D: Entry = Entry {
    name: "causal_conv1d",
    fixed_inputs: None,
    backward: None,
    about: "Mamba's causal depthwise conv1d (+ bias, optional SiLU), the sequence in order with its halo rolled in from the previous block",
    params: &[
        DTYPE,
        param("taps", ParamKind::Positive, "4", "filter width K"),
        param("silu", ParamKind::Bool, "true", "SiLU after the conv"),
        param("bt", ParamKind::Positive, "64", "sequence rows per block"),
        param("bc", ParamKind::Positive, "128", "channels per block"),
    ],
    inputs: |c| {
        let taps = c.usize("taps")?;
        Ok(vec![
            ("x", vec![2, 256, 256]),
            ("w", vec![taps, 256]),
            ("bias", vec![1, 256]),
        ])
    },
    build: |c, s| {
        let [batch, seq, channels] = dims(&s[0], "x")?;
        let [taps, w_channels] = dims(&s[1], "w")?;
        let [one, b_channels] = dims(&s[2], "bias")?;
        if w_channels != channels || b_channels != channels || one != 1 {
            return Err(EntryError::Shape(format!(
                "x has {channels} channels, so w must be [taps, {channels}] and bias [1, {channels}]; got {:?} and {:?}",
                s[1], s[2]
            )));
        }
        let bt = c.usize("bt")?.min(seq);
        if taps == 0 || taps - 1 > bt {
            return Err(EntryError::Shape(format!(
                "{taps} taps reach {} rows back, more than one block of {bt} rows holds; \
                 use bt >= {} or fewer taps",
                taps.saturating_sub(1),
                taps.saturating_sub(1)
            )));
        }
        Ok(causal_conv1d::build_for(
            c.dtype("dtype")?,
            bt,
            c.usize("bc")?.min(channels),
            c.bool("silu")?,
            causal_conv1d::Dims {
                batch,
                seq,
                channels,
                taps,
            },
        )?)
    },
    reference: |c, a| Ok(vec![reference(&a[0], &a[1], &a[2], c.bool("silu")?)]),
    check: no_check,
    tolerance: |_, k| k.outputs().map(|o| Tolerance::for_dtype(o.dtype)).collect(),
    sample: crate::entry::uniform_inputs,
    presets: &[Preset {
        name: "causal_conv1d_bf16",
        about: "Mamba's conv: 4 taps, SiLU, bf16 [2, 300, 200] in [64, 128] blocks (ragged both ways)",
        config: &[("dtype", "bf16")],
        shapes: &[("x", &[2, 300, 200]), ("w", &[4, 200]), ("bias", &[1, 200])],
    }],
};
