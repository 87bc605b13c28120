//! Grouped matmul for mixture-of-experts layers: tokens sorted by expert,
//! `o[r] = x[r] · w[g(r)]` with `g(r)` the group (expert) of row `r`, and
//! the transposed-rhs form `o[r] = x[r] · w_t[g(r)]ᵀ` the backward pass
//! uses (`dx = dy · wᵀ` with `w` stored `[e, n, k]`).
//!
//! The grid walks *visits*: each (row tile, group) pair whose rows meet,
//! in row order, so a tile that straddles a group boundary is visited once
//! per group and each visit stores only its group's rows (a masked store;
//! consecutive visits of one tile keep its output block in VMEM). The
//! schedule is scalar prefetch, computed on the host from the group sizes
//! by [`group_metadata`] (as Pallas' megablox does): `group_offsets[e + 1]`
//! (row where each group starts), and per visit its group and row tile.
//! The grid has `m_tiles + e − 1` visits, the most any sizes need; unused
//! ones repeat the last visit, which stores the same values again.
//!
//! ```
//! use kernels::moe::{GroupedMatmulConfig, grouped_matmul, group_metadata};
//! let meta = group_metadata(&[100, 0, 28], 128, 64);
//! assert_eq!(meta.offsets, [0, 100, 100, 128]);
//! assert_eq!(meta.group_ids, [0, 0, 2, 2]); // tile 1 is split: groups 0 and 2
//! assert_eq!(meta.m_tile_ids, [0, 1, 1, 1]);
//! let cfg = GroupedMatmulConfig { m: 128, k: 256, n: 128, e: 3, bm: 64, bk: 128, bn: 128,
//!     transpose_rhs: false, dtype: kernel_ir::DType::BF16, out_dtype: kernel_ir::DType::F32 };
//! let k = grouped_matmul(&cfg).unwrap();
//! assert_eq!(k.arguments().count(), 5); // offsets, group ids, tile ids, x, w
//! ```

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, OUT_DTYPE, ParamKind, Preset, arg, dims, matmul_tolerance,
    param,
};
use crate::reference;

/// Config of [`grouped_matmul()`].
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedMatmulConfig {
    /// Rows (tokens).
    pub m: usize,
    /// The contracted dim.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// Groups (experts).
    pub e: usize,
    /// Rows per tile.
    pub bm: usize,
    /// Depth per k step.
    pub bk: usize,
    /// Columns per tile.
    pub bn: usize,
    /// The rhs is `w_t: [e, n, k]` (contracted on its last dim) instead of
    /// `w: [e, k, n]`.
    pub transpose_rhs: bool,
    /// Input dtype (x, w).
    pub dtype: DType,
    /// Output dtype.
    pub out_dtype: DType,
}

/// The visit schedule of a grouped matmul (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMetadata {
    /// `offsets[g]..offsets[g + 1]` are the rows of group `g`.
    pub offsets: Vec<i32>,
    /// The group of each visit.
    pub group_ids: Vec<i32>,
    /// The row tile of each visit.
    pub m_tile_ids: Vec<i32>,
}

/// The most visits any group sizes need: every tile once, plus one per
/// group boundary inside a tile.
pub fn visits(m: usize, bm: usize, e: usize) -> usize {
    (cdiv(m, bm) + e.saturating_sub(1)).max(1)
}

/// The schedule for `group_sizes` (summing to `m`) and tiles of `bm` rows:
/// visits in row order, padded to [`visits`] by repeating the last one.
pub fn group_metadata(group_sizes: &[usize], m: usize, bm: usize) -> GroupMetadata {
    let bm = bm.max(1);
    let mut offsets = vec![0i32];
    for s in group_sizes {
        let last = *offsets.last().unwrap_or(&0);
        offsets.push(last + *s as i32);
    }
    let (mut group_ids, mut m_tile_ids) = (Vec::new(), Vec::new());
    for (g, w) in offsets.windows(2).enumerate() {
        let (start, end) = (w[0] as usize, w[1] as usize);
        if start == end {
            continue;
        }
        for tile in start / bm..end.div_ceil(bm) {
            group_ids.push(g as i32);
            m_tile_ids.push(tile as i32);
        }
    }
    let total = visits(m, bm, group_sizes.len());
    let (lg, lt) = (
        group_ids.last().copied().unwrap_or(0),
        m_tile_ids.last().copied().unwrap_or(0),
    );
    group_ids.resize(total, lg);
    m_tile_ids.resize(total, lt);
    GroupMetadata {
        offsets,
        group_ids,
        m_tile_ids,
    }
}

