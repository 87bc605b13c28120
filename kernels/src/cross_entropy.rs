//! Fused linear + softmax cross-entropy: each row's loss
//! `lse(x·w) − (x·w)[label]` without the `[n, v]` logits ever reaching
//! memory, forward and backward.
//!
//! The forward walks the vocabulary in `bv`-wide tiles (the `arbitrary`
//! grid axis), carrying each row's running max and sum (the online
//! logsumexp) and the label's logit. The backward recomputes a tile's
//! logits from `x` and `w` and turns them into `g = dloss·(softmax −
//! onehot) + dlse·softmax` in VMEM: `dx = g·wᵀ` accumulates over the
//! vocabulary, `dw = xᵀ·g` over the rows. One kernel does both from one
//! softmax per tile (`linear_cross_entropy_backward`, dw in an f32 in-out
//! across the row blocks); the two-kernel form, each accumulator one
//! block, stays (`linear_cross_entropy_dx`, `linear_cross_entropy_dw`).
//!
//! A label outside `0..v` (PyTorch's `ignore_index = −100`, padding) marks
//! an ignored row: its loss is 0 and it adds nothing to either gradient
//! through the loss; its `lse` is still the row's logsumexp. The f64
//! references ([`reference()`], [`reference_backward()`]) follow the same
//! rule.
//!
//! ```
//! use kernel_ir::prelude::*;
//! use kernels::cross_entropy::{LinearCrossEntropyConfig, linear_cross_entropy, reference};
//!
//! let cfg = LinearCrossEntropyConfig { n: 4, d: 128, v: 300, bn: 4, bv: 128, dtype: F32 };
//! let x = Array::random(F32, [4, 128], 1, -1.0, 1.0);
//! let w = Array::random(F32, [128, 300], 2, -0.1, 0.1);
//! let labels = Array::new(I32, [4, 1], vec![0.0, 299.0, -100.0, 7.0]).unwrap();
//! let out = interpret(&linear_cross_entropy(&cfg).unwrap(), &[x.clone(), w.clone(), labels.clone()]).unwrap();
//! let (loss, lse) = reference(&x, &w, &labels);
//! assert_eq!(out[0].data()[2], 0.0); // the ignored row
//! for (got, want) in out[0].data().iter().zip(&loss).chain(out[1].data().iter().zip(&lse)) {
//!     assert!((got - want).abs() < 1e-4, "{got} vs {want}");
//! }
//! ```

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, Shapes, dims, no_check, param,
};
#[cfg(feature = "graph")]
use crate::recording::{backward_error, build_error};
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};

/// Shapes and blocking: `x[n, d]`, `w[d, v]`, `labels[n, 1]` (i32).
#[derive(Clone, Debug, PartialEq)]
pub struct LinearCrossEntropyConfig {
    /// Rows (tokens).
    pub n: usize,
    /// Hidden size (contracted, whole in each block).
    pub d: usize,
    /// Vocabulary size.
    pub v: usize,
    /// Rows per block.
    pub bn: usize,
    /// Vocabulary columns per block.
    pub bv: usize,
    /// Element type of `x`, `w`, `dx` and `dw` (losses, `lse` and the
    /// cotangents are f32).
    pub dtype: DType,
}

/// What every kernel of the loss reads at grid step `(i, j)`: row block
/// `i` of `x` and its labels, vocabulary tile `j` of `w`.
#[operands]
pub(crate) struct RowsByVocab<T> {
    #[shape(n, d)]
    #[block([bn, d], |i, _| (i, 0))]
    x: In<T>,
    #[shape(d, v)]
    #[block([d, bv], |_, j| (0, j))]
    w: In<T>,
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    labels: In<i32>,
}

/// The logits of vocabulary tile `j`, `[bn, bv]` (f32) with the columns
/// past `v` at −∞, and each column's vocabulary index `[1, bv]`.
#[kernel_fn]
fn logits(x: Ref, w: Ref, j: Tile, bv: usize, v: usize) -> (Tile, Tile) {
    let col = iota(I32, [1, bv], 1) + j * bv as i32;
    let s = dot(x.load(..), w.load(..));
    (select(col < v as i32, s, f32::NEG_INFINITY), col)
}

/// Whether each row's label is a vocabulary index (`[bn, 1]`): the rows
/// whose loss counts.
#[kernel_fn]
fn counted(label: Tile, v: usize) -> Tile {
    label >= 0 && label < v as i32
}

