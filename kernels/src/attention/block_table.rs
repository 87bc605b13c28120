//! A mask preprocessed on the host into the tables a block-sparse
//! attention kernel reads through scalar prefetch (as splash attention's
//! mask info): per (head, query block, key block) whether the step is
//! empty, full or partial; which key block the step's index map names (a
//! skipped step names the block the next computed step needs, so it
//! fetches nothing that is not used); and for partial steps an index into
//! the deduplicated element masks.
//!
//! Blocks are classified from the mask's structure
//! ([`Mask::block`](super::mask::Mask::block));
//! only blocks it cannot settle are visited element by element, and those
//! turn out empty or full when their elements say so. Positions past the
//! sequence ends (the last blocks' padding) are never visible.
//!
//! ```
//! use kernels::attention::block_table::BlockTables;
//! use kernels::attention::mask::{Mask, MultiHeadMask};
//! let m = MultiHeadMask::uniform(Mask::Causal { offset: 0 }, 1);
//! let t = BlockTables::build(&m, 1024, 1024, 256, 256).unwrap();
//! // 4×4 blocks: 6 above the diagonal empty, 4 on it partial, 6 full;
//! // causal is computable from positions, so no element mask is kept.
//! assert_eq!(t.count(kernels::attention::mask::BlockKind::Empty), 6);
//! assert_eq!(t.partial_masks(), 0);
//! // An explicit mask's partial blocks keep theirs, deduplicated: the
//! // same pattern in both diagonal blocks is one mask.
//! let e = Mask::explicit(4, 4, (0..16).map(|i| i % 4 <= i / 4).collect()).unwrap();
//! let t = BlockTables::build(&MultiHeadMask::uniform(e, 1), 4, 4, 2, 2).unwrap();
//! assert_eq!(t.partial_masks(), 1);
//! ```

use std::collections::HashMap;

use kernel_ir::{Array, DType};

use super::mask::{BlockKind, MultiHeadMask};

/// The tables of a [`MultiHeadMask`] at given sequence and block sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockTables {
    /// Heads, query blocks and key blocks.
    pub heads: usize,
    /// Query blocks (`ceil(sq / bq)`).
    pub q_blocks: usize,
    /// Key blocks (`ceil(skv / bk)`).
    pub k_blocks: usize,
    /// Block sizes.
    pub bq: usize,
    /// Block sizes.
    pub bk: usize,
    /// `[heads, q_blocks, k_blocks]`: 0 empty, 1 partial, 2 full.
    pub kind: Vec<u8>,
    /// `[heads, q_blocks, k_blocks]`: the key block each step names.
    pub fetch: Vec<i32>,
    /// `[heads, q_blocks, k_blocks]`: the partial step's element mask
    /// (an index into `masks`), −1 for the others (and for every step of
    /// a [computable](MultiHeadMask::computable) mask).
    pub mask_index: Vec<i32>,
    /// The distinct element masks of partial blocks, each `[bq, bk]`;
    /// none for a computable mask, whose partial steps compute visibility
    /// from positions (`MaskedConfig::rule`), so the kernels fetch one
    /// unread block once instead of a mask per partial step.
    pub masks: Vec<Vec<bool>>,
    /// `[heads, q_blocks, k_blocks]`: the element mask each step's index
    /// map names: a partial step's own, any other step the one named
    /// before it (so only a partial step with a new mask fetches one).
    pub mask_fetch: Vec<i32>,
}

/// Sizes the tables cannot be built for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// A zero size.
    #[error("{what} is 0; sequences, blocks and heads need at least 1")]
    Zero {
        /// Which size.
        what: &'static str,
    },
    /// More blocks than an i32 index can name.
    #[error("{blocks} key blocks do not fit the i32 block index; use larger blocks")]
    TooManyBlocks {
        /// How many.
        blocks: usize,
    },
}

