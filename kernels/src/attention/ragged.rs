//! Ragged paged attention: one call over a batch that mixes prefill and
//! decode sequences, as vLLM's TPU backend runs it.
//!
//! The new query tokens of every sequence are concatenated: `q, o: [h, t,
//! d]` (heads kv-head major: head `hk · g + i` reads kv head `hk`), with
//! sequence `s`'s tokens at `cu_q_lens[s]..cu_q_lens[s + 1]`. Its keys and
//! values (`kv_lens[s]` of them, the new tokens last) live in pages of the
//! HBM pools `k_pages, v_pages: [hkv, pages, page, d]`, listed by
//! `page_tables[s]`. Query token `i` of a sequence with `q` new and `kv`
//! total tokens sits at position `kv − q + i` and sees the keys at or
//! before it (causal within the sequence), within the window when one is
//! set, with optional soft-capped scores.
//!
//! The grid is `(hkv, visits)`. Query blocks of `block_q` tokens may hold
//! the tail of one sequence and the head of the next, so the grid walks
//! *visits*, (q block, sequence) pairs in token order, from a schedule
//! computed on the host ([`ragged_metadata`], scalar prefetch, as the MoE
//! grouped matmul does): a visit attends its sequence's rows of the block,
//! looping over that sequence's kv blocks (`pages_per_block` pages each)
//! with the copies of the next kv block started before the wait on this
//! one (double-buffered inside the step), and merges its rows into an f32
//! block; the block's last visit writes it out. Tokens past the last
//! sequence (padding) get `o = 0`.

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use super::decode_dma::{PageCopies, block_copies};
use super::{MASK_VALUE, Online, normalized, online_softmax_init, online_update};
use crate::entry::{Config, DTYPE, Entry, EntryError, ParamKind, Preset, arg, param, refs};
use crate::tolerance::Tolerance;

/// Config of [`ragged_paged_attention`](mod@ragged_paged_attention).
#[derive(Clone, Debug, PartialEq)]
pub struct RaggedConfig {
    /// Score scale, usually `1/√d`.
    pub sm_scale: f32,
    /// Query tokens per block; divides the token count.
    pub block_q: usize,
    /// Pages copied per kv step; divides the pages per sequence.
    pub pages_per_block: usize,
    /// Sliding window: keys more than `window − 1` before a query are
    /// hidden.
    pub window: Option<usize>,
    /// Logit soft-cap: `s = cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
}

impl RaggedConfig {
    /// How far before a query its earliest visible key is: `window − 1`,
    /// or far beyond any sequence without a window.
    pub fn reach(&self) -> i32 {
        self.window
            .map_or(1 << 30, |w| w.saturating_sub(1).min(1 << 30) as i32)
    }
}

/// The visit schedule of a ragged batch (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaggedMetadata {
    /// The sequence of each visit.
    pub seq_ids: Vec<i32>,
    /// The query block of each visit.
    pub qblk_ids: Vec<i32>,
}

/// The most visits a batch of `seqs` sequences over `t` tokens needs:
/// every query block once, plus one per sequence boundary inside a block.
pub fn visits(t: usize, block_q: usize, seqs: usize) -> usize {
    (cdiv(t, block_q) + seqs.saturating_sub(1)).max(1)
}

