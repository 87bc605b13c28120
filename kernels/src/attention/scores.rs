//! Attention scores and their masks, shared by the forward and backward
//! kernels: `scale · q·kᵀ` (soft-capped) with query or key rows, and the
//! causal/window band as an element mask.

use kernel_ir::prelude::*;

use super::band::Band;
use super::config::AttnConfig;

/// Added to masked scores: far below any real score, yet finite so that a
/// row never computes `−∞ − (−∞)`.
pub const MASK_VALUE: f32 = -1e30;

/// Which operand's rows a score tile's rows are: the queries (`q·kᵀ`,
/// `[block_q, block_k]`) or the keys (`k·qᵀ`, `[block_k, block_q]`).
///
/// The forward and `dq` kernels reduce over keys, so their scores have
/// query rows on every platform. The dk/dv kernels reduce over queries:
/// on the TPU they keep query rows and transpose `P` and `dS` into the MXU
/// (Pallas's layout: the saved logsumexp is a column there, broadcast
/// along lanes); on the GPU they compute `k·qᵀ` directly, as Triton's
/// fused-attention tutorial does, so every product has the k block as its
/// M dimension (128 rows, where the q block's 32 would leave Hopper's
/// warpgroup MMA unused) and nothing is transposed but two operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScoreRows {
    /// `[block_q, block_k]`: row `i` is query `i`.
    Queries,
    /// `[block_k, block_q]`: row `j` is key `j`.
    Keys,
}

impl ScoreRows {
    /// The dk/dv kernels' layout for the platform being built for
    /// ([`kernel_ir::current_platform`]).
    pub(crate) fn for_dkv() -> ScoreRows {
        match kernel_ir::current_platform() {
            kernel_ir::Platform::Tpu => ScoreRows::Queries,
            kernel_ir::Platform::Gpu => ScoreRows::Keys,
        }
    }

    /// A score tile's shape.
    pub(crate) fn shape(self, cfg: &AttnConfig) -> [usize; 2] {
        match self {
            ScoreRows::Queries => [cfg.block_q, cfg.block_k],
            ScoreRows::Keys => [cfg.block_k, cfg.block_q],
        }
    }

    /// The axis of a score tile along which the query changes.
    fn query_axis(self) -> usize {
        match self {
            ScoreRows::Queries => 0,
            ScoreRows::Keys => 1,
        }
    }

    /// A per-query column `[block_q, 1]` (the logsumexp, delta) shaped to
    /// broadcast over a score tile.
    pub(crate) fn per_query(self, column: Tile) -> Tile {
        match self {
            ScoreRows::Queries => column,
            ScoreRows::Keys => column.t(),
        }
    }

    /// `a·bᵀ` of a query-side block `a` (q, dO) and a key-side block `b`
    /// (k, v) with the score tile's rows: `b·aᵀ` with key rows.
    pub(crate) fn outer(self, a: Tile, b: Tile) -> Tile {
        match self {
            ScoreRows::Queries => dot(a, b.t()),
            ScoreRows::Keys => dot(b, a.t()),
        }
    }

    /// A score tile with key rows (`[block_k, block_q]`), transposed if
    /// it has query rows.
    pub(crate) fn with_key_rows(self, s: Tile) -> Tile {
        match self {
            ScoreRows::Queries => s.t(),
            ScoreRows::Keys => s,
        }
    }

    /// A score tile with query rows (`[block_q, block_k]`), transposed if
    /// it has key rows.
    pub(crate) fn with_query_rows(self, s: Tile) -> Tile {
        match self {
            ScoreRows::Queries => s,
            ScoreRows::Keys => s.t(),
        }
    }

    /// The query and key positions of every score of block (`qi`, `ki`).
    pub(crate) fn positions(self, cfg: &AttnConfig, qi: Tile, ki: Tile) -> (Tile, Tile) {
        let shape = self.shape(cfg);
        let qa = self.query_axis();
        let q_pos = iota(I32, shape, qa) + qi * cfg.block_q;
        let k_pos = iota(I32, shape, 1 - qa) + ki * cfg.block_k;
        (q_pos, k_pos)
    }
}

/// `scale · q·kᵀ` (or `k·qᵀ`, as `rows` says), soft-capped, unmasked.
#[kernel_fn]
pub(crate) fn raw_scores(cfg: &AttnConfig, rows: ScoreRows, q: Ref, k: Ref) -> Tile {
    // The MXU multiplies in the input dtype and accumulates in f32.
    let mut s = rows.outer(q.load((0, 0, .., ..)), k.load((0, 0, .., ..))) * cfg.sm_scale;
    if let Some(cap) = cfg.softcap {
        s = (s * (1.0 / cap)).tanh() * cap;
    }
    s
}

/// Scores hidden by the causal mask or the window set to [`MASK_VALUE`].
#[kernel_fn]
pub(crate) fn mask_scores(cfg: &AttnConfig, rows: ScoreRows, s: Tile, qi: Tile, ki: Tile) -> Tile {
    if cfg.masked() {
        select(visible_keys(cfg, rows, qi, ki), s, MASK_VALUE)
    } else {
        s
    }
}

/// Bools laid out as `rows` says: which keys the causal mask and the
/// window leave visible to which queries (all, when neither applies).
/// Computed from positions only, so padding cannot poison it.
#[kernel_fn]
pub(crate) fn visible_keys(cfg: &AttnConfig, rows: ScoreRows, qi: Tile, ki: Tile) -> Tile {
    let (q_pos, k_pos) = rows.positions(cfg, qi, ki);
    if let Some(v) = Band::of(cfg).visible(q_pos, k_pos) {
        v
    } else {
        k_pos >= 0
    }
}
