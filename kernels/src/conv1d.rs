//! Mamba's causal depthwise conv1d: `y[b, t, c] = act(bias[c] + Σₖ
//! w[k, c] · x[b, t − (K − 1) + k, c])` with `x` zero before the start
//! and `act` SiLU or none. Each step reads its rows and the `halo` rows
//! before them through an element window (the array padded by `halo` rows
//! in front), so every grid axis is parallel; tap `k` is the window's
//! rows shifted `K − 1 − k` back, the rows before the sequence masked.

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param};
use crate::tolerance::Tolerance;

/// Causal depthwise conv1d over `x[batch, seq, channels]` with `w[taps,
/// channels]` and `bias[1, channels]`, SiLU after when `silu`. Each step
/// computes `bt` rows from a window of `window` rows of `x`, the first
/// `halo ≥ taps − 1` of them before its own ([`CAUSAL_CONV1D`]'s build
/// chooses both for the platform).
#[tpu_kernel(
    grid = (batch, kernel_ir::cdiv(channels, bc), kernel_ir::cdiv(seq, bt)),
    semantics = (parallel, parallel, parallel)
)]
pub fn causal_conv1d<T: Float>(
    bt: usize,
    bc: usize,
    halo: usize,
    window: usize,
    silu: bool,
    #[shape(batch, seq, channels)]
    #[block([1, window, bc], |b, c, t| (b, t * bt, c * bc))]
    #[element(
        [0, halo, 0],
        [0, window - halo - bt + kernel_ir::cdiv(seq, bt) * bt - seq, kernel_ir::cdiv(channels, bc) * bc - channels]
    )]
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
) {
    let rows = x.load((0, .., ..)).convert(F32);
    let row = iota(I32, [bt, bc], 0) + program_id(2) * bt;
    let mut acc = bias.load(..).convert(F32).broadcast_to([bt, bc]);
    #[unroll]
    for k in 0..taps {
        // Tap k reads `back` rows earlier: window row `halo − back` is the
        // first; rows before the sequence are the padding, masked.
        let back = taps - 1 - k;
        let tap = rows.slice(0, halo - back..halo - back + bt);
        let tap = if back == 0 {
            tap
        } else {
            select(row.ge(back as i32), tap, 0.0)
        };
        acc = acc + tap * w.load((k..k + 1, ..)).convert(F32);
    }
    let out = if silu { acc * acc.logistic() } else { acc };
    y.store((0, .., ..), out.cast::<T>());
}

