//! The kernels the `tessera` command knows, with their config parameters,
//! defaults and default input shapes: what `tessera list` prints and
//! `tessera lower`, `run` and `diff` build.
//!
//! ```
//! use kernels::catalog::{Config, find};
//! let k = find("flash_attention").unwrap();
//! let cfg = Config::parse(&k, &[("causal".into(), "true".into())]).unwrap();
//! let kernel = k.build_at_default_shapes(&cfg).unwrap();
//! assert_eq!(kernel.outputs().count(), 2); // o and lse
//! ```

use std::collections::BTreeMap;

use kernel_ir::{Array, DType, VerifiedKernel};

use crate::attention::backward::{attention_delta, flash_attention_dkv, flash_attention_dq};
use crate::attention::decode::{DecodeConfig, paged_decode_attention};
use crate::attention::{AttnConfig, flash_attention, flash_attention_kv_len};
use crate::epilogue::{Activation, EpilogueConfig, matmul_epilogue};
use crate::foundation::{
    AddConfig, LayerNormConfig, MatmulConfig, SoftmaxConfig, add, layer_norm, matmul, softmax,
};
use crate::norm::{NormConfig, layer_norm_bwd, rms_norm, rms_norm_bwd};
use crate::reference;
use crate::swiglu::{SwigluConfig, swiglu};

/// One config parameter.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    /// Its key in `--config key=value`.
    pub name: &'static str,
    /// The default value, as text.
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// Parsed `--config` values of one kernel (defaults filled in).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    values: BTreeMap<&'static str, String>,
}

type Shapes = Vec<(&'static str, Vec<usize>)>;
type BuildFn = fn(&Config, &[Vec<usize>]) -> Result<VerifiedKernel, String>;
type ShapesFn = fn(&Config) -> Result<Shapes, String>;
type ReferenceFn = fn(&Config, &[Array]) -> Result<Vec<Vec<f64>>, String>;

/// A kernel of the catalog.
pub struct Entry {
    /// Name, as the command takes it.
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
    /// Its config parameters.
    pub params: &'static [Param],
    shapes: ShapesFn,
    build: BuildFn,
    reference: ReferenceFn,
}

impl Entry {
    /// The inputs (scalar prefetch first) with their default shapes.
    pub fn default_shapes(&self, cfg: &Config) -> Result<Shapes, String> {
        (self.shapes)(cfg)
    }

    /// Builds and verifies the kernel for `cfg` and the inputs' shapes (in
    /// the order of [`Entry::default_shapes`]).
    pub fn build(&self, cfg: &Config, shapes: &[Vec<usize>]) -> Result<VerifiedKernel, String> {
        let want = self.default_shapes(cfg)?.len();
        if shapes.len() != want {
            return Err(format!(
                "kernel `{}` takes {want} inputs, got {}",
                self.name,
                shapes.len()
            ));
        }
        (self.build)(cfg, shapes)
    }

    /// What the inputs must satisfy beyond their shapes and types, checked
    /// before anything runs, so every back end (and the reference) gets
    /// the same answer for out-of-range values: an error naming the value.
    ///
    /// * a valid kv length in `0..=skv`;
    /// * paged decode: lengths in `0..=pages_per_seq · page`, block-table
    ///   entries in `0..pages`;
    /// * attention: scores that stay in f32 range (`max|q| · max|k| · d ·
    ///   sm_scale` finite), or the kernels compute ±∞ and NaN.
    pub fn check_inputs(
        &self,
        cfg: &Config,
        kernel: &VerifiedKernel,
        inputs: &[Array],
    ) -> Result<(), String> {
        let arg = |name: &str| {
            kernel
                .arguments()
                .position(|a| a.name == name)
                .and_then(|i| inputs.get(i))
        };
        let in_range = |name: &str, lo: f64, hi: f64, what: &str| -> Result<(), String> {
            if let Some(a) = arg(name)
                && let Some((i, v)) = a
                    .data()
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !(lo..=hi).contains(*v))
            {
                return Err(format!(
                    "input `{name}` has {v} at flat index {i}, outside {lo}..={hi} ({what})"
                ));
            }
            Ok(())
        };
        match self.name {
            "flash_attention_kv_len" => {
                let skv = arg("k").map_or(0, |k| k.shape()[2]) as f64;
                in_range("kv_len", 0.0, skv, "the keys that exist")?;
            }
            "paged_decode_attention" => {
                let tables = arg("block_tables").map_or(&[][..], |t| t.shape());
                let pages_per_seq = tables.get(1).copied().unwrap_or(0);
                let pool = arg("k_pages").map_or(&[][..], |k| k.shape());
                let (pages, page) = (
                    pool.get(1).copied().unwrap_or(0),
                    pool.get(2).copied().unwrap_or(0),
                );
                in_range(
                    "lengths",
                    0.0,
                    (pages_per_seq * page) as f64,
                    "a sequence holds at most pages_per_seq x page tokens",
                )?;
                in_range(
                    "block_tables",
                    0.0,
                    pages as f64 - 1.0,
                    "the pages of the pool",
                )?;
            }
            _ => {}
        }
        if let (Some(q), Some(k)) = (arg("q"), arg("k")) {
            // `auto` (or no such parameter): 1/√d.
            let given = if self.params.iter().any(|p| p.name == "sm_scale") {
                cfg.opt_f32("sm_scale").ok().flatten()
            } else {
                None
            };
            let scale = given
                .map(f64::from)
                .unwrap_or_else(|| 1.0 / (*q.shape().last().unwrap_or(&1) as f64).sqrt());
            let max = |a: &Array| a.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let d = *q.shape().last().unwrap_or(&1) as f64;
            let bound = max(q) * max(k) * d * scale.abs();
            if !bound.is_finite() || bound > f32::MAX as f64 / 4.0 {
                return Err(format!(
                    "the attention scores can overflow f32: max|q| x max|k| x d x sm_scale = {bound:.3e} (f32 holds up to 3.4e38); scale q or k down"
                ));
            }
        }
        Ok(())
    }

    /// The kernel for `cfg` at the default input shapes.
    pub fn build_at_default_shapes(&self, cfg: &Config) -> Result<VerifiedKernel, String> {
        let shapes: Vec<Vec<usize>> = self
            .default_shapes(cfg)?
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        self.build(cfg, &shapes)
    }

    /// The f64 reference of each output for these inputs.
    pub fn reference(&self, cfg: &Config, inputs: &[Array]) -> Result<Vec<Vec<f64>>, String> {
        (self.reference)(cfg, inputs)
    }
}

