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
use kernel_ir::{Element, KernelErrors, VerifiedKernel};

use super::{MASK_VALUE, normalized, online_softmax_init, online_update};

/// Config of [`paged_decode_attention()`].
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeConfig {
    /// Score scale, usually `1/√d`.
    pub sm_scale: f32,
}

/// Paged decode attention.
#[tpu_kernel(grid = (b, hkv, pages_per_seq), semantics = (parallel, parallel, arbitrary))]
pub fn paged_decode_attention<T: Element>(
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
        online_softmax_init(m, l, acc);
    }
    if p * page < len {
        let qb = q.load((0, 0, .., ..));
        let kb = k_pages.load((0, 0, .., ..));
        let pos = iota(I32, [g, page], 1) + p * page;
        let s = select(pos < len, dot(qb, kb.t()) * cfg.sm_scale, MASK_VALUE);
        // Slots past the length may hold anything (a freed page's data).
        let row = iota(I32, [page, d], 0) + p * page;
        let vb = select(row < len, v_pages.load((0, 0, .., ..)), 0.0);
        online_update(g, m, l, acc, s, vb);
    }
    if p == num_programs(2) - 1 {
        // A sequence of length 0 (or less) attends to nothing: o = 0.
        let (out, _) = normalized(m, l, acc);
        o.store((0, 0, .., ..), out.cast::<T>());
    }
}

/// [`paged_decode_attention()`] for a dtype.
pub fn paged_decode_attention(
    cfg: &DecodeConfig,
    dtype: DType,
    dims: paged_decode_attention::Dims,
) -> Result<VerifiedKernel, KernelErrors> {
    match dtype {
        DType::BF16 => paged_decode_attention::build::<bf16>(cfg, dims),
        DType::F16 => paged_decode_attention::build::<f16>(cfg, dims),
        DType::F32 => paged_decode_attention::build::<f32>(cfg, dims),
        other => Err(crate::foundation::unsupported(
            "paged_decode_attention",
            other,
        )),
    }
}
