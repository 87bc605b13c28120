//! What the library says about each kernel, next to the kernel: its
//! [`Entry`] (name, config parameters with kinds and defaults, default
//! input shapes, build from input shapes, f64 reference, input checks,
//! tolerances, sampled inputs) and its named [`Preset`]s.
//!
//! Everything that walks the library (`tessera list/lower/run/diff/compile`,
//! the lowering snapshots, the every-path and TPU-compile tests, the demo)
//! reads the entries of [`crate::ENTRIES`].
//!
//! ```
//! use kernels::{Config, find};
//! let k = find("flash_attention").unwrap();
//! let cfg = Config::parse(k, &[("causal".into(), "true".into())]).unwrap();
//! let kernel = k.build_at_default_shapes(&cfg).unwrap();
//! assert_eq!(kernel.outputs().count(), 2); // o and lse
//! ```

use std::collections::BTreeMap;

use kernel_ir::{Array, DType, KernelErrors, VerifiedKernel};

use super::tolerance::Tolerance;

/// What values a config parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// An integer ≥ 1.
    Positive,
    /// A finite number.
    Number,
    /// `true` or `false`.
    Bool,
    /// `f32`, `bf16` or `f16`.
    FloatDType,
    /// `none` or an integer ≥ 1.
    OptPositive,
    /// `none` or a number > 0.
    OptPositiveNumber,
    /// `auto` (`1/√d`) or a finite number.
    Scale,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A mask description ([`crate::attention::mask::Mask`]'s text form),
    /// or one per head separated by `;`.
    Mask,
}

impl ParamKind {
    /// The values, in words (for errors and `tessera list`).
    pub fn describe(self) -> String {
        match self {
            ParamKind::Positive => "a positive integer".into(),
            ParamKind::Number => "a finite number".into(),
            ParamKind::Bool => "true or false".into(),
            ParamKind::FloatDType => {
                "f32, bf16 or f16 (f8e4m3fn, f8e5m2 where the kernel takes them)".into()
            }
            ParamKind::OptPositive => "none or a positive integer".into(),
            ParamKind::OptPositiveNumber => "none or a positive number".into(),
            ParamKind::Scale => "auto or a number".into(),
            ParamKind::Choice(c) => c.join(", "),
            ParamKind::Mask => {
                "a mask (full, causal[:OFFSET], local:LEFT:RIGHT, chunked:CHUNK, prefix:LEN, joined with & and |), or one per head separated by ;".into()
            }
        }
    }

    fn accepts(self, v: &str) -> bool {
        let positive = |v: &str| v.parse::<usize>().is_ok_and(|n| n > 0);
        let number = |v: &str| v.parse::<f32>().is_ok_and(f32::is_finite);
        match self {
            ParamKind::Positive => positive(v),
            ParamKind::Number => number(v),
            ParamKind::Bool => v == "true" || v == "false",
            ParamKind::FloatDType => v.parse::<DType>().is_ok_and(|d| d.is_float()),
            ParamKind::OptPositive => v == "none" || positive(v),
            ParamKind::OptPositiveNumber => {
                v == "none" || (number(v) && v.parse::<f32>().is_ok_and(|x| x > 0.0))
            }
            ParamKind::Scale => v == "auto" || number(v),
            ParamKind::Choice(c) => c.contains(&v),
            // Parsed where it is read (`attention::mask` depends on this
            // module, not the other way round): an error names the grammar.
            ParamKind::Mask => !v.trim().is_empty(),
        }
    }
}

/// One config parameter.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    /// Its key in `--config key=value`.
    pub name: &'static str,
    /// What values it takes.
    pub kind: ParamKind,
    /// The default value, as text.
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// A [`Param`], one line per table row.
pub const fn param(
    name: &'static str,
    kind: ParamKind,
    default: &'static str,
    help: &'static str,
) -> Param {
    Param {
        name,
        kind,
        default,
        help,
    }
}

/// The element type of a floating-point kernel.
pub const DTYPE: Param = param(
    "dtype",
    ParamKind::FloatDType,
    "f32",
    "element type: f32, bf16 or f16",
);

