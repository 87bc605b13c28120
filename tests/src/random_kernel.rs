//! Random kernels for differential testing against the TPU compiler.
//!
//! [`random_kernel`] builds, from a seed, a kernel of the shapes and ops
//! kernel authors write: operands of rank 1 to 4 in every dtype, blocks
//! that are usually legal and sometimes not, layout hints, index maps that
//! read scalar prefetch, and a body of elementwise math, compares and
//! selects, conversions, reductions, reshapes, transposes, broadcasts,
//! dots, iota masks, masked loads and stores, loops, branches and scratch
//! carried over an `arbitrary` dim. Most come out valid; the verifier
//! decides. The point is the other direction: every kernel the verifier
//! accepts must compile with libtpu (`tests/it/targets/tpu_compile.rs`).

use kernel_ir::prelude::*;
use kernel_ir::{DimSemantics, Idx, Kernel, KernelErrors, ReduceOp, SplitMix64, Start};

/// A seeded choice.
type Choose = SplitMix64;

/// What a random kernel was built from, for reports.
#[derive(Clone, Debug)]
pub struct RandomKernel {
    /// The seed.
    pub seed: u64,
    /// The generation it was built for.
    pub target: Target,
    /// The ops of the body, in order (`unary`, `dot`, ...).
    pub ops: Vec<String>,
    /// The kernel, not yet verified (the builder's own errors are `Err`).
    pub kernel: Result<Kernel, KernelErrors>,
}

const DTYPES: [DType; 9] = [F32, F32, F32, BF16, BF16, F16, I32, I8, Bool];

/// One array dim with its block: (array, block).
fn minor_dim(c: &mut Choose) -> (usize, usize) {
    match c.below(10) {
        0 => (100, 100),
        1 => (64, 64),
        2 => (256, 256),
        3 => (384, 128),
        4 => (200, 128), // ragged last block
        5 => (256, 64),  // illegal unless the verifier is wrong
        6 => (1, 1),
        _ => (256, 128),
    }
}

fn second_minor_dim(c: &mut Choose, rows: usize) -> (usize, usize) {
    match c.below(10) {
        0 => (rows * 4, rows * 2),
        1 => (rows, rows),
        2 => (3, 3),
        3 => (1, 1),
        4 => (rows * 3 - 2, rows), // ragged
        5 => (rows * 4, 8),        // legal only for 32-bit types
        6 => (40, 40),
        _ => (rows * 4, rows),
    }
}

fn leading_dim(c: &mut Choose) -> (usize, usize) {
    match c.below(4) {
        0 => (2, 2),
        1 => (3, 1),
        _ => (2, 1),
    }
}

