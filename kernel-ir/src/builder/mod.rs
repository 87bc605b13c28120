//! The builder API: kernels in plain Rust.
//!
//! A [`KernelBuilder`] declares the signature (grid, operands, scratch,
//! scalar prefetch); the body is ordinary Rust over [`Tile`] values and
//! [`Ref`] buffers, with [`for_range`], [`when`] and [`if_else`] for control
//! flow. Every call records the caller's `file:line:col`, so errors point at
//! the user's expression.
//!
//! ```
//! use kernel_ir::prelude::*;
//!
//! let mut k = KernelBuilder::new("add");
//! k.grid([4], [Parallel]);
//! let x = k.input("x", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
//! let y = k.input("y", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
//! let o = k.output("o", F32, [32, 128]).block([8, 128], |[i]| (i, 0));
//! o.store(.., x.load(..) + y.load(..));
//! let kernel = k.build().expect("a valid kernel");
//! assert_eq!(kernel.grid.steps(), 4);
//! ```

mod control;
mod dma;
mod index;
mod packed;
mod positions;
pub mod random;
mod refs;
mod roll;
mod scan;
mod slice;
mod sort;
mod state;
mod tile;
mod tile_ops;
mod top_k;

pub use control::{Bound, Carry, for_range, for_range_step, if_else, when};
pub use dma::{
    AsyncCopy, Scope, Sem, SemArray, View, make_async_copy, make_async_remote_copy, scoped,
};
pub use index::{Idx, IntoIndices, Start, ds};
pub use refs::{BlockMap, IntoIndexExprs, OptionalLoad, Ref};
pub use slice::concat;
pub use sort::sort_by_key;
pub use tile::{
    IntoOperand, Tile, axis_index, constant, device_id, dot, dot_general, iota, num_programs,
    program_id, select,
};
pub use top_k::top_k;

use std::marker::PhantomData;

use crate::error::{ErrorKind, KernelErrors};
use crate::verify::VerifiedKernel;
use crate::{
    BlockSpec, Body, BufferRef, DType, DimSemantics, Grid, Kernel, Layout, Loc, MemorySpace,
    Operand, Role, ScalarPrefetch, Scratch, Target, TileType,
};

/// Builds one kernel. While it lives, tiles and refs it hands out record
/// ops into it; [`KernelBuilder::build`] checks and returns the kernel.
///
/// Not `Send`: a kernel is built on one thread (the finished [`Kernel`] is
/// plain data and moves freely).
pub struct KernelBuilder {
    pub(super) id: u32,
    _not_send: PhantomData<*const ()>,
}

impl KernelBuilder {
    /// Starts a kernel called `name`, for the default target (v5e), with a
    /// rank-0 grid (one step) until [`KernelBuilder::grid`] is called.
    #[track_caller]
    pub fn new(name: impl Into<String>) -> KernelBuilder {
        let loc = Loc::caller();
        let sig = Kernel {
            name: name.into(),
            target: Target::default(),
            platform: crate::current_platform(),
            vmem_limit: None,
            grid: Grid::default(),
            grid_loc: None,
            loc: Some(loc),
            mesh: None,
            prefetch: Vec::new(),
            operands: Vec::new(),
            scratch: Vec::new(),
            semaphores: Vec::new(),
            body: Body::default(),
        };
        KernelBuilder {
            id: state::push(sig),
            _not_send: PhantomData,
        }
    }

    /// Sets the grid: one bound and one semantics per dim, outermost first.
    #[track_caller]
    pub fn grid<const N: usize>(&mut self, bounds: [usize; N], semantics: [DimSemantics; N]) {
        let loc = Loc::caller();
        state::with(self.id, |st| {
            st.sig.grid = Grid::new(bounds.into_iter().zip(semantics));
            st.sig.grid_loc = Some(loc);
        });
    }

    /// Sets the grid from a slice of (bound, semantics), outermost first: the
    /// form for kernels whose grid rank is only known at run time (generated
    /// kernels); [`KernelBuilder::grid`] is the usual one.
    #[track_caller]
    pub fn grid_dims(&mut self, dims: &[(usize, DimSemantics)]) {
        let loc = Loc::caller();
        state::with(self.id, |st| {
            st.sig.grid = Grid::new(dims.iter().copied());
            st.sig.grid_loc = Some(loc);
        });
    }

    /// Sets the TPU generation whose rules apply.
    pub fn target(&mut self, target: Target) {
        state::with(self.id, |st| st.sig.target = target);
    }

