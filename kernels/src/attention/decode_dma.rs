//! Paged decode attention the way production TPU kernels move its data:
//! K/V pages copied by hand from the HBM pools, several pages per grid
//! step, double-buffered across steps.
//!
//! The grid is `(b, hkv, pages_per_seq / pages_per_block)`. Step `p`
//! works on block `p` of a sequence: `pages_per_block` pages, each its own
//! copy from the page pool (the pool page is read from the block table in
//! scalar prefetch), all signalling one DMA semaphore per buffer slot and
//! per K/V. Step 0 of a sequence starts its block 0; every step starts the
//! next block into the other slot *before* waiting on its own, so the next
//! copies overlap this step's matmuls. Blocks past the sequence's length
//! are neither copied nor computed, so a step's copies never outlive its
//! sequence (the parallel dims change only after the last wait).
//!
//! Same inputs, outputs and reference as the BlockSpec version
//! ([`super::decode`]), which fetches one page per step through an index
//! map; this one moves `pages_per_block` pages per step, fewer, larger
//! steps with the fetch of the next block hidden behind the compute.

use kernel_ir::prelude::*;

use super::decode::{attend_tokens, paged_check, paged_inputs, paged_reference, paged_sample};
use super::{Online, normalized, online_softmax_init};
use crate::entry::{DTYPE, Entry, EntryError, ParamKind, Preset, param, refs};
use crate::tolerance::Tolerance;

/// Config of [`paged_decode_attention_dma`](mod@paged_decode_attention_dma).
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeDmaConfig {
    /// Score scale, usually `1/√d`.
    pub sm_scale: f32,
    /// Pages copied (and attended) per grid step; divides `pages_per_seq`.
    pub pages_per_block: usize,
}

/// The paged KV cache, its page tables, and the double buffer (with its
/// semaphores) its pages are copied into: what every page copy names.
#[derive(Clone, Copy)]
pub(super) struct PageCopies {
    /// `[sequences, blocks]` page of each block.
    pub(super) block_tables: Ref,
    /// The K pages.
    pub(super) k_pages: Ref,
    /// The V pages.
    pub(super) v_pages: Ref,
    /// The two K buffer slots.
    pub(super) kbuf: Ref,
    /// The two V buffer slots.
    pub(super) vbuf: Ref,
    /// `[2, 2]` DMA semaphores: K/V by slot.
    pub(super) sems: SemArray,
}

/// Starts (or, with `wait`, waits on) the copies of block `blk` of
/// sequence `bi`, kv head `hk`, into buffer slot `slot`: one copy per page
/// and per K/V, the K copies on `sems[0, slot]`, the V copies on
/// `sems[1, slot]`.
#[kernel_fn]
pub(super) fn block_copies(
    ppb: usize,
    pc: PageCopies,
    (bi, hk): (Tile, Tile),
    (blk, slot): (Tile, Tile),
    wait: bool,
) {
    let PageCopies {
        block_tables,
        k_pages,
        v_pages,
        kbuf,
        vbuf,
        sems,
    } = pc;
    #[unroll]
    for j in 0..ppb {
        let page = block_tables.load((bi, blk * ppb + j));
        let kc = make_async_copy(
            k_pages.slice((hk, page, .., ..)),
            kbuf.slice((slot, j, .., ..)),
            sems.at((0, slot)),
        );
        let vc = make_async_copy(
            v_pages.slice((hk, page, .., ..)),
            vbuf.slice((slot, j, .., ..)),
            sems.at((1, slot)),
        );
        if wait {
            kc.wait();
            vc.wait();
        } else {
            kc.start();
            vc.start();
        }
    }
}

