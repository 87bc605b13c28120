//! The MoE routing tables, made on the device from the router's expert
//! ids, so a training step routes, permutes, multiplies and comes back in
//! one program with no trip to the host:
//!
//! * each slot's position in expert order (`pos`, what
//!   [`crate::permute`]'s kernels take): the kernel
//!   [`moe_positions`](mod@moe_positions), which walks the slots in
//!   order with each expert's running count in scratch (a stable sort by
//!   expert, without sorting);
//! * the group offsets (`[e + 1]`, the running sum of the experts' slot
//!   counts) and the visit schedules of the grouped matmul and of its
//!   weight gradient ([`crate::moe::group_metadata`],
//!   [`crate::tgmm::tgmm_metadata`], as tensors): a few element-wise ops
//!   over `[e, visits]`, as megablox makes its schedule with `jnp` ops
//!   beside the kernel (feature `graph`).
//!
//! The host functions stay the definition: the tests compare both.
//!
//! ```
//! use kernel_ir::prelude::*;
//! use kernels::routing::{moe_positions, positions_reference};
//! // Slots routed to experts 1, 0, 2, 1 (two tokens, k = 2), 3 experts.
//! let ids = Array::new(I32, [1, 4], vec![1.0, 0.0, 2.0, 1.0])?;
//! let starts = Array::new(I32, [3, 1], vec![0.0, 1.0, 3.0])?; // expert 0 holds 1 slot, expert 1 two
//! let k = moe_positions::build(4, moe_positions::Dims { n: 4, e: 3 })?; // one block of 4 slots
//! let pos = interpret(&k, &[ids.clone(), starts])?.remove(0);
//! assert_eq!(pos.data(), [1.0, 0.0, 3.0, 2.0]);
//! assert_eq!(positions_reference(&ids, 3), [1, 0, 3, 2]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use kernel_ir::prelude::*;
use kernel_ir::{Array, VerifiedKernel};

use crate::entry::{Entry, EntryError, ParamKind, Preset, arg, dims, param};
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor};

/// The visit schedule of a grouped matmul (see [`crate::moe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMetadata {
    /// `offsets[g]..offsets[g + 1]` are the rows of group `g`.
    pub offsets: Vec<i32>,
    /// The group of each visit.
    pub group_ids: Vec<i32>,
    /// The row tile of each visit.
    pub m_tile_ids: Vec<i32>,
}

/// The schedule for `group_sizes` (summing to `m`) and tiles of `bm` rows:
/// visits in row order, padded to [`visits`] by repeating the last one.
pub fn group_metadata(group_sizes: &[usize], m: usize, bm: usize) -> GroupMetadata {
    host_schedule(group_sizes, m, bm, false).0
}

/// A visit schedule on the host, as [`schedule`] makes it on the device:
/// each group's row tiles in row order; with `every_group` an empty group
/// is visited once, at the tile where it would start (a weight gradient
/// writes every group), else skipped. Padded to [`visits`] by repeating
/// the last visit; returns it and the number of real visits.
pub(crate) fn host_schedule(
    group_sizes: &[usize],
    m: usize,
    bm: usize,
    every_group: bool,
) -> (GroupMetadata, usize) {
    let bm = bm.max(1);
    let last_tile = m.div_ceil(bm).saturating_sub(1);
    let offsets = running_offsets(group_sizes);
    let (mut group_ids, mut m_tile_ids) = (Vec::new(), Vec::new());
    for (g, w) in offsets.windows(2).enumerate() {
        let (start, end) = (w[0] as usize, w[1] as usize);
        let tiles = match (start == end, every_group) {
            (true, false) => continue,
            (true, true) => {
                let t = (start / bm).min(last_tile);
                t..t + 1
            }
            (false, _) => start / bm..end.div_ceil(bm),
        };
        for tile in tiles {
            group_ids.push(g as i32);
            m_tile_ids.push(tile as i32);
        }
    }
    let count = group_ids.len();
    let total = visits(m, bm, group_sizes.len()).max(count);
    let (lg, lt) = (
        group_ids.last().copied().unwrap_or(0),
        m_tile_ids.last().copied().unwrap_or(0),
    );
    group_ids.resize(total, lg);
    m_tile_ids.resize(total, lt);
    (
        GroupMetadata {
            offsets,
            group_ids,
            m_tile_ids,
        },
        count,
    )
}

