//! Index maps evaluated over the grid: every block in bounds, every block
//! start aligned.
//!
//! Index maps that read scalar prefetch are only known at run time; the
//! interpreter checks those. Grids of more than [`MAX_POINTS`] steps are
//! checked at their corners only (index maps are monotone in practice).

use crate::error::{ErrorKind, KernelError};
use crate::{Kernel, MemorySpace, Operand};

/// Grids up to this many steps are checked at every step.
pub const MAX_POINTS: usize = 1 << 16;

/// The grid points to check: all of them, or the corners of a large grid.
fn points(grid: &crate::Grid) -> Vec<Vec<i64>> {
    let bounds = grid.bounds();
    if grid.steps() <= MAX_POINTS {
        grid.points().collect()
    } else {
        (0..1usize << bounds.len())
            .map(|mask| {
                bounds
                    .iter()
                    .enumerate()
                    .map(|(d, &b)| if mask >> d & 1 == 1 { b as i64 - 1 } else { 0 })
                    .collect()
            })
            .collect()
    }
}

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let pts = points(&k.grid);
    k.operands
        .iter()
        .filter(|o| o.space != MemorySpace::Any && !o.block.index_map.uses_prefetch())
        .filter_map(|o| {
            let tpu = (k.platform == crate::Platform::Tpu).then_some(k.target);
            check_operand(o, &pts, tpu).map(|kind| KernelError::new(kind, o.loc.clone()))
        })
        .collect()
}

/// The part of operand `o`'s padded array (an element window's) that a
/// run touches, per dim `[lo, hi)` in padded coordinates: every window the
/// index map places at every grid point, and the array itself, which is
/// copied in whole. `None` (the whole padding) for an operand without an
/// element window, in `any` space, whose map reads scalar prefetch (its
/// windows are known only at run time), or on a grid of more than
/// [`MAX_POINTS`] steps (checked at its corners only: a reach from them
/// would rest on the maps being monotone).
pub(crate) fn element_reach(grid: &crate::Grid, o: &Operand) -> Option<Vec<(usize, usize)>> {
    let pad = o.block.element.as_ref()?;
    if o.space == MemorySpace::Any || o.block.index_map.uses_prefetch() || grid.steps() > MAX_POINTS
    {
        return None;
    }
    let mut reach: Vec<(usize, usize)> = (0..o.shape.len())
        .map(|d| {
            let low = pad.low.get(d).copied().unwrap_or(0);
            (low, low + o.shape[d])
        })
        .collect();
    for g in points(grid) {
        for (d, e) in o.block.index_map.exprs.iter().enumerate() {
            let v = usize::try_from(e.eval_static(&g).ok()?).ok()?;
            let s = *o.block.shape.get(d)?;
            let r = reach.get_mut(d)?;
            r.0 = r.0.min(v);
            r.1 = r.1.max(v.checked_add(s)?);
        }
    }
    Some(reach)
}

/// libtpu places element windows at whole tiles: along the two physically
/// minor dims each window's offset (and so the low padding) must be a
/// multiple of the dtype's tile rows and of 128 lanes ("Couldn't prove
/// that tiling divides index returned by transform_indices").
fn tile_aligned(o: &Operand, g: &[i64], index: &[i64], target: crate::Target) -> Option<ErrorKind> {
    let pad = o.block.element.as_ref()?;
    let order = o.layout.minor_to_major_dims(o.shape.len())?;
    let units = [
        (target.tile_lanes(), "lanes", "minor (lane)"),
        (target.tile_rows(o.dtype), "rows", "second-minor (sublane)"),
    ];
    for (&dim, (unit, what, which)) in order.iter().zip(units) {
        let (v, low) = (index[dim], pad.low[dim] as i64);
        if v % unit as i64 != 0 || low % unit as i64 != 0 {
            return Some(ErrorKind::ElementWindow {
                operand: o.name.clone(),
                detail: format!(
                    "at grid index ({}) the window starts at element {v} of dim {dim} (low padding \
                     {low}), the {which} dim of this {} operand: the TPU places element windows at \
                     whole tiles, so offsets and low padding along it must be multiples of {unit} \
                     {what}",
                    g.iter().map(i64::to_string).collect::<Vec<_>>().join(", "),
                    o.dtype
                ),
            });
        }
    }
    None
}