impl BlockTables {
    /// The tables of `mask` for `sq` queries and `skv` keys in blocks of
    /// `bq` × `bk`.
    pub fn build(
        mask: &MultiHeadMask,
        sq: usize,
        skv: usize,
        bq: usize,
        bk: usize,
    ) -> Result<BlockTables, TableError> {
        for (what, v) in [
            ("sq", sq),
            ("skv", skv),
            ("bq", bq),
            ("bk", bk),
            ("heads", mask.heads.len()),
        ] {
            if v == 0 {
                return Err(TableError::Zero { what });
            }
        }
        let (nq, nk) = (sq.div_ceil(bq), skv.div_ceil(bk));
        if nk > i32::MAX as usize {
            return Err(TableError::TooManyBlocks { blocks: nk });
        }
        let h = mask.heads.len();
        let cells = h * nq * nk;
        let mut kind = vec![0u8; cells];
        let mut mask_index = vec![-1i32; cells];
        let mut masks: Vec<Vec<bool>> = Vec::new();
        let mut seen: HashMap<Vec<bool>, i32> = HashMap::new();
        // A computable mask's partial steps compute their visibility from
        // positions: no element masks are kept.
        let computed = mask.computable();
        for (hh, m) in mask.heads.iter().enumerate() {
            for qi in 0..nq {
                let (q0, q1) = (qi * bq, ((qi + 1) * bq).min(sq));
                for ki in 0..nk {
                    let (k0, k1) = (ki * bk, ((ki + 1) * bk).min(skv));
                    let cell = (hh * nq + qi) * nk + ki;
                    let mut b = m.block(q0 as u64, q1 as u64, k0 as u64, k1 as u64);
                    // A padded block is partial even when its valid part is full.
                    let padded = q1 - q0 < bq || k1 - k0 < bk;
                    if b == BlockKind::Full && !padded {
                        kind[cell] = 2;
                        continue;
                    }
                    if b == BlockKind::Empty {
                        continue;
                    }
                    let mut elems = vec![false; bq * bk];
                    for q in q0..q1 {
                        for k in k0..k1 {
                            elems[(q - q0) * bk + (k - k0)] = m.visible(q as u64, k as u64);
                        }
                    }
                    let any = elems.iter().any(|&v| v);
                    let all = !padded && elems.iter().all(|&v| v);
                    b = if !any {
                        BlockKind::Empty
                    } else if all {
                        BlockKind::Full
                    } else {
                        BlockKind::Partial
                    };
                    match b {
                        BlockKind::Empty => {}
                        BlockKind::Full => kind[cell] = 2,
                        BlockKind::Partial if computed => kind[cell] = 1,
                        BlockKind::Partial => {
                            kind[cell] = 1;
                            let next = masks.len() as i32;
                            let id = *seen.entry(elems.clone()).or_insert_with(|| {
                                masks.push(elems);
                                next
                            });
                            mask_index[cell] = id;
                        }
                    }
                }
            }
        }
        let fetch = fetch_indices(&kind, h * nq, nk);
        let mask_fetch = mask_fetches(&mask_index);
        Ok(BlockTables {
            heads: h,
            q_blocks: nq,
            k_blocks: nk,
            bq,
            bk,
            kind,
            fetch,
            mask_index,
            masks,
            mask_fetch,
        })
    }

    /// Steps of `kind`.
    pub fn count(&self, kind: BlockKind) -> usize {
        let code = match kind {
            BlockKind::Empty => 0,
            BlockKind::Partial => 1,
            BlockKind::Full => 2,
        };
        self.kind.iter().filter(|&&c| c == code).count()
    }

    /// How many distinct element masks the partial steps use.
    pub fn partial_masks(&self) -> usize {
        self.masks.len()
    }

    /// Bytes of the tables as a kernel prefetches them (kind as i32,
    /// fetch, mask index) plus the element masks (one byte each).
    pub fn bytes(&self) -> usize {
        3 * 4 * self.kind.len() + self.masks.len() * self.bq * self.bk
    }

