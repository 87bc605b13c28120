//! The attention kernels' library entries: flash attention forward (with
//! and without a valid kv length, with sinks) and its backward kernels (delta, dq,
//! dk/dv), with their parameters, reference, tolerances and presets.

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::backward::*;
use super::*;
use crate::entry::{
    Config, DTYPE, Entry, EntryError, Param, ParamKind, Preset, Shapes, arg, in_range, no_check,
    param, refs, uniform_inputs,
};
use crate::reference;
use crate::tolerance::Tolerance;

/// `block_q`, `block_k`, `sm_scale` and `softcap`: the parameters every
/// attention entry has.
pub(crate) const BLOCK_Q: Param = param(
    "block_q",
    ParamKind::Positive,
    "64",
    "query rows per block (clamped to the sequence)",
);
pub(crate) const BLOCK_K: Param = param(
    "block_k",
    ParamKind::Positive,
    "128",
    "keys per block (clamped to the sequence; f32 built for a GPU: 64)",
);
pub(crate) const SM_SCALE: Param = param(
    "sm_scale",
    ParamKind::Scale,
    "auto",
    "score scale; auto = 1/sqrt(head_dim)",
);
pub(crate) const SOFTCAP: Param = param(
    "softcap",
    ParamKind::OptPositiveNumber,
    "none",
    "logit soft-cap: s = cap * tanh(s / cap)",
);

/// The config parameters of the attention kernels.
pub(crate) const ATTN_PARAMS: &[Param] =
    &[DTYPE, CAUSAL, BLOCK_Q, BLOCK_K, SM_SCALE, WINDOW, SOFTCAP];

/// Causal attention.
pub(crate) const CAUSAL: Param = param(
    "causal",
    ParamKind::Bool,
    "false",
    "query i sees keys j <= i only",
);

/// A sliding window.
pub(crate) const WINDOW: Param = param(
    "window",
    ParamKind::OptPositive,
    "none",
    "sliding window: keys more than window-1 away are hidden",
);

/// The [`AttnConfig`] of a library config for these sequence lengths.
pub(crate) fn attn_config(
    c: &Config,
    sq: usize,
    skv: usize,
    d: usize,
) -> Result<AttnConfig, EntryError> {
    Ok(AttnConfig {
        causal: c.bool("causal")?,
        sm_scale: c.scale("sm_scale", d)?,
        block_q: c.usize("block_q")?.min(sq),
        block_k: default_block_k(c)?.min(skv),
        window: c.opt_usize("window")?,
        softcap: c.opt_f32("softcap")?,
        dropout: None,
    })
}

/// `block_k`, or where the caller left it at its default, the default
/// fitted to the platform being built for: on the GPU, f32 blocks of 64
/// keys. An f32 tile takes twice a bf16 tile's shared memory, and at 128
/// keys Triton stages the f32 backward's dot operands past what sm_80 (dk/dv,
/// the one-pass dq/dk/dv) and sm_90 (the one-pass kernel) give a program,
/// even at one pipeline stage.
fn default_block_k(c: &Config) -> Result<usize, EntryError> {
    let block_k = c.usize("block_k")?;
    let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
    if gpu && !c.is_given("block_k") && c.dtype("dtype")? == DType::F32 {
        return Ok(block_k.min(64));
    }
    Ok(block_k)
}

/// The reference's view of a library config.
pub(crate) fn attn_spec(c: &Config, d: usize) -> Result<reference::AttnSpec, EntryError> {
    Ok(reference::AttnSpec {
        causal: c.bool("causal")?,
        scale: c.scale("sm_scale", d)? as f64,
        window: c.opt_usize("window")?,
        softcap: c.opt_f32("softcap")?.map(f64::from),
        kv_len: None,
    })
}

/// `[b, h, s, d]` q, `[b, hkv, s, d]` k and v: the attention defaults.
pub(crate) fn qkv() -> Shapes {
    vec![
        ("q", vec![1, 2, 256, 64]),
        ("k", vec![1, 2, 256, 64]),
        ("v", vec![1, 2, 256, 64]),
    ]
}

