//! Decode attention over a paged KV cache: one new query token per
//! sequence attends to that sequence's cached keys and values, which live
//! in fixed-size pages scattered through a shared pool.
//!
//! The block table (`[b, pages_per_seq]`, the pool page of each sequence
//! page) and the sequence lengths (`[b]`) are scalar prefetch: the K/V
//! index maps read the table, so each grid step fetches exactly the page it
//! needs, and steps past a sequence's last page re-use that page (no new
//! fetch) and skip their compute. The `h / hkv` query heads that share a
//! kv head are processed together, so each page is read once per kv head.
//!
//! Shapes: `q, o: [b, hkv, h / hkv, d]`, `k_pages, v_pages: [hkv, pages,
//! page_size, d]`.

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::{MASK_VALUE, Online, normalized, online_softmax_init, online_update};
use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, arg, in_range, param, refs, uniform_inputs,
};
use crate::reference;
use crate::tolerance::Tolerance;

/// Config of [`paged_decode_attention`](mod@paged_decode_attention).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeConfig {
    /// Score scale, usually `1/√d`.
    pub sm_scale: f32,
}

/// Paged decode attention.
#[tpu_kernel(grid = (b, hkv, pages_per_seq), semantics = (parallel, parallel, arbitrary))]
pub fn paged_decode_attention<T: Float>(
    cfg: &DecodeConfig,
    #[shape(b)] lengths: Prefetch,
    #[shape(b, pages_per_seq)] block_tables: Prefetch,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    q: In<T>,
    #[shape(hkv, pages, page, d)]
    #[block([1, 1, page, d], |bi, hk, p| (hk, block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    k_pages: In<T>,
    #[shape(hkv, pages, page, d)]
    #[block([1, 1, page, d], |bi, hk, p| (hk, block_tables[(bi, p.min(((lengths[bi] - 1) / page).max(0)))], 0, 0))]
    v_pages: In<T>,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    o: Out<T>,
    #[shape(g, 128)] m: Scratch<f32>,
    #[shape(g, 128)] l: Scratch<f32>,
    #[shape(g, d)] acc: Scratch<f32>,
) {
    let (bi, p) = (program_id(0), program_id(2));
    let len = lengths.load([bi]);
    if p == 0 {
        online_softmax_init(Online { m, l, acc });
    }
    if p * page < len {
        let kb = k_pages.load((0, 0, .., ..));
        let vb = v_pages.load((0, 0, .., ..));
        attend_tokens(
            cfg.sm_scale,
            Online { m, l, acc },
            q.load((0, 0, .., ..)),
            (kb, vb),
            p * page,
            len,
        );
    }
    if p == num_programs(2) - 1 {
        // A sequence of length 0 (or less) attends to nothing: o = 0.
        let (out, _) = normalized(Online { m, l, acc });
        o.store((0, 0, .., ..), out.cast::<T>());
    }
}

/// One online-softmax step of decode attention over `kb`, `vb`: keys
/// `first..first + tokens` of a sequence of `len` tokens, those at or past
/// `len` hidden (both paged kernels).
#[kernel_fn]
pub(super) fn attend_tokens(
    sm_scale: f32,
    st: Online,
    qb: Tile,
    (kb, vb): (Tile, Tile),
    first: Tile,
    len: Tile,
) {
    attend_scores(st, dot(qb, kb.t()) * sm_scale, vb, first, len);
}

/// The online-softmax step over scores `s` (`[g, tokens]`) of keys
/// `first..first + tokens` and their values `vb` (`[tokens, dv]`), keys at
/// or past `len` hidden: what every paged decode kernel does once it has
/// its scores.
#[kernel_fn]
pub(super) fn attend_scores(st: Online, s: Tile, vb: Tile, first: Tile, len: Tile) {
    // A tile whose op failed has no shape; its error is already recorded.
    let shape = s.shape();
    let g = shape.first().copied().unwrap_or(1);
    let tokens = shape.get(1).copied().unwrap_or(1);
    let pos = iota(I32, [g, tokens], 1) + first;
    let s = select(pos < len, s, MASK_VALUE);
    // Slots past the length may hold anything (a freed page's data).
    let row = iota(I32, vb.shape(), 0) + first;
    let vb = select(row < len, vb, 0.0);
    online_update(g, st, s, vb);
}

