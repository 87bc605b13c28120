//! The cost estimate a `tpu_custom_call` carries, computed from the IR.

use kernel_ir::{IndexExpr, IndexValue, Kernel, MemorySpace, OpKind, Region, UnaryOp};

/// What XLA's scheduler is told about a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CostEstimate {
    /// Floating-point (and integer) arithmetic ops, a multiply-add counting
    /// two.
    pub flops: u64,
    /// Transcendental ops (exp, log, tanh, sqrt, ...).
    pub transcendentals: u64,
    /// Bytes moved between HBM and VMEM/SMEM: each block fetched or written
    /// back once per change of its block index, whole arrays for `any` and
    /// scalar prefetch.
    pub bytes_accessed: u64,
}

/// Grids beyond this many steps are not walked; every step then counts as
/// a fetch.
const MAX_WALK: usize = 1 << 20;

impl CostEstimate {
    /// The estimate for `k`. Loops with run-time bounds count one trip, and
    /// both branches of a conditional count as taken: an estimate, not a
    /// measurement.
    pub fn of(k: &Kernel) -> CostEstimate {
        let mut c = CostEstimate::default();
        region(k, &k.body.region, 1, &mut c);
        let steps = k.grid.steps() as u64;
        c.flops = c.flops.saturating_mul(steps);
        c.transcendentals = c.transcendentals.saturating_mul(steps);
        c.bytes_accessed = bytes_accessed(k);
        c
    }
}

fn region(k: &Kernel, r: &Region, times: u64, c: &mut CostEstimate) {
    let elems = |v: kernel_ir::ValueId| k.body.ty(v).map_or(1, |t| t.elements() as u64);
    for op in &r.ops {
        let n = op.results.first().map_or(0, |&v| elems(v));
        match &op.kind {
            OpKind::Unary { op: u, .. } if u.is_transcendental() => {
                c.transcendentals += times * n;
                if *u == UnaryOp::Logistic {
                    c.flops += times * 2 * n;
                }
            }
            OpKind::Unary { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Select { .. } => c.flops += times * n,
            OpKind::Reduce { x, .. } => c.flops += times * elems(*x),
            OpKind::Dot { lhs, dims, .. } => {
                let contract: u64 = k.body.ty(*lhs).map_or(1, |t| {
                    dims.lhs_contract
                        .iter()
                        .map(|&d| t.shape.get(d).copied().unwrap_or(1) as u64)
                        .product()
                });
                c.flops += times * 2 * n * contract;
            }
            OpKind::For {
                lower,
                upper,
                step,
                body,
                ..
            } => {
                let trips = match (lower, upper) {
                    (IndexValue::Static(a), IndexValue::Static(b)) if b > a => {
                        ((b - a) as u64).div_ceil((*step).max(1) as u64)
                    }
                    (IndexValue::Static(_), IndexValue::Static(_)) => 0,
                    _ => 1,
                };
                region(k, body, times.saturating_mul(trips), c);
            }
            OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                region(k, then_region, times, c);
                region(k, else_region, times, c);
            }
            _ => {}
        }
    }
}

fn bytes_accessed(k: &Kernel) -> u64 {
    let mut total: u64 = k
        .prefetch
        .iter()
        .map(|p| (p.shape.iter().product::<usize>() * p.dtype.bytes()) as u64)
        .sum();
    for o in &k.operands {
        let array = (o.shape.iter().product::<usize>() * o.dtype.bytes()) as u64;
        if o.space == MemorySpace::Any {
            total += array;
            continue;
        }
        // Read in, written back, or both.
        let directions = o.role.is_input() as u64 + o.role.is_output() as u64;
        total += block_traffic(k, o) * directions;
    }
    total
}

/// The bytes `o`'s pipeline moves one way over the grid: each block once
/// per change of its block index (the first step counts), its in-bounds
/// part ([`kernel_ir::Operand::block_bytes`], the rule `tessera cost`
/// counts the interpreter's trace with). A map that reads scalar prefetch
/// (unknown here) or a grid too large to walk counts a full block every
/// step.
fn block_traffic(k: &Kernel, o: &kernel_ir::Operand) -> u64 {
    let exprs = &o.block.index_map.exprs;
    let steps = k.grid.steps();
    if steps > MAX_WALK || exprs.iter().any(IndexExpr::uses_prefetch) {
        let block = (o.block.shape.iter().product::<usize>() * o.dtype.bytes()) as u64;
        return block.saturating_mul(steps as u64);
    }
    let mut last: Option<Vec<i64>> = None;
    let mut bytes = 0;
    for p in k.grid.points() {
        let b: Vec<i64> = exprs
            .iter()
            .map(|e| e.eval_static(&p).unwrap_or(0))
            .collect();
        if last.as_ref() != Some(&b) {
            bytes += o.block_bytes(&b);
            last = Some(b);
        }
    }
    bytes
}