/// The schedule of sequences at `cu_q_lens` (`[seqs + 1]`, from 0, not
/// decreasing, at most `t`): every query block once per sequence with rows
/// in it (a block of padding only: once, for the last sequence), in token
/// order; unused visits repeat the last one.
///
/// ```
/// use kernels::attention::ragged::ragged_metadata;
/// // A 20-token prefill and two decodes, over 32 tokens in blocks of 16.
/// let m = ragged_metadata(&[0, 20, 21, 22], 32, 16);
/// assert_eq!(m.qblk_ids, [0, 1, 1, 1]);
/// assert_eq!(m.seq_ids, [0, 0, 1, 2]);
/// ```
pub fn ragged_metadata(cu_q_lens: &[usize], t: usize, block_q: usize) -> RaggedMetadata {
    let seqs = cu_q_lens.len().saturating_sub(1);
    let (mut seq_ids, mut qblk_ids) = (Vec::new(), Vec::new());
    for qb in 0..cdiv(t, block_q) {
        let (lo, hi) = (qb * block_q, (qb + 1) * block_q);
        let before = seq_ids.len();
        for s in 0..seqs {
            if cu_q_lens[s].max(lo) < cu_q_lens[s + 1].min(hi) {
                seq_ids.push(s as i32);
                qblk_ids.push(qb as i32);
            }
        }
        if seq_ids.len() == before {
            seq_ids.push(seqs.saturating_sub(1) as i32);
            qblk_ids.push(qb as i32);
        }
    }
    let n = visits(t, block_q, seqs);
    while seq_ids.len() < n {
        seq_ids.push(seq_ids.last().copied().unwrap_or(0));
        qblk_ids.push(qblk_ids.last().copied().unwrap_or(0));
    }
    RaggedMetadata { seq_ids, qblk_ids }
}

