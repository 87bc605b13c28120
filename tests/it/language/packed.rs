//! 4-bit values (issue 48 item 4): unpacking two-per-byte storage and the
//! `int4`, `float4_e2m1fn` and `float8_e8m0fnu` codecs in a kernel, on
//! every path against the host codecs of `kernel_ir::fp4` (which
//! `tests/conformance/fp4.py` checks against `ml_dtypes`), over every byte
//! and code and the rounding cases; libtpu compiles them for every
//! generation.

use kernel_ir::fp4;
use kernel_ir::prelude::*;
use kernel_ir::{SplitMix64, VerifiedKernel};
use kernels::check::Tolerance;
use proptest::prelude::*;

use crate::common::all_paths;

const ROWS: usize = 8;
const COLS: usize = 128;

fn codecs() -> Result<VerifiedKernel, kernel_ir::KernelErrors> {
    let mut k = KernelBuilder::new("codecs");
    k.grid([1], [Parallel]);
    let w = k
        .input("w", I8, [ROWS, COLS])
        .block([ROWS, COLS], |[_]| (0, 0));
    let x = k
        .input("x", F32, [2 * ROWS, COLS])
        .block([2 * ROWS, COLS], |[_]| (0, 0));
    let out = |k: &mut KernelBuilder, name: &str, dtype, shape: [usize; 2]| {
        k.output(name, dtype, shape).block(shape, |[_]| (0, 0))
    };
    let tall = [2 * ROWS, COLS];
    let o = [
        out(&mut k, "rows", I32, tall),
        out(&mut k, "lanes", I32, [ROWS, 2 * COLS]),
        out(&mut k, "int4", I32, tall),
        out(&mut k, "e2m1", F32, tall),
        out(&mut k, "e8m0", F32, [ROWS, COLS]),
        out(&mut k, "to_e2m1", I32, tall),
        out(&mut k, "to_e8m0", I32, tall),
        out(&mut k, "repacked", I8, [ROWS, COLS]),
    ];
    let (wv, xv) = (w.load(..), x.load(..));
    let codes = wv.unpack_nibbles(0);
    o[0].store(.., codes);
    o[1].store(.., wv.unpack_nibbles(1));
    o[2].store(.., codes.decode_int4());
    o[3].store(.., codes.decode_e2m1());
    // NaN (code 255) as -1: a NaN never passes the check.
    let scale = wv.decode_e8m0();
    o[4].store(.., select(scale.ne(scale), -1.0, scale));
    o[5].store(.., xv.encode_e2m1());
    o[6].store(.., xv.encode_e8m0());
    o[7].store(.., codes.pack_nibbles(0));
    k.build()
}

/// Every byte four times, shuffled.
fn bytes(seed: u64) -> Vec<u8> {
    let mut b: Vec<u8> = (0..ROWS * COLS).map(|i| (i % 256) as u8).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..b.len()).rev() {
        b.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    b
}

/// The rounding cases of both encoders (ties, saturation, signs, the
/// specials), then random values over many magnitudes.
fn floats(seed: u64) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        0.25,
        0.2500001,
        0.75,
        0.7499999,
        1.25,
        1.2500001,
        1.75,
        2.5,
        2.5000002,
        3.5,
        5.0,
        5.0000005,
        6.0,
        7.0,
        100.0,
        -5.1,
        -0.25,
        1.4,
        1.5,
        1.4999999,
        3.0,
        6.0,
        0.75,
        3.4e38,
        1e-30,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let mut rng = SplitMix64(seed);
    while v.len() < 2 * ROWS * COLS {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let e = (rng.next_u64() % 60) as i32 - 30;
        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        v.push((sign * (1.0 + u) * 2f64.powi(e)) as f32);
    }
    v
}

