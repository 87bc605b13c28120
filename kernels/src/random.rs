//! Random numbers in kernels, bit for bit `jax.random`'s (Threefry-2x32,
//! [`kernel_ir::random`]): [`random_bits`](mod@random_bits) fills an
//! array with `jax.random.bits(key, shape)`, or per row with the row's
//! folded key; [`dropout`](mod@dropout) keeps each element with
//! probability `1 − rate` and scales it by `1 / (1 − rate)`, the mask
//! `jax.random.bernoulli(key, 1 − rate, shape)` (flax's `Dropout`).
//!
//! The key is scalar prefetch `key[2]`: the two words of
//! `jax.random.key_data(key)` viewed as `int32`.

#[cfg(feature = "graph")]
use std::sync::Arc;

#[cfg(feature = "graph")]
use graph::{RuntimeError, Tensor, VjpCall};
use kernel_ir::prelude::*;
use kernel_ir::random::Key;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param, uniform_inputs,
};
use crate::reference;
use crate::tolerance::Tolerance;

/// Random 32-bit words: `o[r, c]` is element `r·n + c` of
/// `jax.random.bits(key, (m, n), uint32)` viewed as `int32`, or with
/// `fold_rows` element `c` of `jax.random.bits(fold_in(key, r), (n,))`.
#[tpu_kernel(grid = (kernel_ir::cdiv(m, bm), kernel_ir::cdiv(n, bn)), semantics = (parallel, parallel))]
pub fn random_bits(
    bm: usize,
    bn: usize,
    fold_rows: bool,
    #[shape(two)] key: Prefetch,
    #[shape(m, n)]
    #[block([bm, bn], |i, j| (i, j))]
    o: Out<i32>,
) {
    let key = Key::new(key.load([0]), key.load([1]));
    let (i, j) = (program_id(0), program_id(1));
    let bits = if fold_rows {
        // One key per row: a column of row indices folds into a column of
        // keys, which broadcast along the row.
        let row = iota(I32, [bm, 1], 0) + i * bm as i32;
        let index = Key::flat_index([1, n], [1, bn], [0.into(), (j * bn as i32).into()]);
        key.fold_in(row).bits(index)
    } else {
        let index = Key::flat_index(
            [m, n],
            [bm, bn],
            [(i * bm as i32).into(), (j * bn as i32).into()],
        );
        key.bits(index)
    };
    o.store(.., bits);
}

/// Dropout: `o = keep ? x / (1 − rate) : 0` with `keep` element `r·n + c`
/// of `jax.random.bernoulli(key, 1 − rate, (m, n))`, the scaling in f32.
#[tpu_kernel(grid = (kernel_ir::cdiv(m, bm), kernel_ir::cdiv(n, bn)), semantics = (parallel, parallel))]
pub fn dropout<T: Float>(
    bm: usize,
    bn: usize,
    rate: f32,
    #[shape(two)] key: Prefetch,
    #[shape(m, n)]
    #[block([bm, bn], |i, j| (i, j))]
    x: In<T>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j| (i, j))]
    o: Out<T>,
) {
    let key = Key::new(key.load([0]), key.load([1]));
    let (i, j) = (program_id(0), program_id(1));
    let index = Key::flat_index(
        [m, n],
        [bm, bn],
        [(i * bm as i32).into(), (j * bn as i32).into()],
    );
    let keep_prob = 1.0 - rate;
    let keep = key.bernoulli(keep_prob, index);
    let scaled = x.load(..).convert(F32) / keep_prob;
    o.store(.., select(keep, scaled, 0.0).cast::<T>());
}

/// The [`random_bits`](mod@random_bits) kernel: `[m, n]` words in
/// `[bm, bn]` blocks.
pub fn random_bits(
    m: usize,
    n: usize,
    bm: usize,
    bn: usize,
    fold_rows: bool,
) -> Result<VerifiedKernel, KernelErrors> {
    random_bits::build(bm, bn, fold_rows, random_bits::Dims { two: 2, m, n })
}

fn key_words(a: &Array) -> [u32; 2] {
    let w = |i: usize| a.data().get(i).copied().unwrap_or(0.0) as i64 as u32;
    [w(0), w(1)]
}

/// A key from the seed: random words, so every run draws other bits.
fn sample_key(seed: u64) -> Array {
    let mut rng = kernel_ir::SplitMix64(seed);
    let words = [0, 1].map(|_| f64::from(rng.next_u64() as u32 as i32));
    Array::new(DType::I32, [2], words.to_vec()).unwrap_or_else(|_| Array::zeros(DType::I32, [2]))
}

/// A Threefry key is two words.
fn key_shape(s: &[usize]) -> Result<(), EntryError> {
    let [two] = dims(s, "key")?;
    if two != 2 {
        return Err(EntryError::Shape(format!(
            "key is [{two}]; a Threefry key is two int32 words, [2]"
        )));
    }
    Ok(())
}

/// The rate must leave something to keep.
fn check_rate(c: &Config) -> Result<f32, EntryError> {
    let rate = c.f32("rate")?;
    if !(0.0..1.0).contains(&rate) {
        return Err(EntryError::BadValue {
            key: "rate",
            value: rate.to_string(),
            expected: "in [0, 1): the probability of dropping an element (1 drops everything; leave the op out instead)".into(),
        });
    }
    Ok(rate)
}

