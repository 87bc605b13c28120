//! Index-set splitting of the innermost grid loop: the loop runs only the
//! steps where its work branch holds, and a two-armed branch inside is
//! taken by running the loop in consecutive pieces, one per arm, with no
//! branch left in the loop.
//!
//! This is how a GPU kernel is written by hand. Triton's fused-attention
//! tutorial runs a causal forward as two loops (the blocks left of the
//! diagonal unmasked, then the diagonal blocks masked), where Tessera's
//! kernel says the same with `if block_inside { .. } else { .. }` under
//! `if key_blocks.contains(ki)`, the form the TPU's sequential grid needs.
//! With the branches in the loop, the AMD back end keeps both arms' values
//! live (gfx942: 320 registers against the tutorial's 264).
//!
//! The rewrite is exact: the conditions are affine in the loop index
//! (`a·g + r ≤ 0`, with `r` loop-invariant: program ids, constants), so
//! each holds on an interval of steps, computed before the loop; the steps
//! dropped are those whose only ops are pure, and the pieces run in the
//! loop's order, so every carried value sees the same updates in the same
//! order. Anything else (a condition read from memory, a second branch with
//! effects, an output block that moves with the loop) leaves the loop as it
//! was.

use kernel_ir::{BinaryOp, CompareOp, IndexOp, Literal, OpKind, Region, Role, ValueId};

use super::{Emitter, Expr};

/// A loop's work branch and the loop steps it holds for.
pub(super) struct Split {
    /// The top-level body op `if c { work }` (no else, no results).
    pub(super) outer: usize,
    /// Where `c` holds.
    range: Interval,
    /// Inside the work: the index of `if c2 { .. } else { .. }` (no
    /// results) in the outer branch's region, and where `c2` holds.
    inner: Option<(usize, Interval)>,
}

/// Which arm of the inner branch a piece of the loop runs.
pub(super) type Piece = (usize, Option<(usize, bool)>);

/// A piece of the loop: its first and end step (code) and, when the loop
/// is split, its work branch and arm.
pub(super) type Range = (String, String, Option<Piece>);

/// Inclusive bounds on a loop index: the greatest lower bound and the
/// least upper bound hold (none: unbounded that way).
#[derive(Default)]
struct Interval {
    lower: Vec<Expr>,
    upper: Vec<Expr>,
}

/// `a·g + rest` for loop index `g`, `rest` loop-invariant.
struct Affine {
    a: i64,
    rest: Expr,
}

/// How deep a condition's definition is followed.
const MAX_DEPTH: usize = 32;

