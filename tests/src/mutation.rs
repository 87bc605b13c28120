//! Random mutations of valid kernels: any field of the signature, any
//! operand of any op, shapes, types, index maps, grids, scratch, prefetch,
//! op order. The result may be invalid in any way; the mutation test
//! (`tests/it/language/random_kernels.rs`) holds the verifier and interpreter to
//! never panicking on it, and the TPU differential test
//! (`tests/it/targets/tpu_compile.rs`) compiles the ones that still verify.

use kernel_ir::prelude::*;
use kernel_ir::{
    Index, IndexExpr, IndexValue, Kernel, OpKind, Region, SplitMix64, TileType, ValueId,
};
use kernels::foundation::*;
use kernels::norm::{NormConfig, layer_norm};

use crate::random_kernel::RandomKernel;

/// The kernels mutations start from: foundation kernels and one with
/// scalar prefetch, a loop and a branch.
pub fn seed_kernels() -> Vec<Kernel> {
    let mm = |m, n, k| MatmulConfig {
        m,
        n,
        k,
        bm: 8,
        bn: 128,
        bk: 128,
        dtype: F32,
        out_dtype: F32,
    };
    let mut ks = vec![
        matmul(&mm(16, 128, 256)).unwrap().into_kernel(),
        matmul(&mm(8, 128, 200)).unwrap().into_kernel(),
        softmax(&SoftmaxConfig {
            rows: 32,
            cols: 128,
            block_rows: 16,
            dtype: BF16,
        })
        .unwrap()
        .into_kernel(),
        layer_norm(&NormConfig {
            rows: 16,
            cols: 128,
            block_rows: 8,
            eps: 1e-5,
            dtype: F32,
        })
        .unwrap()
        .into_kernel(),
        add(&AddConfig {
            rows: 16,
            cols: 256,
            block_rows: 8,
            block_cols: 128,
            dtype: F32,
        })
        .unwrap()
        .into_kernel(),
    ];
    // One with scalar prefetch, a loop and a branch.
    let mut k = KernelBuilder::new("loop");
    k.grid([2], [Arbitrary]);
    let t = k.scalar_prefetch("t", [2]);
    let x = k
        .input("x", F32, [16, 128])
        .block([8, 128], |[i]| (t.at(i), 0));
    let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
    let s = for_range(0, 3, x.load(..), |i, acc| {
        if_else(
            i.eq(1),
            || acc * 2.0,
            || acc + t.load([ds(0, 1)]).convert(F32).sum_all(),
        )
    });
    o.store(.., s);
    ks.push(k.finish().unwrap());
    // Kernels across chips: a ring all-gather in a kernel loop, the
    // collective matmul's handshake, the all-to-all, and the barrier.
    use kernels::collective::*;
    ks.push(all_gather(F32, 4, 8, 128).unwrap().into_kernel());
    let dims = all_gather_matmul_kernel::Dims {
        m: 8,
        k: 128,
        n: 128,
    };
    ks.push(
        all_gather_matmul_kernel::build_for(F32, 4, Protocol::Handshake, dims)
            .unwrap()
            .into_kernel(),
    );
    ks.push(all_to_all(F32, 4, 8, 128).unwrap().into_kernel());
    let barrier = include_str!("../filetests/lower/barrier-handshake-tpu-custom-call.kir");
    ks.push(kernel_ir::parse(barrier).unwrap());
    ks
}

