//! The VMEM budget of a kernel: what its windows and scratch occupy.

use std::fmt;

use crate::ops::ShapeDisplay;
use crate::{DType, Kernel, MemorySpace, Target};

/// One line of a VMEM budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmemItem {
    /// Operand or scratch name.
    pub name: String,
    /// `in`, `out`, `inout` or `scratch`.
    pub kind: String,
    /// Element type.
    pub dtype: DType,
    /// Block (or scratch) shape.
    pub shape: Vec<usize>,
    /// Bytes of one copy, padded to native (sublane, lane) tiles.
    pub padded_bytes: u64,
    /// Number of copies: 2 for pipelined windows (double buffering), 4 for
    /// an in-out operand (its input and output windows), 1 for scratch.
    pub copies: u64,
}

impl VmemItem {
    /// Bytes in total.
    pub fn total(&self) -> u64 {
        self.padded_bytes.saturating_mul(self.copies)
    }
}

/// What a kernel's VMEM windows and scratch need against the scoped limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmemBudget {
    /// Target generation.
    pub target: Target,
    /// One line per VMEM operand and scratch buffer.
    pub items: Vec<VmemItem>,
    /// The scoped limit in force.
    pub limit: u64,
    /// True when the limit is the target's default (not set by the kernel).
    pub default_limit: bool,
}

impl VmemBudget {
    /// The budget of `kernel`.
    pub fn of(kernel: &Kernel) -> VmemBudget {
        let t = kernel.target;
        let mut items = Vec::new();
        for o in &kernel.operands {
            if o.space == MemorySpace::Vmem {
                let order = o.layout.minor_to_major_dims(o.shape.len());
                items.push(VmemItem {
                    name: o.name.clone(),
                    kind: o.role.to_string(),
                    dtype: o.dtype,
                    shape: o.block.shape.clone(),
                    padded_bytes: padded_bytes(
                        t,
                        o.dtype.tpu_memory_dtype(),
                        &o.block.shape,
                        order.as_deref(),
                    ),
                    // Pipelined windows are double-buffered unless the
                    // spec says otherwise; an in-out operand is both an
                    // input and an output window (the kernel takes it
                    // twice, as Pallas passes it).
                    copies: o.block.buffers.unwrap_or(2) as u64
                        * if o.role == crate::Role::InOut { 2 } else { 1 },
                });
            }
        }
        for s in &kernel.scratch {
            if s.space == MemorySpace::Vmem {
                items.push(VmemItem {
                    name: s.name.clone(),
                    // Scoped buffers live only in their scope; counting
                    // each as if all were live at once is an upper bound.
                    kind: if s.scoped { "scoped" } else { "scratch" }.into(),
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    padded_bytes: padded_bytes(t, s.dtype.tpu_memory_dtype(), &s.shape, None),
                    copies: 1,
                });
            }
        }
        items.push(VmemItem {
            name: "(compiler)".into(),
            kind: "internal".into(),
            dtype: DType::F32,
            shape: Vec::new(),
            padded_bytes: compiler_internal_bytes(kernel),
            copies: 1,
        });
        VmemBudget {
            target: t,
            items,
            limit: kernel.effective_vmem_limit(),
            default_limit: kernel.vmem_limit.is_none(),
        }
    }

    /// Bytes needed in total.
    pub fn total(&self) -> u64 {
        self.items
            .iter()
            .fold(0u64, |a, i| a.saturating_add(i.total()))
    }

    /// True when everything fits under the limit.
    pub fn fits(&self) -> bool {
        self.total() <= self.limit
    }
}

/// The vector register file of one TensorCore: 64 vregs of 8 x 128 words.
const VREG_FILE_BYTES: u64 = 64 * 8 * 128 * 4;

/// Headroom for the compiler's own small buffers (reductions' partial
/// results, values spilled around branches): measured at up to 36 KiB on
/// small kernels.
const COMPILER_HEADROOM_BYTES: u64 = 64 << 10;

/// VMEM the TPU compiler takes from the scoped limit for itself, measured
/// with libtpu (`tests/it/targets/tpu_compile.rs`): a matmul spills what does not
/// fit in the register file to VMEM, up to its result tile plus its lhs
/// tile (a transposed lhs is staged there), beyond the 256 KiB of vregs;
/// reductions and branches take a few KiB, covered by a fixed headroom.
/// An upper bound, not an exact count: the compiler often needs less (the
/// test prints the slack).
fn compiler_internal_bytes(kernel: &Kernel) -> u64 {
    fn walk(k: &Kernel, r: &crate::Region, spill: &mut u64) {
        for op in &r.ops {
            if let crate::OpKind::Dot { lhs, .. } = &op.kind {
                let tile = |v: crate::ValueId| {
                    k.body
                        .ty(v)
                        .map(|t| padded_bytes(k.target, t.dtype, &t.shape, None))
                        .unwrap_or(0)
                };
                let result = op.results.first().map_or(0, |&v| tile(v));
                let staged = result.saturating_add(tile(*lhs));
                *spill = spill.saturating_add(staged.saturating_sub(VREG_FILE_BYTES));
            }
            for inner in op.kind.regions() {
                walk(k, inner, spill);
            }
        }
    }
    let mut spill = 0u64;
    walk(kernel, &kernel.body.region, &mut spill);
    spill.saturating_add(COMPILER_HEADROOM_BYTES)
}

/// Bytes of a buffer in VMEM, with the two physically minor dims padded to
/// native tiles (sublanes × 128 lanes), as Mosaic lays them out.
fn padded_bytes(t: Target, dtype: DType, shape: &[usize], order: Option<&[usize]>) -> u64 {
    let rank = shape.len();
    let default: Vec<usize> = (0..rank).rev().collect();
    let order = order.unwrap_or(&default);
    let mut dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    if let Some(&minor) = order.first() {
        dims[minor] = dims[minor].div_ceil(t.tile_lanes() as u64) * t.tile_lanes() as u64;
    }
    if let Some(&second) = order.get(1) {
        let rows = t.tile_rows(dtype) as u64;
        dims[second] = dims[second].div_ceil(rows) * rows;
    }
    dims.iter()
        .fold(dtype.bytes() as u64, |a, &d| a.saturating_mul(d))
}

/// Formats a byte count with a binary unit.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl fmt::Display for VmemBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.fits() { "fits in" } else { "exceeds" };
        write!(
            f,
            "VMEM needed {} {} the scoped limit {} ({}{})",
            human_bytes(self.total()),
            verdict,
            human_bytes(self.limit),
            self.target,
            if self.default_limit {
                " default"
            } else {
                ", vmem_limit"
            }
        )?;
        for i in &self.items {
            write!(
                f,
                "\n  {:<10} {:<7} {:<4} {:<16} {} x {:>10} = {:>10}",
                i.name,
                i.kind,
                i.dtype.name(),
                ShapeDisplay(&i.shape).to_string(),
                i.copies,
                human_bytes(i.padded_bytes),
                human_bytes(i.total())
            )?;
        }
        if !self.fits() {
            write!(
                f,
                "\n  shrink the blocks, or raise vmem_limit (up to the {} VMEM of {})",
                self.target,
                human_bytes(self.target.vmem_bytes())
            )?;
        }
        Ok(())
    }
}
