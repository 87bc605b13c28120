//! The pass that makes copies synchronous: what a back end without DMA
//! engines runs (the upstream kernel module, the host JIT, decomposed
//! StableHLO).
//!
//! * `dma_start` becomes a load of the source and a store to the
//!   destination; `dma_wait` disappears, and so do DMA semaphores. A
//!   kernel the interpreter accepts never touches a copy's buffers between
//!   start and wait, so copying at the start gives the same answers.
//! * Regular semaphores become SMEM i32 scratch (rank 0 as `[1]`), zeroed
//!   at the first step of each parallel group; signal adds, wait
//!   subtracts, read loads.
//! * `scope` bodies are inlined and their buffers become kernel scratch.
//! * In a kernel across chips, a remote copy's start stays (an SPMD back
//!   end delivers it on every device at that point, as one collective);
//!   its waits, remote signals and the barrier go: with every copy
//!   complete at its start they order nothing. A regular semaphore that
//!   other devices signal then only counts its local signals and waits.

use crate::verify::VerifiedKernel;
use crate::{
    BinaryOp, BufferRef, CompareOp, DType, Index, IndexValue, Kernel, Literal, MemorySpace, Op,
    OpKind, Region, Scratch, SemaphoreKind, SemaphoreSlot, TileType, ValueId,
};

impl VerifiedKernel {
    /// True when the body copies, uses semaphores or scopes.
    pub fn moves_data_itself(&self) -> bool {
        let mut found = !self.semaphores.is_empty();
        self.body.walk(&mut |op| {
            found |= matches!(
                op.kind,
                OpKind::DmaStart(_)
                    | OpKind::DmaWait(_)
                    | OpKind::DmaWaitSend(_)
                    | OpKind::RemoteSignal { .. }
                    | OpKind::SemSignal { .. }
                    | OpKind::SemWait { .. }
                    | OpKind::SemRead { .. }
                    | OpKind::Scope { .. }
            );
        });
        found
    }

    /// The kernel with copies made synchronous and semaphores as scratch
    /// counters (see the module docs): the same answers, with no DMA,
    /// semaphore or scope op left. Returns a copy of the kernel when it
    /// has none.
    pub fn with_synchronous_copies(&self) -> VerifiedKernel {
        if !self.moves_data_itself() {
            return self.clone();
        }
        let mut k: Kernel = self.kernel().clone();
        for s in &mut k.scratch {
            s.scoped = false;
        }
        // Semaphore array -> the scratch index of its counter.
        let mut counter = vec![None; k.semaphores.len()];
        for (i, s) in k.semaphores.iter().enumerate() {
            if s.kind == SemaphoreKind::Regular {
                counter[i] = Some(k.scratch.len());
                k.scratch.push(Scratch {
                    name: s.name.clone(),
                    dtype: DType::I32,
                    shape: if s.shape.is_empty() {
                        vec![1]
                    } else {
                        s.shape.clone()
                    },
                    space: MemorySpace::Smem,
                    scoped: false,
                    loc: s.loc.clone(),
                });
            }
        }
        k.semaphores.clear();
        let values = std::mem::take(&mut k.body.values);
        let region = std::mem::take(&mut k.body.region);
        let dtypes = |b: BufferRef| k.buffer(b).map_or(DType::F32, |x| x.1);
        let mut p = Pass {
            values,
            counter,
            dtype: &dtypes,
        };
        let mut top = p.region(region);
        let init = p.zero_counters(&k);
        top.ops.splice(0..0, init);
        let values = p.values;
        k.body.values = values;
        k.body.region = top;
        VerifiedKernel::trusted(k)
    }
}

struct Pass<'a> {
    values: Vec<TileType>,
    counter: Vec<Option<usize>>,
    dtype: &'a dyn Fn(BufferRef) -> DType,
}

type Loc = Option<crate::Loc>;