/// Ragged paged attention over a mixed prefill/decode batch.
#[tpu_kernel(grid = (hkv, visits), semantics = (parallel, arbitrary))]
pub fn ragged_paged_attention<T: Float>(
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
    #[shape(hkv, pages, page, d)]
    k_pages: In<T>,
    #[any]
    #[shape(hkv, pages, page, d)]
    v_pages: In<T>,
    #[shape(h, t, d)]
    #[block([h / hkv, cfg.block_q, d], |hk, v| (hk, visit_qblk[v], 0))]
    o: Out<T>,
    #[shape(2, cfg.pages_per_block, page, d)] kbuf: Scratch<T>,
    #[shape(2, cfg.pages_per_block, page, d)] vbuf: Scratch<T>,
    #[shape(2, 2)] sems: DmaSemaphores,
    #[shape(h / hkv * cfg.block_q, 128)] m: Scratch<f32>,
    #[shape(h / hkv * cfg.block_q, 128)] l: Scratch<f32>,
    #[shape(h / hkv * cfg.block_q, d)] acc: Scratch<f32>,
    #[shape(h / hkv, cfg.block_q, d)] merged: Scratch<f32>,
) {
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

/// What one visit of a ragged kernel reads and keeps: the schedule and
/// tables (scalar prefetch), q, the page pools, o, and its scratch.
#[derive(Clone, Copy)]
pub(crate) struct RaggedRefs {
    pub(crate) cu_q_lens: Ref,
    pub(crate) kv_lens: Ref,
    pub(crate) page_tables: Ref,
    pub(crate) visit_seq: Ref,
    pub(crate) visit_qblk: Ref,
    pub(crate) q: Ref,
    pub(crate) k_pages: Ref,
    pub(crate) v_pages: Ref,
    pub(crate) o: Ref,
    pub(crate) kbuf: Ref,
    pub(crate) vbuf: Ref,
    pub(crate) sems: SemArray,
    pub(crate) m: Ref,
    pub(crate) l: Ref,
    pub(crate) acc: Ref,
    pub(crate) merged: Ref,
}

/// One visit (grid step `(hk, v)`): the visit's sequence's rows of its
/// query block attend over that sequence's pages, merged into the block's
/// f32 rows; the block's last visit writes `o`.
#[kernel_fn]
pub(crate) fn ragged_visit(
    cfg: &RaggedConfig,
    (h, hkv, d, page): (usize, usize, usize, usize),
    r: RaggedRefs,
) {
    let RaggedRefs {
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
    } = r;
    let (bq, ppb) = (cfg.block_q, cfg.pages_per_block);
    let g = h / hkv;
    let rows = g * bq;
    let tokens = ppb * page;
    let (hk, v) = (program_id(0), program_id(1));
    let last = num_programs(1) - 1;
    let seq = visit_seq.load([v]);
    let qb = visit_qblk.load([v]);
    let q_start = cu_q_lens.load([seq]);
    let q_end = cu_q_lens.load([seq + 1]);
    let kv_len = kv_lens.load([seq]);
    // Query token t of the sequence sits at position offset + t.
    let offset = kv_len - q_end;
    let blk_start = qb * bq as i32;
    let r0 = q_start.max(blk_start);
    let r1 = q_end.min(blk_start + bq as i32);
    if v == 0 || visit_qblk.load([(v - 1).max(0)]) != qb {
        merged.store(.., 0.0);
    }
    if r0 < r1 {
        // The kv blocks the block's rows of this sequence see.
        let reach = cfg.reach();
        let start = (offset + r0 - reach).max(0) / tokens as i32;
        let end = (offset + r1 - 1 + tokens as i32) / tokens as i32;
        online_softmax_init(Online { m, l, acc });
        let pc = PageCopies {
            block_tables: page_tables,
            k_pages,
            v_pages,
            kbuf,
            vbuf,
            sems,
        };
        block_copies(
            ppb,
            pc,
            (seq, hk),
            (start, constant(0, I32, start.shape())),
            false,
        );
        let qt = q.load(..).reshape([rows, d]);
        let t = iota(I32, [g, bq, tokens], 1).reshape([rows, tokens]) + blk_start;
        let qpos = t + offset;
        let in_seq = t >= q_start && t < q_end;
        for kb in start..end {
            let slot = (kb - start) % 2;
            // The next kv block's copies run while this one is computed.
            if kb + 1 < end {
                block_copies(ppb, pc, (seq, hk), (kb + 1, 1 - slot), false);
            }
            block_copies(ppb, pc, (seq, hk), (kb, slot), true);
            let kt = kbuf.load((slot, .., .., ..)).reshape([tokens, d]);
            let mut s = dot(qt, kt.t()) * cfg.sm_scale;
            if let Some(cap) = cfg.softcap {
                s = (s / cap).tanh() * cap;
            }
            let key = iota(I32, [rows, tokens], 1) + kb * tokens as i32;
            let mut visible = in_seq && key <= qpos;
            if cfg.window.is_some() {
                visible = visible && qpos - key <= reach;
            }
            let s = select(visible, s, MASK_VALUE);
            // Slots past the length may hold anything (a freed page's data).
            let kv_row = iota(I32, [tokens, d], 0) + kb * tokens as i32;
            let vt = select(
                kv_row < kv_len,
                vbuf.load((slot, .., .., ..)).reshape([tokens, d]),
                0.0,
            );
            online_update(rows, Online { m, l, acc }, s, vt);
        }
        let (out, _) = normalized(Online { m, l, acc });
        let mine = iota(I32, [g, bq, d], 1) + blk_start;
        let mine = mine >= q_start && mine < q_end;
        merged.store(.., select(mine, out.reshape([g, bq, d]), merged.load(..)));
    }
    if v == last || visit_qblk.load([(v + 1).min(last)]) != qb {
        o.store(.., merged.load(..).convert(o.dtype()));
    }
}

/// A ragged batch as the reference reads it: where each sequence's new
/// tokens start (`cu_q_lens`, one more than there are sequences), each
/// sequence's kv length, and its page table.
#[derive(Clone, Copy, Debug)]
pub struct RaggedBatch<'a> {
    /// Cumulative new-token counts, starting at 0.
    pub cu_q_lens: &'a [usize],
    /// Tokens in each sequence's KV cache (the new ones included).
    pub kv_lens: &'a [usize],
    /// Each sequence's pages, in order.
    pub tables: &'a [Vec<usize>],
}

