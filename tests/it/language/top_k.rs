//! Arg-max, arg-min and top-k on every path against a reference written
//! from the definition (a stable sort, NaN above every number), on rows
//! full of ties, infinities and NaN; the router kernel built on them runs
//! every path through its entry (`library_paths`).

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };

/// Orders `a` before `b` when it ranks higher: NaN first, then larger.
fn higher(a: f64, b: f64) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Less,
        (false, true) => std::cmp::Ordering::Greater,
        _ => b.total_cmp(&a),
    }
}

/// The indices of `row` from highest to lowest (stable: ties by index).
fn ranked(row: &[f64], lowest_first: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| {
        if lowest_first {
            // NaN still first, then smaller.
            match (row[a].is_nan(), row[b].is_nan()) {
                (false, false) => row[a].total_cmp(&row[b]),
                _ => higher(row[a], row[b]),
            }
        } else {
            higher(row[a], row[b])
        }
    });
    order
}

/// Values drawn from a few levels (so rows tie), with ±∞ and, when
/// `nan`, NaN among them.
pub(super) fn values(seed: u64, n: usize, nan: bool) -> Vec<f64> {
    let mut rng = kernel_ir::SplitMix64(seed);
    (0..n)
        .map(|_| match rng.next_u64() % 23 {
            0 => f64::INFINITY,
            1 => f64::NEG_INFINITY,
            2 if nan => f64::NAN,
            r => f64::from((r % 7) as i32 - 3) * 0.5,
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn argmax_and_argmin_take_the_lowest_index_and_nan_on_every_path(seed in any::<u64>(), bf in any::<bool>()) {
        let dtype = if bf { BF16 } else { F32 };
        let (rows, cols) = (16usize, 128usize);
        let mut k = KernelBuilder::new("argmax");
        k.grid([1], [Parallel]);
        let x = k.input("x", dtype, [rows, cols]).block([rows, cols], |[_]| (0, 0));
        let names = ["max_row", "min_row", "max_col"];
        let shapes = [[rows, 1], [rows, 1], [1, cols]];
        let outs: Vec<_> = names
            .iter()
            .zip(shapes)
            .map(|(n, s)| k.output(*n, I32, s).block(s, |[_]| (0, 0)))
            .collect();
        let xv = x.load(..);
        outs[0].store(.., xv.argmax_keep(1));
        outs[1].store(.., xv.argmin_keep(1));
        outs[2].store(.., xv.argmax_keep(0));
        let data = values(seed, rows * cols, true);
        let row = |r: usize| data[r * cols..(r + 1) * cols].to_vec();
        let col = |c: usize| (0..rows).map(|r| data[r * cols + c]).collect::<Vec<_>>();
        let first = |v: Vec<f64>, low: bool| ranked(&v, low)[0] as f64;
        let want = vec![
            (0..rows).map(|r| first(row(r), false)).collect(),
            (0..rows).map(|r| first(row(r), true)).collect(),
            (0..cols).map(|c| first(col(c), false)).collect(),
        ];
        let x = Array::new(dtype, [rows, cols], data.clone()).unwrap();
        all_paths(k.build(), &[x], want, &[EXACT])?;
    }

    #[test]
    fn top_k_ranks_ties_by_index_on_every_path(seed in any::<u64>(), kk in 1usize..5, int in any::<bool>()) {
        let (rows, cols) = (8usize, 128usize);
        let dtype = if int { I32 } else { F32 };
        let mut k = KernelBuilder::new("top_k");
        k.grid([1], [Parallel]);
        let x = k.input("x", dtype, [rows, cols]).block([rows, cols], |[_]| (0, 0));
        let v = k.output("v", dtype, [rows, kk]).block([rows, kk], |[_]| (0, 0));
        let i = k.output("i", I32, [rows, kk]).block([rows, kk], |[_]| (0, 0));
        let (values_out, indices) = top_k(x.load(..), kk, 1);
        v.store(.., values_out);
        i.store(.., indices);
        // Integers: the levels scaled, ±∞ as the type's extremes.
        let data: Vec<f64> = values(seed, rows * cols, false)
            .into_iter()
            .map(|v| if int { (v * 2.0).clamp(f64::from(i32::MIN), f64::from(i32::MAX)) } else { v })
            .collect();
        let (mut want_v, mut want_i) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let row = &data[r * cols..(r + 1) * cols];
            for &e in ranked(row, false).iter().take(kk) {
                want_v.push(row[e]);
                want_i.push(e as f64);
            }
        }
        let x = Array::new(dtype, [rows, cols], data).unwrap();
        all_paths(k.build(), &[x], vec![want_v, want_i], &[EXACT])?;
    }
}

#[test]
fn top_k_compiles_with_libtpu_for_every_generation() {
    // Lane reductions of i32 indices, bool masks and selects, as Mosaic
    // takes them (bf16 input: compared in f32).
    let mut k = KernelBuilder::new("top_k");
    k.grid([2], [Parallel]);
    let x = k.input("x", BF16, [32, 256]).block([16, 256], |[i]| (i, 0));
    let v = k.output("v", BF16, [32, 4]).block([16, 4], |[i]| (i, 0));
    let i = k.output("i", I32, [32, 4]).block([16, 4], |[i]| (i, 0));
    let a = k.output("a", I32, [32, 1]).block([16, 1], |[i]| (i, 0));
    let xv = x.load(..);
    let (vals, idx) = top_k(xv, 4, 1);
    v.store(.., vals);
    i.store(.., idx);
    a.store(.., xv.argmin_keep(1));
    let kernel = k.build().unwrap();
    let tpu = crate::targets::tpu_compile::tpu();
    for t in kernel_ir::Target::ALL {
        if let Err(e) = tpu.compile_kernel(&kernel, t) {
            panic!("{t}: {e}");
        }
    }
}

/// The ops composed of other ops (arg-max, top-k, cumsum, random bits)
/// report a misuse at the author's line, not at a line inside Tessera.
#[test]
fn misuse_of_composed_ops_is_reported_at_the_authors_line() {
    type Misuse = fn(Tile) -> Tile;
    let cases: [(Misuse, u32); 4] = [
        (|x| x.argmax_keep(2), line!()),
        (|x| top_k(x, 2, 3).1, line!()),
        (|x| x.cumsum(2), line!()),
        (|x| kernel_ir::random::Key::new(x, x).bits(x), line!()),
    ];
    for (misuse, line) in cases {
        let mut k = KernelBuilder::new("misuse");
        k.grid([1], [Parallel]);
        let x = k.input("x", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
        let o = k.output("o", F32, [8, 128]).block([8, 128], |[_]| (0, 0));
        o.store(.., misuse(x.load(..)).convert(F32));
        let errors = k.build().unwrap_err().to_string();
        assert!(errors.contains(&format!("top_k.rs:{line}:")), "{errors}");
        assert!(!errors.contains("kernel-ir/src"), "{errors}");
    }
}
