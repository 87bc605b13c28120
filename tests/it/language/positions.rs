//! `Ref::positions`: each element's array index along an axis, read off
//! the operand's index map (floor division and remainder included, a
//! scalar-prefetch map, an element window's padding), on every path
//! against the map evaluated here.

use kernel_ir::prelude::*;
use kernel_ir::{IndexExpr, VerifiedKernel};
use kernels::check::Tolerance;

use crate::common::all_paths;

const STEPS: usize = 4;

fn positions() -> Result<VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("positions");
    k.grid([STEPS], [Parallel]);
    let table = k.scalar_prefetch("table", [STEPS]);
    // Block (5i + 3) mod 8, then floor((i − 2) / 3) + 1 (so −1 floors to
    // −1, not 0), then the block the table names, then an element window.
    let a = k
        .input("a", F32, [64, 128])
        .block([8, 128], |[i]: [IndexExpr; 1]| ((i * 5 + 3) % 8, 0));
    let b = k
        .input("b", F32, [16, 128])
        .block([8, 128], |[i]: [IndexExpr; 1]| ((i - 2) / 3 + 1, 0));
    let c = k
        .input("c", F32, [32, 128])
        .block([8, 128], move |[i]| (table.at(i), 0));
    let d = k
        .input("d", F32, [32, 128])
        .block([16, 128], |[i]: [IndexExpr; 1]| (i * 8, 0))
        .element_window([8, 0], [0, 0]);
    let outs: Vec<_> = ["pa", "pb", "pc", "pd"]
        .iter()
        .map(|n| {
            let rows = if *n == "pd" { 16 } else { 8 };
            k.output(*n, I32, [STEPS * rows, 128])
                .block([rows, 128], |[i]| (i, 0))
        })
        .collect();
    for (o, r) in outs.iter().zip([a, b, c, d]) {
        o.store(.., r.positions(0));
    }
    k.build()
}

#[test]
fn positions_follow_each_operands_index_map_on_every_path() {
    let table = [2i64, 0, 3, 1];
    let rows = |start: i64, n: usize| -> Vec<f64> {
        (0..n as i64)
            .flat_map(|r| std::iter::repeat_n((start + r) as f64, 128))
            .collect()
    };
    let each = |f: &dyn Fn(i64) -> i64, n: usize| -> Vec<f64> {
        (0..STEPS as i64).flat_map(|i| rows(f(i), n)).collect()
    };
    let want = vec![
        each(&|i| (i * 5 + 3).rem_euclid(8) * 8, 8),
        each(&|i| ((i - 2).div_euclid(3) + 1) * 8, 8),
        each(&|i| table[i as usize] * 8, 8),
        // Element offset 8i in x padded by 8 rows: array row 8i − 8 first.
        each(&|i| i * 8 - 8, 16),
    ];
    let args = vec![
        Array::new(I32, [STEPS], table.iter().map(|&t| t as f64).collect()).unwrap(),
        Array::random(F32, [64, 128], 1, 0.0, 1.0),
        Array::random(F32, [16, 128], 2, 0.0, 1.0),
        Array::random(F32, [32, 128], 3, 0.0, 1.0),
        Array::random(F32, [32, 128], 4, 0.0, 1.0),
    ];
    let exact = Tolerance { abs: 0.0, rel: 0.0 };
    all_paths(positions(), &args, want, &[exact; 4]).unwrap();
}
