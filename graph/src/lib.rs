//! The deferred graph runtime: lazy tensors over a PJRT plugin.
//!
//! Ops on a [`Tensor`] record a node (checked for shapes and dtypes at the
//! call, so errors name the user's line) and return at once. A sync point
//! ([`Tensor::to_host`], [`Tensor::item`], [`Runtime::sync`]) materializes
//! the pending subgraph (one materialization at a time per runtime): it
//! finds the executable of its structure, or lowers it to one
//! StableHLO module, gets the executable from the compile cache (memory,
//! disk, remote) or compiles it, runs it and stores the results in the
//! nodes in place, so every handle sees them. Tessera kernels are nodes
//! like any other ([`Runtime::call`]): on the CPU plugin they run natively
//! through the FFI handler, on TPU as `tpu_custom_call`, elsewhere as
//! decomposed StableHLO.
//!
//! ```no_run
//! # fn main() -> Result<(), graph::RuntimeError> {
//! use kernel_ir::{Array, DType};
//! use graph::{Runtime, RuntimeOptions};
//!
//! let rt = Runtime::new(RuntimeOptions::default())?; // the CPU plugin
//! let x = rt.tensor(&Array::random(DType::F32, [4, 8], 1, -1.0, 1.0))?;
//! let w = rt.tensor(&Array::random(DType::F32, [8, 2], 2, -1.0, 1.0))?;
//! let y = x.matmul(&w)?.tanh()?.softmax(1)?; // recorded, not run
//! let host = y.to_host()?;                   // compiled, cached, run
//! # Ok(()) }
//! ```
//!
//! # Invariants
//!
//! * **A node is deferred, ready or failed**, and handles share it
//!   (`Arc<Node>`): materializing replaces its state in place, dropping its
//!   inputs, so a synced graph frees its history. Dropping a long unsynced
//!   chain is iterative (no stack overflow).
//! * **Recording checks everything** (shapes, dtypes, axes, bucket
//!   compatibility) and errors carry the caller's `file:line:col`
//!   (`#[track_caller]`); nothing runs until a sync. `RuntimeOptions::eager`
//!   syncs after every op (the op-by-op baseline).
//! * **A sync materializes on the syncing thread**, holding the runtime's
//!   materialization lock (a hand-off to a worker thread cost more than the
//!   runtime's whole own share of a small program's dispatch, ~20 µs
//!   measured in `cargo bench -p tessera-graph` from the trace): the requested nodes, every pending collective
//!   (collectives are never pruned), and every deferred node of the same
//!   subgraph that a handle still points at (detected from `Arc` counts), so
//!   nothing is computed twice; dead nodes are never computed. Failures (an
//!   ancestor's stored error, lowering, compile, execution) are stored in all
//!   of those nodes as `RuntimeError::Failed { what, cause, recorded_at }`:
//!   the cause stays typed (`Cause::Pjrt`, `Lowering`, `Kernel`, `Plugin`, `Cache`),
//!   and `recorded_at` is set once, by the first node that stores it.
//! * **The module text is the canonical form**: nodes are numbered in a
//!   deterministic topological order, materialized inputs and constants other
//!   than 0/±1 are parameters, kernels are private functions (`func.call`,
//!   inlined by XLA) built into the program per platform by
//!   `lowering::program` (cpu: the FFI host call; tpu: `tpu_custom_call`;
//!   cuda/rocm: the Triton call, its TTIR made once per kernel; else
//!   decomposed; `RuntimeOptions::kernels = KernelLowering::Decomposed`
//!   forces the portable form everywhere), never printed and parsed again.
//!   The cache key is the SHA-256 of that text, the compile options, the
//!   plugin's platform, platform version and C API version, and Tessera's
//!   version. A structure seen before runs its executable without lowering.
//! * **Buckets** pad a dynamic dim to the next of ≤ 8 sizes; the valid length
//!   is an `i32[1]` parameter: reductions, means, softmax and contractions over
//!   the padded dim mask it; kernels receive it as a scalar-prefetch operand
//!   (`Tensor::valid_length`). Reshapes may not mix a padded dim into others;
//!   slices and concatenations along it are refused; `to_host` crops to valid
//!   lengths.
//! * **Reverse mode is more graph.** A tensor marked `requires_grad` is a
//!   leaf; a node recorded from a tracked input keeps `Tape::Op { op,
//!   inputs }` (kept after materialization, unlike `State`), untracked nodes
//!   keep nothing, so inference and optimizer updates still free their
//!   history. `vjp` walks the tape in reverse topological order (a unit is
//!   one node or every output of one kernel call, processed after all its
//!   users; ready units in creation order, so the recorded backward, and the
//!   module text, is deterministic) and records each rule with tracking off
//!   (no gradients of gradients). A kernel call differentiates only through
//!   the `KernelVjp` it was recorded with; without one, `grad` fails naming
//!   the kernel. A kernel output's tape holds the call's later outputs, so
//!   values a backward reads (flash attention's lse) live as long as the
//!   first output, without a reference cycle (the call holds its outputs
//!   weakly). Reductions and softmax give padding zero cotangent, so valid
//!   gradients do not depend on it. The materializer counts tape references
//!   as internal, so tracked intermediates are not made outputs.
//! * **Tracing costs one atomic load when off.** Every span point
//!   (`record`, `sync`, `materialize`, `lower`, `cache lookup` with its tier,
//!   `compile`, `kernel jit`, `h2d`, `d2h`, `execute`, `bucket`, `collective`,
//!   `subgraph`) asks `Tracer::span`, which returns `None` unless tracing is
//!   on. Spans are guards, so on one thread they nest by construction; a
//!   trace keeps at most `MAX_SPANS` (then counts the dropped). The summary
//!   is computed from the spans alone and must equal `Stats` over the same
//!   run (`tests/it/graph_runtime/trace.rs`).
//! * **A seen structure skips lowering.** `plan::shape_of` fingerprints
//!   everything the module text depends on (per node: op and attributes,
//!   shape, dtype, padding, input positions; leaves by shape and dtype; a
//!   structural constant by value, any other as a parameter; a kernel by
//!   its printed-IR key and call identity; devices and platform); on a hit
//!   the leaves and scalars are bound to the cached executable in the order
//!   `lower` gave the parameters, so equal fingerprints run equal modules.
//!   The memo holds at most 4096 structures (then it is cleared).
//! * **An optimizer step has one structure**: state tensors are uploaded
//!   zeros at the start and per-step scalars (learning rate, bias
//!   corrections) uploaded rank-0 tensors, so step 1's module is step n's and
//!   the compile cache hits from step 2 on.
//! * **Disk entries are written under the key's lock**: a process that finds
//!   no valid entry compiles while holding it, so concurrent processes compile
//!   each program once; a truncated or corrupt entry (bad header, length or
//!   checksum, or one the plugin cannot load) is removed and recompiled and
//!   counted in `Stats::corrupt_entries`.