/// The grouped matmul kernel.
#[tpu_kernel(
    grid = (cdiv(n, bn), visits, cdiv(k, bk)),
    semantics = (parallel, arbitrary, arbitrary),
    name = if transpose { "grouped_matmul_t" } else { "grouped_matmul" }
)]
#[allow(clippy::too_many_arguments)]
pub fn grouped_matmul<T: Float, O: Float>(
    bm: usize,
    bk: usize,
    bn: usize,
    transpose: bool,
    #[shape(e1)] group_offsets: Prefetch,
    #[shape(visits)] group_ids: Prefetch,
    #[shape(visits)] m_tile_ids: Prefetch,
    #[shape(m, k)]
    #[block([bm, bk], |_, v, l| (m_tile_ids[v], l))]
    x: In<T>,
    #[shape(e, if transpose { n } else { k }, if transpose { k } else { n })]
    #[block(
        [1, if transpose { bn } else { bk }, if transpose { bk } else { bn }],
        |j, v, l| if transpose { (group_ids[v], j, l) } else { (group_ids[v], l, j) }
    )]
    w: In<T>,
    #[shape(m, n)]
    #[block([bm, bn], |j, v, _| (m_tile_ids[v], j))]
    o: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let (v, l) = (program_id(1), program_id(2));
    if l == 0 {
        acc.store(.., 0.0);
    }
    let (xv, wv) = if k % bk == 0 {
        (x.load(..), w.load((0, .., ..)))
    } else {
        // The ragged k tail is padding in both operands: mask both, as
        // 0 · garbage is garbage.
        let col = x.positions(1);
        let wv = if transpose {
            let wcol = iota(I32, [bn, bk], 1) + l * bk;
            w.load_masked((0, .., ..), wcol < k as i32)
        } else {
            let wrow = iota(I32, [bk, bn], 0) + l * bk;
            w.load_masked((0, .., ..), wrow < k as i32)
        };
        (x.load_masked(.., col < k as i32), wv)
    };
    let wv = if transpose { wv.t() } else { wv };
    acc.store(.., acc.load(..) + dot(xv, wv));
    if l == num_programs(2) - 1 {
        let g = group_ids.load([v]);
        let (start, end) = (group_offsets.load([g]), group_offsets.load([g + 1]));
        let row = o.positions(0);
        o.store_masked(.., acc.load(..).cast::<O>(), row >= start && row < end);
    }
}

/// The grouped matmul for a config. Arguments: `group_offsets[e + 1]`,
/// `group_ids[visits]`, `m_tile_ids[visits]` (from [`group_metadata`]),
/// `x[m, k]`, then `w[e, k, n]` (or `w_t[e, n, k]` with `transpose_rhs`);
/// output `o[m, n]`.
pub fn grouped_matmul(c: &GroupedMatmulConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = grouped_matmul::Dims {
        e1: c.e + 1,
        visits: visits(c.m, c.bm, c.e),
        m: c.m,
        k: c.k,
        e: c.e,
        n: c.n,
    };
    let t = c.transpose_rhs;
    grouped_matmul::build_for(c.dtype, c.out_dtype, c.bm, c.bk, c.bn, t, dims)
}

