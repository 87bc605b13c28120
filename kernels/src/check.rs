//! Comparing a kernel's output with its reference.
//!
//! An output element passes when `|actual − reference| ≤ abs + rel·|reference|`
//! and is not NaN. The reference is plain f64 host code; the bounds below
//! are every tolerance the tests use, in one place (`k`: the contracted
//! length; `n`: the number of terms a gradient sums):
//!
//! | constructor | f32 | bf16 | f16 | for |
//! |---|---|---|---|---|
//! | [`Tolerance::for_dtype`] | 1e-5 + 1e-5·\|r\| | 1e-2 + 1.6e-2·\|r\| | 1e-3 + 2e-3·\|r\| | elementwise ops, norms, softmax, RoPE: a few roundings of the output dtype |
//! | [`Tolerance::matmul`] | 1e-6·k + 1e-4·\|r\| | as `for_dtype` of the output | as `for_dtype` | matmuls and fused epilogues with an f32 accumulator: k products of O(1) terms |
//! | [`Tolerance::attention`] | 2e-5 + 1e-4·\|r\| | as `for_dtype` | as `for_dtype` | attention outputs: softmax sums and two products |
//! | [`Tolerance::logsumexp`] | 1e-4 + 1e-5·\|r\| | 2e-2 + 1e-2·\|r\| | same | the forward's saved row logsumexp |
//! | [`Tolerance::attention_grad`] | 2e-4 + 1e-3·\|r\| | 6e-2 + 6e-2·\|r\| | same | dq, dk, dv: products of recomputed probabilities with bf16-rounded inputs |
//! | [`Tolerance::sum_grad`] | 1e-5·n + 1e-4·\|r\| | 2e-2·√n + 3e-2·\|r\| | same | parameter gradients summed over n rows (dgamma, dbeta) |
//!
//! Half-float bounds are about two units in the last place of the output
//! (bf16 keeps 8 significant bits); f32 bounds are set by accumulation
//! order: the kernels sum blocks in a different order than the reference,
//! and the native JIT uses a polynomial `exp` (about 1 ulp).

use std::fmt;

use kernel_ir::{Array, DType};

/// How far an output is from its reference.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorStats {
    /// Largest |actual − reference|.
    pub max_abs: f64,
    /// Largest |actual − reference| / max(|reference|, tiny).
    pub max_rel: f64,
    /// Elements where the output is NaN (never acceptable).
    pub nan_count: usize,
    /// Flat index of the element with the largest tolerance-scaled error.
    pub worst: usize,
    /// Largest error divided by the allowed error (≤ 1 passes).
    pub worst_ratio: f64,
    /// Number of elements compared.
    pub len: usize,
}

/// Allowed error: |actual − reference| ≤ abs + rel·|reference|.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub abs: f64,
    /// Relative part.
    pub rel: f64,
}

impl Tolerance {
    /// The default tolerance for an output of `dtype` computed by a short
    /// chain of correctly rounded ops (a few units of roundoff).
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 1e-5,
                rel: 1e-5,
            },
            DType::BF16 => Tolerance {
                abs: 1e-2,
                rel: 1.6e-2,
            },
            DType::F16 => Tolerance {
                abs: 1e-3,
                rel: 2e-3,
            },
            _ => Tolerance { abs: 0.0, rel: 0.0 },
        }
    }
}