mod autodiff;
mod bucket;
mod error;
mod exec;
mod lower;
mod node;
mod optim;
mod plan;
mod steps;
mod tensor;
mod trace;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kernel_ir::{Array, DType, VerifiedKernel};
use lowering::program::CallForm;

pub use autodiff::{KernelVjp, VjpCall, grad, no_grad, vjp, with_grad};
use error::setup;
pub use error::{Cause, RuntimeError};

/// How [`Runtime::export_as`] lowers the kernel calls of a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelForm {
    /// As this runtime runs them (on CPU, host custom calls registered in
    /// this process: the program runs here only).
    Platform,
    /// Decomposed StableHLO: plain XLA, runs on any PJRT CPU client.
    Decomposed,
    /// `stablehlo.custom_call @tpu_custom_call` with the Mosaic body: the
    /// TPU branch of an artifact.
    TpuCustomCall,
    /// XLA's GPU custom call of the kernel's Triton program, its TTIR made
    /// for this target (`runtime::triton::custom_call_module`): the `cuda`
    /// and `rocm` branches of an artifact.
    TritonCustomCall(kernel_ir::GpuTarget),
}
pub use bucket::Buckets;
pub use optim::{AdamW, Sgd};
pub use steps::{STEPS_FORMAT, STEPS_VERSION, kernel_steps};
pub use tensor::Tensor;
pub use trace::{MAX_SPANS, Span, Trace, TraceSummary};

use node::{Node, State};
use runtime::cache::{CompileCache, DiskCache, RemoteCache};
use runtime::pjrt::{Client, Plugin};

