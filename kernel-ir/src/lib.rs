//! Tessera's kernel IR: a kernel is data that can be checked, executed and
//! lowered.
//!
//! * [`Kernel`]: the signature ([`Grid`], [`Operand`]s with [`BlockSpec`]s
//!   and [`Layout`] hints, [`Scratch`], [`ScalarPrefetch`], [`Target`]) and
//!   the [`Body`], SSA values over typed, shaped tiles;
//! * [`KernelBuilder`]: writing kernels in plain Rust (the `#[tpu_kernel]`
//!   macro expands to it);
//! * `Display` for [`Kernel`]: a stable, readable text form;
//! * [`Kernel::verify`]: shapes, dtypes, TPU tiling on the physical layout,
//!   alignment, the [`VmemBudget`], index-map bounds and parallel-dim state;
//!   the result is a [`VerifiedKernel`];
//! * [`interpret`]: the reference semantics, with checks hardware does not
//!   make (out-of-bounds blocks, undefined scratch, unwritten outputs).
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! // Row softmax over [16, 256], one block of 8 rows per grid step.
//! let mut k = KernelBuilder::new("softmax");
//! k.grid([2], [Parallel]);
//! let x = k.input("x", F32, [16, 256]).block([8, 256], |[i]| (i, 0));
//! let o = k.output("o", F32, [16, 256]).block([8, 256], |[i]| (i, 0));
//! let v = x.load(..);
//! let e = (v - v.max_keep(1)).exp();
//! o.store(.., e / e.sum_keep(1));
//! let kernel = k.build().unwrap();
//!
//! let input = Array::random(F32, [16, 256], 7, -1.0, 1.0);
//! let out = interpret(&kernel, &[input]).unwrap();
//! let row0: f64 = out[0].data()[..256].iter().sum();
//! assert!((row0 - 1.0).abs() < 1e-5);
//! ```

// Error values carry what was found and what would fit; they are built on
// the cold path only, so their size does not matter.
#![allow(clippy::result_large_err)]

// The macros expand to `::kernel_ir::...` paths; this lets them (and doc
// tests) work inside this crate too.
extern crate self as kernel_ir;

mod array;
mod budget;
mod builder;
mod dma;
pub mod dsl;

/// Guides for kernel authors.
pub mod guide {
    /// Triton's vector add and fused softmax next to their Tessera versions.
    pub mod from_triton {
        #![doc = include_str!("../doc/guide-triton.md")]
    }
    /// Per-row statistics, reductions across steps, arg-max and top-k,
    /// lane-dense layouts, halos, build-time conditions.
    pub mod patterns {
        #![doc = include_str!("../doc/patterns.md")]
    }
}

mod dtype;
mod error;
pub mod filetest;
mod index_map;
mod infer;
mod int_expr;
mod interp;
mod kernel;
mod layout;
pub mod limits;
mod loc;
pub mod memo;
mod ops;
mod parse;
mod printer;
pub mod quote;
mod spec;
mod synchronous;
mod target;
mod verify;

