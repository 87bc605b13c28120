//! Runs a JIT-compiled host kernel's grid over host buffers.
//!
//! Each operand lives in *physical storage* for the run: its logical dims
//! padded up to whole blocks (so every window is in bounds, as VMEM blocks
//! are on a TPU) and laid out as its layout hint says. A row-major operand
//! that needs no padding is used in place, with no copy. A window is then a
//! memref descriptor into that storage: offset of the block, block shape,
//! the storage's strides.
//!
//! Grid points that share their `parallel` indices form a group, which runs
//! in row-major order on one thread with that thread's scratch and
//! workspace; groups run on a pool of threads. Scratch therefore carries
//! across the `arbitrary` steps of a group, as the kernel model promises.

use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kernel_ir::{IndexEvalError, Kernel, MemorySpace, Role};

use super::jit::Engine;
use crate::LoweringError;

/// A zeroed, 64-byte aligned heap buffer.
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl AlignedBuf {
    pub fn zeroed(bytes: usize) -> Result<AlignedBuf, LoweringError> {
        let layout = Layout::from_size_align(bytes.max(64), 64)
            .map_err(|e| LoweringError::Run(format!("cannot allocate {bytes} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(LoweringError::Run(format!(
                "out of memory allocating {bytes} bytes of kernel storage"
            )));
        }
        Ok(AlignedBuf { ptr, layout })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// How one operand is stored while the kernel runs.
#[derive(Clone, Debug)]
pub(crate) struct Storage {
    /// Logical dims padded up to whole blocks.
    pub padded: Vec<usize>,
    /// Element strides of each logical dim in the storage.
    pub strides: Vec<usize>,
    /// The caller's row-major buffer is the storage (no copy).
    pub in_place: bool,
    /// Bytes per element.
    pub elem: usize,
    /// Logical dims in physical major-to-minor order, when not row-major
    /// (the window memref is in this order).
    pub order: Option<Vec<usize>>,
}

impl Storage {
    pub fn of(k: &Kernel, i: usize) -> Storage {
        let o = &k.operands[i];
        let padded: Vec<usize> = if o.space == MemorySpace::Any {
            o.shape.clone()
        } else {
            o.shape
                .iter()
                .zip(&o.block.shape)
                .map(|(&n, &b)| n.div_ceil(b.max(1)) * b)
                .collect()
        };
        let strides = o
            .layout
            .strides(&padded)
            .unwrap_or_else(|| row_major(&padded));
        let in_place = padded == o.shape && strides == row_major(&padded);
        Storage {
            padded,
            strides,
            in_place,
            elem: o.dtype.bytes(),
            order: crate::convention::physical_order(o),
        }
    }

    fn bytes(&self) -> usize {
        self.padded.iter().product::<usize>() * self.elem
    }
}

/// Writes a memref descriptor (allocated and aligned pointer, offset 0,
/// sizes, strides) at slot `*at` and moves past it.
fn desc(vals: &mut [u64], at: &mut usize, ptr: *mut u8, sizes: &[usize], strides: &[usize]) {
    vals[*at] = ptr as u64;
    vals[*at + 1] = ptr as u64;
    vals[*at + 2] = 0;
    for (j, &s) in sizes.iter().enumerate() {
        vals[*at + 3 + j] = s as u64;
    }
    for (j, &s) in strides.iter().enumerate() {
        vals[*at + 3 + sizes.len() + j] = s as u64;
    }
    *at += 3 + 2 * sizes.len();
}

/// Element strides of a row-major array.
pub(crate) fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Copies one element of `elem` bytes.
///
/// # Safety
/// Both pointers must be valid for `elem` bytes.
#[inline(always)]
unsafe fn copy_elem(s: *const u8, d: *mut u8, elem: usize) {
    // SAFETY: valid per the caller; unaligned accesses because storage
    // offsets are element-aligned only.
    unsafe {
        match elem {
            4 => d
                .cast::<u32>()
                .write_unaligned(s.cast::<u32>().read_unaligned()),
            2 => d
                .cast::<u16>()
                .write_unaligned(s.cast::<u16>().read_unaligned()),
            1 => *d = *s,
            8 => d
                .cast::<u64>()
                .write_unaligned(s.cast::<u64>().read_unaligned()),
            _ => std::ptr::copy_nonoverlapping(s, d, elem),
        }
    }
}

/// Side of the square tiles a transposing copy moves at a time: 32 rows of
/// 32 elements touch 32 cache lines on each side, which stay in L1.
const TRANSPOSE_TILE: usize = 32;

/// Copies an array of `shape` between two strided layouts (element
/// strides), `elem` bytes per element. Rows with unit stride on both sides
/// are copied whole; a copy that changes which dim has unit stride (a
/// column-major layout) goes tile by tile, so that neither side walks a
/// large stride element after element.
///
/// # Safety
/// Both pointers must be valid for every element the shape and strides
/// address.
unsafe fn copy_strided(
    src: *const u8,
    src_strides: &[usize],
    dst: *mut u8,
    dst_strides: &[usize],
    shape: &[usize],
    elem: usize,
) {
    let rank = shape.len();
    if rank == 0 {
        // SAFETY: one element, valid per the caller.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, elem) };
        return;
    }
    if shape.contains(&0) {
        return;
    }
    let last = rank - 1;
    let (ss, ds) = (src_strides, dst_strides);
    let rows_whole = ss[last] == 1 && ds[last] == 1;
    // The dim that has unit stride on the side where `last` does not.
    let partner = (!rows_whole)
        .then(|| {
            (0..last).find(|&d| (ss[last] == 1 && ds[d] == 1) || (ds[last] == 1 && ss[d] == 1))
        })
        .flatten();
    let outer: Vec<usize> = (0..last).filter(|&d| Some(d) != partner).collect();
    let count: usize = outer.iter().map(|&d| shape[d]).product();
    let mut idx = vec![0usize; outer.len()];
    for _ in 0..count {
        let so: usize = idx.iter().zip(&outer).map(|(i, &d)| i * ss[d]).sum();
        let dof: usize = idx.iter().zip(&outer).map(|(i, &d)| i * ds[d]).sum();
        // SAFETY: offsets stay inside both arrays per the caller.
        unsafe {
            let s = src.add(so * elem);
            let d = dst.add(dof * elem);
            match partner {
                _ if rows_whole => std::ptr::copy_nonoverlapping(s, d, shape[last] * elem),
                Some(p) => {
                    for r0 in (0..shape[p]).step_by(TRANSPOSE_TILE) {
                        for c0 in (0..shape[last]).step_by(TRANSPOSE_TILE) {
                            for r in r0..(r0 + TRANSPOSE_TILE).min(shape[p]) {
                                for c in c0..(c0 + TRANSPOSE_TILE).min(shape[last]) {
                                    copy_elem(
                                        s.add((r * ss[p] + c * ss[last]) * elem),
                                        d.add((r * ds[p] + c * ds[last]) * elem),
                                        elem,
                                    );
                                }
                            }
                        }
                    }
                }
                None => {
                    for j in 0..shape[last] {
                        copy_elem(s.add(j * ss[last] * elem), d.add(j * ds[last] * elem), elem);
                    }
                }
            }
        }
        for k in (0..outer.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[outer[k]] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// A pointer that may cross threads: the storage it points into outlives
/// the scoped threads, and correct kernels write disjoint blocks from
/// different parallel groups.
#[derive(Clone, Copy)]
struct SharedPtr(*mut u8);
// SAFETY: see the type's doc.
unsafe impl Send for SharedPtr {}
// SAFETY: see the type's doc.
unsafe impl Sync for SharedPtr {}

/// What the driver needs of a compiled kernel.
pub(crate) struct Program<'a> {
    pub kernel: &'a Kernel,
    pub engine: &'a Engine,
    pub storage: &'a [Storage],
    pub workspace_bytes: usize,
    pub threads: usize,
}

/// Positions of the packed arguments.
struct ArgSlots {
    grid: Vec<usize>,
    /// First slot of each operand's descriptor (its offset slot is +2).
    operands: Vec<usize>,
    total: usize,
}

impl Program<'_> {
    /// Runs the kernel. `prefetch[i]` points at scalar-prefetch array i
    /// (row-major i32), `inputs` at the caller's input arrays (in and
    /// in-out operands, in operand order), `outputs` at the caller's output
    /// arrays (out and in-out operands, in operand order), all row-major and
    /// of the kernel's shapes and dtypes.
    ///
    /// # Safety
    /// Every pointer must be valid for its whole array (outputs writable),
    /// and no output may overlap another array except an in-out operand's
    /// input and output, which may be the same buffer.
    pub unsafe fn run(
        &self,
        prefetch: &[*const u8],
        inputs: &[*const u8],
        outputs: &[*mut u8],
    ) -> Result<(), LoweringError> {
        let k = self.kernel;
        // Storage for every operand: the caller's buffer or a padded copy.
        let mut owned: Vec<AlignedBuf> = Vec::new();
        let mut base: Vec<SharedPtr> = Vec::with_capacity(k.operands.len());
        let (mut ni, mut no) = (0, 0);
        for (i, o) in k.operands.iter().enumerate() {
            let st = &self.storage[i];
            let input = o.role.is_input().then(|| {
                ni += 1;
                inputs[ni - 1]
            });
            let output = o.role.is_output().then(|| {
                no += 1;
                outputs[no - 1]
            });
            let logical = row_major(&o.shape);
            let ptr = if st.in_place {
                match (o.role, input, output) {
                    (Role::In, Some(src), _) => src as *mut u8,
                    (Role::InOut, Some(src), Some(dst)) => {
                        if !std::ptr::eq(src, dst) {
                            // SAFETY: both hold the whole array; they do not
                            // overlap unless identical (checked).
                            unsafe {
                                std::ptr::copy_nonoverlapping(src, dst, st.bytes());
                            }
                        }
                        dst
                    }
                    (_, _, Some(dst)) => dst,
                    _ => return Err(LoweringError::Internal("operand without buffer".into())),
                }
            } else {
                let buf = AlignedBuf::zeroed(st.bytes())?;
                if let Some(src) = input {
                    // SAFETY: the source holds the logical array; the
                    // storage holds the padded one.
                    unsafe {
                        copy_strided(src, &logical, buf.ptr(), &st.strides, &o.shape, st.elem)
                    };
                }
                let p = buf.ptr();
                owned.push(buf);
                p
            };
            base.push(SharedPtr(ptr));
        }

        let groups = self.groups();
        let threads = self.threads.clamp(1, groups.len().max(1));
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let error: Mutex<Option<LoweringError>> = Mutex::new(None);
        let prefetch: Vec<SharedPtr> = prefetch.iter().map(|&p| SharedPtr(p as *mut u8)).collect();
        let worker = || {
            if let Err(e) = self.worker(&groups, &next, &failed, &base, &prefetch) {
                failed.store(true, Ordering::Relaxed);
                let mut slot = error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(e);
            }
        };
        if threads == 1 {
            worker();
        } else {
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(worker);
                }
            });
        }
        if let Some(e) = error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }

        // Copy padded or re-laid-out outputs back.
        let mut no = 0;
        for (i, o) in k.operands.iter().enumerate() {
            if !o.role.is_output() {
                continue;
            }
            let dst = outputs[no];
            no += 1;
            let st = &self.storage[i];
            if !st.in_place {
                // SAFETY: storage and destination hold their arrays.
                unsafe {
                    copy_strided(
                        base[i].0,
                        &st.strides,
                        dst,
                        &row_major(&o.shape),
                        &o.shape,
                        st.elem,
                    )
                };
            }
        }
        drop(owned);
        Ok(())
    }

    /// Grid points grouped by their parallel indices, each group in
    /// row-major order.
    fn groups(&self) -> Vec<Vec<Vec<i64>>> {
        let k = self.kernel;
        let parallel: Vec<usize> = (0..k.grid.rank())
            .filter(|&d| k.grid.dims[d].semantics.is_parallel())
            .collect();
        let mut index: std::collections::HashMap<Vec<i64>, usize> = Default::default();
        let mut groups: Vec<Vec<Vec<i64>>> = Vec::new();
        for p in k.grid.points() {
            let key: Vec<i64> = parallel.iter().map(|&d| p[d]).collect();
            let g = *index.entry(key).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(p);
        }
        groups
    }

    fn slots(&self) -> ArgSlots {
        let k = self.kernel;
        let mut n = 0;
        let grid: Vec<usize> = (0..k.grid.rank()).collect();
        n += k.grid.rank();
        for p in &k.prefetch {
            n += 3 + 2 * p.shape.len();
        }
        let mut operands = Vec::new();
        for o in &k.operands {
            operands.push(n);
            n += 3 + 2 * o.shape.len();
        }
        for s in &k.scratch {
            n += 3 + 2 * s.shape.len();
        }
        n += 5;
        ArgSlots {
            grid,
            operands,
            total: n,
        }
    }

    /// One thread: takes groups until none are left, runs their points.
    fn worker(
        &self,
        groups: &[Vec<Vec<i64>>],
        next: &AtomicUsize,
        failed: &AtomicBool,
        base: &[SharedPtr],
        prefetch: &[SharedPtr],
    ) -> Result<(), LoweringError> {
        let k = self.kernel;
        let scratch: Vec<AlignedBuf> = k
            .scratch
            .iter()
            .map(|s| {
                let bytes = s.shape.iter().product::<usize>() * super::mem_bytes(s.dtype);
                AlignedBuf::zeroed(bytes)
            })
            .collect::<Result<_, _>>()?;
        let workspace = AlignedBuf::zeroed(self.workspace_bytes)?;
        let slots = self.slots();
        let mut vals = vec![0u64; slots.total];
        // Fill everything that does not change between points.
        let mut at = k.grid.rank();
        for (i, p) in k.prefetch.iter().enumerate() {
            desc(
                &mut vals,
                &mut at,
                prefetch[i].0,
                &p.shape,
                &row_major(&p.shape),
            );
        }
        for (i, o) in k.operands.iter().enumerate() {
            let st = &self.storage[i];
            let view = o.view_shape();
            let (sizes, strides): (Vec<usize>, Vec<usize>) = match &st.order {
                Some(order) => order.iter().map(|&d| (view[d], st.strides[d])).unzip(),
                None => (view.to_vec(), st.strides.clone()),
            };
            desc(&mut vals, &mut at, base[i].0, &sizes, &strides);
        }
        for (i, s) in k.scratch.iter().enumerate() {
            desc(
                &mut vals,
                &mut at,
                scratch[i].ptr(),
                &s.shape,
                &row_major(&s.shape),
            );
        }
        desc(
            &mut vals,
            &mut at,
            workspace.ptr(),
            &[self.workspace_bytes.max(64)],
            &[1],
        );
        // From here on the slots are written only through `vp`, the pointer
        // the packed arguments are derived from.
        let vp = vals.as_mut_ptr();
        // SAFETY: every index is inside `vals`.
        let mut args: Vec<*mut c_void> = (0..slots.total)
            .map(|i| unsafe { vp.add(i) } as *mut c_void)
            .collect();
        let read = |p: usize, idx: &[i64]| -> Result<i64, IndexEvalError> {
            let spec = k
                .prefetch
                .get(p)
                .ok_or_else(|| IndexEvalError::Prefetch(format!("no scalar prefetch {p}")))?;
            let strides = row_major(&spec.shape);
            let mut flat = 0usize;
            for (d, (&i, &n)) in idx.iter().zip(&spec.shape).enumerate() {
                if i < 0 || i as usize >= n {
                    return Err(IndexEvalError::Prefetch(format!(
                        "`{}` index {i} in dim {d} is outside 0..{n}",
                        spec.name
                    )));
                }
                flat += i as usize * strides[d];
            }
            // SAFETY: `flat` is inside the prefetch array (checked above),
            // which the caller keeps valid for the run.
            let v = unsafe { (prefetch[p].0 as *const i32).add(flat).read_unaligned() };
            Ok(v as i64)
        };
        loop {
            if failed.load(Ordering::Relaxed) {
                return Ok(());
            }
            let g = next.fetch_add(1, Ordering::Relaxed);
            let Some(points) = groups.get(g) else {
                return Ok(());
            };
            for point in points {
                for (d, &slot) in slots.grid.iter().enumerate() {
                    // An i32 in the low half of a little-endian u64 slot.
                    // SAFETY: `slot` is inside `vals`.
                    unsafe { *vp.add(slot) = point[d] as i32 as u32 as u64 };
                }
                for (i, o) in k.operands.iter().enumerate() {
                    if o.space == MemorySpace::Any {
                        continue;
                    }
                    let bidx = k
                        .block_index(i, point, &read)
                        .map_err(|e| LoweringError::BlockIndex(Box::new(e)))?;
                    let st = &self.storage[i];
                    let offset: usize = bidx
                        .iter()
                        .zip(&o.block.shape)
                        .zip(&st.strides)
                        .map(|((&b, &s), &stride)| b as usize * s * stride)
                        .sum();
                    // SAFETY: the offset slot is inside `vals`.
                    unsafe { *vp.add(slots.operands[i] + 2) = offset as u64 };
                }
                // SAFETY: the descriptors describe live storage (operand
                // windows are in bounds: block indices were checked and the
                // storage is padded to whole blocks), scratch and workspace
                // are this thread's own.
                unsafe { self.engine.call(&mut args) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element strides of a layout that stores `shape`'s dims in `order`
    /// (major to minor).
    fn strides_in(shape: &[usize], order: &[usize]) -> Vec<usize> {
        let mut s = vec![0; shape.len()];
        let mut step = 1;
        for &d in order.iter().rev() {
            s[d] = step;
            step *= shape[d];
        }
        s
    }

    /// Every element of a row-major `shape` copied to every dim order, with
    /// elements of 1, 2, 4 and 8 bytes, lands where the strides say, and
    /// the copy back restores the source.
    #[test]
    fn strided_copies_move_every_element_to_its_place() {
        let shapes: [&[usize]; 6] = [
            &[70, 45],
            &[3, 33, 65],
            &[1, 2, 40, 3],
            &[5],
            &[2, 0, 3],
            &[32, 32],
        ];
        for shape in shapes {
            let n: usize = shape.iter().product();
            let rm = row_major(shape);
            let mut orders: Vec<Vec<usize>> = vec![(0..shape.len()).collect()];
            orders.push((0..shape.len()).rev().collect());
            if shape.len() > 2 {
                let mut o: Vec<usize> = (0..shape.len()).collect();
                o.swap(shape.len() - 1, 1);
                orders.push(o);
            }
            for order in &orders {
                let ds = strides_in(shape, order);
                for elem in [1usize, 2, 4, 8] {
                    let src: Vec<u8> = (0..n * elem).map(|i| (i * 7 + i / 251) as u8).collect();
                    let mut dst = vec![0u8; n * elem];
                    // SAFETY: both buffers hold n elements of elem bytes.
                    unsafe { copy_strided(src.as_ptr(), &rm, dst.as_mut_ptr(), &ds, shape, elem) };
                    let mut idx = vec![0usize; shape.len()];
                    for _ in 0..n {
                        let so: usize = idx.iter().zip(&rm).map(|(i, s)| i * s).sum();
                        let dof: usize = idx.iter().zip(&ds).map(|(i, s)| i * s).sum();
                        assert_eq!(
                            src[so * elem..(so + 1) * elem],
                            dst[dof * elem..(dof + 1) * elem],
                            "shape {shape:?} order {order:?} elem {elem} at {idx:?}"
                        );
                        for d in (0..shape.len()).rev() {
                            idx[d] += 1;
                            if idx[d] < shape[d] {
                                break;
                            }
                            idx[d] = 0;
                        }
                    }
                    let mut back = vec![0u8; n * elem];
                    // SAFETY: as above.
                    unsafe { copy_strided(dst.as_ptr(), &ds, back.as_mut_ptr(), &rm, shape, elem) };
                    assert_eq!(back, src, "round trip, shape {shape:?} order {order:?}");
                }
            }
        }
    }
}