/// Why a config, a shape or an input was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EntryError {
    /// A `--config` key the kernel does not have.
    #[error("unknown config key `{key}` for kernel `{kernel}`; its keys are: {keys}")]
    UnknownKey {
        /// The kernel.
        kernel: &'static str,
        /// The key given.
        key: String,
        /// The kernel's keys, comma-separated.
        keys: String,
    },
    /// A key given twice.
    #[error("config key `{0}` is given twice")]
    RepeatedKey(String),
    /// A value of the wrong kind.
    #[error("config `{key}={value}` must be {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// Not the kernel's number of inputs.
    #[error("kernel `{kernel}` takes {want} inputs, got {got}")]
    InputCount {
        /// The kernel.
        kernel: &'static str,
        /// Its input count.
        want: usize,
        /// The count given.
        got: usize,
    },
    /// Shapes that do not fit together.
    #[error("{0}")]
    Shape(String),
    /// An input value out of the range the kernel defines.
    #[error("{0}")]
    Input(String),
    /// The kernel did not build or verify.
    #[error("{0}")]
    Kernel(KernelErrors),
}

impl From<KernelErrors> for EntryError {
    fn from(e: KernelErrors) -> Self {
        EntryError::Kernel(e)
    }
}

/// Parsed `--config` values of one kernel (defaults filled in, every
/// value checked against its [`ParamKind`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    values: BTreeMap<&'static str, (ParamKind, String)>,
    /// The parameters set by the caller (the others hold their defaults).
    given: Vec<&'static str>,
}

/// Input names with shapes, in argument order (scalar prefetch first).
pub type Shapes = Vec<(&'static str, Vec<usize>)>;

/// The f64 reference values of each output, flat, row-major.
pub type Outputs = Vec<Vec<f64>>;

/// A kernel's backward for one call, made when the call is recorded from
/// the config and the inputs' shapes: it holds the typed config it needs,
/// so taking gradients parses nothing. It gives the cotangent of each
/// input (call order) from the call's inputs, outputs and output
/// cotangents, recorded with tensor ops and kernel calls on the graph
/// runtime (see [`Entry::call`]).
#[cfg(feature = "graph")]
pub type Backward =
    fn(&Config, &[Vec<usize>]) -> Result<std::sync::Arc<dyn runtime::graph::KernelVjp>, EntryError>;

/// Without the `graph` feature there is no runtime to record a backward
/// on, so no entry has one (`backward` is always `None`).
#[cfg(not(feature = "graph"))]
#[derive(Clone, Copy, Debug)]
pub enum Backward {}

/// `Some(f)` as an entry's `backward` with the `graph` feature, `None`
/// without it (the backward's code is compiled out with the runtime).
macro_rules! backward {
    ($f:expr) => {{
        #[cfg(feature = "graph")]
        let b: Option<$crate::entry::Backward> = Some($f);
        #[cfg(not(feature = "graph"))]
        let b: Option<$crate::entry::Backward> = None;
        b
    }};
}
pub(crate) use backward;

/// The inputs a config and the inputs' shapes determine (a mask's block
/// tables), by argument index, with their values.
pub type FixedInputs = fn(&Config, &[Vec<usize>]) -> Result<Vec<(usize, Array)>, EntryError>;

/// A kernel of the library.
pub struct Entry {
    /// Name, as the command takes it.
    pub name: &'static str,
    /// The inputs that are a function of the config and the shapes, not
    /// data: `tessera export` writes them into the artifact as constants,
    /// so its program takes only the others (a JAX caller never builds a
    /// mask's tables).
    pub fixed_inputs: Option<FixedInputs>,
    /// Its backward, if it has one: `Entry::call` (feature `graph`)
    /// records calls that `runtime::graph::grad` differentiates with it.
    pub backward: Option<Backward>,
    /// One line about it.
    pub about: &'static str,
    /// Its config parameters.
    pub params: &'static [Param],
    /// The inputs with their default shapes for a config.
    pub inputs: fn(&Config) -> Result<Shapes, EntryError>,
    /// Builds and verifies the kernel for a config and input shapes (in
    /// the order of `inputs`; the count is checked before).
    pub build: fn(&Config, &[Vec<usize>]) -> Result<VerifiedKernel, EntryError>,
    /// The f64 reference of each output.
    pub reference: fn(&Config, &[Array]) -> Result<Outputs, EntryError>,
    /// What inputs must satisfy beyond shapes and dtypes (see
    /// [`Entry::check_inputs`]).
    pub check: fn(&Config, &VerifiedKernel, &[Array]) -> Result<(), EntryError>,
    /// The tolerance of each output against the reference.
    pub tolerance: fn(&Config, &VerifiedKernel) -> Vec<Tolerance>,
    /// Random inputs the kernel is defined on, for tests and the demo.
    pub sample: fn(&Config, &VerifiedKernel, u64) -> Vec<Array>,
    /// Its named instances.
    pub presets: &'static [Preset],
}

/// A named kernel instance: config values and input shapes (each given
/// as `--config` and `--shape` would), over the entry's defaults.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// Name, as `tessera lower` takes it.
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
    /// `key=value` overrides of the config.
    pub config: &'static [(&'static str, &'static str)],
    /// Input shapes that differ from the defaults.
    pub shapes: &'static [(&'static str, &'static [usize])],
}