/// [`paged_decode_attention`](mod@paged_decode_attention) in the library.
pub const PAGED_DECODE_ATTENTION: Entry = Entry {
    name: "paged_decode_attention",
    fixed_inputs: None,
    backward: None,
    about: "decode attention over a paged KV cache (lengths and block tables as scalar prefetch)",
    params: &[
        DTYPE,
        param(
            "sm_scale",
            ParamKind::Scale,
            "auto",
            "score scale; auto = 1/sqrt(head_dim)",
        ),
    ],
    inputs: paged_inputs,
    build: |c, s| {
        let dims = paged_decode_attention::Dims::from_shapes(&refs(s))?;
        let cfg = DecodeConfig {
            sm_scale: c.scale("sm_scale", dims.d)?,
        };
        Ok(paged_decode_attention::build_for(
            c.dtype("dtype")?,
            &cfg,
            dims,
        )?)
    },
    reference: paged_reference,
    check: paged_check,
    tolerance: |c, _| vec![Tolerance::attention(c.dtype("dtype").unwrap_or(DType::F32))],
    sample: paged_sample,
    presets: &[Preset {
        name: "paged_decode_attention_4_seqs",
        about: "decode attention over a paged KV cache: 4 sequences, 8 pages of 16 each, block tables in scalar prefetch",
        config: &[("dtype", "bf16"), ("sm_scale", "0.088")],
        shapes: &[],
    }],
};

/// The f64 reference of the paged decode kernels (inputs in their order:
/// lengths, block tables, q, k pages, v pages).
pub(super) fn paged_reference(c: &Config, a: &[Array]) -> Result<Vec<Vec<f64>>, EntryError> {
    let lengths: Vec<usize> = a[0].data().iter().map(|&v| v.max(0.0) as usize).collect();
    let pps = a[1].shape()[1];
    let tables: Vec<Vec<usize>> = a[1]
        .data()
        .chunks(pps.max(1))
        .map(|r| r.iter().map(|&v| v.max(0.0) as usize).collect())
        .collect();
    let scale = c.scale("sm_scale", a[2].shape()[3])? as f64;
    Ok(vec![reference::paged_decode_attention(
        &a[2], &a[3], &a[4], &lengths, &tables, scale,
    )])
}

/// Lengths within the table's capacity and table entries within the pool.
pub(super) fn paged_check(_: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    // k_pages: [hkv, pages, page, d].
    tables_in_range(k, a, "k_pages", 1)
}

/// The check of every paged kernel: `lengths` within `pages_per_seq ×
/// page` tokens and `block_tables` within the pool `pool` (its pages
/// along axis `pages_axis`, a page's tokens along the next).
pub(super) fn tables_in_range(
    k: &VerifiedKernel,
    a: &[Array],
    pool: &str,
    pages_axis: usize,
) -> Result<(), EntryError> {
    let tables = arg(k, a, "block_tables").map_or(&[][..], |t| t.shape());
    let pages_per_seq = tables.get(1).copied().unwrap_or(0);
    let pool = arg(k, a, pool).map_or(&[][..], |k| k.shape());
    let (pages, page) = (
        pool.get(pages_axis).copied().unwrap_or(0),
        pool.get(pages_axis + 1).copied().unwrap_or(0),
    );
    in_range(
        arg(k, a, "lengths"),
        "lengths",
        0.0,
        (pages_per_seq * page) as f64,
        "a sequence holds at most pages_per_seq x page tokens",
    )?;
    in_range(
        arg(k, a, "block_tables"),
        "block_tables",
        0.0,
        pages as f64 - 1.0,
        "the pages of the pool",
    )
}

/// Distinct pages per sequence where the pool holds them, and lengths from
/// 0 (an empty sequence) to full.
pub(super) fn paged_sample(c: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = uniform_inputs(c, k, seed);
    let (b, pps) = (v[1].shape()[0], v[1].shape()[1]);
    let (pool, page) = (v[3].shape()[1], v[3].shape()[2]);
    if let Some((l, t)) = paged_tables(b, pps, pool, page, seed) {
        v[0] = l;
        v[1] = t;
    }
    v
}

/// Lengths (`[b]`) and block tables (`[b, pps]`) for a pool of `pool`
/// pages of `page` tokens: distinct pages for every sequence when the
/// pool holds them, and lengths from 0 (an empty sequence) to full.
pub(super) fn paged_tables(
    b: usize,
    pps: usize,
    pool: usize,
    page: usize,
    seed: u64,
) -> Option<(Array, Array)> {
    let mut rng = kernel_ir::SplitMix64(seed);
    let mut perm: Vec<usize> = (0..pool.max(b * pps)).map(|p| p % pool.max(1)).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let tables: Vec<f64> = perm[..b * pps].iter().map(|&p| p as f64).collect();
    let lengths: Vec<f64> = (0..b).map(|_| rng.below(pps * page + 1) as f64).collect();
    Some((
        Array::new(DType::I32, [b], lengths).ok()?,
        Array::new(DType::I32, [b, pps], tables).ok()?,
    ))
}

/// The default inputs of both paged decode kernels: 4 sequences of up to 8
/// pages of 16 tokens, GQA 8/2, head dim 128, a pool of 40 pages.
pub(super) fn paged_inputs(_: &Config) -> Result<crate::entry::Shapes, EntryError> {
    Ok(vec![
        ("lengths", vec![4]),
        ("block_tables", vec![4, 8]),
        ("q", vec![4, 2, 4, 128]),
        ("k_pages", vec![2, 40, 16, 128]),
        ("v_pages", vec![2, 40, 16, 128]),
    ])
}