/// Builds the kernel for `seed`.
pub fn random_kernel(seed: u64) -> RandomKernel {
    let mut c = SplitMix64(seed ^ 0x7e55_e7a0_f00d);
    let target = c.pick(&Target::ALL);
    let dtype = c.pick(&DTYPES);
    let rank = 1 + c.below(4);
    let rows = 8 * dtype.packing();
    let mut shape = Vec::new();
    let mut block = Vec::new();
    for d in 0..rank {
        let (a, b) = if d + 1 == rank {
            minor_dim(&mut c)
        } else if d + 2 == rank {
            second_minor_dim(&mut c, rows)
        } else {
            leading_dim(&mut c)
        };
        shape.push(a);
        block.push(b);
    }
    if rank == 1 && c.chance(50) {
        // Rank-1 blocks: full, a multiple of 1024 or a power of two.
        let (a, b) = c.pick(&[
            (2048, 1024),
            (512, 256),
            (1024, 128),
            (300, 300),
            (512, 512),
        ]);
        shape[0] = a;
        block[0] = b;
    }
    let steps: Vec<usize> = shape
        .iter()
        .zip(&block)
        .map(|(a, b)| a.div_ceil(*b))
        .collect();
    let mut ops = Vec::new();
    let mut k = KernelBuilder::new("random");
    k.target(target);
    // An extra `arbitrary` dim accumulates into scratch over its steps.
    let accumulate = c.chance(20);
    let mut grid: Vec<(usize, DimSemantics)> = steps
        .iter()
        .map(|&s| (s, if c.chance(20) { Arbitrary } else { Parallel }))
        .collect();
    if accumulate {
        grid.push((2, Arbitrary));
    }
    k.grid_dims(&grid);
    let table = if c.chance(20) {
        Some(k.scalar_prefetch("table", [steps[0].max(1)]))
    } else {
        None
    };
    let map = |c: &mut Choose| -> Vec<IndexExpr> {
        (0..rank)
            .map(|d| match (d, &table) {
                (0, Some(t)) if c.chance(50) => t.at(IndexExpr::Grid(0)),
                _ => IndexExpr::Grid(d),
            })
            .collect()
    };
    let col_major = rank >= 2 && c.chance(15);
    let hint = |r: Ref, on: bool| if on { r.col_major() } else { r };
    let x = hint(
        k.input("x", dtype, shape.clone())
            .block_exprs(block.clone(), map(&mut c)),
        col_major,
    );
    let y = k
        .input("y", dtype, shape.clone())
        .block_exprs(block.clone(), map(&mut c));
    let out_dtype = if c.chance(15) { c.pick(&DTYPES) } else { dtype };
    let o = k
        .output("o", out_dtype, shape.clone())
        .block_exprs(block.clone(), (0..rank).map(IndexExpr::Grid).collect());
    if c.chance(10) {
        k.vmem_limit(c.pick(&[1 << 20, 16 << 20, 100 << 20]));
    }

    // Leading unit dims of the block can be indexed away.
    let drop_leading = rank >= 3 && block[0] == 1 && c.chance(50);
    let load = |r: Ref| {
        if drop_leading {
            let mut idx = vec![Idx::Point(Start::Static(0))];
            idx.extend((1..rank).map(|_| Idx::Full));
            r.load(idx)
        } else {
            r.load(..)
        }
    };
    let mut t = load(x);
    let other = load(y);
    let n_ops = 1 + c.below(5);
    for _ in 0..n_ops {
        let (name, next) = step(&mut c, t, other, &table);
        ops.push(name.to_string());
        t = next;
    }
    let tshape = t.shape();
    if out_dtype != t.dtype() {
        t = t.convert(out_dtype);
        ops.push("convert out".into());
    }
    let store = |r: Ref, v: Tile, mask: Option<Tile>| {
        let idx: Vec<Idx> = if drop_leading {
            let mut idx = vec![Idx::Point(Start::Static(0))];
            idx.extend((1..rank).map(|_| Idx::Full));
            idx
        } else {
            (0..rank).map(|_| Idx::Full).collect()
        };
        match mask {
            Some(m) => r.store_masked(idx, v, m),
            None => r.store(idx, v),
        }
    };
    if accumulate && !tshape.is_empty() {
        let acc = k.scratch("acc", F32, tshape.clone());
        let last = grid.len() - 1;
        when(program_id(last).eq(0), || acc.store(.., 0.0));
        acc.store(.., acc.load(..) + t.convert(F32));
        when(program_id(last).eq(num_programs(last) - 1), || {
            store(o, acc.load(..).convert(out_dtype), None)
        });
        ops.push("scratch accumulate".into());
    } else if c.chance(15) && !tshape.is_empty() {
        let axis = tshape.len() - 1;
        let m = iota(I32, tshape.clone(), axis).lt(c.below(200) as i64);
        store(o, t, Some(m));
        ops.push("masked store".into());
    } else {
        store(o, t, None);
    }
    RandomKernel {
        seed,
        target,
        ops,
        kernel: k.finish(),
    }
}

fn is_float(t: Tile) -> bool {
    t.dtype().is_float()
}

