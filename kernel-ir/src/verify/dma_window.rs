//! `dma-window`: the views a TPU DMA moves, found by compiling copies with
//! libtpu 0.0.48 on v5e, v5p, v6e and v7x (`tests/it/targets/tpu_dma.rs`):
//!
//! * the lane (last) dim of each side is whole, or sliced in multiples of
//!   128 lanes ("The contiguous inner slice in the DMA transfer must be
//!   divisible by 512 bytes", "Slice sizes along tiled dimensions must be
//!   aligned to tiles"); a whole lane dim narrower than a tile moves only
//!   with whole rows, in runs of a multiple of 512 bytes;
//! * the sublane (second-to-last) dim of a type narrower than 32 bits is
//!   sliced in multiples of 8 rows, or in multiples of its packing (2 for
//!   bf16, 4 for i8) inside one group of 8 rows ("Offsets along tiled
//!   dimensions must be aligned to tiles"; bf16 rows 2..10 fail, 2..8 and
//!   8..16 compile; 4..12 compiles too, which this rule refuses, to stay
//!   simple); 32-bit types may start anywhere when the start is static;
//! * a dynamic start on either dim must be a provable multiple of 8 rows
//!   or 128 lanes (Mosaic accepts `i * 8` and sums of such, as read here).
//!
//! A copy to or from SMEM (scalar arrays) is not tiled and takes any
//! window on either side.

use std::collections::HashMap;

use crate::error::{ErrorKind, KernelError};
use crate::{
    BinaryOp, BufferSlice, Index, IndexValue, Kernel, Literal, MemorySpace, OpKind, ValueId,
};

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let mut defs = HashMap::new();
    k.body.walk(&mut |op| {
        for r in &op.results {
            defs.insert(*r, &op.kind);
        }
        // A loop's index is its body's first argument, defined by the loop.
        if let OpKind::For { body, .. } = &op.kind
            && let Some(index) = body.args.first()
        {
            defs.insert(*index, &op.kind);
        }
    });
    let mut errors = Vec::new();
    k.body.walk(&mut |op| {
        if let OpKind::DmaStart(c) | OpKind::DmaWait(c) = &op.kind {
            // A copy to or from SMEM moves scalars: no tiles on either side.
            if in_smem(k, &c.src) || in_smem(k, &c.dst) {
                return;
            }
            for v in [&c.src, &c.dst] {
                if let Some(kind) = window_error(k, &defs, v) {
                    errors.push(KernelError::new(kind, op.loc.clone()));
                    return;
                }
            }
        }
    });
    errors
}

/// A number `v` is known to be a multiple of (0: of every number): what
/// Mosaic can prove about a dynamic index (constants, products, sums).
fn known_multiple(defs: &HashMap<ValueId, &OpKind>, v: &IndexValue) -> i64 {
    fn of(defs: &HashMap<ValueId, &OpKind>, v: ValueId, depth: usize) -> i64 {
        if depth > 32 {
            return 1;
        }
        match defs.get(&v) {
            Some(OpKind::Constant {
                value: Literal::Int(c),
                ..
            }) => c.unsigned_abs().min(i64::MAX as u64) as i64,
            Some(OpKind::Binary {
                op: BinaryOp::Mul,
                lhs,
                rhs,
            }) => of(defs, *lhs, depth + 1).saturating_mul(of(defs, *rhs, depth + 1)),
            Some(OpKind::Binary {
                op: BinaryOp::Add | BinaryOp::Sub,
                lhs,
                rhs,
            }) => gcd(of(defs, *lhs, depth + 1), of(defs, *rhs, depth + 1)),
            _ => 1,
        }
    }
    match v {
        IndexValue::Static(s) => s.unsigned_abs().min(i64::MAX as u64) as i64,
        IndexValue::Dynamic(id) => of(defs, *id, 0),
    }
}

