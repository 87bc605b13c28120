//! The grid as Triton runs it: parallel dims are program ids, the
//! `arbitrary` dims loops in grid order, and first/last-step branches
//! hoisted out of (or sunk below) the innermost loop.

use super::*;

impl<'a> Emitter<'a> {
    /// Level `l` of the loop nest: its operands' windows, the next loop or
    /// the body (without the top-level ops in `skip`, hoisted out of the
    /// innermost loop), the write-backs.
    pub(super) fn level(&mut self, l: usize, skip: &[usize]) -> Result<(), LoweringError> {
        let k = self.k;
        let at_level: Vec<usize> = (0..k.operands.len())
            .filter(|&i| self.plan.level[i] == l)
            .collect();
        for &i in &at_level {
            self.window_offsets(i)?;
            let r = self.plan.residency(BufferRef::Operand(i));
            let o = &k.operands[i];
            let fetch =
                r == Residency::Fetched || (r == Residency::Registers && o.role == Role::InOut);
            if fetch {
                let (ptr, mask) = self.window_pointers(i, &input_ptr(k, i));
                let load = masked_load(&ptr, mask.as_deref(), o.dtype);
                self.line(format!("{}_w = {load}", o.name), o.loc.as_ref());
            }
        }
        if l < self.plan.loops.len() {
            let d = self.plan.loops[l];
            let bound = k.grid.dims[d].bound;
            let innermost = l + 1 == self.plan.loops.len();
            // The first step's prologue (`if k == 0`) runs before the loop
            // and the last step's epilogue (`if k == last`) after it, as a
            // GPU kernel writes them: no branch in the loop, and nothing
            // the loop keeps live (the q block) stays live beside the
            // epilogue's buffers.
            let (prologue, epilogue) = if innermost {
                (
                    self.hoistable(d, Step::First, l + 1),
                    self.sinkable(d, l + 1),
                )
            } else {
                (None, None)
            };
            let body = &k.body.region;
            let mut skip = Vec::new();
            if let Some((at, inputs)) = &prologue {
                self.line(
                    format!("g{d} = tl.full([], 0, tl.int32)"),
                    k.grid_loc.as_ref(),
                );
                self.hoisted(body, (*at, d), inputs)?;
                skip.push(*at);
            }
            if let Some((start, _)) = &epilogue {
                skip.extend(*start..body.ops.len());
            }
            let split = if innermost {
                self.split_plan(d, l + 1, &skip)
            } else {
                None
            };
            let pieces = match &split {
                Some(s) => self.pieces(d, bound, s),
                None => vec![("0".to_string(), bound.to_string(), None)],
            };
            for (start, end, piece) in pieces {
                self.line(
                    format!("for g{d} in range({start}, {end}):"),
                    k.grid_loc.as_ref(),
                );
                self.indent += 1;
                self.piece = piece;
                self.level(l + 1, &skip)?;
                self.piece = None;
                self.indent -= 1;
            }
            if let Some((start, inputs)) = &epilogue {
                self.line(
                    format!("g{d} = tl.full([], {}, tl.int32)", bound - 1),
                    k.grid_loc.as_ref(),
                );
                for &i in inputs {
                    self.op(&body.ops[i], body)?;
                }
                for op in &body.ops[*start..] {
                    match &op.kind {
                        OpKind::If {
                            cond, then_region, ..
                        } if self.step_of(*cond, d, Step::Last) == Some(true) => {
                            self.region(then_region)?
                        }
                        _ => self.op(op, body)?,
                    }
                }
            }
        } else {
            let body = &k.body.region;
            for (i, op) in body.ops.iter().enumerate() {
                match self.piece {
                    _ if skip.contains(&i) => {}
                    Some((outer, arm)) if outer == i => self.piece_work(op, arm)?,
                    _ => self.op(op, body)?,
                }
            }
        }
        for &i in &at_level {
            let o = &k.operands[i];
            if o.role.is_output()
                && self.plan.residency(BufferRef::Operand(i)) == Residency::Registers
            {
                let (ptr, mask) = self.window_pointers(i, &format!("{}_ptr", o.name));
                let store = match mask {
                    Some(m) => format!("tl.store({ptr}, {}_w, mask={m})", o.name),
                    None => format!("tl.store({ptr}, {}_w)", o.name),
                };
                self.line(store, o.loc.as_ref());
            }
        }
        Ok(())
    }