/// The halo and window rows for `taps` and `bt` rows per step (the fused
/// GDN core's conv takes its chunks so too): on the TPU
/// (and the CPU paths, which follow its rules) whole sublane tiles of the
/// dtype, where element windows are placed; on the GPU the window is a
/// power of two, as Triton's tensors are.
pub(crate) fn window_rows(dtype: DType, taps: usize, bt: usize) -> (usize, usize) {
    let back = taps.saturating_sub(1);
    if kernel_ir::current_platform() == kernel_ir::Platform::Gpu {
        (back, (back + bt).next_power_of_two())
    } else {
        let tile = 8 * dtype.packing();
        let halo = back.div_ceil(tile) * tile;
        (halo, (halo + bt).div_ceil(tile) * tile)
    }
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
    backward: crate::entry::backward!(|c, _| {
        let silu = c.bool("silu")?;
        Ok(std::sync::Arc::new(move |call: &graph::VjpCall<'_>| {
            backward(call, silu)
        }))
    }),
    about: "Mamba's causal depthwise conv1d (+ bias, optional SiLU), each block's halo read through an element window",
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
        if taps == 0 {
            return Err(EntryError::Shape(
                "w has no taps: give it at least one row".into(),
            ));
        }
        let dtype = c.dtype("dtype")?;
        let (halo, window) = window_rows(dtype, taps, bt);
        Ok(causal_conv1d::build_for(
            dtype,
            bt,
            c.usize("bc")?.min(channels),
            halo,
            window,
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

/// `x[b, t − s, c]` (zero before the start) for `s ≥ 0`; with `back`, the
/// other way, `x[b, t + s, c]` (zero past the end).
#[cfg(feature = "graph")]
fn shifted(x: &graph::Tensor, s: usize, back: bool) -> Result<graph::Tensor, graph::RuntimeError> {
    let [batch, seq, ch] = [x.shape()[0], x.shape()[1], x.shape()[2]];
    let s = s.min(seq);
    if s == 0 {
        return Ok(x.clone());
    }
    let zeros = x
        .runtime()
        .scalar(0.0, x.dtype())
        .broadcast_to(&[batch, s, ch])?;
    if back {
        x.slice(&[0, s, 0], &[batch, seq, ch])?.concat(&[&zeros], 1)
    } else {
        zeros.concat(&[&x.slice(&[0, 0, 0], &[batch, seq - s, ch])?], 1)
    }
}

/// The cotangents of `x`, `w` and `bias` from `dy`, in f32, cast to the
/// inputs' dtypes (see the module docs).
#[cfg(feature = "graph")]
fn backward(
    call: &graph::VjpCall<'_>,
    silu: bool,
) -> Result<Vec<Option<graph::Tensor>>, graph::RuntimeError> {
    let f32 = DType::F32;
    let (x, w, bias) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
    let (xf, wf) = (x.cast(f32)?, w.cast(f32)?);
    let [taps, ch] = [w.shape()[0], w.shape()[1]];
    let tap = |k: usize| wf.slice(&[k, 0], &[k + 1, ch])?.reshape(&[1, 1, ch]);
    let shape = x.shape().to_vec();
    let row = |t: &graph::Tensor| t.broadcast_to(&shape);
    let dy = call.cotangent(0)?.cast(f32)?;
    // Tap k's rows of x, for the pre-activation and for dw.
    let xs = (0..taps)
        .map(|k| shifted(&xf, taps - 1 - k, false))
        .collect::<Result<Vec<_>, _>>()?;
    let dz = if silu {
        let mut z = row(&bias.cast(f32)?.reshape(&[1, 1, ch])?)?;
        for (k, xk) in xs.iter().enumerate() {
            z = z.add(&xk.mul(&row(&tap(k)?)?)?)?;
        }
        let s = z.logistic()?;
        let one = x.runtime().scalar(1.0, f32);
        let slope = s.mul(&z.mul(&one.sub(&s)?)?.add(&one)?)?;
        dy.mul(&slope)?
    } else {
        dy
    };
    let mut dx = dz.mul(&row(&tap(taps - 1)?)?)?;
    let mut dw = Vec::with_capacity(taps);
    for (k, xk) in xs.iter().enumerate() {
        if k + 1 < taps {
            dx = dx.add(&shifted(&dz, taps - 1 - k, true)?.mul(&row(&tap(k)?)?)?)?;
        }
        dw.push(xk.mul(&dz)?.sum(&[0, 1])?.reshape(&[1, ch])?);
    }
    let dw = dw[0].concat(&dw.iter().skip(1).collect::<Vec<_>>(), 0)?;
    let dbias = dz.sum(&[0, 1])?.reshape(&[1, ch])?;
    Ok(vec![
        Some(dx.cast(x.dtype())?),
        Some(dw.cast(w.dtype())?),
        Some(dbias.cast(bias.dtype())?),
    ])
}

/// Records [`causal_conv1d`](mod@causal_conv1d) of `x[batch, seq, ch]`
/// with `w[taps, ch]` and `bias[1, ch]` (SiLU after when `silu`) on the
/// graph runtime, with its backward.
#[cfg(feature = "graph")]
pub fn call_causal_conv1d(
    x: &graph::Tensor,
    w: &graph::Tensor,
    bias: &graph::Tensor,
    silu: bool,
) -> Result<graph::Tensor, graph::RuntimeError> {
    let pairs = [
        ("dtype".to_string(), x.dtype().to_string()),
        ("silu".to_string(), silu.to_string()),
    ];
    let cfg = crate::Config::parse(&CAUSAL_CONV1D, &pairs)
        .map_err(|e| crate::recording::build_error(CAUSAL_CONV1D.name, e))?;
    Ok(CAUSAL_CONV1D
        .call(x.runtime(), &cfg, &[x, w, bias])?
        .remove(0))
}
