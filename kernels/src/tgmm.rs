//! The grouped matmul's weight gradient (megablox's `tgmm`): for tokens
//! sorted by expert, `dw[g] = x[rows of g]ᵀ · dy[rows of g]`, one
//! `[k, n]` matrix per group, an empty group's zero.
//!
//! The grid walks `(k tile, n tile, visit)`; a visit is a (row tile,
//! group) pair as in [`crate::moe`], but every group is visited (an empty
//! one once, its rows all masked), so each group's block is written. A
//! group's visits are consecutive: the f32 accumulator starts at its first
//! and is stored at its last. Visits past `visit_count` (the schedule is
//! padded to a fixed length) add nothing.
//!
//! ```
//! use kernels::tgmm::tgmm_metadata;
//! let (meta, count) = tgmm_metadata(&[100, 0, 28], 128, 64);
//! assert_eq!(meta.group_ids[..count], [0, 0, 1, 2]); // group 1 (empty) visited once
//! assert_eq!(meta.m_tile_ids[..count], [0, 1, 1, 1]); // tile 1 holds rows of groups 0 and 2
//! ```

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, OUT_DTYPE, ParamKind, Preset, arg, dims, param,
};
use crate::routing::{
    GroupMetadata, as_i32, group_sizes, host_schedule, i32_array, offsets_of, sampled_group_sizes,
    visits, x_block_rows,
};
use crate::tolerance::Tolerance;

/// The schedule of a weight gradient for `group_sizes` (summing to `m`)
/// and tiles of `bm` rows: every group's row tiles in row order, an empty
/// group visited once at the tile where it would start; padded to
/// [`visits`] by repeating the last visit. Returns it and the number of
/// real visits.
pub fn tgmm_metadata(group_sizes: &[usize], m: usize, bm: usize) -> (GroupMetadata, usize) {
    host_schedule(group_sizes, m, bm, true)
}

/// The weight-gradient kernel: `dw[e, k, n]` from `x[m, k]` and
/// `dy[m, n]`, rows grouped by `group_offsets`.
#[tpu_kernel(
    grid = (cdiv(k, bk), cdiv(n, bn), visits),
    semantics = (parallel, parallel, arbitrary)
)]
#[allow(clippy::too_many_arguments)]
pub fn tgmm<T: Float, O: Float>(
    bm: usize,
    bk: usize,
    bn: usize,
    #[shape(e1)] group_offsets: Prefetch,
    #[shape(visits)] group_ids: Prefetch,
    #[shape(visits)] m_tile_ids: Prefetch,
    #[shape(1)] visit_count: Prefetch,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, v| (m_tile_ids[v], i))]
    x: In<T>,
    #[shape(m, n)]
    #[block([bm, bn], |_, j, v| (m_tile_ids[v], j))]
    dy: In<T>,
    #[shape(e, k, n)]
    #[block([1, bk, bn], |i, j, v| (group_ids[v], i, j))]
    dw: Out<O>,
    #[shape(bk, bn)] acc: Scratch<f32>,
) {
    let v = program_id(2);
    let g = group_ids.load([v]);
    let prev = group_ids.load([select(v > 0, v - 1, 0)]);
    let next = group_ids.load([select(v + 1 < visits as i32, v + 1, v)]);
    if v == 0 || prev != g {
        acc.store(.., 0.0);
    }
    // This group's rows of the tile, the rest (other groups, a padded
    // visit, rows past m) zero in both operands: 0 · garbage is garbage.
    let start = group_offsets.load([g]);
    let end = select(
        v < visit_count.load([0]),
        group_offsets.load([g + 1]),
        start,
    );
    let (xr, dyr) = (x.positions(0), dy.positions(0));
    let xv = x.load_masked(.., xr >= start && xr < end);
    let dyv = dy.load_masked(.., dyr >= start && dyr < end);
    acc.store(.., acc.load(..) + dot(xv.t(), dyv));
    if v == visits as i32 - 1 || next != g {
        dw.store((0, .., ..), acc.load(..).cast::<O>());
    }
}

/// The weight gradient for `e` groups over `m` rows: arguments
/// `group_offsets[e + 1]`, `group_ids[visits]`, `m_tile_ids[visits]`,
/// `visit_count[1]` (from [`tgmm_metadata`]), `x[m, k]`, `dy[m, n]`;
/// output `dw[e, k, n]`.
pub fn weight_gradient(
    (m, k, n, e): (usize, usize, usize, usize),
    (bm, bk, bn): (usize, usize, usize),
    dtype: DType,
    out_dtype: DType,
) -> Result<VerifiedKernel, KernelErrors> {
    let dims = tgmm::Dims {
        e1: e + 1,
        visits: visits(m, bm, e),
        m,
        k,
        n,
        e,
    };
    tgmm::build_for(dtype, out_dtype, bm, bk, bn, dims)
}