impl Config {
    /// Defaults of `entry` overridden by `pairs`; an unknown key or a
    /// repeated one is an error naming the valid keys.
    pub fn parse(entry: &Entry, pairs: &[(String, String)]) -> Result<Config, String> {
        let mut values: BTreeMap<&'static str, String> = entry
            .params
            .iter()
            .map(|p| (p.name, p.default.to_string()))
            .collect();
        let mut seen = Vec::new();
        for (k, v) in pairs {
            let Some(p) = entry.params.iter().find(|p| p.name == k) else {
                let keys: Vec<&str> = entry.params.iter().map(|p| p.name).collect();
                return Err(format!(
                    "unknown config key `{k}` for kernel `{}`; its keys are: {}",
                    entry.name,
                    keys.join(", ")
                ));
            };
            if seen.contains(&p.name) {
                return Err(format!("config key `{k}` is given twice"));
            }
            seen.push(p.name);
            values.insert(p.name, v.clone());
        }
        let cfg = Config { values };
        // Every value must parse as its kind: check now, not at build.
        (entry.shapes)(&cfg)?;
        Ok(cfg)
    }

    fn get(&self, k: &str) -> &str {
        self.values.get(k).map_or("", String::as_str)
    }

    fn bad(&self, k: &str, what: &str) -> String {
        format!("config `{k}={}` must be {what}", self.get(k))
    }

