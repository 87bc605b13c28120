//! The TPU tiling rules for VMEM blocks.
//!
//! A vreg holds (8 × packing, 128) elements. A block's physically minor dim
//! must be a multiple of 128 lanes or the full array dim; the second-minor a
//! multiple of the dtype's tile rows or the full dim. Rank-1 blocks: the full
//! array, a multiple of 1024, or a power of two ≥ 128 × packing. The rules
//! apply to the *physical* order the layout hint gives.

use crate::error::{ErrorKind, KernelError};
use crate::{Kernel, MemorySpace, Operand};

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    k.operands
        .iter()
        .filter(|o| o.space == MemorySpace::Vmem)
        .filter_map(|o| check_operand(k, o).map(|kind| KernelError::new(kind, o.loc.clone())))
        .collect()
}

/// What would fit instead of `block`: the neighbouring multiples of `unit`
/// that are at most `array`, and the full dim.
fn suggest(block: usize, unit: usize, array: usize) -> String {
    let mut c: Vec<usize> = Vec::new();
    let down = block / unit * unit;
    if down > 0 {
        c.push(down);
    }
    let up = block.div_ceil(unit) * unit;
    if up <= array && !c.contains(&up) {
        c.push(up);
    }
    if !c.contains(&array) {
        c.push(array);
    }
    let c: Vec<String> = c.iter().map(usize::to_string).collect();
    format!("use {}", c.join(" or "))
}

fn check_operand(k: &Kernel, o: &Operand) -> Option<ErrorKind> {
    let rank = o.shape.len();
    let order = o.layout.minor_to_major_dims(rank)?;
    let t = k.target;
    let rows = t.tile_rows(o.dtype);
    let lanes = t.tile_lanes();
    let block = &o.block.shape;
    let err = |dim: usize, which: &'static str, rule: String, suggest: String| {
        Some(ErrorKind::Tiling {
            operand: o.name.clone(),
            dtype: o.dtype,
            layout: o.layout.to_string(),
            dim,
            which,
            block: block[dim],
            array: o.shape[dim],
            rule,
            suggest,
        })
    };
    match rank {
        0 => None,
        1 => {
            let (b, a) = (block[0], o.shape[0]);
            let min_pow2 = lanes * o.dtype.packing();
            if b == a || b % 1024 == 0 || (b.is_power_of_two() && b >= min_pow2) {
                return None;
            }
            let mut fix = suggest(b, 1024.min(a.next_power_of_two()).max(min_pow2), a);
            if b < min_pow2 {
                // A short rank-1 block is usually one value per row of a
                // 2-D block (a row max, a norm's statistic).
                fix.push_str(&format!(
                    "; for one value per row of 2-D blocks, declare it [{a}, 1] with block [{b}, 1] (a column: full lane dim 1)"
                ));
            }
            err(
                0,
                "only",
                format!("a multiple of 1024, or a power of two ≥ {min_pow2}"),
                fix,
            )
        }
        _ => {
            let minor = order[0];
            let (b, a) = (block[minor], o.shape[minor]);
            if b != a && b % lanes != 0 {
                return err(
                    minor,
                    "minor (lane)",
                    format!("a multiple of {lanes} lanes"),
                    suggest(b, lanes, a),
                );
            }
            let second = order[1];
            let (b, a) = (block[second], o.shape[second]);
            if b != a && b % rows != 0 {
                let mut fix = suggest(b, rows, a);
                if b == 1 {
                    // One row per step: a unit dim before the minor one makes
                    // the sublane dim whole (Pallas's squeezed block dims).
                    fix.push_str(&format!(
                        "; for one row per grid step, give the array a unit dim before its minor one ([.., {a}, 1, {}] with block [.., 1, 1, {}]), so the sublane dim is whole",
                        o.shape[minor], block[minor]
                    ));
                }
                return err(
                    second,
                    "second-minor (sublane)",
                    format!(
                        "a multiple of {rows} rows ({} tiles are ({rows}, {lanes}))",
                        o.dtype
                    ),
                    fix,
                );
            }
            None
        }
    }
}