/// A dynamic index in the kernel body's own terms (`program_id(0) * 8 +
/// 3`, `lens[..]`, `the loop index`) rather than the IR's `%N`, which the
/// author never wrote; deep or unknown parts are `…`.
fn describe(k: &Kernel, defs: &HashMap<ValueId, &OpKind>, v: ValueId, depth: usize) -> String {
    if depth > 4 {
        return "…".into();
    }
    let inner = |x: ValueId| {
        let s = describe(k, defs, x, depth + 1);
        match defs.get(&x) {
            Some(OpKind::Binary { .. }) => format!("({s})"),
            _ => s,
        }
    };
    match defs.get(&v) {
        Some(OpKind::Constant {
            value: Literal::Int(c),
            ..
        }) => c.to_string(),
        Some(OpKind::ProgramId { dim }) => format!("program_id({dim})"),
        Some(OpKind::NumPrograms { dim }) => format!("num_programs({dim})"),
        Some(OpKind::For { .. }) => "the loop index".into(),
        Some(OpKind::Convert { x, .. }) => describe(k, defs, *x, depth),
        Some(OpKind::Load { buffer, .. }) => match k.buffer(*buffer) {
            Some((name, ..)) => format!("{name}[..]"),
            None => "a loaded value".into(),
        },
        Some(OpKind::Binary { op, lhs, rhs }) => {
            let sym = match op {
                BinaryOp::Add => "+",
                BinaryOp::Sub => "-",
                BinaryOp::Mul => "*",
                BinaryOp::Div => "/",
                BinaryOp::Rem => "%",
                _ => return format!("{}({}, {})", op.name(), inner(*lhs), inner(*rhs)),
            };
            format!("{} {sym} {}", inner(*lhs), inner(*rhs))
        }
        _ => "…".into(),
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Start and length of a dim of a view (a point is one element).
fn dim(i: &Index) -> (&IndexValue, usize) {
    match i {
        Index::Slice { start, len } => (start, *len),
        Index::Point(start) => (start, 1),
    }
}

fn in_smem(k: &Kernel, v: &BufferSlice) -> bool {
    let space = match v.buffer {
        crate::BufferRef::Operand(i) => k.operands.get(i).map(|o| o.space),
        crate::BufferRef::Scratch(i) => k.scratch.get(i).map(|s| s.space),
        crate::BufferRef::Prefetch(_) => Some(MemorySpace::Smem),
    };
    space == Some(MemorySpace::Smem)
}

fn window_error(
    k: &Kernel,
    defs: &HashMap<ValueId, &OpKind>,
    v: &BufferSlice,
) -> Option<ErrorKind> {
    let (name, dtype, shape) = k.buffer(v.buffer)?;
    let r = shape.len();
    if r == 0 || v.indices.len() != r {
        return None;
    }
    let mem = dtype.tpu_memory_dtype();
    let whole = |d: usize| {
        let (s, len) = dim(&v.indices[d]);
        *s == IndexValue::Static(0)
            && len == shape[d]
            && matches!(v.indices[d], Index::Slice { .. })
    };
    let bad = |what: String, why: &str, fix: &str| {
        Some(ErrorKind::TpuUnsupported {
            rule: "dma-window",
            what,
            why: why.into(),
            fix: fix.into(),
        })
    };
    let lanes = k.target.tile_lanes();
    let (ls, ll) = dim(&v.indices[r - 1]);
    if !whole(r - 1) {
        if ll % lanes != 0 || known_multiple(defs, ls) % lanes as i64 != 0 {
            return bad(
                format!("a copy of `{name}` that slices its lane (last) dim to {ll} elements"),
                "a TPU DMA moves whole 128-lane tiles of the last dim",
                "copy whole rows, or slices starting and ending at multiples of 128 lanes",
            );
        }
    } else if shape[r - 1] % lanes != 0 {
        let rows = if r >= 2 && whole(r - 2) {
            shape[r - 2]
        } else {
            0
        };
        let run = (rows * shape[r - 1] * mem.bytes()) as u64;
        if rows == 0 || !run.is_multiple_of(512) {
            return bad(
                format!(
                    "a copy of `{name}` whose rows of {} elements (under a 128-lane tile) do not form runs of a multiple of 512 bytes",
                    shape[r - 1]
                ),
                "a TPU DMA moves contiguous runs of a multiple of 512 bytes",
                "copy whole [rows, lanes] blocks of a multiple of 512 bytes, or pad the last dim to 128",
            );
        }
    }
    if r >= 2 && !whole(r - 2) {
        let (ss, sl) = dim(&v.indices[r - 2]);
        let p = mem.packing();
        let ok = match ss {
            IndexValue::Static(s) if p == 1 => *s >= 0,
            // Measured for bf16 and i8: whole multiples of 8 rows, or
            // multiples of the packing inside one 8-row group.
            IndexValue::Static(s) => {
                let (s, l) = (*s as usize, sl);
                s % p == 0 && l % p == 0 && (s % 8 == 0 && l % 8 == 0 || s / 8 == (s + l - 1) / 8)
            }
            dynamic => known_multiple(defs, dynamic) % 8 == 0 && (p == 1 || sl % 8 == 0),
        };
        if !ok {
            return bad(
                format!(
                    "a copy of {mem} `{name}` rows {} of {sl}",
                    match ss {
                        IndexValue::Static(s) => format!("from {s}"),
                        IndexValue::Dynamic(v) => format!("from `{}`", describe(k, defs, *v, 0)),
                    }
                ),
                if p > 1 {
                    "a TPU DMA moves a type narrower than 32 bits in groups of packed rows"
                } else {
                    "a TPU DMA needs a dynamic row start it can prove to be a multiple of 8"
                },
                "start the row slice at a multiple of 8 (`ds(i * 8, n)`) and, for types narrower than 32 bits, make its length a multiple of 8 too",
            );
        }
    }
    None
}