/// `o[r] = x[r] · w[g(r)]` (or `· w_t[g(r)]ᵀ`) in f64, for rows
/// `offsets[g]..offsets[g + 1]` of group `g`.
pub fn reference(x: &Array, w: &Array, offsets: &[usize], transpose: bool) -> Vec<f64> {
    let (m, k) = (x.shape()[0], x.shape()[1]);
    let n = if transpose {
        w.shape()[1]
    } else {
        w.shape()[2]
    };
    let mut o = vec![0.0; m * n];
    for (g, span) in offsets.windows(2).enumerate() {
        // w[g] as a [k, n] matrix.
        let wg: Vec<f64> = (0..k * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                if transpose {
                    w.data()[(g * n + c) * k + r]
                } else {
                    w.data()[(g * k + r) * n + c]
                }
            })
            .collect();
        let (a, b) = (span[0].min(m), span[1].min(m));
        let rows = reference::matmul_rows(&x.data()[a * k..b * k], &wg, b - a, k, n);
        o[a * n..b * n].copy_from_slice(&rows);
    }
    o
}

pub(crate) fn offsets_of(a: &Array) -> Vec<usize> {
    a.data().iter().map(|&v| v.max(0.0) as usize).collect()
}

/// The group sizes of `group_offsets`, which must rise from 0 to `m` (the
/// check both schedules' entries make before comparing their schedule).
pub(crate) fn group_sizes(off: &Array, m: usize) -> Result<Vec<usize>, EntryError> {
    let offs = off.data();
    let monotone = offs.windows(2).all(|w| w[0] <= w[1]);
    if offs.first() != Some(&0.0) || offs.last() != Some(&(m as f64)) || !monotone {
        return Err(EntryError::Input(format!(
            "group_offsets must rise from 0 to m = {m} (the running sum of the group sizes), got {offs:?}"
        )));
    }
    Ok(offsets_of(off).windows(2).map(|w| w[1] - w[0]).collect())
}

/// Rows per tile: the block of operand `x`.
pub(crate) fn x_block_rows(k: &VerifiedKernel) -> usize {
    k.operands
        .iter()
        .find(|o| o.name == "x")
        .map_or(1, |o| o.block.shape[0])
}

/// An i32 array's values as i32s.
pub(crate) fn as_i32(a: &Array) -> Vec<i32> {
    a.data().iter().map(|&v| v as i32).collect()
}

/// `v` as an i32 array.
pub(crate) fn i32_array(v: &[i32]) -> Array {
    Array::new(DType::I32, [v.len()], v.iter().map(|&x| x as f64).collect())
        .unwrap_or_else(|_| Array::zeros(DType::I32, [v.len()]))
}

/// Random sizes of `e` groups summing to `m`, group 1 empty when there are
/// three or more (what the samples of both schedules' entries draw).
pub(crate) fn sampled_group_sizes(m: usize, e: usize, seed: u64) -> Vec<usize> {
    let mut rng = kernel_ir::SplitMix64(seed);
    let mut cuts: Vec<usize> = (0..e.saturating_sub(1)).map(|_| rng.below(m + 1)).collect();
    cuts.sort_unstable();
    if e >= 3 {
        cuts[1] = cuts[0]; // group 1 is empty
    }
    let mut bounds = vec![0];
    bounds.extend(cuts);
    bounds.push(m);
    bounds.windows(2).map(|w| w[1] - w[0]).collect()
}

/// The group offsets must run from 0 to `m` without going back, and the
/// schedule must be the one [`group_metadata`] makes for them (a wrong one
/// would leave rows unwritten or write rows twice).
fn check(_: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    let (Some(off), Some(ids), Some(tiles), Some(x)) = (
        arg(k, a, "group_offsets"),
        arg(k, a, "group_ids"),
        arg(k, a, "m_tile_ids"),
        arg(k, a, "x"),
    ) else {
        return Ok(());
    };
    let m = x.shape()[0];
    let sizes = group_sizes(off, m)?;
    let want = group_metadata(&sizes, m, x_block_rows(k));
    if as_i32(ids) != want.group_ids || as_i32(tiles) != want.m_tile_ids {
        return Err(EntryError::Input(
            "group_ids and m_tile_ids are not the schedule of group_offsets; build them with kernels::moe::group_metadata".into(),
        ));
    }
    Ok(())
}