impl Entry {
    /// The inputs (scalar prefetch first) with their default shapes.
    pub fn default_shapes(&self, cfg: &Config) -> Result<Shapes, EntryError> {
        (self.inputs)(cfg)
    }

    /// Builds and verifies the kernel for `cfg` and the inputs' shapes (in
    /// the order of [`Entry::default_shapes`]).
    pub fn build(&self, cfg: &Config, shapes: &[Vec<usize>]) -> Result<VerifiedKernel, EntryError> {
        let want = self.default_shapes(cfg)?.len();
        if shapes.len() != want {
            return Err(EntryError::InputCount {
                kernel: self.name,
                want,
                got: shapes.len(),
            });
        }
        (self.build)(cfg, shapes)
    }

    /// The kernel for `cfg` at the default input shapes.
    pub fn build_at_default_shapes(&self, cfg: &Config) -> Result<VerifiedKernel, EntryError> {
        let shapes: Vec<Vec<usize>> = self
            .default_shapes(cfg)?
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        self.build(cfg, &shapes)
    }

    /// The kernel for `cfg` with some inputs' shapes overridden by name;
    /// an unknown name is an error listing the inputs. Fixed inputs not
    /// named take the shapes the config and the other shapes give them
    /// (a mask's tables follow the sequence lengths).
    ///
    /// ```
    /// let e = kernels::find("masked_attention").unwrap();
    /// let blocks = [("block_q".to_string(), "128".to_string()), ("block_k".into(), "128".into())];
    /// let cfg = kernels::Config::parse(e, &blocks).unwrap();
    /// let q = [1usize, 2, 512, 64];
    /// let k = e
    ///     .build_with_shapes(&cfg, &[("q", &q[..]), ("k", &q[..]), ("v", &q[..]),
    ///         ("q_seg", &[1, 512, 1][..]), ("kv_seg", &[1, 1, 512][..])])
    ///     .unwrap();
    /// // Blocks of 128: the tables are [heads, 4, 4].
    /// assert_eq!(k.arguments().next().unwrap().shape, &[2, 4, 4]);
    /// ```
    pub fn build_with_shapes<N: AsRef<str>, S: AsRef<[usize]>>(
        &self,
        cfg: &Config,
        overrides: &[(N, S)],
    ) -> Result<VerifiedKernel, EntryError> {
        let mut shapes = self.default_shapes(cfg)?;
        for (k, v) in overrides {
            let (k, v) = (k.as_ref(), v.as_ref());
            let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
            let slot = shapes.iter_mut().find(|(n, _)| *n == k).ok_or_else(|| {
                EntryError::Shape(format!(
                    "kernel `{}` has no input `{k}`; its inputs are: {}",
                    self.name,
                    names.join(", ")
                ))
            })?;
            slot.1 = v.to_vec();
        }
        let given = |i: usize| overrides.iter().any(|(k, _)| k.as_ref() == shapes[i].0);
        let mut follow = Vec::new();
        if let Some(fixed) = self.fixed_inputs {
            let plain: Vec<Vec<usize>> = shapes.iter().map(|(_, s)| s.clone()).collect();
            for (i, a) in fixed(cfg, &plain)? {
                if i < shapes.len() && !given(i) {
                    follow.push((i, a.shape().to_vec()));
                }
            }
        }
        for (i, s) in follow {
            shapes[i].1 = s;
        }
        let shapes: Vec<Vec<usize>> = shapes.into_iter().map(|(_, s)| s).collect();
        self.build(cfg, &shapes)
    }

    /// What the inputs must satisfy beyond their shapes and types, checked
    /// before anything runs, so every back end (and the reference) gets
    /// the same answer for out-of-range values: an error naming the value
    /// (a valid kv length in `0..=skv`, paged-decode lengths and block
    /// tables in range, attention scores that stay in f32 range).
    pub fn check_inputs(
        &self,
        cfg: &Config,
        kernel: &VerifiedKernel,
        inputs: &[Array],
    ) -> Result<(), EntryError> {
        (self.check)(cfg, kernel, inputs)
    }

    /// The f64 reference of each output for these inputs.
    pub fn reference(&self, cfg: &Config, inputs: &[Array]) -> Result<Outputs, EntryError> {
        (self.reference)(cfg, inputs)
    }