/// `target`: the TPU whose tiling element windows must keep (`None` off
/// the TPU).
fn check_operand(
    o: &Operand,
    pts: &[Vec<i64>],
    target: Option<crate::Target>,
) -> Option<ErrorKind> {
    let strides = o.layout.strides(&o.shape)?;
    let bytes = o.dtype.bytes() as u64;
    for g in pts {
        let mut bidx = Vec::with_capacity(o.shape.len());
        for e in &o.block.index_map.exprs {
            match e.eval_static(g) {
                Ok(v) => bidx.push(v),
                Err(e) => {
                    return Some(ErrorKind::IndexMapEval {
                        operand: o.name.clone(),
                        grid: g.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        let tiles = || target.and_then(|t| tile_aligned(o, g, &bidx, t));
        if let Some(kind) = block_in_bounds(o, g, &bidx).or_else(tiles) {
            return Some(kind);
        }
        if let Some(align) = o.layout.align {
            let start = o.block.window_start(&bidx);
            let parts: Vec<u64> = (0..o.shape.len())
                .map(|d| start[d].max(0) as u64 * strides[d] as u64 * bytes)
                .collect();
            let offset: u64 = parts.iter().sum();
            if !offset.is_multiple_of(align) {
                let dim = parts
                    .iter()
                    .position(|p| !p.is_multiple_of(align))
                    .unwrap_or(0);
                let unit = strides[dim] as u64 * bytes;
                return Some(ErrorKind::Misaligned {
                    operand: o.name.clone(),
                    align,
                    grid: g.clone(),
                    block_index: bidx,
                    offset,
                    dim,
                    step_bytes: o.block.shape[dim] as u64 * unit,
                    elements: align / gcd(align, unit),
                });
            }
        }
    }
    None
}

/// Checks block indices against the array: block `b` along a dim of size
/// `n` with block size `s` is valid for `0 <= b < ceil(n / s)` (the last
/// block may be partial).
pub(crate) fn block_in_bounds(o: &Operand, grid: &[i64], bidx: &[i64]) -> Option<ErrorKind> {
    if let Some(pad) = &o.block.element {
        return window_in_bounds(o, pad, grid, bidx);
    }
    for (dim, ((&b, &s), &n)) in bidx.iter().zip(&o.block.shape).zip(&o.shape).enumerate() {
        let blocks = n.div_ceil(s);
        if b < 0 || b as u64 >= blocks as u64 {
            return Some(ErrorKind::BlockOutOfBounds {
                operand: o.name.clone(),
                grid: grid.to_vec(),
                block_index: bidx.to_vec(),
                dim,
                blocks,
                block_size: s,
                array: n,
            });
        }
    }
    None
}

/// Element windows lie inside the padded array: `0 <= v` and `v + s <=
/// low + n + high` along every dim.
fn window_in_bounds(
    o: &Operand,
    pad: &crate::ElementPad,
    grid: &[i64],
    index: &[i64],
) -> Option<ErrorKind> {
    for (dim, ((&v, &s), &n)) in index.iter().zip(&o.block.shape).zip(&o.shape).enumerate() {
        let (low, high) = (
            pad.low.get(dim).copied().unwrap_or(0),
            pad.high.get(dim).copied().unwrap_or(0),
        );
        let padded = low + n + high;
        let end = v.saturating_add(s as i64);
        if v < 0 || end > padded as i64 {
            return Some(ErrorKind::WindowOutOfBounds {
                operand: o.name.clone(),
                grid: grid.to_vec(),
                index: index.to_vec(),
                dim,
                start: v,
                end,
                low,
                array: n,
                high,
                padded,
            });
        }
    }
    None
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}
