//! Counter-based random numbers: Threefry-2x32 with 20 rounds, the
//! generator behind `jax.random`'s default implementation, so a kernel's
//! bits equal `jax.random.bits` for the same key and shape.
//!
//! The generator is a pure function of a key and a counter, built here
//! from integer adds, xors and shifts on `i32` tiles (the `u32` words'
//! bit patterns; adds wrap on every path). Every path therefore computes
//! the same bits, interpreted or compiled, on the CPU, a TPU or a GPU, and
//! a backward pass regenerates a forward's mask from the same key and
//! indices instead of storing it.
//!
//! Why not the TPU's hardware generator (Mosaic's `prng_set_seed_32` /
//! `prng_random_bits`, Pallas's `pltpu.prng_seed`): its bits are not
//! specified, may differ between TPU generations, and no CPU path can
//! reproduce them (Pallas's interpret mode returns zeros), so no test could
//! check a kernel that uses them. It is cheaper on the vector unit (one op
//! per word against about 120 integer ops per pair of words here) and is
//! the fast path to add later, as an opt-in whose answer is "some bits"
//! rather than `jax.random`'s.
//!
//! ```
//! use kernel_ir::prelude::*;
//! use kernel_ir::random::Key;
//!
//! // A dropout mask over a [128, 128] array, 32 rows per grid step (a bool
//! // block's sublane tile); the key arrives as two scalar-prefetch words.
//! let mut k = KernelBuilder::new("mask");
//! k.grid([4], [Parallel]);
//! let seed = k.scalar_prefetch("seed", [2]);
//! let o = k.output("o", Bool, [128, 128]).block([32, 128], |[i]| (i, 0));
//! let key = Key::new(seed.load([0]), seed.load([1]));
//! let index = Key::flat_index([128, 128], [32, 128], [(program_id(0) * 32).into(), 0.into()]);
//! o.store(.., key.bernoulli(0.9f32, index));
//! let kernel = k.build().unwrap();
//! let words = Array::new(I32, [2], vec![0.0, 42.0]).unwrap(); // jax.random.key(42)
//! let keep = interpret(&kernel, &[words]).unwrap();
//! let kept = keep[0].data().iter().filter(|&&v| v != 0.0).count();
//! assert!((14300..15200).contains(&kept)); // about 0.9 of 16384
//! ```

use super::tile::{IntoOperand, Tile, constant, select};
use crate::DType;