    /// A positive integer.
    pub fn usize(&self, k: &str) -> Result<usize, String> {
        self.get(k)
            .parse::<usize>()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| self.bad(k, "a positive integer"))
    }

    /// A number.
    pub fn f32(&self, k: &str) -> Result<f32, String> {
        self.get(k)
            .parse::<f32>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| self.bad(k, "a finite number"))
    }

    /// `true` or `false`.
    pub fn bool(&self, k: &str) -> Result<bool, String> {
        match self.get(k) {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(self.bad(k, "true or false")),
        }
    }

    /// A float dtype name.
    pub fn dtype(&self, k: &str) -> Result<DType, String> {
        match self.get(k).parse::<DType>() {
            Ok(d) if d.is_float() => Ok(d),
            _ => Err(self.bad(k, "f32, bf16 or f16")),
        }
    }

    /// `none` or a positive integer.
    pub fn opt_usize(&self, k: &str) -> Result<Option<usize>, String> {
        if self.get(k) == "none" {
            Ok(None)
        } else {
            self.usize(k)
                .map(Some)
                .map_err(|_| self.bad(k, "none or a positive integer"))
        }
    }

    /// `none` or a positive number.
    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>, String> {
        if self.get(k) == "none" {
            Ok(None)
        } else {
            self.f32(k)
                .ok()
                .filter(|v| *v > 0.0)
                .map(Some)
                .ok_or_else(|| self.bad(k, "none or a positive number"))
        }
    }

    /// `auto` (`1/√d`) or a number.
    fn scale(&self, k: &str, d: usize) -> Result<f32, String> {
        if self.get(k) == "auto" {
            Ok(1.0 / (d as f32).sqrt())
        } else {
            self.f32(k).map_err(|_| self.bad(k, "auto or a number"))
        }
    }

    fn activation(&self, k: &str) -> Result<Activation, String> {
        match self.get(k) {
            "none" => Ok(Activation::Identity),
            "gelu" => Ok(Activation::Gelu),
            "silu" => Ok(Activation::Silu),
            _ => Err(self.bad(k, "none, gelu or silu")),
        }
    }
}

fn dims<const N: usize>(s: &[usize], what: &str) -> Result<[usize; N], String> {
    s.try_into()
        .map_err(|_| format!("`{what}` must have rank {N}, got shape {s:?}"))
}

fn e(x: kernel_ir::KernelErrors) -> String {
    x.to_string()
}

/// A [`Param`], one line per table row (tables calling it sit in
/// `const { }` blocks so they are `'static`).
const fn param(name: &'static str, default: &'static str, help: &'static str) -> Param {
    Param {
        name,
        default,
        help,
    }
}

const DTYPE: Param = param("dtype", "f32", "element type: f32, bf16 or f16");
const OUT_DTYPE: Param = param("out_dtype", "f32", "output element type");
const BN: Param = param("bn", "128", "block columns");
const BK: Param = param("bk", "128", "block depth along k");

const ATTN_PARAMS: &[Param] = &[
    DTYPE,
    param("causal", "false", "query i sees keys j <= i only"),
    param(
        "block_q",
        "64",
        "query rows per block (clamped to the sequence)",
    ),
    param("block_k", "128", "keys per block (clamped to the sequence)"),
    param("sm_scale", "auto", "score scale; auto = 1/sqrt(head_dim)"),
    param(
        "window",
        "none",
        "sliding window: keys more than window-1 away are hidden",
    ),
    param("softcap", "none", "logit soft-cap: s = cap * tanh(s / cap)"),
];

fn attn_config(c: &Config, sq: usize, skv: usize, d: usize) -> Result<AttnConfig, String> {
    Ok(AttnConfig {
        causal: c.bool("causal")?,
        sm_scale: c.scale("sm_scale", d)?,
        block_q: c.usize("block_q")?.min(sq),
        block_k: c.usize("block_k")?.min(skv),
        window: c.opt_usize("window")?,
        softcap: c.opt_f32("softcap")?,
    })
}

fn attn_spec(c: &Config, d: usize) -> Result<reference::AttnSpec, String> {
    Ok(reference::AttnSpec {
        causal: c.bool("causal")?,
        scale: c.scale("sm_scale", d)? as f64,
        window: c.opt_usize("window")?,
        softcap: c.opt_f32("softcap")?.map(f64::from),
        kv_len: None,
    })
}

/// `[b, h, s, d]` q, `[b, hkv, s, d]` k and v: the attention defaults.
fn qkv() -> Shapes {
    vec![
        ("q", vec![1, 2, 256, 64]),
        ("k", vec![1, 2, 256, 64]),
        ("v", vec![1, 2, 256, 64]),
    ]
}

/// q, k, v, dO, lse, delta: the inputs of the dq and dk/dv kernels.
fn backward_shapes(_: &Config) -> Result<Shapes, String> {
    let mut v = qkv();
    v.extend([
        ("d_o", vec![1, 2, 256, 64]),
        ("lse", vec![1, 2, 256, 1]),
        ("delta", vec![1, 2, 256, 1]),
    ]);
    Ok(v)
}

