//! Tessera's runtime: running kernels and tensor programs on PJRT plugins.
//!
//! * [`plugin`]: finding the PJRT plugin (`$TESSERA_PJRT_PLUGIN` or the
//!   set-up's cache) and reading its API version;
//! * [`pjrt`]: thin bindings over the PJRT C API (clients, devices, buffers,
//!   compile, execute on one or many devices, executable serialization);
//! * [`host_call`]: Tessera kernels inside XLA programs on the CPU, through a
//!   typed XLA FFI handler running the native JIT;
//! * [`backend`]: one kernel on any CPU path (interpreter, JIT, decomposed
//!   StableHLO on PJRT, the FFI call on PJRT);
//! * [`graph`]: the deferred graph runtime: lazy [`graph::Tensor`] ops,
//!   sync points that lower the pending subgraph to one StableHLO module,
//!   kernels as graph nodes, shape buckets, collectives, statistics;
//! * [`cache`]: the compile cache behind it (in-process, disk, remote);
//! * [`tpu`]: the TPU compiler (libtpu) in the loop, compile-only: a
//!   topology per generation, compiled programs with the compiler's memory
//!   stats, cost analysis and serialized form, and its errors taken apart;
//! * [`triton`]: Triton, the GPU compiler, in the loop: a kernel's Triton
//!   program compiled for NVIDIA and AMD GPUs (no GPU needed) and run on
//!   the CPU by Triton's interpreter;
//! * [`plugin_log`]: plugin logging kept off the terminal unless asked for.

pub mod across_devices;
pub mod backend;
pub mod cache;
pub mod graph;
pub mod host_call;
pub mod pjrt;
pub mod plugin;
pub mod plugin_log;
pub mod tpu;
pub mod triton;
