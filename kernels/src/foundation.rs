//! The foundation kernels, written with `#[tpu_kernel]`: the smallest
//! kernels that exercise blocking, an `arbitrary` reduction dim with scratch
//! and row reductions (add, matmul, softmax; layer norm, the fourth the
//! builder API is checked against, lives with its backward in
//! [`crate::norm`]).
//!
//! Each kernel is generic over its element types; the config functions
//! (`add(&AddConfig)`, ...) pick the instance from a runtime dtype.

use kernel_ir::prelude::*;
use kernel_ir::{KernelErrors, VerifiedKernel};

use crate::entry::{
    DTYPE, Entry, OUT_DTYPE, ParamKind, Preset, dims, dtype_tolerance, matmul_shapes,
    matmul_tolerance, no_check, param, uniform_inputs,
};
use crate::reference;

/// Config of [`add()`].
#[derive(Clone, Debug, PartialEq)]
pub struct AddConfig {
    /// Array rows.
    pub rows: usize,
    /// Array columns.
    pub cols: usize,
    /// Rows per block.
    pub block_rows: usize,
    /// Columns per block.
    pub block_cols: usize,
    /// Element type of inputs and output.
    pub dtype: DType,
}

/// Tiled elementwise `o = x + y` over a 2-D grid of blocks. Partial last
/// blocks are allowed: their padding is computed and dropped.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(rows, block_rows), kernel_ir::cdiv(cols, block_cols)),
    semantics = (parallel, parallel)
)]
pub fn add<T: Float>(
    block_rows: usize,
    block_cols: usize,
    #[shape(rows, cols)]
    #[block([block_rows, block_cols], |i, j| (i, j))]
    x: In<T>,
    #[shape(rows, cols)]
    #[block([block_rows, block_cols], |i, j| (i, j))]
    y: In<T>,
    #[shape(rows, cols)]
    #[block([block_rows, block_cols], |i, j| (i, j))]
    o: Out<T>,
) {
    o.store(.., x.load(..) + y.load(..));
}

/// The [`add`](mod@add) kernel for a config.
pub fn add(c: &AddConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = add::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    add::build_for(c.dtype, c.block_rows, c.block_cols, dims)
}

/// Config of [`matmul()`].
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulConfig {
    /// Rows of x and o.
    pub m: usize,
    /// Columns of y and o.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// Block rows.
    pub bm: usize,
    /// Block columns.
    pub bn: usize,
    /// Block depth along k.
    pub bk: usize,
    /// Input dtype.
    pub dtype: DType,
    /// Output dtype.
    pub out_dtype: DType,
}

/// Tiled `o = x · y` accumulated in f32 over the `arbitrary` k grid dim,
/// zeroed at the first k step: in the output block itself when it is f32,
/// else in the `acc` scratch with the output block written from it at
/// every step (the last write is what reaches HBM). A ragged k tail is
/// masked so padding never enters the sum.
#[tpu_kernel(
    grid = (kernel_ir::cdiv(m, bm), kernel_ir::cdiv(n, bn), kernel_ir::cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary)
)]
pub fn matmul<T: Float, O: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    y: In<T>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    o: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let l = program_id(2);
    // No write of the output under `if l == last`: that branch cost 1.1%
    // in libtpu's schedule estimate (v6e, 1024³ in 256³ blocks: 38,608
    // against Pallas's 38,185 cycles, which writes every step). The output
    // block stays in VMEM while its index does not change, so HBM sees it
    // once either way.
    if O::DTYPE == DType::F32 {
        // An f32 output is its own accumulator (no copy at the end).
        if l == 0 {
            o.store(.., 0.0);
        }
        let (xv, yv) = k_block_operands(k, bk, x, y);
        o.store(.., o.load(..) + dot(xv, yv));
    } else {
        accumulate_k_step(k, bk, x, y, acc, l);
        o.store(.., acc.load(..).cast::<O>());
    }
}

/// One k step `l` of a tiled matmul into the f32 accumulator `acc[bm, bn]`:
/// zeroed at the first step, then `acc += x · y` over the step's blocks.
#[kernel_fn]
pub(crate) fn accumulate_k_step(k: usize, bk: usize, x: Ref, y: Ref, acc: Ref, l: Tile) {
    if l == 0 {
        acc.store(.., 0.0);
    }
    let (xv, yv) = k_block_operands(k, bk, x, y);
    acc.store(.., acc.load(..) + dot(xv, yv));
}

/// The operands of one k step of a tiled matmul: `x[bm, bk]` and
/// `y[bk, bn]`, with a ragged k tail masked so padding never enters a sum
/// (where each block sits along k comes from its own index map).
#[kernel_fn]
pub(crate) fn k_block_operands(k: usize, bk: usize, x: Ref, y: Ref) -> (Tile, Tile) {
    if k % bk == 0 {
        (x.load(..), y.load(..))
    } else {
        let valid = k as i32;
        (
            x.load_masked(.., x.positions(1) < valid),
            y.load_masked(.., y.positions(0) < valid),
        )
    }
}

/// The rhs operand `y[bk, bn]` of one k step, ragged tail masked (for a
/// second rhs next to [`k_block_operands`]).
#[kernel_fn]
pub(crate) fn k_block_rhs(k: usize, bk: usize, y: Ref) -> Tile {
    if k % bk == 0 {
        y.load(..)
    } else {
        y.load_masked(.., y.positions(0) < k as i32)
    }
}

/// The [`matmul`](mod@matmul) kernel for a config.
pub fn matmul(c: &MatmulConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = matmul::Dims {
        m: c.m,
        k: c.k,
        n: c.n,
    };
    matmul::build_for(c.dtype, c.out_dtype, c.bm, c.bn, c.bk, dims)
}