/// `dw[g] = Σ_{r ∈ g} x[r]ᵀ dy[r]` in f64, rows `offsets[g]..offsets[g + 1]`.
pub fn reference(x: &Array, dy: &Array, offsets: &[usize]) -> Vec<f64> {
    let (m, k, n) = (x.shape()[0], x.shape()[1], dy.shape()[1]);
    let e = offsets.len().saturating_sub(1);
    let mut dw = vec![0.0; e * k * n];
    for g in 0..e {
        for r in offsets[g].min(m)..offsets[g + 1].min(m) {
            for a in 0..k {
                let xa = x.data()[r * k + a];
                for b in 0..n {
                    dw[(g * k + a) * n + b] += xa * dy.data()[r * n + b];
                }
            }
        }
    }
    dw
}

/// The schedule must be the one [`tgmm_metadata`] makes for the offsets
/// (another would leave a group's block unwritten or count rows twice).
fn check(_: &Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    let (Some(off), Some(ids), Some(tiles), Some(count), Some(x)) = (
        arg(k, a, "group_offsets"),
        arg(k, a, "group_ids"),
        arg(k, a, "m_tile_ids"),
        arg(k, a, "visit_count"),
        arg(k, a, "x"),
    ) else {
        return Ok(());
    };
    let m = x.shape()[0];
    let sizes = group_sizes(off, m)?;
    let (want, n) = tgmm_metadata(&sizes, m, x_block_rows(k));
    if as_i32(ids) != want.group_ids
        || as_i32(tiles) != want.m_tile_ids
        || as_i32(count) != [n as i32]
    {
        return Err(EntryError::Input(
            "group_ids, m_tile_ids and visit_count are not the weight gradient's schedule of group_offsets; build them with kernels::tgmm::tgmm_metadata".into(),
        ));
    }
    Ok(())
}

/// Random tokens and gradients, random group sizes (one empty group when
/// there are three or more) and their schedule.
fn sample(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let shapes: Vec<(DType, Vec<usize>)> =
        k.arguments().map(|a| (a.dtype, a.shape.to_vec())).collect();
    let (m, e) = (shapes[4].1[0], shapes[0].1[0].saturating_sub(1));
    let sizes = sampled_group_sizes(m, e, seed);
    let (meta, count) = tgmm_metadata(&sizes, m, x_block_rows(k));
    vec![
        i32_array(&meta.offsets),
        i32_array(&meta.group_ids),
        i32_array(&meta.m_tile_ids),
        i32_array(&[count as i32]),
        Array::random(shapes[4].0, shapes[4].1.clone(), seed + 1, -1.0, 1.0),
        Array::random(shapes[5].0, shapes[5].1.clone(), seed + 2, -1.0, 1.0),
    ]
}

/// [`tgmm`](mod@tgmm) in the library.
pub const TGMM: Entry = Entry {
    name: "tgmm",
    fixed_inputs: None,
    backward: None,
    about: "MoE grouped matmul weight gradient (megablox tgmm): dw[g] = x[rows of g]^T * dy[rows of g], empty groups zero; schedule from kernels::tgmm::tgmm_metadata",
    params: &[
        DTYPE,
        OUT_DTYPE,
        param("bm", ParamKind::Positive, "128", "rows per tile"),
        param("bk", ParamKind::Positive, "128", "rows of dw per block"),
        param("bn", ParamKind::Positive, "128", "columns of dw per block"),
    ],
    inputs: |c| {
        let (m, k, n, e, bm) = (384, 256, 256, 4, c.usize("bm")?.min(384));
        let v = visits(m, bm, e);
        Ok(vec![
            ("group_offsets", vec![e + 1]),
            ("group_ids", vec![v]),
            ("m_tile_ids", vec![v]),
            ("visit_count", vec![1]),
            ("x", vec![m, k]),
            ("dy", vec![m, n]),
        ])
    },
    build: |c, s| {
        let [e1] = dims(&s[0], "group_offsets")?;
        let [m, k] = dims(&s[4], "x")?;
        let [my, n] = dims(&s[5], "dy")?;
        if my != m || e1 == 0 {
            return Err(EntryError::Shape(format!(
                "x is [{m}, {k}] and dy [{my}, {n}]: give them the same rows, and group_offsets e + 1 long"
            )));
        }
        Ok(weight_gradient(
            (m, k, n, e1 - 1),
            (
                c.usize("bm")?.min(m),
                c.usize("bk")?.min(k),
                c.usize("bn")?.min(n),
            ),
            c.dtype("dtype")?,
            c.dtype("out_dtype")?,
        )?)
    },
    reference: |_, a| Ok(vec![reference(&a[4], &a[5], &offsets_of(&a[0]))]),
    check,
    // The contraction runs over the rows.
    tolerance: |_, k| {
        let rows = k
            .operands
            .iter()
            .find(|o| o.name == "x")
            .map_or(1, |o| o.shape[0]);
        k.outputs()
            .map(|o| Tolerance::matmul(rows, o.dtype))
            .collect()
    },
    sample,
    presets: &[Preset {
        name: "tgmm_bf16",
        about: "MoE weight gradient: 4 experts over 384 bf16 tokens, [256 x 256] per expert, one expert empty",
        config: &[("dtype", "bf16")],
        shapes: &[],
    }],
};
