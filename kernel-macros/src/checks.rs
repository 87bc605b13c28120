//! TPU rules checked while compiling, where the numbers are literals.
//!
//! The same rules run again in the verifier when the kernel is built (with
//! the real shapes); checking literals here moves the error to `cargo
//! build`, with the span on the offending number.

use syn::{BinOp, Expr, Lit};

use crate::sig::{ArrayParam, BlockAttr, LayoutAttr, ScratchParam, Space};

const LANES: u64 = 128;

/// The value of an integer literal, or of `+ - * / << ` over literals.
pub fn literal(e: &Expr) -> Option<u64> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse().ok(),
            _ => None,
        },
        Expr::Paren(p) => literal(&p.expr),
        Expr::Group(g) => literal(&g.expr),
        Expr::Binary(b) => {
            let (x, y) = (literal(&b.left)?, literal(&b.right)?);
            match b.op {
                BinOp::Add(_) => x.checked_add(y),
                BinOp::Sub(_) => x.checked_sub(y),
                BinOp::Mul(_) => x.checked_mul(y),
                BinOp::Div(_) if y != 0 => Some(x / y),
                BinOp::Shl(_) => x.checked_shl(y as u32),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Logical dims from most to least minor, when the layout is literal.
fn minor_to_major(layout: &LayoutAttr, rank: usize) -> Option<Vec<usize>> {
    match layout {
        LayoutAttr::RowMajor => Some((0..rank).rev().collect()),
        LayoutAttr::ColMajor => {
            let mut d: Vec<usize> = (0..rank).rev().collect();
            if rank >= 2 {
                d.swap(0, 1);
            }
            Some(d)
        }
        LayoutAttr::MinorToMajor(es) => es.iter().map(|e| literal(e).map(|v| v as usize)).collect(),
    }
}

/// Checks one array operand; pushes errors spanned at the offending number.
pub fn check_array(a: &ArrayParam, grid_rank: usize, errors: &mut Vec<syn::Error>) {
    let Some(bytes) = a.dtype.bytes() else { return };
    let bytes = bytes as u64;
    let packing = 4 / bytes;
    let rows = 8 * packing;
    if let Some(align) = &a.align
        && let Some(v) = literal(align)
        && !v.is_power_of_two()
    {
        errors.push(syn::Error::new_spanned(
            align,
            format!("align = {v} is not a power of two; use 128 for operands that feed the MXU"),
        ));
    }
    let Some(BlockAttr::Inline(block)) = &a.block else {
        return;
    };
    let map_args = block.map.inputs.len();
    if map_args != grid_rank {
        errors.push(syn::Error::new_spanned(
            &block.map.inputs,
            format!(
                "the index map takes {map_args} grid indices but the grid has {grid_rank} dims; take one per grid dim (`_` for unused ones)"
            ),
        ));
    }
    let rank = a.shape.len();
    if block.shape.len() != rank {
        errors.push(syn::Error::new(
            block.span,
            format!(
                "the block has {} dims but `{}` is declared with {rank} (`#[shape(..)]`); give one block dim per array dim",
                block.shape.len(),
                a.name
            ),
        ));
        return;
    }
    // An element window may be larger than its array (it reaches into the
    // padding); the verifier checks it against the padded array.
    for (b, s) in block.shape.iter().zip(&a.shape) {
        if let (Some(bv), Some(sv)) = (literal(b), literal(s))
            && a.element.is_none()
            && bv > sv
        {
            errors.push(syn::Error::new_spanned(
                b,
                format!("block dim {bv} is larger than the array dim {sv}; use at most {sv}"),
            ));
        }
    }
    if a.space != Space::Vmem {
        return;
    }
    let Some(order) = minor_to_major(&a.layout, rank) else {
        return;
    };
    let layout = match a.layout {
        LayoutAttr::ColMajor => "col-major",
        LayoutAttr::RowMajor => "row-major",
        LayoutAttr::MinorToMajor(_) => "this layout's",
    };
    let dtype = &a.dtype.ident;
    // A literal block dim breaks a rule unless it could be the full array
    // dim: that needs the array dim to be a literal too.
    let violates = |d: usize, unit: u64| -> Option<(u64, Option<u64>)> {
        let bv = literal(&block.shape[d])?;
        let sv = literal(&a.shape[d]);
        (bv % unit != 0 && sv.is_some_and(|s| s != bv)).then_some((bv, sv))
    };
    if rank == 1 {
        if let Some(bv) = literal(&block.shape[0]) {
            let min_pow2 = LANES * packing;
            let sv = literal(&a.shape[0]);
            if sv.is_some_and(|s| s != bv)
                && bv % 1024 != 0
                && !(bv.is_power_of_two() && bv >= min_pow2)
            {
                errors.push(syn::Error::new_spanned(
                    &block.shape[0],
                    format!(
                        "a rank-1 {dtype} block must be the full array, a multiple of 1024, or a power of two ≥ {min_pow2}; {bv} is none of these"
                    ),
                ));
            }
        }
        return;
    }
    if rank == 0 {
        return;
    }
    let (minor, second) = (order[0], order[1]);
    if let Some((bv, sv)) = violates(minor, LANES) {
        errors.push(syn::Error::new_spanned(
            &block.shape[minor],
            format!(
                "block dim {minor} = {bv} is the physical minor (lane) dim of this {layout} {dtype} operand: it must be a multiple of 128 lanes or the full array dim {}",
                sv.unwrap_or_default()
            ),
        ));
    }
    if let Some((bv, sv)) = violates(second, rows) {
        errors.push(syn::Error::new_spanned(
            &block.shape[second],
            format!(
                "block dim {second} = {bv} is the physical second-minor (sublane) dim of this {layout} {dtype} operand: it must be a multiple of {rows} rows ({dtype} tiles are ({rows}, 128)) or the full array dim {}",
                sv.unwrap_or_default()
            ),
        ));
    }
    // Alignment along the minor dim: consecutive blocks start
    // `block * bytes` apart.
    if let Some(align) = a.align.as_ref().and_then(literal)
        && a.element.is_none()
        && align.is_power_of_two()
        && let (Some(bv), Some(sv)) = (literal(&block.shape[minor]), literal(&a.shape[minor]))
        && sv > bv
        && !(bv * bytes).is_multiple_of(align)
    {
        errors.push(syn::Error::new_spanned(
            &block.shape[minor],
            format!(
                "with align = {align}, blocks along the minor dim start every {bv} × {bytes} = {} bytes, which is not a multiple of {align}; make block dim {minor} a multiple of {}",
                bv * bytes,
                align / gcd(align, bytes)
            ),
        ));
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a.max(1) } else { gcd(b, a % b) }
}

/// VMEM bytes of a buffer with the two physically minor dims padded to
/// native tiles, when every dim is a literal.
fn padded_bytes(dims: &[Expr], layout: &LayoutAttr, bytes: u64) -> Option<u64> {
    let mut v: Vec<u64> = dims.iter().map(literal).collect::<Option<_>>()?;
    let order = minor_to_major(layout, v.len())?;
    let rows = 8 * (4 / bytes);
    if let Some(&m) = order.first() {
        v[m] = v[m].div_ceil(LANES) * LANES;
    }
    if let Some(&s) = order.get(1) {
        v[s] = v[s].div_ceil(rows) * rows;
    }
    v.iter().try_fold(bytes, |a, &d| a.checked_mul(d))
}

/// When every VMEM block and scratch shape is a literal, checks the VMEM
/// budget against the (literal or default) limit.
pub fn check_vmem(
    arrays: &[&ArrayParam],
    scratch: &[&ScratchParam],
    limit: Option<u64>,
    default_limit: u64,
    span: proc_macro2::Span,
    errors: &mut Vec<syn::Error>,
) {
    let mut total = 0u64;
    let mut lines = Vec::new();
    for a in arrays.iter().filter(|a| a.space == Space::Vmem) {
        let Some(BlockAttr::Inline(b)) = &a.block else {
            return;
        };
        let Some(bytes) = a.dtype.bytes() else { return };
        let Some(p) = padded_bytes(&b.shape, &a.layout, bytes as u64) else {
            return;
        };
        total += 2 * p;
        lines.push(format!("{}: 2 × {p} B", a.name));
    }
    for s in scratch.iter().filter(|s| s.space == Space::Vmem) {
        let Some(bytes) = s.dtype.bytes() else { return };
        let Some(p) = padded_bytes(&s.shape, &LayoutAttr::RowMajor, bytes as u64) else {
            return;
        };
        total += p;
        lines.push(format!("{}: {p} B", s.name));
    }
    let limit = limit.unwrap_or(default_limit);
    if total > limit {
        errors.push(syn::Error::new(
            span,
            format!(
                "the VMEM budget is exceeded: double-buffered windows and scratch need {total} bytes ({}) but the scoped limit is {limit} bytes; shrink the blocks or raise `vmem_limit`",
                lines.join(", ")
            ),
        ));
    }
}