    /// Sets the platform whose rules the kernel is verified against (by
    /// default the thread's, [`crate::current_platform`]).
    pub fn platform(&mut self, platform: crate::Platform) {
        state::with(self.id, |st| st.sig.platform = platform);
    }

    /// Sets the scoped VMEM limit in bytes (`vmem_limit_bytes`).
    pub fn vmem_limit(&mut self, bytes: u64) {
        state::with(self.id, |st| st.sig.vmem_limit = Some(bytes));
    }

    #[track_caller]
    fn operand(&mut self, name: String, role: Role, dtype: DType, shape: Vec<usize>) -> Ref {
        let loc = Loc::caller();
        let idx = state::with(self.id, |st| {
            st.sig.operands.push(Operand {
                name,
                role,
                dtype,
                block: BlockSpec::full(&shape),
                shape,
                space: MemorySpace::Vmem,
                layout: Layout::row_major(),
                loc: Some(loc),
            });
            st.sig.operands.len() - 1
        })
        .unwrap_or(usize::MAX);
        Ref::new(BufferRef::Operand(idx), self.id)
    }

    /// Declares an input array. Its block defaults to the whole array; set
    /// one with [`Ref::block`].
    #[track_caller]
    pub fn input(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        self.operand(name.into(), Role::In, dtype, shape.into())
    }

    /// Declares an output array (contents undefined until written).
    #[track_caller]
    pub fn output(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        self.operand(name.into(), Role::Out, dtype, shape.into())
    }

    /// Declares an array that is read and written in place (the output
    /// aliases the input).
    #[track_caller]
    pub fn inout(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        self.operand(name.into(), Role::InOut, dtype, shape.into())
    }

    /// Declares a VMEM scratch buffer that persists across grid steps. It
    /// starts undefined; change the space with [`Ref::space`].
    #[track_caller]
    pub fn scratch(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        let loc = Loc::caller();
        let (name, shape) = (name.into(), shape.into());
        let idx = state::with(self.id, |st| {
            st.sig.scratch.push(Scratch {
                name,
                dtype,
                shape,
                space: MemorySpace::Vmem,
                scoped: false,
                loc: Some(loc),
            });
            st.sig.scratch.len() - 1
        })
        .unwrap_or(usize::MAX);
        Ref::new(BufferRef::Scratch(idx), self.id)
    }

    /// Declares an i32 scalar-prefetch operand: passed before the arrays,
    /// readable in index maps ([`Ref::at`]) and in the body.
    #[track_caller]
    pub fn scalar_prefetch(
        &mut self,
        name: impl Into<String>,
        shape: impl Into<Vec<usize>>,
    ) -> Ref {
        let loc = Loc::caller();
        let (name, shape) = (name.into(), shape.into());
        let idx = state::with(self.id, |st| {
            st.sig.prefetch.push(ScalarPrefetch {
                name,
                dtype: DType::I32,
                shape,
                loc: Some(loc),
            });
            st.sig.prefetch.len() - 1
        })
        .unwrap_or(usize::MAX);
        Ref::new(BufferRef::Prefetch(idx), self.id)
    }

    /// Finishes the kernel without verifying it. Errors found while
    /// building (types, shapes, foreign tiles) are returned here.
    pub fn finish(self) -> Result<Kernel, KernelErrors> {
        let st = state::remove(self.id).ok_or_else(|| {
            KernelErrors::from(crate::KernelError::from(ErrorKind::Builder(
                crate::BuilderMisuse::StateGone,
            )))
        })?;
        let mut errors = st.errors;
        if st.regions.len() != 1 {
            errors.push(ErrorKind::Builder(crate::BuilderMisuse::RegionLeftOpen).into());
        }
        if !errors.is_empty() {
            return Err(KernelErrors(errors));
        }
        let values: Option<Vec<TileType>> = st.values.into_iter().collect();
        let Some(values) = values else {
            return Err(KernelErrors(vec![
                ErrorKind::Builder(crate::BuilderMisuse::UntypedValue).into(),
            ]));
        };
        let mut kernel = st.sig;
        let region = st.regions.into_iter().next().unwrap_or_default();
        kernel.body = Body { values, region };
        Ok(kernel)
    }

    /// Finishes and verifies the kernel.
    pub fn build(self) -> Result<VerifiedKernel, KernelErrors> {
        self.finish()?.verify()
    }
}

impl Drop for KernelBuilder {
    fn drop(&mut self) {
        state::remove(self.id);
    }
}
