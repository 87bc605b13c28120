//! Element types of tiles, buffers and arrays.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

pub mod fp4;
pub mod fp8;

/// The element type of a tile, buffer or array.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16: 8 exponent bits, 7 mantissa bits.
    BF16,
    /// IEEE binary16.
    F16,
    /// Two's complement 32-bit integer.
    I32,
    /// Two's complement 8-bit integer.
    I8,
    /// Boolean; one byte in memory, as on TPU.
    Bool,
    /// 8-bit float, 4 exponent bits (bias 7), 3 mantissa bits, finite:
    /// no infinities, one NaN pattern per sign (`S.1111.111`), largest
    /// value 448 (the OCP FP8 E4M3 format, `float8_e4m3fn`).
    F8E4M3FN,
    /// 8-bit float, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like:
    /// infinities and NaNs, largest finite value 57344 (`float8_e5m2`).
    F8E5M2,
}

impl DType {
    /// Every dtype, in a fixed order (useful for tests and listings).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I8,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E5M2,
    ];

    /// Width in bits of one element in memory.
    pub fn bits(self) -> u32 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::BF16 | DType::F16 => 16,
            DType::I8 | DType::Bool | DType::F8E4M3FN | DType::F8E5M2 => 8,
        }
    }

    /// Size in bytes of one element in memory.
    pub fn bytes(self) -> usize {
        self.bits() as usize / 8
    }

    /// The element type a buffer of this type has in TPU memory. Mosaic
    /// takes no `i1` memrefs, so bools are i32 there (as in Pallas); every
    /// other type is itself. The lowering converts at the boundary and the
    /// VMEM budget counts these bytes.
    pub fn tpu_memory_dtype(self) -> DType {
        match self {
            DType::Bool => DType::I32,
            d => d,
        }
    }

    /// How many elements share one 32-bit sublane slot: 32 / bitwidth.
    pub fn packing(self) -> usize {
        32 / self.bits() as usize
    }

    /// True for the floats: f32, bf16, f16 and the two fp8 formats.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32 | DType::BF16 | DType::F16 | DType::F8E4M3FN | DType::F8E5M2
        )
    }

    /// True for the 8-bit floats (`f8e4m3fn`, `f8e5m2`): storage and MXU
    /// operand types, converted to a wider float for any other arithmetic.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3FN | DType::F8E5M2)
    }

    /// True for i32 and i8.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I8)
    }

    /// True for float and integer types (everything but bool).
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// The short name used in printed IR (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::Bool => "bool",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Rounds an exact value to the nearest value this dtype can hold.
    ///
    /// Floats round to nearest even; integers truncate toward zero and wrap
    /// (two's complement), as a convert followed by the dtype's arithmetic
    /// does on hardware; bool is `v != 0`. NaN stays NaN for floats and
    /// becomes 0 for integers. The fp8 formats do not saturate, as XLA's
    /// and ml_dtypes' conversions do not: a value that rounds past the
    /// largest finite one is NaN in `f8e4m3fn` (which has no infinity) and
    /// ±∞ in `f8e5m2`; ∞ becomes NaN in `f8e4m3fn`.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => f32_widen(f32_narrow(v)),
            DType::BF16 => bf16::from_f64(v).to_f64(),
            DType::F16 => f16::from_f64(v).to_f64(),
            DType::I32 => wrap_int(v, 32),
            DType::I8 => wrap_int(v, 8),
            DType::F8E4M3FN => fp8::E4M3FN.round(v),
            DType::F8E5M2 => fp8::E5M2.round(v),
            DType::Bool => {
                if v != 0.0 && !v.is_nan() {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// A value of dtype `from` converted to this dtype: as [`DType::round`],
    /// except from a float to an integer type, which truncates toward zero
    /// and **saturates** at the type's bounds (±∞ too) with NaN as 0: the
    /// rule of XLA's convert, PTX's `cvt` and Rust's `as`, kept by every
    /// path (an integer to a narrower integer wraps).
    ///
    /// ```
    /// use kernel_ir::DType;
    /// assert_eq!(DType::I32.convert_from(DType::F32, 3.0e9), 2147483647.0);
    /// assert_eq!(DType::I8.convert_from(DType::F32, f64::NEG_INFINITY), -128.0);
    /// assert_eq!(DType::I32.convert_from(DType::F32, f64::NAN), 0.0);
    /// assert_eq!(DType::I8.convert_from(DType::I32, 200.0), -56.0);
    /// ```
    pub fn convert_from(self, from: DType, v: f64) -> f64 {
        if !(from.is_float() && self.is_int()) {
            return self.round(v);
        }
        if v.is_nan() {
            return 0.0;
        }
        let half = 2f64.powi(self.bits() as i32 - 1);
        v.trunc().clamp(-half, half - 1.0)
    }

    /// The bounds a float is clamped to before it converts to this integer
    /// type on the compiled paths: the type's minimum, and the largest f32
    /// below 2^(bits-1) (the maximum itself is not an f32 for i32; values
    /// at or past 2^(bits-1) become the maximum by a select).
    pub fn float_to_int_clamp(self) -> (f64, f64) {
        let half = 2f64.powi(self.bits() as i32 - 1);
        (
            -half,
            f64::from(f32::from_bits((half as f32).to_bits() - 1)).floor(),
        )
    }

    /// The largest finite value of a float dtype (`f64::MAX` for the
    /// others).
    pub fn max_finite(self) -> f64 {
        match self {
            DType::F32 => f64::from(f32::MAX),
            DType::BF16 => bf16::MAX.to_f64(),
            DType::F16 => f16::MAX.to_f64(),
            DType::F8E4M3FN => fp8::E4M3FN.max_finite(),
            DType::F8E5M2 => fp8::E5M2.max_finite(),
            _ => f64::MAX,
        }
    }

    /// Unit roundoff of a float dtype (half the distance from 1 to the next
    /// value); 0 for exact types.
    pub fn epsilon(self) -> f64 {
        match self {
            DType::F32 => f32::EPSILON as f64 / 2.0,
            DType::BF16 => 2f64.powi(-8),
            DType::F16 => 2f64.powi(-11),
            DType::F8E4M3FN => 2f64.powi(-4),
            DType::F8E5M2 => 2f64.powi(-3),
            _ => 0.0,
        }
    }
}

fn wrap_int(v: f64, bits: u32) -> f64 {
    if !v.is_finite() {
        return 0.0;
    }
    // Saturate into i64 first (as `as` does), then wrap to the width.
    let t = v.trunc() as i64;
    match bits {
        32 => t as i32 as f64,
        _ => t as i8 as f64,
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a dtype name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype `{0}`; expected one of f32, bf16, f16, i32, i8, bool, f8e4m3fn, f8e5m2")]
pub struct ParseDTypeError(pub String);

impl FromStr for DType {
    type Err = ParseDTypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| ParseDTypeError(s.to_string()))
    }
}

/// A Rust type that is the host representation of a [`DType`].
///
/// Implemented for `f32`, [`half::bf16`], [`half::f16`], `i32`, `i8` and
/// `bool`; lets typed code say `x.cast::<bf16>()` or
/// `Array::from_vec::<f32>(..)`.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype this Rust type stands for.
    const DTYPE: DType;
    /// Converts to f64 exactly.
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding as [`DType::round`] does.
    fn from_f64(v: f64) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        DType::I32.round(v) as i32
    }
}