    /// The tolerance of each output.
    pub fn tolerances(&self, cfg: &Config, kernel: &VerifiedKernel) -> Vec<Tolerance> {
        (self.tolerance)(cfg, kernel)
    }

    /// Random inputs (seeded) that the kernel is defined on.
    pub fn sample_inputs(&self, cfg: &Config, kernel: &VerifiedKernel, seed: u64) -> Vec<Array> {
        (self.sample)(cfg, kernel, seed)
    }
}

impl Config {
    /// Defaults of `entry` overridden by `pairs`; an unknown key, a
    /// repeated one or a value of the wrong kind is an error naming it.
    pub fn parse(entry: &Entry, pairs: &[(String, String)]) -> Result<Config, EntryError> {
        let mut values: BTreeMap<&'static str, (ParamKind, String)> = entry
            .params
            .iter()
            .map(|p| (p.name, (p.kind, p.default.to_string())))
            .collect();
        let mut seen = Vec::new();
        for (k, v) in pairs {
            let Some(p) = entry.params.iter().find(|p| p.name == k) else {
                let keys: Vec<&str> = entry.params.iter().map(|p| p.name).collect();
                return Err(EntryError::UnknownKey {
                    kernel: entry.name,
                    key: k.clone(),
                    keys: keys.join(", "),
                });
            };
            if seen.contains(&p.name) {
                return Err(EntryError::RepeatedKey(k.clone()));
            }
            seen.push(p.name);
            if !p.kind.accepts(v) {
                return Err(EntryError::BadValue {
                    key: p.name,
                    value: v.clone(),
                    expected: p.kind.describe(),
                });
            }
            values.insert(p.name, (p.kind, v.clone()));
        }
        Ok(Config {
            values,
            given: seen,
        })
    }

    /// The config of a preset of `entry`.
    pub fn of_preset(entry: &Entry, p: &Preset) -> Result<Config, EntryError> {
        let pairs: Vec<(String, String)> = p
            .config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(entry, &pairs)
    }

    fn get(&self, k: &'static str, kind: ParamKind) -> Result<&str, EntryError> {
        match self.values.get(k) {
            Some((kd, v)) if *kd == kind => Ok(v),
            // A kernel reading a key it does not declare (or as another
            // kind) is a library bug; say which.
            _ => Err(EntryError::BadValue {
                key: k,
                value: String::new(),
                expected: format!("a declared parameter of kind {}", kind.describe()),
            }),
        }
    }

    /// Every parameter with its value (defaults filled in), by name.
    pub fn values(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values.iter().map(|(k, (_, v))| (*k, v.as_str()))
    }

    /// Whether the kernel has parameter `k`.
    pub fn is_declared(&self, k: &str) -> bool {
        self.values.contains_key(k)
    }

    /// Whether the caller set parameter `k` (else it holds its default,
    /// which a kernel may fit to the platform it is built for).
    pub fn is_given(&self, k: &str) -> bool {
        self.given.contains(&k)
    }

    /// A [`ParamKind::Positive`] value.
    pub fn usize(&self, k: &'static str) -> Result<usize, EntryError> {
        Ok(self.get(k, ParamKind::Positive)?.parse().unwrap_or(1))
    }

    /// A [`ParamKind::Number`] value.
    pub fn f32(&self, k: &'static str) -> Result<f32, EntryError> {
        Ok(self.get(k, ParamKind::Number)?.parse().unwrap_or(0.0))
    }

    /// A [`ParamKind::Bool`] value.
    pub fn bool(&self, k: &'static str) -> Result<bool, EntryError> {
        Ok(self.get(k, ParamKind::Bool)? == "true")
    }

    /// A [`ParamKind::FloatDType`] value.
    pub fn dtype(&self, k: &'static str) -> Result<DType, EntryError> {
        Ok(self
            .get(k, ParamKind::FloatDType)?
            .parse()
            .unwrap_or(DType::F32))
    }

    /// A [`ParamKind::OptPositive`] value.
    pub fn opt_usize(&self, k: &'static str) -> Result<Option<usize>, EntryError> {
        Ok(self.get(k, ParamKind::OptPositive)?.parse().ok())
    }

    /// A [`ParamKind::OptPositiveNumber`] value.
    pub fn opt_f32(&self, k: &'static str) -> Result<Option<f32>, EntryError> {
        Ok(self.get(k, ParamKind::OptPositiveNumber)?.parse().ok())
    }

    /// A [`ParamKind::Scale`] value for head dim `d`.
    pub fn scale(&self, k: &'static str, d: usize) -> Result<f32, EntryError> {
        let v = self.get(k, ParamKind::Scale)?;
        Ok(v.parse().unwrap_or_else(|_| 1.0 / (d.max(1) as f32).sqrt()))
    }

