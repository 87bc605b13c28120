//! The foundation kernels written with the builder API, kept to check that
//! their `#[tpu_kernel]` versions in `kernels::foundation` print identical IR.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};
use kernels::foundation::{AddConfig, MatmulConfig, SoftmaxConfig};
use kernels::norm::NormConfig;

/// Tiled elementwise `o = x + y` over a 2-D grid of blocks. Partial last
/// blocks are allowed: their padding is computed and dropped.
pub fn add(c: &AddConfig) -> Result<VerifiedKernel, KernelErrors> {
    let shape = [c.rows, c.cols];
    let block = [c.block_rows, c.block_cols];
    let mut k = KernelBuilder::new("add");
    k.grid(
        [cdiv(c.rows, c.block_rows), cdiv(c.cols, c.block_cols)],
        [Parallel, Parallel],
    );
    let x = k.input("x", c.dtype, shape).block(block, |[i, j]| (i, j));
    let y = k.input("y", c.dtype, shape).block(block, |[i, j]| (i, j));
    let o = k.output("o", c.dtype, shape).block(block, |[i, j]| (i, j));
    o.store(.., x.load(..) + y.load(..));
    k.build()
}

/// Tiled `o = x · y` with an f32 accumulator in scratch over the
/// `arbitrary` k grid dim: zeroed at the first k step, written out at the
/// last. A ragged k tail is masked so padding never enters the sum.
pub fn matmul(c: &MatmulConfig) -> Result<VerifiedKernel, KernelErrors> {
    let mut b = KernelBuilder::new("matmul");
    let steps_k = cdiv(c.k, c.bk);
    b.grid(
        [cdiv(c.m, c.bm), cdiv(c.n, c.bn), steps_k],
        [Parallel, Parallel, Arbitrary],
    );
    let x = b
        .input("x", c.dtype, [c.m, c.k])
        .block([c.bm, c.bk], |[i, _, l]| (i, l));
    let y = b
        .input("y", c.dtype, [c.k, c.n])
        .block([c.bk, c.bn], |[_, j, l]| (l, j));
    let o = b
        .output("o", c.out_dtype, [c.m, c.n])
        .block([c.bm, c.bn], |[i, j, _]| (i, j));
    let acc = b.scratch("acc", F32, [c.bm, c.bn]);

    let l = program_id(2);
    // An f32 output is its own accumulator; otherwise the f32 scratch is,
    // and the output block is written from it at every step.
    let f32_out = c.out_dtype == F32;
    if f32_out {
        when(l.eq(0), || o.store(.., 0.0));
    } else {
        when(l.eq(0), || acc.store(.., 0.0));
    }
    let (xv, yv) = if c.k.is_multiple_of(c.bk) {
        (x.load(..), y.load(..))
    } else {
        let valid = c.k as i32;
        (
            x.load_masked(.., x.positions(1).lt(valid)),
            y.load_masked(.., y.positions(0).lt(valid)),
        )
    };
    if f32_out {
        o.store(.., o.load(..) + dot(xv, yv));
    } else {
        acc.store(.., acc.load(..) + dot(xv, yv));
        o.store(.., acc.load(..).convert(c.out_dtype));
    }
    b.build()
}

/// Numerically stable softmax of each row, one block of whole rows per
/// grid step, computed in f32.
pub fn softmax(c: &SoftmaxConfig) -> Result<VerifiedKernel, KernelErrors> {
    let mut k = KernelBuilder::new("softmax");
    k.grid([cdiv(c.rows, c.block_rows)], [Parallel]);
    let block = [c.block_rows, c.cols];
    let x = k
        .input("x", c.dtype, [c.rows, c.cols])
        .block(block, |[i]| (i, 0));
    let o = k
        .output("o", c.dtype, [c.rows, c.cols])
        .block(block, |[i]| (i, 0));
    let v = to_f32(x.load(..));
    let e = (v - v.max_keep(1)).exp();
    o.store(.., from_f32(e / e.sum_keep(1), c.dtype));
    k.build()
}

/// Layer norm over the last dim: `(x − mean) / sqrt(var + eps) · gamma +
/// beta`, with rank-1 gamma and beta broadcast over the rows of a block.
pub fn layer_norm(c: &NormConfig) -> Result<VerifiedKernel, KernelErrors> {
    let mut k = KernelBuilder::new("layer_norm");
    k.grid([cdiv(c.rows, c.block_rows)], [Parallel]);
    let block = [c.block_rows, c.cols];
    let x = k
        .input("x", c.dtype, [c.rows, c.cols])
        .block(block, |[i]| (i, 0));
    let gamma = k.input("gamma", F32, [c.cols]).block([c.cols], |[_]| [0]);
    let beta = k.input("beta", F32, [c.cols]).block([c.cols], |[_]| [0]);
    let o = k
        .output("o", c.dtype, [c.rows, c.cols])
        .block(block, |[i]| (i, 0));
    let v = to_f32(x.load(..));
    let n = c.cols as f32;
    let centered = v - v.sum_keep(1) / n;
    let var = (centered * centered).sum_keep(1) / n;
    let y = centered * (var + c.eps).rsqrt() * gamma.load(..) + beta.load(..);
    o.store(.., from_f32(y, c.dtype));
    k.build()
}

fn to_f32(t: Tile) -> Tile {
    if t.dtype() == F32 { t } else { t.convert(F32) }
}

fn from_f32(t: Tile, dtype: DType) -> Tile {
    if dtype == F32 { t } else { t.convert(dtype) }
}
