//! A whole kernel: signature plus body.

use std::fmt;

use crate::ops::ShapeDisplay;
use crate::{Body, BufferRef, DType, Grid, Operand, ScalarPrefetch, Scratch, Target};

/// A kernel as data: what it iterates over, what it touches and what it does.
///
/// Build one with [`crate::KernelBuilder`] (or the `#[tpu_kernel]` macro),
/// check it with [`Kernel::verify`], run it with [`crate::interpret`].
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Name, used for the lowered function.
    pub name: String,
    /// The TPU generation whose rules apply (when [`Kernel::platform`] is
    /// the TPU).
    pub target: Target,
    /// Whose rules the kernel is verified against.
    pub platform: crate::Platform,
    /// Scoped VMEM limit in bytes; `None` means the target's default.
    pub vmem_limit: Option<u64>,
    /// Iteration space.
    pub grid: Grid,
    /// Where the grid was set (what grid errors point at).
    pub grid_loc: Option<crate::Loc>,
    /// Where the kernel is declared (its `kernel @name {` line in a file,
    /// the `KernelBuilder::new` call in Rust): what errors about the whole
    /// kernel point at (its name, `vmem_limit`, a top-level `yield`).
    pub loc: Option<crate::Loc>,
    /// The devices it runs on together, for kernels that copy or signal
    /// across chips; `None` for a single-chip kernel.
    pub mesh: Option<crate::Mesh>,
    /// Scalar-prefetch operands, passed first.
    pub prefetch: Vec<ScalarPrefetch>,
    /// Array operands, in call order.
    pub operands: Vec<Operand>,
    /// Scratch buffers (those marked `scoped` belong to a `scope` op).
    pub scratch: Vec<Scratch>,
    /// Semaphore arrays (those marked `scoped` belong to a `scope` op).
    pub semaphores: Vec<crate::SemaphoreDecl>,
    /// What each grid step does.
    pub body: Body,
}

impl Kernel {
    /// The scoped VMEM limit that applies: explicit or the target default.
    pub fn effective_vmem_limit(&self) -> u64 {
        self.vmem_limit
            .unwrap_or_else(|| self.target.default_scoped_vmem_limit())
    }

    /// Name, dtype and view shape of a buffer, if it exists.
    pub fn buffer(&self, b: BufferRef) -> Option<(&str, DType, &[usize])> {
        match b {
            BufferRef::Operand(i) => self
                .operands
                .get(i)
                .map(|o| (o.name.as_str(), o.dtype, o.view_shape())),
            BufferRef::Scratch(i) => self
                .scratch
                .get(i)
                .map(|s| (s.name.as_str(), s.dtype, s.shape.as_slice())),
            BufferRef::Prefetch(i) => self
                .prefetch
                .get(i)
                .map(|p| (p.name.as_str(), p.dtype, p.shape.as_slice())),
        }
    }

    /// The part of operand `i`'s padded array a run touches, if it has an
    /// element window whose windows are known before the run: per dim
    /// `[lo, hi)` in padded coordinates, the hull of the array and every
    /// window the grid places. The CPU paths materialise only this much of
    /// the padding (padding beyond the outermost window costs nothing);
    /// `None` means the whole padded array.
    pub fn element_reach(&self, i: usize) -> Option<Vec<(usize, usize)>> {
        crate::verify::element_reach(&self.grid, self.operands.get(i)?)
    }

    /// The block index operand `i` uses at grid `point`, from its index
    /// map, with scalar-prefetch values read through `prefetch`; an index
    /// map that fails to evaluate or a block outside the array is an error
    /// naming the operand and grid point (the interpreter and the native
    /// driver both report it this way).
    pub fn block_index(
        &self,
        i: usize,
        point: &[i64],
        prefetch: &crate::index_map::PrefetchRead<'_>,
    ) -> Result<Vec<i64>, crate::KernelError> {
        use crate::{ErrorKind, KernelError};
        let o = self
            .operands
            .get(i)
            .ok_or_else(|| KernelError::from(ErrorKind::Inputs(format!("no operand {i}"))))?;
        let mut bidx = Vec::with_capacity(o.shape.len());
        for e in &o.block.index_map.exprs {
            let v = e.eval(point, prefetch).map_err(|e| {
                KernelError::new(
                    ErrorKind::IndexMapEval {
                        operand: o.name.clone(),
                        grid: point.to_vec(),
                        reason: e.to_string(),
                    },
                    o.loc.clone(),
                )
            })?;
            bidx.push(v);
        }
        if let Some(kind) = crate::verify::block_in_bounds(o, point, &bidx) {
            return Err(KernelError::new(kind, o.loc.clone()));
        }
        Ok(bidx)
    }