impl Emitter<'_> {
    /// The split of the innermost loop over grid dim `d` (at loop level
    /// `level`) whose body, without the top-level ops `skip` (hoisted or
    /// sunk), is pure ops and one work branch with affine conditions.
    pub(super) fn split_plan(&mut self, d: usize, level: usize, skip: &[usize]) -> Option<Split> {
        let k = self.k;
        // An operand whose window moves with the loop is fetched or
        // written back every step; only inputs may skip steps.
        let moving_output = (0..k.operands.len())
            .any(|i| self.plan.level[i] == level && k.operands[i].role != Role::In);
        if moving_output {
            return None;
        }
        let body = &k.body.region;
        let mut effects =
            (0..body.ops.len()).filter(|i| !skip.contains(i) && !super::pure(&body.ops[*i]));
        let outer = effects.next()?;
        if effects.next().is_some() {
            return None;
        }
        let OpKind::If {
            cond,
            then_region,
            else_region,
        } = &body.ops[outer].kind
        else {
            return None;
        };
        if !body.ops[outer].results.is_empty() || !else_region.ops.is_empty() {
            return None;
        }
        let mut range = Interval::default();
        self.interval(*cond, d, &mut range, 0)?;
        Some(Split {
            outer,
            range,
            inner: self.inner_branch(then_region, d),
        })
    }

    /// The one two-armed branch of `work` whose condition is affine in the
    /// loop index, with its interval.
    fn inner_branch(&mut self, work: &Region, d: usize) -> Option<(usize, Interval)> {
        let mut branches = (0..work.ops.len()).filter(|&i| {
            matches!(&work.ops[i].kind, OpKind::If { .. }) && work.ops[i].results.is_empty()
        });
        let at = branches.next()?;
        if branches.next().is_some() {
            return None;
        }
        let OpKind::If { cond, .. } = &work.ops[at].kind else {
            return None;
        };
        let mut range = Interval::default();
        self.interval(*cond, d, &mut range, 0)?;
        Some((at, range))
    }

    /// Adds to `out` the bounds on loop index `g{d}` under which bool
    /// `cond` holds, when `cond` is a conjunction of affine comparisons.
    fn interval(
        &mut self,
        cond: ValueId,
        d: usize,
        out: &mut Interval,
        depth: usize,
    ) -> Option<()> {
        if depth > MAX_DEPTH || !self.scalar(cond) {
            return None;
        }
        let kind = &self.defs.get(&cond)?.kind;
        match kind {
            OpKind::Binary {
                op: BinaryOp::And,
                lhs,
                rhs,
            } => {
                let (lhs, rhs) = (*lhs, *rhs);
                self.interval(lhs, d, out, depth + 1)?;
                self.interval(rhs, d, out, depth + 1)
            }
            OpKind::Compare { op, lhs, rhs } => {
                let (op, lhs, rhs) = (*op, *lhs, *rhs);
                let x = self.affine(lhs, d, depth + 1)?;
                let y = self.affine(rhs, d, depth + 1)?;
                let a = x.a.checked_sub(y.a)?;
                let r = self.index_binary(IndexOp::Sub, x.rest, y.rest);
                // As `a·g + r ≤ 0` over the integers.
                let neg = |e: &mut Self, r: Expr| e.index_binary(IndexOp::Sub, Expr::Const(0), r);
                let (a, r) = match op {
                    CompareOp::Le => (a, r),
                    CompareOp::Lt => (a, self.index_binary(IndexOp::Add, r, Expr::Const(1))),
                    CompareOp::Ge => (a.checked_neg()?, neg(self, r)),
                    CompareOp::Gt => {
                        let r = neg(self, r);
                        (
                            a.checked_neg()?,
                            self.index_binary(IndexOp::Add, r, Expr::Const(1)),
                        )
                    }
                    CompareOp::Eq | CompareOp::Ne => return None,
                };
                if a == 0 {
                    return None;
                }
                // a > 0: g ≤ ⌊−r / a⌋; a < 0: g ≥ ⌈r / |a|⌉ = −⌊−r / |a|⌋.
                let minus_r = neg(self, r);
                let q = self.index_binary(IndexOp::FloorDiv, minus_r, Expr::Const(a.abs()));
                if a > 0 {
                    out.upper.push(q);
                } else {
                    let lower = neg(self, q);
                    out.lower.push(lower);
                }
                Some(())
            }
            _ => None,
        }
    }

    /// Integer scalar `v` as `a·g{d} + rest`, `rest` built from program
    /// ids of other dims, grid sizes and constants.
    fn affine(&mut self, v: ValueId, d: usize, depth: usize) -> Option<Affine> {
        if depth > MAX_DEPTH || !self.scalar(v) || !self.ty(v).0.is_int() {
            return None;
        }
        let invariant = |rest: Expr| Some(Affine { a: 0, rest });
        let kind = &self.defs.get(&v)?.kind;
        match kind {
            OpKind::ProgramId { dim } if *dim == d => Some(Affine {
                a: 1,
                rest: Expr::Const(0),
            }),
            OpKind::ProgramId { dim } => invariant(Expr::Code(format!("g{dim}"))),
            OpKind::NumPrograms { dim } => {
                invariant(Expr::Const(self.k.grid.dims.get(*dim)?.bound as i64))
            }
            OpKind::Constant {
                value: Literal::Int(c),
                ..
            } => invariant(Expr::Const(*c)),
            OpKind::Binary { op, lhs, rhs } => {
                let (op, lhs, rhs) = (*op, *lhs, *rhs);
                let x = self.affine(lhs, d, depth + 1)?;
                let y = self.affine(rhs, d, depth + 1)?;
                let (a, index_op) = match op {
                    BinaryOp::Add => (x.a.checked_add(y.a)?, IndexOp::Add),
                    BinaryOp::Sub => (x.a.checked_sub(y.a)?, IndexOp::Sub),
                    BinaryOp::Mul => match (&x.rest, &y.rest) {
                        _ if x.a == 0 && y.a == 0 => (0, IndexOp::Mul),
                        (Expr::Const(c), _) if x.a == 0 => (y.a.checked_mul(*c)?, IndexOp::Mul),
                        (_, Expr::Const(c)) if y.a == 0 => (x.a.checked_mul(*c)?, IndexOp::Mul),
                        _ => return None,
                    },
                    BinaryOp::Max if x.a == 0 && y.a == 0 => (0, IndexOp::Max),
                    BinaryOp::Min if x.a == 0 && y.a == 0 => (0, IndexOp::Min),
                    _ => return None,
                };
                let rest = self.index_binary(index_op, x.rest, y.rest);
                Some(Affine { a, rest })
            }
            _ => None,
        }
    }

    /// Whether `v` is a scalar (rank 0).
    fn scalar(&self, v: ValueId) -> bool {
        self.k.body.ty(v).is_some_and(|t| t.shape.is_empty())
    }

    /// Writes the pieces of the loop over `g{d}` (of `bound` steps) as
    /// `(start, end, piece)`: the loop's range cut where the inner branch
    /// changes arm, in order.
    pub(super) fn pieces(&mut self, d: usize, bound: usize, split: &Split) -> Vec<Range> {
        let mut lo = Expr::Const(0);
        for l in split.range.lower.clone() {
            lo = self.index_binary(IndexOp::Max, lo, l);
        }
        let mut hi = Expr::Const(bound as i64);
        for u in split.range.upper.clone() {
            let end = self.index_binary(IndexOp::Add, u, Expr::Const(1));
            hi = self.index_binary(IndexOp::Min, hi, end);
        }
        let lo = self.bind(format!("g{d}_lo"), lo);
        let hi = self.bind(format!("g{d}_hi"), hi);
        let Some((at, inner)) = &split.inner else {
            return vec![(lo.code(), hi.code(), Some((split.outer, None)))];
        };
        let at = *at;
        // Cut points clamped into [lo, hi] and in order: a ≤ b.
        let mut a = lo.clone();
        for l in inner.lower.clone() {
            a = self.index_binary(IndexOp::Max, a, l);
        }
        a = self.index_binary(IndexOp::Min, a, hi.clone());
        let a = self.bind(format!("g{d}_a"), a);
        let mut b = a.clone();
        if inner.upper.is_empty() {
            b = hi.clone();
        } else {
            let mut end = hi.clone();
            for u in inner.upper.clone() {
                let e = self.index_binary(IndexOp::Add, u, Expr::Const(1));
                end = self.index_binary(IndexOp::Min, end, e);
            }
            b = self.index_binary(IndexOp::Max, b, end);
        }
        let b = self.bind(format!("g{d}_b"), b);
        let mut out = Vec::new();
        if !inner.lower.is_empty() {
            out.push((lo.code(), a.code(), Some((split.outer, Some((at, false))))));
        }
        out.push((a.code(), b.code(), Some((split.outer, Some((at, true))))));
        if !inner.upper.is_empty() {
            out.push((b.code(), hi.code(), Some((split.outer, Some((at, false))))));
        }
        out
    }

    /// `e` as a named value (a constant stays a constant).
    fn bind(&mut self, name: String, e: Expr) -> Expr {
        match e {
            Expr::Const(_) => e,
            Expr::Code(code) => {
                self.line(format!("{name} = {code}"), self.k.grid_loc.as_ref());
                Expr::Code(name)
            }
        }
    }

    /// The work branch of a loop piece: its region's ops, the inner
    /// branch replaced by the piece's arm.
    pub(super) fn piece_work(
        &mut self,
        op: &kernel_ir::Op,
        arm: Option<(usize, bool)>,
    ) -> Result<(), crate::LoweringError> {
        let k = self.k;
        let OpKind::If { then_region, .. } = &op.kind else {
            return self.op(op, &k.body.region);
        };
        for (i, inner) in then_region.ops.iter().enumerate() {
            match (&inner.kind, arm) {
                (
                    OpKind::If {
                        then_region: t,
                        else_region: e,
                        ..
                    },
                    Some((at, taken)),
                ) if i == at => self.region(if taken { t } else { e })?,
                _ => self.op(inner, then_region)?,
            }
        }
        Ok(())
    }
}
