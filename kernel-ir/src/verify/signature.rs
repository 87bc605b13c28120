//! Checks of the kernel signature.

use std::collections::HashSet;

use crate::error::{ErrorKind, KernelError};
use crate::{IndexExpr, Kernel, MemorySpace, Order};

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The grid and mesh against [`crate::limits`]: checked before anything
/// walks them (the grid walk visits 2^rank corners, the interpreter every
/// step).
fn limits(k: &Kernel) -> Vec<KernelError> {
    use crate::limits::{MAX_GRID_RANK, MAX_GRID_STEPS, MAX_MESH_DEVICES};
    let mut errors = Vec::new();
    let rank = k.grid.rank();
    if rank > MAX_GRID_RANK {
        errors.push(KernelError::new(
            ErrorKind::Limit {
                what: "the grid's rank".into(),
                value: rank.to_string(),
                limit: MAX_GRID_RANK as u64,
                name: "MAX_GRID_RANK",
                fix: "fold dims together (index maps can divide a grid index)".into(),
            },
            k.grid_loc.clone(),
        ));
        return errors;
    }
    let steps = k
        .grid
        .dims
        .iter()
        .try_fold(1u64, |a, d| a.checked_mul(d.bound as u64));
    if steps.is_none_or(|n| n > MAX_GRID_STEPS) {
        errors.push(KernelError::new(
            ErrorKind::Limit {
                what: format!("the number of grid steps ({:?})", k.grid.bounds()),
                value: steps.map_or("2^64 or more".into(), |n| n.to_string()),
                limit: MAX_GRID_STEPS,
                name: "MAX_GRID_STEPS",
                fix: "use larger blocks, or loop inside a step with `for`".into(),
            },
            k.grid_loc.clone(),
        ));
    }
    if let Some(m) = &k.mesh {
        let devices = m
            .axes
            .iter()
            .try_fold(1u64, |a, (_, n)| a.checked_mul(*n as u64));
        if devices.is_none_or(|n| n > MAX_MESH_DEVICES) {
            errors.push(KernelError::new(
                ErrorKind::Limit {
                    what: "the mesh's device count".into(),
                    value: devices.map_or("2^64 or more".into(), |n| n.to_string()),
                    limit: MAX_MESH_DEVICES,
                    name: "MAX_MESH_DEVICES",
                    fix: "give a smaller mesh".into(),
                },
                m.loc.clone(),
            ));
        }
    }
    errors
}

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let limit_errors = limits(k);
    if !limit_errors.is_empty() {
        return limit_errors;
    }
    let mut errors = Vec::new();
    let mut err = |kind, loc: &Option<crate::Loc>| errors.push(KernelError::new(kind, loc.clone()));
    if !is_identifier(&k.name) {
        err(
            ErrorKind::BadName {
                name: k.name.clone(),
            },
            &k.loc,
        );
    }
    if let Some(limit) = k.vmem_limit
        && limit > k.target.vmem_bytes()
    {
        err(
            ErrorKind::VmemLimitTooLarge {
                limit,
                target: k.target,
                physical: k.target.vmem_bytes(),
            },
            &k.loc,
        );
    }
    if k.grid.dims.iter().any(|d| d.bound == 0) {
        err(
            ErrorKind::ZeroSize {
                what: "the grid".into(),
                shape: k.grid.bounds(),
            },
            &k.grid_loc,
        );
    }

    let mut names = HashSet::new();
    let decls = k
        .prefetch
        .iter()
        .map(|p| (&p.name, &p.loc))
        .chain(k.operands.iter().map(|o| (&o.name, &o.loc)))
        .chain(k.scratch.iter().map(|s| (&s.name, &s.loc)))
        .chain(k.semaphores.iter().map(|s| (&s.name, &s.loc)));
    for (name, loc) in decls {
        if !is_identifier(name) {
            err(ErrorKind::BadName { name: name.clone() }, loc);
        } else if !names.insert(name.clone()) {
            err(ErrorKind::DuplicateName { name: name.clone() }, loc);
        }
    }

    for p in &k.prefetch {
        if p.dtype != crate::DType::I32 {
            err(
                ErrorKind::PrefetchDType {
                    name: p.name.clone(),
                    dtype: p.dtype,
                },
                &p.loc,
            );
        }
        if let Some(kind) = too_large(format!("scalar prefetch `{}`", p.name), &p.shape) {
            err(kind, &p.loc);
        }
        if p.shape.contains(&0) {
            err(
                ErrorKind::ZeroSize {
                    what: format!("scalar prefetch `{}`", p.name),
                    shape: p.shape.clone(),
                },
                &p.loc,
            );
        }
    }
    for s in &k.scratch {
        if let Some(kind) = too_large(format!("scratch `{}`", s.name), &s.shape) {
            err(kind, &s.loc);
        }
        if s.shape.contains(&0) {
            err(
                ErrorKind::ZeroSize {
                    what: format!("scratch `{}`", s.name),
                    shape: s.shape.clone(),
                },
                &s.loc,
            );
        }
        if s.space == MemorySpace::Any {
            err(
                ErrorKind::ScratchSpace {
                    name: s.name.clone(),
                },
                &s.loc,
            );
        }
    }

    for s in &k.semaphores {
        if s.shape.contains(&0) {
            err(
                ErrorKind::ZeroSize {
                    what: format!("semaphores `{}`", s.name),
                    shape: s.shape.clone(),
                },
                &s.loc,
            );
        }
        if let Some(kind) = too_large(format!("semaphores `{}`", s.name), &s.shape) {
            err(kind, &s.loc);
        }
    }

    // The mesh and the barrier: a kernel across chips names its devices,
    // and the chip has one barrier semaphore.
    if let Some(mesh) = &k.mesh {
        let mut seen = Vec::new();
        for (name, size) in &mesh.axes {
            let problem = if *size == 0 {
                Some(format!(
                    "mesh axis `{name}` has size 0; every axis has at least one device"
                ))
            } else if seen.contains(&name) {
                Some(format!(
                    "mesh axis `{name}` is named twice; give each axis its own name"
                ))
            } else {
                None
            };
            if let Some(detail) = problem {
                err(ErrorKind::Mesh(detail), &mesh.loc);
            }
            seen.push(name);
        }
        if mesh.axes.is_empty() {
            err(
                ErrorKind::Mesh("the mesh has no axes; name at least one (`x 4`)".into()),
                &mesh.loc,
            );
        }
    }
    let barriers: Vec<_> = k
        .semaphores
        .iter()
        .filter(|s| s.kind == crate::SemaphoreKind::Barrier)
        .collect();
    for (i, s) in barriers.iter().enumerate() {
        let problem = if k.mesh.is_none() {
            Some("the barrier semaphore meets other devices; declare the kernel's mesh".to_string())
        } else if !s.shape.is_empty() {
            Some(format!(
                "the barrier semaphore `{}` has shape {:?}; the chip has one, of shape []",
                s.name, s.shape
            ))
        } else if s.scoped {
            Some("the barrier semaphore is the chip's, not allocated by a scope".into())
        } else if i > 0 {
            Some("a kernel has one barrier semaphore; declare it once".into())
        } else {
            None
        };
        if let Some(detail) = problem {
            err(ErrorKind::Mesh(detail), &s.loc);
        }
    }

    for o in &k.operands {
        let name = || o.name.clone();
        let rank = o.shape.len();
        if o.shape.contains(&0) {
            err(
                ErrorKind::ZeroSize {
                    what: format!("operand `{}`", o.name),
                    shape: o.shape.clone(),
                },
                &o.loc,
            );
            continue;
        }
        if let Some(kind) = too_large(format!("operand `{}`", o.name), &o.shape) {
            err(kind, &o.loc);
            continue;
        }
        if let Order::MinorToMajor(order) = &o.layout.order
            && o.layout.minor_to_major_dims(rank).is_none()
        {
            err(
                ErrorKind::BadLayout {
                    operand: name(),
                    order: order.clone(),
                    rank,
                },
                &o.loc,
            );
        }
        if let Some(a) = o.layout.align
            && !a.is_power_of_two()
        {
            err(
                ErrorKind::BadAlign {
                    operand: name(),
                    align: a,
                },
                &o.loc,
            );
        }
        if o.space == MemorySpace::Any {
            let full = o.block.shape == o.shape
                && o.block
                    .index_map
                    .exprs
                    .iter()
                    .all(|e| *e == IndexExpr::Const(0));
            if !full {
                err(ErrorKind::AnyWithBlock { operand: name() }, &o.loc);
            }
            continue;
        }
        let block = &o.block.shape;
        if block.len() != rank {
            err(
                ErrorKind::BlockRank {
                    operand: name(),
                    block: block.clone(),
                    block_rank: block.len(),
                    array_rank: rank,
                },
                &o.loc,
            );
            continue;
        }
        if block.contains(&0) {
            err(
                ErrorKind::ZeroSize {
                    what: format!("the block of `{}`", o.name),
                    shape: block.clone(),
                },
                &o.loc,
            );
        }
        if let Some(pad) = &o.block.element {
            let detail = if o.role != crate::Role::In {
                Some(format!(
                    "element windows are for inputs ({} is {}): windows may overlap, and two steps \
                     writing one element would race; write an output in whole blocks",
                    o.name, o.role
                ))
            } else if pad.low.len() != rank || pad.high.len() != rank {
                Some(format!(
                    "the padding has {} low and {} high entries for a rank-{rank} array; give one \
                     of each per dim (0 where none)",
                    pad.low.len(),
                    pad.high.len()
                ))
            } else {
                None
            };
            if let Some(detail) = detail {
                err(
                    ErrorKind::ElementWindow {
                        operand: name(),
                        detail,
                    },
                    &o.loc,
                );
                continue;
            }
        }
        let padded = |dim: usize, a: usize| match &o.block.element {
            Some(pad) => a + pad.low[dim] + pad.high[dim],
            None => a,
        };
        for (dim, (&b, &a)) in block.iter().zip(&o.shape).enumerate() {
            let a = padded(dim, a);
            if b > a {
                err(
                    ErrorKind::BlockTooLarge {
                        operand: name(),
                        dim,
                        block: b,
                        array: a,
                    },
                    &o.loc,
                );
            }
        }
        let exprs = &o.block.index_map.exprs;
        if exprs.len() != rank {
            err(
                ErrorKind::IndexMapArity {
                    operand: name(),
                    found: exprs.len(),
                    expected: rank,
                },
                &o.loc,
            );
        }
        for e in exprs {
            let mut bad = None;
            e.visit(&mut |n| match n {
                IndexExpr::Grid(d) if *d >= k.grid.rank() => {
                    bad.get_or_insert(format!(
                        "uses grid dim {d} but the grid has {} dims",
                        k.grid.rank()
                    ));
                }
                IndexExpr::Prefetch { operand, at } => match k.prefetch.get(*operand) {
                    None => {
                        bad.get_or_insert(format!(
                            "reads scalar-prefetch operand {operand}, but the kernel has {}",
                            k.prefetch.len()
                        ));
                    }
                    Some(p) if p.shape.len() != at.len() => {
                        bad.get_or_insert(format!(
                            "reads `{}` with {} indices but it has rank {}",
                            p.name,
                            at.len(),
                            p.shape.len()
                        ));
                    }
                    _ => {}
                },
                _ => {}
            });
            if let Some(detail) = bad {
                err(
                    ErrorKind::IndexMapRef {
                        operand: name(),
                        detail,
                    },
                    &o.loc,
                );
            }
        }
    }
    errors
}

/// The most elements one array may have: 2^40 (4 TiB of f32), far past any
/// device memory, so that element and byte counts never overflow.
pub const MAX_ELEMENTS: u64 = 1 << 40;

/// An error when `shape` has more than [`MAX_ELEMENTS`] elements or a dim
/// past `i32::MAX` (kernels index in i32).
fn too_large(what: String, shape: &[usize]) -> Option<ErrorKind> {
    let elements = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
    let fits = elements.is_some_and(|n| n <= MAX_ELEMENTS)
        && shape.iter().all(|&d| d <= i32::MAX as usize);
    (!fits).then(|| ErrorKind::TooLarge {
        what,
        shape: shape.to_vec(),
    })
}