pub use array::{Array, ArrayError, SplitMix64};
pub use budget::{VmemBudget, VmemItem, human_bytes};
pub use builder::random;
pub use builder::{
    AsyncCopy, BlockMap, Bound, Carry, Idx, IntoIndexExprs, IntoIndices, IntoOperand,
    KernelBuilder, OptionalLoad, Ref, Scope, Sem, SemArray, Start, Tile, View, axis_index, concat,
    constant, device_id, dot, dot_general, ds, for_range, for_range_step, if_else, iota,
    make_async_copy, make_async_remote_copy, num_programs, program_id, scoped, select, sort_by_key,
    top_k, when,
};
pub use dma::{
    BufferSlice, CopyDescriptor, RemoteTarget, SemaphoreDecl, SemaphoreKind, SemaphoreSlot,
};
pub use dtype::fp4;
pub use dtype::fp8::{self, f8e4m3fn, f8e5m2};
pub use dtype::{DType, Element, Float, Fp8, ParseDTypeError};
pub use error::{BuilderMisuse, ErrorKind, GpuRule, KernelError, KernelErrors};
pub use half::{bf16, f16};
pub use index_map::{IndexEvalError, IndexExpr, IndexExprDisplay, IndexMap, IndexOp};
pub use int_expr::IntExpr;
pub use interp::{
    BlockFetch, DotShape, FetchTrace, InterpOptions, MeshRun, MeshStep, interpret, interpret_mesh,
    interpret_traced, interpret_with, single_device_only,
};
pub use kernel::{Argument, ArgumentError, Kernel};
pub use layout::{Layout, Order};
pub use loc::Loc;
pub use ops::{
    BinaryOp, Body, BufferRef, CompareOp, DotDims, Index, IndexValue, Literal, Op, OpKind,
    ReduceOp, Region, ShapeDisplay, TileType, UnaryOp, ValueId,
};
pub use parse::{ParseError, parse, parse_file};
pub use spec::{
    BlockSpec, DimSemantics, ElementPad, Grid, GridDim, MemorySpace, Mesh, Operand, Role,
    ScalarPrefetch, Scratch,
};
pub use target::{
    GpuTarget, LANES, ParseGpuTargetError, ParseTargetError, Platform, Target, current_platform,
    for_platform,
};
pub use verify::VerifiedKernel;

#[doc = include_str!("../doc/tpu_kernel.md")]
pub use kernel_macros::tpu_kernel;

/// An operand group: operands several kernels take alike, declared once.
///
/// On a struct whose fields are operands with their `#[shape]`, `#[block]`
/// and layout attributes, `#[operands]` defines a group; a kernel parameter
/// `#[operands] _: Group<T>` stands for its fields, in order, under the
/// names the group gives them (the body uses `x`, not `group.x`). Shape
/// symbols and config values in the fields' attributes are the kernel's
/// own (`rows` below is each kernel's parameter). A group's generics are
/// bare element types, bounded by the kernel; a kernel may take several
/// groups. Groups are used within their crate (`pub(crate)` at most); a
/// group used from another module is named by its path
/// (`#[operands] _: super::Pair<T>`) or imported, and the functions its
/// attributes call (block maps) are looked up where the kernel is, as if
/// the fields were written there: import them beside the kernel.
///
/// ```
/// use kernel_ir::prelude::*;
///
/// /// `x` and `y`, `rows` rows per grid step.
/// #[operands]
/// struct Pair<T> {
///     #[shape(m, n)]
///     #[block([rows, n], |i| (i, 0))]
///     x: In<T>,
///     #[shape(m, n)]
///     #[block([rows, n], |i| (i, 0))]
///     y: In<T>,
/// }
///
/// #[tpu_kernel(grid = (m / rows,), semantics = (parallel,))]
/// fn add<T: Float>(
///     rows: usize,
///     #[operands] _: Pair<T>,
///     #[shape(m, n)]
///     #[block([rows, n], |i| (i, 0))]
///     o: Out<T>,
/// ) {
///     o.store(.., x.load(..) + y.load(..));
/// }
///
/// #[tpu_kernel(grid = (m / rows,), semantics = (parallel,))]
/// fn mul<T: Float>(
///     rows: usize,
///     #[operands] _: Pair<T>,
///     #[shape(m, n)]
///     #[block([rows, n], |i| (i, 0))]
///     o: Out<T>,
/// ) {
///     o.store(.., x.load(..) * y.load(..));
/// }
///
/// fn main() {
///     let dims = add::Dims { m: 16, n: 128 };
///     let k = add::build_for(F32, 8, dims).unwrap();
///     let names: Vec<&str> = k.arguments().map(|a| a.name).collect();
///     assert_eq!(names, ["x", "y"]);
///     let x = Array::random(F32, [16, 128], 1, -1.0, 1.0);
///     let y = Array::random(F32, [16, 128], 2, -1.0, 1.0);
///     let args = [x.clone(), y.clone()];
///     let sum = interpret(&k, &args).unwrap();
///     let product = mul::build_for(F32, 8, mul::Dims { m: 16, n: 128 }).unwrap();
///     let prod = interpret(&product, &args).unwrap();
///     let (a, b) = (x.data()[5] as f32, y.data()[5] as f32);
///     assert_eq!(sum[0].data()[5], f64::from(a + b));
///     assert_eq!(prod[0].data()[5], f64::from(a * b));
/// }
/// ```
pub use kernel_macros::operands;

