//! The online softmax every attention forward carries across its k blocks
//! (flash, decode, paged, ragged, masked): the running row max and sum in
//! lane-replicated scratch, the rescaled accumulator, and the finish that
//! gives rows with no visible key `o = 0`, `lse = −∞`.

use kernel_ir::prelude::*;

use super::scores::MASK_VALUE;

/// The online softmax's running state, in scratch: the row max `m` and
/// sum `l` (each row's value in all 128 lanes, `[rows, 128]`) and the
/// unnormalized output `acc` (`[rows, d]`).
#[derive(Clone, Copy)]
pub(crate) struct Online {
    /// Running row max.
    pub(crate) m: Ref,
    /// Running row sum of `exp(s − m)`.
    pub(crate) l: Ref,
    /// Running `Σ exp(s − m) · v`.
    pub(crate) acc: Ref,
}

/// The online-softmax step for `rows` query rows: new running max and
/// sum, rescaled accumulator.
#[kernel_fn]
pub(crate) fn online_update(rows: usize, st: Online, s: Tile, vb: Tile) {
    online_step(rows, st, s, vb, None);
}

/// [`online_update`] with dropout: each probability times `keep` (`1 /
/// (1 − rate)` or 0, see [`super::dropout`]) before it weighs the values;
/// the running sum counts every key.
#[kernel_fn]
pub(crate) fn online_update_dropped(rows: usize, st: Online, s: Tile, vb: Tile, keep: Tile) {
    online_step(rows, st, s, vb, Some(keep));
}

#[kernel_fn]
fn online_step(rows: usize, st: Online, s: Tile, vb: Tile, keep: Option<Tile>) {
    let Online { m, l, acc } = st;
    // `m` and `l` hold each row's value in all 128 lanes. Reading them back
    // as a lane max (not a `[rows, 1]` column load) gives Mosaic a value
    // already replicated across lanes, so broadcasting it over the
    // `[rows, bk]` scores and the `[rows, d]` accumulator is free: a
    // column load is broadcast by a lane permute per vreg, which libtpu's
    // schedule estimate put at 2.4x the whole step's cycles at 512 x 512
    // blocks on v6e (ARCHITECTURE.md, the kernels' invariants).
    let m_prev = m.load(..).max_keep(1);
    let l_prev = l.load(..).max_keep(1);
    let m_new = m_prev.max(s.max_keep(1));
    let p = (s - m_new).exp();
    let alpha = (m_prev - m_new).exp();
    let weights = if let Some(keep) = keep { p * keep } else { p };
    acc.store(
        ..,
        acc.load(..) * alpha + dot(weights.convert(vb.dtype()), vb),
    );
    m.store(.., m_new.broadcast_to([rows, 128]));
    l.store(
        ..,
        (l_prev * alpha + p.sum_keep(1)).broadcast_to([rows, 128]),
    );
}

/// First step: reset the running state. Last step: normalize, write the
/// output and the logsumexp.
#[kernel_fn]
pub(crate) fn online_softmax_init(st: Online) {
    st.m.store(.., f32::NEG_INFINITY);
    st.l.store(.., 0.0);
    st.acc.store(.., 0.0);
}

/// Adds one more logit per row to the softmax, the head's sink
/// (`sinks[h]`, `h` heads, this grid step's head from axis 1): it joins
/// the running max and sum and carries no value, so it only rescales.
/// A row that saw no key is left with the sink alone (`o = 0`, `lse =
/// sink`); a sink of −∞ changes nothing.
#[kernel_fn]
pub(crate) fn fold_sink(st: Online, sinks: Ref, h: usize, rows: usize) {
    let Online { m, l, acc } = st;
    let head = iota(I32, [1, h], 1);
    let all = sinks.load(..).reshape([1, h]);
    let sink = select(head == program_id(1), all, f32::NEG_INFINITY).max_keep(1);
    let m_prev = m.load(..).max_keep(1);
    let m_new = m_prev.max(sink);
    // Equal maxima (both −∞ included) keep the running state as it is.
    let alpha = select(m_prev == m_new, 1.0, (m_prev - m_new).exp());
    let e_sink = select(sink == m_new, 1.0, (sink - m_new).exp());
    let e_sink = select(sink == f32::NEG_INFINITY, 0.0, e_sink);
    acc.store(.., acc.load(..) * alpha);
    m.store(.., m_new.broadcast_to([rows, 128]));
    l.store(
        ..,
        (l.load(..).max_keep(1) * alpha + e_sink).broadcast_to([rows, 128]),
    );
}

/// Writes `o = acc / l` and `lse = m + log l`; rows that saw no visible
/// key (see [`no_visible_key`]) get `o = 0` and `lse = −∞`.
#[kernel_fn]
pub(crate) fn online_softmax_finish(st: Online, o: Ref, lse: Ref) {
    let (out, lse_row) = normalized(st);
    o.store((0, 0, .., ..), out.convert(o.dtype()));
    lse.store((0, 0, .., ..), lse_row);
}

/// `acc / l` and `m + log l` of the online softmax, with the rows that saw
/// no visible key set to 0 and −∞.
///
/// A row sees no key when every key is masked (causal with a short K, a
/// window, a valid length of 0): its running max is still −∞ (no block
/// was computed) or [`MASK_VALUE`] (only masked scores were), which no
/// real score reaches. Its softmax is empty: the output is 0 (the sum over
/// no keys) and the logsumexp −∞ (the log of an empty sum), as in the f64
/// reference, on every path; the backward passes give it zero gradients.
#[kernel_fn]
pub(crate) fn normalized(Online { m, l, acc }: Online) -> (Tile, Tile) {
    let m_row = m.load((.., 0..1));
    let dead = no_visible_key(m_row);
    let l_row = select(dead, 1.0, l.load((.., 0..1)));
    let alive = select(dead, 0.0, 1.0);
    let out = acc.load(..) / l_row * alive;
    (out, select(dead, f32::NEG_INFINITY, m_row + l_row.log()))
}

/// Whether rows with running max `m_row` have seen no visible key.
#[kernel_fn]
pub(crate) fn no_visible_key(m_row: Tile) -> Tile {
    m_row < MASK_VALUE * 0.5
}
