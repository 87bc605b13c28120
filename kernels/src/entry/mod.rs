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

mod config;
mod fields;

use kernel_ir::{Array, VerifiedKernel};

pub use config::{Config, DTYPE, EntryError, OUT_DTYPE, Param, ParamKind, param};
pub use fields::{
    arg, dims, dtype_tolerance, in_range, matmul_shapes, matmul_tolerance, no_check, random_inputs,
    refs, uniform_inputs,
};

use crate::tolerance::Tolerance;

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
    fn(&Config, &[Vec<usize>]) -> Result<std::sync::Arc<dyn graph::KernelVjp>, EntryError>;

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
    /// records calls that `graph::grad` differentiates with it.
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
        Config::from_params(entry.name, entry.params, pairs)
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
}