    /// A hoisted first-step branch (op `at` of the loop over grid dim
    /// `d`): the ops it reads values of, then its body, or the whole branch
    /// when its condition says more than the step.
    pub(super) fn hoisted(
        &mut self,
        body: &Region,
        (at, d): (usize, usize),
        inputs: &[usize],
    ) -> Result<(), LoweringError> {
        for &i in inputs {
            self.op(&body.ops[i], body)?;
        }
        match &body.ops[at].kind {
            OpKind::If {
                cond, then_region, ..
            } if self.step_of(*cond, d, Step::First) == Some(true) => self.region(then_region),
            _ => self.op(&body.ops[at], body),
        }
    }

    /// The end of the innermost body that runs after the loop instead, once,
    /// for the last step: what only the last step's effect of survives.
    /// Its ops are the last-step epilogue (`if program_id(d) ==
    /// num_programs(d) - 1 { .. }`), whole unmasked stores to an output
    /// whose block stays put through the loop and that the body never
    /// reads (each step's write is overwritten by the next: the TPU writes
    /// it back once, when its index changes; a GPU writes it once, after
    /// the loop), loads of register buffers and arithmetic. Gives the first
    /// index of that end and the earlier top-level ops whose values it
    /// reads (arithmetic on grid indices and constants, run again after
    /// the loop); `None` when the body ends otherwise.
    pub(super) fn sinkable(&self, d: usize, level: usize) -> Option<(usize, Vec<usize>)> {
        let k: &'a Kernel = self.k;
        let body = &k.body.region;
        let mut loaded = HashSet::new();
        walk_region(body, &mut |op| {
            if let OpKind::Load { buffer, .. } = &op.kind {
                loaded.insert(*buffer);
            }
        });
        let sinks = |op: &Op| -> bool {
            match &op.kind {
                OpKind::If {
                    cond,
                    then_region,
                    else_region,
                } => {
                    if !op.results.is_empty()
                        || !else_region.ops.is_empty()
                        || self.step_of(*cond, d, Step::Last).is_none()
                    {
                        return false;
                    }
                    let mut moving = false;
                    walk_region(then_region, &mut |op| {
                        if let OpKind::Load {
                            buffer: BufferRef::Operand(i),
                            ..
                        }
                        | OpKind::Store {
                            buffer: BufferRef::Operand(i),
                            ..
                        } = &op.kind
                        {
                            moving |= self.plan.level[*i] >= level;
                        }
                    });
                    !moving
                }
                OpKind::Store {
                    buffer: b @ BufferRef::Operand(i),
                    indices,
                    mask: None,
                    ..
                } => {
                    self.plan.level[*i] < level
                        && self.plan.residency(*b) == Residency::Memory
                        && !loaded.contains(b)
                        && is_whole(indices, k.operands[*i].view_shape())
                }
                OpKind::Load {
                    buffer, mask: None, ..
                } => {
                    matches!(self.plan.residency(*buffer), Residency::Registers)
                }
                _ => pure(op),
            }
        };
        let mut start = body.ops.len();
        while start > 0 && sinks(&body.ops[start - 1]) {
            start -= 1;
        }
        // Only an end that writes something is worth moving.
        let writes = body.ops[start..]
            .iter()
            .any(|op| matches!(op.kind, OpKind::If { .. } | OpKind::Store { .. }));
        if !writes {
            return None;
        }
        let mut free = std::collections::BTreeSet::new();
        let mut bound = HashSet::new();
        for op in &body.ops[start..] {
            for v in op.kind.operands() {
                if !bound.contains(&v) {
                    free.insert(v);
                }
            }
            for sub in op.kind.regions() {
                free_values(sub, &mut bound.clone(), &mut free);
            }
            bound.extend(op.results.iter().copied());
        }
        let picked = pure_producers(&body.ops[..start], free.into_iter().collect())?;
        Some((start, picked))
    }