/// Scores that stay in f32 range: `max|q| · max|k| · d · sm_scale` finite
/// (else the kernels compute ±∞ and NaN where the f64 reference does not).
pub(crate) fn check_scores(
    c: &Config,
    k: &VerifiedKernel,
    inputs: &[Array],
) -> Result<(), EntryError> {
    let (Some(q), Some(kk)) = (arg(k, inputs, "q"), arg(k, inputs, "k")) else {
        return Ok(());
    };
    let d = *q.shape().last().unwrap_or(&1);
    let scale = if c.is_declared("sm_scale") {
        c.scale("sm_scale", d)? as f64
    } else {
        1.0 / (d as f64).sqrt()
    };
    let max = |a: &Array| a.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let bound = max(q) * max(kk) * d as f64 * scale.abs();
    if !bound.is_finite() || bound > f32::MAX as f64 / 4.0 {
        return Err(EntryError::Input(format!(
            "the attention scores can overflow f32: max|q| x max|k| x d x sm_scale = {bound:.3e} (f32 holds up to 3.4e38); scale q or k down"
        )));
    }
    Ok(())
}

/// The output's and the logsumexp's tolerances.
pub(crate) fn forward_tolerance(c: &Config, _: &VerifiedKernel) -> Vec<Tolerance> {
    let d = c.dtype("dtype").unwrap_or(DType::F32);
    vec![Tolerance::attention(d), Tolerance::logsumexp(d)]
}

/// The GQA presets' config: causal, sliding window 96, soft-cap 30.
pub(crate) const GQA_WINDOW: &[(&str, &str)] = &[
    ("dtype", "bf16"),
    ("causal", "true"),
    ("sm_scale", "0.125"),
    ("window", "96"),
    ("softcap", "30"),
];

/// 4 query heads on 2 kv heads, 200 positions of 64.
pub(crate) const GQA_SHAPES: &[(&str, &[usize])] = &[
    ("q", &[1, 4, 200, 64]),
    ("k", &[1, 2, 200, 64]),
    ("v", &[1, 2, 200, 64]),
];

