//! Scoped buffers and semaphores belong to one `scope` op and are used only
//! inside it.

use crate::error::{ErrorKind, KernelError};
use crate::{BufferRef, Kernel, OpKind, Region};

pub(super) fn check(k: &Kernel) -> Vec<KernelError> {
    let mut c = Checker {
        k,
        owner: (vec![0; k.scratch.len()], vec![0; k.semaphores.len()]),
        open: (
            vec![false; k.scratch.len()],
            vec![false; k.semaphores.len()],
        ),
        errors: Vec::new(),
    };
    c.region(&k.body.region);
    let decl = |what: &str, name: &str, loc: &Option<crate::Loc>, n: usize| {
        KernelError::new(
            ErrorKind::Dma {
                op: "scope",
                detail: format!(
                    "scoped {what} `{name}` is allocated by {n} scope ops; declare it in exactly one `scoped` block"
                ),
            },
            loc.clone(),
        )
    };
    for (i, s) in k.scratch.iter().enumerate() {
        if s.scoped && c.owner.0[i] != 1 {
            c.errors.push(decl("buffer", &s.name, &s.loc, c.owner.0[i]));
        }
    }
    for (i, s) in k.semaphores.iter().enumerate() {
        if s.scoped && c.owner.1[i] != 1 {
            c.errors
                .push(decl("semaphores", &s.name, &s.loc, c.owner.1[i]));
        }
    }
    c.errors
}

struct Checker<'a> {
    k: &'a Kernel,
    /// How many scope ops allocate each scratch buffer and semaphore array.
    owner: (Vec<usize>, Vec<usize>),
    /// Whether each is allocated at the current point.
    open: (Vec<bool>, Vec<bool>),
    errors: Vec<KernelError>,
}

impl Checker<'_> {
    fn outside(&mut self, op: &crate::Op, name: &str) {
        self.errors.push(KernelError::new(
            ErrorKind::Dma {
                op: op.kind.mnemonic(),
                detail: format!(
                    "`{name}` is allocated by a `scoped` block and exists only inside it; use it there, or declare it as kernel scratch"
                ),
            },
            op.loc.clone(),
        ));
    }

    fn buffer(&mut self, op: &crate::Op, b: BufferRef) {
        if let BufferRef::Scratch(i) = b
            && let Some(s) = self.k.scratch.get(i)
            && s.scoped
            && !self.open.0[i]
        {
            let name = s.name.clone();
            self.outside(op, &name);
        }
    }

    fn sem(&mut self, op: &crate::Op, s: &crate::SemaphoreSlot) {
        if let Some(a) = self.k.semaphores.get(s.array)
            && a.scoped
            && !self.open.1[s.array]
        {
            let name = a.name.clone();
            self.outside(op, &name);
        }
    }

    fn region(&mut self, r: &Region) {
        for op in &r.ops {
            match &op.kind {
                OpKind::Load { buffer, .. } | OpKind::Store { buffer, .. } => {
                    self.buffer(op, *buffer)
                }
                OpKind::DmaStart(c) | OpKind::DmaWait(c) => {
                    self.buffer(op, c.src.buffer);
                    self.buffer(op, c.dst.buffer);
                    self.sem(op, &c.sem);
                }
                OpKind::SemSignal { sem, .. }
                | OpKind::SemWait { sem, .. }
                | OpKind::SemRead { sem } => self.sem(op, sem),
                OpKind::Scope {
                    scratch,
                    semaphores,
                    body,
                } => {
                    let mut bad = false;
                    for &i in scratch {
                        bad |= i >= self.owner.0.len();
                    }
                    for &i in semaphores {
                        bad |= i >= self.owner.1.len();
                    }
                    if bad {
                        // The typing pass reports what does not exist.
                        continue;
                    }
                    for &i in scratch {
                        self.owner.0[i] += 1;
                        self.open.0[i] = true;
                    }
                    for &i in semaphores {
                        self.owner.1[i] += 1;
                        self.open.1[i] = true;
                    }
                    self.region(body);
                    for &i in scratch {
                        self.open.0[i] = false;
                    }
                    for &i in semaphores {
                        self.open.1[i] = false;
                    }
                    continue;
                }
                _ => {}
            }
            for sub in op.kind.regions() {
                self.region(sub);
            }
        }
    }
}
