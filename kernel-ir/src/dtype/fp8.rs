//! The two 8-bit float formats: bit layouts, decoding, and rounding from
//! an exact value.
//!
//! `E4M3FN` (OCP "E4M3", ml_dtypes `float8_e4m3fn`): bias 7, no
//! infinities, NaN is `S.1111.111`, largest finite 448, smallest
//! subnormal 2⁻⁹. `E5M2` (ml_dtypes `float8_e5m2`): bias 15, IEEE-style
//! infinities (`S.11111.00`) and NaNs, largest finite 57344, smallest
//! subnormal 2⁻¹⁶. Rounding is to nearest, ties to even, with subnormals;
//! a value past the largest finite one after rounding (and ∞) is NaN in
//! E4M3FN and ∞ in E5M2, as XLA's and ml_dtypes' (non-saturating)
//! conversions give.
//!
//! ```
//! use kernel_ir::DType;
//! assert_eq!(DType::F8E4M3FN.round(448.0), 448.0);
//! assert!(DType::F8E4M3FN.round(465.0).is_nan()); // past 448 + half a step
//! assert_eq!(DType::F8E4M3FN.round(1.0625), 1.0); // a tie: to even
//! assert_eq!(DType::F8E5M2.round(1e6), f64::INFINITY);
//! assert_eq!(DType::F8E4M3FN.round(2f64.powi(-10)), 0.0); // half the least subnormal: to even (0)
//! ```

/// One fp8 format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Exponent bits.
    pub exponent_bits: u32,
    /// Mantissa (fraction) bits.
    pub mantissa_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// No infinities; the all-ones pattern is the only NaN (E4M3FN).
    pub finite: bool,
}

/// `f8e4m3fn`.
pub const E4M3FN: Format = Format {
    exponent_bits: 4,
    mantissa_bits: 3,
    bias: 7,
    finite: true,
};

/// `f8e5m2`.
pub const E5M2: Format = Format {
    exponent_bits: 5,
    mantissa_bits: 2,
    bias: 15,
    finite: false,
};

/// A host `f8e4m3fn` value (its bit pattern), for typed code:
/// `In<f8e4m3fn>`, `Array::from_elems::<f8e4m3fn>`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct f8e4m3fn(pub u8);

/// A host `f8e5m2` value (its bit pattern).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct f8e5m2(pub u8);

impl Format {
    fn max_exponent_field(self) -> u32 {
        (1 << self.exponent_bits) - 1
    }

    /// The smallest normal exponent (unbiased).
    pub fn min_exponent(self) -> i32 {
        1 - self.bias
    }

    /// The largest finite value.
    pub fn max_finite(self) -> f64 {
        let m = self.mantissa_bits as i32;
        let (e, frac) = if self.finite {
            // All-ones exponent is still finite, but all-ones mantissa is NaN.
            (self.max_exponent_field() as i32 - self.bias, (1 << m) - 2)
        } else {
            (
                self.max_exponent_field() as i32 - 1 - self.bias,
                (1 << m) - 1,
            )
        };
        (1.0 + frac as f64 / (1u32 << m) as f64) * 2f64.powi(e)
    }

    /// The bit pattern of NaN (positive).
    pub fn nan_bits(self) -> u8 {
        if self.finite { 0x7f } else { 0x7e }
    }

    /// The value of a bit pattern.
    pub fn decode(self, bits: u8) -> f64 {
        let m = self.mantissa_bits;
        let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((bits >> m) as u32) & self.max_exponent_field();
        let frac = (bits as u32) & ((1 << m) - 1);
        // NaNs keep their sign bit (encode gives it back).
        let nan = if sign < 0.0 { -f64::NAN } else { f64::NAN };
        if e == self.max_exponent_field() {
            if self.finite {
                if frac == (1 << m) - 1 {
                    return nan;
                }
            } else if frac == 0 {
                return sign * f64::INFINITY;
            } else {
                return nan;
            }
        }
        let scale = |x: i32| 2f64.powi(x);
        if e == 0 {
            sign * frac as f64 * scale(self.min_exponent() - m as i32)
        } else {
            sign * (1.0 + frac as f64 / (1u32 << m) as f64) * scale(e as i32 - self.bias)
        }
    }

