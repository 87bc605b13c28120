//! Where each buffer of a kernel lives in its Triton program, and where the
//! grid's steps go.
//!
//! A Triton program is one group of grid steps that share their parallel
//! indices (the host JIT's unit of work too): the parallel dims become
//! program ids, the `arbitrary` dims loops inside the program, in grid
//! order. A loop's *level* is its depth (1 for the outermost arbitrary
//! dim); level 0 is the program outside every loop.
//!
//! Buffers:
//!
//! * **Registers** (`Residency::Registers`): a tensor variable carried
//!   through the program's loops, for a buffer the body only ever writes
//!   whole and reads at static positions (online-softmax state, an
//!   accumulator, an output block accumulated over the k steps). Scratch
//!   starts as zeros (as the host JIT's does); an output block is written
//!   back, and an in-out block fetched, at its operand's level: the level
//!   of the innermost loop its index map reads, so exactly when a TPU
//!   pipeline would (the block index can change only there).
//! * **Fetched** (`Residency::Fetched`): an input the body only ever loads
//!   whole, loaded once at its level when that level is outside some loop
//!   (a flash-attention q block, loaded before the loop over k blocks).
//! * **Memory** (`Residency::Memory`): everything else is read and written
//!   through pointers where the body touches it: inputs and outputs at
//!   their block's offset in the caller's arrays (rows past an array's end
//!   masked), scratch in a global workspace with one slice per program.
//!   Threads of a program do not see each other's global writes without a
//!   barrier, so a memory buffer that one op writes and another op reads
//!   or writes gets `tl.debug_barrier()` around its stores.

use std::collections::HashMap;

use kernel_ir::{
    BufferRef, DimSemantics, Index, IndexExpr, IndexValue, Kernel, MemorySpace, OpKind, Region,
    Role,
};

/// A register buffer holds at most this many elements; larger ones live in
/// memory (a GPU thread block has 64K 32-bit registers).
const REGISTER_ELEMENTS: usize = 32 * 1024;

/// Workspace slices start at multiples of this many bytes.
const WORKSPACE_ALIGN: u64 = 128;

/// Where one buffer lives (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Residency {
    /// A tensor variable carried through the program.
    Registers,
    /// An input loaded whole once, at its operand's level.
    Fetched,
    /// Read and written through pointers.
    Memory,
}

/// How the loads and stores of one buffer index it.
#[derive(Default)]
struct Access {
    loads: usize,
    stores: usize,
    /// Every load reads the whole buffer.
    loads_whole: bool,
    /// Every load has static indices.
    loads_static: bool,
    /// Every store writes the whole buffer (a mask allowed).
    stores_whole: bool,
}

/// The layout of one kernel's Triton program.
pub(super) struct Plan {
    /// The arbitrary grid dims, outermost first: the program's loops.
    pub loops: Vec<usize>,
    /// The parallel grid dims, outermost first: the program ids.
    pub parallel: Vec<usize>,
    /// Program id axes: `Some(a)` per parallel dim when each has its own
    /// (innermost dim on axis 0), `None` when all are folded into axis 0.
    pub axes: Option<Vec<usize>>,
    /// Where each operand, scratch buffer and prefetch array lives.
    pub residency: HashMap<BufferRef, Residency>,
    /// Per operand: the level its block index can change at.
    pub level: Vec<usize>,
    /// Memory buffers whose stores need barriers around them.
    pub barriers: Vec<BufferRef>,
    /// Per scratch buffer: its byte offset in a program's workspace slice,
    /// for memory scratch.
    pub workspace_offset: Vec<Option<u64>>,
    /// Bytes of one program's workspace slice.
    pub workspace_per_program: u64,
    /// Register scratch buffers that hold one value per row, repeated along
    /// their last dim (see [`lane_replicated`]): held as that column.
    pub replicated: Vec<usize>,
}