/// Cross-entropy forward: `loss[n, 1]` and `lse[n, 1]`, f32.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(n, bn), kernel_ir::cdiv(v, bv)),
    semantics = (parallel, arbitrary)
)]
pub fn linear_cross_entropy<T: Float>(
    bn: usize,
    bv: usize,
    #[operands] _: RowsByVocab<T>,
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    loss: Out<f32>,
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    lse: Out<f32>,
    #[shape(bn, 128)] m: Scratch<f32>,
    #[shape(bn, 128)] l: Scratch<f32>,
    #[shape(bn, 1)] picked: Scratch<f32>,
) {
    let j = program_id(1);
    if j == 0 {
        m.store(.., f32::NEG_INFINITY);
        l.store(.., 0.0);
        picked.store(.., 0.0);
    }
    let (s, col) = logits(x, w, j, bv, v);
    let label = labels.load(..);
    // Running max and sum held in all 128 lanes (as the attention kernels
    // do): read back as a lane max they broadcast over the tile for free.
    let m_prev = m.load(..).max_keep(1);
    let m_new = m_prev.max(s.max_keep(1));
    let sum = l.load(..).max_keep(1) * (m_prev - m_new).exp() + (s - m_new).exp().sum_keep(1);
    m.store(.., m_new.broadcast_to([bn, 128]));
    l.store(.., sum.broadcast_to([bn, 128]));
    picked.store(
        ..,
        picked.load(..) + select(col == label, s, 0.0).sum_keep(1),
    );
    if j == num_programs(1) - 1 {
        let row_lse = m_new + sum.log();
        lse.store(.., row_lse);
        loss.store(
            ..,
            select(counted(label, v), row_lse - picked.load(..), 0.0),
        );
    }
}

/// What both backward kernels read beside the forward's inputs: the
/// forward's `lse` and the cotangents of `loss` and `lse`, all `[n, 1]`
/// f32, row block `i`.
#[operands]
pub(crate) struct RowCotangents {
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    lse: In<f32>,
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    dloss: In<f32>,
    #[shape(n, 1)]
    #[block([bn, 1], |i, _| (i, 0))]
    dlse: In<f32>,
}

/// The logits' cotangent on vocabulary tile `j`, `[bn, bv]` f32: `dloss·(p − onehot)
/// + dlse·p` with `p = exp(s − lse)`, zero past `v` and past `n` (the
/// rows are `lse`'s block positions), the loss term zero on ignored rows;
/// from the row block's labels, lse, dloss and dlse.
#[kernel_fn]
#[allow(clippy::too_many_arguments)]
fn logit_grad(
    x: Ref,
    w: Ref,
    j: Tile,
    [labels, lse, dloss, dlse]: [Ref; 4],
    (n, bv, v): (usize, usize, usize),
) -> Tile {
    let rows = lse.positions(0);
    let (label, lse, dloss, dlse) = (labels.load(..), lse.load(..), dloss.load(..), dlse.load(..));
    let (s, col) = logits(x, w, j, bv, v);
    let p = (s - lse).exp();
    let dl = select(counted(label, v), dloss, 0.0);
    let g = dl * (p - select(col == label, 1.0, 0.0)) + dlse * p;
    select(rows < n as i32 && col < v as i32, g, 0.0)
}

/// Cross-entropy backward, `dx[n, d] = g·wᵀ` summed over the vocabulary.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(n, bn), kernel_ir::cdiv(v, bv)),
    semantics = (parallel, arbitrary)
)]
pub fn linear_cross_entropy_dx<T: Float>(
    bn: usize,
    bv: usize,
    #[operands] _: RowsByVocab<T>,
    #[operands] _: RowCotangents,
    #[shape(n, d)]
    #[block([bn, d], |i, _| (i, 0))]
    dx: Out<T>,
    #[shape(bn, d)] acc: Scratch<f32>,
) {
    let j = program_id(1);
    if j == 0 {
        acc.store(.., 0.0);
    }
    let g = logit_grad(x, w, j, [labels, lse, dloss, dlse], (n, bv, v));
    // Columns past `v` are zero in g but w's are unread memory there.
    let wv = w.load_masked(.., w.positions(1) < v as i32);
    acc.store(.., acc.load(..) + dot(g.convert(x.dtype()), wv.t()));
    if j == num_programs(1) - 1 {
        dx.store(.., acc.load(..).cast::<T>());
    }
}