impl Tolerance {
    /// Attention outputs: f32 error grows with the key count through the
    /// softmax sum and two matmuls; half floats as [`Tolerance::for_dtype`].
    pub fn attention(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 2e-5,
                rel: 1e-4,
            },
            d => Tolerance::for_dtype(d),
        }
    }

    /// A product over `k` terms accumulated in f32, stored as `out`.
    pub fn matmul(k: usize, out: DType) -> Tolerance {
        match out {
            DType::F32 => Tolerance {
                abs: 1e-6 * k as f64,
                rel: 1e-4,
            },
            d => Tolerance::for_dtype(d),
        }
    }

    /// The forward's row logsumexp (f32) for inputs of `dtype`.
    pub fn logsumexp(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 1e-4,
                rel: 1e-5,
            },
            _ => Tolerance {
                abs: 2e-2,
                rel: 1e-2,
            },
        }
    }

    /// Attention gradients (dq, dk, dv) for inputs of `dtype`.
    pub fn attention_grad(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 2e-4,
                rel: 1e-3,
            },
            _ => Tolerance {
                abs: 6e-2,
                rel: 6e-2,
            },
        }
    }

    /// A gradient summed over `n` rows (n = 1 for per-element gradients).
    pub fn sum_grad(dtype: DType, n: usize) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                abs: 1e-5 * n as f64,
                rel: 1e-4,
            },
            _ => Tolerance {
                abs: 2e-2 * (n as f64).sqrt(),
                rel: 3e-2,
            },
        }
    }
}

impl ErrorStats {
    /// Compares `actual` with `reference` (same length, row-major) under
    /// `tol`. A length mismatch counts every element as NaN.
    pub fn between(actual: &Array, reference: &[f64], tol: Tolerance) -> ErrorStats {
        let mut s = ErrorStats {
            max_abs: 0.0,
            max_rel: 0.0,
            nan_count: 0,
            worst: 0,
            worst_ratio: 0.0,
            len: reference.len(),
        };
        if actual.len() != reference.len() {
            s.nan_count = reference.len().max(1);
            s.worst_ratio = f64::INFINITY;
            return s;
        }
        for (i, (&a, &r)) in actual.data().iter().zip(reference).enumerate() {
            if a.is_nan() || r.is_nan() {
                s.nan_count += 1;
                s.worst_ratio = f64::INFINITY;
                s.worst = i;
                continue;
            }
            // Equal values (infinities of one sign included: the −∞ of an
            // empty logsumexp) are exact; an infinity against anything
            // else is an infinite error below.
            let abs = if a == r { 0.0 } else { (a - r).abs() };
            let rel = abs / r.abs().max(f64::MIN_POSITIVE);
            s.max_abs = s.max_abs.max(abs);
            s.max_rel = s.max_rel.max(rel);
            let allowed = tol.abs + tol.rel * r.abs();
            let ratio = if allowed > 0.0 {
                abs / allowed
            } else if abs > 0.0 {
                f64::INFINITY
            } else {
                0.0
            };
            if ratio > s.worst_ratio {
                s.worst_ratio = ratio;
                s.worst = i;
            }
        }
        s
    }

    /// True when no element is NaN and every error is within tolerance.
    pub fn passes(&self) -> bool {
        self.nan_count == 0 && self.worst_ratio <= 1.0
    }
}

impl fmt::Display for ErrorStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max abs {:.3e}, max rel {:.3e}, {} NaN, worst element {} at {:.2}x tolerance ({} elements)",
            self.max_abs, self.max_rel, self.nan_count, self.worst, self.worst_ratio, self.len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_never_passes() {
        let a = Array::new(DType::F32, [2], vec![1.0, f64::NAN]).unwrap();
        let s = ErrorStats::between(&a, &[1.0, 1.0], Tolerance { abs: 1e9, rel: 1e9 });
        assert!(!s.passes());
        assert_eq!(s.nan_count, 1);
    }

    #[test]
    fn tolerance_is_abs_plus_rel() {
        let a = Array::new(DType::F32, [2], vec![1.0, 100.5]).unwrap();
        let t = Tolerance {
            abs: 0.1,
            rel: 0.004,
        };
        assert!(ErrorStats::between(&a, &[1.05, 100.0], t).passes());
        assert!(!ErrorStats::between(&a, &[1.2, 100.0], t).passes());
        let b = Array::new(DType::F32, [1], vec![1.0]).unwrap();
        assert!(!ErrorStats::between(&b, &[1.0, 2.0], t).passes());
    }
}