impl Plan {
    pub fn of(k: &Kernel) -> Plan {
        let loops: Vec<usize> = (0..k.grid.rank())
            .filter(|&d| k.grid.dims[d].semantics == DimSemantics::Arbitrary)
            .collect();
        let parallel: Vec<usize> = (0..k.grid.rank())
            .filter(|&d| k.grid.dims[d].semantics != DimSemantics::Arbitrary)
            .collect();
        let axes = program_axes(k, &parallel);
        let mut access: HashMap<BufferRef, Access> = HashMap::new();
        collect(k, &k.body.region, &mut access);
        let level: Vec<usize> = k
            .operands
            .iter()
            .map(|o| match o.space {
                MemorySpace::Any => 0,
                _ => o
                    .block
                    .index_map
                    .exprs
                    .iter()
                    .map(|e| level_of(e, &loops))
                    .max()
                    .unwrap_or(0),
            })
            .collect();
        let mut residency = HashMap::new();
        for (i, o) in k.operands.iter().enumerate() {
            let a = access.get(&BufferRef::Operand(i));
            let windowed = o.space == MemorySpace::Vmem;
            let fits = fits_registers(o.view_shape());
            let r = match (o.role, a) {
                _ if !windowed || !fits => Residency::Memory,
                (Role::In, Some(a)) if a.loads_whole && level[i] < loops.len() => {
                    Residency::Fetched
                }
                (Role::Out, Some(a)) if a.loads == 0 => Residency::Memory,
                (Role::Out | Role::InOut, Some(a)) if a.stores_whole && a.loads_static => {
                    Residency::Registers
                }
                _ => Residency::Memory,
            };
            residency.insert(BufferRef::Operand(i), r);
        }
        let mut workspace_offset = Vec::new();
        let mut per_program = 0u64;
        for (i, s) in k.scratch.iter().enumerate() {
            let a = access.get(&BufferRef::Scratch(i));
            let registers =
                fits_registers(&s.shape) && a.is_none_or(|a| a.stores_whole && a.loads_static);
            if registers {
                residency.insert(BufferRef::Scratch(i), Residency::Registers);
                workspace_offset.push(None);
            } else {
                residency.insert(BufferRef::Scratch(i), Residency::Memory);
                let bytes = s.shape.iter().product::<usize>() as u64 * s.dtype.bytes() as u64;
                workspace_offset.push(Some(per_program));
                per_program += bytes.div_ceil(WORKSPACE_ALIGN) * WORKSPACE_ALIGN;
            }
        }
        for i in 0..k.prefetch.len() {
            residency.insert(BufferRef::Prefetch(i), Residency::Memory);
        }
        let mut defs = HashMap::new();
        definitions(&k.body.region, &mut defs);
        let replicated = (0..k.scratch.len())
            .filter(|&i| {
                residency.get(&BufferRef::Scratch(i)) == Some(&Residency::Registers)
                    && lane_replicated(k, i, &defs)
            })
            .collect();
        let barriers = access
            .iter()
            .filter(|(b, a)| {
                residency.get(b) == Some(&Residency::Memory)
                    && a.stores > 0
                    && a.loads + a.stores > 1
            })
            .map(|(b, _)| *b)
            .collect();
        Plan {
            loops,
            parallel,
            axes,
            residency,
            level,
            barriers,
            workspace_offset,
            workspace_per_program: per_program,
            replicated,
        }
    }

    /// Where buffer `b` lives.
    pub fn residency(&self, b: BufferRef) -> Residency {
        self.residency.get(&b).copied().unwrap_or(Residency::Memory)
    }

    /// The program ids of the launch grid, `[x, y, z]`.
    pub fn launch_grid(&self, k: &Kernel) -> [u64; 3] {
        let bound = |d: usize| k.grid.dims[d].bound as u64;
        match &self.axes {
            Some(axes) => {
                let mut g = [1u64; 3];
                for (&d, &a) in self.parallel.iter().zip(axes) {
                    g[a] = bound(d);
                }
                g
            }
            None => [self.parallel.iter().map(|&d| bound(d)).product(), 1, 1],
        }
    }

    /// Number of programs.
    pub fn programs(&self, k: &Kernel) -> u64 {
        self.parallel
            .iter()
            .map(|&d| k.grid.dims[d].bound as u64)
            .product()
    }
}

/// CUDA's y and z grid dims hold at most this many programs.
const MAX_GRID_YZ: usize = 65_535;

fn program_axes(k: &Kernel, parallel: &[usize]) -> Option<Vec<usize>> {
    let n = parallel.len();
    if n > 3 {
        return None;
    }
    // The innermost parallel dim varies fastest: program id axis 0.
    let axes: Vec<usize> = (0..n).map(|i| n - 1 - i).collect();
    let fits = parallel
        .iter()
        .zip(&axes)
        .all(|(&d, &a)| a == 0 || k.grid.dims[d].bound <= MAX_GRID_YZ);
    fits.then_some(axes)
}

