//! SSA scoping and typing of the body.

use crate::error::{ErrorKind, KernelError};
use crate::infer::result_types;
use crate::limits::MAX_TILE_ELEMENTS;
use crate::{Kernel, Region, TileType, ValueId};

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let mut c = Checker {
        k,
        visible: vec![false; k.body.values.len()],
        defined: vec![false; k.body.values.len()],
        errors: Vec::new(),
    };
    let top = &k.body.region;
    if !top.args.is_empty() || !top.yields.is_empty() {
        c.errors.push(KernelError::new(
            ErrorKind::Yield {
                op: "kernel body",
                detail: "the top-level region takes no args and yields nothing".into(),
            },
            k.loc.clone(),
        ));
    }
    c.region(top);
    c.errors
}

struct Checker<'a> {
    k: &'a Kernel,
    /// In scope at the current point.
    visible: Vec<bool>,
    /// Defined anywhere so far (SSA: at most once).
    defined: Vec<bool>,
    errors: Vec<KernelError>,
}

impl Checker<'_> {
    /// Marks `v` defined and visible; false (with an error) if it cannot be.
    fn define(&mut self, v: ValueId, loc: &Option<crate::Loc>) -> bool {
        match self.defined.get_mut(v.index()) {
            Some(d) if !*d => {
                *d = true;
                self.visible[v.index()] = true;
                true
            }
            Some(_) => {
                self.errors.push(KernelError::new(
                    ErrorKind::RedefinedValue { id: v.0 },
                    loc.clone(),
                ));
                false
            }
            None => {
                self.errors.push(KernelError::new(
                    ErrorKind::UndefinedValue { id: v.0 },
                    loc.clone(),
                ));
                false
            }
        }
    }

    fn region(&mut self, r: &Region) -> bool {
        let mut scope: Vec<ValueId> = Vec::new();
        let mut ok = true;
        for &a in &r.args {
            if self.define(a, &None) {
                scope.push(a);
            } else {
                ok = false;
            }
        }
        for op in &r.ops {
            let mut op_ok = true;
            for v in op.kind.operands() {
                if !self.visible.get(v.index()).copied().unwrap_or(false) {
                    self.errors.push(KernelError::new(
                        ErrorKind::UndefinedValue { id: v.0 },
                        op.loc.clone(),
                    ));
                    op_ok = false;
                }
            }
            for sub in op.kind.regions() {
                op_ok &= self.region(sub);
            }
            if op_ok {
                let values = &self.k.body.values;
                let lookup = |v: ValueId| -> Result<TileType, ErrorKind> {
                    values
                        .get(v.index())
                        .cloned()
                        .ok_or(ErrorKind::UndefinedValue { id: v.0 })
                };
                match result_types(self.k, &op.kind, &lookup) {
                    Ok(types) => {
                        if types.len() != op.results.len() {
                            self.errors.push(KernelError::new(
                                ErrorKind::Shape {
                                    op: op.kind.mnemonic(),
                                    detail: format!(
                                        "the op has {} results but {} were recorded",
                                        types.len(),
                                        op.results.len()
                                    ),
                                },
                                op.loc.clone(),
                            ));
                        }
                        for (t, v) in types.iter().zip(&op.results) {
                            let elements = t
                                .shape
                                .iter()
                                .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
                            if elements.is_none_or(|n| n > MAX_TILE_ELEMENTS) {
                                self.errors.push(KernelError::new(
                                    ErrorKind::Limit {
                                        what: format!(
                                            "{v} = {}, a {t}, in elements",
                                            op.kind.mnemonic()
                                        ),
                                        value: elements
                                            .map_or("2^64 or more".into(), |n| n.to_string()),
                                        limit: MAX_TILE_ELEMENTS,
                                        name: "MAX_TILE_ELEMENTS",
                                        fix: "use smaller blocks or tiles".into(),
                                    },
                                    op.loc.clone(),
                                ));
                                op_ok = false;
                            }
                            if let Some(recorded) = values.get(v.index())
                                && recorded != t
                            {
                                self.errors.push(KernelError::new(
                                    ErrorKind::Shape {
                                        op: op.kind.mnemonic(),
                                        detail: format!(
                                            "{v} is recorded as {recorded} but the op produces {t}"
                                        ),
                                    },
                                    op.loc.clone(),
                                ));
                            }
                        }
                    }
                    Err(kind) => {
                        self.errors.push(KernelError::new(kind, op.loc.clone()));
                        op_ok = false;
                    }
                }
            }
            ok &= op_ok;
            for &v in &op.results {
                if self.define(v, &op.loc) {
                    scope.push(v);
                }
            }
        }
        for &y in &r.yields {
            if !self.visible.get(y.index()).copied().unwrap_or(false) {
                self.errors.push(KernelError::new(
                    ErrorKind::UndefinedValue { id: y.0 },
                    None,
                ));
                ok = false;
            }
        }
        for v in scope {
            self.visible[v.index()] = false;
        }
        ok
    }
}
