//! Masked attention in the library: the forward
//! ([`super::masked::masked_attention`]) with its backward declared (so
//! `grad` and `tessera export` reach it), and the dq and dk/dv kernels
//! ([`super::masked_backward`]) as entries of their own.
//!
//! The mask is config (`mask=causal`, `mask=local:127:0;causal` per head);
//! the block tables it preprocesses into are inputs, as the kernels read
//! them by scalar prefetch. They must be the tables of the config's mask
//! at the inputs' sizes ([`BlockTables::build`], then
//! [`BlockTables::arrays`]; the dk/dv entry takes
//! [`BlockTables::transposed_arrays`]): [`crate::Entry::check_inputs`]
//! refuses any other, and the backward builds its transposed tables from
//! the mask. They are the entries' fixed inputs, so `tessera export`
//! writes them into the artifact and a JAX caller passes only q, k, v and
//! the segment ids.

use kernel_ir::{Array, DType, VerifiedKernel};

use super::block_table::BlockTables;
use super::entries::{BLOCK_K, BLOCK_Q, SM_SCALE, SOFTCAP, check_scores};
use super::mask::MultiHeadMask;
use super::masked::{MaskedConfig, masked_attention};
use super::masked_backward::{masked_attention_dkv, masked_attention_dq};
use crate::entry::{
    Config, DTYPE, Entry, EntryError, Param, ParamKind, Preset, Shapes, arg, param, refs,
};
use crate::reference;
use crate::tolerance::Tolerance;

const MASKED_PARAMS: &[Param] = &[
    DTYPE,
    param(
        "mask",
        ParamKind::Mask,
        "causal",
        "which keys each query sees: one mask, or one per head separated by ;",
    ),
    BLOCK_Q,
    BLOCK_K,
    SM_SCALE,
    SOFTCAP,
];

/// Default q, k, v: `[1, 2, 256, 64]`.
const Q: [usize; 4] = [1, 2, 256, 64];

/// What the config and the q and k shapes fix: the kernels' config, the
/// mask per head and its tables.
pub(crate) struct Setup {
    pub(crate) cfg: MaskedConfig,
    pub(crate) mask: MultiHeadMask,
    pub(crate) tables: BlockTables,
}

impl Setup {
    /// For `q: [b, h, sq, d]` and `k: [b, hkv, skv, d]`.
    pub(crate) fn new(c: &Config, q: &[usize], k: &[usize]) -> Result<Setup, EntryError> {
        let (Some(&[_, h, sq, d]), Some(&[_, _, skv, _])) = (
            <&[usize; 4]>::try_from(q).ok(),
            <&[usize; 4]>::try_from(k).ok(),
        ) else {
            return Err(EntryError::Shape(format!(
                "q must be [b, h, sq, d] and k [b, hkv, skv, d]; got q {q:?}, k {k:?}"
            )));
        };
        let cfg = MaskedConfig {
            sm_scale: c.scale("sm_scale", d)?,
            softcap: c.opt_f32("softcap")?,
            block_q: c.usize("block_q")?.min(sq.max(1)),
            block_k: c.usize("block_k")?.min(skv.max(1)),
            rule: None,
        };
        let mask = MultiHeadMask::parse(c.mask_text("mask")?, h)
            .map_err(|e| EntryError::Shape(format!("config `mask`: {e}")))?;
        let cfg = MaskedConfig {
            rule: MaskedConfig::rule_of(&mask),
            ..cfg
        };
        let tables = BlockTables::build(&mask, sq, skv, cfg.block_q, cfg.block_k)
            .map_err(|e| EntryError::Shape(e.to_string()))?;
        Ok(Setup { cfg, mask, tables })
    }

    /// The reference's view, with the segment ids of `q_seg`, `kv_seg`.
    fn spec<'a>(
        &'a self,
        segs: &'a (Vec<i32>, Vec<i32>),
        visible: &'a dyn Fn(usize, usize, usize) -> bool,
    ) -> reference::MaskedSpec<'a> {
        reference::MaskedSpec {
            mask: visible,
            q_seg: &segs.0,
            kv_seg: &segs.1,
            scale: self.cfg.sm_scale as f64,
            softcap: self.cfg.softcap.map(f64::from),
        }
    }
}

