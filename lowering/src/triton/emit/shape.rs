//! Tensor shapes in Triton's terms: reshapes, broadcasts, slices and
//! the layout a dot wants; and the region queries (free values, pure
//! producers) the loop rewrites use.

use super::*;

/// Values `r` reads that are defined outside it.
pub(super) fn free_values(
    r: &Region,
    bound: &mut HashSet<ValueId>,
    free: &mut std::collections::BTreeSet<ValueId>,
) {
    bound.extend(r.args.iter().copied());
    for op in &r.ops {
        for v in op.kind.operands() {
            if !bound.contains(&v) {
                free.insert(v);
            }
        }
        for sub in op.kind.regions() {
            free_values(sub, bound, free);
        }
        bound.extend(op.results.iter().copied());
    }
    for y in &r.yields {
        if !bound.contains(y) {
            free.insert(*y);
        }
    }
}

pub(super) fn walk_region<'a>(r: &'a Region, f: &mut impl FnMut(&'a Op)) {
    for op in &r.ops {
        f(op);
        for sub in op.kind.regions() {
            walk_region(sub, f);
        }
    }
}

/// The op that defines `v` directly in `region`.
pub(super) fn find_def(region: &Region, v: ValueId) -> Option<&Op> {
    region.ops.iter().find(|op| op.results.contains(&v))
}

/// The accumulator of a fused dot, shaped as the dot's `[b?, m, n]`.
pub(super) fn reshape_for_dot(
    acc: &str,
    shape: &[usize],
    e: &Emitter<'_>,
    dot: &Op,
) -> Result<String, LoweringError> {
    let OpKind::Dot { lhs, rhs, dims, .. } = &dot.kind else {
        return Err(LoweringError::Internal("a fused dot that is no dot".into()));
    };
    let (b, m, _, n) = e.dot_sizes(*lhs, *rhs, dims);
    let flat = if dims.lhs_batch.is_empty() {
        vec![m, n]
    } else {
        vec![b, m, n]
    };
    Ok(reshape(acc, shape, &flat, DType::F32))
}

/// `x` (of `shape`) permuted to `order` and reshaped to `to`.
pub(super) fn arrange(
    x: &str,
    shape: &[usize],
    order: &[usize],
    to: &[usize],
    dtype: DType,
) -> String {
    let identity = order.iter().enumerate().all(|(i, &o)| i == o);
    let (mut code, permuted): (String, Vec<usize>) = if identity {
        (x.to_string(), shape.to_vec())
    } else if order.len() == 2 {
        (format!("tl.trans({x})"), vec![shape[1], shape[0]])
    } else {
        (
            format!("tl.permute({x}, {})", shape_list(order)),
            order.iter().map(|&o| shape[o]).collect(),
        )
    };
    if permuted != to {
        code = reshape(&code, &permuted, to, dtype);
    }
    code
}

/// Row-major reshape of `x` from `from` to `to`: unit dims inserted by
/// indexing (`x[:, None]`), which costs nothing, a real reshape only when
/// the other dims change.
pub(super) fn reshape(x: &str, from: &[usize], to: &[usize], dtype: DType) -> String {
    if from == to {
        return x.to_string();
    }
    let core: Vec<usize> = from.iter().copied().filter(|&d| d != 1).collect();
    let to_core: Vec<usize> = to.iter().copied().filter(|&d| d != 1).collect();
    if core != to_core {
        return format!("tl.reshape({x}, {})", shape_list(to));
    }
    if core.is_empty() {
        // A single element: a scalar, or units of any rank.
        let scalar = if from.is_empty() {
            x.to_string()
        } else {
            format!("tl.reshape({x}, [])")
        };
        return if to.is_empty() {
            scalar
        } else {
            format!("tl.broadcast_to({scalar}, {})", shape_list(to))
        };
    }
    // Unit dims go by a max over each (one element: no combine, and the
    // result has the layout a reduction gives, which `x[:, None]` expands
    // for free; `tl.reshape` would make a layout that needs converting).
    // Triton's max widens bf16 and f16 to f32: those keep `tl.reshape`.
    let mut squeezed = x.to_string();
    if narrow(dtype) {
        if core.len() != from.len() {
            squeezed = format!("tl.reshape({x}, {})", shape_list(&core));
        }
    } else {
        for (a, _) in from.iter().enumerate().rev().filter(|(_, d)| **d == 1) {
            squeezed = format!("tl.max({squeezed}, axis={a})");
        }
    }
    if to.len() == core.len() {
        return squeezed;
    }
    let idx: Vec<&str> = to
        .iter()
        .map(|&d| if d == 1 { "None" } else { ":" })
        .collect();
    format!("({squeezed})[{}]", idx.join(", "))
}

