//! The calling convention of the kernel function, shared by the module
//! builder (`kernel_module`), the body walk (`body`), the custom-call
//! wrapper (`custom_call`) and the host driver: which argument each
//! kernel buffer is ([`ArgLayout`]), what window it is seen through
//! ([`Window`]: shape, physical order, memory space), and how dtypes are
//! stored ([`memory_dtype`]).

use kernel_ir::{BufferRef, Kernel, MemorySpace, Operand, Role};

use crate::LoweringError;
use crate::mlir::Ir;

/// Which conventions the kernel module follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Upstream dialects only (target 1, and the host JIT).
    Upstream,
    /// Mosaic's conventions (target 2).
    Mosaic,
}

/// The element type a buffer of `dtype` has in memory. Mosaic takes no
/// `i1` memrefs: as Pallas does, a bool buffer is i32 in memory (the
/// wrapper converts at the call boundary), loads compare it with zero and
/// stores widen the bits.
pub(crate) fn memory_dtype(flavor: Flavor, dtype: kernel_ir::DType) -> kernel_ir::DType {
    match flavor {
        Flavor::Mosaic => dtype.tpu_memory_dtype(),
        Flavor::Upstream => dtype,
    }
}

/// How a kernel buffer appears to the kernel function.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    /// Shape of the memref, in the order the function sees.
    pub shape: Vec<usize>,
    /// For Mosaic: logical dim of each memref dim (physical order). Empty
    /// when the memref is in logical order.
    pub physical: Vec<usize>,
    /// Strides for a strided (upstream, non-row-major) memref.
    pub strides: Option<Vec<usize>>,
}

/// Major-to-minor physical order of an operand, when it differs from the
/// logical order (only the Mosaic flavor uses it).
pub(crate) fn physical_order(o: &Operand) -> Option<Vec<usize>> {
    let rank = o.shape.len();
    if o.layout.is_row_major(rank) {
        return None;
    }
    let mut m2m = o.layout.minor_to_major_dims(rank)?;
    m2m.reverse();
    Some(m2m)
}

/// The window an operand's kernel argument has.
pub(crate) fn window(o: &Operand, flavor: Flavor) -> Window {
    let view = o.view_shape().to_vec();
    match (flavor, physical_order(o)) {
        (Flavor::Mosaic, Some(p)) => Window {
            shape: p.iter().map(|&d| view[d]).collect(),
            physical: p,
            strides: None,
        },
        (Flavor::Upstream, Some(_)) => Window {
            strides: o.layout.strides(&view),
            shape: view,
            physical: Vec::new(),
        },
        _ => Window {
            shape: view,
            physical: Vec::new(),
            strides: None,
        },
    }
}

/// The position of each kernel buffer among the kernel function's
/// arguments: grid indices, scalar prefetch, inputs, outputs, scratch.
pub(crate) struct ArgLayout {
    pub grid: usize,
    pub prefetch: Vec<usize>,
    /// Argument read by loads of operand i.
    pub load: Vec<usize>,
    /// Argument written by stores to operand i.
    pub store: Vec<usize>,
    /// Argument of each scratch buffer (`usize::MAX` for scoped ones,
    /// which their scope allocates).
    pub scratch: Vec<usize>,
    /// Argument of each semaphore array (`usize::MAX` for scoped ones).
    pub semaphores: Vec<usize>,
    /// Operands in custom-call order: inputs (in, in-out), then outputs
    /// (out, in-out); an in-out operand appears twice.
    pub call_order: Vec<(usize, Role)>,
}

impl ArgLayout {
    pub fn of(k: &Kernel) -> ArgLayout {
        let grid = k.grid.rank();
        let mut next = grid;
        let prefetch = (0..k.prefetch.len()).map(|i| next + i).collect();
        next += k.prefetch.len();
        let mut load = vec![usize::MAX; k.operands.len()];
        let mut store = vec![usize::MAX; k.operands.len()];
        let mut call_order = Vec::new();
        for (i, o) in k.operands.iter().enumerate() {
            if o.role.is_input() {
                load[i] = next;
                call_order.push((i, Role::In));
                next += 1;
            }
        }
        for (i, o) in k.operands.iter().enumerate() {
            if o.role.is_output() {
                store[i] = next;
                if o.role == Role::Out {
                    load[i] = next;
                }
                call_order.push((i, Role::Out));
                next += 1;
            }
        }
        for (i, o) in k.operands.iter().enumerate() {
            if o.role == Role::In {
                store[i] = load[i];
            }
        }
        // Scratch, then semaphores, as Pallas orders scratch operands;
        // scoped ones are not arguments.
        let mut slot = |scoped: bool| {
            if scoped {
                usize::MAX
            } else {
                next += 1;
                next - 1
            }
        };
        let scratch = k.scratch.iter().map(|s| slot(s.scoped)).collect();
        let semaphores = k
            .semaphores
            .iter()
            .map(|s| slot(!is_semaphore_arg(s)))
            .collect();
        ArgLayout {
            grid,
            prefetch,
            load,
            store,
            scratch,
            semaphores,
            call_order,
        }
    }

    /// The argument a load (`write == false`) or store reaches.
    pub fn arg(&self, b: BufferRef, write: bool) -> usize {
        match b {
            BufferRef::Operand(i) if write => self.store[i],
            BufferRef::Operand(i) => self.load[i],
            BufferRef::Scratch(i) => self.scratch[i],
            BufferRef::Prefetch(i) => self.prefetch[i],
        }
    }
}

/// Whether a semaphore array is an argument of the kernel function: not
/// a scoped one (allocated by its scope) nor the barrier semaphore (the
/// chip's, fetched with `tpu.sem_barrier`).
pub(crate) fn is_semaphore_arg(s: &kernel_ir::SemaphoreDecl) -> bool {
    !s.scoped && s.kind != kernel_ir::SemaphoreKind::Barrier
}

/// Mosaic's memref of semaphores of `kind` with `shape`:
/// `memref<2x!tpu.dma_semaphore, #tpu.memory_space<semaphore_mem>>`.
pub(crate) fn semaphore_type<'c>(
    ir: &Ir<'c>,
    kind: kernel_ir::SemaphoreKind,
    shape: &[usize],
) -> melior::ir::Type<'c> {
    let name = match kind {
        kernel_ir::SemaphoreKind::Dma => "dma_semaphore",
        kernel_ir::SemaphoreKind::Regular | kernel_ir::SemaphoreKind::Barrier => "semaphore",
    };
    let elem = ir
        .parse_type(&format!("!tpu.{name}"))
        .unwrap_or_else(|_| ir.i32());
    let space = ir.parse_attr("#tpu.memory_space<semaphore_mem>").ok();
    ir.memref_of(elem, shape, space)
}

/// The memory-space attribute of a buffer in `flavor`.
pub(crate) fn memory_space<'c>(
    ir: &Ir<'c>,
    space: MemorySpace,
    flavor: Flavor,
) -> Result<Option<melior::ir::Attribute<'c>>, LoweringError> {
    Ok(match (flavor, space) {
        (Flavor::Mosaic, s) => Some(ir.parse_attr(&format!("#tpu.memory_space<{s}>"))?),
        (Flavor::Upstream, MemorySpace::Vmem) => Some(ir.i64_attr(1)),
        (Flavor::Upstream, MemorySpace::Smem) => Some(ir.i64_attr(2)),
        (Flavor::Upstream, MemorySpace::Any) => None,
    })
}