/// The segment ids of arrays `q_seg`, `kv_seg`.
fn segments(q_seg: &Array, kv_seg: &Array) -> (Vec<i32>, Vec<i32>) {
    let ids = |a: &Array| a.data().iter().map(|&x| x as i32).collect();
    (ids(q_seg), ids(kv_seg))
}

/// The fixed inputs: the tables (transposed for the dk/dv entry) at
/// arguments 0..3 and the element masks at `masks_at`, of the config's
/// mask at the shapes of q (argument 3) and k (argument 4).
fn fixed(
    c: &Config,
    s: &[Vec<usize>],
    transposed: bool,
    masks_at: usize,
) -> Result<Vec<(usize, Array)>, EntryError> {
    let (Some(q), Some(k)) = (s.get(3), s.get(4)) else {
        return Err(EntryError::Shape(
            "masked attention takes the tables, then q and k".into(),
        ));
    };
    let setup = Setup::new(c, q, k)?;
    let (pre, masks) = setup.tables.arrays();
    let pre = if transposed {
        setup.tables.transposed_arrays()
    } else {
        pre
    };
    let mut v: Vec<(usize, Array)> = pre.into_iter().enumerate().collect();
    v.push((masks_at, masks));
    Ok(v)
}

/// The inputs around the tables: `(tables, q, k, v, [backward extras],
/// masks, q_seg, kv_seg)` at the default shapes.
fn shapes(c: &Config, backward: bool, transposed: bool) -> Result<Shapes, EntryError> {
    let s = Setup::new(c, &Q, &Q)?;
    let t = &s.tables;
    let cells = if transposed {
        vec![t.heads, t.k_blocks, t.q_blocks]
    } else {
        vec![t.heads, t.q_blocks, t.k_blocks]
    };
    let names = if transposed {
        ["kind_t", "fetch_t", "mask_fetch_t"]
    } else {
        ["kind", "fetch", "mask_fetch"]
    };
    let mut v: Shapes = names.iter().map(|&n| (n, cells.clone())).collect();
    v.extend([("q", Q.to_vec()), ("k", Q.to_vec()), ("v", Q.to_vec())]);
    if backward {
        let rows = vec![Q[0], Q[1], Q[2], 1];
        v.extend([("d_o", Q.to_vec()), ("lse", rows.clone()), ("delta", rows)]);
    }
    v.extend([
        ("masks", vec![t.masks.len().max(1), t.bq, t.bk]),
        ("q_seg", vec![Q[0], Q[2], 1]),
        ("kv_seg", vec![Q[0], 1, Q[2]]),
    ]);
    Ok(v)
}

