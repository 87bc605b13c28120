//! Comparing a kernel's output with its reference under the kernel's
//! [`Tolerance`] (which the library declares per kernel).

use std::fmt;

use kernel_ir::Array;

pub use crate::tolerance::Tolerance;

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