impl Pass<'_> {
    fn op(&mut self, out: &mut Vec<Op>, kind: OpKind, ty: Option<TileType>, loc: &Loc) -> ValueId {
        let mut results = Vec::new();
        if let Some(t) = ty {
            self.values.push(t);
            results.push(ValueId(self.values.len() as u32 - 1));
        }
        let r = results.first().copied().unwrap_or(ValueId(u32::MAX));
        out.push(Op {
            kind,
            results,
            loc: loc.clone(),
        });
        r
    }

    fn i32_const(&mut self, out: &mut Vec<Op>, v: i64, loc: &Loc) -> ValueId {
        let ty = TileType::scalar(DType::I32);
        let kind = OpKind::Constant {
            value: Literal::Int(v),
            ty: ty.clone(),
        };
        self.op(out, kind, Some(ty), loc)
    }

    /// The counter of a regular semaphore: its scratch buffer and indices.
    fn counter(&self, s: &SemaphoreSlot) -> (BufferRef, Vec<Index>) {
        let buffer = BufferRef::Scratch(self.counter[s.array].unwrap_or(usize::MAX));
        let indices = if s.at.is_empty() {
            vec![Index::Point(IndexValue::Static(0))]
        } else {
            s.at.iter().map(|i| Index::Point(*i)).collect()
        };
        (buffer, indices)
    }

    fn region(&mut self, r: Region) -> Region {
        let mut ops = Vec::with_capacity(r.ops.len());
        for op in r.ops {
            self.rewrite(op, &mut ops);
        }
        Region {
            args: r.args,
            ops,
            yields: r.yields,
        }
    }

    fn rewrite(&mut self, op: Op, out: &mut Vec<Op>) {
        let loc = op.loc;
        let kind = match op.kind {
            // A copy to another device stays as a start: a single-device
            // lowering refuses it, naming the op, and an SPMD one delivers
            // it to every device at once (a collective), so its waits and
            // the remote signals that order it have nothing left to do.
            k @ OpKind::DmaStart(crate::CopyDescriptor {
                remote: Some(_), ..
            }) => {
                out.push(Op {
                    kind: k,
                    results: op.results,
                    loc,
                });
                return;
            }
            OpKind::DmaWait(_) | OpKind::DmaWaitSend(_) | OpKind::RemoteSignal { .. } => return,
            // The barrier has no counter: with copies delivered at their
            // start, meeting at it orders nothing.
            OpKind::SemSignal { sem, .. } | OpKind::SemWait { sem, .. }
                if self.counter[sem.array].is_none() =>
            {
                return;
            }
            OpKind::DmaStart(c) => {
                let ty = TileType::new((self.dtype)(c.src.buffer), c.src.shape());
                let load = OpKind::Load {
                    buffer: c.src.buffer,
                    indices: c.src.indices,
                    mask: None,
                };
                let value = self.op(out, load, Some(ty), &loc);
                let store = OpKind::Store {
                    buffer: c.dst.buffer,
                    indices: c.dst.indices,
                    value,
                    mask: None,
                };
                self.op(out, store, None, &loc);
                return;
            }
            OpKind::SemSignal { sem, amount } => {
                return self.count(out, &sem, amount, BinaryOp::Add, &loc);
            }
            OpKind::SemWait { sem, amount } => {
                return self.count(out, &sem, amount, BinaryOp::Sub, &loc);
            }
            OpKind::SemRead { sem } => {
                let (buffer, indices) = self.counter(&sem);
                OpKind::Load {
                    buffer,
                    indices,
                    mask: None,
                }
            }
            OpKind::Scope { body, .. } => {
                out.extend(self.region(body).ops);
                return;
            }
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                unroll,
            } => OpKind::For {
                lower,
                upper,
                step,
                init,
                body: self.region(body),
                unroll,
            },
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => OpKind::If {
                cond,
                then_region: self.region(then_region),
                else_region: self.region(else_region),
            },
            kind => kind,
        };
        out.push(Op {
            kind,
            results: op.results,
            loc,
        });
    }

    /// `counter = counter op amount`.
    fn count(
        &mut self,
        out: &mut Vec<Op>,
        sem: &SemaphoreSlot,
        amount: IndexValue,
        op: BinaryOp,
        loc: &Loc,
    ) {
        let (buffer, indices) = self.counter(sem);
        let i32 = TileType::scalar(DType::I32);
        let load = OpKind::Load {
            buffer,
            indices: indices.clone(),
            mask: None,
        };
        let v = self.op(out, load, Some(i32.clone()), loc);
        let n = match amount {
            IndexValue::Static(n) => self.i32_const(out, n, loc),
            IndexValue::Dynamic(n) => n,
        };
        let next = self.op(out, OpKind::Binary { op, lhs: v, rhs: n }, Some(i32), loc);
        let store = OpKind::Store {
            buffer,
            indices,
            value: next,
            mask: None,
        };
        self.op(out, store, None, loc);
    }

    /// Stores zero into every counter at the first step of each parallel
    /// group (every grid dim inner to the innermost parallel dim at 0; with
    /// no parallel dim, the first step): the host JIT gives each group its
    /// own scratch, and a kernel the interpreter accepts has its counters
    /// at zero whenever a parallel index changes, so this changes nothing
    /// for it.
    fn zero_counters(&mut self, k: &Kernel) -> Vec<Op> {
        let counters: Vec<usize> = self.counter.iter().flatten().copied().collect();
        if counters.is_empty() {
            return Vec::new();
        }
        let loc: Loc = None;
        let mut stores = Vec::new();
        for &s in &counters {
            let shape = k.scratch[s].shape.clone();
            let ty = TileType::new(DType::I32, shape.clone());
            let kind = OpKind::Constant {
                value: Literal::Int(0),
                ty: ty.clone(),
            };
            let zero = self.op(&mut stores, kind, Some(ty), &loc);
            let indices = shape
                .iter()
                .map(|&n| Index::Slice {
                    start: IndexValue::Static(0),
                    len: n,
                })
                .collect();
            let store = OpKind::Store {
                buffer: BufferRef::Scratch(s),
                indices,
                value: zero,
                mask: None,
            };
            self.op(&mut stores, store, None, &loc);
        }
        let innermost_parallel = (0..k.grid.rank())
            .rev()
            .find(|&d| k.grid.dims[d].semantics.is_parallel());
        let dims: Vec<usize> = match innermost_parallel {
            Some(p) => (p + 1..k.grid.rank()).collect(),
            None => (0..k.grid.rank()).collect(),
        };
        if dims.is_empty() {
            return stores;
        }
        let mut out = Vec::new();
        let zero = self.i32_const(&mut out, 0, &loc);
        let boolean = TileType::scalar(DType::Bool);
        let mut cond = None;
        for d in dims {
            let pid = self.op(
                &mut out,
                OpKind::ProgramId { dim: d },
                Some(TileType::scalar(DType::I32)),
                &loc,
            );
            let first = OpKind::Compare {
                op: CompareOp::Eq,
                lhs: pid,
                rhs: zero,
            };
            let c = self.op(&mut out, first, Some(boolean.clone()), &loc);
            cond = Some(match cond {
                None => c,
                Some(prev) => {
                    let and = OpKind::Binary {
                        op: BinaryOp::And,
                        lhs: prev,
                        rhs: c,
                    };
                    self.op(&mut out, and, Some(boolean.clone()), &loc)
                }
            });
        }
        let kind = OpKind::If {
            cond: cond.unwrap_or(zero),
            then_region: Region {
                args: Vec::new(),
                ops: stores,
                yields: Vec::new(),
            },
            else_region: Region::default(),
        };
        self.op(&mut out, kind, None, &loc);
        out
    }
}
