//! The lowerings and what runs or compiles them: the back ends agree on every path, snapshots per target, the JIT, Triton, libtpu.
mod filetests;
mod gpu_script;
mod gpu_table;
mod host_tiling;
mod lowered;
mod native;
mod paths;
mod snapshots_ir;
mod tpu_attention;
pub(crate) mod tpu_compile;
mod tpu_dma;
mod tpu_fp8;
mod tpu_fuzz;
mod triton;