/// How a [`Runtime`] is set up.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// The PJRT plugin; `None` is the CPU plugin the set-up installed (or
    /// `$TESSERA_PJRT_PLUGIN`). Changing this one line targets another back
    /// end.
    pub plugin: Option<PathBuf>,
    /// Devices (replicas); collectives run across them.
    pub devices: usize,
    /// Use the on-disk compile cache.
    pub disk_cache: bool,
    /// Its directory; `None` is `<tessera cache>/compile`.
    pub cache_dir: Option<PathBuf>,
    /// A remote cache tier (off by default).
    pub remote: Option<Arc<dyn RemoteCache>>,
    /// A length past the last bucket compiles for its exact size instead of
    /// being an error.
    pub recompile_past_last_bucket: bool,
    /// Run every op as soon as it is recorded (op by op, for comparison).
    pub eager: bool,
    /// How kernel calls are lowered inside graph modules.
    pub kernels: KernelLowering,
}

/// How a graph module embeds a Tessera kernel call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelLowering {
    /// By platform: on the CPU plugin the native kernel through the FFI
    /// handler, on TPU `tpu_custom_call`, elsewhere decomposed StableHLO.
    #[default]
    Auto,
    /// Decomposed StableHLO on every platform (portable, slower).
    Decomposed,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            plugin: None,
            devices: 1,
            disk_cache: true,
            cache_dir: None,
            remote: None,
            recompile_past_last_bucket: false,
            eager: false,
            kernels: KernelLowering::Auto,
        }
    }
}

impl std::fmt::Debug for RuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeOptions")
            .field("plugin", &self.plugin)
            .field("devices", &self.devices)
            .field("disk_cache", &self.disk_cache)
            .field("cache_dir", &self.cache_dir)
            .field("remote", &self.remote.is_some())
            .field(
                "recompile_past_last_bucket",
                &self.recompile_past_last_bucket,
            )
            .field("eager", &self.eager)
            .field("kernels", &self.kernels)
            .finish()
    }
}

/// What the runtime has done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Programs compiled by the plugin.
    pub compiles: u64,
    /// Executables found in this process.
    pub hits_memory: u64,
    /// Executables loaded from the disk cache.
    pub hits_disk: u64,
    /// Executables loaded from the remote cache.
    pub hits_remote: u64,
    /// Time spent compiling.
    pub compile_time: Duration,
    /// Cache entries found corrupt or truncated, dropped and recompiled.
    pub corrupt_entries: u64,
    /// Inputs per bucket size.
    pub buckets: BTreeMap<usize, u64>,
    /// Bytes of padding added to reach bucket sizes.
    pub padding_bytes: u64,
    /// Layout changes implied by kernels' layout hints, per execution.
    pub transposes: u64,
    /// Bytes those layout changes move.
    pub transpose_bytes: u64,
    /// Programs executed (materializations).
    pub materializations: u64,
    /// Nodes materialized.
    pub nodes_materialized: u64,
    /// Bytes copied host → device.
    pub bytes_to_device: u64,
    /// Bytes copied device → host.
    pub bytes_to_host: u64,
}

impl Stats {
    /// Executables that did not need a compile, over all look-ups.
    pub fn hit_rate(&self) -> f64 {
        let hits = self.hits_memory + self.hits_disk + self.hits_remote;
        let all = hits + self.compiles;
        if all == 0 {
            0.0
        } else {
            hits as f64 / all as f64
        }
    }
}

pub(crate) struct Inner {
    pub client: Client,
    pub devices: usize,
    pub cache: CompileCache,
    pub stats: Mutex<Stats>,
    /// The TTIR of kernels called on a GPU platform, by kernel key (one
    /// Triton child per kernel, not per program).
    pub kernel_ttir: Mutex<HashMap<String, String>>,
    /// Recorded collectives not yet run: never pruned.
    pub pending_collectives: Mutex<Vec<Arc<Node>>>,
    /// Executables by subgraph structure: the dispatch fast path.
    pub plans: Mutex<HashMap<[u8; 32], Arc<plan::Plan>>>,
    /// Spans, while tracing.
    pub tracer: trace::Tracer,
    /// Held while materializing: one materialization at a time, on the
    /// syncing thread (a hand-off to a worker thread cost more than a
    /// small program's execution).
    materializing: Mutex<()>,
    next_id: AtomicU64,
    pub options: RuntimeOptions,
}

impl Inner {
    pub fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// A lazy-tensor runtime over one PJRT plugin. Cheap to clone; clones
/// share everything.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("platform", &self.inner.client.platform())
            .field("devices", &self.inner.devices)
            .finish()
    }
}

