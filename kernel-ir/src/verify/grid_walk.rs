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
        .filter_map(|o| check_operand(o, &pts).map(|kind| KernelError::new(kind, o.loc.clone())))
        .collect()
}

fn check_operand(o: &Operand, pts: &[Vec<i64>]) -> Option<ErrorKind> {
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
        if let Some(kind) = block_in_bounds(o, g, &bidx) {
            return Some(kind);
        }
        if let Some(align) = o.layout.align {
            let parts: Vec<u64> = (0..o.shape.len())
                .map(|d| bidx[d] as u64 * o.block.shape[d] as u64 * strides[d] as u64 * bytes)
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

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}