fn fits_registers(shape: &[usize]) -> bool {
    shape.iter().all(|d| d.is_power_of_two())
        && shape.iter().product::<usize>() <= REGISTER_ELEMENTS
}

/// The deepest loop level whose grid index `e` reads.
fn level_of(e: &IndexExpr, loops: &[usize]) -> usize {
    let mut level = 0;
    e.visit(&mut |n| {
        if let IndexExpr::Grid(d) = n
            && let Some(p) = loops.iter().position(|l| l == d)
        {
            level = level.max(p + 1);
        }
    });
    level
}

/// Whether `indices` cover the whole of a buffer of `shape`: full static
/// slices, and points only on unit dims.
pub(super) fn is_whole(indices: &[Index], shape: &[usize]) -> bool {
    indices.len() == shape.len()
        && indices.iter().zip(shape).all(|(i, &n)| match i {
            Index::Slice {
                start: IndexValue::Static(0),
                len,
            } => *len == n,
            Index::Point(IndexValue::Static(0)) => n == 1,
            _ => false,
        })
}

fn is_static(indices: &[Index]) -> bool {
    indices.iter().all(|i| {
        matches!(
            i,
            Index::Slice {
                start: IndexValue::Static(_),
                ..
            } | Index::Point(IndexValue::Static(_))
        )
    })
}

fn collect(k: &Kernel, r: &Region, access: &mut HashMap<BufferRef, Access>) {
    for op in &r.ops {
        match &op.kind {
            OpKind::Load {
                buffer, indices, ..
            } => {
                let shape = k.buffer(*buffer).map(|b| b.2.to_vec()).unwrap_or_default();
                let a = entry(access, *buffer);
                a.loads += 1;
                a.loads_whole &= is_whole(indices, &shape);
                a.loads_static &= is_static(indices);
            }
            OpKind::Store {
                buffer, indices, ..
            } => {
                let shape = k.buffer(*buffer).map(|b| b.2.to_vec()).unwrap_or_default();
                let a = entry(access, *buffer);
                a.stores += 1;
                a.stores_whole &= is_whole(indices, &shape);
            }
            _ => {}
        }
        for sub in op.kind.regions() {
            collect(k, sub, access);
        }
    }
}

fn entry(access: &mut HashMap<BufferRef, Access>, b: BufferRef) -> &mut Access {
    access.entry(b).or_insert(Access {
        loads: 0,
        stores: 0,
        loads_whole: true,
        loads_static: true,
        stores_whole: true,
    })
}

fn definitions<'a>(r: &'a Region, defs: &mut HashMap<kernel_ir::ValueId, &'a kernel_ir::Op>) {
    for op in &r.ops {
        for &v in &op.results {
            defs.insert(v, op);
        }
        for sub in op.kind.regions() {
            definitions(sub, defs);
        }
    }
}

/// Whether scratch `i` repeats one value per row along its last dim (a
/// TPU kernel's online-softmax state, lane-replicated so that Mosaic
/// broadcasts it for free): every store writes it whole, unmasked, with a
/// splat constant or a value broadcast along the last dim. A GPU keeps the
/// column alone (`[rows]` in registers instead of `[rows, 128]`), and a
/// max or min over the last dim of a load is the column itself.
fn lane_replicated(
    k: &Kernel,
    i: usize,
    defs: &HashMap<kernel_ir::ValueId, &kernel_ir::Op>,
) -> bool {
    let s = &k.scratch[i];
    if s.shape.last().is_none_or(|&l| l < 2) {
        return false;
    }
    let mut ok = true;
    let mut stores = 0;
    k.body.walk(&mut |op| {
        if let OpKind::Store {
            buffer: BufferRef::Scratch(j),
            value,
            mask,
            ..
        } = &op.kind
            && *j == i
        {
            stores += 1;
            let splat = match defs.get(value).map(|d| &d.kind) {
                Some(OpKind::Constant { .. }) => true,
                Some(OpKind::BroadcastInDim { x, dims, shape }) => {
                    let xs = &k.body.values[x.index()].shape;
                    let last = shape.len().saturating_sub(1);
                    match dims.iter().position(|&d| d == last) {
                        None => true,
                        Some(p) => xs.get(p) == Some(&1),
                    }
                }
                _ => false,
            };
            ok &= mask.is_none() && splat;
        }
    });
    ok && stores > 0
}