/// [`random_bits()`] in the library.
pub const RANDOM_BITS: Entry = Entry {
    name: "random_bits",
    fixed_inputs: None,
    backward: None,
    about: "random int32 words, jax.random.bits(key, (m, n)) bit for bit (Threefry-2x32); key as scalar prefetch",
    params: &[
        param("m", ParamKind::Positive, "64", "output rows"),
        param("n", ParamKind::Positive, "512", "output columns"),
        param("bm", ParamKind::Positive, "16", "block rows"),
        param("bn", ParamKind::Positive, "256", "block columns"),
        param(
            "fold_rows",
            ParamKind::Bool,
            "false",
            "row r draws jax.random.bits(fold_in(key, r), (n,)) instead",
        ),
    ],
    inputs: |_| Ok(vec![("key", vec![2])]),
    build: |c, s| {
        key_shape(&s[0])?;
        // The output's shape is config: the kernel has no array input.
        let (m, n) = (c.usize("m")?, c.usize("n")?);
        if m.saturating_mul(n) > i32::MAX as usize {
            return Err(EntryError::Shape(format!(
                "[{m}, {n}] has 2^31 or more elements; flat indices are int32 words"
            )));
        }
        Ok(random_bits(
            m,
            n,
            c.usize("bm")?.min(m),
            c.usize("bn")?.min(n),
            c.bool("fold_rows")?,
        )?)
    },
    reference: |c, a| {
        let key = key_words(&a[0]);
        let (m, n) = (c.usize("m")?, c.usize("n")?);
        let words: Vec<f64> = if c.bool("fold_rows")? {
            (0..m)
                .flat_map(|r| {
                    let k = reference::threefry_fold_in(key, r as u32);
                    (0..n).map(move |col| f64::from(reference::random_bits(k, col as u32) as i32))
                })
                .collect()
        } else {
            (0..m * n)
                .map(|i| f64::from(reference::random_bits(key, i as u32) as i32))
                .collect()
        };
        Ok(vec![words])
    },
    check: no_check,
    tolerance: |_, _| vec![Tolerance { abs: 0.0, rel: 0.0 }],
    sample: |_, _, seed| vec![sample_key(seed)],
    presets: &[Preset {
        name: "random_bits_fold_rows",
        about: "random words with one key per row (fold_in of the row index), as per-head dropout keys",
        config: &[("fold_rows", "true")],
        shapes: &[],
    }],
};

/// Dropout's backward is dropout: the key regenerates the forward's mask,
/// so `dx = keep ? dy / (1 − rate) : 0` is the forward kernel run on the
/// cotangent, and no mask is stored between the passes.
#[cfg(feature = "graph")]
fn dropout_backward(call: &VjpCall<'_>) -> Result<Vec<Option<Tensor>>, RuntimeError> {
    let (key, x) = (&call.inputs[0], &call.inputs[1]);
    let dy = call.cotangent(0)?;
    let dy = if dy.dtype() == x.dtype() {
        dy
    } else {
        dy.cast(x.dtype())?
    };
    let dx = key.runtime().call(call.kernel, &[key, &dy])?.remove(0);
    Ok(vec![None, Some(dx)])
}

/// [`dropout`](mod@dropout) in the library.
pub const DROPOUT: Entry = Entry {
    name: "dropout",
    fixed_inputs: None,
    backward: crate::entry::backward!(|_, _| Ok(Arc::new(dropout_backward))),
    about: "dropout with jax.random.bernoulli's mask (Threefry-2x32, bit for bit), scaled by 1/(1-rate); key as scalar prefetch",
    params: &[
        DTYPE,
        param(
            "rate",
            ParamKind::Number,
            "0.1",
            "probability of dropping an element, in [0, 1)",
        ),
        param("bm", ParamKind::Positive, "16", "block rows"),
        param("bn", ParamKind::Positive, "256", "block columns"),
    ],
    inputs: |_| Ok(vec![("key", vec![2]), ("x", vec![64, 512])]),
    build: |c, s| {
        key_shape(&s[0])?;
        let [m, n] = dims(&s[1], "x")?;
        Ok(dropout::build_for(
            c.dtype("dtype")?,
            c.usize("bm")?.min(m),
            c.usize("bn")?.min(n),
            check_rate(c)?,
            dropout::Dims { two: 2, m, n },
        )?)
    },
    reference: |c, a| {
        let key = key_words(&a[0]);
        let keep = 1.0 - check_rate(c)?;
        let o = a[1]
            .data()
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                if reference::uniform(key, i as u32) < keep {
                    x / f64::from(keep)
                } else {
                    0.0
                }
            })
            .collect();
        Ok(vec![o])
    },
    check: no_check,
    tolerance: crate::entry::dtype_tolerance,
    sample: |c, k, seed| {
        let mut inputs = uniform_inputs(c, k, seed);
        inputs[0] = sample_key(seed);
        inputs
    },
    presets: &[Preset {
        name: "dropout_bf16",
        about: "dropout at rate 0.25 on bf16, ragged blocks (100 x 300 in 16 x 256)",
        config: &[("dtype", "bf16"), ("rate", "0.25")],
        shapes: &[("x", &[100, 300])],
    }],
};