impl Runtime {
    /// A runtime with `options`.
    pub fn new(options: RuntimeOptions) -> Result<Runtime, RuntimeError> {
        let plugin = match &options.plugin {
            Some(p) => Plugin::load(p),
            None => Plugin::default_plugin(),
        }
        .map_err(setup("loading the PJRT plugin"))?;
        let devices = options.devices.max(1);
        let client =
            Client::with_devices(plugin.clone(), devices).map_err(setup("creating the client"))?;
        if client.devices().len() < devices {
            return Err(RuntimeError::Setup {
                what: "choosing devices",
                cause: Box::new(Cause::Other(format!(
                    "the plugin has {} devices, {devices} were asked for",
                    client.devices().len()
                ))),
            });
        }
        if client.platform() == "cpu" {
            runtime::host_call::install_handler(&plugin)
                .map_err(setup("installing the host-kernel handler"))?;
        }
        let disk = if options.disk_cache {
            let dir = options
                .cache_dir
                .clone()
                .unwrap_or_else(|| runtime::plugin::cache_dir().join("compile"));
            Some(DiskCache::open(&dir).map_err(setup("opening the disk cache"))?)
        } else {
            None
        };
        Ok(Runtime {
            inner: Arc::new(Inner {
                client,
                devices,
                cache: CompileCache::new(disk, options.remote.clone()),
                stats: Mutex::new(Stats::default()),
                kernel_ttir: Mutex::new(HashMap::new()),
                pending_collectives: Mutex::new(Vec::new()),
                plans: Mutex::new(HashMap::new()),
                tracer: trace::Tracer::new(),
                materializing: Mutex::new(()),
                next_id: AtomicU64::new(0),
                options,
            }),
        })
    }

    /// The CPU plugin with one device and the default caches.
    pub fn cpu() -> Result<Runtime, RuntimeError> {
        Runtime::new(RuntimeOptions::default())
    }

    /// The plugin's platform name (`cpu`, `tpu`, ...).
    pub fn platform(&self) -> &str {
        self.inner.client.platform()
    }

    /// Devices the runtime runs on.
    pub fn devices(&self) -> usize {
        self.inner.devices
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.inner.stats().clone()
    }

    /// Starts recording spans of the runtime's work (see [`Trace`]),
    /// discarding any recorded before.
    pub fn start_tracing(&self) {
        self.inner.tracer.start();
    }

    /// Stops recording and returns the spans since
    /// [`Runtime::start_tracing`].
    pub fn stop_tracing(&self) -> Trace {
        self.inner.tracer.stop()
    }

    /// Uploads `array` to every device (a materialized tensor).
    #[track_caller]
    pub fn tensor(&self, array: &Array) -> Result<Tensor, RuntimeError> {
        let per_device = vec![array.clone(); self.inner.devices];
        self.tensor_per_device(&per_device)
    }

    /// Uploads one array per device (same shape and dtype), for
    /// collectives.
    #[track_caller]
    pub fn tensor_per_device(&self, arrays: &[Array]) -> Result<Tensor, RuntimeError> {
        let loc = std::panic::Location::caller().to_string();
        let first = arrays.first().ok_or_else(|| RuntimeError::Record {
            message: "no arrays given".into(),
            loc: loc.clone(),
        })?;
        if arrays.len() != self.inner.devices
            || arrays
                .iter()
                .any(|a| a.shape() != first.shape() || a.dtype() != first.dtype())
        {
            return Err(RuntimeError::Record {
                message: format!(
                    "give one array per device ({}), all of one shape and dtype",
                    self.inner.devices
                ),
                loc,
            });
        }
        let node = self.upload(arrays, loc, vec![None; first.shape().len()])?;
        Ok(Tensor::from_node(self.clone(), node))
    }

    /// Uploads `arrays` (one per device) as a ready node.
    pub(crate) fn upload(
        &self,
        arrays: &[Array],
        loc: String,
        dims: Vec<node::Dyn>,
    ) -> Result<Arc<Node>, RuntimeError> {
        let mut span = self.inner.tracer.span("h2d");
        let mut bufs = Vec::with_capacity(arrays.len());
        let mut bytes = 0;
        for (d, a) in arrays.iter().enumerate() {
            bufs.push(
                self.inner
                    .client
                    .upload(a, d)
                    .map_err(|e| RuntimeError::failed("uploading an array", e))?,
            );
            bytes += (a.len() * a.dtype().bytes()) as u64;
        }
        self.inner.stats().bytes_to_device += bytes;
        if let Some(s) = span.as_mut() {
            s.arg("bytes", bytes);
        }
        drop(span);
        Ok(Arc::new(Node {
            id: self.inner.next_id(),
            shape: arrays[0].shape().to_vec(),
            dtype: arrays[0].dtype(),
            dims,
            loc,
            state: Mutex::new(State::Ready(Arc::new(bufs))),
            tape: node::Tape::Off,
        }))
    }

