//! Ragged paged attention that first writes the step's new keys and
//! values into the paged cache: one kernel per serving step, as
//! tpu-inference's ragged paged attention v3 fuses its `update_kv_cache`.
//!
//! The batch is [`super::ragged`]'s; the new tokens' keys and values come
//! as `new_k, new_v: [hkv, t, d]`, token-major like `q`. Token `i` of a
//! sequence with `q` new and `kv` total tokens sits at position `kv − q +
//! i`, so it belongs in page `page_tables[s][pos / page]`, slot `pos %
//! page`. The pools are in-out (`k_pages, v_pages` come back with the rows
//! written); they and the new rows stay in HBM: each visit copies its
//! sequence's rows of the block into their slots (one HBM-to-HBM DMA per
//! row and K/V, as a row of a VMEM block cannot start a TPU DMA at any
//! sublane), waits, then attends
//! as `ragged_paged_attention` does. A sequence's earlier rows were written by its
//! earlier visits (visits run in token order per kv head), and causality
//! means no row needs a later one. Different sequences must not write the
//! same slot, nor read another's new slot (the entry checks both).

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::ragged::{
    RAGGED_PARAMS, RaggedBatch, RaggedConfig, RaggedRefs, check, check_shapes, config, ints,
    ragged_visit, reference, sample, visits,
};
use crate::entry::{Config, Entry, EntryError, Preset, refs};
use crate::tolerance::Tolerance;

/// [`super::ragged::ragged_paged_attention`] with the new tokens' keys and
/// values written into the pools first.
#[tpu_kernel(grid = (hkv, visits), semantics = (parallel, arbitrary))]
pub fn ragged_paged_attention_update<T: Float>(
    cfg: &RaggedConfig,
    #[shape(seqs_plus_one)] cu_q_lens: Prefetch,
    #[shape(seqs)] kv_lens: Prefetch,
    #[shape(seqs, pages_per_seq)] page_tables: Prefetch,
    #[shape(visits)] visit_seq: Prefetch,
    #[shape(visits)] visit_qblk: Prefetch,
    #[shape(h, t, d)]
    #[block([h / hkv, cfg.block_q, d], |hk, v| (hk, visit_qblk[v], 0))]
    q: In<T>,
    #[any]
    #[shape(hkv, t, d)]
    new_k: In<T>,
    #[any]
    #[shape(hkv, t, d)]
    new_v: In<T>,
    #[any]
    #[shape(hkv, pages, page, d)]
    k_pages: InOut<T>,
    #[any]
    #[shape(hkv, pages, page, d)]
    v_pages: InOut<T>,
    #[shape(h, t, d)]
    #[block([h / hkv, cfg.block_q, d], |hk, v| (hk, visit_qblk[v], 0))]
    o: Out<T>,
    #[shape(2, cfg.pages_per_block, page, d)] kbuf: Scratch<T>,
    #[shape(2, cfg.pages_per_block, page, d)] vbuf: Scratch<T>,
    #[shape(2, 2)] sems: DmaSemaphores,
    #[shape(2, 8 * T::DTYPE.packing(), d)] stage: Scratch<T>,
    #[shape(2)] writes: DmaSemaphores,
    #[shape(h / hkv * cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(h / hkv * cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(h / hkv * cfg.block_q, d)] acc: Scratch<f32>,
    #[shape(h / hkv, cfg.block_q, d)] merged: Scratch<f32>,
) {
    let (hk, v) = (program_id(0), program_id(1));
    let seq = visit_seq.load([v]);
    let blk_start = visit_qblk.load([v]) * cfg.block_q as i32;
    let (q_start, q_end) = (cu_q_lens.load([seq]), cu_q_lens.load([seq + 1]));
    let offset = kv_lens.load([seq]) - q_end;
    // This visit's rows of its sequence, written before anything reads.
    let rows = 8 * T::DTYPE.packing();
    for r in q_start.max(blk_start)..q_end.min(blk_start + cfg.block_q as i32) {
        let pos = offset + r;
        let at = (hk, page_tables.load((seq, pos / page as i32)));
        let (from, to) = (r, pos % page as i32);
        write_row((new_k, k_pages), (stage, writes), at, (from, to), rows);
        write_row((new_v, v_pages), (stage, writes), at, (from, to), rows);
    }
    let refs = RaggedRefs {
        cu_q_lens,
        kv_lens,
        page_tables,
        visit_seq,
        visit_qblk,
        q,
        k_pages,
        v_pages,
        o,
        kbuf,
        vbuf,
        sems,
        m,
        l,
        acc,
        merged,
    };
    ragged_visit(cfg, (h, hkv, d, page), refs);
}

