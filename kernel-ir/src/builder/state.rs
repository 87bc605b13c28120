//! The per-thread stack of kernels under construction.
//!
//! Tiles and refs are `Copy` handles (a value id and a builder id) so that
//! kernel code reads like math: `(s - m).exp()`. The ops they record go to
//! the builder they belong to, found here.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{ErrorKind, KernelError};
use crate::infer::result_types;
use crate::{Kernel, Loc, Op, OpKind, Region, TileType, ValueId};

use super::Tile;

/// A kernel under construction.
pub(crate) struct State {
    pub id: u32,
    pub sig: Kernel,
    /// Type of every value; `None` after an op that failed to type, so
    /// that one mistake is reported once, not at every later use.
    pub values: Vec<Option<TileType>>,
    /// Open regions; `[0]` is the top level.
    pub regions: Vec<Region>,
    pub errors: Vec<KernelError>,
}

thread_local! {
    static STACK: RefCell<Vec<State>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

pub(crate) fn push(sig: Kernel) -> u32 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    STACK.with(|s| {
        s.borrow_mut().push(State {
            id,
            sig,
            values: Vec::new(),
            regions: vec![Region::default()],
            errors: Vec::new(),
        })
    });
    id
}

pub(crate) fn remove(id: u32) -> Option<State> {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        let pos = s.iter().position(|st| st.id == id)?;
        Some(s.remove(pos))
    })
}

/// The id of the innermost builder on this thread.
pub(crate) fn current() -> Option<u32> {
    STACK.with(|s| s.borrow().last().map(|st| st.id))
}

/// Runs `f` on builder `id`. If it does not exist (a tile outlived its
/// builder) the error goes to the innermost builder, and `f` does not run.
pub(crate) fn with<R>(id: u32, f: impl FnOnce(&mut State) -> R) -> Option<R> {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        if let Some(st) = s.iter_mut().find(|st| st.id == id) {
            return Some(f(st));
        }
        if let Some(top) = s.last_mut() {
            top.errors
                .push(KernelError::new(ErrorKind::ForeignTile, None));
        }
        None
    })
}

impl State {
    pub fn error(&mut self, kind: ErrorKind, loc: Option<Loc>) {
        self.errors.push(KernelError::new(kind, loc));
    }

    pub fn new_value(&mut self, ty: Option<TileType>) -> ValueId {
        self.values.push(ty);
        ValueId(self.values.len() as u32 - 1)
    }

    /// Checks that a tile belongs to this builder.
    pub fn own(&mut self, t: Tile, loc: &Loc) -> Option<ValueId> {
        if t.builder == self.id && t.id.index() < self.values.len() {
            Some(t.id)
        } else {
            self.error(ErrorKind::ForeignTile, Some(loc.clone()));
            None
        }
    }

    /// Types and records an op in the innermost open region; returns its
    /// results.
    pub fn push_op(&mut self, kind: OpKind, loc: Loc) -> Vec<ValueId> {
        let mut operands = kind.operands();
        for r in kind.regions() {
            operands.extend(&r.yields);
        }
        let known = operands
            .iter()
            .all(|v| self.values.get(v.index()).is_some_and(Option::is_some));
        let types: Vec<Option<TileType>> = if known {
            let values = &self.values;
            let lookup = |v: ValueId| {
                values
                    .get(v.index())
                    .cloned()
                    .flatten()
                    .ok_or(ErrorKind::UndefinedValue { id: v.0 })
            };
            match result_types(&self.sig, &kind, &lookup) {
                Ok(t) => t.into_iter().map(Some).collect(),
                Err(e) => {
                    self.error(e, Some(loc.clone()));
                    vec![None; result_count(&kind)]
                }
            }
        } else {
            vec![None; result_count(&kind)]
        };
        let results: Vec<ValueId> = types.into_iter().map(|t| self.new_value(t)).collect();
        let op = Op {
            kind,
            results: results.clone(),
            loc: Some(loc),
        };
        // The top-level region is never popped, so there is always one.
        if let Some(region) = self.regions.last_mut() {
            region.ops.push(op);
        }
        results
    }

    pub fn ty(&self, v: ValueId) -> Option<&TileType> {
        self.values.get(v.index()).and_then(Option::as_ref)
    }
}

fn result_count(kind: &OpKind) -> usize {
    match kind {
        OpKind::Store { .. }
        | OpKind::DmaStart(_)
        | OpKind::DmaWait(_)
        | OpKind::SemSignal { .. }
        | OpKind::SemWait { .. }
        | OpKind::Scope { .. } => 0,
        OpKind::For { init, .. } => init.len(),
        OpKind::If { then_region, .. } => then_region.yields.len(),
        _ => 1,
    }
}