fn norm_config(c: &Config, s: &[usize]) -> Result<NormConfig, String> {
    let [rows, cols] = dims(s, "x")?;
    Ok(NormConfig {
        rows,
        cols,
        block_rows: c.usize("block_rows")?.min(rows),
        eps: c.f32("eps")?,
        dtype: c.dtype("dtype")?,
    })
}

const NORM_PARAMS: &[Param] = &[
    DTYPE,
    param("block_rows", "8", "rows per block"),
    param("eps", "1e-5", "added to the mean square or variance"),
];

/// `(m, n, k)` of `x: [m, k]` times `rhs: [k, n]` (the rhs input is
/// called `rhs`).
fn matmul_shapes(s: &[Vec<usize>], rhs: &str) -> Result<(usize, usize, usize), String> {
    let [m, k] = dims(&s[0], "x")?;
    let [k2, n] = dims(&s[1], rhs)?;
    if k != k2 {
        return Err(format!(
            "x is [{m}, {k}] but {rhs} is [{k2}, {n}]: the inner dims differ"
        ));
    }
    Ok((m, n, k))
}

/// Every kernel of the catalog, in a fixed order.
pub fn entries() -> Vec<Entry> {
    vec![
        Entry {
            name: "add",
            about: "tiled elementwise add",
            params: const {
                &[
                    DTYPE,
                    param("block_rows", "16", "rows per block"),
                    param("block_cols", "128", "columns per block"),
                ]
            },
            shapes: |_| Ok(vec![("x", vec![64, 256]), ("y", vec![64, 256])]),
            build: |c, s| {
                let [rows, cols] = dims(&s[0], "x")?;
                add(&AddConfig {
                    rows,
                    cols,
                    block_rows: c.usize("block_rows")?.min(rows),
                    block_cols: c.usize("block_cols")?.min(cols),
                    dtype: c.dtype("dtype")?,
                })
                .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::add(&a[0], &a[1])]),
        },
        Entry {
            name: "matmul",
            about: "tiled matmul with an f32 accumulator in scratch",
            params: const { &[DTYPE, OUT_DTYPE, param("bm", "128", "block rows"), BN, BK] },
            shapes: |_| Ok(vec![("x", vec![256, 512]), ("y", vec![512, 256])]),
            build: |c, s| {
                let (m, n, k) = matmul_shapes(s, "y")?;
                matmul(&MatmulConfig {
                    m,
                    n,
                    k,
                    bm: c.usize("bm")?.min(m),
                    bn: c.usize("bn")?.min(n),
                    bk: c.usize("bk")?.min(k),
                    dtype: c.dtype("dtype")?,
                    out_dtype: c.dtype("out_dtype")?,
                })
                .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::matmul(&a[0], &a[1])]),
        },
        Entry {
            name: "softmax",
            about: "row softmax, whole rows per block",
            params: const { &[DTYPE, param("block_rows", "16", "rows per block")] },
            shapes: |_| Ok(vec![("x", vec![64, 512])]),
            build: |c, s| {
                let [rows, cols] = dims(&s[0], "x")?;
                softmax(&SoftmaxConfig {
                    rows,
                    cols,
                    block_rows: c.usize("block_rows")?.min(rows),
                    dtype: c.dtype("dtype")?,
                })
                .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::softmax_rows(&a[0])]),
        },
        Entry {
            name: "layer_norm",
            about: "layer norm over the last dim",
            params: NORM_PARAMS,
            shapes: |_| {
                Ok(vec![
                    ("x", vec![64, 256]),
                    ("gamma", vec![256]),
                    ("beta", vec![256]),
                ])
            },
            build: |c, s| {
                let n = norm_config(c, &s[0])?;
                layer_norm(&LayerNormConfig {
                    rows: n.rows,
                    cols: n.cols,
                    block_rows: n.block_rows,
                    eps: n.eps,
                    dtype: n.dtype,
                })
                .map_err(e)
            },
            reference: |c, a| {
                Ok(vec![reference::layer_norm(
                    &a[0],
                    &a[1],
                    &a[2],
                    c.f32("eps")? as f64,
                )])
            },
        },
        Entry {
            name: "flash_attention",
            about: "flash attention forward (GQA, causal, window, soft-cap): outputs o and lse",
            params: ATTN_PARAMS,
            shapes: |_| Ok(qkv()),
            build: |c, s| {
                let [b, h, sq, d] = dims(&s[0], "q")?;
                let [_, hkv, skv, _] = dims(&s[1], "k")?;
                let dims =
                    crate::attention::flash_attention::Dims::from_shapes(&[&s[0], &s[1], &s[2]])
                        .map_err(e)?;
                let _ = (b, h, hkv, sq, skv, d);
                flash_attention(&attn_config(c, sq, skv, d)?, c.dtype("dtype")?, dims).map_err(e)
            },
            reference: |c, a| {
                let d = a[0].shape()[3];
                let (o, lse) = reference::attention_full(&a[0], &a[1], &a[2], &attn_spec(c, d)?);
                Ok(vec![o, lse])
            },
        },
        Entry {
            name: "flash_attention_kv_len",
            about: "flash attention forward over keys padded to a bucket; kv_len[0] valid keys",
            params: ATTN_PARAMS,
            shapes: |_| {
                let mut v = vec![("kv_len", vec![1])];
                v.extend(qkv());
                Ok(v)
            },
            build: |c, s| {
                let [_, _, sq, d] = dims(&s[1], "q")?;
                let [_, _, skv, _] = dims(&s[2], "k")?;
                let dims =
                    crate::attention::flash_attention::Dims::from_shapes(&[&s[1], &s[2], &s[3]])
                        .map_err(e)?;
                flash_attention_kv_len(&attn_config(c, sq, skv, d)?, c.dtype("dtype")?, dims)
                    .map_err(e)
            },
            reference: |c, a| {
                let d = a[1].shape()[3];
                let spec = reference::AttnSpec {
                    kv_len: Some(a[0].data()[0].max(0.0) as usize),
                    ..attn_spec(c, d)?
                };
                let (o, lse) = reference::attention_full(&a[1], &a[2], &a[3], &spec);
                Ok(vec![o, lse])
            },
        },
        Entry {
            name: "attention_delta",
            about: "flash attention backward: delta = rowsum(dO * O)",
            params: const { &[DTYPE, param("block_q", "64", "query rows per block")] },
            shapes: |_| {
                Ok(vec![
                    ("o", vec![1, 2, 256, 64]),
                    ("d_o", vec![1, 2, 256, 64]),
                ])
            },
            build: |c, s| {
                let dims =
                    crate::attention::backward::attention_delta::Dims::from_shapes(&[&s[0], &s[1]])
                        .map_err(e)?;
                attention_delta(c.usize("block_q")?.min(dims.sq), c.dtype("dtype")?, dims)
                    .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::attention_delta(a[0].data(), &a[1])]),
        },
        Entry {
            name: "flash_attention_dq",
            about: "flash attention backward: dq from q, k, v, dO, lse, delta",
            params: ATTN_PARAMS,
            shapes: backward_shapes,
            build: |c, s| {
                let [_, _, sq, d] = dims(&s[0], "q")?;
                let [_, _, skv, _] = dims(&s[1], "k")?;
                let refs: Vec<&[usize]> = s.iter().map(Vec::as_slice).collect();
                let dims = crate::attention::backward::flash_attention_dq::Dims::from_shapes(&refs)
                    .map_err(e)?;
                flash_attention_dq(&attn_config(c, sq, skv, d)?, c.dtype("dtype")?, dims).map_err(e)
            },
            reference: |c, a| {
                let d = a[0].shape()[3];
                Ok(vec![
                    reference::attention_backward(&a[0], &a[1], &a[2], &a[3], &attn_spec(c, d)?).0,
                ])
            },
        },
        Entry {
            name: "flash_attention_dkv",
            about: "flash attention backward: dk and dv (summed over GQA groups)",
            params: ATTN_PARAMS,
            shapes: backward_shapes,
            build: |c, s| {
                let [_, _, sq, d] = dims(&s[0], "q")?;
                let [_, _, skv, _] = dims(&s[1], "k")?;
                let refs: Vec<&[usize]> = s.iter().map(Vec::as_slice).collect();
                let dims =
                    crate::attention::backward::flash_attention_dkv::Dims::from_shapes(&refs)
                        .map_err(e)?;
                flash_attention_dkv(&attn_config(c, sq, skv, d)?, c.dtype("dtype")?, dims)
                    .map_err(e)
            },
            reference: |c, a| {
                let d = a[0].shape()[3];
                let (_, dk, dv) =
                    reference::attention_backward(&a[0], &a[1], &a[2], &a[3], &attn_spec(c, d)?);
                Ok(vec![dk, dv])
            },
        },
        Entry {
            name: "paged_decode_attention",
            about: "decode attention over a paged KV cache (lengths and block tables as scalar prefetch)",
            params: const {
                &[
                    DTYPE,
                    param("sm_scale", "auto", "score scale; auto = 1/sqrt(head_dim)"),
                ]
            },
            shapes: |_| {
                Ok(vec![
                    ("lengths", vec![4]),
                    ("block_tables", vec![4, 8]),
                    ("q", vec![4, 2, 4, 128]),
                    ("k_pages", vec![2, 40, 16, 128]),
                    ("v_pages", vec![2, 40, 16, 128]),
                ])
            },
            build: |c, s| {
                let refs: Vec<&[usize]> = s.iter().map(Vec::as_slice).collect();
                let dims =
                    crate::attention::decode::paged_decode_attention::Dims::from_shapes(&refs)
                        .map_err(e)?;
                let cfg = DecodeConfig {
                    sm_scale: c.scale("sm_scale", dims.d)?,
                };
                paged_decode_attention(&cfg, c.dtype("dtype")?, dims).map_err(e)
            },
            reference: |c, a| {
                let lengths: Vec<usize> =
                    a[0].data().iter().map(|&v| v.max(0.0) as usize).collect();
                let pps = a[1].shape()[1];
                let tables: Vec<Vec<usize>> = a[1]
                    .data()
                    .chunks(pps.max(1))
                    .map(|r| r.iter().map(|&v| v.max(0.0) as usize).collect())
                    .collect();
                let scale = c.scale("sm_scale", a[2].shape()[3])? as f64;
                Ok(vec![reference::paged_decode_attention(
                    &a[2], &a[3], &a[4], &lengths, &tables, scale,
                )])
            },
        },
        Entry {
            name: "rms_norm",
            about: "RMS norm over the last dim",
            params: NORM_PARAMS,
            shapes: |_| Ok(vec![("x", vec![64, 256]), ("gamma", vec![256])]),
            build: |c, s| rms_norm(&norm_config(c, &s[0])?).map_err(e),
            reference: |c, a| {
                Ok(vec![reference::rms_norm(
                    &a[0],
                    &a[1],
                    c.f32("eps")? as f64,
                )])
            },
        },
        Entry {
            name: "rms_norm_bwd",
            about: "RMS norm backward: dx and dgamma",
            params: NORM_PARAMS,
            shapes: |_| {
                Ok(vec![
                    ("x", vec![64, 256]),
                    ("gamma", vec![256]),
                    ("dy", vec![64, 256]),
                ])
            },
            build: |c, s| rms_norm_bwd(&norm_config(c, &s[0])?).map_err(e),
            reference: |c, a| {
                let (dx, dg) = reference::rms_norm_bwd(&a[0], &a[1], &a[2], c.f32("eps")? as f64);
                Ok(vec![dx, dg])
            },
        },
        Entry {
            name: "layer_norm_bwd",
            about: "layer norm backward: dx, dgamma and dbeta",
            params: NORM_PARAMS,
            shapes: |_| {
                Ok(vec![
                    ("x", vec![64, 256]),
                    ("gamma", vec![256]),
                    ("dy", vec![64, 256]),
                ])
            },
            build: |c, s| layer_norm_bwd(&norm_config(c, &s[0])?).map_err(e),
            reference: |c, a| {
                let (dx, dg, db) =
                    reference::layer_norm_bwd(&a[0], &a[1], &a[2], c.f32("eps")? as f64);
                Ok(vec![dx, dg, db])
            },
        },
        Entry {
            name: "matmul_epilogue",
            about: "matmul with a fused epilogue: act(x*w + bias) [+ residual]",
            params: const {
                &[
                    DTYPE,
                    param("out_dtype", "f32", "output (and residual) element type"),
                    param("activation", "gelu", "none, gelu or silu"),
                    param("residual", "false", "add a [m, n] residual input"),
                    param("bm", "128", "block rows"),
                    BN,
                    BK,
                ]
            },
            shapes: |c| {
                let mut v = vec![
                    ("x", vec![128, 320]),
                    ("w", vec![320, 256]),
                    ("bias", vec![1, 256]),
                ];
                if c.bool("residual")? {
                    v.push(("residual", vec![128, 256]));
                }
                Ok(v)
            },
            build: |c, s| {
                let (m, n, k) = matmul_shapes(s, "w")?;
                matmul_epilogue(&EpilogueConfig {
                    m,
                    n,
                    k,
                    bm: c.usize("bm")?.min(m),
                    bn: c.usize("bn")?.min(n),
                    bk: c.usize("bk")?.min(k),
                    activation: c.activation("activation")?,
                    residual: c.bool("residual")?,
                    dtype: c.dtype("dtype")?,
                    out_dtype: c.dtype("out_dtype")?,
                })
                .map_err(e)
            },
            reference: |c, a| {
                let act = match c.activation("activation")? {
                    Activation::Gelu => "gelu",
                    Activation::Silu => "silu",
                    Activation::Identity => "none",
                };
                Ok(vec![reference::matmul_epilogue(
                    &a[0],
                    &a[1],
                    &a[2],
                    act,
                    a.get(3),
                )])
            },
        },
        Entry {
            name: "rope",
            about: "rotary position embedding with [s, d/2] cos and sin tables",
            params: const { &[DTYPE, param("block_s", "32", "positions per block")] },
            shapes: |_| {
                Ok(vec![
                    ("x", vec![1, 4, 200, 128]),
                    ("cos", vec![200, 64]),
                    ("sin", vec![200, 64]),
                ])
            },
            build: |c, s| {
                let refs: Vec<&[usize]> = s.iter().map(Vec::as_slice).collect();
                let dims = crate::rope::rope::Dims::from_shapes(&refs).map_err(e)?;
                crate::rope::rope(c.usize("block_s")?.min(dims.s), c.dtype("dtype")?, dims)
                    .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::rope(&a[0], &a[1], &a[2])]),
        },
        Entry {
            name: "swiglu",
            about: "fused SwiGLU: silu(x*w_gate) * (x*w_up)",
            params: const { &[DTYPE, param("bm", "64", "block rows"), BN, BK] },
            shapes: |_| {
                Ok(vec![
                    ("x", vec![64, 256]),
                    ("w_gate", vec![256, 512]),
                    ("w_up", vec![256, 512]),
                ])
            },
            build: |c, s| {
                let (m, n, k) = matmul_shapes(s, "w_gate")?;
                swiglu(&SwigluConfig {
                    m,
                    n,
                    k,
                    bm: c.usize("bm")?.min(m),
                    bn: c.usize("bn")?.min(n),
                    bk: c.usize("bk")?.min(k),
                    dtype: c.dtype("dtype")?,
                })
                .map_err(e)
            },
            reference: |_, a| Ok(vec![reference::swiglu(&a[0], &a[1], &a[2])]),
        },
    ]
}