/// The f64 reference: per sequence, head and new token, causal (and
/// windowed, soft-capped) attention over the sequence's pages; padding
/// tokens give 0.
pub fn reference(
    q: &Array,
    (k_pages, v_pages): (&Array, &Array),
    batch: &RaggedBatch<'_>,
    cfg: &RaggedConfig,
) -> Vec<f64> {
    let RaggedBatch {
        cu_q_lens,
        kv_lens,
        tables,
    } = *batch;
    let (scale, window) = (f64::from(cfg.sm_scale), cfg.window);
    let softcap = cfg.softcap.map(f64::from);
    let [h, t, d] = [q.shape()[0], q.shape()[1], q.shape()[2]];
    let (hkv, pages, page) = (k_pages.shape()[0], k_pages.shape()[1], k_pages.shape()[2]);
    let g = h / hkv.max(1);
    let (qd, kd, vd) = (q.data(), k_pages.data(), v_pages.data());
    let mut out = vec![0.0; h * t * d];
    for s in 0..kv_lens.len() {
        let (q0, q1, kv) = (cu_q_lens[s], cu_q_lens[s + 1], kv_lens[s]);
        for head in 0..h {
            let hk = head / g;
            let slot = |j: usize| ((hk * pages + tables[s][j / page]) * page + j % page) * d;
            for tok in q0..q1 {
                let pos = kv - (q1 - q0) + (tok - q0);
                let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qo = (head * t + tok) * d;
                let keys: Vec<usize> = (first..=pos).collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let dot: f64 = (0..d).map(|x| qd[qo + x] * kd[slot(j) + x]).sum();
                        let s = dot * scale;
                        softcap.map_or(s, |c| c * (s / c).tanh())
                    })
                    .collect();
                let (p, _) = crate::reference::softmax_lse(&scores);
                for x in 0..d {
                    out[qo + x] = keys.iter().zip(&p).map(|(&j, w)| w * vd[slot(j) + x]).sum();
                }
            }
        }
    }
    out
}

pub(crate) fn ints(a: &Array) -> Vec<usize> {
    a.data().iter().map(|&v| v.max(0.0) as usize).collect()
}

pub(crate) fn config(c: &Config, d: usize) -> Result<RaggedConfig, EntryError> {
    Ok(RaggedConfig {
        sm_scale: c.scale("sm_scale", d)?,
        block_q: c.usize("block_q")?,
        pages_per_block: c.usize("pages_per_block")?,
        window: c.opt_usize("window")?,
        softcap: c.opt_f32("softcap")?,
    })
}

/// The query lengths (from `cu_q_lens`, rising from 0 to at most the token
/// count), kv lengths (at least the query length, at most the table's
/// capacity), page tables (pages of the pool) and the schedule (the one
/// [`ragged_metadata`] makes).
pub(crate) fn check(_: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    let get = |n| arg(k, a, n).ok_or_else(|| EntryError::Input(format!("no input `{n}`")));
    let (cu, kv, tables, seq, qblk, q, kp) = (
        get("cu_q_lens")?,
        get("kv_lens")?,
        get("page_tables")?,
        get("visit_seq")?,
        get("visit_qblk")?,
        get("q")?,
        get("k_pages")?,
    );
    let t = q.shape()[1];
    let (pages, page) = (kp.shape()[1], kp.shape()[2]);
    let pps = tables.shape()[1];
    let c = cu.data();
    if c.first() != Some(&0.0)
        || c.windows(2).any(|w| w[0] > w[1])
        || c.last().is_some_and(|&l| l > t as f64)
    {
        return Err(EntryError::Input(format!(
            "cu_q_lens must rise from 0 to at most the {t} query tokens (the running sum of the query lengths), got {c:?}"
        )));
    }
    let cu = ints(cu);
    for (s, &kvl) in ints(kv).iter().enumerate() {
        let ql = cu[s + 1] - cu[s];
        if kvl < ql || kvl > pps * page {
            return Err(EntryError::Input(format!(
                "kv_lens[{s}] = {kvl} must be at least its {ql} new query tokens and at most the {} tokens its page table holds",
                pps * page
            )));
        }
    }
    if tables.data().iter().any(|&p| p < 0.0 || p >= pages as f64) {
        return Err(EntryError::Input(format!(
            "page_tables entries must be pages of the pool, 0..{pages}"
        )));
    }
    let bq = k
        .operands
        .iter()
        .find(|o| o.name == "q")
        .map_or(1, |o| o.block.shape[1]);
    let want = ragged_metadata(&cu, t, bq);
    let as_i32 = |a: &Array| a.data().iter().map(|&v| v as i32).collect::<Vec<_>>();
    if as_i32(seq) != want.seq_ids || as_i32(qblk) != want.qblk_ids {
        return Err(EntryError::Input(
            "visit_seq and visit_qblk are not the schedule of cu_q_lens; build them with kernels::attention::ragged::ragged_metadata".into(),
        ));
    }
    Ok(())
}

