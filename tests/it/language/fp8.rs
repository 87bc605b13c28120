//! fp8 tiles on the CPU paths: conversions in both directions, exact
//! against the f64 semantics (`DType::round`), on the interpreter and on
//! XLA (the decomposed StableHLO, whose fp8 conversions are XLA's own: a
//! peer) and in the host JIT's own conversions (native and through XLA's
//! FFI).

use kernel_ir::prelude::*;
use runtime::backend::{Backend, run};

/// Values where rounding to fp8 is easy to get wrong: ties (to even),
/// subnormal ties, the overflow boundaries of both formats, infinities,
/// NaN, signed zeros.
const EDGES: [f64; 18] = [
    1.0625,
    1.1875,
    -2.5,
    0.0009765625, // 2^-10: half the least e4m3fn subnormal
    0.0029296875, // 1.5 x 2^-9
    464.0,
    464.0625,
    448.0,
    480.0,
    57344.0,
    61440.0,
    61439.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    -0.0,
    1.52587890625e-05, // 2^-16: the least e5m2 subnormal
    7.62939453125e-06, // half of it
];

#[test]
fn fp8_conversions_are_exact_on_every_path() {
    for d in [F8E4M3FN, F8E5M2] {
        // Up: every value of the format, times 2 in f32.
        let mut k = KernelBuilder::new("up");
        let x = k.input("x", d, [2, 128]);
        let o = k.output("o", F32, [2, 128]);
        o.store(.., x.load(..).convert(F32) * 2.0);
        let up = k.build().unwrap();
        let bits: Vec<u8> = (0..=255).collect();
        let xa = Array::from_le_bytes(d, [2, 128], &bits).unwrap();
        // Down: f32 values across the range, NaN, overflow and subnormals
        // included, rounded to the format.
        let mut k = KernelBuilder::new("down");
        let y = k.input("y", F32, [2, 128]);
        let p = k.output("p", d, [2, 128]);
        p.store(.., y.load(..).convert(d));
        let down = k.build().unwrap();
        let ya = Array::random(F32, [2, 128], 9, -1.0, 1.0);
        let ya = Array::new(
            F32,
            [2, 128],
            ya.data()
                .iter()
                .enumerate()
                .map(|(i, v)| match EDGES.get(i) {
                    Some(&e) => e,
                    None => F32.round(v * 2f64.powi(i as i32 % 40 - 20)),
                })
                .collect(),
        )
        .unwrap();
        for backend in Backend::ALL {
            let out = run(backend, &up, std::slice::from_ref(&xa)).unwrap();
            for (o, v) in out[0].data().iter().zip(xa.data()) {
                assert!(
                    o.is_nan() && v.is_nan() || *o == v * 2.0,
                    "{backend} {d}: {v} -> {o}"
                );
            }
            let out = run(backend, &down, std::slice::from_ref(&ya)).unwrap();
            for (o, v) in out[0].data().iter().zip(ya.data()) {
                let want = d.round(*v);
                assert!(
                    o.is_nan() && want.is_nan() || *o == want,
                    "{backend} {d}: {v} -> {o}, want {want}"
                );
            }
        }
    }
}

/// An fp8 × fp8 dot accumulating in f32 on every path,
/// against the f64 product (exact here: products of fp8 values and their
/// short sums are exact in f32).
#[test]
fn fp8_dots_match_the_f64_product_on_every_path() {
    for d in [F8E4M3FN, F8E5M2] {
        let mut k = KernelBuilder::new("mm");
        let a = k.input("a", d, [16, 32]);
        let b = k.input("b", d, [32, 128]);
        let o = k.output("o", F32, [16, 128]);
        o.store(.., dot(a.load(..), b.load(..)));
        let kernel = k.build().unwrap();
        // Values whose products and sums of 32 stay exact in f32: small
        // integers and halves.
        let small = |n: usize, seed: u64| {
            let mut r = kernel_ir::SplitMix64(seed);
            (0..n)
                .map(|_| (r.below(9) as f64 - 4.0) / 2.0)
                .collect::<Vec<f64>>()
        };
        let aa = Array::new(d, [16, 32], small(16 * 32, 1)).unwrap();
        let ba = Array::new(d, [32, 128], small(32 * 128, 2)).unwrap();
        let want = kernels::reference::matmul(&aa, &ba);
        for backend in Backend::ALL {
            let out = run(backend, &kernel, &[aa.clone(), ba.clone()]).unwrap();
            assert_eq!(out[0].data(), &want[..], "{backend} {d}");
        }
    }
}

/// fp8 blocks tile like every 8-bit type: 32 sublane rows (4 per 32-bit
/// sublane slot), checked at the operand's line.
#[test]
fn fp8_blocks_tile_in_32_rows() {
    for d in [F8E4M3FN, F8E5M2] {
        let mut k = KernelBuilder::new("tiles");
        k.grid([4], [Parallel]);
        let line = line!() + 1;
        let x = k.input("x", d, [64, 128]).block([16, 128], |[i]| (i, 0));
        let o = k.output("o", F32, [64, 128]).block([16, 128], |[i]| (i, 0));
        o.store(.., x.load(..).convert(F32));
        let e = k.build().unwrap_err();
        let first = &e.0[0];
        assert!(first.to_string().contains("32"), "{first}");
        assert_eq!(first.loc.as_ref().map(|l| l.line), Some(line));
        assert_eq!(d.packing(), 4);
    }
}