    /// The bit pattern nearest to `v` (see the module docs).
    pub fn encode(self, v: f64) -> u8 {
        let sign: u8 = if v.is_sign_negative() { 0x80 } else { 0 };
        if v.is_nan() {
            return self.nan_bits() | sign;
        }
        let overflow = if self.finite {
            self.nan_bits() | sign
        } else {
            ((self.max_exponent_field() << self.mantissa_bits) as u8) | sign
        };
        let a = v.abs();
        if a.is_infinite() {
            return overflow;
        }
        if a == 0.0 {
            return sign;
        }
        let m = self.mantissa_bits as i32;
        // The exponent of `a` (exact: from the f64 bits; f64 subnormals lie
        // far below the least fp8 subnormal and round to 0 below).
        let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let quantum = 2f64.powi(e.max(self.min_exponent()) - m);
        let r = (a / quantum).round_ties_even() * quantum;
        if r > self.max_finite() {
            return overflow;
        }
        if r == 0.0 {
            return sign;
        }
        let re = ((r.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let bits = if re < self.min_exponent() {
            (r / 2f64.powi(self.min_exponent() - m)) as u32
        } else {
            let frac = ((r / 2f64.powi(re) - 1.0) * (1u32 << m) as f64) as u32;
            (((re + self.bias) as u32) << m) | frac
        };
        bits as u8 | sign
    }

    /// `v` rounded to this format.
    pub fn round(self, v: f64) -> f64 {
        self.decode(self.encode(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bit pattern decodes to a value that encodes back to it (NaNs
    /// to the canonical NaN), values are ordered like their patterns, and
    /// the limits are the formats' published ones.
    #[test]
    fn every_pattern_round_trips_and_the_limits_are_right() {
        for f in [E4M3FN, E5M2] {
            let mut finite = Vec::new();
            for b in 0..=255u8 {
                let v = f.decode(b);
                if v.is_nan() {
                    // Every NaN pattern: the canonical NaN of its sign.
                    assert_eq!(f.encode(v), f.nan_bits() | (b & 0x80));
                    continue;
                }
                let back = f.encode(v);
                // -0.0 and 0.0 keep their signs.
                assert_eq!(back, b, "{f:?} pattern {b:#04x} = {v}");
                if v.is_finite() && b < 0x80 {
                    finite.push(v);
                }
            }
            assert!(finite.windows(2).all(|w| w[0] < w[1]), "{f:?} not monotone");
        }
        assert_eq!(E4M3FN.max_finite(), 448.0);
        assert_eq!(E5M2.max_finite(), 57344.0);
        assert_eq!(E4M3FN.decode(0x01), 2f64.powi(-9));
        assert_eq!(E5M2.decode(0x01), 2f64.powi(-16));
        assert_eq!(E5M2.decode(0x7c), f64::INFINITY);
        assert!(E4M3FN.decode(0x7f).is_nan() && E4M3FN.decode(0xff).is_nan());
        assert_eq!(E4M3FN.decode(0x7e), 448.0);
        assert_eq!(E4M3FN.decode(0x78), 256.0); // the all-ones exponent is finite
    }

    /// Rounding: to nearest, ties to even, at every binade and in the
    /// subnormals; overflow as documented.
    #[test]
    fn rounding_is_to_nearest_even_and_overflow_is_documented() {
        for f in [E4M3FN, E5M2] {
            // Midpoints between consecutive finite positives round to the
            // one with the even pattern.
            for b in 0..0x7eu8 {
                let (lo, hi) = (f.decode(b), f.decode(b + 1));
                if !hi.is_finite() || hi.is_nan() {
                    continue;
                }
                let mid = (lo + hi) / 2.0;
                let want = if b % 2 == 0 { b } else { b + 1 };
                assert_eq!(f.encode(mid), want, "{f:?} midpoint of {b:#04x}");
                assert_eq!(f.encode(lo + (hi - lo) * 0.25), b);
                assert_eq!(f.encode(lo + (hi - lo) * 0.75), b + 1);
                assert_eq!(f.encode(-mid), want | 0x80);
            }
        }
        // 448 + 16 (half a step of 32) is a tie between 448 (even) and 480
        // (the NaN pattern): it stays 448; anything above overflows.
        assert_eq!(E4M3FN.round(464.0), 448.0);
        assert!(E4M3FN.round(464.1).is_nan());
        assert!(E4M3FN.round(f64::INFINITY).is_nan());
        assert_eq!(E5M2.round(61439.0), 57344.0);
        assert_eq!(E5M2.round(61440.0), f64::INFINITY);
        assert_eq!(E5M2.round(f64::NEG_INFINITY), f64::NEG_INFINITY);
        assert_eq!(E4M3FN.round(1e-30), 0.0);
    }

    /// The bit patterns ml_dtypes 0.6.0 (jax 0.11.2's, the peer) gives for
    /// a spread of values, NaN included.
    #[test]
    fn encoding_agrees_with_ml_dtypes() {
        let xs = [
            1.2301533574825744e-06,
            0.02987455375084699,
            -0.2741378553622176,
            -8.905918387572742,
            -136.40123555151678,
            -29749.39664989387,
            -0.7,
            0.0029296875,
            -3.814697265625e-05,
        ];
        let e4m3fn = [0u8, 15, 169, 209, 241, 255, 179, 2, 128];
        let e5m2 = [0u8, 40, 180, 200, 216, 247, 186, 26, 130];
        for (i, &x) in xs.iter().enumerate() {
            assert_eq!(E4M3FN.encode(x), e4m3fn[i], "e4m3fn {x}");
            assert_eq!(E5M2.encode(x), e5m2[i], "e5m2 {x}");
        }
        assert_eq!((E4M3FN.encode(f64::NAN), E5M2.encode(f64::NAN)), (127, 126));
        assert!(E4M3FN.round(464.1).is_nan() && E4M3FN.round(480.0).is_nan());
        assert_eq!(E4M3FN.round(2f64.powi(-10) * 1.01), 2f64.powi(-9));
        assert_eq!(E5M2.round(3.0 * 2f64.powi(-17)), 2f64.powi(-15));
    }
}
