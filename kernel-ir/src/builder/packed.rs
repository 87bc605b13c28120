//! 4-bit values in kernels: unpacking two-per-byte storage and decoding
//! `int4`, `float4_e2m1fn` and `float8_e8m0fnu` codes (and encoding
//! back), written with integer and compare-and-select ops so every path
//! runs them and agrees bit for bit with [`crate::fp4`] (`ml_dtypes`).
//!
//! ```
//! use kernel_ir::prelude::*;
//! use kernel_ir::fp4;
//!
//! // Packed fp4 weights times their power-of-two scale.
//! let mut k = KernelBuilder::new("dequant");
//! k.grid([1], [Parallel]);
//! let w = k.input("w", I8, [8, 128]).block([8, 128], |[_]| (0, 0));
//! let s = k.input("s", I8, [1, 128]).block([1, 128], |[_]| (0, 0));
//! let o = k.output("o", F32, [16, 128]).block([16, 128], |[_]| (0, 0));
//! let values = w.load(..).unpack_nibbles(0).decode_e2m1();
//! o.store(.., values * s.load(..).decode_e8m0());
//! let kernel = k.build().unwrap();
//!
//! let codes: Vec<u8> = (0..16 * 128).map(|i| (i % 16) as u8).collect();
//! let packed = fp4::pack_halves(&codes, &[16, 128], 0, 8).unwrap();
//! let w = Array::new(I8, [8, 128], packed.iter().map(|&b| b as i8 as f64).collect()).unwrap();
//! let s = Array::new(I8, [1, 128], vec![(128u8 as i8) as f64; 128]).unwrap(); // 2.0
//! let out = interpret(&kernel, &[w, s]).unwrap();
//! assert_eq!(out[0].data()[7], 2.0 * 6.0); // code 7 is 6.0
//! ```

use super::slice::concat;
use super::tile::{Tile, select};
use crate::DType;

impl Tile {
    /// Two 4-bit codes per byte of an `i8` tile, as `i32` codes `0..16`
    /// along `axis` twice as long: the low nibbles, then the high nibbles
    /// (the halves layout of [`crate::fp4`]).
    #[track_caller]
    pub fn unpack_nibbles(self, axis: usize) -> Tile {
        let bytes = self.convert(DType::I32);
        concat([bytes & 15, (bytes >> 4) & 15], axis)
    }

    /// `i32` codes `0..16` packed two per byte along `axis` (half as long):
    /// the first half of the axis into the low nibbles, the second into the
    /// high nibbles, as an `i8` tile. The inverse of
    /// [`Tile::unpack_nibbles`]; only each code's low four bits are kept.
    #[track_caller]
    pub fn pack_nibbles(self, axis: usize) -> Tile {
        let n = self.shape().get(axis).copied().unwrap_or(0);
        let lo = self.slice(axis, ..n / 2) & 15;
        let hi = self.slice(axis, n / 2..) & 15;
        let byte = lo | (hi << 4);
        // 0..256 as the i8 with the same bits.
        select(byte.ge(128), byte - 256, byte).convert(DType::I8)
    }

    /// `int4` codes (`0..16`) as their `i32` values, `-8..=7`.
    #[track_caller]
    pub fn decode_int4(self) -> Tile {
        let c = self.convert(DType::I32) & 15;
        select(c.ge(8), c - 16, c)
    }

    /// `float4_e2m1fn` codes (`0..16`) as `f32` values: ±{0, 0.5, 1, 1.5,
    /// 2, 3, 4, 6}.
    #[track_caller]
    pub fn decode_e2m1(self) -> Tile {
        let c = self.convert(DType::I32);
        let (e, m) = ((c >> 1) & 3, (c & 1).convert(DType::F32));
        // (2 + m) · 2^(e − 2) for e ≥ 1, m / 2 for e = 0.
        let scale = select(e.eq(1), 0.5, select(e.eq(2), 1.0, 2.0));
        let magnitude = select(e.eq(0), m * 0.5, (m + 2.0) * scale);
        select((c & 8).ne(0), -magnitude, magnitude)
    }

    /// `f32` values as `float4_e2m1fn` codes (`i32`, `0..16`), as
    /// [`crate::fp4::e2m1_code`]: nearest, ties to even, saturating at ±6,
    /// the sign kept, NaN to `0b1000`.
    #[track_caller]
    pub fn encode_e2m1(self) -> Tile {
        let x = self.convert(DType::F32);
        let a = x.abs();
        let step = |t: Tile| t.convert(DType::I32);
        let code = step(a.gt(0.25))
            + step(a.ge(0.75))
            + step(a.gt(1.25))
            + step(a.ge(1.75))
            + step(a.gt(2.5))
            + step(a.ge(3.5))
            + step(a.gt(5.0));
        // The sign bit, so -0 keeps it; NaN (unordered) is 0b1000.
        let negative = x.bitcast(DType::I32).lt(0) | x.ne(x);
        select(negative, code | 8, code)
    }

    /// `float8_e8m0fnu` codes (`i8` or `i32` bits `0..256`) as `f32`
    /// scales: 2^(code − 127), NaN for 255.
    #[track_caller]
    pub fn decode_e8m0(self) -> Tile {
        let c = self.convert(DType::I32) & 255;
        // 2^-127 is the f32 subnormal 0x00400000; 255 the quiet NaN's bits.
        let bits = select(c.eq(0), 0x0040_0000, c << 23);
        select(c.eq(255), 0x7FC0_0000, bits).bitcast(DType::F32)
    }

    /// `f32` values as `float8_e8m0fnu` codes (`i32`, `0..256`), as
    /// [`crate::fp4::e8m0_code`]: the nearest power of two, ties up; zero,
    /// negatives, infinities, NaN and overflow are 255.
    #[track_caller]
    pub fn encode_e8m0(self) -> Tile {
        let x = self.convert(DType::F32);
        let bits = x.bitcast(DType::I32);
        let (exp, mant) = ((bits >> 23) & 255, bits & 0x7F_FFFF);
        let normal = exp + mant.ge(0x40_0000).convert(DType::I32);
        let code = select(exp.eq(0), mant.ge(0x60_0000).convert(DType::I32), normal);
        // From the bits, not float compares, so a subnormal input is not
        // taken for zero where a target flushes denormals: a sign bit or
        // zero bits (≤ 0 as i32), or an all-ones exponent (inf, NaN).
        let bad = bits.le(0) | exp.eq(255);
        select(bad, 255, code.min(255))
    }
}