/// One random step of the body: a new tile from `t` (and `other`, a tile
/// of the same shape and dtype).
fn step(c: &mut Choose, t: Tile, other: Tile, table: &Option<Ref>) -> (&'static str, Tile) {
    let shape = t.shape();
    let rank = shape.len();
    match c.below(16) {
        0 | 1 if is_float(t) => (
            "unary",
            match c.below(10) {
                0 => t.exp(),
                1 => t.tanh(),
                2 => t.abs().sqrt(),
                3 => (t.abs() + 1.0).log(),
                4 => t.logistic(),
                5 => (t.abs() + 1.0).rsqrt(),
                6 => t.sin(),
                7 => t.floor(),
                8 => t.erf(),
                _ => -t,
            },
        ),
        0 | 1 => ("unary", if c.chance(50) { -t } else { t.abs() }),
        2 | 3 => (
            "binary",
            match c.below(6) {
                0 => t + other,
                1 => t - other,
                2 => t * other,
                3 => t.max(other),
                4 if is_float(t) => t / (other.abs() + 1.0),
                _ => t.min(other),
            },
        ),
        4 => ("compare select", t.gt(other).select(t, other)),
        5 => {
            let to = c.pick(&[F32, BF16, I32, F16, I8]);
            ("convert", t.convert(to).convert(t.dtype()))
        }
        6 if rank >= 1 => {
            let axis = c.below(rank);
            let r = match c.below(3) {
                0 => t.sum_keep(axis),
                1 => t.max_keep(axis),
                _ => t.min_keep(axis),
            };
            ("reduce keep", r.broadcast_to(shape))
        }
        7 if rank >= 2 => {
            let axis = c.below(rank);
            let r = t.reduce(ReduceOp::Sum, &[axis]);
            let dims: Vec<usize> = (0..rank).filter(|&d| d != axis).collect();
            ("reduce broadcast_in_dim", r.broadcast_in_dim(shape, dims))
        }
        8 if rank >= 2 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(rank - 1, rank - 2);
            let back = t.transpose(perm.clone());
            ("transpose twice", (back * 2.0).transpose(perm))
        }
        8 if rank >= 3 => {
            let mut perm: Vec<usize> = (0..rank).collect();
            perm.swap(0, 1);
            (
                "transpose leading",
                t.transpose(perm.clone()).transpose(perm),
            )
        }
        9 if rank >= 2 => {
            // Merge the two minor dims, or the leading ones, and back.
            let mut merged = shape[..rank - 2].to_vec();
            merged.push(shape[rank - 2] * shape[rank - 1]);
            let r = if c.chance(50) {
                t.reshape(merged)
            } else {
                let mut lead = vec![shape[..rank - 1].iter().product::<usize>()];
                lead.push(shape[rank - 1]);
                t.reshape(lead)
            };
            ("reshape and back", r.reshape(shape))
        }
        10 if rank == 2 => {
            // [m, n] · [n, m] · [m, n] keeps the shape.
            let acc = if is_float(t) { F32 } else { I32 };
            let tt = t.transpose([1, 0]);
            let sq = dot_general(t, tt, DotDims::matmul(), acc).convert(t.dtype());
            let back = dot_general(sq, t, DotDims::matmul(), acc).convert(t.dtype());
            ("dot", back)
        }
        10 if rank == 3 => {
            let acc = if is_float(t) { F32 } else { I32 };
            let dims = DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![2],
            };
            let sq = dot_general(t, other, dims, acc).convert(t.dtype());
            let dims2 = DotDims {
                lhs_batch: vec![0],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![1],
            };
            (
                "batched dot",
                dot_general(sq, t, dims2, acc).convert(t.dtype()),
            )
        }
        11 if rank >= 1 => {
            let axis = c.below(rank);
            let m = iota(I32, shape.clone(), axis).lt((c.below(8) * 16) as i64);
            ("iota mask", m.select(t, other))
        }
        12 => {
            let n = 1 + c.below(3) as i64;
            let r = for_range(0, n, t, |i, acc| {
                acc + i.convert(acc.dtype()).broadcast_to(acc.shape())
            });
            ("loop", r)
        }
        13 => {
            let r = if_else(program_id(0).eq(0), || t + other, || t);
            ("branch", r)
        }
        14 => match table {
            Some(tb) => {
                let s = tb.load([ds(0, 1)]).sum_all().convert(t.dtype());
                ("prefetch scalar", t + s.broadcast_to(shape))
            }
            None => ("binary", t * other),
        },
        _ => ("binary", t + other),
    }
}
