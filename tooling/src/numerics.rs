//! Where the numerics of an FP8 GEMM drift: its error against the f64
//! reference by depth and accumulation scheme, measured on one backend.
//! `tessera numerics` prints the table; `kernels::guide::numerics` holds
//! one run of it and what it shows.
//!
//! The schemes: `f32` (the running sum in f32, as the MXU and the library
//! kernel keep it), `bf16 partials` (the running sum rounded to bf16 after
//! every 128-deep k step), and `split-K 4` (four f32 partial GEMMs over
//! quarters of k, summed in f32 afterwards, CUTLASS's split-K). The inputs
//! are e4m3fn values uniform in −8..8, unscaled, so the errors are the
//! accumulation's alone (the products of fp8 values are exact in f32).

use std::fmt;

use kernel_ir::{Array, DType};
use runtime::backend::{Backend, run};

use kernels::epilogue::Activation;
use kernels::fp8_gemm::{Fp8GemmConfig, Scaling, fp8_gemm};

/// How the k sum is accumulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// The running sum in f32.
    F32,
    /// The running sum rounded to bf16 after every k step.
    Bf16Partials,
    /// Four f32 partial GEMMs over quarters of k, summed in f32.
    SplitK4,
}

impl Scheme {
    /// All three, in the table's order.
    pub const ALL: [Scheme; 3] = [Scheme::F32, Scheme::Bf16Partials, Scheme::SplitK4];
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::F32 => "f32",
            Scheme::Bf16Partials => "bf16 partials",
            Scheme::SplitK4 => "split-K 4",
        })
    }
}

/// One measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorRow {
    /// The depth.
    pub k: usize,
    /// The scheme.
    pub scheme: Scheme,
    /// Largest |error| over the largest |reference|.
    pub max_rel: f64,
    /// RMS error over the RMS reference.
    pub rms_rel: f64,
    /// Elements whose error exceeds the library's f32 matmul tolerance.
    pub over_tolerance: usize,
}

