//! How two results of one kernel output differ: what `tessera diff` prints
//! for a porting engineer (max abs and rel error, a histogram of the
//! distance in units in the last place of the output dtype, and the first
//! differing elements with their indices).
//!
//! ```
//! use kernel_ir::DType;
//! use tooling::diff::{compare, ulps};
//! assert_eq!(ulps(1.0, 1.0 + f32::EPSILON as f64, DType::F32), Some(1));
//! let d = compare("o", DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 3.5, 4.0], 10);
//! assert_eq!(d.differing, 1);
//! assert_eq!(d.first[0].0, vec![1, 0]);
//! ```

use std::fmt;

use kernel_ir::DType;

/// Distance between `a` and `b` in units in the last place of `d` (after
/// rounding both to `d`); `None` when either is NaN. Integer dtypes count
/// integer steps.
pub fn ulps(a: f64, b: f64, d: DType) -> Option<u64> {
    if a.is_nan() || b.is_nan() {
        return None;
    }
    // Sign-magnitude bit patterns mapped onto one ordered integer line.
    let ordered32 = |x: f32| -> i64 {
        let bits = x.to_bits() as i32 as i64;
        if bits < 0 {
            i32::MIN as i64 - bits
        } else {
            bits
        }
    };
    let ordered16 = |bits: u16| -> i64 {
        let b = bits as i16 as i64;
        if b < 0 { i16::MIN as i64 - b } else { b }
    };
    let (x, y) = match d {
        DType::F32 => (ordered32(a as f32), ordered32(b as f32)),
        DType::BF16 => (
            ordered16(kernel_ir::bf16::from_f64(a).to_bits()),
            ordered16(kernel_ir::bf16::from_f64(b).to_bits()),
        ),
        DType::F16 => (
            ordered16(kernel_ir::f16::from_f64(a).to_bits()),
            ordered16(kernel_ir::f16::from_f64(b).to_bits()),
        ),
        DType::I32 | DType::I8 | DType::Bool => (a.round() as i64, b.round() as i64),
        DType::F8E4M3FN | DType::F8E5M2 => {
            let ordered8 = |x: f64| {
                let bits = kernel_ir::Array::new(d, [1], vec![x])
                    .map(|a| a.to_le_bytes()[0])
                    .unwrap_or(0) as i8 as i64;
                if bits < 0 {
                    i8::MIN as i64 - bits
                } else {
                    bits
                }
            };
            (ordered8(a), ordered8(b))
        }
    };
    Some(x.abs_diff(y))
}

/// The comparison of one output.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputDiff {
    /// The output's name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Largest |a − b|.
    pub max_abs: f64,
    /// Largest |a − b| / max(|b|, [`rel_floor`]): right at subnormal and
    /// zero magnitudes of `b` (an element that is 0 on one side and not on
    /// the other counts, where |a − b| / |b| would skip it).
    pub max_rel: f64,
    /// NaN elements on each side.
    pub nans: (usize, usize),
    /// Elements that differ (or are NaN on exactly one side).
    pub differing: usize,
    /// Elements per ULP distance bucket: `(label, count)`, empty buckets
    /// left out.
    pub histogram: Vec<(String, usize)>,
    /// The first differing elements: index, a, b, ULP distance.
    pub first: Vec<(Vec<usize>, f64, f64, Option<u64>)>,
}

fn bucket(u: u64) -> (usize, String) {
    match u {
        0 => (0, "0".into()),
        1 => (1, "1".into()),
        2 => (2, "2".into()),
        _ => {
            // (2^k, 2^(k+1)]
            let k = 64 - (u - 1).leading_zeros() as usize; // ceil(log2 u)
            let lo = (1u64 << (k - 1)) + 1;
            let hi = 1u64 << k;
            (k + 1, format!("{lo}-{hi}"))
        }
    }
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = flat % n;
        flat /= n;
    }
    idx
}

/// The floor of the relative error's denominator in `d`: the smallest
/// positive value `d` holds (its smallest subnormal; 1 for integers), so
/// that a difference against 0 or a subnormal is a finite relative error
/// counted in the dtype's own steps rather than skipped or infinite.
pub fn rel_floor(d: DType) -> f64 {
    match d {
        DType::F32 => f64::powi(2.0, -149),
        DType::BF16 => f64::powi(2.0, -133),
        DType::F16 => f64::powi(2.0, -24),
        DType::F8E4M3FN => f64::powi(2.0, -9),
        DType::F8E5M2 => f64::powi(2.0, -16),
        DType::I32 | DType::I8 | DType::Bool => 1.0,
    }
}