    /// A scalar constant (rank 0). Constants other than 0 and ±1 are passed
    /// to the program at run time, so a value that changes per call does
    /// not recompile.
    #[track_caller]
    pub fn scalar(&self, value: f64, dtype: DType) -> Tensor {
        let node = Arc::new(Node {
            id: self.inner.next_id(),
            shape: Vec::new(),
            dtype,
            dims: Vec::new(),
            loc: std::panic::Location::caller().to_string(),
            state: Mutex::new(State::Deferred {
                op: node::Op::Constant(dtype.round(value)),
                inputs: Vec::new(),
            }),
            tape: node::Tape::Off,
        });
        Tensor::from_node(self.clone(), node)
    }

    /// Indices `0..shape[dim]` along `dim`, repeated over the other dims
    /// (`stablehlo.iota`): positions for masks built in the graph.
    #[track_caller]
    pub fn iota(&self, shape: &[usize], dim: usize, dtype: DType) -> Result<Tensor, RuntimeError> {
        let loc = std::panic::Location::caller().to_string();
        if dim >= shape.len() {
            return Err(RuntimeError::Record {
                message: format!(
                    "iota along dim {dim} of a rank-{} shape {shape:?}; give a dim below {}",
                    shape.len(),
                    shape.len()
                ),
                loc,
            });
        }
        let node = Arc::new(Node {
            id: self.inner.next_id(),
            shape: shape.to_vec(),
            dtype,
            dims: vec![None; shape.len()],
            loc,
            state: Mutex::new(State::Deferred {
                op: node::Op::Iota(dim),
                inputs: Vec::new(),
            }),
            tape: node::Tape::Off,
        });
        Ok(Tensor::from_node(self.clone(), node))
    }

