//! No scratch state across a parallel grid dim.
//!
//! A scratch buffer read before it is written in a grid step carries state
//! from the previous step; so does an output block (`out`, not `inout`, in
//! VMEM) that the kernel reads back, as a matmul accumulating into its f32
//! output does. The grid runs in row-major order, so a parallel
//! dim `p` changes only when every dim inner to it wraps to 0. State is
//! therefore safe when it is reset (fully stored under
//! `when(program_id(d) == 0 && ...)`) for dims `d` that are all inner to
//! every parallel dim, or when there are no parallel dims at all.
//!
//! The analysis is flow-sensitive but conservative inside loops and
//! branches: a store there defines the buffer only for the rest of that
//! region. A waited copy into a buffer defines it like a full store;
//! scoped buffers never carry state.

use std::collections::HashMap;

use crate::error::{ErrorKind, KernelError};
use crate::{
    BinaryOp, BufferRef, CompareOp, Index, IndexValue, Kernel, Literal, OpKind, Region, ValueId,
};

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// Nothing written yet in this step: a read sees the previous step.
    Carried,
    /// Reset when all these grid dims are 0.
    ResetAt(Vec<usize>),
    /// Fully written earlier in this step.
    Defined,
    /// Parts written earlier in this step by stores of static ranges
    /// (each a start and length per dim); defined once they cover it.
    Partial(Vec<Vec<(usize, usize)>>),
}

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let parallel: Vec<usize> = k
        .grid
        .dims
        .iter()
        .enumerate()
        .filter(|(_, d)| d.semantics.is_parallel())
        .map(|(i, _)| i)
        .collect();
    let Some(&innermost_parallel) = parallel.iter().max() else {
        return Vec::new();
    };
    let mut defs = HashMap::new();
    k.body.walk(&mut |op| {
        for r in &op.results {
            defs.insert(*r, &op.kind);
        }
    });
    let mut w = Walker {
        k,
        defs,
        innermost_parallel,
        reported: vec![false; k.scratch.len() + k.operands.len()],
        errors: Vec::new(),
    };
    // Scoped buffers are allocated afresh by their scope: they carry
    // nothing (reading one before writing it is the interpreter's error).
    // Slots past the scratch are the operands: only a VMEM output block
    // can carry (an input is read, never carried; an in-out's first read
    // is its input).
    let mut states: Vec<State> = k
        .scratch
        .iter()
        .map(|s| {
            if s.scoped {
                State::Defined
            } else {
                State::Carried
            }
        })
        .chain(k.operands.iter().map(|o| {
            if o.role == crate::Role::Out && o.space == crate::MemorySpace::Vmem {
                State::Carried
            } else {
                State::Defined
            }
        }))
        .collect();
    w.region(&k.body.region, &mut states);
    w.errors
}

struct Walker<'a> {
    k: &'a Kernel,
    defs: HashMap<ValueId, &'a OpKind>,
    innermost_parallel: usize,
    reported: Vec<bool>,
    errors: Vec<KernelError>,
}

