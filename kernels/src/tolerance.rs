//! How close a kernel's outputs must be to the f64 reference: each
//! library entry declares one [`Tolerance`] per output.
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

use kernel_ir::DType;

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
            // Two units of roundoff, and the least subnormal.
            DType::F8E4M3FN => Tolerance {
                abs: 2f64.powi(-9),
                rel: 2f64.powi(-3),
            },
            DType::F8E5M2 => Tolerance {
                abs: 2f64.powi(-16),
                rel: 2f64.powi(-2),
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