impl Element for i8 {
    const DTYPE: DType = DType::I8;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        DType::I8.round(v) as i8
    }
}

impl Element for fp8::f8e4m3fn {
    const DTYPE: DType = DType::F8E4M3FN;
    fn to_f64(self) -> f64 {
        fp8::E4M3FN.decode(self.0)
    }
    fn from_f64(v: f64) -> Self {
        fp8::f8e4m3fn(fp8::E4M3FN.encode(v))
    }
}

impl Element for fp8::f8e5m2 {
    const DTYPE: DType = DType::F8E5M2;
    fn to_f64(self) -> f64 {
        fp8::E5M2.decode(self.0)
    }
    fn from_f64(v: f64) -> Self {
        fp8::f8e5m2(fp8::E5M2.encode(v))
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self { 1.0 } else { 0.0 }
    }
    fn from_f64(v: f64) -> Self {
        DType::Bool.round(v) != 0.0
    }
}

/// A float element a kernel can be built for at run time: `f32`,
/// [`half::bf16`] and [`half::f16`], and no other (sealed: a
/// `#[tpu_kernel]` whose type parameters are bounded by `Float` or [`Fp8`]
/// gets a `build_for` matching a [`DType`] against exactly these types).
/// Which of them a target accepts (no f16 on a TPU) is the verifier's
/// rule, not the bound's.
pub trait Float: Element + sealed::Sealed {}