/// Config of [`softmax()`].
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxConfig {
    /// Array rows.
    pub rows: usize,
    /// Array columns (one block spans them all).
    pub cols: usize,
    /// Rows per block.
    pub block_rows: usize,
    /// Element type of input and output (math runs in f32).
    pub dtype: DType,
}

/// Numerically stable softmax of each row, one block of whole rows per
/// grid step, computed in f32.
#[tpu_kernel(grid = (kernel_ir::cdiv(rows, block_rows),), semantics = (parallel,))]
pub fn softmax<T: Float>(
    block_rows: usize,
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    x: In<T>,
    #[shape(rows, cols)]
    #[block([block_rows, cols], |i| (i, 0))]
    o: Out<T>,
) {
    let v = x.load(..).convert(F32);
    let e = (v - v.max_keep(1)).exp();
    o.store(.., (e / e.sum_keep(1)).cast::<T>());
}

/// The [`softmax`](mod@softmax) kernel for a config.
pub fn softmax(c: &SoftmaxConfig) -> Result<VerifiedKernel, KernelErrors> {
    let dims = softmax::Dims {
        rows: c.rows,
        cols: c.cols,
    };
    softmax::build_for(c.dtype, c.block_rows, dims)
}

/// [`add()`] in the library.
pub const ADD: Entry = Entry {
    name: "add",
    fixed_inputs: None,
    backward: None,
    about: "tiled elementwise add",
    params: &[
        DTYPE,
        param("block_rows", ParamKind::Positive, "16", "rows per block"),
        param(
            "block_cols",
            ParamKind::Positive,
            "128",
            "columns per block",
        ),
    ],
    inputs: |_| Ok(vec![("x", vec![64, 256]), ("y", vec![64, 256])]),
    build: |c, s| {
        let [rows, cols] = dims(&s[0], "x")?;
        Ok(add(&AddConfig {
            rows,
            cols,
            block_rows: c.usize("block_rows")?.min(rows),
            block_cols: c.usize("block_cols")?.min(cols),
            dtype: c.dtype("dtype")?,
        })?)
    },
    reference: |_, a| Ok(vec![reference::add(&a[0], &a[1])]),
    check: no_check,
    tolerance: dtype_tolerance,
    sample: uniform_inputs,
    presets: &[
        Preset {
            name: "add_f32",
            about: "tiled elementwise add, f32[64, 256] in 16x128 blocks",
            config: &[],
            shapes: &[],
        },
        Preset {
            name: "add_bf16_ragged",
            about: "tiled add with partial last blocks, bf16[40, 200] in 16x128 blocks",
            config: &[("dtype", "bf16")],
            shapes: &[("x", &[40, 200]), ("y", &[40, 200])],
        },
    ],
};

const MATMUL_BLOCKS: [crate::Param; 3] = [
    param("bm", ParamKind::Positive, "128", "block rows"),
    param("bn", ParamKind::Positive, "128", "block columns"),
    param("bk", ParamKind::Positive, "128", "block depth along k"),
];

/// [`matmul()`] in the library.
pub const MATMUL: Entry = Entry {
    name: "matmul",
    fixed_inputs: None,
    backward: None,
    about: "tiled matmul with an f32 accumulator in scratch",
    params: &[
        DTYPE,
        OUT_DTYPE,
        MATMUL_BLOCKS[0],
        MATMUL_BLOCKS[1],
        MATMUL_BLOCKS[2],
    ],
    inputs: |_| Ok(vec![("x", vec![256, 512]), ("y", vec![512, 256])]),
    build: |c, s| {
        let (m, n, k) = matmul_shapes(s, "y")?;
        Ok(matmul(&MatmulConfig {
            m,
            n,
            k,
            bm: c.usize("bm")?.min(m),
            bn: c.usize("bn")?.min(n),
            bk: c.usize("bk")?.min(k),
            dtype: c.dtype("dtype")?,
            out_dtype: c.dtype("out_dtype")?,
        })?)
    },
    reference: |_, a| Ok(vec![reference::matmul(&a[0], &a[1])]),
    check: no_check,
    tolerance: matmul_tolerance,
    sample: uniform_inputs,
    presets: &[
        Preset {
            name: "matmul_bf16_f32",
            about: "tiled matmul 256x256x512, bf16 in, f32 accumulator in scratch",
            config: &[("dtype", "bf16")],
            shapes: &[],
        },
        Preset {
            name: "matmul_ragged_k",
            about: "tiled matmul 64x128x200 with the k tail masked",
            config: &[],
            shapes: &[("x", &[64, 200]), ("y", &[200, 128])],
        },
    ],
};

/// [`softmax()`] in the library.
pub const SOFTMAX: Entry = Entry {
    name: "softmax",
    fixed_inputs: None,
    backward: None,
    about: "row softmax, whole rows per block",
    params: &[
        DTYPE,
        param("block_rows", ParamKind::Positive, "16", "rows per block"),
    ],
    inputs: |_| Ok(vec![("x", vec![64, 512])]),
    build: |c, s| {
        let [rows, cols] = dims(&s[0], "x")?;
        Ok(softmax(&SoftmaxConfig {
            rows,
            cols,
            block_rows: c.usize("block_rows")?.min(rows),
            dtype: c.dtype("dtype")?,
        })?)
    },
    reference: |_, a| Ok(vec![reference::softmax_rows(&a[0])]),
    check: no_check,
    tolerance: dtype_tolerance,
    sample: uniform_inputs,
    presets: &[Preset {
        name: "softmax_bf16",
        about: "row softmax, bf16[64, 512], 16 rows per step",
        config: &[("dtype", "bf16")],
        shapes: &[],
    }],
};
