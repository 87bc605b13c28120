//! Random numbers in kernels: the reference generator against Threefry's
//! published known answers, the integer shifts it is built from on every
//! path against Rust's wrapping shifts, and keys folded with grid indices
//! (scalar Threefry) on every path. The library's `random_bits` and
//! `dropout` run every path through their entries (`library_paths`), and
//! `tests/conformance/jax_random.py` checks them against `jax.random`.

use kernel_ir::prelude::*;
use kernel_ir::random::Key;
use kernels::check::Tolerance;
use kernels::reference;
use proptest::prelude::*;

use crate::common::all_paths;

const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };

#[test]
fn reference_threefry_gives_random123s_known_answers() {
    // Threefry-2x32, 20 rounds: Random123's kat_vectors (also jax's
    // `threefry_2x32` test vectors).
    let cases = [
        ([0, 0], [0, 0], [0x6b20_0159, 0x99ba_4efe]),
        (
            [0xffff_ffff, 0xffff_ffff],
            [0xffff_ffff, 0xffff_ffff],
            [0x1cb9_96fc, 0xbb00_2be7],
        ),
        (
            [0x1319_8a2e, 0x0370_7344],
            [0x243f_6a88, 0x85a3_08d3],
            [0xc492_3a9c, 0x483d_f7a0],
        ),
    ];
    for (key, ctr, want) in cases {
        assert_eq!(
            reference::threefry2x32(key, ctr),
            want,
            "key {key:x?} ctr {ctr:x?}"
        );
    }
}

#[test]
fn reference_uniform_is_uniform_on_0_1() {
    let n = 1 << 16;
    let draws: Vec<f32> = (0..n).map(|i| reference::uniform([3, 4], i)).collect();
    assert!(draws.iter().all(|u| (0.0..1.0).contains(u)));
    let mean = draws.iter().map(|&u| f64::from(u)).sum::<f64>() / f64::from(n);
    // The mean of 2^16 uniforms has a standard deviation of 0.0011.
    assert!((mean - 0.5).abs() < 0.006, "mean {mean}");
}

/// `o = x << y`, `x >>> y` (logical) and `x >> y` on i32 tiles.
fn shifts(rows: usize) -> Result<kernel_ir::VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("shifts");
    k.grid([1], [Parallel]);
    let x = k
        .input("x", I32, [rows, 128])
        .block([rows, 128], |[_]| (0, 0));
    let y = k
        .input("y", I32, [rows, 128])
        .block([rows, 128], |[_]| (0, 0));
    let outs: Vec<_> = ["shl", "shrl", "shra"]
        .iter()
        .map(|n| {
            k.output(*n, I32, [rows, 128])
                .block([rows, 128], |[_]| (0, 0))
        })
        .collect();
    let (xv, yv) = (x.load(..), y.load(..));
    outs[0].store(.., xv << yv);
    outs[1].store(.., xv.shr_logical(yv));
    outs[2].store(.., xv >> yv);
    k.build()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn shifts_take_the_amount_modulo_32_on_every_path(seed in any::<u64>()) {
        let rows = 8;
        let mut rng = kernel_ir::SplitMix64(seed);
        let xs: Vec<i32> = (0..rows * 128).map(|_| rng.next_u64() as i32).collect();
        // Amounts in range and out of it, negative included.
        let ys: Vec<i32> = (0..rows * 128).map(|_| (rng.next_u64() % 81) as i32 - 40).collect();
        let arr = |v: &[i32]| Array::new(I32, [rows, 128], v.iter().map(|&a| f64::from(a)).collect()).unwrap();
        let want = |f: fn(i32, u32) -> i32| -> Vec<f64> {
            xs.iter().zip(&ys).map(|(&a, &b)| f64::from(f(a, b as u32))).collect()
        };
        all_paths(
            shifts(rows),
            &[arr(&xs), arr(&ys)],
            vec![
                want(|a, b| a.wrapping_shl(b)),
                want(|a, b| (a as u32).wrapping_shr(b) as i32),
                want(|a, b| a.wrapping_shr(b)),
            ],
            &[EXACT],
        )?;
    }

    #[test]
    fn keys_folded_with_grid_indices_match_the_reference_on_every_path(k0 in any::<i32>(), k1 in any::<i32>()) {
        // Each grid step folds its index into the key on scalars (the TPU's
        // scalar unit), then draws a row of uniforms and a dropout mask.
        // (32 rows: a bool block's sublane tile.)
        let (steps, rows, n) = (4usize, 32usize, 256usize);
        let mut k = KernelBuilder::new("folded");
        k.grid([steps], [Parallel]);
        let seed = k.scalar_prefetch("seed", [2]);
        let u = k.output("u", F32, [steps * rows, n]).block([rows, n], |[i]| (i, 0));
        let keep = k.output("keep", Bool, [steps * rows, n]).block([rows, n], |[i]| (i, 0));
        let key = Key::new(seed.load([0]), seed.load([1])).fold_in(program_id(0));
        let index = Key::flat_index([rows, n], [rows, n], [0.into(), 0.into()]);
        u.store(.., key.uniform(index));
        keep.store(.., key.bernoulli(0.3f32, index));
        let kernel = k.build();
        let key = [k0 as u32, k1 as u32];
        let (mut us, mut keeps) = (Vec::new(), Vec::new());
        for step in 0..steps {
            let folded = reference::threefry_fold_in(key, step as u32);
            for i in 0..rows * n {
                let v = reference::uniform(folded, i as u32);
                us.push(f64::from(v));
                keeps.push(f64::from(u8::from(v < 0.3)));
            }
        }
        let words = Array::new(I32, [2], vec![f64::from(k0), f64::from(k1)]).unwrap();
        all_paths(kernel, &[words], vec![us, keeps], &[EXACT])?;
    }
}

