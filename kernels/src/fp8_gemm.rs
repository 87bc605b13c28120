//! The CUTLASS FP8 GEMM port: `o = act(sx ⊙ (x · w) ⊙ sw + bias) [+
//! residual]` with `x, w` in fp8 (`f8e4m3fn` or `f8e5m2`), the products
//! accumulated in f32, and the scales applied once, in the epilogue, to the
//! f32 accumulator: per tensor (`sx, sw: [1, 1]`) or per row of `x` and
//! per column of `w` (`sx: [m, 1]`, `sw: [1, n]`, CUTLASS's row-wise
//! scaling). The epilogue is `matmul_epilogue`'s (bias, gelu/silu,
//! residual), the output bf16 or f32.
//!
//! `accumulate = bf16` rounds the running sum to bf16 after every k step,
//! the scheme of a kernel that keeps its partials in 16 bits: the numerics
//! report (`kernels::guide::numerics`) measures what it costs.
//!
//! ```
//! use kernels::fp8_gemm::{Fp8GemmConfig, Scaling, fp8_gemm};
//! use kernels::epilogue::Activation;
//! let cfg = Fp8GemmConfig { m: 128, n: 128, k: 256, bm: 128, bn: 128, bk: 128,
//!     scaling: Scaling::Row, activation: Activation::Identity, residual: false,
//!     bf16_partials: false, dtype: kernel_ir::DType::F8E4M3FN, out_dtype: kernel_ir::DType::BF16 };
//! let k = fp8_gemm(&cfg).unwrap();
//! assert_eq!(k.arguments().count(), 5); // x, w, sx, sw, bias
//! ```

use kernel_ir::prelude::*;
use kernel_ir::{Array, KernelErrors, VerifiedKernel};

use crate::entry::{
    Config, Entry, EntryError, ParamKind, Preset, dims, matmul_tolerance, no_check, param,
};
use crate::epilogue::{Activation, activate};
use crate::foundation::k_block_operands;

/// How the fp8 operands are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// One scale for all of `x` and one for all of `w`.
    Tensor,
    /// One scale per row of `x` and one per column of `w`.
    Row,
}

/// Config of [`fp8_gemm()`].
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8GemmConfig {
    /// Rows of x and o.
    pub m: usize,
    /// Columns of w and o.
    pub n: usize,
    /// The contracted dim.
    pub k: usize,
    /// Block rows.
    pub bm: usize,
    /// Block columns.
    pub bn: usize,
    /// Block depth along k.
    pub bk: usize,
    /// Per-tensor or per-row scales.
    pub scaling: Scaling,
    /// The epilogue's activation.
    pub activation: Activation,
    /// Add a `[m, n]` residual (of the output dtype) after the activation.
    pub residual: bool,
    /// Round the running sum to bf16 after each k step (a 16-bit partials
    /// kernel, for the numerics comparison).
    pub bf16_partials: bool,
    /// The fp8 format of x and w.
    pub dtype: DType,
    /// Output (and residual) dtype.
    pub out_dtype: DType,
}

/// `o = act(sx ⊙ (x·w) ⊙ sw + bias) [+ residual]` (see the module docs).
#[tpu_kernel(
    grid = (cdiv(m, bm), cdiv(n, bn), cdiv(k, bk)),
    semantics = (parallel, parallel, arbitrary),
    name = if with_residual { "fp8_gemm_residual" } else { "fp8_gemm" }
)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_gemm<T: Fp8, O: Float>(
    bm: usize,
    bn: usize,
    bk: usize,
    per_row: usize,
    act: Activation,
    with_residual: bool,
    bf16_partials: bool,
    #[shape(m, k)]
    #[block([bm, bk], |i, _, l| (i, l))]
    x: In<T>,
    #[shape(k, n)]
    #[block([bk, bn], |_, j, l| (l, j))]
    w: In<T>,
    #[shape(sm, 1)]
    #[block([if per_row == 1 { bm } else { 1 }, 1], |i, _, _| (i * per_row, 0))]
    sx: In<f32>,
    #[shape(1, sn)]
    #[block([1, if per_row == 1 { bn } else { 1 }], |_, j, _| (0, j * per_row))]
    sw: In<f32>,
    #[shape(1, n)]
    #[block([1, bn], |_, j, _| (0, j))]
    bias: In<f32>,
    #[present(with_residual)]
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    residual: Option<In<O>>,
    #[shape(m, n)]
    #[block([bm, bn], |i, j, _| (i, j))]
    o: Out<O>,
    #[shape(bm, bn)] acc: Scratch<f32>,
) {
    let l = program_id(2);
    if l == 0 {
        acc.store(.., 0.0);
    }
    // The MXU multiplies the fp8 operands and accumulates in f32.
    let (xv, wv) = k_block_operands(k, bk, x, w);
    let mut sum = acc.load(..) + dot(xv, wv);
    if bf16_partials {
        sum = sum.convert(BF16).convert(F32);
    }
    acc.store(.., sum);
    if l == num_programs(2) - 1 {
        let y = acc.load(..) * sx.load(..) * sw.load(..);
        let mut y = activate(y + bias.load(..), act);
        if let Some(r) = residual {
            y = y + r.load(..).convert(F32);
        }
        o.store(.., y.cast::<O>());
    }
}