impl Float for f32 {}
impl Float for half::bf16 {}
impl Float for half::f16 {}

/// An 8-bit float element: [`fp8::f8e4m3fn`] and [`fp8::f8e5m2`], and no
/// other (see [`Float`] for what the bound gives a kernel).
pub trait Fp8: Element + sealed::Sealed {}

impl Fp8 for fp8::f8e4m3fn {}
impl Fp8 for fp8::f8e5m2 {}

/// Keeps [`Float`] and [`Fp8`] to the types `build_for` dispatches over.
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for super::fp8::f8e4m3fn {}
    impl Sealed for super::fp8::f8e5m2 {}
}

/// `v` as an f64, a NaN's sign and payload kept bit for bit (its mantissa
/// shifted up), a signalling NaN left signalling: `as` quiets it on most
/// hardware (x86's `cvtss2sd`), and the interpreter must keep the bits a
/// bitcast round trip gives back, as every compiled path does.
pub(crate) fn f32_widen(v: f32) -> f64 {
    if !v.is_nan() {
        return v as f64;
    }
    let b = v.to_bits();
    let sign = u64::from(b >> 31) << 63;
    let mantissa = u64::from(b & 0x007f_ffff) << 29;
    f64::from_bits(sign | (0x7ff << 52) | mantissa)
}

/// `v` rounded to f32; a NaN keeps its sign and its payload's top 23 bits
/// (the inverse of [`f32_widen`]; a payload that leaves none nonzero
/// becomes the quiet NaN, as a NaN must stay one).
pub(crate) fn f32_narrow(v: f64) -> f32 {
    if !v.is_nan() {
        return v as f32;
    }
    let b = v.to_bits();
    let sign = ((b >> 63) as u32) << 31;
    let mut mantissa = ((b >> 29) & 0x007f_ffff) as u32;
    if mantissa == 0 {
        mantissa = 0x0040_0000;
    }
    f32::from_bits(sign | (0xff << 23) | mantissa)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f64".parse::<DType>().is_err());
    }

    #[test]
    fn rounding_matches_the_storage_type() {
        let x = 1.0 + 2f64.powi(-20);
        assert_eq!(DType::F32.round(x), x);
        assert_eq!(DType::BF16.round(x), 1.0);
        assert_eq!(DType::I32.round(2f64.powi(31)), -(2f64.powi(31)));
        assert_eq!(DType::I8.round(-3.7), -3.0);
        assert_eq!(DType::I8.round(130.0), -126.0);
        assert_eq!(DType::Bool.round(-2.0), 1.0);
        assert!(DType::F16.round(f64::NAN).is_nan());
    }

    #[test]
    fn packing_follows_bit_width() {
        assert_eq!(DType::F32.packing(), 1);
        assert_eq!(DType::BF16.packing(), 2);
        assert_eq!(DType::I8.packing(), 4);
    }
}
