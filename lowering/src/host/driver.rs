//! Runs a JIT-compiled host kernel's grid over host buffers.
//!
//! Each operand lives in row-major *storage* for the run: its logical dims
//! padded up to whole blocks (so every window is in bounds, as VMEM blocks
//! are on a TPU); an operand that needs no padding is used in place, with
//! no copy. A window is then a memref descriptor into that storage: offset
//! of the block, block shape, the storage's strides.
//!
//! Grid points that share their `parallel` indices form a group, which runs
//! in row-major order on one thread with that thread's scratch and
//! workspace; groups run on a pool of threads (the calling thread is one).
//! Scratch therefore carries across the `arbitrary` steps of a group, as
//! the kernel model promises. Scratch and workspace start zeroed; they are
//! kept between runs in a bounded [`BufferPool`] and zeroed again.

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

// SAFETY: an `AlignedBuf` owns its allocation outright; moving it to
// another thread moves that ownership.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// Zeroes the whole buffer again (for reuse: the pages are resident, so
    /// this is a memset, not the page faults of a fresh allocation).
    fn clear(&mut self) {
        // SAFETY: the buffer owns `layout.size()` bytes at `ptr`.
        unsafe { std::ptr::write_bytes(self.ptr, 0, self.layout.size()) }
    }
}

/// One grid worker's scratch buffers and workspace.
pub(crate) struct WorkerBuffers {
    scratch: Vec<AlignedBuf>,
    workspace: AlignedBuf,
}

/// Worker buffers kept between runs of one kernel, at most `cap` of them:
/// a fresh megabyte of workspace per worker per run cost its page faults
/// every time (4% of a 6 ms matmul here).
pub(crate) struct BufferPool {
    free: Mutex<Vec<WorkerBuffers>>,
    cap: usize,
}

impl BufferPool {
    /// An empty pool that keeps at most `cap` sets of buffers.
    pub fn new(cap: usize) -> BufferPool {
        BufferPool {
            free: Mutex::new(Vec::new()),
            cap,
        }
    }

    /// A set of zeroed buffers for `k`: a kept one cleared, or new ones.
    fn take(&self, k: &Kernel, workspace_bytes: usize) -> Result<WorkerBuffers, LoweringError> {
        let kept = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(mut b) = kept {
            b.scratch.iter_mut().for_each(AlignedBuf::clear);
            b.workspace.clear();
            return Ok(b);
        }
        let scratch = k
            .scratch
            .iter()
            .map(|s| {
                let bytes = s.shape.iter().product::<usize>() * super::mem_bytes(s.dtype);
                AlignedBuf::zeroed(bytes)
            })
            .collect::<Result<_, _>>()?;
        Ok(WorkerBuffers {
            scratch,
            workspace: AlignedBuf::zeroed(workspace_bytes)?,
        })
    }