/// A mixed batch: decodes (one new token) and prefills (many), random
/// context lengths, distinct pages, its schedule; then random values for
/// the float inputs.
pub(crate) fn sample(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut v = batch_tables(k, seed);
    for (i, a) in k.arguments().enumerate().skip(v.len()) {
        v.push(Array::random(
            a.dtype,
            a.shape.to_vec(),
            seed + i as u64,
            -1.0,
            1.0,
        ));
    }
    v
}

/// The five scalar-prefetch inputs of a sampled mixed batch (see
/// [`sample`]) for a ragged kernel's shapes: `cu_q_lens`, `kv_lens`,
/// `page_tables` (no page in two sequences), `visit_seq`, `visit_qblk`.
pub(crate) fn batch_tables(k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let shape = |n: &str| {
        k.arguments()
            .find(|a| a.name == n)
            .map_or(vec![1; 4], |a| a.shape.to_vec())
    };
    let (seqs, pps) = (shape("page_tables")[0], shape("page_tables")[1]);
    let (t, pool, page) = (shape("q")[1], shape("k_pages")[1], shape("k_pages")[2]);
    let cap = pps * page;
    let mut rng = kernel_ir::SplitMix64(seed);
    let mut cu = vec![0usize];
    let mut kv = Vec::new();
    for s in 0..seqs {
        let room = t - cu[s];
        let want = if s % 2 == 1 {
            1
        } else {
            1 + rng.below(cap.min(2 * t / seqs.max(1)).max(1))
        };
        let ql = want.min(room).min(cap);
        cu.push(cu[s] + ql);
        kv.push(ql + rng.below(cap - ql + 1));
    }
    let mut perm: Vec<usize> = (0..pool.max(seqs * pps)).map(|p| p % pool.max(1)).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let bq = k
        .operands
        .iter()
        .find(|o| o.name == "q")
        .map_or(1, |o| o.block.shape[1]);
    let meta = ragged_metadata(&cu, t, bq);
    let ints = |shape: Vec<usize>, v: Vec<f64>| {
        Array::new(DType::I32, shape.clone(), v).unwrap_or_else(|_| Array::zeros(DType::I32, shape))
    };
    let f = |v: &[usize]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    vec![
        ints(vec![seqs + 1], f(&cu)),
        ints(vec![seqs], f(&kv)),
        ints(vec![seqs, pps], f(&perm[..seqs * pps])),
        ints(
            vec![meta.seq_ids.len()],
            meta.seq_ids.iter().map(|&x| x as f64).collect(),
        ),
        ints(
            vec![meta.qblk_ids.len()],
            meta.qblk_ids.iter().map(|&x| x as f64).collect(),
        ),
    ]
}