/// Why the error table could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NumericsError {
    /// A depth that is not a positive multiple of 512.
    #[error("depth {0}: give multiples of 512 (four quarters of 128-deep steps)")]
    Depth(usize),
    /// The FP8 GEMM did not build.
    #[error(transparent)]
    Kernel(#[from] kernel_ir::KernelErrors),
    /// A path could not run it.
    #[error(transparent)]
    Run(Box<runtime::backend::BackendError>),
    /// An array of the wrong size (a Tessera bug).
    #[error(transparent)]
    Array(#[from] kernel_ir::ArrayError),
    /// A run gave no output.
    #[error("the FP8 GEMM gave no output")]
    NoOutput,
}

fn gemm(
    m: usize,
    n: usize,
    k: usize,
    bf16_partials: bool,
    x: &Array,
    w: &Array,
    backend: Backend,
) -> Result<Array, NumericsError> {
    let cfg = Fp8GemmConfig {
        m,
        n,
        k,
        bm: m.min(128),
        bn: n.min(128),
        bk: 128,
        scaling: Scaling::Tensor,
        activation: Activation::Identity,
        residual: false,
        bf16_partials,
        dtype: DType::F8E4M3FN,
        out_dtype: DType::F32,
    };
    let kernel = fp8_gemm(&cfg)?;
    let one = Array::new(DType::F32, [1, 1], vec![1.0])?;
    let zero = Array::zeros(DType::F32, [1, n]);
    let out = run(
        backend,
        &kernel,
        &[x.clone(), w.clone(), one.clone(), one, zero],
    )
    .map_err(|e| NumericsError::Run(Box::new(e)))?;
    out.into_iter().next().ok_or(NumericsError::NoOutput)
}

/// Columns `lo..hi` of `a: [r, c]` (rows of `a` when `rows`).
fn slice(a: &Array, lo: usize, hi: usize, rows: bool) -> Array {
    let (r, c) = (a.shape()[0], a.shape()[1]);
    let d = a.data();
    let data: Vec<f64> = if rows {
        d[lo * c..hi * c].to_vec()
    } else {
        (0..r)
            .flat_map(|i| d[i * c + lo..i * c + hi].to_vec())
            .collect()
    };
    let shape = if rows { [hi - lo, c] } else { [r, hi - lo] };
    Array::new(a.dtype(), shape, data).unwrap_or_else(|_| Array::zeros(a.dtype(), shape))
}

/// The error table of an `m × n` FP8 GEMM at each depth in `ks` (each a
/// multiple of 512), every scheme, on `backend`.
pub fn fp8_gemm_errors(
    ks: &[usize],
    m: usize,
    n: usize,
    seed: u64,
    backend: Backend,
) -> Result<Vec<ErrorRow>, NumericsError> {
    let mut rows = Vec::new();
    for &k in ks {
        if k == 0 || k % 512 != 0 {
            return Err(NumericsError::Depth(k));
        }
        let x = Array::random(DType::F8E4M3FN, [m, k], seed, -8.0, 8.0);
        let w = Array::random(DType::F8E4M3FN, [k, n], seed + 1, -8.0, 8.0);
        let want = kernels::reference::matmul(&x, &w);
        let tol = kernels::tolerance::Tolerance::matmul(k, DType::F32);
        for scheme in Scheme::ALL {
            let got: Vec<f64> = match scheme {
                Scheme::F32 | Scheme::Bf16Partials => {
                    gemm(m, n, k, scheme == Scheme::Bf16Partials, &x, &w, backend)?
                        .data()
                        .to_vec()
                }
                Scheme::SplitK4 => {
                    let q = k / 4;
                    let mut sum = vec![0f32; m * n];
                    for s in 0..4 {
                        let part = gemm(
                            m,
                            n,
                            q,
                            false,
                            &slice(&x, s * q, (s + 1) * q, false),
                            &slice(&w, s * q, (s + 1) * q, true),
                            backend,
                        )?;
                        for (acc, v) in sum.iter_mut().zip(part.data()) {
                            *acc += *v as f32;
                        }
                    }
                    sum.into_iter().map(f64::from).collect()
                }
            };
            let max_ref = want
                .iter()
                .fold(0f64, |a, v| a.max(v.abs()))
                .max(f64::MIN_POSITIVE);
            let rms = |v: &mut dyn Iterator<Item = f64>| {
                let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x * x, n + 1));
                (s / n.max(1) as f64).sqrt()
            };
            let errs: Vec<f64> = got.iter().zip(&want).map(|(g, r)| (g - r).abs()).collect();
            rows.push(ErrorRow {
                k,
                scheme,
                max_rel: errs.iter().fold(0f64, |a, &e| a.max(e)) / max_ref,
                rms_rel: rms(&mut errs.iter().copied())
                    / rms(&mut want.iter().copied()).max(f64::MIN_POSITIVE),
                over_tolerance: errs
                    .iter()
                    .zip(&want)
                    .filter(|(e, r)| **e > tol.abs + tol.rel * r.abs())
                    .count(),
            });
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn table(rows: &[ErrorRow], m: usize, n: usize) -> String {
    let mut s = format!(
        "| K | scheme | max \\|err\\| / max \\|ref\\| | RMS err / RMS ref | over the f32 tolerance (of {}) |\n|---:|---|---:|---:|---:|\n",
        m * n
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {:.2e} | {:.2e} | {} |\n",
            r.k, r.scheme, r.max_rel, r.rms_rel, r.over_tolerance
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the interpreter at small depths: f32 accumulation stays near f32
    /// roundoff, bf16 partials are orders of magnitude worse, split-K is
    /// no worse than f32 (it sums shorter runs).
    #[test]
    fn the_schemes_order_as_their_precision_says() {
        let rows = fp8_gemm_errors(&[512, 2048], 8, 128, 3, Backend::Interpreter).unwrap();
        for k in [512, 2048] {
            let get = |s| {
                rows.iter()
                    .find(|r| r.k == k && r.scheme == s)
                    .unwrap()
                    .rms_rel
            };
            let (f, b, sk) = (
                get(Scheme::F32),
                get(Scheme::Bf16Partials),
                get(Scheme::SplitK4),
            );
            assert!(f < 1e-6, "f32 at k={k}: {f}");
            assert!(
                b > 100.0 * f && b > 1e-4,
                "bf16 partials at k={k}: {b} vs {f}"
            );
            assert!(sk <= 2.0 * f + 1e-9, "split-K at k={k}: {sk} vs {f}");
        }
        assert!(fp8_gemm_errors(&[100], 8, 128, 3, Backend::Interpreter).is_err());
        assert!(table(&rows, 8, 128).contains("| 2048 | bf16 partials |"));
    }
}
