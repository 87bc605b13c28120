//! Tessera's limits, in one table: how large, deep or long anything a
//! kernel file, a builder or a command line describes may be. Every reader
//! and checker takes its limit from here (the parser, the verifier, the
//! interpreter, the command), so an input over one is refused with the
//! same `[limit]` error on every path, in bounded time and memory, and the
//! README's table is this one.
//!
//! Each limit is far past any real kernel (the catalog's largest use is
//! noted beside it) and low enough that what it bounds fits in memory and
//! finishes in seconds.
//!
//! ```
//! use kernel_ir::{limits, parse};
//! let text = format!(
//!     "kernel @k {{\n  target v5e, vmem_limit default\n  grid [{} arbitrary]\n  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\nbody:\n}}\n",
//!     limits::MAX_GRID_STEPS + 1
//! );
//! let e = parse(&text).unwrap().verify().unwrap_err().to_string();
//! assert!(e.contains("[limit]") && e.contains("grid steps"), "{e}");
//! ```

/// Value numbers in a kernel's text (`%N`): at most this many values
/// (the catalog's largest kernel has about 600).
pub const MAX_VALUES: u32 = 1 << 20;

/// Regions nested inside each other (`if`, `for`, `scope`), and
/// expressions nested inside each other on one line (the catalog nests 4
/// regions deep).
pub const MAX_NESTING: usize = 64;

/// Grid dims (the catalog uses at most 5; Pallas kernels rarely pass 4).
pub const MAX_GRID_RANK: usize = 8;

/// Grid steps, all dims together: 2^31 (a 32k × 32k × 2 grid), so step
/// counts fit i32 on every path and a walk over the grid ends.
pub const MAX_GRID_STEPS: u64 = 1 << 31;

/// Ops of the module the native JIT compiles, counted before it is
/// lowered to LLVM (the catalog's largest has about 3,000): LLVM's time
/// grows faster than the module (a chain of 1,000 vector adds took 20 s,
/// 2,000 took 3 minutes), so past this the JIT and the PJRT FFI path
/// refuse the kernel with a `[limit]` error; the interpreter and the
/// decomposed PJRT path run it.
pub const MAX_HOST_OPS: usize = 1 << 15;

/// Elements of one tile value or block (a 2048 × 2048 f32 tile is 2^22;
/// the catalog's largest is 2^17). Arrays in HBM have their own limit,
/// 2^40 elements (`[too-large]`).
pub const MAX_TILE_ELEMENTS: u64 = 1 << 26;

/// Devices of a mesh (a TPU v5p pod slice has 8,960 chips).
pub const MAX_MESH_DEVICES: u64 = 1 << 14;

/// Iterations of one `for` op in the interpreter (the default of
/// `InterpOptions::max_loop_trips`).
pub const MAX_LOOP_TRIPS: u64 = 1 << 24;

/// Grid steps the interpreter runs (the default of
/// `InterpOptions::max_grid_steps`): it checks every access in f64, at
/// roughly a million elements a second, so a larger grid is a job for the
/// native JIT.
pub const MAX_INTERP_STEPS: u64 = 1 << 24;

/// Grid steps the compiled CPU paths run (the JIT, PJRT, the PJRT FFI
/// path): 2^26, about half a minute of the smallest body on the JIT (2^22
/// steps took 1.7 s here). Larger grids are for the TPU and GPU compiles,
/// which take up to [`MAX_GRID_STEPS`].
pub const MAX_CPU_STEPS: u64 = 1 << 26;

/// Grid steps Triton's interpreter runs: it executes each step in NumPy,
/// about 2 ms a step (2^14 steps took 26 s here), so 2^16 bounds a run to
/// a few minutes.
pub const MAX_TRITON_INTERP_STEPS: u64 = 1 << 16;

/// Block-size combinations `tessera tune` tries (`--values` to the power
/// of the kernel's block parameters).
pub const MAX_TUNE_CANDIDATES: u64 = 4096;

/// Seconds one compile (`--timeout`) may be given: a day.
pub const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;

/// Bytes of a kernel file (`.kir`).
pub const MAX_KIR_BYTES: u64 = 16 << 20;
