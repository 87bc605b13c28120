//! The Python helper functions a program may call (floor division and
//! remainder of index maps, NaN-propagating min/max, saturating and
//! fp8 conversions by the bits).

/// Helper functions a program may call, with their source; a program
/// includes the ones it uses.
pub(super) const HELPERS: &[(&str, &str)] = &[
    (
        "_tsr_floordiv",
        "@triton.jit\ndef _tsr_floordiv(a, b):\n    # Floor division (index maps); Triton's `//` truncates toward zero.\n    q = a // b\n    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)\n",
    ),
    (
        "_tsr_mod",
        "@triton.jit\ndef _tsr_mod(a, b):\n    # The remainder with the divisor's sign (index maps).\n    r = a % b\n    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)\n",
    ),
    (
        "_tsr_max",
        "@triton.jit\ndef _tsr_max(a, b):\n    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
    ),
    (
        "_tsr_min",
        "@triton.jit\ndef _tsr_min(a, b):\n    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
    ),
    (
        "_tsr_to_int",
        "@triton.jit\ndef _tsr_to_int(x, dtype: tl.constexpr, lo: tl.constexpr, hi: tl.constexpr, imax: tl.constexpr):\n    # f32 to an integer type: truncate toward zero, saturate at the type's bounds (lo, the largest f32 below -lo, imax); NaN is 0.\n    t = tl.where(x == x, tl.minimum(tl.maximum(x, lo), hi), 0.0)\n    return tl.where(x >= -lo, imax, t.to(dtype)).to(dtype)\n",
    ),
    (
        "_tsr_to_f8e4m3fn",
        r#"@triton.jit
def _tsr_to_f8e4m3fn(x):
    # f32 to f8e4m3fn by the bits, rounding to nearest even (the hardware
    # conversion saturates, Triton's interpreter rounds ties up): past the
    # largest finite value (448) is NaN, S.1111.111 (no infinity).
    bits = x.to(tl.uint32, bitcast=True)
    sign = ((bits >> 31) << 7).to(tl.uint8)
    a = bits & 0x7FFFFFFF
    # Below 2^-6: multiples of 2^-9, rounded by an f32 add.
    q = (a.to(tl.float32, bitcast=True) * 512.0 + 8388608.0) - 8388608.0
    sub = q.to(tl.uint32)
    # Normal: keep 3 of f32's 23 mantissa bits, then rebias 127 -> 7.
    r = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    mag = tl.where(a < 0x3C800000, sub, r)
    mag = tl.where((mag > 0x7E) | (a > 0x7F800000), 0x7F, mag)
    return (sign | mag.to(tl.uint8)).to(tl.float8e4nv, bitcast=True)
"#,
    ),
    (
        "_tsr_from_f8e4m3fn",
        r#"@triton.jit
def _tsr_from_f8e4m3fn(x):
    # f8e4m3fn to f32 by the bits: S.1111.111 is NaN (no infinity).
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 3) & 0xF
    m = b & 7
    normal = ((e + 120) << 23) | (m << 20)
    mag = tl.where(e == 0, (m.to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True), normal)
    mag = tl.where((b & 0x7F) == 0x7F, 0x7FC00000, mag)
    return (mag | ((b >> 7) << 31)).to(tl.float32, bitcast=True)
"#,
    ),
    (
        "_tsr_from_f8e5m2",
        r#"@triton.jit
def _tsr_from_f8e5m2(x):
    # f8e5m2 to f32 by the bits (exponent 31: infinity or NaN).
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 2) & 0x1F
    m = b & 3
    normal = ((e + 112) << 23) | (m << 21)
    mag = tl.where(e == 0, (m.to(tl.float32) * 0.0000152587890625).to(tl.uint32, bitcast=True), normal)
    mag = tl.where(e == 31, tl.where(m == 0, 0x7F800000, 0x7FC00000), mag)
    return (mag | ((b >> 7) << 31)).to(tl.float32, bitcast=True)
"#,
    ),
    (
        "_tsr_to_f8e5m2",
        r#"@triton.jit
def _tsr_to_f8e5m2(x):
    # f32 to f8e5m2 by the bits, rounding to nearest even (the hardware
    # conversion saturates): past the largest finite value (57344) is
    # infinity; NaN stays NaN.
    bits = x.to(tl.uint32, bitcast=True)
    sign = ((bits >> 31) << 7).to(tl.uint8)
    a = bits & 0x7FFFFFFF
    # Below 2^-14: multiples of 2^-16, rounded by an f32 add.
    q = (a.to(tl.float32, bitcast=True) * 65536.0 + 8388608.0) - 8388608.0
    sub = q.to(tl.uint32)
    # Normal: keep 2 of f32's 23 mantissa bits, then rebias 127 -> 15.
    r = ((a + 0xFFFFF + ((a >> 21) & 1)) >> 21) - (112 << 2)
    mag = tl.where(a < 0x38800000, sub, r)
    mag = tl.where(mag > 0x7C, 0x7C, mag)
    mag = tl.where(a > 0x7F800000, 0x7E, mag)
    return (sign | mag.to(tl.uint8)).to(tl.float8e5, bitcast=True)
"#,
    ),
];