/// The inputs the tables of the config's mask, the scores in range and the
/// segment ids one per position.
fn check(c: &Config, k: &VerifiedKernel, a: &[Array], transposed: bool) -> Result<(), EntryError> {
    check_scores(c, k, a)?;
    let (Some(q), Some(kk)) = (arg(k, a, "q"), arg(k, a, "k")) else {
        return Ok(());
    };
    let s = Setup::new(c, q.shape(), kk.shape())?;
    let (pre, masks) = s.tables.arrays();
    let pre = if transposed {
        s.tables.transposed_arrays()
    } else {
        pre
    };
    let names = if transposed {
        ["kind_t", "fetch_t", "mask_fetch_t", "masks"]
    } else {
        ["kind", "fetch", "mask_fetch", "masks"]
    };
    for (name, want) in names.iter().zip(pre.iter().chain([&masks])) {
        if arg(k, a, name)
            .is_some_and(|got| got.shape() != want.shape() || got.data() != want.data())
        {
            return Err(EntryError::Input(format!(
                "input `{name}` is not the block table of mask `{}` at these sizes; build the tables with BlockTables::build for the mask and the q and k lengths, then .arrays(){}",
                c.values()
                    .find(|(k, _)| *k == "mask")
                    .map_or("", |(_, v)| v),
                if transposed {
                    " and .transposed_arrays()"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(())
}

/// Random inputs: q, k, v (and dO) uniform in −1..1, the tables of the
/// config's mask, sorted random segment ids in `0..3` (the same ids for
/// queries and keys when the lengths agree, as packed self-attention has);
/// for the backward entries, the lse and delta the forward would give.
fn sample(
    c: &Config,
    k: &VerifiedKernel,
    seed: u64,
    backward: bool,
    transposed: bool,
) -> Vec<Array> {
    let mut v = crate::entry::uniform_inputs(c, k, seed);
    let (Some(q), Some(kk)) = (arg(k, &v, "q"), arg(k, &v, "k")) else {
        return v;
    };
    let (qs, ks) = (q.shape().to_vec(), kk.shape().to_vec());
    let Ok(s) = Setup::new(c, &qs, &ks) else {
        return v;
    };
    let (b, sq, skv) = (qs[0], qs[2], ks[2]);
    let mut r = kernel_ir::SplitMix64(seed ^ 0x5e9);
    let mut ids = |n: usize| -> Vec<f64> {
        let mut x: Vec<f64> = (0..b * n).map(|_| r.below(3) as f64).collect();
        for row in x.chunks_mut(n.max(1)) {
            row.sort_by(f64::total_cmp);
        }
        x
    };
    let q_ids = ids(sq);
    let kv_ids = if sq == skv { q_ids.clone() } else { ids(skv) };
    let (pre, masks) = s.tables.arrays();
    let pre = if transposed {
        s.tables.transposed_arrays()
    } else {
        pre
    };
    let n = v.len();
    v[..3].clone_from_slice(&pre);
    let seg = |ids: Vec<f64>, shape: [usize; 3]| Array::new(DType::I32, shape, ids);
    if let (Ok(qseg), Ok(kseg)) = (seg(q_ids, [b, sq, 1]), seg(kv_ids, [b, 1, skv])) {
        v[n - 3] = masks;
        v[n - 2] = qseg;
        v[n - 1] = kseg;
    }
    if backward {
        let segs = segments(&v[n - 2], &v[n - 1]);
        let (o, lse) = reference::masked_attention(
            &v[3],
            &v[4],
            &v[5],
            &s.spec(&segs, &|h, i, j| {
                s.mask.heads[h].visible(i as u64, j as u64)
            }),
        );
        let o = Array::new(v[3].dtype(), qs.clone(), o).unwrap_or_else(|_| v[3].clone());
        let delta = reference::attention_delta(o.data(), &v[6]);
        let rows = vec![b, qs[1], sq, 1];
        if let (Ok(l), Ok(dl)) = (
            Array::new(DType::F32, rows.clone(), lse),
            Array::new(DType::F32, rows, delta),
        ) {
            v[7] = l;
            v[8] = dl;
        }
    }
    v
}

/// `(dq, dk, dv)`, flat.
type Grads = (Vec<f64>, Vec<f64>, Vec<f64>);

/// The reference gradients of a backward entry's inputs.
fn reference_grads(c: &Config, a: &[Array]) -> Result<Grads, EntryError> {
    let s = Setup::new(c, a[3].shape(), a[4].shape())?;
    let segs = segments(&a[10], &a[11]);
    Ok(reference::masked_attention_backward(
        &a[3],
        &a[4],
        &a[5],
        &a[6],
        &s.spec(&segs, &|h, i, j| {
            s.mask.heads[h].visible(i as u64, j as u64)
        }),
    ))
}

fn grad_tolerance(c: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let d = c.dtype("dtype").unwrap_or(DType::F32);
    k.outputs().map(|_| Tolerance::attention_grad(d)).collect()
}

/// The presets' configs: a local head and a global head, and chunked
/// causal in bf16 with a soft-cap.
const LOCAL_AND_GLOBAL: &[(&str, &str)] = &[("mask", "local:63:0;causal"), ("sm_scale", "0.125")];
const CHUNKED_BF16: &[(&str, &str)] = &[
    ("dtype", "bf16"),
    ("mask", "chunked:96&causal"),
    ("softcap", "30"),
];
/// One kv head shared by both query heads.
const GQA: &[(&str, &[usize])] = &[("k", &[1, 1, 256, 64]), ("v", &[1, 1, 256, 64])];

/// [`masked_attention`](mod@masked_attention) in the library.
pub const MASKED_ATTENTION: Entry = Entry {
    name: "masked_attention",
    fixed_inputs: Some(|c, s| fixed(c, s, false, 6)),
    backward: crate::entry::backward!(|c, s| {
        let setup = Setup::new(c, &s[3], &s[4])?;
        Ok(super::masked_vjp::vjp(
            setup.cfg,
            setup.tables.transposed_arrays(),
        ))
    }),
    about: "attention with any mask (splash's block tables by scalar prefetch), segment ids, GQA, soft-cap: outputs o and lse",
    params: MASKED_PARAMS,
    inputs: |c| shapes(c, false, false),
    build: |c, s| {
        let setup = Setup::new(c, &s[3], &s[4])?;
        let dims = super::masked::masked_attention::Dims::from_shapes(&refs(s))?;
        Ok(masked_attention::build_for(
            c.dtype("dtype")?,
            &setup.cfg,
            dims,
        )?)
    },
    reference: |c, a| {
        let s = Setup::new(c, a[3].shape(), a[4].shape())?;
        let segs = segments(&a[7], &a[8]);
        let (o, lse) = reference::masked_attention(
            &a[3],
            &a[4],
            &a[5],
            &s.spec(&segs, &|h, i, j| {
                s.mask.heads[h].visible(i as u64, j as u64)
            }),
        );
        Ok(vec![o, lse])
    },
    check: |c, k, a| check(c, k, a, false),
    tolerance: |c, _| {
        let d = c.dtype("dtype").unwrap_or(DType::F32);
        vec![Tolerance::attention(d), Tolerance::logsumexp(d)]
    },
    sample: |c, k, seed| sample(c, k, seed, false, false),
    presets: &[
        Preset {
            name: "masked_attention_local_and_global",
            about: "masked attention, head 0 a causal window of 64, head 1 causal, packed segments, f32[1, 2, 256, 64]",
            config: LOCAL_AND_GLOBAL,
            shapes: &[],
        },
        Preset {
            name: "masked_attention_chunked_gqa_bf16",
            about: "masked attention, chunked causal (96), soft-cap 30, 2 query heads on 1 kv head, bf16",
            config: CHUNKED_BF16,
            shapes: GQA,
        },
    ],
};

/// [`masked_attention_dq`](mod@masked_attention_dq) in the library.
pub const MASKED_ATTENTION_DQ: Entry = Entry {
    name: "masked_attention_dq",
    fixed_inputs: Some(|c, s| fixed(c, s, false, 9)),
    backward: None,
    about: "masked attention backward: dq, over the forward's block tables",
    params: MASKED_PARAMS,
    inputs: |c| shapes(c, true, false),
    build: |c, s| {
        let setup = Setup::new(c, &s[3], &s[4])?;
        let dims = super::masked_backward::masked_attention_dq::Dims::from_shapes(&refs(s))?;
        Ok(masked_attention_dq::build_for(
            c.dtype("dtype")?,
            &setup.cfg,
            dims,
        )?)
    },
    reference: |c, a| Ok(vec![reference_grads(c, a)?.0]),
    check: |c, k, a| check(c, k, a, false),
    tolerance: grad_tolerance,
    sample: |c, k, seed| sample(c, k, seed, true, false),
    presets: &[Preset {
        name: "masked_attention_dq_local_and_global",
        about: "masked attention backward, dq, a local and a causal head",
        config: LOCAL_AND_GLOBAL,
        shapes: &[],
    }],
};

/// [`masked_attention_dkv`](mod@masked_attention_dkv) in the library.
pub const MASKED_ATTENTION_DKV: Entry = Entry {
    name: "masked_attention_dkv",
    fixed_inputs: Some(|c, s| fixed(c, s, true, 9)),
    backward: None,
    about: "masked attention backward: dk and dv, over the transposed block tables",
    params: MASKED_PARAMS,
    inputs: |c| shapes(c, true, true),
    build: |c, s| {
        let setup = Setup::new(c, &s[3], &s[4])?;
        let dims = super::masked_backward::masked_attention_dkv::Dims::from_shapes(&refs(s))?;
        Ok(masked_attention_dkv::build_for(
            c.dtype("dtype")?,
            &setup.cfg,
            dims,
        )?)
    },
    reference: |c, a| {
        let (_, dk, dv) = reference_grads(c, a)?;
        Ok(vec![dk, dv])
    },
    check: |c, k, a| check(c, k, a, true),
    tolerance: grad_tolerance,
    sample: |c, k, seed| sample(c, k, seed, true, true),
    presets: &[Preset {
        name: "masked_attention_dkv_chunked_gqa_bf16",
        about: "masked attention backward, dk and dv, chunked causal, GQA, bf16",
        config: CHUNKED_BF16,
        shapes: &[("k", &[1, 1, 256, 64]), ("v", &[1, 1, 256, 64])],
    }],
};
