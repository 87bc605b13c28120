//! Tessera's kernels, each with its reference op.
//!
//! Every kernel is a function from a config (block sizes, shapes, flags) to
//! a [`kernel_ir::VerifiedKernel`], next to a plain f64 host implementation
//! of the same math in [`reference`]. [`check`] compares the two.
//!
//! * [`attention`]: flash attention forward (online softmax, causal, K
//!   column-major);
//! * [`paths`]: one kernel on every CPU path (interpreter, native JIT,
//!   PJRT decomposed, PJRT FFI call) against the reference;
//! * [`foundation`]: tiled elementwise add, tiled matmul with an f32
//!   accumulator in scratch, row softmax, layer norm.

pub mod attention;
pub mod bench;
pub mod check;
pub mod epilogue;
pub mod examples;
pub mod foundation;
pub mod norm;
pub mod paths;
pub mod reference;
pub mod rope;
pub mod swiglu;
pub mod transformer;
