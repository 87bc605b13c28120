//! My kernels: RMSNorm fused into the matmul that follows it, the way a
//! transformer block's pre-norm feeds its projection. One pass over `x`
//! per output tile: normalize the rows in VMEM, multiply by the weight
//! block, never write the normalized `x` to HBM.
//!
//! ```
//! use kernel_ir::DType;
//! use my_kernels::{RmsNormMatmul, rms_norm_matmul};
//! let cfg = RmsNormMatmul { block_m: 8, block_n: 128, eps: 1e-6 };
//! let dims = rms_norm_matmul::Dims { m: 16, k: 128, n: 256 };
//! // `#[tpu_kernel]` made `build::<f32>(..)` and `build_for(dtype, ..)`,
//! // which picks the instance from a dtype known at run time.
//! let kernel = rms_norm_matmul::build_for(DType::F32, &cfg, dims).unwrap();
//! assert_eq!(kernel.name, "rms_norm_matmul");
//! ```

use kernel_ir::Array;
use kernel_ir::prelude::*;

/// Tiling and the norm's epsilon.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormMatmul {
    /// Rows of `x` (and of the output) per block: a multiple of 8 (16 for
    /// bf16), or all of them.
    pub block_m: usize,
    /// Output columns per block: a multiple of 128, or all of them.
    pub block_n: usize,
    /// Added to the mean square before the square root.
    pub eps: f32,
}

/// `o = (x / sqrt(mean(x², row) + eps) · gamma) @ w` for `x: [m, k]`,
/// `gamma: [k]` (f32), `w: [k, n]`; the norm in f32, the product's
/// operands in the input dtype with f32 accumulation. Each grid step
/// holds whole rows of `x` (the norm needs all of `k`) and one column
/// block of `w`.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(m, cfg.block_m), kernel_ir::cdiv(n, cfg.block_n)),
    semantics = (parallel, parallel)
)]
pub fn rms_norm_matmul<T: Float>(
    cfg: &RmsNormMatmul,
    #[shape(m, k)]
    #[block([cfg.block_m, k], |i, _j| (i, 0))]
    x: In<T>,
    #[shape(k)]
    #[block([k], |_i, _j| 0)]
    gamma: In<f32>,
    #[shape(k, n)]
    #[block([k, cfg.block_n], |_i, j| (0, j))]
    w: In<T>,
    #[shape(m, n)]
    #[block([cfg.block_m, cfg.block_n], |i, j| (i, j))]
    o: Out<T>,
) {
    let v = x.load(..).convert(F32);
    let rstd = ((v * v).sum_keep(1) / k as f32 + cfg.eps).rsqrt();
    let normed = (v * rstd * gamma.load(..)).cast::<T>();
    o.store(.., dot(normed, w.load(..)).cast::<T>());
}

/// The same computation in f64 on the host, row-major `[m, n]`: what
/// every path is compared with. The normalized rows are rounded to the
/// inputs' dtype, as the kernel feeds them to the matmul in it.
pub fn reference(x: &Array, gamma: &Array, w: &Array, eps: f64) -> Vec<f64> {
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[1]);
    let dtype = x.dtype();
    let (x, g, w) = (x.data(), gamma.data(), w.data());
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let rstd = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / k as f64 + eps).sqrt();
        let normed: Vec<f64> = (0..k).map(|i| dtype.round(row[i] * rstd * g[i])).collect();
        for c in 0..n {
            out[r * n + c] = (0..k).map(|i| normed[i] * w[i * n + c]).sum();
        }
    }
    out
}