/// Random tokens and weights, and random group sizes (an empty group
/// included when there are three or more) with their schedule.
fn sample(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let shapes: Vec<(DType, Vec<usize>)> =
        k.arguments().map(|a| (a.dtype, a.shape.to_vec())).collect();
    let (m, e) = (shapes[3].1[0], shapes[0].1[0].saturating_sub(1));
    let sizes = sampled_group_sizes(m, e, seed);
    let meta = group_metadata(&sizes, m, x_block_rows(k));
    vec![
        i32_array(&meta.offsets),
        i32_array(&meta.group_ids),
        i32_array(&meta.m_tile_ids),
        Array::random(shapes[3].0, shapes[3].1.clone(), seed + 1, -1.0, 1.0),
        Array::random(shapes[4].0, shapes[4].1.clone(), seed + 2, -0.2, 0.2),
    ]
}

/// [`grouped_matmul()`] in the library.
pub const GROUPED_MATMUL: Entry = Entry {
    name: "grouped_matmul",
    fixed_inputs: None,
    backward: None,
    about: "MoE grouped matmul: rows sorted by expert, o[r] = x[r] * w[g(r)] (or * w_t[g(r)]^T); schedule from kernels::moe::group_metadata as scalar prefetch",
    params: &[
        DTYPE,
        OUT_DTYPE,
        param(
            "transpose_rhs",
            ParamKind::Bool,
            "false",
            "the rhs is w_t[e, n, k] (the backward pass's dx = dy * w^T)",
        ),
        param("bm", ParamKind::Positive, "128", "rows per tile"),
        param("bk", ParamKind::Positive, "128", "depth per k step"),
        param("bn", ParamKind::Positive, "128", "columns per tile"),
    ],
    inputs: |c| {
        let (m, k, n, e, bm) = (384, 256, 256, 4, c.usize("bm")?.min(384));
        let v = visits(m, bm, e);
        Ok(vec![
            ("group_offsets", vec![e + 1]),
            ("group_ids", vec![v]),
            ("m_tile_ids", vec![v]),
            ("x", vec![m, k]),
            (
                "w",
                if c.bool("transpose_rhs")? {
                    vec![e, n, k]
                } else {
                    vec![e, k, n]
                },
            ),
        ])
    },
    build: |c, s| {
        let [m, k] = dims(&s[3], "x")?;
        let [e, a, b] = dims(&s[4], "w")?;
        let t = c.bool("transpose_rhs")?;
        let (wk, n) = if t { (b, a) } else { (a, b) };
        if wk != k {
            return Err(EntryError::Shape(format!(
                "x is [{m}, {k}] but w contracts {wk} (w is {:?}{})",
                s[4],
                if t {
                    ", [e, n, k] with transpose_rhs"
                } else {
                    ", [e, k, n]"
                }
            )));
        }
        Ok(grouped_matmul(&GroupedMatmulConfig {
            m,
            k,
            n,
            e,
            bm: c.usize("bm")?.min(m),
            bk: c.usize("bk")?.min(k),
            bn: c.usize("bn")?.min(n),
            transpose_rhs: t,
            dtype: c.dtype("dtype")?,
            out_dtype: c.dtype("out_dtype")?,
        })?)
    },
    reference: |c, a| {
        Ok(vec![reference(
            &a[3],
            &a[4],
            &offsets_of(&a[0]),
            c.bool("transpose_rhs")?,
        )])
    },
    check,
    tolerance: matmul_tolerance,
    sample,
    presets: &[
        Preset {
            name: "grouped_matmul_bf16",
            about: "MoE grouped matmul: 4 experts over 384 bf16 tokens, [256 -> 256], tiles straddling group boundaries",
            config: &[("dtype", "bf16")],
            shapes: &[],
        },
        Preset {
            name: "grouped_matmul_t_ragged_k",
            about: "MoE grouped matmul with the transposed rhs w_t[e, n, k] (the backward's dx), f32, ragged k = 200",
            config: &[("transpose_rhs", "true")],
            shapes: &[("x", &[384, 200]), ("w", &[4, 256, 200])],
        },
    ],
};
