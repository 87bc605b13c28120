//! A kernel's config parameters and their parsed values: [`ParamKind`],
//! [`Param`], [`Config`] (defaults filled in, every value checked against
//! its kind) and [`EntryError`], the refusals of configs, shapes and inputs.

use std::collections::BTreeMap;

use kernel_ir::{DType, KernelErrors};

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

/// The `out_dtype` parameter of the matmuls that write f32 unless told:
/// their output's element type.
pub const OUT_DTYPE: Param = param(
    "out_dtype",
    ParamKind::FloatDType,
    "f32",
    "output element type",
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

impl Config {
    /// Defaults of `params` (kernel `kernel`'s) overridden by `pairs`;
    /// an unknown key, a repeated one or a value of the wrong kind is an
    /// error naming it.
    pub(crate) fn from_params(
        kernel: &'static str,
        params: &[Param],
        pairs: &[(String, String)],
    ) -> Result<Config, EntryError> {
        let mut values: BTreeMap<&'static str, (ParamKind, String)> = params
            .iter()
            .map(|p| (p.name, (p.kind, p.default.to_string())))
            .collect();
        let mut seen = Vec::new();
        for (k, v) in pairs {
            let Some(p) = params.iter().find(|p| p.name == k) else {
                let keys: Vec<&str> = params.iter().map(|p| p.name).collect();
                return Err(EntryError::UnknownKey {
                    kernel,
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