fn wants(b: &[u8], x: &[f32]) -> Vec<Vec<f64>> {
    let nib = |r: usize, c: usize, cols: usize, rows_axis: bool| -> u8 {
        // Halves layout: the first half of the axis in the low nibbles.
        let (byte, high) = if rows_axis {
            (b[(r % ROWS) * cols + c], r >= ROWS)
        } else {
            (b[r * COLS + c % COLS], c >= COLS)
        };
        if high { byte >> 4 } else { byte & 15 }
    };
    let tall: Vec<u8> = (0..2 * ROWS * COLS)
        .map(|i| nib(i / COLS, i % COLS, COLS, true))
        .collect();
    vec![
        tall.iter().map(|&c| f64::from(c)).collect(),
        (0..ROWS * 2 * COLS)
            .map(|i| f64::from(nib(i / (2 * COLS), i % (2 * COLS), COLS, false)))
            .collect(),
        tall.iter()
            .map(|&c| f64::from(fp4::int4_value(c)))
            .collect(),
        tall.iter()
            .map(|&c| f64::from(fp4::e2m1_value(c)))
            .collect(),
        b.iter()
            .map(|&c| {
                let v = fp4::e8m0_value(c);
                if v.is_nan() { -1.0 } else { f64::from(v) }
            })
            .collect(),
        x.iter().map(|&v| f64::from(fp4::e2m1_code(v))).collect(),
        x.iter().map(|&v| f64::from(fp4::e8m0_code(v))).collect(),
        b.iter().map(|&c| f64::from(c as i8)).collect(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, ..ProptestConfig::default() })]

    #[test]
    fn four_bit_codecs_match_the_host_codecs_on_every_path(seed in any::<u64>()) {
        let b = bytes(seed);
        let x = floats(seed);
        let w = Array::new(I8, [ROWS, COLS], b.iter().map(|&c| f64::from(c as i8)).collect()).unwrap();
        let xs = Array::new(F32, [2 * ROWS, COLS], x.iter().map(|&v| f64::from(v)).collect()).unwrap();
        let exact = Tolerance { abs: 0.0, rel: 0.0 };
        all_paths(codecs(), &[w, xs], wants(&b, &x), &[exact; 8])?;
    }
}

#[test]
fn the_host_codecs_round_trip_and_pack_in_halves() {
    for c in 0..16u8 {
        // Every code decodes to a value that encodes back to it.
        assert_eq!(fp4::e2m1_code(fp4::e2m1_value(c)), c, "e2m1 {c}");
        assert_eq!(fp4::int4_code(fp4::int4_value(c)), c, "int4 {c}");
    }
    for c in 0..255u8 {
        assert_eq!(fp4::e8m0_code(fp4::e8m0_value(c)), c, "e8m0 {c}");
    }
    // Two blocks of 2 × 2 values along a [8] axis.
    let codes = [1, 2, 3, 4, 5, 6, 7, 8];
    assert_eq!(
        fp4::pack_halves(&codes, &[8], 0, 2),
        Some(vec![1 | 3 << 4, 2 | 4 << 4, 5 | 7 << 4, 6 | 8 << 4])
    );
    assert_eq!(fp4::pack_halves(&codes, &[8], 0, 3), None);
}

#[test]
fn four_bit_codecs_compile_with_libtpu_for_every_generation() {
    let tpu = crate::targets::tpu_compile::tpu();
    let kernel = codecs().unwrap();
    for t in kernel_ir::Target::ALL {
        if let Err(e) = tpu.compile_kernel(&kernel, t) {
            panic!("{t}: {e}");
        }
    }
}

/// `tests/conformance/fp4_codecs.kir` is this kernel printed: the
/// conformance run (`fp4.py`) runs it on every backend against `ml_dtypes`.
/// `TESSERA_BLESS=1` rewrites it.
#[test]
fn the_conformance_kernel_file_is_the_codecs_kernel_printed() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance/fp4_codecs.kir");
    let printed = codecs().unwrap().kernel().to_string();
    if std::env::var_os("TESSERA_BLESS").is_some() {
        std::fs::write(&path, &printed).unwrap();
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with TESSERA_BLESS=1", path.display()));
    assert_eq!(
        text, printed,
        "fp4_codecs.kir is stale; run with TESSERA_BLESS=1"
    );
    let back = kernel_ir::parse(&text).unwrap().verify().unwrap();
    assert_eq!(back.kernel().to_string(), printed, "round trip");
}