/// [`flash_attention()`] in the library.
pub const FLASH_ATTENTION: Entry = Entry {
    name: "flash_attention",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let (q, k) = (&s[0], &s[1]);
        let cfg = attn_config(c, q[2], k[2], q[3])?;
        Ok(vjp::vjp(cfg, false))
    }),
    about: "flash attention forward (GQA, causal, window, soft-cap): outputs o and lse",
    params: ATTN_PARAMS,
    inputs: |_| Ok(qkv()),
    build: |c, s| {
        let dims = flash_attention::Dims::from_shapes(&refs(s))?;
        Ok(flash_attention(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let d = a[0].shape()[3];
        let (o, lse) = reference::attention_full(&a[0], &a[1], &a[2], &attn_spec(c, d)?);
        Ok(vec![o, lse])
    },
    check: check_scores,
    tolerance: forward_tolerance,
    sample: uniform_inputs,
    presets: &[
        Preset {
            name: "flash_attention_causal_bf16",
            about: "flash attention forward, causal, bf16[1, 2, 256, 64], K col-major",
            config: &[("dtype", "bf16"), ("causal", "true"), ("sm_scale", "0.125")],
            shapes: &[],
        },
        Preset {
            name: "flash_attention_f32",
            about: "flash attention forward, f32, 128 queries over 256 keys",
            config: &[("block_q", "32"), ("sm_scale", "0.125")],
            shapes: &[("q", &[1, 2, 128, 64])],
        },
        Preset {
            name: "flash_attention_gqa_window_bf16",
            about: "flash attention forward, bf16, 4 query heads on 2 kv heads, causal, window 96, soft-cap 30, ragged 200 keys",
            config: GQA_WINDOW,
            shapes: GQA_SHAPES,
        },
    ],
};

/// The f64 reference with sinks: attention's `o` and `lse` with each
/// head's sink added to its rows' softmax (`lse' = log(e^lse + e^sink)`,
/// `o' = o·e^(lse − lse')`; a row with no key: `o = 0`, `lse = sink`).
pub(crate) fn sinks_reference(
    c: &Config,
    a: &[Array],
) -> Result<crate::entry::Outputs, EntryError> {
    let d = a[0].shape()[3];
    let (mut o, mut lse) = reference::attention_full(&a[0], &a[1], &a[2], &attn_spec(c, d)?);
    let (h, sq) = (a[0].shape()[1], a[0].shape()[2]);
    for (row, l) in lse.iter_mut().enumerate() {
        let sink = a[3].data()[row / sq % h];
        let folded = if *l == f64::NEG_INFINITY {
            sink
        } else {
            l.max(sink) + ((*l - l.max(sink)).exp() + (sink - l.max(sink)).exp()).ln()
        };
        let scale = (*l - folded).exp();
        o[row * d..(row + 1) * d]
            .iter_mut()
            .for_each(|x| *x *= scale);
        *l = folded;
    }
    Ok(vec![o, lse])
}

/// Sinks of either sign, from well below the scores to above them, each
/// a finite f32; q, k, v uniform.
fn sinks_inputs(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    if let Some(s) = v.get_mut(3) {
        *s = Array::random(F32, s.shape().to_vec(), seed + 40, -4.0, 4.0);
    }
    v
}

/// [`flash_attention_sinks()`] in the library.
pub const FLASH_ATTENTION_SINKS: Entry = Entry {
    name: "flash_attention_sinks",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let (q, k) = (&s[0], &s[1]);
        let cfg = attn_config(c, q[2], k[2], q[3])?;
        Ok(vjp::vjp_sinks(cfg, false))
    }),
    about: "flash attention forward with a learned sink logit per query head (gpt-oss): outputs o and lse",
    params: ATTN_PARAMS,
    inputs: |_| {
        let mut v = qkv();
        v.push(("sinks", vec![2]));
        Ok(v)
    },
    build: |c, s| {
        let dims = flash_attention::Dims::from_shapes(&refs(&s[..3]))?;
        if s[3] != [dims.h] {
            return Err(EntryError::Shape(format!(
                "sinks is {:?}; give one sink per query head, as [{}]",
                s[3], dims.h
            )));
        }
        Ok(flash_attention_sinks(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: sinks_reference,
    check: |c, k, a| {
        check_scores(c, k, a)?;
        match a
            .get(3)
            .and_then(|s| s.data().iter().find(|v| !v.is_finite()))
        {
            Some(v) => Err(EntryError::Input(format!(
                "sinks must be finite (got {v}); leave a head without a sink as a large negative logit, or use flash_attention"
            ))),
            None => Ok(()),
        }
    },
    tolerance: forward_tolerance,
    sample: sinks_inputs,
    presets: &[Preset {
        name: "flash_attention_sinks_gqa_bf16",
        about: "flash attention with sinks, bf16, 4 query heads on 2 kv heads, causal, window 96, ragged 200 keys",
        config: &[("dtype", "bf16"), ("causal", "true"), ("window", "96")],
        shapes: &[
            ("q", &[1, 4, 200, 64]),
            ("k", &[1, 2, 200, 64]),
            ("v", &[1, 2, 200, 64]),
            ("sinks", &[4]),
        ],
    }],
};

/// [`flash_attention_kv_len()`] in the library.
pub const FLASH_ATTENTION_KV_LEN: Entry = Entry {
    name: "flash_attention_kv_len",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| {
        let (q, k) = (&s[1], &s[2]);
        let cfg = attn_config(c, q[2], k[2], q[3])?;
        Ok(vjp::vjp(cfg, true))
    }),
    about: "flash attention forward over keys padded to a bucket; kv_len[0] valid keys",
    params: ATTN_PARAMS,
    inputs: |_| {
        let mut v = vec![("kv_len", vec![1])];
        v.extend(qkv());
        Ok(v)
    },
    build: |c, s| {
        let dims = flash_attention::Dims::from_shapes(&refs(&s[1..]))?;
        Ok(flash_attention_kv_len(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let d = a[1].shape()[3];
        let spec = reference::AttnSpec {
            kv_len: Some(a[0].data()[0].max(0.0) as usize),
            ..attn_spec(c, d)?
        };
        let (o, lse) = reference::attention_full(&a[1], &a[2], &a[3], &spec);
        Ok(vec![o, lse])
    },
    check: check_kv_len,
    tolerance: forward_tolerance,
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        let skv = v[2].shape()[2];
        // Some keys valid, at least one, not all.
        let len = 1 + kernel_ir::SplitMix64(seed).below(skv.max(1));
        v[0] = Array::new(DType::I32, [1], vec![len as f64]).unwrap_or_else(|_| v[0].clone());
        v
    },
    presets: &[Preset {
        name: "flash_attention_kv_len_bucket",
        about: "flash attention forward over a bucket of 256 keys, valid length as scalar prefetch",
        config: &[("causal", "true"), ("sm_scale", "0.125")],
        shapes: &[],
    }],
};

/// q, k, v, dO, lse, delta: the inputs of the dq and dk/dv kernels.
fn backward_shapes(_: &Config) -> Result<Shapes, EntryError> {
    let mut v = qkv();
    v.extend([
        ("d_o", vec![1, 2, 256, 64]),
        ("lse", vec![1, 2, 256, 1]),
        ("delta", vec![1, 2, 256, 1]),
    ]);
    Ok(v)
}

/// Random q, k, v, dO, and the lse and delta the forward would have
/// saved for them (the backward is defined only for those).
fn backward_inputs(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    let d = v[0].shape()[3];
    let Ok(spec) = attn_spec(c, d) else {
        return v;
    };
    let (o, lse) = reference::attention_full(&v[0], &v[1], &v[2], &spec);
    let o = Array::new(v[0].dtype(), v[0].shape().to_vec(), o).unwrap_or_else(|_| v[0].clone());
    let delta = reference::attention_delta(o.data(), &v[3]);
    let rows = v[4].shape().to_vec();
    if let (Ok(l), Ok(dl)) = (
        Array::new(DType::F32, rows.clone(), lse),
        Array::new(DType::F32, rows, delta),
    ) {
        v[4] = l;
        v[5] = dl;
    }
    v
}

fn grad_tolerance(c: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let d = c.dtype("dtype").unwrap_or(DType::F32);
    k.outputs().map(|_| Tolerance::attention_grad(d)).collect()
}

/// The GQA dq/dk/dv presets' shapes.
const GQA_BACKWARD_SHAPES: &[(&str, &[usize])] = &[
    ("q", &[1, 4, 200, 64]),
    ("k", &[1, 2, 200, 64]),
    ("v", &[1, 2, 200, 64]),
    ("d_o", &[1, 4, 200, 64]),
    ("lse", &[1, 4, 200, 1]),
    ("delta", &[1, 4, 200, 1]),
];

/// [`attention_delta`](mod@attention_delta) in the library.
pub const ATTENTION_DELTA: Entry = Entry {
    name: "attention_delta",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward: delta = rowsum(dO * O)",
    params: &[
        DTYPE,
        param("block_q", ParamKind::Positive, "64", "query rows per block"),
    ],
    inputs: |_| {
        Ok(vec![
            ("o", vec![1, 2, 256, 64]),
            ("d_o", vec![1, 2, 256, 64]),
        ])
    },
    build: |c, s| {
        let dims = attention_delta::Dims::from_shapes(&refs(s))?;
        Ok(attention_delta::build_for(
            c.dtype("dtype")?,
            c.usize("block_q")?.min(dims.sq),
            dims,
        )?)
    },
    reference: |_, a| Ok(vec![reference::attention_delta(a[0].data(), &a[1])]),
    check: no_check,
    tolerance: |_, _| {
        vec![Tolerance {
            abs: 1e-4,
            rel: 1e-4,
        }]
    },
    sample: uniform_inputs,
    presets: &[Preset {
        name: "attention_delta_bf16",
        about: "flash attention backward, delta = rowsum(dO * O), bf16[1, 4, 200, 64]",
        config: &[("dtype", "bf16")],
        shapes: &[("o", &[1, 4, 200, 64]), ("d_o", &[1, 4, 200, 64])],
    }],
};

/// [`flash_attention_dq()`] in the library.
pub const FLASH_ATTENTION_DQ: Entry = Entry {
    name: "flash_attention_dq",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward: dq from q, k, v, dO, lse, delta",
    params: ATTN_PARAMS,
    inputs: backward_shapes,
    build: |c, s| {
        let dims = flash_attention_dq::Dims::from_shapes(&refs(s))?;
        Ok(flash_attention_dq(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = attn_spec(c, a[0].shape()[3])?;
        Ok(vec![
            reference::attention_backward(&a[0], &a[1], &a[2], &a[3], &spec).0,
        ])
    },
    check: check_scores,
    tolerance: grad_tolerance,
    sample: backward_inputs,
    presets: &[Preset {
        name: "flash_attention_dq_gqa_window",
        about: "flash attention backward, dq, GQA 4/2 heads, causal, window, soft-cap",
        config: GQA_WINDOW,
        shapes: GQA_BACKWARD_SHAPES,
    }],
};

/// [`flash_attention_dkv()`] in the library.
pub const FLASH_ATTENTION_DKV: Entry = Entry {
    name: "flash_attention_dkv",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward: dk and dv (summed over GQA groups)",
    params: ATTN_PARAMS,
    inputs: backward_shapes,
    build: |c, s| {
        let dims = flash_attention_dkv::Dims::from_shapes(&refs(s))?;
        Ok(flash_attention_dkv(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = attn_spec(c, a[0].shape()[3])?;
        let (_, dk, dv) = reference::attention_backward(&a[0], &a[1], &a[2], &a[3], &spec);
        Ok(vec![dk, dv])
    },
    check: check_scores,
    tolerance: grad_tolerance,
    sample: backward_inputs,
    presets: &[Preset {
        name: "flash_attention_dkv_gqa",
        about: "flash attention backward, dk and dv summed over the 2 query heads of each kv head",
        config: GQA_WINDOW,
        shapes: GQA_BACKWARD_SHAPES,
    }],
};

/// [`flash_attention_dqkv()`] in the library.
pub const FLASH_ATTENTION_DQKV: Entry = Entry {
    name: "flash_attention_dqkv",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward in one pass: dq, dk and dv (dq summed in scratch over the k blocks)",
    params: ATTN_PARAMS,
    inputs: backward_shapes,
    build: |c, s| {
        let dims = flash_attention_dqkv::Dims::from_shapes(&refs(s))?;
        Ok(flash_attention_dqkv(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = attn_spec(c, a[0].shape()[3])?;
        let (dq, dk, dv) = reference::attention_backward(&a[0], &a[1], &a[2], &a[3], &spec);
        Ok(vec![dq, dk, dv])
    },
    check: check_scores,
    tolerance: grad_tolerance,
    sample: backward_inputs,
    presets: &[Preset {
        name: "flash_attention_dqkv_gqa_window",
        about: "flash attention backward in one pass, GQA 4/2 heads, causal, window, soft-cap",
        config: GQA_WINDOW,
        shapes: GQA_BACKWARD_SHAPES,
    }],
};

/// `kv_len`, then the dq/dk/dv inputs.
fn backward_shapes_kv_len(c: &Config) -> Result<Shapes, EntryError> {
    let mut v = vec![("kv_len", vec![1])];
    v.extend(backward_shapes(c)?);
    Ok(v)
}

/// [`backward_inputs`] with a random valid length in `1..=skv` first, and
/// lse and delta from the forward that masks keys past it.
fn backward_inputs_kv_len(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    let skv = v[2].shape()[2];
    let len = 1 + kernel_ir::SplitMix64(seed).below(skv.max(1));
    v[0] = Array::new(DType::I32, [1], vec![len as f64]).unwrap_or_else(|_| v[0].clone());
    let d = v[1].shape()[3];
    let Ok(spec) = attn_spec(c, d) else {
        return v;
    };
    let spec = reference::AttnSpec {
        kv_len: Some(len),
        ..spec
    };
    let (o, lse) = reference::attention_full(&v[1], &v[2], &v[3], &spec);
    let o = Array::new(v[1].dtype(), v[1].shape().to_vec(), o).unwrap_or_else(|_| v[1].clone());
    let delta = reference::attention_delta(o.data(), &v[4]);
    let rows = v[5].shape().to_vec();
    if let (Ok(l), Ok(dl)) = (
        Array::new(DType::F32, rows.clone(), lse),
        Array::new(DType::F32, rows, delta),
    ) {
        v[5] = l;
        v[6] = dl;
    }
    v
}

/// The attention spec of a kv_len backward entry's inputs.
fn spec_kv_len(c: &Config, a: &[Array]) -> Result<reference::AttnSpec, EntryError> {
    Ok(reference::AttnSpec {
        kv_len: Some(a[0].data()[0].max(0.0) as usize),
        ..attn_spec(c, a[1].shape()[3])?
    })
}

/// `kv_len` in `0..=skv`, and the scores in range.
fn check_kv_len(c: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    let skv = arg(k, a, "k").map_or(0, |k| k.shape()[2]) as f64;
    in_range(
        arg(k, a, "kv_len"),
        "kv_len",
        0.0,
        skv,
        "the keys that exist",
    )?;
    check_scores(c, k, a)
}

/// [`flash_attention_dqkv_kv_len()`] in the library.
pub const FLASH_ATTENTION_DQKV_KV_LEN: Entry = Entry {
    name: "flash_attention_dqkv_kv_len",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward in one pass over keys padded to a bucket: dq, dk and dv; kv_len[0] valid keys",
    params: ATTN_PARAMS,
    inputs: backward_shapes_kv_len,
    build: |c, s| {
        let dims = flash_attention_dqkv::Dims::from_shapes(&refs(&s[1..]))?;
        Ok(flash_attention_dqkv_kv_len(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = spec_kv_len(c, a)?;
        let (dq, dk, dv) = reference::attention_backward(&a[1], &a[2], &a[3], &a[4], &spec);
        Ok(vec![dq, dk, dv])
    },
    check: check_kv_len,
    tolerance: grad_tolerance,
    sample: backward_inputs_kv_len,
    presets: &[Preset {
        name: "flash_attention_dqkv_kv_len_causal",
        about: "flash attention backward in one pass, causal, over a bucket of 256 keys with a valid length",
        config: &[("causal", "true"), ("sm_scale", "0.125")],
        shapes: &[],
    }],
};

/// [`flash_attention_dq_kv_len()`] in the library.
pub const FLASH_ATTENTION_DQ_KV_LEN: Entry = Entry {
    name: "flash_attention_dq_kv_len",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward over keys padded to a bucket: dq; kv_len[0] valid keys",
    params: ATTN_PARAMS,
    inputs: backward_shapes_kv_len,
    build: |c, s| {
        let dims = flash_attention_dq::Dims::from_shapes(&refs(&s[1..]))?;
        Ok(flash_attention_dq_kv_len(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = spec_kv_len(c, a)?;
        Ok(vec![
            reference::attention_backward(&a[1], &a[2], &a[3], &a[4], &spec).0,
        ])
    },
    check: check_kv_len,
    tolerance: grad_tolerance,
    sample: backward_inputs_kv_len,
    presets: &[Preset {
        name: "flash_attention_dq_kv_len_causal",
        about: "flash attention backward, dq, causal, over a bucket of 256 keys with a valid length",
        config: &[("causal", "true"), ("sm_scale", "0.125")],
        shapes: &[],
    }],
};

/// [`flash_attention_dkv_kv_len()`] in the library.
pub const FLASH_ATTENTION_DKV_KV_LEN: Entry = Entry {
    name: "flash_attention_dkv_kv_len",
    fixed_inputs: None,
    backward: None,
    about: "flash attention backward over keys padded to a bucket: dk and dv; kv_len[0] valid keys",
    params: ATTN_PARAMS,
    inputs: backward_shapes_kv_len,
    build: |c, s| {
        let dims = flash_attention_dkv::Dims::from_shapes(&refs(&s[1..]))?;
        Ok(flash_attention_dkv_kv_len(
            &attn_config(c, dims.sq, dims.skv, dims.d)?,
            c.dtype("dtype")?,
            dims,
        )?)
    },
    reference: |c, a| {
        let spec = spec_kv_len(c, a)?;
        let (_, dk, dv) = reference::attention_backward(&a[1], &a[2], &a[3], &a[4], &spec);
        Ok(vec![dk, dv])
    },
    check: check_kv_len,
    tolerance: grad_tolerance,
    sample: backward_inputs_kv_len,
    presets: &[Preset {
        name: "flash_attention_dkv_kv_len_bucket",
        about: "flash attention backward, dk and dv, over a bucket of 256 keys with a valid length",
        config: &[("sm_scale", "0.125")],
        shapes: &[],
    }],
};