/// Paged decode attention with hand-made, double-buffered page copies.
#[tpu_kernel(
    grid = (b, hkv, pages_per_seq / cfg.pages_per_block),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn paged_decode_attention_dma<T: Float>(
    cfg: &DecodeDmaConfig,
    #[shape(b)] lengths: Prefetch,
    #[shape(b, pages_per_seq)] block_tables: Prefetch,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    q: In<T>,
    #[any]
    #[shape(hkv, pages, page, d)]
    k_pages: In<T>,
    #[any]
    #[shape(hkv, pages, page, d)]
    v_pages: In<T>,
    #[shape(b, hkv, g, d)]
    #[block([1, 1, g, d], |bi, hk, _| (bi, hk, 0, 0))]
    o: Out<T>,
    #[shape(2, cfg.pages_per_block, page, d)] kbuf: Scratch<T>,
    #[shape(2, cfg.pages_per_block, page, d)] vbuf: Scratch<T>,
    #[shape(2, 2)] sems: DmaSemaphores,
    #[shape(g, 128)] m: Scratch<f32>,
    #[shape(g, 128)] l: Scratch<f32>,
    #[shape(g, d)] acc: Scratch<f32>,
) {
    let ppb = cfg.pages_per_block;
    let tokens = ppb * page;
    let (bi, hk, p) = (program_id(0), program_id(1), program_id(2));
    let len = lengths.load([bi]);
    // Blocks this sequence needs (0 for an empty one).
    let blocks = (len + (tokens as i32 - 1)) / tokens as i32;
    let slot = p % 2;
    let pc = PageCopies {
        block_tables,
        k_pages,
        v_pages,
        kbuf,
        vbuf,
        sems,
    };
    if p == 0 {
        online_softmax_init(Online { m, l, acc });
        if blocks > 0 {
            block_copies(ppb, pc, (bi, hk), (p, slot), false);
        }
    }
    if p < blocks {
        // The next block's copies run while this block is computed.
        if p + 1 < blocks {
            block_copies(ppb, pc, (bi, hk), (p + 1, (p + 1) % 2), false);
        }
        block_copies(ppb, pc, (bi, hk), (p, slot), true);
        let kb = kbuf.load((slot, .., .., ..)).reshape([tokens, d]);
        let vb = vbuf.load((slot, .., .., ..)).reshape([tokens, d]);
        attend_tokens(
            cfg.sm_scale,
            Online { m, l, acc },
            q.load((0, 0, .., ..)),
            (kb, vb),
            p * tokens,
            len,
        );
    }
    if p == num_programs(2) - 1 {
        // A sequence of length 0 attends to nothing: o = 0.
        let (out, _) = normalized(Online { m, l, acc });
        o.store((0, 0, .., ..), out.cast::<T>());
    }
}

/// [`paged_decode_attention_dma`](mod@paged_decode_attention_dma) in the library.
pub const PAGED_DECODE_ATTENTION_DMA: Entry = Entry {
    name: "paged_decode_attention_dma",
    fixed_inputs: None,
    backward: None,
    about: "paged decode attention with K/V pages copied by hand (manual DMA), several pages per step, double-buffered across steps",
    params: &[
        DTYPE,
        param(
            "sm_scale",
            ParamKind::Scale,
            "auto",
            "score scale; auto = 1/sqrt(head_dim)",
        ),
        param(
            "pages_per_block",
            ParamKind::Positive,
            "4",
            "pages copied per grid step; divides pages_per_seq",
        ),
    ],
    inputs: paged_inputs,
    build: |c, s| {
        let dims = paged_decode_attention_dma::Dims::from_shapes(&refs(s))?;
        let ppb = c.usize("pages_per_block")?;
        if dims.pages_per_seq % ppb != 0 {
            return Err(EntryError::Shape(format!(
                "block_tables has {} pages per sequence, which pages_per_block = {ppb} does not divide; pick a divisor",
                dims.pages_per_seq
            )));
        }
        let cfg = DecodeDmaConfig {
            sm_scale: c.scale("sm_scale", dims.d)?,
            pages_per_block: ppb,
        };
        Ok(paged_decode_attention_dma::build_for(
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
        name: "paged_decode_attention_dma_bf16",
        about: "paged decode with manual DMA: 4 sequences, 8 pages of 16, 4 pages per step double-buffered, bf16",
        config: &[("dtype", "bf16"), ("sm_scale", "0.088")],
        shapes: &[],
    }],
};
