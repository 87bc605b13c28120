//! The support matrix: one small kernel per (op, dtype, shape), each doing
//! one thing between a load and a store, to find which ops the TPU
//! compiler takes in which dtypes and ranks. It is how the rules of
//! `kernel_ir`'s `verify::mosaic` pass were found, and the differential
//! test runs it with the random kernels (`tests/it/targets/tpu_compile.rs`).

use kernel_ir::prelude::*;
use kernel_ir::{DimSemantics, IndexExpr, ReduceOp, UnaryOp};

use crate::random_kernel::RandomKernel;

type Case = (&'static str, fn(Tile, Tile) -> Tile);

/// One row of the matrix: every unary op (from [`UnaryOp::ALL`], so a new
/// op is in the matrix without a line here), then the other cases.
#[derive(Clone, Copy)]
enum Row {
    Unary(UnaryOp),
    Other(Case),
}

fn rows() -> Vec<Row> {
    UnaryOp::ALL
        .into_iter()
        .map(Row::Unary)
        .chain(cases().into_iter().map(Row::Other))
        .collect()
}

fn last(t: Tile) -> usize {
    t.shape().len() - 1
}

fn cases() -> Vec<Case> {
    vec![
        ("copy", |x, _| x),
        ("add", |x, y| x + y),
        ("sub", |x, y| x - y),
        ("mul", |x, y| x * y),
        ("div", |x, y| x / y),
        ("rem", |x, y| x % y),
        ("max", |x, y| x.max(y)),
        ("min", |x, y| x.min(y)),
        ("pow", |x, y| x.pow(y)),
        ("and", |x, y| x & y),
        ("or", |x, y| x | y),
        ("xor", |x, y| x ^ y),
        ("shifts", |x, y| (x << y) ^ x.shr_logical(y) ^ (x >> y)),
        ("bitcast_round_trip", |x, _| {
            let other = if x.dtype() == F32 { I32 } else { F32 };
            x.bitcast(other).bitcast(x.dtype())
        }),
        ("cmp_gt", |x, y| x.gt(y).select(x, y)),
        ("cmp_eq", |x, y| x.eq(y).select(x, y)),
        ("cmp_ne", |x, y| x.ne(y).select(x, y)),
        ("cmp_le", |x, y| x.le(y).select(x, y)),
        ("to_bool_and_back", |x, _| {
            x.convert(Bool).convert(x.dtype())
        }),
        ("select_i32_mask", |x, y| {
            iota(I32, x.shape(), last(x)).lt(7).select(x, y)
        }),
        ("select_f32_mask", |x, y| {
            iota(F32, x.shape(), last(x)).lt(7.0).select(x, y)
        }),
        ("loop_carry", |x, y| {
            for_range(0, 3, (x, y), |_, (a, b)| (b, a)).0
        }),
        ("loop_add_scalar", |x, _| {
            for_range(0, 2, x, |i, a| {
                a + i.convert(a.dtype()).broadcast_to(a.shape())
            })
        }),
        ("branch_pick", |x, y| {
            if_else(program_id(0).eq(0), || x, || y)
        }),
        ("sum_minor_keep", |x, _| {
            x.sum_keep(last(x)).broadcast_to(x.shape())
        }),
        ("max_minor_keep", |x, _| {
            x.max_keep(last(x)).broadcast_to(x.shape())
        }),
        ("sum_first_keep", |x, _| {
            x.sum_keep(0).broadcast_to(x.shape())
        }),
        ("sum_minor_bcast_in_dim", |x, _| {
            let r = x.shape().len();
            x.reduce(ReduceOp::Sum, &[r - 1])
                .broadcast_in_dim(x.shape(), (0..r - 1).collect::<Vec<_>>())
        }),
        ("reduce_all_scalar", |x, _| {
            x.sum_all().broadcast_to(x.shape())
        }),
        ("transpose_minor_twice", |x, _| {
            let r = x.shape().len();
            let mut p: Vec<usize> = (0..r).collect();
            if r >= 2 {
                p.swap(r - 1, r - 2);
            }
            x.transpose(p.clone()).transpose(p)
        }),
        ("reshape_flat_and_back", |x, _| {
            let n: usize = x.shape().iter().product();
            x.reshape([n]).reshape(x.shape())
        }),
        ("iota_plus", |x, _| iota(x.dtype(), x.shape(), last(x)) + x),
        ("scalar_bcast", |x, _| {
            x + constant(1.5, x.dtype(), Vec::<usize>::new()).broadcast_to(x.shape())
        }),
        ("to_f32", |x, _| x.convert(F32).convert(x.dtype())),
        ("to_bf16", |x, _| x.convert(BF16).convert(x.dtype())),
        ("to_i32", |x, _| x.convert(I32).convert(x.dtype())),
        ("to_i8", |x, _| x.convert(I8).convert(x.dtype())),
    ]
}

const DTYPES: [DType; 6] = [F32, BF16, F16, I32, I8, Bool];

/// Shapes: (array, block), ranks 2, 1, 3 and 4.
fn shapes() -> Vec<(Vec<usize>, Vec<usize>)> {
    vec![
        (vec![64, 128], vec![32, 128]),
        (vec![1024], vec![512]),
        (vec![2, 3, 256], vec![1, 3, 128]),
        (vec![2, 2, 64, 128], vec![1, 1, 32, 128]),
    ]
}

/// Masking variants: none, a masked load, a masked store.
const MASKS: [&str; 3] = ["", "+masked_load", "+masked_store"];

/// How many kernels the matrix has.
pub fn len() -> u64 {
    (rows().len() * DTYPES.len() * shapes().len() * MASKS.len()) as u64
}

/// Kernel `index` of the matrix (for `index < len()`).
pub fn kernel(index: u64) -> RandomKernel {
    let rows = rows();
    let shapes = shapes();
    let mut i = index as usize;
    let row = rows[i % rows.len()];
    i /= rows.len();
    let dtype = DTYPES[i % DTYPES.len()];
    i /= DTYPES.len();
    let (shape, block) = shapes[i % shapes.len()].clone();
    i /= shapes.len();
    let masked = i % MASKS.len();
    let rank = shape.len();
    let mut k = KernelBuilder::new("matrix");
    let steps: Vec<(usize, DimSemantics)> = shape
        .iter()
        .zip(&block)
        .map(|(a, b)| (a.div_ceil(*b), Parallel))
        .collect();
    k.grid_dims(&steps);
    let map: Vec<IndexExpr> = (0..rank).map(IndexExpr::Grid).collect();
    let x = k
        .input("x", dtype, shape.clone())
        .block_exprs(block.clone(), map.clone());
    let y = k
        .input("y", dtype, shape.clone())
        .block_exprs(block.clone(), map.clone());
    let o = k
        .output("o", dtype, shape.clone())
        .block_exprs(block.clone(), map);
    let mask = || iota(I32, block.clone(), rank - 1).lt(100);
    let xv = if masked == 1 {
        x.load_masked(.., mask())
    } else {
        x.load(..)
    };
    let (name, v) = match row {
        Row::Unary(u) => (u.name(), xv.apply(u)),
        Row::Other((name, f)) => (name, f(xv, y.load(..))),
    };
    if masked == 2 {
        o.store_masked(.., v, mask())
    } else {
        o.store(.., v)
    }
    RandomKernel {
        seed: index,
        target: Target::V5e,
        ops: vec![format!("{name}{} {dtype}{block:?}", MASKS[masked])],
        kernel: k.finish(),
    }
}
