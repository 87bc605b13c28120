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
//! * [`cache`]: the compile cache (in-process, disk, remote) behind the
//!   graph runtime (the `tessera-graph` crate, built on this one);
//! * [`triton`]: Triton, the GPU compiler, in the loop: a kernel's Triton
//!   program compiled for NVIDIA and AMD GPUs (no GPU needed) and run on
//!   the CPU by Triton's interpreter;
//! * [`plugin_log`]: plugin logging kept off the terminal unless asked for.

pub mod across_devices;
pub mod backend;
pub mod cache;
pub mod child;
pub mod host_call;
pub mod pjrt;
pub mod plugin;
pub mod plugin_log;
pub mod triton;
