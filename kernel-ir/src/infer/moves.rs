//! Typing of the ops that only move elements along an axis: roll, slice
//! and concat.

use crate::TileType;
use crate::error::ErrorKind;

/// The size of `axis`, or an error naming the op.
fn axis_size(op: &'static str, t: &TileType, axis: usize) -> Result<usize, ErrorKind> {
    t.shape.get(axis).copied().ok_or_else(|| ErrorKind::Axis {
        op,
        detail: format!("axis {axis} of a rank-{} tile", t.shape.len()),
    })
}

pub(super) fn roll(t: TileType, shift: usize, axis: usize) -> Result<TileType, ErrorKind> {
    let n = axis_size("roll", &t, axis)?;
    if shift >= n.max(1) {
        return Err(ErrorKind::Axis {
            op: "roll",
            detail: format!("shift {shift} is not below the axis size {n}"),
        });
    }
    Ok(t)
}

pub(super) fn slice(
    t: TileType,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<TileType, ErrorKind> {
    let n = axis_size("slice", &t, axis)?;
    if len == 0 || start.checked_add(len).is_none_or(|end| end > n) {
        return Err(ErrorKind::Axis {
            op: "slice",
            detail: format!(
                "elements {start}..{} of an axis of {n}: a slice keeps 1 to {n} elements inside \
                 the axis",
                start.saturating_add(len)
            ),
        });
    }
    let mut shape = t.shape;
    shape[axis] = len;
    Ok(TileType::new(t.dtype, shape))
}

pub(super) fn concat(a: TileType, b: TileType, axis: usize) -> Result<TileType, ErrorKind> {
    axis_size("concat", &a, axis)?;
    let others = |s: &[usize]| {
        let mut s = s.to_vec();
        s.remove(axis);
        s
    };
    if a.dtype != b.dtype || a.shape.len() != b.shape.len() || others(&a.shape) != others(&b.shape)
    {
        return Err(ErrorKind::Shape {
            op: "concat",
            detail: format!(
                "{a} and {b} do not join along axis {axis}: the element types and every other \
                 dim must agree"
            ),
        });
    }
    let mut shape = a.shape;
    shape[axis] += b.shape[axis];
    Ok(TileType::new(a.dtype, shape))
}
