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
#[cfg(feature = "graph")]
use crate::recording::{backward_error, build_error};
use crate::reference;
#[cfg(feature = "graph")]
use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};
#[cfg(feature = "graph")]
use std::sync::Arc;

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

pub use crate::routing::{GroupMetadata, group_metadata, visits};
use crate::routing::{
    as_i32, group_sizes, i32_array, offsets_of, sampled_group_sizes, x_block_rows,
};

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

/// The config of the entry's kernel from its config and input shapes.
fn entry_config(c: &Config, s: &[Vec<usize>]) -> Result<GroupedMatmulConfig, EntryError> {
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
    Ok(GroupedMatmulConfig {
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
    })
}

/// The grouped matmul's backward: `dx` is the grouped matmul of the
/// cotangent with the other rhs form (same rows, same schedule), `dw` the
/// weight gradient ([`crate::tgmm`]) on a schedule made on the device
/// from the offsets. The cotangent is rounded to the inputs' dtype for
/// the matrix unit, as flash attention's backward rounds `dS`.
#[cfg(feature = "graph")]
fn grouped_matmul_vjp(c: GroupedMatmulConfig) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let [offsets, group_ids, m_tile_ids, x, w] = call.inputs else {
            return Err(RuntimeError::Internal(
                "grouped_matmul takes five arguments".into(),
            ));
        };
        let rt = x.runtime();
        let dy = call.cotangent(0)?.cast(c.dtype)?;
        let err = |e: KernelErrors| backward_error("grouped_matmul", e.into());
        let dx_cfg = GroupedMatmulConfig {
            k: c.n,
            n: c.k,
            bk: c.bn,
            bn: c.bk,
            transpose_rhs: !c.transpose_rhs,
            out_dtype: x.dtype(),
            ..c.clone()
        };
        let dx = rt
            .call(
                &grouped_matmul(&dx_cfg).map_err(err)?,
                &[offsets, group_ids, m_tile_ids, &dy, w],
            )?
            .remove(0);
        let t = crate::routing::schedule(offsets, c.m, c.bm, true)?;
        // dw[g] = xᵀ·dy over g's rows, or its transpose dyᵀ·x for w_t.
        let (a, b, (k, n), (bk, bn)) = if c.transpose_rhs {
            (&dy, x, (c.n, c.k), (c.bn, c.bk))
        } else {
            (x, &dy, (c.k, c.n), (c.bk, c.bn))
        };
        let tg = crate::tgmm::weight_gradient((c.m, k, n, c.e), (c.bm, bk, bn), c.dtype, w.dtype())
            .map_err(err)?;
        let dw = rt
            .call(
                &tg,
                &[
                    &t.offsets,
                    &t.group_ids,
                    &t.m_tile_ids,
                    &t.visit_count,
                    a,
                    b,
                ],
            )?
            .remove(0);
        Ok(vec![None, None, None, Some(dx), Some(dw)])
    })
}

/// Records the grouped matmul of `x[m, k]` with `w` on the graph runtime,
/// on a schedule made on the device ([`crate::routing::route`]), with its
/// backward (`dx`, and `dw` through the weight gradient).
#[cfg(feature = "graph")]
pub fn call_grouped_matmul(
    c: &GroupedMatmulConfig,
    schedule: &crate::routing::Schedule,
    x: &Tensor,
    w: &Tensor,
) -> Result<Tensor, RuntimeError> {
    let kernel = grouped_matmul(c).map_err(|e| build_error("grouped_matmul", e))?;
    let s = schedule;
    Ok(x.runtime()
        .call_with_vjp(
            &kernel,
            &[&s.offsets, &s.group_ids, &s.m_tile_ids, x, w],
            grouped_matmul_vjp(c.clone()),
        )?
        .remove(0))
}

/// [`grouped_matmul()`] in the library.
pub const GROUPED_MATMUL: Entry = Entry {
    name: "grouped_matmul",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, s| Ok(grouped_matmul_vjp(entry_config(c, s)?))),
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
    build: |c, s| Ok(grouped_matmul(&entry_config(c, s)?)?),
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