/// One random change to what makes a kernel span chips: the mesh's size
/// or presence, a remote copy's or signal's device, a copy's semaphores.
fn mutate_mesh(k: &mut Kernel, r: &mut SplitMix64) {
    let device = |r: &mut SplitMix64| IndexValue::Static(r.below(10) as i64 - 2);
    match r.below(4) {
        0 => match &mut k.mesh {
            Some(m) if r.below(3) > 0 => {
                let a = r
                    .below(m.axes.len().max(1))
                    .min(m.axes.len().saturating_sub(1));
                if let Some(axis) = m.axes.get_mut(a) {
                    axis.1 = pick(r, &[0, 1, 2, 3, 4, 8, 300]);
                }
            }
            Some(_) => k.mesh = None,
            None => {
                k.mesh = Some(kernel_ir::Mesh {
                    axes: vec![("x".into(), pick(r, &[1, 2, 4]))],
                    loc: None,
                })
            }
        },
        _ => {
            let Some(kind) = random_op(k, r) else {
                return;
            };
            let pick_slot = |r: &mut SplitMix64, s: &mut kernel_ir::SemaphoreSlot| {
                s.array = r.below(5);
                if let Some(i) = s.at.first_mut() {
                    *i = IndexValue::Static(r.below(5) as i64 - 1);
                }
            };
            match kind {
                OpKind::DmaStart(c) | OpKind::DmaWait(c) | OpKind::DmaWaitSend(c) => {
                    match (&mut c.remote, r.below(3)) {
                        (Some(remote), 0) => remote.device = device(r),
                        (Some(remote), 1) => pick_slot(r, &mut remote.send_sem),
                        (Some(_), _) => c.remote = None,
                        (None, 0) => pick_slot(r, &mut c.sem),
                        (None, _) => {
                            c.remote = Some(kernel_ir::RemoteTarget {
                                device: device(r),
                                send_sem: c.sem.clone(),
                            })
                        }
                    }
                }
                OpKind::RemoteSignal { device: d, sem, .. } => {
                    if r.below(2) == 0 {
                        *d = device(r);
                    } else {
                        pick_slot(r, sem);
                    }
                }
                OpKind::SemSignal { sem, .. } | OpKind::SemWait { sem, .. } => pick_slot(r, sem),
                _ => {}
            }
        }
    }
}

const DIMS: [usize; 8] = [0, 1, 3, 8, 16, 100, 128, 256];

fn pick<T: Clone>(r: &mut SplitMix64, xs: &[T]) -> T {
    xs[r.below(xs.len())].clone()
}

fn random_expr(r: &mut SplitMix64, depth: u32) -> IndexExpr {
    match r.below(if depth == 0 { 3 } else { 5 }) {
        0 => IndexExpr::Const(r.below(6) as i64 - 2),
        1 => IndexExpr::Grid(r.below(4)),
        2 => IndexExpr::Prefetch {
            operand: r.below(3),
            at: vec![IndexExpr::Grid(r.below(2)); r.below(3)],
        },
        3 => random_expr(r, depth - 1) / random_expr(r, depth - 1),
        _ => random_expr(r, depth - 1) * 3 + random_expr(r, depth - 1),
    }
}

fn count_ops(r: &Region) -> usize {
    r.ops
        .iter()
        .map(|op| {
            1 + op
                .kind
                .regions()
                .iter()
                .map(|r| count_ops(r))
                .sum::<usize>()
        })
        .sum()
}