/// The rotations of Threefry-2x32, four per round group, alternating.
const ROTATIONS: [[i32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
/// The key schedule's parity constant (Threefish's `C240` for 32-bit words).
const PARITY: i32 = 0x1BD1_1BDA;

/// A Threefry-2x32 key: two 32-bit words held as `i32` tiles (scalars,
/// usually, from scalar prefetch or [`Key::fold_in`]; tiles work too).
/// `jax.random.key_data(key)` viewed as `int32` gives the two words;
/// `jax.random.key(seed)` for `0 ≤ seed < 2³¹` is `(0, seed)`.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// The first word.
    pub k0: Tile,
    /// The second word.
    pub k1: Tile,
}

impl Key {
    /// The key of two `i32` words.
    pub fn new(k0: Tile, k1: Tile) -> Key {
        Key { k0, k1 }
    }

    /// `jax.random.fold_in(key, data)`: the key hashed with a 32-bit
    /// value, a new key for each grid step, batch or head.
    #[track_caller]
    pub fn fold_in(self, data: impl IntoOperand) -> Key {
        let zero = constant(0, DType::I32, self.k0.shape());
        let data = zero + data;
        let (k0, k1) = threefry2x32(self, zero, data);
        Key { k0, k1 }
    }

    /// 32 random bits per element of `index` (an `i32` tile of flat
    /// indices, see [`Key::flat_index`]): element `n` of
    /// `jax.random.bits(key, shape, uint32)`, viewed as `int32`, for
    /// arrays of fewer than 2³¹ elements.
    #[track_caller]
    pub fn bits(self, index: Tile) -> Tile {
        let zero = constant(0, DType::I32, index.shape());
        let (x0, x1) = threefry2x32(self, zero, index);
        x0 ^ x1
    }

    /// `f32` values uniform in `[0, 1)`: `jax.random.uniform(key, shape)`
    /// at the flat indices `index`, bit for bit (the top 23 bits as the
    /// mantissa: multiples of 2⁻²³).
    #[track_caller]
    pub fn uniform(self, index: Tile) -> Tile {
        let mantissa = self.bits(index).shr_logical(9);
        mantissa.convert(DType::F32) * (2f64).powi(-23)
    }

    /// `true` with probability `p` (an `f32`): `jax.random.bernoulli(key,
    /// p, shape)` at the flat indices `index`, bit for bit
    /// (`uniform < p`).
    #[track_caller]
    pub fn bernoulli(self, p: impl IntoOperand, index: Tile) -> Tile {
        self.uniform(index).lt(p)
    }

    /// The row-major flat index of each element of a `block`-shaped tile
    /// at `origin` (the block's first element's index per dim) in an array
    /// of `shape`: the counters that make a kernel's blocks together equal
    /// `jax.random.bits(key, shape)`. An `i32` tile of `block`'s shape.
    #[track_caller]
    pub fn flat_index<const N: usize>(
        shape: [usize; N],
        block: [usize; N],
        origin: [IndexOrigin; N],
    ) -> Tile {
        let mut stride = 1usize;
        let mut index: Option<Tile> = None;
        for d in (0..N).rev() {
            let along = super::tile::iota(DType::I32, block.to_vec(), d);
            let at = match origin[d] {
                IndexOrigin::Fixed(v) => along + v,
                IndexOrigin::Tile(t) => along + t,
            };
            let term = at * i64::try_from(stride).unwrap_or(i64::MAX);
            index = Some(match index {
                None => term,
                Some(i) => i + term,
            });
            stride = stride.saturating_mul(shape[d]);
        }
        index.unwrap_or_else(|| constant(0, DType::I32, Vec::new()))
    }
}

/// Where a block starts along one dim, for [`Key::flat_index`]: a number
/// known when the kernel is built or an `i32` scalar tile (a grid index
/// times the block size).
#[derive(Clone, Copy, Debug)]
pub enum IndexOrigin {
    /// Known when built.
    Fixed(i64),
    /// Computed in the kernel.
    Tile(Tile),
}

impl From<Tile> for IndexOrigin {
    fn from(t: Tile) -> IndexOrigin {
        IndexOrigin::Tile(t)
    }
}

impl From<i64> for IndexOrigin {
    fn from(v: i64) -> IndexOrigin {
        IndexOrigin::Fixed(v)
    }
}

impl From<i32> for IndexOrigin {
    fn from(v: i32) -> IndexOrigin {
        IndexOrigin::Fixed(v.into())
    }
}

/// `x` rounded to `to` stochastically with the random words `bits` (an
/// `i32` tile of `x`'s shape, from [`Key::bits`]): to one of the two
/// values of `to` around `x`, up with probability equal to `x`'s distance
/// from the lower one over their spacing, so the result's expectation is
/// `x` (unbiased, unlike round-to-nearest, which loses small updates).
///
/// `to` is `bf16`, `f16`, `f8e4m3fn` or `f8e5m2` (any other type: plain
/// `convert`); `x` is read as `f32`. The answer on every path: within
/// `to`'s normal range the probability is exact (the low `23 − mantissa`
/// random bits added to `x`'s bit pattern, which is then truncated); in its
/// subnormal range likewise down to one spacing, and below one spacing
/// `x` becomes the spacing with probability `|x| / spacing` at 2⁻²³
/// resolution; inputs below 2⁻¹²⁶ in magnitude (f32 subnormals, which
/// TPUs flush) give ±0; NaN, infinities and magnitudes above `to`'s
/// largest finite value give what `convert` gives.
#[track_caller]
pub fn stochastic_round(x: Tile, to: DType, bits: Tile) -> Tile {
    let (mantissa, emin): (i32, i32) = match to {
        DType::BF16 => (7, -126),
        DType::F16 => (10, -14),
        DType::F8E4M3FN => (3, -6),
        DType::F8E5M2 => (2, -14),
        _ => return x.convert(to),
    };
    let x = x.convert(DType::F32);
    let pattern = x.bitcast(DType::I32);
    let sign = pattern & i32::MIN;
    let magnitude = pattern & i32::MAX;
    let exponent = magnitude.shr_logical(23) - 127;
    // Low pattern bits below `to`'s spacing at this exponent (more in its
    // subnormal range); random bits added there carry into the kept ones
    // with exactly the probability the dropped ones make.
    let dropped = (emin - exponent).max(0) + (23 - mantissa);
    let low: Tile = (1i32 << dropped) - 1;
    let rounded = ((magnitude + (bits & low)) & !low).bitcast(DType::F32);
    // Below one spacing: the spacing or zero.
    let spacing = (2f64).powi(emin - mantissa);
    let unit = bits.shr_logical(9).convert(DType::F32) * (2f64).powi(-23);
    let abs = magnitude.bitcast(DType::F32);
    let tiny = select(unit.lt(abs * (1.0 / spacing)), spacing, 0.0);
    let up_to = select(exponent.ge(emin - mantissa), rounded, tiny);
    let flushed = select(exponent.eq(-127), 0.0, up_to);
    let signed = (flushed.bitcast(DType::I32) | sign).bitcast(DType::F32);
    select(abs.le(to.max_finite()), signed, x).convert(to)
}

/// `x` rotated left by `r` bits as a 32-bit word.
#[track_caller]
fn rotate_left(x: Tile, r: i32) -> Tile {
    (x << r) | x.shr_logical(32 - r)
}

/// The Threefry-2x32 block function (20 rounds) of `key` on the counter
/// words `(x0, x1)`: the two output words. The counter words broadcast
/// with the key's.
#[track_caller]
pub fn threefry2x32(key: Key, x0: Tile, x1: Tile) -> (Tile, Tile) {
    let ks = [key.k0, key.k1, key.k0 ^ key.k1 ^ PARITY];
    let mut x = [x0 + ks[0], x1 + ks[1]];
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x[0] += x[1];
            x[1] = rotate_left(x[1], r);
            x[1] = x[0] ^ x[1];
        }
        // Key injection after each group of four rounds.
        let s = group + 1;
        x[0] += ks[s % 3];
        x[1] += ks[(s + 1) % 3] + s as i32;
    }
    (x[0], x[1])
}