/// Cross-entropy backward, `dw[d, v] = xᵀ·g` summed over the rows: the
/// grid walks vocabulary tiles outside (`j`) and row blocks inside (`i`).
#[tpu_kernel(
    grid = (kernel_ir::cdiv(v, bv), kernel_ir::cdiv(n, bn)),
    semantics = (parallel, arbitrary)
)]
pub fn linear_cross_entropy_dw<T: Float>(
    bn: usize,
    bv: usize,
    #[shape(n, d)]
    #[block([bn, d], |_, i| (i, 0))]
    x: In<T>,
    #[shape(d, v)]
    #[block([d, bv], |j, _| (0, j))]
    w: In<T>,
    #[shape(n, 1)]
    #[block([bn, 1], |_, i| (i, 0))]
    labels: In<i32>,
    #[shape(n, 1)]
    #[block([bn, 1], |_, i| (i, 0))]
    lse: In<f32>,
    #[shape(n, 1)]
    #[block([bn, 1], |_, i| (i, 0))]
    dloss: In<f32>,
    #[shape(n, 1)]
    #[block([bn, 1], |_, i| (i, 0))]
    dlse: In<f32>,
    #[shape(d, v)]
    #[block([d, bv], |j, _| (0, j))]
    dw: Out<T>,
    #[shape(d, bv)] acc: Scratch<f32>,
) {
    let i = program_id(1);
    if i == 0 {
        acc.store(.., 0.0);
    }
    let g = logit_grad(x, w, program_id(0), [labels, lse, dloss, dlse], (n, bv, v));
    // Rows past `n` are zero in g but x's are unread memory there.
    let xv = x.load_masked(.., x.positions(0) < n as i32);
    acc.store(.., acc.load(..) + dot(xv.t(), g.convert(x.dtype())));
    if i == num_programs(1) - 1 {
        dw.store(.., acc.load(..).cast::<T>());
    }
}

/// Cross-entropy backward in one kernel, as tokamax's: each step's
/// logits' cotangent `g` (one softmax per logit tile) feeds both `dx =
/// g·wᵀ`, summed over the vocabulary tiles in f32 scratch, and `dw = xᵀ·g`,
/// summed over the row blocks in the in-out `dw` (f32; the caller passes
/// zeros, row block 0 overwrites it). The two-kernel backward
/// ([`linear_cross_entropy_dx`](mod@linear_cross_entropy_dx),
/// [`linear_cross_entropy_dw`](mod@linear_cross_entropy_dw)) recomputes
/// each tile's softmax twice: libtpu's trace of it on v5e runs 9% more
/// bundles. With one row block (`bn ≥ n`) each `dw` tile is read once and
/// written once.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(n, bn), kernel_ir::cdiv(v, bv)),
    semantics = (arbitrary, arbitrary),
    vmem_limit = backward_vmem(bn, bv, d, T::DTYPE)
)]
pub fn linear_cross_entropy_backward<T: Float>(
    bn: usize,
    bv: usize,
    #[operands] _: RowsByVocab<T>,
    #[operands] _: RowCotangents,
    #[shape(n, d)]
    #[block([bn, d], |i, _| (i, 0))]
    dx: Out<T>,
    #[shape(d, v)]
    #[block([d, bv], |_, j| (0, j))]
    dw: InOut<f32>,
    #[shape(bn, d)] acc: Scratch<f32>,
) {
    let (i, j) = (program_id(0), program_id(1));
    if j == 0 {
        acc.store(.., 0.0);
    }
    let g = logit_grad(x, w, j, [labels, lse, dloss, dlse], (n, bv, v)).convert(x.dtype());
    // Past `v` and past `n` g is zero, but w's and x's rows there are
    // unread memory.
    let wv = w.load_masked(.., w.positions(1) < v as i32);
    let xv = x.load_masked(.., x.positions(0) < n as i32);
    acc.store(.., acc.load(..) + dot(g, wv.t()));
    let part = dot(xv.t(), g);
    if i == 0 {
        dw.store(.., part);
    } else {
        dw.store(.., dw.load(..) + part);
    }
    if j == num_programs(1) - 1 {
        dx.store(.., acc.load(..).cast::<T>());
    }
}