    /// Checks, before a run, that every block index the kernel's index maps
    /// produce from these scalar-prefetch values is inside its array, at
    /// every grid point: the check the interpreter and the native driver
    /// make as they go, for paths that cannot make it themselves (the
    /// decomposed StableHLO clamps a dynamic slice instead of failing).
    /// `prefetch` are the scalar-prefetch arrays in order. The error is the
    /// one the interpreter reports.
    pub fn check_block_indices(&self, prefetch: &[crate::Array]) -> Result<(), crate::KernelError> {
        let uses_prefetch: Vec<usize> = self
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                o.space != crate::MemorySpace::Any
                    && o.block.index_map.exprs.iter().any(|e| e.uses_prefetch())
            })
            .map(|(i, _)| i)
            .collect();
        if uses_prefetch.is_empty() {
            return Ok(());
        }
        let read = |p: usize, idx: &[i64]| -> Result<i64, crate::IndexEvalError> {
            let (decl, a) = self.prefetch.get(p).zip(prefetch.get(p)).ok_or_else(|| {
                crate::IndexEvalError::Prefetch(format!("no scalar prefetch {p}"))
            })?;
            let mut flat = 0usize;
            for (d, (&i, &n)) in idx.iter().zip(a.shape()).enumerate() {
                if i < 0 || i as usize >= n {
                    return Err(crate::IndexEvalError::Prefetch(format!(
                        "`{}` index {i} in dim {d} is outside 0..{n}",
                        decl.name
                    )));
                }
                flat = flat * n + i as usize;
            }
            Ok(a.data()[flat] as i64)
        };
        let bounds: Vec<i64> = self.grid.dims.iter().map(|d| d.bound as i64).collect();
        let mut point = vec![0i64; bounds.len()];
        loop {
            for &i in &uses_prefetch {
                self.block_index(i, &point, &read)?;
            }
            // Next grid point, last dim fastest.
            let mut d = bounds.len();
            loop {
                if d == 0 {
                    return Ok(());
                }
                d -= 1;
                point[d] += 1;
                if point[d] < bounds[d] {
                    break;
                }
                point[d] = 0;
            }
        }
    }

    /// Operands the kernel reads from the caller (in and in-out), in order.
    pub fn inputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role.is_input())
    }

    /// Operands the kernel returns (out and in-out), in order.
    pub fn outputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().filter(|o| o.role.is_output())
    }

    /// The arrays a call passes, in call order: scalar prefetch, then the
    /// inputs (in and in-out operands) in operand order. Every way of
    /// running a kernel (interpreter, host JIT, graph runtime, XLA handler)
    /// takes its arguments in this order.
    pub fn arguments(&self) -> impl Iterator<Item = Argument<'_>> {
        let prefetch = self.prefetch.iter().map(|p| Argument {
            name: &p.name,
            dtype: p.dtype,
            shape: &p.shape,
        });
        prefetch.chain(self.inputs().map(|o| Argument {
            name: &o.name,
            dtype: o.dtype,
            shape: &o.shape,
        }))
    }

    /// Checks the dtype and shape of each array a call passes against
    /// [`Kernel::arguments`]: the one argument check every way of running a
    /// kernel makes (interpreter, host JIT, PJRT, graph runtime, XLA's FFI
    /// handler, the `tessera` command). `None` as a dtype is one Tessera
    /// has no name for (an XLA type code it does not know).
    pub fn check_arguments<'s>(
        &self,
        given: impl ExactSizeIterator<Item = (Option<DType>, &'s [usize])>,
    ) -> Result<(), ArgumentError> {
        let expected: Vec<Argument<'_>> = self.arguments().collect();
        check_against(&self.name, "arrays", &expected, given)
    }

    /// [`Kernel::check_arguments`] for the arrays a call returns (out and
    /// in-out operands, in operand order).
    pub fn check_results<'s>(
        &self,
        given: impl ExactSizeIterator<Item = (Option<DType>, &'s [usize])>,
    ) -> Result<(), ArgumentError> {
        let expected: Vec<Argument<'_>> = self
            .outputs()
            .map(|o| Argument {
                name: &o.name,
                dtype: o.dtype,
                shape: &o.shape,
            })
            .collect();
        check_against(&self.name, "results", &expected, given)
    }
}

fn check_against<'s>(
    kernel: &str,
    what: &'static str,
    expected: &[Argument<'_>],
    given: impl ExactSizeIterator<Item = (Option<DType>, &'s [usize])>,
) -> Result<(), ArgumentError> {
    if given.len() != expected.len() {
        return Err(ArgumentError::Count {
            kernel: kernel.to_string(),
            what,
            expected: expected.iter().map(Argument::to_string).collect(),
            given: given.len(),
        });
    }
    for (index, (a, (dtype, shape))) in expected.iter().zip(given).enumerate() {
        if dtype != Some(a.dtype) || a.shape != shape {
            return Err(ArgumentError::Mismatch {
                kernel: kernel.to_string(),
                index,
                name: a.name.to_string(),
                want: (a.dtype, a.shape.to_vec()),
                got: (dtype, shape.to_vec()),
            });
        }
    }
    Ok(())
}

/// Why the arrays of a call do not fit a kernel ([`Kernel::check_arguments`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentError {
    /// Not the kernel's number of arrays.
    #[error("kernel `{kernel}` takes {} {what} ({}), got {given}", expected.len(), expected.join(", "))]
    Count {
        /// The kernel.
        kernel: String,
        /// `arrays` (arguments) or `results`.
        what: &'static str,
        /// What it takes, as `name: dtype[shape]`.
        expected: Vec<String>,
        /// How many the call has.
        given: usize,
    },
    /// An array of the wrong dtype or shape.
    #[error(
        "`{name}` of kernel `{kernel}` must be {}{} but got {}{}",
        want.0,
        ShapeDisplay(&want.1),
        got.0.map_or("an unknown dtype ".to_string(), |d| d.to_string()),
        ShapeDisplay(&got.1)
    )]
    Mismatch {
        /// The kernel.
        kernel: String,
        /// Position among the arguments (or results).
        index: usize,
        /// The argument's name.
        name: String,
        /// Its dtype and shape.
        want: (DType, Vec<usize>),
        /// What the call passes.
        got: (Option<DType>, Vec<usize>),
    },
}

/// One array a kernel call takes (see [`Kernel::arguments`]); displays as
/// `name: f32[8, 128]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Argument<'a> {
    /// The prefetch or operand name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Full array shape.
    pub shape: &'a [usize],
}

impl fmt::Display for Argument<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}{}",
            self.name,
            self.dtype,
            ShapeDisplay(self.shape)
        )
    }
}