    /// Keeps `b` for a later run, unless `cap` sets are kept already.
    fn give(&self, b: WorkerBuffers) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.cap {
            free.push(b);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// How one operand is stored while the kernel runs: row-major, padded up
/// to whole blocks. Layout hints (column-major, alignment) are the TPU's
/// business; here a column-major copy would cost a transpose of the whole
/// array per run, while the JIT's dots read either order at full speed
/// (the rhs packer transposes 16 × 16 tiles in registers).
#[derive(Clone, Debug)]
pub(crate) struct Storage {
    /// Logical dims padded up to whole blocks (or, for element windows,
    /// the part of the padded array the run touches).
    pub padded: Vec<usize>,
    /// Where the array's first element sits in the storage along each dim
    /// (the low padding the storage keeps, else 0).
    pub origin: Vec<usize>,
    /// Element strides of each logical dim in the storage (row-major).
    pub strides: Vec<usize>,
    /// The caller's row-major buffer is the storage (no copy).
    pub in_place: bool,
    /// Bytes per element.
    pub elem: usize,
}

impl Storage {
    pub fn of(k: &Kernel, i: usize) -> Storage {
        let o = &k.operands[i];
        let zeros = vec![0; o.shape.len()];
        let (padded, origin): (Vec<usize>, Vec<usize>) = match &o.block.element {
            _ if o.space == MemorySpace::Any => (o.shape.clone(), zeros),
            // The verifier keeps every window inside the padded array; of
            // it, only the part the run touches is stored.
            Some(pad) => match k.element_reach(i) {
                Some(reach) => (
                    reach.iter().map(|(lo, hi)| hi - lo).collect(),
                    (0..o.shape.len())
                        .map(|d| pad.low[d] - reach[d].0)
                        .collect(),
                ),
                None => (
                    (0..o.shape.len())
                        .map(|d| pad.low[d] + o.shape[d] + pad.high[d])
                        .collect(),
                    pad.low.clone(),
                ),
            },
            None => (
                o.shape
                    .iter()
                    .zip(&o.block.shape)
                    .map(|(&n, &b)| n.div_ceil(b.max(1)) * b)
                    .collect(),
                zeros,
            ),
        };
        let strides = row_major(&padded);
        Storage {
            in_place: padded == o.shape,
            origin,
            padded,
            strides,
            elem: o.dtype.bytes(),
        }
    }

    /// Elements from the storage's start to the array's first element.
    fn origin_offset(&self) -> usize {
        self.origin
            .iter()
            .zip(&self.strides)
            .map(|(o, s)| o * s)
            .sum()
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

/// Copies an array of `shape` between two row-major layouts of different
/// padding (element strides, unit on the last dim), `elem` bytes per
/// element, row by row.
///
/// # Safety
/// Both pointers must be valid for every element the shape and strides
/// address.
unsafe fn copy_padded(
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
    debug_assert!(src_strides[last] == 1 && dst_strides[last] == 1);
    let rows: usize = shape[..last].iter().product();
    let mut idx = vec![0usize; last];
    for _ in 0..rows {
        let so: usize = idx.iter().zip(src_strides).map(|(i, s)| i * s).sum();
        let dof: usize = idx.iter().zip(dst_strides).map(|(i, s)| i * s).sum();
        // SAFETY: offsets stay inside both arrays per the caller.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.add(so * elem),
                dst.add(dof * elem),
                shape[last] * elem,
            );
        }
        for d in (0..last).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
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
    pub pool: &'a BufferPool,
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
                    // storage holds the padded one, the array from
                    // `origin` on.
                    unsafe {
                        let at = buf.ptr().add(st.origin_offset() * st.elem);
                        copy_padded(src, &logical, at, &st.strides, &o.shape, st.elem)
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
        // The calling thread is one of the workers: one spawn fewer, and
        // its caches are warm with the inputs it just prepared.
        std::thread::scope(|s| {
            for _ in 1..threads {
                s.spawn(worker);
            }
            worker();
        });
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
                    copy_padded(
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
        let bufs = self.pool.take(k, self.workspace_bytes)?;
        let result = self.run_groups(groups, next, failed, base, prefetch, &bufs);
        self.pool.give(bufs);
        result
    }

    /// The body of [`Program::worker`], with its buffers.
    fn run_groups(
        &self,
        groups: &[Vec<Vec<i64>>],
        next: &AtomicUsize,
        failed: &AtomicBool,
        base: &[SharedPtr],
        prefetch: &[SharedPtr],
        bufs: &WorkerBuffers,
    ) -> Result<(), LoweringError> {
        let k = self.kernel;
        let (scratch, workspace) = (&bufs.scratch, &bufs.workspace);
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
            desc(&mut vals, &mut at, base[i].0, o.view_shape(), &st.strides);
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
                    let offset: usize = o
                        .block
                        .window_start(&bidx)
                        .iter()
                        .zip(&st.origin)
                        .zip(&st.strides)
                        .map(|((&w, &origin), &stride)| (w + origin as i64) as usize * stride)
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
    use kernel_ir::prelude::*;

    fn with_scratch() -> Kernel {
        let mut k = KernelBuilder::new("pooled");
        k.grid([1], [Arbitrary]);
        let x = k.input("x", F32, [8, 128]).block([8, 128], |[i]| (i, 0));
        let o = k.output("o", F32, [8, 128]).block([8, 128], |[i]| (i, 0));
        let s = k.scratch("s", F32, [8, 128]);
        s.store(.., x.load(..));
        o.store(.., s.load(..));
        (*k.build().unwrap()).clone()
    }

    /// Reused buffers come back zeroed (scratch semaphores rely on it),
    /// and the pool keeps no more than its cap.
    #[test]
    fn pooled_buffers_are_zeroed_and_bounded() {
        let k = with_scratch();
        let pool = BufferPool::new(2);
        let mut sets: Vec<WorkerBuffers> = (0..3).map(|_| pool.take(&k, 4096).unwrap()).collect();
        for b in &mut sets {
            // SAFETY: each buffer owns at least `layout.size()` bytes.
            unsafe {
                std::ptr::write_bytes(b.workspace.ptr(), 0xAB, b.workspace.layout.size());
                for s in &b.scratch {
                    std::ptr::write_bytes(s.ptr(), 0xCD, s.layout.size());
                }
            }
        }
        for b in sets {
            pool.give(b);
        }
        assert_eq!(
            pool.free.lock().unwrap().len(),
            2,
            "the cap bounds the pool"
        );
        for _ in 0..3 {
            let b = pool.take(&k, 4096).unwrap();
            // SAFETY: as above, reading initialized bytes.
            let zero = |buf: &AlignedBuf| unsafe {
                std::slice::from_raw_parts(buf.ptr(), buf.layout.size())
                    .iter()
                    .all(|&x| x == 0)
            };
            assert!(zero(&b.workspace) && b.scratch.iter().all(zero));
            assert_eq!(b.scratch.len(), 1);
        }
    }
}