/// `x` (f32) stochastically rounded to each narrow float type with the
/// bits of `key` at each element's flat index.
fn stochastic(
    rows: usize,
    cols: usize,
) -> Result<kernel_ir::VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("stochastic");
    k.grid([1], [Parallel]);
    let seed = k.scalar_prefetch("seed", [2]);
    let x = k
        .input("x", F32, [rows, cols])
        .block([rows, cols], |[_]| (0, 0));
    let key = Key::new(seed.load([0]), seed.load([1]));
    let bits = key.bits(Key::flat_index(
        [rows, cols],
        [rows, cols],
        [0.into(), 0.into()],
    ));
    let xv = x.load(..);
    for to in NARROW {
        let o = k
            .output(to.name(), to, [rows, cols])
            .block([rows, cols], |[_]| (0, 0));
        o.store(.., kernel_ir::random::stochastic_round(xv, to, bits));
    }
    k.build()
}

// f16 too, but kernels cannot hold f16 vectors on TPUs (the verifier says so).
const NARROW: [DType; 3] = [BF16, F8E4M3FN, F8E5M2];

fn words(k0: i32, k1: i32) -> Array {
    Array::new(I32, [2], vec![f64::from(k0), f64::from(k1)]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn stochastic_rounding_matches_its_definition_on_every_path(
        k0 in any::<i32>(), k1 in any::<i32>(), seed in any::<u64>(),
    ) {
        let (rows, cols) = (8, 256);
        let mut rng = kernel_ir::SplitMix64(seed);
        // Magnitudes from 2^-30 to 2^8 (every type's normal and subnormal
        // ranges, within e4m3fn's 448
        // ranges), both signs, and the edges: zeros, an f32 subnormal, fp8's
        // largest finite values.
        let mut xs: Vec<f32> = (0..rows * cols)
            .map(|_| {
                let m = (rng.next_u64() % 1_000_000) as f64 / 1e6;
                let e = (rng.next_u64() % 38) as i32 - 30;
                let s = if rng.next_u64().is_multiple_of(2) { 1.0 } else { -1.0 };
                (s * (1.0 + m) * 2f64.powi(e)) as f32
            })
            .collect();
        xs[..6].copy_from_slice(&[0.0, -0.0, 1e-40, -448.0, 447.9, 57344.0 / 256.0]);
        let key = [k0 as u32, k1 as u32];
        let wants: Vec<Vec<f64>> = NARROW
            .iter()
            .map(|&to| {
                xs.iter()
                    .enumerate()
                    .map(|(i, &x)| reference::stochastic_round(x, to, reference::random_bits(key, i as u32)))
                    .collect()
            })
            .collect();
        let x = Array::new(F32, [rows, cols], xs.iter().map(|&v| f64::from(v)).collect()).unwrap();
        all_paths(stochastic(rows, cols), &[words(k0, k1), x], wants, &[EXACT])?;
    }
}

#[test]
fn stochastic_rounding_is_unbiased_where_nearest_is_not() {
    // x three tenths of a spacing above a value of each type: the mean of
    // 16k stochastic roundings is x (within 5 standard errors), while
    // round-to-nearest always gives the lower neighbour.
    let (rows, cols) = (64, 256);
    let n = (rows * cols) as f64;
    let kernel = stochastic(rows, cols).unwrap();
    for (t, to) in NARROW.iter().enumerate() {
        for base in [1.0f64, -40.0, 0.375] {
            // The spacing of `to` in base's binade: 2 epsilon per power of 2.
            let spacing = 2f64.powi(base.abs().log2().floor() as i32) * 2.0 * to.epsilon();
            let x = f64::from((base + base.signum() * 0.3 * spacing) as f32);
            let arr = Array::new(F32, [rows, cols], vec![x; rows * cols]).unwrap();
            let outs = kernel_ir::interpret(&kernel, &[words(11, 22), arr]).unwrap();
            let out = outs[t].data();
            let mean = out.iter().sum::<f64>() / n;
            let values: std::collections::BTreeSet<u64> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                values.len(),
                2,
                "{to}: not two neighbours for {x}: {values:?}"
            );
            // The standard error of a mean of n two-valued draws.
            let allowed = 5.0 * spacing * (0.21 / n).sqrt();
            assert!(
                (mean - x).abs() <= allowed,
                "{to}: mean {mean} of x {x}, allowed {allowed}"
            );
            assert!(
                (to.round(x) - x).abs() > allowed,
                "{to}: nearest is as good at {x}"
            );
        }
    }
}

#[test]
fn random_bits_and_stochastic_rounding_compile_with_libtpu_for_every_generation() {
    // Threefry's shifts, the bitcasts and the selects of stochastic
    // rounding, as Mosaic and the TPU back end take them.
    let tpu = crate::targets::tpu_compile::tpu();
    let kernel = stochastic(8, 256).unwrap();
    for t in kernel_ir::Target::ALL {
        if let Err(e) = tpu.compile_kernel(&kernel, t) {
            panic!("{t}: {e}");
        }
    }
}