/// Compares `a` with `b` (row-major, `shape`), element by element in `d`.
pub fn compare(
    name: &str,
    d: DType,
    shape: &[usize],
    a: &[f64],
    b: &[f64],
    first_n: usize,
) -> OutputDiff {
    let mut out = OutputDiff {
        name: name.to_string(),
        dtype: d,
        shape: shape.to_vec(),
        max_abs: 0.0,
        max_rel: 0.0,
        nans: (0, 0),
        differing: 0,
        histogram: Vec::new(),
        first: Vec::new(),
    };
    let mut counts: Vec<(usize, String, usize)> = Vec::new();
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        out.nans.0 += x.is_nan() as usize;
        out.nans.1 += y.is_nan() as usize;
        let u = ulps(x, y, d);
        let differs = match u {
            Some(u) => u > 0,
            None => x.is_nan() != y.is_nan(),
        };
        if let Some(u) = u {
            let abs = (x - y).abs();
            out.max_abs = out.max_abs.max(abs);
            if abs > 0.0 {
                out.max_rel = out.max_rel.max(abs / y.abs().max(rel_floor(d)));
            }
            let (k, label) = bucket(u);
            match counts.iter_mut().find(|c| c.0 == k) {
                Some(c) => c.2 += 1,
                None => counts.push((k, label, 1)),
            }
        }
        if differs {
            out.differing += 1;
            if out.first.len() < first_n {
                out.first.push((unravel(i, shape), x, y, u));
            }
        }
    }
    counts.sort_by_key(|c| c.0);
    out.histogram = counts.into_iter().map(|(_, l, n)| (l, n)).collect();
    out
}

impl fmt::Display for OutputDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.shape.iter().product();
        writeln!(
            f,
            "  max abs {:.3e}  max rel {:.3e} (of max(|b|, {:.1e}))  NaN {}/{}  differing {} of {total}",
            self.max_abs,
            self.max_rel,
            rel_floor(self.dtype),
            self.nans.0,
            self.nans.1,
            self.differing
        )?;
        let hist: Vec<String> = self
            .histogram
            .iter()
            .map(|(l, n)| format!("{l}: {n}"))
            .collect();
        writeln!(f, "  ulp histogram ({}): {}", self.dtype, hist.join("  "))?;
        if !self.first.is_empty() {
            writeln!(f, "  first differing elements:")?;
            for (idx, a, b, u) in &self.first {
                let u = u.map_or("NaN".to_string(), |u| format!("{u} ulp"));
                writeln!(f, "    {idx:?}  {a:.9e}  vs  {b:.9e}  ({u})")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 70's tenth finding: every element 100 % off at subnormal
    /// magnitudes (one side flushed to 0) reported max rel 0.
    #[test]
    fn relative_error_counts_subnormal_and_zero_magnitudes() {
        let tiny = f64::powi(2.0, -140); // an f32 subnormal
        let a = vec![tiny, 2.0 * tiny, 0.0];
        let flushed = vec![0.0, 0.0, 0.0];
        let d = compare("o", DType::F32, &[3], &a, &flushed, 0);
        assert_eq!(d.differing, 2);
        assert_eq!(d.max_rel, 2.0 * tiny / rel_floor(DType::F32));
        assert!(d.max_rel >= 1.0, "{}", d.max_rel);
        let halved = vec![tiny / 2.0, tiny, 0.0];
        let d = compare("o", DType::F32, &[3], &a, &halved, 0);
        assert_eq!(d.max_rel, 1.0);
        // Equal zeros are no error; the floor is stated.
        let d = compare("o", DType::F32, &[3], &flushed, &flushed, 0);
        assert_eq!(d.max_rel, 0.0);
        assert!(d.to_string().contains("of max(|b|, 1.4e-45)"), "{d}");
    }

    #[test]
    fn ulps_count_representable_steps_across_zero() {
        assert_eq!(ulps(0.0, 0.0, DType::F32), Some(0));
        let tiny = f32::from_bits(1) as f64;
        assert_eq!(ulps(-tiny, tiny, DType::F32), Some(2));
        assert_eq!(ulps(1.0, 1.0078125, DType::BF16), Some(1));
        assert_eq!(ulps(f64::NAN, 1.0, DType::F32), None);
        assert_eq!(ulps(3.0, 7.0, DType::I32), Some(4));
    }

    #[test]
    fn the_histogram_buckets_by_powers_of_two() {
        let a = [1.0, 1.0, 1.0, 1.0];
        let e = f32::EPSILON as f64;
        let b = [1.0, 1.0 + e, 1.0 + 5.0 * e, f64::NAN];
        let d = compare("x", DType::F32, &[4], &a, &b, 2);
        assert_eq!(
            d.histogram,
            vec![("0".into(), 1), ("1".into(), 1), ("5-8".into(), 1)]
        );
        assert_eq!(d.differing, 3);
        assert_eq!(d.nans, (0, 1));
        assert_eq!(d.first.len(), 2);
        assert_eq!(d.first[1].3, Some(5));
    }
}