    /// A [`ParamKind::Mask`] value, as text (parse it with
    /// `attention::mask::MultiHeadMask::parse`).
    pub fn mask_text(&self, k: &'static str) -> Result<&str, EntryError> {
        self.get(k, ParamKind::Mask)
    }

    /// A [`ParamKind::Choice`] value.
    pub fn choice(&self, k: &'static str) -> Result<&str, EntryError> {
        match self.values.get(k) {
            Some((ParamKind::Choice(_), v)) => Ok(v),
            _ => Err(EntryError::BadValue {
                key: k,
                value: String::new(),
                expected: "a declared choice parameter".into(),
            }),
        }
    }
}

/// `s` as `[usize; N]`, or an error naming the input.
pub fn dims<const N: usize>(s: &[usize], what: &str) -> Result<[usize; N], EntryError> {
    s.try_into()
        .map_err(|_| EntryError::Shape(format!("`{what}` must have rank {N}, got shape {s:?}")))
}

/// `(m, n, k)` of `x: [m, k]` times `rhs: [k, n]` (the rhs input is
/// called `rhs`).
pub fn matmul_shapes(s: &[Vec<usize>], rhs: &str) -> Result<(usize, usize, usize), EntryError> {
    let [m, k] = dims(&s[0], "x")?;
    let [k2, n] = dims(&s[1], rhs)?;
    if k != k2 {
        return Err(EntryError::Shape(format!(
            "x is [{m}, {k}] but {rhs} is [{k2}, {n}]: the inner dims differ"
        )));
    }
    Ok((m, n, k))
}

/// The slices of `s`, for `Dims::from_shapes`.
pub fn refs(s: &[Vec<usize>]) -> Vec<&[usize]> {
    s.iter().map(Vec::as_slice).collect()
}

/// Inputs need no check beyond shapes and dtypes.
pub fn no_check(_: &Config, _: &VerifiedKernel, _: &[Array]) -> Result<(), EntryError> {
    Ok(())
}

/// Each output within [`Tolerance::for_dtype`] of its dtype.
pub fn dtype_tolerance(_: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    k.outputs().map(|o| Tolerance::for_dtype(o.dtype)).collect()
}

/// A product over the last dim of input `x` (`[m, k]`; the first input
/// if none is called `x`), accumulated in f32: [`Tolerance::matmul`] per
/// output.
pub fn matmul_tolerance(_: &Config, k: &VerifiedKernel) -> Vec<Tolerance> {
    let depth = k
        .arguments()
        .find(|a| a.name == "x")
        .or_else(|| k.arguments().next())
        .and_then(|x| x.shape.last().copied())
        .unwrap_or(1);
    k.outputs()
        .map(|o| Tolerance::matmul(depth, o.dtype))
        .collect()
}

/// Each argument uniform in −1..1 (scalar prefetch: zeros), in its dtype.
pub fn uniform_inputs(_: &Config, k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    random_inputs(k, seed)
}

/// Each float argument of `k` uniform in −1..1 (argument `i` seeded with
/// `seed + i`), every other argument zeros: [`uniform_inputs`] for a
/// kernel without an entry (a `.kir` file).
pub fn random_inputs(k: &VerifiedKernel, seed: u64) -> Vec<Array> {
    k.arguments()
        .enumerate()
        .map(|(i, a)| {
            if a.dtype.is_float() {
                Array::random(a.dtype, a.shape.to_vec(), seed + i as u64, -1.0, 1.0)
            } else {
                Array::zeros(a.dtype, a.shape.to_vec())
            }
        })
        .collect()
}

/// An input of `k` by name in `inputs` (argument order).
pub fn arg<'a>(k: &VerifiedKernel, inputs: &'a [Array], name: &str) -> Option<&'a Array> {
    k.arguments()
        .position(|a| a.name == name)
        .and_then(|i| inputs.get(i))
}

/// The first element of `a` outside `lo..=hi`, as an error naming it.
pub fn in_range(
    a: Option<&Array>,
    name: &str,
    lo: f64,
    hi: f64,
    what: &str,
) -> Result<(), EntryError> {
    if let Some(a) = a
        && let Some((i, v)) = a
            .data()
            .iter()
            .enumerate()
            .find(|(_, v)| !(lo..=hi).contains(*v))
    {
        return Err(EntryError::Input(format!(
            "input `{name}` has {v} at flat index {i}, outside {lo}..={hi} ({what})"
        )));
    }
    Ok(())
}