/// The scoped VMEM the one-kernel backward asks for: its blocks (x, w, dx
/// double-buffered; dw in and out double-buffered, f32), its f32
/// accumulator and about four f32 `[bn, bv]` temporaries (the logits, the
/// probabilities, their cotangent and its cast), with a quarter more, and
/// never below the 32 MiB default. tokamax's backward asks for 115 MiB on
/// v5e at its default blocks.
fn backward_vmem(bn: usize, bv: usize, d: usize, dtype: DType) -> u64 {
    let e = dtype.bytes();
    let bytes =
        2 * (bn * d + d * bv) * e + 4 * d * bv * 4 + bn * d * 4 + 2 * bn * d * e + 4 * bn * bv * 4;
    let want = (bytes + bytes / 4) as u64;
    if want > 32 << 20 { want } else { 32 << 20 }
}

/// The one-kernel backward for a config: inputs `x`, `w`, `labels`, `lse`,
/// `dloss`, `dlse` and the in-out `dw` (f32).
pub fn linear_cross_entropy_backward(
    c: &LinearCrossEntropyConfig,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = linear_cross_entropy_backward::Dims {
        n: c.n,
        d: c.d,
        v: c.v,
    };
    linear_cross_entropy_backward::build_for(c.dtype, c.bn, c.bv, dims)
}

/// The forward kernel for a config: inputs `x`, `w`, `labels`; outputs
/// `loss`, `lse`.
pub fn linear_cross_entropy(c: &LinearCrossEntropyConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = linear_cross_entropy::Dims {
        n: c.n,
        d: c.d,
        v: c.v,
    };
    linear_cross_entropy::build_for(c.dtype, c.bn, c.bv, dims)
}

/// The `dx` kernel for a config: inputs `x`, `w`, `labels`, `lse`,
/// `dloss`, `dlse`.
pub fn linear_cross_entropy_dx(
    c: &LinearCrossEntropyConfig,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = linear_cross_entropy_dx::Dims {
        n: c.n,
        d: c.d,
        v: c.v,
    };
    linear_cross_entropy_dx::build_for(c.dtype, c.bn, c.bv, dims)
}

/// The `dw` kernel for a config: inputs as [`linear_cross_entropy_dx()`].
pub fn linear_cross_entropy_dw(
    c: &LinearCrossEntropyConfig,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = linear_cross_entropy_dw::Dims {
        n: c.n,
        d: c.d,
        v: c.v,
    };
    linear_cross_entropy_dw::build_for(c.dtype, c.bn, c.bv, dims)
}

/// Whether `label` (an `f64` holding an i32) is a vocabulary index.
fn counted_label(label: f64, v: usize) -> Option<usize> {
    (label >= 0.0 && label < v as f64).then_some(label as usize)
}

/// Each row's logits `x·w` in f64.
fn logits_f64(x: &Array, w: &Array) -> (Vec<f64>, usize, usize, usize) {
    let (n, d, v) = (x.shape()[0], x.shape()[1], w.shape()[1]);
    (
        crate::reference::matmul_rows(x.data(), w.data(), n, d, v),
        n,
        d,
        v,
    )
}

/// The f64 reference from the definition: each row's loss (0 for an
/// ignored row) and logsumexp.
pub fn reference(x: &Array, w: &Array, labels: &Array) -> (Vec<f64>, Vec<f64>) {
    let (s, _, _, v) = logits_f64(x, w);
    let mut loss = Vec::new();
    let mut lse = Vec::new();
    for (row, label) in s.chunks(v.max(1)).zip(labels.data()) {
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l = m + row.iter().map(|s| (s - m).exp()).sum::<f64>().ln();
        loss.push(counted_label(*label, v).map_or(0.0, |c| l - row[c]));
        lse.push(l);
    }
    (loss, lse)
}

