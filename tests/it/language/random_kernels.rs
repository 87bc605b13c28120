//! Property tests over random kernels.
//!
//! * Random valid elementwise/reduction kernels over random legal shapes and
//!   blockings agree with a plain f64 evaluation of the same expression.
//! * Random mutations of valid kernels (possibly invalid in any way) never
//!   panic the verifier or the interpreter.

use kernel_ir::prelude::*;
use kernel_ir::{Kernel, SplitMix64};
use kernels::check::{ErrorStats, Tolerance};
use proptest::prelude::*;
use runtime::backend::Backend;
use tests::mutation::{mutate, seed_kernels};
use tooling::paths::run_paths;

use crate::graph_runtime::grad::{H, h_dot};

/// An elementwise expression over inputs `x` and `y`.
#[derive(Clone, Debug)]
enum Expr {
    X,
    Y,
    Const(f64),
    Un(u8, Box<Expr>),
    Bin(u8, Box<Expr>, Box<Expr>),
}

/// A reduction applied to `tanh(expr)` along each row, then broadcast back.
#[derive(Clone, Copy, Debug)]
enum Rowwise {
    None,
    MinusMax,
    Sum,
    Normalize,
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = prop_oneof![
        Just(Expr::X),
        Just(Expr::Y),
        (-2.0f64..2.0).prop_map(|c| Expr::Const((c * 8.0).round() / 8.0)),
    ];
    leaf.prop_recursive(4, 16, 2, |inner| {
        prop_oneof![
            (0u8..6, inner.clone()).prop_map(|(o, e)| Expr::Un(o, Box::new(e))),
            (0u8..5, inner.clone(), inner).prop_map(|(o, a, b)| Expr::Bin(
                o,
                Box::new(a),
                Box::new(b)
            )),
        ]
    })
}

fn build(e: &Expr, x: Tile, y: Tile) -> Tile {
    match e {
        Expr::X => x,
        Expr::Y => y,
        Expr::Const(c) => x * 0.0 + *c,
        Expr::Un(o, a) => {
            let a = build(a, x, y);
            match o {
                0 => -a,
                1 => a.abs(),
                2 => a.tanh(),
                3 => a.logistic(),
                4 => a.sin(),
                _ => a.cos(),
            }
        }
        Expr::Bin(o, a, b) => {
            let (a, b) = (build(a, x, y), build(b, x, y));
            match o {
                0 => a + b,
                1 => a - b,
                2 => a * b,
                3 => a.max(b),
                _ => a.min(b),
            }
        }
    }
}

fn eval(e: &Expr, x: f64, y: f64) -> f64 {
    match e {
        Expr::X => x,
        Expr::Y => y,
        Expr::Const(c) => *c,
        Expr::Un(o, a) => {
            let a = eval(a, x, y);
            match o {
                0 => -a,
                1 => a.abs(),
                2 => a.tanh(),
                3 => 1.0 / (1.0 + (-a).exp()),
                4 => a.sin(),
                _ => a.cos(),
            }
        }
        Expr::Bin(o, a, b) => {
            let (a, b) = (eval(a, x, y), eval(b, x, y));
            match o {
                0 => a + b,
                1 => a - b,
                2 => a * b,
                3 => a.max(b),
                _ => a.min(b),
            }
        }
    }
}

fn rowwise() -> impl Strategy<Value = Rowwise> {
    prop_oneof![
        Just(Rowwise::None),
        Just(Rowwise::MinusMax),
        Just(Rowwise::Sum),
        Just(Rowwise::Normalize)
    ]
}