/// `[0, s0, s0 + s1, ..]`: where each group's rows start, and the end.
fn running_offsets(group_sizes: &[usize]) -> Vec<i32> {
    let mut offsets = vec![0i32];
    for s in group_sizes {
        let last = *offsets.last().unwrap_or(&0);
        offsets.push(last + *s as i32);
    }
    offsets
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

/// The most visits any group sizes need: every tile once, plus one per
/// group boundary inside a tile.
pub fn visits(m: usize, bm: usize, e: usize) -> usize {
    (cdiv(m, bm) + e.saturating_sub(1)).max(1)
}

/// Each slot's position in expert order: `pos[s] = starts[ids[s]] + #{s' <
/// s : ids[s'] = ids[s]}`, blocks of `bn` slots in order, each expert's
/// count so far carried in scratch. Counts are f32 (exact below 2²⁴; the
/// TPU has no i32 products for the in-block prefix sum).
#[tpu_kernel(grid = (cdiv(n, bn),), semantics = (arbitrary,))]
pub fn moe_positions(
    bn: usize,
    #[shape(1, n)]
    #[block([1, bn], |i| (0, i))]
    ids: In<i32>,
    #[shape(e, 1)]
    #[block([e, 1], |_| (0, 0))]
    starts: In<i32>,
    #[shape(1, n)]
    #[block([1, bn], |i| (0, i))]
    pos: Out<i32>,
    #[shape(e, 1)] seen: Scratch<f32>,
) {
    if program_id(0) == 0 {
        seen.store(.., 0.0);
    }
    // Slots past n (a ragged last block) match no expert.
    let id = select(ids.positions(1) < n as i32, ids.load(..), -1).convert(F32);
    let expert = iota(F32, [e, bn], 0);
    let hit = expert == id.broadcast_to([e, bn]);
    let one = select(hit, 1.0, 0.0);
    let base = seen.load(..) + starts.load(..).convert(F32);
    let at = select(hit, one.cumsum_exclusive(1) + base, 0.0).sum_keep(0);
    pos.store(.., at.convert(I32));
    seen.store(.., seen.load(..) + one.sum_keep(1));
}

/// The positions from the definition: the slots sorted stably by expert
/// (ids `[1, n]`, each below `experts`).
pub fn positions_reference(ids: &Array, experts: usize) -> Vec<usize> {
    let ids: Vec<usize> = ids.data().iter().map(|&v| v.max(0.0) as usize).collect();
    crate::permute::slot_positions(&ids, experts)
}

/// The group offsets of `ids` over `experts`, from the definition.
pub fn offsets_reference(ids: &[usize], experts: usize) -> Vec<usize> {
    let mut off = vec![0; experts + 1];
    for &i in ids {
        if i < experts {
            off[i + 1] += 1;
        }
    }
    for g in 0..experts {
        off[g + 1] += off[g];
    }
    off
}

/// The tables a routed MoE layer needs, on the device (see the module
/// docs): `pos` for the permutes, and the group offsets with the grouped
/// matmul's visit schedule (`bm` rows a tile).
#[cfg(feature = "graph")]
#[derive(Clone, Debug)]
pub struct Routing {
    /// Each slot's position in expert order, `[tokens·k]` i32.
    pub pos: Tensor,
    /// The grouped matmul's schedule.
    pub schedule: Schedule,
}

/// A visit schedule as tensors: what [`crate::moe::group_metadata`]
/// gives (or, for a weight gradient, [`crate::tgmm::tgmm_metadata`] with
/// its count).
#[cfg(feature = "graph")]
#[derive(Clone, Debug)]
pub struct Schedule {
    /// `[e + 1]` i32: rows `offsets[g]..offsets[g + 1]` are group `g`'s.
    pub offsets: Tensor,
    /// `[visits]` i32.
    pub group_ids: Tensor,
    /// `[visits]` i32.
    pub m_tile_ids: Tensor,
    /// `[1]` i32: the visits that count (a weight gradient's schedule).
    pub visit_count: Tensor,
}

/// Routes the router's expert ids `ids[tokens, k]` (i32, each below
/// `experts`) on the device: positions and the grouped matmul's schedule
/// for tiles of `bm` rows. Recorded, not run: it joins the step's program.
#[cfg(feature = "graph")]
pub fn route(ids: &Tensor, experts: usize, bm: usize) -> Result<Routing, RuntimeError> {
    let rt = ids.runtime();
    let n = ids.shape().iter().product::<usize>();
    let e = experts;
    let err = |e: EntryError| crate::recording::build_error("moe_positions", e);
    if e == 0 || n == 0 {
        return Err(err(EntryError::Shape(format!(
            "routing {n} slots over {e} experts; give at least one of each"
        ))));
    }
    // Each expert's slot count, then their running sum, in f32 (exact).
    let id = ids.reshape(&[n])?.cast(DType::F32)?;
    let expert = rt.iota(&[n, e], 1, DType::F32)?;
    let hit = id.broadcast_in_dim(&[n, e], &[0])?.eq(&expert)?;
    let scalar = |x: f64| rt.scalar(x, DType::F32).broadcast_to(&[n, e]);
    let counts = hit.select(&scalar(1.0)?, &scalar(0.0)?)?.sum(&[0])?;
    let before = triangle(rt, e, e + 1)?;
    let offsets = counts
        .reshape(&[1, e])?
        .matmul(&before)?
        .reshape(&[e + 1])?;
    let starts = offsets
        .slice(&[0], &[e])?
        .reshape(&[e, 1])?
        .cast(DType::I32)?;
    let kernel = moe_positions::build(128.min(n), moe_positions::Dims { n, e })
        .map_err(|x| err(x.into()))?;
    let pos = rt
        .call(&kernel, &[&ids.reshape(&[1, n])?, &starts])?
        .remove(0)
        .reshape(&[n])?;
    Ok(Routing {
        pos,
        schedule: schedule(&offsets.cast(DType::I32)?, n, bm, false)?,
    })
}

/// The visit schedule of `offsets` (`[e + 1]` i32, rising from 0 to `m`)
/// for tiles of `bm` rows, as [`crate::moe::group_metadata`] makes it or,
/// with `every_group`, [`crate::tgmm::tgmm_metadata`].
#[cfg(feature = "graph")]
pub fn schedule(
    offsets: &Tensor,
    m: usize,
    bm: usize,
    every_group: bool,
) -> Result<Schedule, RuntimeError> {
    let rt = offsets.runtime();
    let e = offsets.shape()[0].saturating_sub(1).max(1);
    let bm = bm.max(1);
    let v = visits(m, bm, e);
    let last_tile = (m.div_ceil(bm).max(1) - 1) as f64;
    let off = offsets.cast(DType::F32)?;
    let (start, end) = (off.slice(&[0], &[e])?, off.slice(&[1], &[e + 1])?);
    // Tile bounds by f32 floors half a row inside each bound, so a
    // division rounded either way lands on the same tile.
    let first_tile = start.add_scalar(0.5)?.scale(1.0 / bm as f64)?.floor()?;
    let end_tile = end
        .add_scalar(bm as f64 - 0.5)?
        .scale(1.0 / bm as f64)?
        .floor()?;
    let filled = end.gt(&start)?;
    let scalar = |x: f64, shape: &[usize]| rt.scalar(x, DType::F32).broadcast_to(shape);
    let tiles = end_tile.sub(&first_tile)?;
    let (count, lo) = if every_group {
        // An empty group is visited once, at the tile where it would start.
        let clamped = first_tile.minimum(&scalar(last_tile, &[e])?)?;
        (
            filled.select(&tiles, &scalar(1.0, &[e])?)?,
            filled.select(&first_tile, &clamped)?,
        )
    } else {
        (filled.select(&tiles, &scalar(0.0, &[e])?)?, first_tile)
    };
    let first = count
        .reshape(&[1, e])?
        .matmul(&triangle(rt, e, e)?)?
        .reshape(&[e])?;
    let total = count.sum(&[0])?;
    // Visits past the last repeat it.
    let last = total
        .add_scalar(-1.0)?
        .maximum(&rt.scalar(0.0, DType::F32))?;
    let visit = rt
        .iota(&[v], 0, DType::F32)?
        .minimum(&last.broadcast_to(&[v])?)?;
    let grid = |t: &Tensor| t.broadcast_in_dim(&[e, v], &[0]);
    let (count_g, first_g, lo_g) = (grid(&count)?, grid(&first)?, grid(&lo)?);
    let visit_g = visit.broadcast_in_dim(&[e, v], &[1])?;
    let group_g = rt.iota(&[e, v], 0, DType::F32)?;
    let zero = scalar(0.0, &[e, v])?;
    let one = scalar(1.0, &[e, v])?;
    // Group g holds visit v when it has visits and its first is ≤ v; the
    // visit's group is the last such.
    let holds = count_g
        .gt(&zero)?
        .select(&first_g.le(&visit_g)?.select(&one, &zero)?, &zero)?;
    let group = holds.mul(&group_g)?.max(&[0])?;
    let mine = group_g
        .eq(&group.broadcast_in_dim(&[e, v], &[1])?)?
        .select(&holds, &zero)?;
    let tile = mine.mul(&lo_g.add(&visit_g)?.sub(&first_g)?)?.sum(&[0])?;
    Ok(Schedule {
        offsets: offsets.clone(),
        group_ids: group.cast(DType::I32)?,
        m_tile_ids: tile.cast(DType::I32)?,
        visit_count: total.reshape(&[1])?.cast(DType::I32)?,
    })
}

/// `[rows, cols]` f32 with ones where `row < col`: a row vector times it
/// is the exclusive running sum. Made of iotas, so the program holds no
/// host data (it exports as it records).
#[cfg(feature = "graph")]
fn triangle(rt: &graph::Runtime, rows: usize, cols: usize) -> Result<Tensor, RuntimeError> {
    let shape = [rows, cols];
    let one = |x: f64| rt.scalar(x, DType::F32).broadcast_to(&shape);
    rt.iota(&shape, 0, DType::F32)?
        .lt(&rt.iota(&shape, 1, DType::F32)?)?
        .select(&one(1.0)?, &one(0.0)?)
}

/// The ids must name experts (`0..e`) and `starts` must be their
/// offsets: a slot of another expert would take another's position.
fn check(_: &crate::Config, k: &VerifiedKernel, a: &[Array]) -> Result<(), EntryError> {
    let (Some(ids), Some(starts)) = (arg(k, a, "ids"), arg(k, a, "starts")) else {
        return Ok(());
    };
    let e = starts.data().len();
    let ids: Vec<usize> = ids
        .data()
        .iter()
        .map(|&v| {
            if v < 0.0 || v >= e as f64 {
                Err(EntryError::Input(format!(
                    "expert id {v} is outside 0..{e}; ids must name one of the {e} experts"
                )))
            } else {
                Ok(v as usize)
            }
        })
        .collect::<Result<_, _>>()?;
    let want = offsets_reference(&ids, e);
    if starts
        .data()
        .iter()
        .zip(&want)
        .any(|(a, &b)| *a != b as f64)
    {
        return Err(EntryError::Input(format!(
            "starts are {:?}, but the ids' group offsets start {:?}; give each expert's first row (kernels::routing::offsets_reference)",
            starts.data(),
            &want[..e]
        )));
    }
    Ok(())
}

/// [`moe_positions`](mod@moe_positions) in the library.
pub const MOE_POSITIONS: Entry = Entry {
    name: "moe_positions",
    fixed_inputs: None,
    backward: None,
    about: "MoE routing: each slot's position in expert order (a stable sort by expert id, counted, not sorted), the pos the permutes take",
    params: &[param("bn", ParamKind::Positive, "128", "slots per block")],
    inputs: |_| Ok(vec![("ids", vec![1, 512]), ("starts", vec![8, 1])]),
    build: |c, s| {
        let [one, n] = dims(&s[0], "ids")?;
        let [e, one_s] = dims(&s[1], "starts")?;
        if one != 1 || one_s != 1 {
            return Err(EntryError::Shape(format!(
                "ids {:?} and starts {:?}: give ids as [1, slots] and starts as [experts, 1]",
                s[0], s[1]
            )));
        }
        Ok(moe_positions::build(
            c.usize("bn")?.min(n),
            moe_positions::Dims { n, e },
        )?)
    },
    reference: |_, a| {
        let pos = positions_reference(&a[0], a[1].data().len());
        Ok(vec![pos.into_iter().map(|p| p as f64).collect()])
    },
    check,
    tolerance: |_, _| vec![Tolerance { abs: 0.0, rel: 0.0 }],
    sample: |_, k, seed| {
        let (n, e) = (
            k.arguments().next().map_or(1, |a| a.shape[1]),
            k.arguments().nth(1).map_or(1, |a| a.shape[0]),
        );
        let mut rng = kernel_ir::SplitMix64(seed);
        // Every other expert left empty, the rest uneven.
        let ids: Vec<usize> = (0..n).map(|_| rng.below(e) / 2 * 2).collect();
        let off = offsets_reference(&ids, e);
        let as_f = |v: &[usize]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        vec![
            Array::new(DType::I32, [1, n], as_f(&ids))
                .unwrap_or_else(|_| Array::zeros(DType::I32, [1, n])),
            Array::new(DType::I32, [e, 1], as_f(&off[..e]))
                .unwrap_or_else(|_| Array::zeros(DType::I32, [e, 1])),
        ]
    },
    presets: &[Preset {
        name: "moe_positions_64_experts",
        about: "4096 slots (2048 tokens, top 2) over 64 experts",
        config: &[("bn", "512")],
        shapes: &[("ids", &[1, 4096]), ("starts", &[64, 1])],
    }],
};