impl Walker<'_> {
    /// Grid dims such that `cond` holds whenever they are all 0, if `cond`
    /// is recognized as `program_id(d) == 0`, possibly and-ed (all of
    /// them) or or-ed with anything (at least then).
    fn reset_dims(&self, cond: ValueId) -> Option<Vec<usize>> {
        match self.defs.get(&cond)? {
            OpKind::Compare {
                op: CompareOp::Eq,
                lhs,
                rhs,
            } => {
                let pid = |v: &ValueId| match self.defs.get(v) {
                    Some(OpKind::ProgramId { dim }) => Some(*dim),
                    _ => None,
                };
                let zero = |v: &ValueId| {
                    matches!(
                        self.defs.get(v),
                        Some(OpKind::Constant {
                            value: Literal::Int(0),
                            ..
                        })
                    )
                };
                match (pid(lhs), pid(rhs)) {
                    (Some(d), _) if zero(rhs) => Some(vec![d]),
                    (_, Some(d)) if zero(lhs) => Some(vec![d]),
                    _ => None,
                }
            }
            OpKind::Binary {
                op: BinaryOp::And,
                lhs,
                rhs,
            } => {
                let mut a = self.reset_dims(*lhs)?;
                a.extend(self.reset_dims(*rhs)?);
                Some(a)
            }
            // `reset || other` holds at least whenever `reset` does.
            OpKind::Binary {
                op: BinaryOp::Or,
                lhs,
                rhs,
            } => self.reset_dims(*lhs).or_else(|| self.reset_dims(*rhs)),
            _ => None,
        }
    }

    /// The state slot of a buffer: scratch first, then operands.
    fn slot(&self, b: &BufferRef) -> Option<usize> {
        match b {
            BufferRef::Scratch(s) if *s < self.k.scratch.len() => Some(*s),
            BufferRef::Operand(i) if *i < self.k.operands.len() => Some(self.k.scratch.len() + i),
            _ => None,
        }
    }

    fn name(&self, slot: usize) -> &str {
        match self.k.scratch.get(slot) {
            Some(s) => &s.name,
            None => &self.k.operands[slot - self.k.scratch.len()].name,
        }
    }

    /// The slot a store writes whole, if it does.
    fn full_store(&self, kind: &OpKind) -> Option<usize> {
        let (slot, range) = self.static_store(kind)?;
        let shape = self.shape(slot);
        let whole = range.len() == shape.len()
            && range
                .iter()
                .zip(shape)
                .all(|(&(s, l), &n)| s == 0 && l == n);
        whole.then_some(slot)
    }

    /// The slot and the static range (start, length per dim) an unmasked
    /// store with constant indices writes.
    fn static_store(&self, kind: &OpKind) -> Option<(usize, Vec<(usize, usize)>)> {
        let OpKind::Store {
            buffer,
            indices,
            mask: None,
            ..
        } = kind
        else {
            return None;
        };
        let slot = self.slot(buffer)?;
        let range = indices
            .iter()
            .map(|i| match i {
                Index::Slice {
                    start: IndexValue::Static(s),
                    len,
                } => Some((usize::try_from(*s).ok()?, *len)),
                Index::Point(IndexValue::Static(p)) => Some((usize::try_from(*p).ok()?, 1)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some((slot, range))
    }

    fn shape(&self, slot: usize) -> &[usize] {
        match self.k.scratch.get(slot) {
            Some(s) => &s.shape,
            None => &self.k.operands[slot - self.k.scratch.len()].block.shape,
        }
    }

    fn read(&mut self, s: usize, state: &State, loc: &Option<crate::Loc>) {
        let bad = match state {
            State::Defined => false,
            State::Carried | State::Partial(_) => true,
            State::ResetAt(dims) => dims.iter().any(|&d| d <= self.innermost_parallel),
        };
        if bad && !self.reported[s] {
            self.reported[s] = true;
            self.errors.push(KernelError::new(
                ErrorKind::ParallelCarry {
                    scratch: self.name(s).to_string(),
                    dim: self.innermost_parallel,
                },
                loc.clone(),
            ));
        }
    }

    fn region(&mut self, r: &Region, states: &mut [State]) {
        for op in &r.ops {
            match &op.kind {
                OpKind::Load { buffer, .. } => {
                    if let Some(s) = self.slot(buffer) {
                        let st = states[s].clone();
                        self.read(s, &st, &op.loc);
                    }
                }
                OpKind::If {
                    cond,
                    then_region,
                    else_region,
                } => {
                    let mut inner = states.to_vec();
                    self.region(then_region, &mut inner);
                    let mut inner_else = states.to_vec();
                    self.region(else_region, &mut inner_else);
                    if let Some(dims) = self.reset_dims(*cond) {
                        for o in &then_region.ops {
                            if let Some(s) = self.full_store(&o.kind)
                                && states[s] == State::Carried
                            {
                                states[s] = State::ResetAt(dims.clone());
                            }
                        }
                    }
                }
                OpKind::For { body, .. } => {
                    let mut inner = states.to_vec();
                    self.region(body, &mut inner);
                }
                // Runs exactly once, so what it defines stays defined.
                OpKind::Scope { body, .. } => self.region(body, states),
                // A waited copy has filled its destination in this step
                // (the copy itself may have started in the step before,
                // along an arbitrary dim: the interpreter rejects copies
                // in flight across a parallel one).
                OpKind::DmaWait(c) => {
                    if let Some(s) = self.slot(&c.dst.buffer) {
                        states[s] = State::Defined;
                    }
                }
                kind => {
                    if let Some(s) = self.full_store(kind) {
                        states[s] = State::Defined;
                    } else if let Some((s, range)) = self.static_store(kind) {
                        let mut ranges = match &states[s] {
                            State::Carried => Vec::new(),
                            State::Partial(r) => r.clone(),
                            State::Defined | State::ResetAt(_) => continue,
                        };
                        ranges.push(range);
                        states[s] = if covers(&ranges, self.shape(s)) {
                            State::Defined
                        } else {
                            State::Partial(ranges)
                        };
                    }
                }
            }
        }
    }
}

/// Whether the ranges together write every element of `shape` (checked
/// element by element up to 4M elements; larger buffers count as not
/// covered, the conservative answer).
fn covers(ranges: &[Vec<(usize, usize)>], shape: &[usize]) -> bool {
    let n: usize = shape.iter().product();
    if n > 1 << 22 || ranges.iter().any(|r| r.len() != shape.len()) {
        return false;
    }
    let mut written = vec![false; n];
    for r in ranges {
        let mut idx: Vec<usize> = r.iter().map(|&(s, _)| s).collect();
        if r.iter().zip(shape).any(|(&(s, l), &d)| l == 0 || s + l > d) {
            continue;
        }
        'elements: loop {
            let flat = idx.iter().zip(shape).fold(0, |f, (&i, &d)| f * d + i);
            written[flat] = true;
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < r[d].0 + r[d].1 {
                    continue 'elements;
                }
                idx[d] = r[d].0;
            }
            break;
        }
    }
    written.iter().all(|&w| w)
}