/// The `n`-th op in walk order.
fn nth_op<'a>(r: &'a mut Region, n: &mut usize) -> Option<&'a mut OpKind> {
    for op in &mut r.ops {
        if *n == 0 {
            return Some(&mut op.kind);
        }
        *n -= 1;
        match &mut op.kind {
            OpKind::For { body, .. } => {
                if let Some(k) = nth_op(body, n) {
                    return Some(k);
                }
            }
            OpKind::If {
                then_region,
                else_region,
                ..
            } => {
                if let Some(k) = nth_op(then_region, n) {
                    return Some(k);
                }
                if let Some(k) = nth_op(else_region, n) {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

fn random_op<'a>(k: &'a mut Kernel, r: &mut SplitMix64) -> Option<&'a mut OpKind> {
    let total = count_ops(&k.body.region);
    if total == 0 {
        return None;
    }
    let mut n = r.below(total);
    nth_op(&mut k.body.region, &mut n)
}

/// Applies one random mutation to `k`.
pub fn mutate(k: &mut Kernel, r: &mut SplitMix64) {
    let nvals = k.body.values.len() as u32 + 3;
    match r.below(12) {
        0 if !k.operands.is_empty() => {
            let o = r.below(k.operands.len());
            let op = &mut k.operands[o];
            match r.below(5) {
                0 if !op.shape.is_empty() => {
                    let d = r.below(op.shape.len());
                    op.shape[d] = pick(r, &DIMS)
                }
                1 if !op.block.shape.is_empty() => {
                    let d = r.below(op.block.shape.len());
                    op.block.shape[d] = pick(r, &DIMS)
                }
                2 if !op.block.index_map.exprs.is_empty() => {
                    let d = r.below(op.block.index_map.exprs.len());
                    op.block.index_map.exprs[d] = random_expr(r, 2);
                }
                3 => {
                    op.layout = Layout::minor_to_major(
                        (0..r.below(4)).map(|_| r.below(3)).collect::<Vec<_>>(),
                    )
                    .with_align(pick(r, &[0, 1, 3, 128, 512]))
                }
                _ => op.space = pick(r, &[MemorySpace::Vmem, MemorySpace::Smem, MemorySpace::Any]),
            }
        }
        1 => {
            let v = ValueId(r.below(nvals as usize) as u32);
            let Some(kind) = random_op(k, r) else { return };
            match kind {
                OpKind::Unary { x, .. }
                | OpKind::Convert { x, .. }
                | OpKind::Bitcast { x, .. }
                | OpKind::Reshape { x, .. }
                | OpKind::Transpose { x, .. }
                | OpKind::Reduce { x, .. }
                | OpKind::BroadcastInDim { x, .. } => *x = v,
                OpKind::Binary { lhs, rhs, .. }
                | OpKind::Compare { lhs, rhs, .. }
                | OpKind::Dot { lhs, rhs, .. } => {
                    if r.below(2) == 0 {
                        *lhs = v
                    } else {
                        *rhs = v
                    }
                }
                OpKind::Store { value, .. } => *value = v,
                OpKind::Load { mask, .. } => *mask = Some(v),
                OpKind::If { cond, .. } => *cond = v,
                OpKind::For { init, upper, .. } => {
                    if init.is_empty() || r.below(2) == 0 {
                        *upper = IndexValue::Dynamic(v)
                    } else {
                        init[0] = v
                    }
                }
                _ => {}
            }
        }
        2 => {
            let vec = (0..r.below(4)).map(|_| r.below(4)).collect::<Vec<_>>();
            let which = [
                kernel_ir::BufferRef::Operand(r.below(5)),
                kernel_ir::BufferRef::Scratch(r.below(2)),
                kernel_ir::BufferRef::Prefetch(r.below(2)),
            ];
            let Some(kind) = random_op(k, r) else { return };
            match kind {
                OpKind::Reduce { axes, .. } => *axes = vec,
                OpKind::Transpose { perm, .. } => *perm = vec,
                OpKind::BroadcastInDim { dims, shape, .. } => {
                    if r.below(2) == 0 {
                        *dims = vec
                    } else {
                        *shape = vec.iter().map(|&d| DIMS[d]).collect()
                    }
                }
                OpKind::Reshape { shape, .. } => {
                    *shape = vec.iter().map(|&d| DIMS[d + 1]).collect()
                }
                OpKind::Dot { dims, acc, .. } => {
                    dims.lhs_contract = vec;
                    *acc = pick(r, &DType::ALL)
                }
                OpKind::Iota { dim, .. } | OpKind::ProgramId { dim } => *dim = r.below(4),
                OpKind::Constant { ty, .. } => ty.dtype = pick(r, &DType::ALL),
                OpKind::Load {
                    buffer, indices, ..
                }
                | OpKind::Store {
                    buffer, indices, ..
                } => {
                    if r.below(2) == 0 {
                        *buffer = pick(r, &which);
                    } else if !indices.is_empty() {
                        let d = r.below(indices.len());
                        indices[d] = match r.below(3) {
                            0 => Index::Point(IndexValue::Static(r.below(300) as i64 - 3)),
                            1 => Index::Slice {
                                start: IndexValue::Dynamic(ValueId(r.below(nvals as usize) as u32)),
                                len: pick(r, &DIMS),
                            },
                            _ => Index::Slice {
                                start: IndexValue::Static(r.below(5) as i64),
                                len: pick(r, &DIMS),
                            },
                        };
                    }
                }
                OpKind::For { lower, step, .. } => {
                    *lower = IndexValue::Static(r.below(6) as i64 - 3);
                    *step = r.below(3) as i64 - 1
                }
                _ => {}
            }
        }
        3 if !k.body.values.is_empty() => {
            let v = r.below(k.body.values.len());
            k.body.values[v] =
                TileType::new(pick(r, &DType::ALL), vec![pick(r, &DIMS); r.below(3)]);
        }
        4 => {
            if k.grid.dims.is_empty() || r.below(3) == 0 {
                k.grid.dims.push(kernel_ir::GridDim {
                    bound: r.below(4),
                    semantics: Parallel,
                });
            } else {
                let d = r.below(k.grid.dims.len());
                k.grid.dims[d].bound = r.below(5);
                k.grid.dims[d].semantics = pick(r, &[Parallel, Arbitrary]);
            }
        }
        5 => k.scratch.push(kernel_ir::Scratch {
            name: pick(r, &["acc", "s2", "9bad"]).to_string(),
            dtype: pick(r, &DType::ALL),
            shape: vec![pick(r, &DIMS); r.below(3)],
            space: pick(r, &[MemorySpace::Vmem, MemorySpace::Smem, MemorySpace::Any]),
            // A scoped buffer no scope allocates must be rejected.
            scoped: r.below(4) == 0,
            loc: None,
        }),
        6 => k.prefetch.push(kernel_ir::ScalarPrefetch {
            name: pick(r, &["p", "t", "x"]).to_string(),
            dtype: pick(r, &DType::ALL),
            shape: vec![pick(r, &DIMS[..5]); r.below(2) + 1],
            loc: None,
        }),
        7 if !k.body.region.ops.is_empty() => {
            let i = r.below(k.body.region.ops.len());
            let op = k.body.region.ops.remove(i);
            let j = r.below(k.body.region.ops.len() + 1);
            k.body.region.ops.insert(j, op);
        }
        8 => k.vmem_limit = Some(pick(r, &[0, 1 << 20, 1 << 40])),
        9 if !k.operands.is_empty() => {
            let o = r.below(k.operands.len());
            k.operands[o].role = pick(
                r,
                &[
                    kernel_ir::Role::In,
                    kernel_ir::Role::Out,
                    kernel_ir::Role::InOut,
                ],
            );
            k.operands[o].dtype = pick(r, &DType::ALL);
        }
        10 => k.target = pick(r, &Target::ALL),
        11 if k.mesh.is_some() || r.below(8) == 0 => mutate_mesh(k, r),
        _ => {
            if let Some(op) = k.body.region.ops.last_mut() {
                op.results.push(ValueId(r.below(nvals as usize) as u32));
            }
        }
    }
}

/// Mutated kernel `seed`: a seed kernel with one to three mutations.
pub fn mutated_kernel(seed: u64) -> RandomKernel {
    let mut ks = seed_kernels();
    let which = (seed % ks.len() as u64) as usize;
    let mut k = ks.swap_remove(which);
    let mut r = SplitMix64(seed ^ 0x6d75_7461_7465);
    let n = 1 + r.below(3);
    for _ in 0..n {
        mutate(&mut k, &mut r);
    }
    RandomKernel {
        seed,
        target: k.target,
        ops: vec![format!(
            "seed kernel {which} ({}) with {n} mutations",
            k.name
        )],
        kernel: Ok(k),
    }
}