/// The f64 backward from the definition, for the forward's `lse` and the
/// cotangents `dloss`, `dlse` (each `[n]`): `(dx, dw)` with `g =
/// dloss·(p − onehot) + dlse·p`, `p = exp(x·w − lse)` (the softmax when
/// `lse` is the forward's), the loss term dropped on ignored rows.
pub fn reference_backward(
    x: &Array,
    w: &Array,
    labels: &Array,
    lse: &[f64],
    (dloss, dlse): (&[f64], &[f64]),
) -> (Vec<f64>, Vec<f64>) {
    let (s, n, d, v) = logits_f64(x, w);
    let mut g = vec![0.0; n * v];
    for r in 0..n {
        let c = counted_label(labels.data()[r], v);
        for col in 0..v {
            let p = (s[r * v + col] - lse[r]).exp();
            let onehot = if c == Some(col) { 1.0 } else { 0.0 };
            let dl = if c.is_some() { dloss[r] } else { 0.0 };
            g[r * v + col] = dl * (p - onehot) + dlse[r] * p;
        }
    }
    let (xd, wd) = (x.data(), w.data());
    let mut dx = vec![0.0; n * d];
    let mut dw = vec![0.0; d * v];
    for r in 0..n {
        for col in 0..v {
            let gv = g[r * v + col];
            for k in 0..d {
                dx[r * d + k] += gv * wd[k * v + col];
                dw[k * v + col] += xd[r * d + k] * gv;
            }
        }
    }
    (dx, dw)
}

/// Records the loss of `x` (`[n, d]`), `w` (`[d, v]`) and `labels`
/// (`[n, 1]` i32) on the graph runtime with its backward: `(loss, lse)`,
/// each `[n, 1]` f32.
#[cfg(feature = "graph")]
pub fn call_linear_cross_entropy(
    cfg: &LinearCrossEntropyConfig,
    x: &Tensor,
    w: &Tensor,
    labels: &Tensor,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let kernel = linear_cross_entropy(cfg).map_err(|e| build_error("linear_cross_entropy", e))?;
    let mut out = x
        .runtime()
        .call_with_vjp(&kernel, &[x, w, labels], loss_vjp(cfg.clone()))?;
    let lse = out.remove(1);
    Ok((out.remove(0), lse))
}

/// The backward of the forward kernel: `dx`, `dw` from the saved `lse`
/// (or the forward again when the program dropped it) and both outputs'
/// cotangents; none for the labels.
#[cfg(feature = "graph")]
fn loss_vjp(cfg: LinearCrossEntropyConfig) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let (x, w, labels) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
        let rt = x.runtime();
        let lse = match call.outputs.get(1) {
            Some(Some(l)) => l.clone(),
            _ => rt.call(call.kernel, &[x, w, labels])?.remove(1),
        };
        let (dloss, dlse) = (call.cotangent(0)?, call.cotangent(1)?);
        // The one-kernel backward: dw's f32 tiles start as anything (row
        // block 0 writes them first).
        let dw = rt.scalar(0.0, DType::F32).broadcast_to(&[cfg.d, cfg.v])?;
        let args = [x, w, labels, &lse, &dloss, &dlse, &dw];
        let err = |e: KernelErrors| backward_error("linear_cross_entropy", e.into());
        let mut out = rt.call(&linear_cross_entropy_backward(&cfg).map_err(err)?, &args)?;
        let dw = out.remove(1).cast(w.dtype())?;
        Ok(vec![Some(out.remove(0)), Some(dw), None])
    })
}

/// The config of every kernel of the loss from the entry's config and
/// `x`'s and `w`'s shapes.
fn config(c: &Config, s: &[Vec<usize>]) -> Result<LinearCrossEntropyConfig, EntryError> {
    let [n, d] = dims(&s[0], "x")?;
    let [dw, v] = dims(&s[1], "w")?;
    if dw != d {
        return Err(EntryError::Shape(format!(
            "x is [{n}, {d}] but w is [{dw}, {v}]: w's rows must be x's {d} columns"
        )));
    }
    let [ln, one] = dims(&s[2], "labels")?;
    if (ln, one) != (n, 1) {
        return Err(EntryError::Shape(format!(
            "labels are [{ln}, {one}]; give one label per row of x, as [{n}, 1]"
        )));
    }
    let gpu = kernel_ir::current_platform() == kernel_ir::Platform::Gpu;
    Ok(LinearCrossEntropyConfig {
        n,
        d,
        v,
        bn: c.usize("bn")?.min(n),
        // A GPU program holds its blocks in shared memory, pipelined: the
        // backward's [d, bv] blocks of w and of dw's accumulator fit an
        // sm_80's 163 KiB at d = 128 only with bv <= 128.
        bv: c.usize("bv")?.min(if gpu { 128 } else { v }).min(v),
        dtype: c.dtype("dtype")?,
    })
}

/// The loss's parameters.
const PARAMS: &[crate::Param] = &[
    DTYPE,
    param("bn", ParamKind::Positive, "64", "rows per block"),
    param(
        "bv",
        ParamKind::Positive,
        "256",
        "vocabulary columns per block",
    ),
];

