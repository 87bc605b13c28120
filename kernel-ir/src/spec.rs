//! The kernel signature: grid, operands, scratch and scalar prefetch.

use std::fmt;

use crate::{DType, IndexMap, Layout, Loc};

/// How iterations of one grid dimension relate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DimSemantics {
    /// Iterations are independent; they may run in any order or on other
    /// cores. No state may flow between them.
    Parallel,
    /// Iterations run in order on one core and may carry state in scratch
    /// (reductions, online softmax).
    Arbitrary,
    /// Parallel, and split across the TensorCores of a chip (v7x's two
    /// cores, v5p's megacore): Pallas's `CORE_PARALLEL`. Only on targets
    /// with more than one core.
    CoreParallel,
}

impl DimSemantics {
    /// Whether iterations are independent (`parallel` or `core_parallel`).
    pub fn is_parallel(self) -> bool {
        matches!(self, DimSemantics::Parallel | DimSemantics::CoreParallel)
    }
}

impl fmt::Display for DimSemantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DimSemantics::Parallel => "parallel",
            DimSemantics::Arbitrary => "arbitrary",
            DimSemantics::CoreParallel => "core_parallel",
        })
    }
}

/// One grid dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GridDim {
    /// Number of iterations.
    pub bound: usize,
    /// Parallel or arbitrary.
    pub semantics: DimSemantics,
}

/// The devices a kernel runs on together (Pallas's mesh in `shard_map`):
/// named axes with sizes; a device's logical id is its coordinates in
/// row-major order over the axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Mesh {
    /// `(name, size)` per axis, outermost first.
    pub axes: Vec<(String, usize)>,
    /// Where it was declared (what mesh errors point at).
    pub loc: Option<Loc>,
}

impl Mesh {
    /// How many devices.
    pub fn devices(&self) -> usize {
        self.axes
            .iter()
            .fold(1usize, |a, (_, n)| a.saturating_mul(*n))
    }

    /// The position of axis `name`.
    pub fn axis(&self, name: &str) -> Option<usize> {
        self.axes.iter().position(|(n, _)| n == name)
    }

    /// Logical ids between one step along `axis` (the product of the
    /// sizes of the axes after it).
    pub fn stride(&self, axis: usize) -> usize {
        self.axes.iter().skip(axis + 1).map(|(_, n)| *n).product()
    }
}

/// The iteration space of a kernel. Iterated in row-major order: the last
/// dim varies fastest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Grid {
    /// Dimensions from outermost to innermost.
    pub dims: Vec<GridDim>,
}

impl Grid {
    /// A grid from bounds and per-dim semantics.
    pub fn new(dims: impl IntoIterator<Item = (usize, DimSemantics)>) -> Grid {
        Grid {
            dims: dims
                .into_iter()
                .map(|(bound, semantics)| GridDim { bound, semantics })
                .collect(),
        }
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Bounds of each dim.
    pub fn bounds(&self) -> Vec<usize> {
        self.dims.iter().map(|d| d.bound).collect()
    }

    /// Every grid point in execution (row-major) order.
    pub fn points(&self) -> impl Iterator<Item = Vec<i64>> + '_ {
        let bounds = self.bounds();
        let mut next = (!bounds.contains(&0)).then(|| vec![0i64; bounds.len()]);
        std::iter::from_fn(move || {
            let current = next.take()?;
            let mut p = current.clone();
            for d in (0..bounds.len()).rev() {
                p[d] += 1;
                if (p[d] as usize) < bounds[d] {
                    next = Some(p);
                    break;
                }
                p[d] = 0;
            }
            Some(current)
        })
    }

    /// Total number of grid steps (saturating).
    pub fn steps(&self) -> usize {
        self.dims
            .iter()
            .fold(1usize, |acc, d| acc.saturating_mul(d.bound))
    }
}

/// Where a buffer lives while the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemorySpace {
    /// Vector memory: operands arrive block by block in windows. The default.
    #[default]
    Vmem,
    /// Scalar memory: small arrays read as scalars (tables, lengths).
    Smem,
    /// Left where it is (HBM): the kernel sees the whole array.
    Any,
}

impl fmt::Display for MemorySpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemorySpace::Vmem => "vmem",
            MemorySpace::Smem => "smem",
            MemorySpace::Any => "any",
        })
    }
}

/// Whether an operand is read, written or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Read only.
    In,
    /// Written; its initial contents are undefined.
    Out,
    /// Read and written; the output aliases the input.
    InOut,
}

impl Role {
    /// True for `In` and `InOut`.
    pub fn is_input(self) -> bool {
        matches!(self, Role::In | Role::InOut)
    }
    /// True for `Out` and `InOut`.
    pub fn is_output(self) -> bool {
        matches!(self, Role::Out | Role::InOut)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::In => "in",
            Role::Out => "out",
            Role::InOut => "inout",
        })
    }
}