/// The FP8 GEMM for a config ([`fp8_gemm`](mod@fp8_gemm)). Arguments:
/// `x, w` (fp8), `sx, sw` (f32 scales: `[1, 1]` each, or `[m, 1]` and
/// `[1, n]` per row), `bias[1, n]` (f32) and, with `residual`, `residual`.
pub fn fp8_gemm(c: &Fp8GemmConfig) -> Result<VerifiedKernel, KernelErrors> {
    let per_row = (c.scaling == Scaling::Row) as usize;
    let (sm, sn) = if per_row == 1 { (c.m, c.n) } else { (1, 1) };
    let dims = fp8_gemm::Dims {
        m: c.m,
        k: c.k,
        n: c.n,
        sm,
        sn,
    };
    fp8_gemm::build_for(
        c.dtype,
        c.out_dtype,
        c.bm,
        c.bn,
        c.bk,
        per_row,
        c.activation,
        c.residual,
        c.bf16_partials,
        dims,
    )
}

/// The f64 reference: `act(sx ⊙ (x·w) ⊙ sw + bias) [+ residual]`.
pub fn reference(
    x: &Array,
    w: &Array,
    sx: &Array,
    sw: &Array,
    bias: &Array,
    act: &str,
    residual: Option<&Array>,
) -> Vec<f64> {
    let (m, n) = (x.shape()[0], w.shape()[1]);
    let prod = crate::reference::matmul(x, w);
    let scale = |a: &Array, i: usize| {
        if a.len() == 1 {
            a.data()[0]
        } else {
            a.data()[i]
        }
    };
    let scaled: Vec<f64> = (0..m * n)
        .map(|e| prod[e] * scale(sx, e / n) * scale(sw, e % n))
        .collect();
    crate::reference::epilogue(scaled, n, bias, act, residual)
}

fn config(c: &Config, m: usize, n: usize, k: usize) -> Result<Fp8GemmConfig, EntryError> {
    Ok(Fp8GemmConfig {
        m,
        n,
        k,
        bm: c.usize("bm")?.min(m),
        bn: c.usize("bn")?.min(n),
        bk: c.usize("bk")?.min(k),
        scaling: if c.choice("scaling")? == "row" {
            Scaling::Row
        } else {
            Scaling::Tensor
        },
        activation: match c.choice("activation")? {
            "gelu" => Activation::Gelu,
            "silu" => Activation::Silu,
            _ => Activation::Identity,
        },
        residual: c.bool("residual")?,
        bf16_partials: c.choice("accumulate")? == "bf16",
        dtype: match c.choice("fp8")? {
            "e5m2" => DType::F8E5M2,
            _ => DType::F8E4M3FN,
        },
        out_dtype: c.dtype("out_dtype")?,
    })
}

/// Activations and weights as a quantized layer holds them: values spread
/// over the fp8 range with scales that bring them back to O(1) outputs.
fn sample(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    let args: Vec<(DType, Vec<usize>, String)> = k
        .arguments()
        .map(|a| (a.dtype, a.shape.to_vec(), a.name.to_string()))
        .collect();
    let depth = args.first().map_or(1, |a| a.1[1]) as f64;
    // Positive scales in lo..hi.
    let scales = |shape: &[usize], s: u64, lo: f64, hi: f64| {
        Array::random(DType::F32, shape.to_vec(), s, lo, hi)
    };
    args.iter()
        .enumerate()
        .map(|(i, (d, shape, name))| {
            let s = seed + i as u64;
            match name.as_str() {
                "x" | "w" => Array::random(*d, shape.clone(), s, -8.0, 8.0),
                // A sum of `depth` products of magnitude ~16 back to O(1).
                "sx" => scales(shape, s, 0.5 / depth.sqrt(), 1.0 / depth.sqrt()),
                "sw" => scales(shape, s, 0.05, 0.1),
                _ => Array::random(*d, shape.clone(), s, -1.0, 1.0),
            }
        })
        .collect()
}

