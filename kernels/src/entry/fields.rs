//! Ready-made field functions entries share: shapes read from inputs,
//! the no-op input check, tolerances by dtype, sampled inputs and an
//! input's range check.

use kernel_ir::{Array, VerifiedKernel};

use super::config::{Config, EntryError};
use crate::tolerance::Tolerance;

/// `s` as `[usize; N]`, or an error naming the input.
pub fn dims<const N: usize>(s: &[usize], what: &str) -> Result<[usize; N], EntryError> {
    s.try_into()
        .map_err(|_| EntryError::Shape(format!("`{what}` must have rank {N}, got shape {s:?}")))
}

/// `(m, n, k)` of `x: [m, k]` times `rhs: [k, n]` (the rhs input is
/// called `rhs`).
pub fn matmul_shapes(s: &[Vec<usize>], rhs: &str) -> Result<(usize, usize, usize), EntryError> {
    let [m, k] = dims(&s[0], "x")?;
    let [k2, n] = dims(&s[1], rhs)?;
    if k != k2 {
        return Err(EntryError::Shape(format!(
            "x is [{m}, {k}] but {rhs} is [{k2}, {n}]: the inner dims differ"
        )));
    }
    Ok((m, n, k))
}

/// The slices of `s`, for `Dims::from_shapes`.
pub fn refs(s: &[Vec<usize>]) -> Vec<&[usize]> {
    s.iter().map(Vec::as_slice).collect()
}

/// Inputs need no check beyond shapes and dtypes.
pub fn no_check(_: &Config, _: &VerifiedKernel, _: &[Array]) -> Result<(), EntryError> {
    Ok(())
}

/// Each output within [`Tolerance::for_dtype`] of its dtype.
pub fn dtype_tolerance(_: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    k.outputs().map(|o| Tolerance::for_dtype(o.dtype)).collect()
}

/// A product over the last dim of input `x` (`[m, k]`; the first input
/// if none is called `x`), accumulated in f32: [`Tolerance::matmul`] per
/// output.
pub fn matmul_tolerance(_: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let depth = k
        .arguments()
        .find(|a| a.name == "x")
        .or_else(|| k.arguments().next())
        .and_then(|x| x.shape.last().copied())
        .unwrap_or(1);
    k.outputs()
        .map(|o| Tolerance::matmul(depth, o.dtype))
        .collect()
}

/// Each argument uniform in −1..1 (scalar prefetch: zeros), in its dtype.
pub fn uniform_inputs(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    random_inputs(k, seed)
}

/// Each float argument of `k` uniform in −1..1 (argument `i` seeded with
/// `seed + i`), every other argument zeros: [`uniform_inputs`] for a
/// kernel without an entry (a `.kir` file).
pub fn random_inputs(k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    k.arguments()
        .enumerate()
        .map(|(i, a)| {
            if a.dtype.is_float() {
                Array::random(a.dtype, a.shape.to_vec(), seed + i as u64, -1.0, 1.0)
            } else {
                Array::zeros(a.dtype, a.shape.to_vec())
            }
        })
        .collect()
}

/// An input of `k` by name in `inputs` (argument order).
pub fn arg<'a>(k: &VerifiedKernel, inputs: &'a [Array], name: &str) -> Option<&'a Array> {
    k.arguments()
        .position(|a| a.name == name)
        .and_then(|i| inputs.get(i))
}

/// The first element of `a` outside `lo..=hi`, as an error naming it.
pub fn in_range(
    a: Option<&Array>,
    name: &str,
    lo: f64,
    hi: f64,
    what: &str,
) -> Result<(), EntryError> {
    if let Some(a) = a
        && let Some((i, v)) = a
            .data()
            .iter()
            .enumerate()
            .find(|(_, v)| !(lo..=hi).contains(*v))
    {
        return Err(EntryError::Input(format!(
            "input `{name}` has {v} at flat index {i}, outside {lo}..={hi} ({what})"
        )));
    }
    Ok(())
}