/// The block a grid step sees of an operand: a shape and the map from grid
/// indices to the block's index (block index × block shape = element
/// offset), or, with [`BlockSpec::element`], to the element offset itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// Block shape, one entry per array dim.
    pub shape: Vec<usize>,
    /// Block index of each dim as a function of the grid indices.
    pub index_map: IndexMap,
    /// Pipeline buffers of the window (Pallas's `Buffered(n)`): 1 fetches
    /// each block before its step runs (no overlap, half the VMEM), 2
    /// double-buffers (fetching the next block during this step). `None`
    /// is the pipeline's default: 2, or 1 for a block every step shares.
    pub buffers: Option<usize>,
    /// Element-offset windows (Pallas's `pl.Element` dims): the index map
    /// gives each window's first element in the array padded by these
    /// amounts, so windows may overlap (a halo) and reach into the
    /// padding. `None`: whole blocks.
    pub element: Option<ElementPad>,
}

/// The padding of an element-offset window's array: `low[d]` elements
/// before dim `d` and `high[d]` after it. The padding is never read from
/// memory: what a window sees there is undefined (poison to the checking
/// interpreter, whatever the hardware holds on a TPU), so a kernel masks
/// it, as a causal conv masks the rows before the sequence starts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ElementPad {
    /// Elements before each dim.
    pub low: Vec<usize>,
    /// Elements after each dim.
    pub high: Vec<usize>,
}

impl BlockSpec {
    /// The whole array as a single block.
    pub fn full(shape: &[usize]) -> BlockSpec {
        BlockSpec {
            shape: shape.to_vec(),
            index_map: IndexMap::zeros(shape.len()),
            buffers: None,
            element: None,
        }
    }

    /// The first element of the window whose index map value is `index`,
    /// in the array's own coordinates: `index × shape` for whole blocks,
    /// `index − low` for element offsets (negative inside the low padding).
    pub fn window_start(&self, index: &[i64]) -> Vec<i64> {
        match &self.element {
            None => index
                .iter()
                .zip(&self.shape)
                .map(|(&b, &s)| b.saturating_mul(s as i64))
                .collect(),
            Some(pad) => index
                .iter()
                .enumerate()
                .map(|(d, &v)| v - pad.low.get(d).copied().unwrap_or(0) as i64)
                .collect(),
        }
    }
}

/// A kernel operand: an array passed in or out.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    /// Name, unique within the kernel.
    pub name: String,
    /// In, out or in-out.
    pub role: Role,
    /// Element type.
    pub dtype: DType,
    /// Shape of the whole array.
    pub shape: Vec<usize>,
    /// Memory space of the kernel's view.
    pub space: MemorySpace,
    /// Blocking (ignored for [`MemorySpace::Any`], which sees the whole
    /// array).
    pub block: BlockSpec,
    /// Layout hints.
    pub layout: Layout,
    /// Where it was declared.
    pub loc: Option<Loc>,
}

impl Operand {
    /// The bytes block `index` of this operand moves between HBM and
    /// VMEM: its in-bounds part only (a block at the array's edge moves
    /// what it covers; the padding is never read or written). The one
    /// rule both the `tpu_custom_call` cost estimate and `tessera cost`
    /// count with.
    pub fn block_bytes(&self, index: &[i64]) -> u64 {
        let start = self.block.window_start(index);
        let elems: u64 = self
            .shape
            .iter()
            .zip(&self.block.shape)
            .zip(start)
            .map(|((&n, &s), start)| {
                let end = start.saturating_add(s as i64).clamp(0, n as i64);
                (end - start.clamp(0, n as i64)) as u64
            })
            .product();
        elems * self.dtype.bytes() as u64
    }

    /// The shape the kernel body sees: the block, or the whole array for
    /// `any`.
    pub fn view_shape(&self) -> &[usize] {
        match self.space {
            MemorySpace::Any => &self.shape,
            _ => &self.block.shape,
        }
    }
}

/// A scratch buffer: lives across grid steps, starts undefined.
#[derive(Clone, Debug, PartialEq)]
pub struct Scratch {
    /// Name, unique within the kernel.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Vmem or smem.
    pub space: MemorySpace,
    /// Allocated by a `scope` op for its body only (Pallas's
    /// `run_scoped`), not for the whole kernel.
    pub scoped: bool,
    /// Where it was declared.
    pub loc: Option<Loc>,
}

/// A scalar-prefetch operand: a small integer array in SMEM, available to
/// index maps and to the body before the grid starts.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalarPrefetch {
    /// Name, unique within the kernel.
    pub name: String,
    /// Element type; must be i32.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Where it was declared.
    pub loc: Option<Loc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_blocks_move_only_their_in_bounds_part() {
        // [10, 256] in [8, 128] blocks: block (1, 1) holds 2 rows.
        let op = |dtype| Operand {
            name: "x".into(),
            role: Role::In,
            dtype,
            shape: vec![10, 256],
            space: MemorySpace::Vmem,
            block: BlockSpec {
                shape: vec![8, 128],
                index_map: IndexMap::zeros(2),
                buffers: None,
                element: None,
            },
            layout: Layout::row_major(),
            loc: None,
        };
        assert_eq!(op(DType::F32).block_bytes(&[1, 1]), 2 * 128 * 4);
        assert_eq!(op(DType::BF16).block_bytes(&[0, 0]), 8 * 128 * 2);
        assert_eq!(op(DType::F32).block_bytes(&[2, 0]), 0, "past the end");
    }
}