/// Writes row `from` of `src[hk]` (`[t, d]`) into row `to` of page `pg`
/// of `pool[hk]`. A TPU DMA moves whole `(8·packing, 128)` tiles, so the
/// row goes by read-modify-write of the aligned tiles around both: the
/// source tile and the pool tile are copied into `stage`, the row is picked
/// (a masked sum over the tile's rows, exact) and put in its place (a
/// select), and the pool tile is copied back.
#[kernel_fn]
fn write_row(
    (src, pool): (Ref, Ref),
    (stage, sems): (Ref, SemArray),
    (hk, pg): (Tile, Tile),
    (from, to): (Tile, Tile),
    rows: usize,
) {
    let (fb, tb) = (
        (from / rows as i32) * rows as i32,
        (to / rows as i32) * rows as i32,
    );
    let tile_of_src = src.slice((hk, ds(fb, rows), ..));
    let tile_of_pool = pool.slice((hk, pg, ds(tb, rows), ..));
    let a = make_async_copy(tile_of_src, stage.slice((0, .., ..)), sems.at(0));
    let b = make_async_copy(tile_of_pool, stage.slice((1, .., ..)), sems.at(1));
    a.start();
    b.start();
    a.wait();
    b.wait();
    let new_rows = stage.load((0, .., ..)).convert(F32);
    let shape = new_rows.shape();
    let row = select(iota(I32, shape.clone(), 0) == from - fb, new_rows, 0.0).sum_keep(0);
    let old = stage.load((1, .., ..));
    let put = select(iota(I32, shape, 0) == to - tb, row, old.convert(F32));
    stage.store((1, .., ..), put.convert(old.dtype()));
    let back = make_async_copy(
        stage.slice((1, .., ..)),
        pool.slice((hk, pg, ds(tb, rows), ..)),
        sems.at(1),
    );
    back.start();
    back.wait();
}

/// The batch of `a` (the entry's arguments) as the references read it.
fn batch_of(a: &[Array]) -> (Vec<usize>, Vec<usize>, Vec<Vec<usize>>) {
    let tables = ints(&a[2])
        .chunks(a[2].shape()[1].max(1))
        .map(<[usize]>::to_vec)
        .collect();
    (ints(&a[0]), ints(&a[1]), tables)
}

/// Where each sequence's new tokens go: `(sequence, token, page, slot)`.
fn new_slots(
    (cu, kv, tables): (&[usize], &[usize], &[Vec<usize>]),
    page: usize,
) -> Vec<(usize, usize, usize, usize)> {
    let mut out = Vec::new();
    for s in 0..kv.len() {
        let (q0, q1) = (cu[s], cu[s + 1]);
        for tok in q0..q1 {
            let pos = kv[s] + tok - q1;
            out.push((s, tok, tables[s][pos / page], pos % page));
        }
    }
    out
}

/// The f64 reference: the pools with every new row written (from the
/// definition of a token's position), then the ragged reference on them.
/// Outputs `k_pages`, `v_pages`, `o`.
pub fn update_reference(a: &[Array], cfg: &RaggedConfig) -> Vec<Vec<f64>> {
    let (cu, kv, tables) = batch_of(a);
    let (q, new_k, new_v) = (&a[5], &a[6], &a[7]);
    let (t, d) = (q.shape()[1], q.shape()[2]);
    let [hkv, pages, page, _] = [
        a[8].shape()[0],
        a[8].shape()[1],
        a[8].shape()[2],
        a[8].shape()[3],
    ];
    let (mut kp, mut vp) = (a[8].data().to_vec(), a[9].data().to_vec());
    for (_, tok, pg, slot) in new_slots((&cu, &kv, &tables), page) {
        for hk in 0..hkv {
            let (dst, src) = (((hk * pages + pg) * page + slot) * d, (hk * t + tok) * d);
            kp[dst..dst + d].copy_from_slice(&new_k.data()[src..src + d]);
            vp[dst..dst + d].copy_from_slice(&new_v.data()[src..src + d]);
        }
    }
    let pool = |v: Vec<f64>| {
        Array::new(a[8].dtype(), a[8].shape().to_vec(), v)
            .unwrap_or_else(|_| Array::zeros(a[8].dtype(), a[8].shape().to_vec()))
    };
    let (kpa, vpa) = (pool(kp.clone()), pool(vp.clone()));
    let batch = RaggedBatch {
        cu_q_lens: &cu,
        kv_lens: &kv,
        tables: &tables,
    };
    let o = reference(q, (&kpa, &vpa), &batch, cfg);
    vec![kp, vp, o]
}