fn reference(e: &Expr, r: Rowwise, x: &Array, y: &Array, cols: usize) -> Vec<f64> {
    let v: Vec<f64> = x
        .data()
        .iter()
        .zip(y.data())
        .map(|(&a, &b)| eval(e, a, b))
        .collect();
    if let Rowwise::None = r {
        return v;
    }
    v.chunks(cols)
        .flat_map(|row| {
            let t: Vec<f64> = row.iter().map(|a| a.tanh()).collect();
            let max = t.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = t.iter().sum();
            let abs: f64 = t.iter().map(|a| a.abs()).sum();
            t.into_iter()
                .map(move |a| match r {
                    Rowwise::MinusMax => a - max,
                    Rowwise::Sum => sum,
                    _ => a / (abs + 1.0),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn random_elementwise_and_row_kernels_match_f64(
        e in expr(), r in rowwise(),
        rb in 1usize..4, rows_extra in 0usize..3, cb in 1usize..4, col_block in 1usize..3,
        seed in any::<u64>(),
    ) {
        let block_rows = 8 * rb;
        let rows = block_rows * (1 + rows_extra) - rows_extra; // sometimes a partial last block
        let cols = 128 * cb;
        // Row reductions need whole rows in a block.
        let block_cols = if matches!(r, Rowwise::None) { (128 * col_block).min(cols) } else { cols };
        let mut k = KernelBuilder::new("random");
        k.grid([rows.div_ceil(block_rows), cols.div_ceil(block_cols)], [Parallel, Parallel]);
        let bs = [block_rows, block_cols];
        let x = k.input("x", F32, [rows, cols]).block(bs, |[i, j]| (i, j));
        let y = k.input("y", F32, [rows, cols]).block(bs, |[i, j]| (i, j));
        let o = k.output("o", F32, [rows, cols]).block(bs, |[i, j]| (i, j));
        let v = build(&e, x.load(..), y.load(..));
        let out = match r {
            Rowwise::None => v,
            Rowwise::MinusMax => { let t = v.tanh(); t - t.max_keep(1) }
            Rowwise::Sum => v.tanh().sum_keep(1).broadcast_to([block_rows, block_cols]),
            Rowwise::Normalize => { let t = v.tanh(); t / (t.abs().sum_keep(1) + 1.0) }
        };
        o.store(.., out);
        let kernel = k.build().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let xa = Array::random(F32, [rows, cols], seed, -1.0, 1.0);
        let ya = Array::random(F32, [rows, cols], seed ^ 0x5555, -1.0, 1.0);
        let got = interpret(&kernel, &[xa.clone(), ya.clone()])
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want = reference(&e, r, &xa, &ya, cols);
        let tol = Tolerance { abs: 1e-4 * (cols as f64 / 128.0), rel: 1e-4 };
        let s = ErrorStats::between(&got[0], &want, tol);
        prop_assert!(s.passes(), "{s}\n{}", *kernel);
        // The native and PJRT paths compute the same expression.
        let others = [Backend::Native, Backend::Decomposed, Backend::HostCall];
        for r in run_paths(&kernel, &[xa, ya], &others, &[want], &[tol]) {
            prop_assert!(r.passes(), "{r}\n{}", *kernel);
        }
    }
}

// ---- mutation fuzzing (the mutator is `tests::mutation`) ----

fn random_args(k: &Kernel, r: &mut SplitMix64) -> Option<Vec<Array>> {
    let mut args = Vec::new();
    let mut total = 0usize;
    let shapes = k
        .prefetch
        .iter()
        .map(|p| (p.dtype, &p.shape))
        .chain(k.inputs().map(|o| (o.dtype, &o.shape)));
    for (dtype, shape) in shapes {
        total += shape.iter().product::<usize>();
        if total > 1 << 20 {
            return None;
        }
        args.push(Array::random(dtype, shape.clone(), r.next_u64(), -2.0, 6.0));
    }
    Some(args)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_kernels_never_panic(which in 0usize..10, seed in any::<u64>(), n in 1usize..4) {
        let mut k = seed_kernels().swap_remove(which);
        let mut r = SplitMix64(seed);
        for _ in 0..n {
            mutate(&mut k, &mut r);
        }
        let _ = k.to_string();
        if let Ok(v) = k.clone().verify() {
            // A verified kernel compiles natively (or is refused with an
            // error), and where the interpreter runs it the native code
            // runs it too, without touching memory it must not.
            if v.mesh.is_some() {
                // A kernel across chips runs on the interpreter of its
                // devices: an answer or an error, never a panic or a hang
                // (a deadlock is an error too), and so does its SPMD form.
                if let Some(args) = random_args(&v, &mut r) {
                    let n = v.mesh.as_ref().map_or(1, |m| m.devices()).min(8);
                    let per: Vec<Vec<kernel_ir::Array>> = (0..n).map(|_| args.clone()).collect();
                    let _ = kernel_ir::interpret_mesh(&v, &per, &kernel_ir::InterpOptions::default());
                    let _ = lowering::decomposed(&v);
                }
                return Ok(());
            }
            let native = lowering::HostKernel::compile(&v);
            if let Some(args) = random_args(&v, &mut r) {
                let interpreted = interpret(&v, &args);
                if let (Ok(_), Ok(native)) = (&interpreted, &native) {
                    let ran = native.run(&args);
                    prop_assert!(ran.is_ok(), "{}\n{}", ran.unwrap_err(), *v);
                }
            }
        } else {
            // The errors print without panicking too.
            let _ = k.verify().unwrap_err().to_string();
        }
    }
}

// ---- random dot_general layouts ----

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The native JIT packs a dot's rhs into panels, reads its lhs in place
    /// when it can and folds transposes into windows: every layout (batch
    /// and contracting dims anywhere, column-major storage, an lhs that is
    /// an expression, sizes that are no multiple of the register tile) and
    /// dtype gives the f64 answer, as the interpreter does.
    #[test]
    fn random_dot_layouts_match_f64_on_the_jit(
        layout in 0usize..4,
        bsz in 1usize..4,
        m in prop::sample::select(vec![1usize, 3, 8, 13, 32, 40]),
        n in prop::sample::select(vec![1usize, 5, 16, 32, 33, 64]),
        kd in prop::sample::select(vec![1usize, 7, 16, 32, 40]),
        dt in 0usize..3,
        col_major in any::<[bool; 2]>(),
        scaled in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (b, k) = (bsz, kd);
        let (ash, bsh, dims) = match layout {
            0 => (vec![m, k], vec![k, n], DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![1], rhs_contract: vec![0] }),
            1 => (vec![b, m, k], vec![b, n, k], DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![2] }),
            2 => (vec![k, b, m], vec![n, b, k], DotDims { lhs_batch: vec![1], rhs_batch: vec![1], lhs_contract: vec![0], rhs_contract: vec![2] }),
            _ => (vec![k, m, b], vec![b, n, k], DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![0, 2], rhs_contract: vec![2, 0] }),
        };
        let (dtype, acc) = [(F32, F32), (BF16, F32), (I8, I32)][dt];
        let mut kb = KernelBuilder::new("random_dot");
        kb.grid([1], [Arbitrary]);
        let whole = |sh: &[usize]| vec![IndexExpr::Const(0); sh.len()];
        let mut x = kb.input("x", dtype, ash.clone()).block_exprs(ash.clone(), whole(&ash));
        let mut y = kb.input("y", dtype, bsh.clone()).block_exprs(bsh.clone(), whole(&bsh));
        if col_major[0] { x = x.col_major(); }
        if col_major[1] { y = y.col_major(); }
        let a = Array::random(dtype, ash.clone(), seed, -2.0, 2.0);
        let bm = Array::random(dtype, bsh.clone(), seed ^ 0x9e37, -2.0, 2.0);
        let mut want = h_dot(&H::of(&a), &H::of(&bm), &dims).data;
        // Mosaic has no i8 arithmetic, so the expression lhs is float only.
        let lhs = if scaled && dtype != I8 {
            // An expression, not a window: computed into a buffer first.
            for w in &mut want { *w *= 2.0; }
            let v = x.load(..);
            v + v
        } else {
            x.load(..)
        };
        let prod = dot_general(lhs, y.load(..), dims, acc);
        let osh = prod.shape();
        let o = kb.output("o", acc, osh.clone()).block_exprs(osh.clone(), whole(&osh));
        o.store(.., prod);
        let kernel = kb.build().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let tol = Tolerance { abs: 1e-4 * k as f64, rel: 1e-4 };
        for r in run_paths(&kernel, &[a, bm], &[Backend::Interpreter, Backend::Native], &[want], &[tol]) {
            prop_assert!(r.passes(), "{r}\n{}", *kernel);
        }
    }
}