/// `x`, `w` near a trained model's scale, labels over the vocabulary with
/// one row in eight ignored (−100 or `v`); for the backward kernels an
/// `lse` near the forward's and cotangents in −1..1.
fn sample(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let mut rng = kernel_ir::SplitMix64(seed);
    let args: Vec<_> = k.arguments().collect();
    let (n, v) = (args[0].shape[0], args[1].shape[1]);
    let x = Array::random(args[0].dtype, args[0].shape.to_vec(), seed, -1.0, 1.0);
    let w = Array::random(args[1].dtype, args[1].shape.to_vec(), seed + 1, -0.3, 0.3);
    let labels: Vec<f64> = (0..n)
        .map(|_| match rng.below(16) {
            0 => -100.0,
            1 => v as f64,
            _ => rng.below(v) as f64,
        })
        .collect();
    let labels =
        Array::new(DType::I32, [n, 1], labels).unwrap_or_else(|_| Array::zeros(DType::I32, [n, 1]));
    let mut out = vec![x, w, labels];
    if args.len() > 3 {
        // Near the forward's lse (logits of these scales are O(1)) without
        // computing it: sampling stays cheap at a real vocabulary, and the
        // backward is defined for any lse.
        let lse = (0..n).map(|_| (v as f64).ln() + rng.next_f64()).collect();
        out.push(Array::new(F32, [n, 1], lse).unwrap_or_else(|_| Array::zeros(F32, [n, 1])));
        out.push(Array::random(F32, [n, 1], seed + 2, -1.0, 1.0));
        out.push(Array::random(F32, [n, 1], seed + 3, -1.0, 1.0));
    }
    if let Some(dw) = args.get(6) {
        // The one-kernel backward's in-out dw, overwritten by row block 0.
        out.push(Array::zeros(F32, dw.shape.to_vec()));
    }
    out
}

/// The forward's and the backward's input shapes.
fn forward_shapes(_: &Config) -> Result<Shapes, EntryError> {
    Ok(vec![
        ("x", vec![64, 128]),
        ("w", vec![128, 1000]),
        ("labels", vec![64, 1]),
    ])
}

fn backward_shapes(c: &Config) -> Result<Shapes, EntryError> {
    let mut s = forward_shapes(c)?;
    s.extend([
        ("lse", vec![64, 1]),
        ("dloss", vec![64, 1]),
        ("dlse", vec![64, 1]),
    ]);
    Ok(s)
}

/// The loss and lse: f32 sums of `d` products and an f32 logsumexp over
/// `v` terms, whatever the inputs' dtype (they are exact in f64).
fn forward_tolerance(_: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let d = k.arguments().next().map_or(1, |x| x.shape[1]);
    vec![Tolerance::matmul(d, F32); 2]
}

/// Gradients: products of recomputed probabilities, cast to the inputs'
/// dtype for the MXU, summed over `v` (dx) or `n` (dw) terms.
fn backward_tolerance(c: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let d = c.dtype("dtype").unwrap_or(DType::F32);
    let n = k.arguments().next().map_or(1, |x| x.shape[0]);
    k.outputs()
        .map(|o| match o.name.as_str() {
            "dw" => Tolerance::sum_grad(d, n),
            _ => Tolerance::attention_grad(d),
        })
        .collect()
}

/// The f64 `(dx, dw)` of a backward kernel's inputs (`x`, `w`, `labels`,
/// `lse`, `dloss`, `dlse`).
fn backward_reference(a: &[Array]) -> (Vec<f64>, Vec<f64>) {
    let (lse, dloss, dlse) = (a[3].data(), a[4].data(), a[5].data());
    reference_backward(&a[0], &a[1], &a[2], lse, (dloss, dlse))
}

/// [`linear_cross_entropy()`] in the library.
pub const LINEAR_CROSS_ENTROPY: Entry = Entry {
    name: "linear_cross_entropy",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| Ok(loss_vjp(config(c, s)?))),
    about: "fused linear + softmax cross-entropy: per-row loss and lse, the logits never in memory",
    params: PARAMS,
    inputs: forward_shapes,
    build: |c, s| Ok(linear_cross_entropy(&config(c, s)?)?),
    reference: |_, a| {
        let (loss, lse) = reference(&a[0], &a[1], &a[2]);
        Ok(vec![loss, lse])
    },
    check: no_check,
    tolerance: forward_tolerance,
    sample,
    presets: &[Preset {
        name: "linear_cross_entropy_bf16",
        about: "bf16 x[40, 128] · w[128, 1000], 16-row blocks (ragged rows and vocabulary)",
        config: &[("dtype", "bf16"), ("bn", "16")],
        shapes: &[("x", &[40, 128]), ("labels", &[40, 1])],
    }],
};