    /// The tables as the arrays [`super::masked::masked_attention`](mod@super::masked::masked_attention) takes:
    /// the scalar prefetch `[kind, fetch, mask_fetch]` (i32 `[heads,
    /// q_blocks, k_blocks]`) and the element masks (i32 `[n, bq, bk]`,
    /// nonzero visible; one all-hidden mask when no step is partial, which
    /// no step reads).
    pub fn arrays(&self) -> ([Array; 3], Array) {
        let cells = [self.heads, self.q_blocks, self.k_blocks];
        let ints = |shape: &[usize], v: Vec<f64>| {
            Array::new(DType::I32, shape.to_vec(), v).expect("a table has one value per cell")
        };
        let table = |v: &[i32]| ints(&cells, v.iter().map(|&x| x as f64).collect());
        let kind: Vec<i32> = self.kind.iter().map(|&k| k as i32).collect();
        let n = self.masks.len().max(1);
        let mut elems = vec![0.0; n * self.bq * self.bk];
        for (dst, &v) in elems.iter_mut().zip(self.masks.iter().flatten()) {
            *dst = f64::from(u8::from(v));
        }
        (
            [table(&kind), table(&self.fetch), table(&self.mask_fetch)],
            ints(&[n, self.bq, self.bk], elems),
        )
    }

    /// The tables of the dk/dv pass, whose grid walks each head's key
    /// blocks outside and query blocks inside: `[kind, fetch, mask_fetch]`
    /// as i32 `[heads, k_blocks, q_blocks]`, `fetch` naming the query block
    /// each step's index maps name (a skipped step the next computed one of
    /// its key block, or the block named before), `mask_fetch` indexing the
    /// same element masks as [`BlockTables::arrays`] (`[bq, bk]`, not
    /// transposed: the kernel forms scores as the forward does).
    pub fn transposed_arrays(&self) -> [Array; 3] {
        let (h, nq, nk) = (self.heads, self.q_blocks, self.k_blocks);
        let mut kind = vec![0u8; self.kind.len()];
        let mut mask_index = vec![-1i32; self.kind.len()];
        for hh in 0..h {
            for qi in 0..nq {
                for ki in 0..nk {
                    let (src, dst) = ((hh * nq + qi) * nk + ki, (hh * nk + ki) * nq + qi);
                    kind[dst] = self.kind[src];
                    mask_index[dst] = self.mask_index[src];
                }
            }
        }
        let fetch = fetch_indices(&kind, h * nk, nq);
        let mask_fetch = mask_fetches(&mask_index);
        let kind: Vec<i32> = kind.iter().map(|&k| k as i32).collect();
        let table = |v: &[i32]| {
            Array::new(
                DType::I32,
                [h, nk, nq],
                v.iter().map(|&x| x as f64).collect(),
            )
            .expect("a table has one value per cell")
        };
        [table(&kind), table(&fetch), table(&mask_fetch)]
    }

    /// The kind of step (`head`, `qi`, `ki`).
    pub fn kind_at(&self, head: usize, qi: usize, ki: usize) -> BlockKind {
        match self.kind[(head * self.q_blocks + qi) * self.k_blocks + ki] {
            0 => BlockKind::Empty,
            1 => BlockKind::Partial,
            _ => BlockKind::Full,
        }
    }
}

/// The block each step names, in grid order (`rows` of `nk` steps: head
/// and query block, then key block; or transposed): a computed step its own; a skipped one the next computed step's
/// block in its row, or when its row computes nothing more the block the
/// step before named, so no skipped step starts a fetch that is not used.
fn fetch_indices(kind: &[u8], rows: usize, nk: usize) -> Vec<i32> {
    let mut fetch = vec![0i32; kind.len()];
    let mut last = 0i32;
    for row in 0..rows {
        let base = row * nk;
        let mut next_needed: Option<i32> = None;
        // Walk the row backwards to know each step's next computed block.
        let mut ahead = vec![None; nk];
        for ki in (0..nk).rev() {
            if kind[base + ki] != 0 {
                next_needed = Some(ki as i32);
            }
            ahead[ki] = next_needed;
        }
        for ki in 0..nk {
            let f = if kind[base + ki] != 0 {
                ki as i32
            } else {
                ahead[ki].unwrap_or(last)
            };
            fetch[base + ki] = f;
            last = f;
        }
    }
    fetch
}

/// The element mask each step names, in grid order: a partial step's own,
/// any other the one named before it (the first partial step's before any).
fn mask_fetches(mask_index: &[i32]) -> Vec<i32> {
    let first = mask_index.iter().copied().find(|&i| i >= 0).unwrap_or(0);
    mask_index
        .iter()
        .scan(first, |last, &i| {
            if i >= 0 {
                *last = i;
            }
            Some(*last)
        })
        .collect()
}