/// A buffer's shape without its unit dims: the shape of its register
/// variable.
pub(super) fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// StableHLO's `broadcast_in_dim` of `x`.
pub(super) fn broadcast(x: &str, from: &[usize], to: &[usize], dims: &[usize]) -> String {
    if from.is_empty() {
        return format!("tl.broadcast_to({x}, {})", shape_list(to));
    }
    let mut idx = vec!["None"; to.len()];
    for &d in dims {
        idx[d] = ":";
    }
    let expanded = if from.len() == to.len() {
        x.to_string()
    } else {
        format!("({x})[{}]", idx.join(", "))
    };
    let shape: Vec<usize> = (0..to.len())
        .map(|d| match dims.iter().position(|&x| x == d) {
            Some(i) => from[i],
            None => 1,
        })
        .collect();
    if shape == to {
        expanded
    } else {
        format!("tl.broadcast_to({expanded}, {})", shape_list(to))
    }
}

/// A static slice of the register variable `x` of a buffer of `shape`
/// (held squeezed, [`squeezed`]): gathers along each narrowed dim, then
/// reshapes to the load's shape. `None` for dynamic indices.
pub(super) fn slice(x: &str, shape: &[usize], indices: &[Index], dtype: DType) -> Option<String> {
    let mut cur = x.to_string();
    let mut cur_shape = squeezed(shape);
    let mut keep = Vec::new();
    let mut axis = 0;
    for (d, idx) in indices.iter().enumerate() {
        let (start, len, point) = match idx {
            Index::Slice {
                start: IndexValue::Static(s),
                len,
            } => (*s, *len, false),
            Index::Point(IndexValue::Static(p)) => (*p, 1, true),
            _ => return None,
        };
        if !point {
            keep.push(len);
        }
        if shape[d] == 1 {
            continue;
        }
        if start != 0 || len != shape[d] {
            cur_shape[axis] = len;
            let r = expand_to(
                &format!("({start} + tl.arange(0, {len}))"),
                axis,
                cur_shape.len(),
            );
            let idx = if cur_shape.len() > 1 {
                format!("tl.broadcast_to({r}, {})", shape_list(&cur_shape))
            } else {
                r
            };
            cur = format!("tl.gather({cur}, {idx}, {axis})");
        }
        axis += 1;
    }
    Some(reshape(&cur, &cur_shape, &keep, dtype))
}

/// An op without effects, cheap to compute again: what may move with a
/// hoisted prologue or a sunk epilogue.
pub(super) fn pure(op: &Op) -> bool {
    matches!(
        op.kind,
        OpKind::Constant { .. }
            | OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Unary { .. }
            | OpKind::Convert { .. }
            | OpKind::Bitcast { .. }
            | OpKind::Select { .. }
            | OpKind::BroadcastInDim { .. }
            | OpKind::Reshape { .. }
            | OpKind::Iota { .. }
    )
}

/// The indices, in order, of the ops among `ops` that compute the values
/// `need` reads, transitively; `None` when one has an effect or a value
/// comes from outside `ops` (the set cannot move as one).
pub(super) fn pure_producers(ops: &[Op], mut need: HashSet<ValueId>) -> Option<Vec<usize>> {
    let mut picked = Vec::new();
    for (i, op) in ops.iter().enumerate().rev() {
        if !op.results.iter().any(|r| need.contains(r)) {
            continue;
        }
        if !pure(op) {
            return None;
        }
        picked.push(i);
        need.extend(op.kind.operands());
    }
    let defined: HashSet<ValueId> = picked
        .iter()
        .flat_map(|&i| ops[i].results.iter().copied())
        .collect();
    if need.iter().any(|v| !defined.contains(v)) {
        return None;
    }
    picked.reverse();
    Some(picked)
}