/// The entry called `name`.
pub fn find(name: &str) -> Option<Entry> {
    entries().into_iter().find(|e| e.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names `tessera list` prints (the kernel's arguments) are the
    /// names `--input` and `--shape` take (the catalog's shapes).
    #[test]
    fn input_names_are_the_kernels_argument_names() {
        for e in entries() {
            let cfg = Config::parse(&e, &[]).unwrap();
            let shapes = e.default_shapes(&cfg).unwrap();
            let k = e.build_at_default_shapes(&cfg).unwrap();
            let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
            let args: Vec<&str> = k.arguments().map(|a| a.name).collect();
            assert_eq!(names, args, "{}", e.name);
        }
    }

    /// A zero-size dim in any input of any kernel is an error from the
    /// build (the verifier's `[zero-size]` or a shape error), never a
    /// panic: every path runs only verified kernels, so this is the one
    /// answer on all of them.
    #[test]
    fn zero_size_dims_are_errors_for_every_kernel() {
        let mut tried = 0;
        for e in entries() {
            let cfg = Config::parse(&e, &[]).unwrap();
            let shapes: Vec<Vec<usize>> = e
                .default_shapes(&cfg)
                .unwrap()
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            for i in 0..shapes.len() {
                for d in 0..shapes[i].len() {
                    let mut s = shapes.clone();
                    s[i][d] = 0;
                    tried += 1;
                    // Either the build refuses it, or the kernel built
                    // from the other inputs takes another shape there (an
                    // argument error when it is called with this one).
                    match e.build(&cfg, &s) {
                        Err(_) => {}
                        Ok(k) => {
                            let want: Vec<Vec<usize>> =
                                k.arguments().map(|a| a.shape.to_vec()).collect();
                            assert_ne!(want[i], s[i], "{} input {i} dim {d}", e.name);
                        }
                    }
                }
            }
        }
        assert!(tried > 40, "{tried}");
    }
}