/// [`fp8_gemm()`] in the library.
pub const FP8_GEMM: Entry = Entry {
    name: "fp8_gemm",
    fixed_inputs: None,
    backward: None,
    about: "the CUTLASS FP8 GEMM: fp8 x fp8 in f32, per-tensor or per-row scales, the matmul_epilogue epilogue, bf16/f32 out",
    params: &[
        param(
            "fp8",
            ParamKind::Choice(&["e4m3", "e5m2"]),
            "e4m3",
            "fp8 format of x and w: e4m3 (f8e4m3fn) or e5m2",
        ),
        param(
            "out_dtype",
            ParamKind::FloatDType,
            "bf16",
            "output (and residual) element type: bf16 or f32",
        ),
        param(
            "scaling",
            ParamKind::Choice(&["tensor", "row"]),
            "row",
            "per-tensor scales, or per row of x and per column of w",
        ),
        param(
            "activation",
            ParamKind::Choice(&["none", "gelu", "silu"]),
            "none",
            "none, gelu or silu",
        ),
        param(
            "residual",
            ParamKind::Bool,
            "false",
            "add a [m, n] residual input",
        ),
        param(
            "accumulate",
            ParamKind::Choice(&["f32", "bf16"]),
            "f32",
            "the running sum in f32, or rounded to bf16 after each k step",
        ),
        param("bm", ParamKind::Positive, "128", "block rows"),
        param("bn", ParamKind::Positive, "128", "block columns"),
        param("bk", ParamKind::Positive, "128", "block depth along k"),
    ],
    inputs: |c| {
        let (m, n, k) = (256, 256, 512);
        let (sm, sn) = if c.choice("scaling")? == "row" {
            (m, n)
        } else {
            (1, 1)
        };
        let mut v = vec![
            ("x", vec![m, k]),
            ("w", vec![k, n]),
            ("sx", vec![sm, 1]),
            ("sw", vec![1, sn]),
            ("bias", vec![1, n]),
        ];
        if c.bool("residual")? {
            v.push(("residual", vec![m, n]));
        }
        Ok(v)
    },
    build: |c, s| {
        let [m, k] = dims(&s[0], "x")?;
        let [k2, n] = dims(&s[1], "w")?;
        if k != k2 {
            return Err(EntryError::Shape(format!(
                "x is [{m}, {k}] but w is [{k2}, {n}]: the inner dims differ"
            )));
        }
        let cfg = config(c, m, n, k)?;
        let want = if cfg.scaling == Scaling::Row {
            ([m, 1], [1, n])
        } else {
            ([1, 1], [1, 1])
        };
        if s[2] != want.0 || s[3] != want.1 {
            return Err(EntryError::Shape(format!(
                "with scaling = {}, sx must be {:?} and sw {:?}, got {:?} and {:?}",
                c.choice("scaling")?,
                want.0,
                want.1,
                s[2],
                s[3]
            )));
        }
        Ok(fp8_gemm(&cfg)?)
    },
    reference: |c, a| {
        Ok(vec![reference(
            &a[0],
            &a[1],
            &a[2],
            &a[3],
            &a[4],
            c.choice("activation")?,
            a.get(5),
        )])
    },
    check: no_check,
    tolerance: matmul_tolerance,
    sample,
    presets: &[
        Preset {
            name: "fp8_gemm_rowwise",
            about: "FP8 GEMM (e4m3) with per-row and per-column scales, f32 accumulation, bf16 out",
            config: &[],
            shapes: &[],
        },
        Preset {
            name: "fp8_gemm_e5m2_gelu_residual",
            about: "FP8 GEMM (e5m2) with per-tensor scales and the fused bias + gelu + residual epilogue, f32 out",
            config: &[
                ("fp8", "e5m2"),
                ("scaling", "tensor"),
                ("activation", "gelu"),
                ("residual", "true"),
                ("out_dtype", "f32"),
            ],
            shapes: &[],
        },
    ],
};