    /// `array` as a constant of the program: unlike [`Runtime::tensor`]'s
    /// buffers it is written into the program text, so a program that
    /// reads it exports without it as an input (a kernel backward's host
    /// tables, say). Keep it small: the program's text, its cache key and
    /// every export carry it. Programs that read it never store it as a
    /// buffer; reading it back itself ([`Tensor::to_host`]) does, and from
    /// then on it is an input like any uploaded tensor.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use kernel_ir::{Array, DType};
    /// let rt = graph::Runtime::cpu()?;
    /// let t = rt.constant(&Array::new(DType::I32, [2], vec![3.0, 1.0])?)?;
    /// assert_eq!(t.add(&t)?.to_host()?.data(), &[6.0, 2.0]);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn constant(&self, array: &Array) -> Result<Tensor, RuntimeError> {
        let node = Arc::new(Node {
            id: self.inner.next_id(),
            shape: array.shape().to_vec(),
            dtype: array.dtype(),
            dims: vec![None; array.shape().len()],
            loc: std::panic::Location::caller().to_string(),
            state: Mutex::new(State::Deferred {
                op: node::Op::Literal(Arc::new(array.clone())),
                inputs: Vec::new(),
            }),
            tape: node::Tape::Off,
        });
        Ok(Tensor::from_node(self.clone(), node))
    }

    /// Uploads `array` padded along `dim` to the smallest bucket that holds
    /// it; the tensor remembers the valid length, which graph ops use as a
    /// mask and kernels get through [`Tensor::valid_length`]. A new length
    /// in a known bucket therefore never recompiles.
    #[track_caller]
    pub fn dynamic(
        &self,
        array: &Array,
        dim: usize,
        buckets: &Buckets,
    ) -> Result<Tensor, RuntimeError> {
        bucket::upload_dynamic(
            self,
            array,
            dim,
            buckets,
            std::panic::Location::caller().to_string(),
        )
    }

    /// Records a call of a Tessera kernel: `args` as
    /// [`kernel_ir::interpret`] takes them (scalar prefetch, then inputs);
    /// returns its outputs.
    #[track_caller]
    pub fn call(
        &self,
        kernel: &VerifiedKernel,
        args: &[&Tensor],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        tensor::call(
            self,
            kernel,
            args,
            None,
            std::panic::Location::caller().to_string(),
        )
    }

    /// Records a call of a kernel that declares its backward: as
    /// [`Runtime::call`], and [`grad`] differentiates through it with
    /// `vjp` (a kernel recorded with plain `call` is an error there, naming
    /// the kernel). The library's entries pass their own backward this
    /// way (`kernels::Entry::call`).
    #[track_caller]
    pub fn call_with_vjp(
        &self,
        kernel: &VerifiedKernel,
        args: &[&Tensor],
        vjp: Arc<dyn KernelVjp>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        tensor::call(
            self,
            kernel,
            args,
            Some(vjp),
            std::panic::Location::caller().to_string(),
        )
    }

    /// Materializes `tensors` (and anything else that must run: pending
    /// collectives, live intermediates of the same subgraph); returns the
    /// first failure among them.
    pub fn sync(&self, tensors: &[&Tensor]) -> Result<(), RuntimeError> {
        let nodes: Vec<Arc<Node>> = tensors.iter().map(|t| t.node.clone()).collect();
        self.sync_nodes(&nodes)?;
        for n in &nodes {
            if let Some(Err(e)) = n.ready() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// The StableHLO module that computes `outputs` from `inputs` (its
    /// parameters, in this order; materialized first, then read, not
    /// computed): the program the runtime would compile, with every
    /// constant inline, to run on any PJRT client. Kernel calls are
    /// lowered for this runtime's platform. An error names a tensor the
    /// outputs read that is not among `inputs`.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use graph::Runtime;
    /// let rt = Runtime::cpu()?;
    /// let x = rt.tensor(&kernel_ir::Array::zeros(kernel_ir::DType::F32, [4, 8]))?;
    /// let y = x.exp()?.scale(0.5)?;
    /// let text = rt.export(&[&x], &[&y])?;
    /// assert!(text.contains("stablehlo.exponential"));
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn export(&self, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<String, RuntimeError> {
        self.export_as(inputs, outputs, KernelForm::Platform)
    }

    /// [`Runtime::export`] with kernel calls lowered as `form` says: a
    /// program for another platform than this runtime's (an exported
    /// artifact's CPU and TPU branches), with nothing registered in this
    /// process.
    #[track_caller]
    pub fn export_as(
        &self,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        form: KernelForm,
    ) -> Result<String, RuntimeError> {
        let loc = std::panic::Location::caller().to_string();
        // Materialized inputs are parameters; the walk stops at them.
        self.sync(inputs)?;
        let ins: Vec<Arc<Node>> = inputs.iter().map(|t| t.node.clone()).collect();
        let outs: Vec<Arc<Node>> = outputs.iter().map(|t| t.node.clone()).collect();
        let platform = self.inner.client.platform().to_string();
        let forms = |k: &kernel_ir::VerifiedKernel| match form {
            KernelForm::Platform => exec::kernel_form(&self.inner, &platform, k),
            KernelForm::Decomposed => Ok(CallForm::Decomposed(lowering::Spmd::Replicas)),
            KernelForm::TpuCustomCall => Ok(CallForm::TpuCustomCall),
            KernelForm::TritonCustomCall(target) => runtime::triton::kernel_ttir(k, target)
                .map(|ttir| CallForm::Triton { ttir })
                .map_err(|e| RuntimeError::failed(format!("kernel `{}`", k.name), e)),
        };
        let program = lower::lower_with(&outs, &ins, true, self.inner.devices, &forms)?;
        if program.params.len() != ins.len() {
            return Err(RuntimeError::Record {
                message: format!(
                    "the outputs read {} tensors but {} are given as inputs; pass every tensor they read",
                    program.params.len(),
                    ins.len()
                ),
                loc,
            });
        }
        Ok(program.text)
    }

    pub(crate) fn sync_nodes(&self, nodes: &[Arc<Node>]) -> Result<(), RuntimeError> {
        let pending = nodes.iter().any(|n| n.deferred().is_some())
            || !self
                .inner
                .pending_collectives
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
        if !pending {
            return Ok(());
        }
        let _span = self.inner.tracer.span("sync");
        let _one = self
            .inner
            .materializing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        exec::materialize(&self.inner, nodes);
        Ok(())
    }
}