#[doc(hidden)]
pub use kernel_macros::__splice_operands;

/// Makes a function callable from `#[tpu_kernel]` bodies.
///
/// The body is rewritten like a kernel body (`if`, `for`, comparisons), and
/// calls from kernels are checked to go to functions marked this way. A
/// kernel function cannot be generic.
///
/// ```
/// use kernel_ir::prelude::*;
///
/// /// One step of an online softmax: new running max and rescale factor.
/// #[kernel_fn]
/// fn rescale(m_prev: Tile, s: Tile) -> (Tile, Tile) {
///     let m = m_prev.max(s.max_keep(1));
///     (m, (m_prev - m).exp())
/// }
/// # let _ = rescale;
/// ```
pub use kernel_macros::kernel_fn;

/// The lowercase hex SHA-256 of `bytes`: the one digest kernel identities
/// ([`VerifiedKernel::digest`]), exported artifacts and checkpoints record.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(bytes))
}

/// `bytes` as lowercase hex, two digits each (`[0x0f, 0xa0]` → `"0fa0"`).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Number of blocks of `block` needed to cover `n` (a block of 0 counts
/// as 1, so a grid size is never a division by zero): the grid dim of an
/// axis tiled by `block`, last block partial.
pub fn cdiv(n: usize, block: usize) -> usize {
    n.div_ceil(block.max(1))
}

/// The error of a kernel builder instantiated for a dtype it has no
/// instance for: `what` names the builder (and which operand, where it
/// matters), `supported` the dtypes it has.
///
/// ```
/// use kernel_ir::DType;
/// let e = kernel_ir::unsupported_dtype("fp8_gemm (inputs)", DType::F32, &[DType::F8E4M3FN, DType::F8E5M2]);
/// assert!(e.to_string().contains("f8e4m3fn or f8e5m2, not f32"), "{e}");
/// // Typed, for a caller that tells a dtype refusal from other errors.
/// assert!(e.any(|k| matches!(k, kernel_ir::ErrorKind::UnsupportedDtype { dtype: DType::F32, .. })));
/// ```
pub fn unsupported_dtype(what: &str, dtype: DType, supported: &[DType]) -> KernelErrors {
    KernelErrors::from(KernelError::from(ErrorKind::UnsupportedDtype {
        what: what.to_string(),
        dtype,
        supported: supported.to_vec(),
    }))
}

/// Everything a kernel author needs, in one import.
pub mod prelude {
    pub use crate::DType::{BF16, Bool, F8E4M3FN, F8E5M2, F16, F32, I8, I32};
    pub use crate::DimSemantics::{Arbitrary, CoreParallel, Parallel};
    pub use crate::dsl::{
        BarrierSemaphore, DmaSemaphores, In, InOut, Out, Predicate, Prefetch, Scratch, Semaphores,
        Smem, Vmem,
    };
    pub use crate::{
        Array, BlockMap, DType, DotDims, Float, Fp8, IndexExpr, KernelBuilder, Layout, MemorySpace,
        OptionalLoad, Ref, SemArray, Target, Tile, axis_index, bf16, cdiv, concat, constant,
        device_id, dot, dot_general, ds, f8e4m3fn, f8e5m2, f16, for_range, for_range_step, if_else,
        interpret, iota, kernel_fn, make_async_copy, make_async_remote_copy, num_programs,
        operands, program_id, scoped, select, sort_by_key, top_k, tpu_kernel, when,
    };
}