    /// A top-level `if program_id(d) == 0 { .. }` (the first op with an
    /// effect) or `if program_id(d) == num_programs(d) - 1 { .. }` (the last
    /// op), with no results and no else, that can run outside the loop over
    /// `d`: its index and the top-level ops whose values it reads, when
    /// those are arithmetic on grid indices and constants and the branch
    /// touches no window that moves with the innermost loop (`level`).
    pub(super) fn hoistable(
        &self,
        d: usize,
        step: Step,
        level: usize,
    ) -> Option<(usize, Vec<usize>)> {
        let k: &'a Kernel = self.k;
        let body = &k.body.region;
        let at = match step {
            Step::First => body.ops.iter().position(|op| !pure(op))?,
            Step::Last => body.ops.len().checked_sub(1)?,
        };
        let branch = &body.ops[at];
        let OpKind::If {
            cond,
            then_region,
            else_region,
        } = &branch.kind
        else {
            return None;
        };
        if !branch.results.is_empty() || !else_region.ops.is_empty() {
            return None;
        }
        let exact = self.step_of(*cond, d, step)?;
        let mut moving = false;
        walk_region(then_region, &mut |op| {
            if let OpKind::Load {
                buffer: BufferRef::Operand(i),
                ..
            }
            | OpKind::Store {
                buffer: BufferRef::Operand(i),
                ..
            } = &op.kind
            {
                moving |= self.plan.level[*i] >= level;
            }
        });
        if moving {
            return None;
        }
        let mut free = std::collections::BTreeSet::new();
        free_values(then_region, &mut HashSet::new(), &mut free);
        if !exact {
            free.insert(*cond);
        }
        let picked = pure_producers(&body.ops[..at], free.into_iter().collect())?;
        Some((at, picked))
    }

    /// Whether bool `cond` holds at `step` of the loop over grid dim `d`
    /// only: `Some(true)` when it is exactly [`Self::is_step`], `Some(false)`
    /// when it is a conjunction with that among its terms (the kernel's
    /// first step, `program_id(g) == 0 && program_id(d) == 0`, say, which
    /// is then evaluated with the step's index), `None` otherwise.
    pub(super) fn step_of(&self, cond: ValueId, d: usize, step: Step) -> Option<bool> {
        if self.is_step(cond, d, step) {
            return Some(true);
        }
        let mut terms = vec![cond];
        let mut found = false;
        while let Some(c) = terms.pop() {
            if terms.len() > 64 {
                return None;
            }
            match self.defs.get(&c).map(|o| &o.kind) {
                Some(OpKind::Binary {
                    op: BinaryOp::And,
                    lhs,
                    rhs,
                }) if self.k.body.ty(c).is_some_and(|t| t.shape.is_empty()) => {
                    terms.extend([*lhs, *rhs]);
                }
                _ => found |= self.is_step(c, d, step),
            }
        }
        found.then_some(false)
    }

    /// Whether bool `cond` is `program_id(d) == 0` (first) or
    /// `program_id(d) == num_programs(d) - 1` (last).
    pub(super) fn is_step(&self, cond: ValueId, d: usize, step: Step) -> bool {
        let bound = self.k.grid.dims[d].bound as i64;
        let want = match step {
            Step::First => 0,
            Step::Last => bound - 1,
        };
        let def = |v: &ValueId| self.defs.get(v).map(|o| &o.kind);
        let is_pid = |v: &ValueId| matches!(def(v), Some(OpKind::ProgramId { dim }) if *dim == d);
        let is_want = |v: &ValueId| match def(v) {
            Some(OpKind::Constant {
                value: Literal::Int(c),
                ty,
            }) => ty.shape.is_empty() && *c == want,
            Some(OpKind::Binary {
                op: BinaryOp::Sub,
                lhs,
                rhs,
            }) => {
                step == Step::Last
                    && matches!(def(lhs), Some(OpKind::NumPrograms { dim }) if *dim == d)
                    && matches!(
                        def(rhs),
                        Some(OpKind::Constant {
                            value: Literal::Int(1),
                            ..
                        })
                    )
            }
            _ => false,
        };
        match def(&cond) {
            Some(OpKind::Compare {
                op: CompareOp::Eq,
                lhs,
                rhs,
            }) => (is_pid(lhs) && is_want(rhs)) || (is_pid(rhs) && is_want(lhs)),
            _ => false,
        }
    }
}
