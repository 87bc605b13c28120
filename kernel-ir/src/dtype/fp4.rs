//! The 4-bit formats current models ship weights in, and the MX block
//! scale that goes with them, as 4- and 8-bit codes: `int4` (two's
//! complement), `float4_e2m1fn` (1 sign, 2 exponent bits with bias 1, 1
//! mantissa bit; finite: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) and
//! `float8_e8m0fnu` (an exponent alone: code `e` is 2^(e − 127), 255 is
//! NaN). Conversions follow `ml_dtypes` bit for bit
//! (`tests/conformance/fp4.py` checks every code and the rounding cases).
//!
//! Kernels keep 4-bit values packed two per byte in `i8` arrays, in
//! Tessera's *halves* layout: along the packed axis, a block of `n` bytes
//! holds `2n` values, the first `n` in the low nibbles and the next `n` in
//! the high nibbles, so unpacking is one concatenation on every target
//! ([`crate::Tile::unpack_nibbles`]; [`pack_halves`] writes it on the host).
//!
//! ```
//! use kernel_ir::fp4;
//!
//! assert_eq!(fp4::e2m1_value(0b0111), 6.0);
//! assert_eq!(fp4::e2m1_code(2.5), 0b0100); // a tie: to even (2.0)
//! assert_eq!(fp4::int4_value(0b1000), -8);
//! assert_eq!(fp4::e8m0_value(127), 1.0);
//! assert_eq!(fp4::e8m0_code(1.5), 128); // ties round up, to 2.0
//! ```

/// The value of a `float4_e2m1fn` code (its low four bits).
pub fn e2m1_value(code: u8) -> f32 {
    let (e, m) = ((code >> 1) & 3, code & 1);
    let magnitude = if e == 0 {
        0.5 * f32::from(m)
    } else {
        f32::from(2 + m) * f32::powi(2.0, i32::from(e) - 2)
    };
    if code & 8 != 0 { -magnitude } else { magnitude }
}

/// The `float4_e2m1fn` code nearest `x` (ties to even), as `ml_dtypes`
/// converts: magnitudes past 6 (and infinities) saturate to ±6, the sign
/// is kept (−0 is `0b1000`), NaN becomes `0b1000`.
pub fn e2m1_code(x: f32) -> u8 {
    if x.is_nan() {
        return 0b1000;
    }
    let a = x.abs();
    // The boundaries between neighbours; at a tie the even code wins, so
    // the comparison is strict above an even code and not below it.
    let code = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    if x.is_sign_negative() { code | 8 } else { code }
}

/// The value of an `int4` code (its low four bits, two's complement).
pub fn int4_value(code: u8) -> i8 {
    ((code << 4) as i8) >> 4
}

/// The `int4` code of `v` in `-8..=7` (its low four bits).
pub fn int4_code(v: i8) -> u8 {
    (v as u8) & 0xF
}

/// The value of a `float8_e8m0fnu` code: 2^(code − 127), NaN for 255.
pub fn e8m0_value(code: u8) -> f32 {
    match code {
        255 => f32::NAN,
        // 2^-127 is an f32 subnormal.
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// The `float8_e8m0fnu` code of `x`, as `ml_dtypes` converts: the nearest
/// power of two with ties (a mantissa of 1.5 or more) rounding up; zero,
/// negatives, infinities, NaN and values past 2^127 give 255 (NaN);
/// values below 1.5 · 2^-127 give 0.
pub fn e8m0_code(x: f32) -> u8 {
    if x.is_nan() || x <= 0.0 || x.is_infinite() {
        return 255;
    }
    let bits = x.to_bits();
    let (exp, mant) = (bits >> 23, bits & 0x7F_FFFF);
    let code = if exp == 0 {
        // Subnormal: 2^-127 is mantissa 0x400000.
        u32::from(mant >= 0x60_0000)
    } else {
        exp + u32::from(mant >= 0x40_0000)
    };
    code.min(255) as u8
}

/// Packs 4-bit `codes` (row-major, `shape`) two per byte in the halves
/// layout along `axis`, in blocks of `block` bytes (the packed block a
/// kernel loads): within each block of `2 · block` values along the axis,
/// value `j < block` goes to byte `j`'s low nibble and value `block + j`
/// to its high nibble. `None` when `2 · block` does not divide the axis.
pub fn pack_halves(codes: &[u8], shape: &[usize], axis: usize, block: usize) -> Option<Vec<u8>> {
    let n = *shape.get(axis)?;
    if block == 0 || n % (2 * block) != 0 || codes.len() != shape.iter().product::<usize>() {
        return None;
    }
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out = vec![0u8; codes.len() / 2];
    for o in 0..outer {
        for i in 0..n / 2 {
            let (b, j) = (i / block, i % block);
            let lo = b * 2 * block + j;
            for c in 0..inner {
                let at = |v: usize| codes[(o * n + v) * inner + c] & 0xF;
                out[(o * (n / 2) + i) * inner + c] = at(lo) | (at(lo + block) << 4);
            }
        }
    }
    Some(out)
}