/// Besides the ragged checks: no two new tokens share a slot, and no
/// sequence reads a slot another writes (the visits of different
/// sequences are not ordered against each other's writes).
fn check_update(c: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    check(c, k, a)?;
    if a.len() < 10 {
        return Ok(());
    }
    let (cu, kv, tables) = batch_of(a);
    let page = a[8].shape()[2];
    let mut writer = std::collections::HashMap::new();
    for (s, _, pg, slot) in new_slots((&cu, &kv, &tables), page) {
        if let Some(other) = writer.insert((pg, slot), s) {
            return Err(EntryError::Input(format!(
                "sequences {other} and {s} both write page {pg} slot {slot}; give each sequence's new tokens pages of their own"
            )));
        }
    }
    for (s, &len) in kv.iter().enumerate() {
        for pos in 0..len {
            let at = (tables[s][pos / page], pos % page);
            if let Some(&w) = writer.get(&at)
                && w != s
            {
                return Err(EntryError::Input(format!(
                    "sequence {s} reads page {} slot {} that sequence {w} writes in this step; a page a step writes must belong to one sequence",
                    at.0, at.1
                )));
            }
        }
    }
    Ok(())
}

/// [`ragged_paged_attention_update`](mod@ragged_paged_attention_update) in the library.
pub const RAGGED_PAGED_ATTENTION_UPDATE: Entry = Entry {
    name: "ragged_paged_attention_update",
    fixed_inputs: None,
    backward: None,
    about: "ragged paged attention that writes the step's new k/v rows into the paged cache first (in-out pools, one DMA per row), then attends: one kernel per serving step",
    params: RAGGED_PARAMS,
    inputs: |c| {
        let (seqs, t) = (4, 64);
        let v = visits(t, c.usize("block_q")?, seqs);
        Ok(vec![
            ("cu_q_lens", vec![seqs + 1]),
            ("kv_lens", vec![seqs]),
            ("page_tables", vec![seqs, 8]),
            ("visit_seq", vec![v]),
            ("visit_qblk", vec![v]),
            ("q", vec![4, t, 128]),
            ("new_k", vec![2, t, 128]),
            ("new_v", vec![2, t, 128]),
            ("k_pages", vec![2, 40, 16, 128]),
            ("v_pages", vec![2, 40, 16, 128]),
        ])
    },
    build: |c, s| {
        let dims = ragged_paged_attention_update::Dims::from_shapes(&refs(s))?;
        let cfg = config(c, dims.d)?;
        let ragged_paged_attention_update::Dims {
            seqs_plus_one,
            seqs,
            h,
            hkv,
            t,
            pages_per_seq,
            visits,
            ..
        } = dims;
        check_shapes(
            &cfg,
            [seqs_plus_one, seqs, h, hkv, t, pages_per_seq, visits],
        )?;
        let dtype = c.dtype("dtype")?;
        let rows = 8 * dtype.packing();
        if dims.page % rows != 0 || t % rows != 0 {
            return Err(EntryError::Shape(format!(
                "pages of {} tokens and {t} new tokens: the cache is written a {rows}-row tile at a time ({dtype}), so give both as multiples of {rows}",
                dims.page
            )));
        }
        Ok(ragged_paged_attention_update::build_for(dtype, &cfg, dims)?)
    },
    reference: |c, a| Ok(update_reference(a, &config(c, a[5].shape()[2])?)),
    check: check_update,
    tolerance: |c, _| {
        let exact = Tolerance { abs: 0.0, rel: 0.0 };
        let d = c.dtype("dtype").unwrap_or(DType::F32);
        vec![exact, exact, Tolerance::attention(d)]
    },
    sample,
    presets: &[Preset {
        name: "ragged_paged_attention_update_mixed",
        about: "ragged paged attention writing its new k/v first: 4 sequences (prefills and decodes) over 64 bf16 tokens, GQA 4/2",
        config: &[("dtype", "bf16"), ("sm_scale", "0.088")],
        shapes: &[],
    }],
};