/// The sizes of a ragged batch that must fit together: `[seqs + 1 (as
/// given), seqs, h, hkv, t, pages_per_seq, visits]`.
pub(crate) fn check_shapes(cfg: &RaggedConfig, dims: [usize; 7]) -> Result<(), EntryError> {
    let [seqs_plus_one, seqs, h, hkv, t, pages_per_seq, given] = dims;
    let need = visits(t, cfg.block_q, seqs);
    let problem = if seqs_plus_one != seqs + 1 {
        format!("cu_q_lens has {seqs_plus_one} entries for {seqs} sequences; give seqs + 1")
    } else if hkv == 0 || h % hkv != 0 {
        format!("q has {h} heads, which the {hkv} kv heads do not divide")
    } else if t % cfg.block_q != 0 {
        format!(
            "q has {t} tokens, which block_q = {} does not divide; pad the batch",
            cfg.block_q
        )
    } else if pages_per_seq % cfg.pages_per_block != 0 {
        format!(
            "page_tables has {pages_per_seq} pages per sequence, which pages_per_block = {} does not divide",
            cfg.pages_per_block
        )
    } else if given != need {
        format!(
            "the schedule has {given} visits but {t} tokens in blocks of {} over {seqs} sequences need {need}; build it with ragged_metadata",
            cfg.block_q
        )
    } else {
        return Ok(());
    };
    Err(EntryError::Shape(problem))
}

/// The ragged kernels' parameters.
pub(crate) const RAGGED_PARAMS: &[crate::Param] = &[
    DTYPE,
    param(
        "sm_scale",
        ParamKind::Scale,
        "auto",
        "score scale; auto = 1/sqrt(head_dim)",
    ),
    param(
        "block_q",
        ParamKind::Positive,
        "16",
        "query tokens per block; divides the token count",
    ),
    param(
        "pages_per_block",
        ParamKind::Positive,
        "4",
        "pages copied per kv step; divides pages_per_seq",
    ),
    param(
        "window",
        ParamKind::OptPositive,
        "none",
        "sliding window: keys more than window-1 before a query are hidden",
    ),
    param(
        "softcap",
        ParamKind::OptPositiveNumber,
        "none",
        "logit soft-cap: s = cap * tanh(s / cap)",
    ),
];

/// [`ragged_paged_attention`](mod@ragged_paged_attention) in the library.
pub const RAGGED_PAGED_ATTENTION: Entry = Entry {
    name: "ragged_paged_attention",
    fixed_inputs: None,
    backward: None,
    about: "ragged paged attention: one call over mixed prefill and decode sequences (cu_q_lens, kv_lens, page tables in scalar prefetch), causal per sequence, GQA, manual DMA",
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
            ("k_pages", vec![2, 40, 16, 128]),
            ("v_pages", vec![2, 40, 16, 128]),
        ])
    },
    build: |c, s| {
        let dims = ragged_paged_attention::Dims::from_shapes(&refs(s))?;
        let cfg = config(c, dims.d)?;
        let ragged_paged_attention::Dims {
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
        Ok(ragged_paged_attention::build_for(
            c.dtype("dtype")?,
            &cfg,
            dims,
        )?)
    },
    reference: |c, a| {
        let tables: Vec<Vec<usize>> = ints(&a[2])
            .chunks(a[2].shape()[1].max(1))
            .map(<[usize]>::to_vec)
            .collect();
        let (cu_q_lens, kv_lens) = (ints(&a[0]), ints(&a[1]));
        let batch = RaggedBatch {
            cu_q_lens: &cu_q_lens,
            kv_lens: &kv_lens,
            tables: &tables,
        };
        Ok(vec![reference(
            &a[5],
            (&a[6], &a[7]),
            &batch,
            &config(c, a[5].shape()[2])?,
        )])
    },
    check,
    tolerance: |c, _| vec![Tolerance::attention(c.dtype("dtype").unwrap_or(DType::F32))],
    sample,
    presets: &[
        Preset {
            name: "ragged_paged_attention_mixed",
            about: "ragged paged attention: 4 sequences (prefills and decodes) over 64 bf16 tokens, GQA 4/2, manual DMA of 4 pages per kv step",
            config: &[("dtype", "bf16"), ("sm_scale", "0.088")],
            shapes: &[],
        },
        Preset {
            name: "ragged_paged_attention_window_softcap",
            about: "ragged paged attention with a sliding window of 24 and soft-cap 30, f32",
            config: &[("window", "24"), ("softcap", "30")],
            shapes: &[],
        },
    ],
};