/// [`linear_cross_entropy_dx()`] in the library.
pub const LINEAR_CROSS_ENTROPY_DX: Entry = Entry {
    name: "linear_cross_entropy_dx",
    fixed_inputs: None,
    backward: None,
    about: "fused linear cross-entropy backward: dx = g·wᵀ over the vocabulary",
    params: PARAMS,
    inputs: backward_shapes,
    build: |c, s| Ok(linear_cross_entropy_dx(&config(c, s)?)?),
    reference: |_, a| Ok(vec![backward_reference(a).0]),
    check: no_check,
    tolerance: backward_tolerance,
    sample,
    presets: &[Preset {
        name: "linear_cross_entropy_dx_bf16",
        about: "dx of the bf16 preset's shapes: vocabulary columns past 1000 masked out of the sum",
        config: &[("dtype", "bf16"), ("bn", "16")],
        shapes: BACKWARD_PRESET,
    }],
};

/// [`linear_cross_entropy_backward`](mod@linear_cross_entropy_backward)
/// in the library.
pub const LINEAR_CROSS_ENTROPY_BACKWARD: Entry = Entry {
    name: "linear_cross_entropy_backward",
    fixed_inputs: None,
    backward: None,
    about: "fused linear cross-entropy backward in one kernel: dx = g·wᵀ and dw = xᵀ·g (f32, in-out) from one softmax per logit tile",
    params: PARAMS,
    inputs: |c| {
        let mut s = backward_shapes(c)?;
        let [d, v] = dims(&s[1].1, "w")?;
        s.push(("dw", vec![d, v]));
        Ok(s)
    },
    build: |c, s| {
        let cfg = config(c, s)?;
        if s[6] != [cfg.d, cfg.v] {
            return Err(EntryError::Shape(format!(
                "dw is {:?}; give it w's shape, [{}, {}] (f32; its values are not read)",
                s[6], cfg.d, cfg.v
            )));
        }
        Ok(linear_cross_entropy_backward(&cfg)?)
    },
    reference: |_, a| {
        let (dx, dw) = backward_reference(a);
        Ok(vec![dx, dw])
    },
    check: no_check,
    tolerance: backward_tolerance,
    sample,
    presets: &[Preset {
        name: "linear_cross_entropy_backward_bf16",
        about: "dx and dw of the bf16 preset's shapes in one kernel: three row blocks accumulate dw",
        config: &[("dtype", "bf16"), ("bn", "16")],
        shapes: &[
            ("x", &[40, 128]),
            ("labels", &[40, 1]),
            ("lse", &[40, 1]),
            ("dloss", &[40, 1]),
            ("dlse", &[40, 1]),
        ],
    }],
};

/// The backward presets' shapes: the forward preset's.
const BACKWARD_PRESET: &[(&str, &[usize])] = &[
    ("x", &[40, 128]),
    ("labels", &[40, 1]),
    ("lse", &[40, 1]),
    ("dloss", &[40, 1]),
    ("dlse", &[40, 1]),
];

/// [`linear_cross_entropy_dw()`] in the library.
pub const LINEAR_CROSS_ENTROPY_DW: Entry = Entry {
    name: "linear_cross_entropy_dw",
    fixed_inputs: None,
    backward: None,
    about: "fused linear cross-entropy backward: dw = xᵀ·g over the rows",
    params: PARAMS,
    inputs: backward_shapes,
    build: |c, s| Ok(linear_cross_entropy_dw(&config(c, s)?)?),
    reference: |_, a| Ok(vec![backward_reference(a).1]),
    check: no_check,
    tolerance: backward_tolerance,
    sample,
    presets: &[Preset {
        name: "linear_cross_entropy_dw_bf16",
        about: "dw of the bf16 preset's shapes: rows past 40 masked out of the sum",
        config: &[("dtype", "bf16"), ("bn", "16")],
        shapes: BACKWARD_PRESET,
    }],
};
