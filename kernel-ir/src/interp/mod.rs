//! The reference interpreter: what a kernel means, checked as it runs.
//!
//! It runs the grid in row-major order on host arrays, honouring block
//! specs, index maps, scalar prefetch, masks and scratch that persists
//! across steps, and it checks what hardware would not:
//!
//! * a block index outside the array is an error naming the operand, grid
//!   index and block index;
//! * scratch starts unwritten, and is reset to unwritten whenever a parallel
//!   grid index changes (that step may run on another core); reading an
//!   unwritten scratch or output element is an error;
//! * elements of a partial last block that lie past the end of the array
//!   read as *poison*, which propagates through arithmetic; poison that
//!   reaches an output element, a branch, a loop bound or an index is an
//!   error, poison written to the padding is dropped as on hardware;
//! * output elements never written are reported;
//! * copies and semaphores are checked for the races and hangs hardware
//!   hides (see the `dma` module): a copy's destination touched before
//!   its wait, a wait with nothing in flight, copies in flight or
//!   semaphores not at zero at the end; [`InterpOptions::dma_seed`] lets
//!   waits retire copies that share a semaphore in a random order;
//! * [`InterpOptions::shuffle_seed`] runs the parallel part of the grid in a
//!   shuffled order to expose hidden dependences between parallel steps.
//!
//! Arithmetic is exact in f64 and rounded to the result dtype after every
//! op, so results are those of a correctly rounded implementation.
//!
//! A copy reads its source at `dma_start` and writes its destination when a
//! `dma_wait` retires it; each race or hang is a `[dma-race]` error at the
//! offending op's line. A wait retires the copy it describes (else the
//! oldest of its size on the semaphore).

mod dma;
mod eval;
mod math;
mod mesh;
mod remote;
mod value;

use crate::array::SplitMix64;
use crate::error::{ErrorKind, KernelError};
use crate::verify::VerifiedKernel;
use crate::{Array, Kernel, MemorySpace, Role};

/// What a device's machine knows of the mesh.
#[derive(Clone, Copy)]
pub(crate) struct Link<'a> {
    /// This device's logical id.
    pub device: usize,
    /// Devices in the mesh.
    pub devices: usize,
    pub net: &'a mesh::Network,
}

/// Options of [`interpret_with`].
#[derive(Clone, Debug)]
pub struct InterpOptions {
    /// Run the parallel grid dims in an order shuffled with this seed
    /// (arbitrary dims keep their order within each parallel index).
    pub shuffle_seed: Option<u64>,
    /// Most iterations one `for` op may run.
    pub max_loop_trips: u64,
    /// Most grid steps a run may have.
    pub max_grid_steps: u64,
    /// Let each DMA wait retire a random copy of its size among those in
    /// flight on its semaphore (seeded), instead of the copy it describes:
    /// exposes copies that share a semaphore and are used before their
    /// own wait.
    pub dma_seed: Option<u64>,
    /// For a kernel across a mesh ([`interpret_mesh`]): the seed of the
    /// interleaving of its devices and of the order remote copies arrive
    /// in. Each seed is one replayable schedule; run several to look for
    /// races that depend on timing.
    pub mesh_seed: u64,
}

impl Default for InterpOptions {
    fn default() -> Self {
        InterpOptions {
            shuffle_seed: None,
            max_loop_trips: crate::limits::MAX_LOOP_TRIPS,
            max_grid_steps: crate::limits::MAX_INTERP_STEPS,
            dma_seed: None,
            mesh_seed: 0,
        }
    }
}

/// Element states of a buffer.
pub(crate) const UNWRITTEN: u8 = 0;
pub(crate) const DEFINED: u8 = 1;
pub(crate) const POISON: u8 = 2;

/// A buffer the kernel can touch, with per-element definedness.
pub(crate) struct Buf {
    pub name: String,
    /// `input`, `output`, `scratch` or `scalar prefetch`.
    pub what: &'static str,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub data: Vec<f64>,
    pub state: Vec<u8>,
}

impl Buf {
    fn new(name: &str, what: &'static str, shape: &[usize], data: Vec<f64>, state: u8) -> Buf {
        let mut strides = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let n = data.len();
        Buf {
            name: name.to_string(),
            what,
            shape: shape.to_vec(),
            strides,
            data,
            state: vec![state; n],
        }
    }
}

/// Runs a kernel with default options. `args` are the scalar-prefetch
/// arrays, then the input arrays (in and in-out operands) in declaration
/// order; the result holds the output arrays (out and in-out operands) in
/// declaration order.
pub fn interpret(kernel: &VerifiedKernel, args: &[Array]) -> Result<Vec<Array>, KernelError> {
    interpret_with(kernel, args, &InterpOptions::default())
}

/// Runs a kernel with options; see [`interpret`].
pub fn interpret_with(
    kernel: &VerifiedKernel,
    args: &[Array],
    opts: &InterpOptions,
) -> Result<Vec<Array>, KernelError> {
    run(kernel, args, opts, None)
}

/// Why a kernel across the devices of `mesh` does not run on a
/// single-device path.
pub fn single_device_only(kernel: &str, mesh: &crate::Mesh) -> String {
    format!(
        "kernel `{kernel}` runs on the {} devices of its mesh; this path runs one device: run it on every device with `tessera run FILE.kir --backend interp` (or `pjrt`: its SPMD program on CPU devices; in Rust `kernel_ir::interpret_mesh`, `runtime::across_devices::PreparedMesh`), and for TPU lower it with `--target mosaic`",
        mesh.devices()
    )
}

/// One block copy into VMEM that a pipelined TPU grid makes: the block
/// index of an operand changed from the previous grid step (or this is
/// the first step), so the block is fetched for this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockFetch {
    /// The operand's name.
    pub operand: String,
    /// The grid step that needs the block.
    pub point: Vec<i64>,
    /// Its block index.
    pub block: Vec<i64>,
}

/// The block fetches of a run, in grid order: what a kernel costs in
/// HBM traffic, and the check that steps a kernel skips fetch nothing new
/// (their index maps re-use a block some computed step needs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchTrace {
    /// Every fetch of every input (and in-out) operand with a block spec.
    pub fetches: Vec<BlockFetch>,
    /// Every write-back of every output block: when an output's block
    /// index changes between steps (the block of the step before goes to
    /// HBM) and at the end (`point` is the last step that wrote it).
    pub writebacks: Vec<BlockFetch>,
    /// Multiply-add flops of the dots the run executed (2 per product;
    /// skipped steps and untaken branches count nothing).
    pub flops: u64,
    /// Per operand (operand order), the bytes the kernel's own copies
    /// (manual DMA) moved from it into VMEM/SMEM and into it: nonzero only
    /// for `any` operands, which stay in HBM.
    pub dma_bytes: Vec<(u64, u64)>,
    /// The dots the run executed, by shape, with how often each ran: what
    /// the MXU must do ([`crate::Target::mxu_passes`]).
    pub dots: Vec<(DotShape, u64)>,
}

/// The shape of one executed dot, as the MXU sees it: `batch` products of
/// `[m, k] x [k, n]` with an lhs of dtype `lhs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DotShape {
    /// Independent products (the batch dims' sizes multiplied).
    pub batch: usize,
    /// Rows of the lhs (its free dims multiplied).
    pub m: usize,
    /// The contracting size.
    pub k: usize,
    /// Columns of the rhs (its free dims multiplied).
    pub n: usize,
    /// The lhs element type (it sets the rows per MXU pass).
    pub lhs: crate::DType,
}

impl FetchTrace {
    /// The fetches of operand `name`.
    pub fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a BlockFetch> + 'a {
        self.fetches.iter().filter(move |f| f.operand == name)
    }
}

/// [`interpret_with`], also returning the [`FetchTrace`]: a fetch is
/// counted when an operand's block index differs from the one of the step
/// before (the rule of Pallas's pipeline, which keeps a block in VMEM while
/// consecutive steps map to it).
pub fn interpret_traced(
    kernel: &VerifiedKernel,
    args: &[Array],
    opts: &InterpOptions,
) -> Result<(Vec<Array>, FetchTrace), KernelError> {
    let mut trace = FetchTrace::default();
    let out = run(kernel, args, opts, Some(&mut trace))?;
    Ok((out, trace))
}

/// Runs the grid; records the block fetches into `trace` when given.
fn run(
    kernel: &VerifiedKernel,
    args: &[Array],
    opts: &InterpOptions,
    trace: Option<&mut FetchTrace>,
) -> Result<Vec<Array>, KernelError> {
    let k = kernel.kernel();
    if let Some(mesh) = &k.mesh {
        return Err(KernelError::from(ErrorKind::Mesh(single_device_only(
            &k.name, mesh,
        ))));
    }
    let mut m = eval::Machine::new(k, args, opts, None)?;
    m.run_grid(trace)?;
    m.finish_dma()?;
    collect_outputs(k, m.operands)
}

/// What [`interpret_mesh`] returns: per device (logical id order), its
/// outputs and what it did.
#[derive(Clone, Debug)]
pub struct MeshRun {
    /// Each device's output arrays, in declaration order.
    pub outputs: Vec<Vec<Array>>,
    /// Bytes each device's remote copies sent (its ICI traffic out).
    pub sent_bytes: Vec<u64>,
    /// Multiply-add flops each device's dots executed.
    pub flops: Vec<u64>,
    /// Each device's block fetches, copies and dots, as
    /// [`interpret_traced`] records them for one device.
    pub traces: Vec<FetchTrace>,
    /// Each device's run cut at its remote copies: what overlaps what.
    pub steps: Vec<Vec<MeshStep>>,
}

/// One stretch of a device's run in a mesh: from one remote copy it
/// starts to the next. The copy's bytes travel while the stretch's dots
/// run, so `max(transfer, compute)` per stretch bounds a kernel that
/// overlaps them, and the sum of both one that does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeshStep {
    /// Bytes of the remote copies that start the stretch (0 for the
    /// stretch before the first copy): one copy, or several started back
    /// to back with no dot between them.
    pub ici_bytes: u64,
    /// The most of those bytes bound for one device: copies to different
    /// neighbours travel on different links at once, so this, not
    /// `ici_bytes`, is what the link time of the stretch is.
    pub busiest_link_bytes: u64,
    /// Flops of the dots run until the next remote copy starts.
    pub flops: u64,
}

/// Runs a kernel across the devices of its mesh: `args[d]` are device
/// `d`'s arrays (per-shard shapes, as [`interpret`] takes them). Each
/// device has its own memories and semaphores; remote copies and signals
/// reach the device they name. One run is one interleaving of the
/// devices, chosen by [`InterpOptions::mesh_seed`]; besides the single
/// device checks, it is an error (at the op's line) to
///
/// * touch a buffer a remote copy is still writing, or whose copy has
///   arrived but was not waited for; write a copy's source before its
///   `dma_wait_send`; send into a buffer the receiver has not yet waited
///   for (`[dma-race]`);
/// * wait when no device can ever wake the waiter (`[deadlock]`, listing
///   every device's waiting op; a TPU hangs);
/// * end with a semaphore not at zero or a remote copy not waited for, on
///   either side (`[dma-race]`);
/// * name a device outside the mesh (`[mesh]`).
///
/// Errors on one device carry its id (`[device 2] ...`).
///
/// ```
/// use kernel_ir::{Array, DType, InterpOptions, interpret_mesh};
/// // Each of 4 devices sends its row to the next one in the ring.
/// let k = kernel_ir::parse(r#"
/// kernel @ring {
///   target v5e, vmem_limit default
///   grid []
///   mesh [x 4]
///   in @x: f32[8, 128] any row_major
///   out @o: f32[8, 128] any row_major
///   dma_semaphore @send: []
///   dma_semaphore @recv: []
/// body:
///   %0 = device_id : i32
///   %1 = constant 1 : i32
///   %2 = add %0, %1 : i32
///   %3 = constant 4 : i32
///   %4 = rem %2, %3 : i32
///   dma_start @x[0:8, 0:128] -> @o[0:8, 0:128] sem @recv[] to %4 send @send[]
///   dma_wait_send @x[0:8, 0:128] -> @o[0:8, 0:128] sem @recv[] to %4 send @send[]
///   dma_wait @x[0:8, 0:128] -> @o[0:8, 0:128] sem @recv[] to %4 send @send[]
/// }"#).unwrap().verify().unwrap();
/// let args: Vec<Vec<Array>> =
///     (0..4).map(|d| vec![Array::new(DType::F32, [8, 128], vec![d as f64; 1024]).unwrap()]).collect();
/// let run = interpret_mesh(&k, &args, &InterpOptions::default()).unwrap();
/// assert_eq!(run.outputs[1][0].data()[0], 0.0); // device 1 holds device 0's row
/// assert_eq!(run.outputs[0][0].data()[0], 3.0);
/// ```
pub fn interpret_mesh(
    kernel: &VerifiedKernel,
    args: &[Vec<Array>],
    opts: &InterpOptions,
) -> Result<MeshRun, KernelError> {
    let k = kernel.kernel();
    let Some(mesh) = &k.mesh else {
        return Err(KernelError::from(ErrorKind::Mesh(format!(
            "kernel `{}` declares no mesh; run it with `interpret` (one device)",
            k.name
        ))));
    };
    let n = mesh.devices();
    if args.len() != n {
        return Err(KernelError::from(ErrorKind::Inputs(format!(
            "kernel `{}` runs on the {n} devices of its mesh but got arguments for {}; pass one argument list per device, in logical id order",
            k.name,
            args.len()
        ))));
    }
    let net = mesh::Network::new(n, opts.mesh_seed);
    type Ran<'m> = Option<(eval::Machine<'m>, FetchTrace)>;
    let machines: Vec<Ran<'_>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|d| {
                let net = &net;
                let args = &args[d];
                s.spawn(move || {
                    let _guard = mesh::PanicGuard { net, device: d };
                    let link = Link {
                        device: d,
                        devices: n,
                        net,
                    };
                    let run = || -> Result<(eval::Machine<'_>, FetchTrace), KernelError> {
                        let mut m = eval::Machine::new(k, args, opts, Some(link))?;
                        let mut trace = FetchTrace::default();
                        net.start(d)?;
                        m.run_grid(Some(&mut trace))?;
                        Ok((m, trace))
                    };
                    match run() {
                        Ok(m) => {
                            net.finish(d);
                            Some(m)
                        }
                        Err(e) => {
                            net.fail(d, e);
                            None
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    if let Some(e) = net.failure() {
        return Err(e);
    }
    let (mut machines, traces): (Vec<eval::Machine<'_>>, Vec<FetchTrace>) =
        machines.into_iter().flatten().unzip();
    if machines.len() != n {
        return Err(KernelError::from(ErrorKind::Mesh(
            "a device of the mesh run stopped without an error (a bug in Tessera; please report it)"
                .into(),
        )));
    }
    for (d, (m, msgs)) in machines.iter_mut().zip(net.drain()).enumerate() {
        let checked = m
            .apply(msgs)
            .and_then(|_| m.finish_remote())
            .and_then(|_| m.finish_dma());
        checked.map_err(|e| mesh::on_device(d, e))?;
    }
    let sent_bytes = machines.iter().map(|m| m.ici_bytes).collect();
    let flops = machines.iter().map(|m| m.flops).collect();
    let steps = machines
        .iter()
        .map(|m| {
            // `sends` holds (bytes, flops so far, destination) at each
            // remote start; copies started with no flops between them open
            // one stretch together.
            let mut cuts: Vec<(u64, Vec<(usize, u64)>)> = vec![(0, Vec::new())];
            for &(bytes, at, to) in &m.sends {
                if cuts.len() == 1 || cuts.last().is_some_and(|c| c.0 != at) {
                    cuts.push((at, Vec::new()));
                }
                if let Some(c) = cuts.last_mut() {
                    match c.1.iter_mut().find(|(d, _)| *d == to) {
                        Some(link) => link.1 += bytes,
                        None => c.1.push((to, bytes)),
                    }
                }
            }
            (0..cuts.len())
                .map(|i| MeshStep {
                    ici_bytes: cuts[i].1.iter().map(|l| l.1).sum(),
                    busiest_link_bytes: cuts[i].1.iter().map(|l| l.1).max().unwrap_or(0),
                    flops: cuts.get(i + 1).map_or(m.flops, |c| c.0) - cuts[i].0,
                })
                .collect()
        })
        .collect();
    let mut outputs = Vec::with_capacity(n);
    for (d, m) in machines.into_iter().enumerate() {
        outputs.push(collect_outputs(k, m.operands).map_err(|e| mesh::on_device(d, e))?);
    }
    Ok(MeshRun {
        outputs,
        sent_bytes,
        flops,
        traces,
        steps,
    })
}

impl<'a> eval::Machine<'a> {
    fn new(
        k: &'a Kernel,
        args: &[Array],
        opts: &'a InterpOptions,
        link: Option<Link<'a>>,
    ) -> Result<eval::Machine<'a>, KernelError> {
        let (prefetch, operands) = bind_args(k, args)?;
        Ok(eval::Machine {
            k,
            opts,
            prefetch,
            operands,
            scratch: k
                .scratch
                .iter()
                .map(|s| {
                    let n = s.shape.iter().product();
                    Buf::new(&s.name, "scratch", &s.shape, vec![0.0; n], UNWRITTEN)
                })
                .collect(),
            offsets: vec![Vec::new(); k.operands.len()],
            indices: vec![Vec::new(); k.operands.len()],
            env: vec![None; k.body.values.len()],
            grid_point: Vec::new(),
            dma: dma::DmaState::new(k, opts.dma_seed),
            flops: 0,
            dots: Default::default(),
            dma_bytes: vec![(0, 0); k.operands.len()],
            link,
            ici_bytes: 0,
            sends: Vec::new(),
        })
    }

    /// Runs every grid step; records the block fetches into `trace`.
    fn run_grid(&mut self, mut trace: Option<&mut FetchTrace>) -> Result<(), KernelError> {
        let k = self.k;
        let steps = k.grid.steps() as u64;
        if steps > self.opts.max_grid_steps {
            return Err(KernelError::new(
                ErrorKind::GridLimit {
                    steps,
                    limit: self.opts.max_grid_steps,
                },
                k.grid_loc.clone(),
            ));
        }
        let order = grid_order(k, self.opts.shuffle_seed);
        let parallel: Vec<usize> = (0..k.grid.rank())
            .filter(|&d| k.grid.dims[d].semantics.is_parallel())
            .collect();
        let mut last_parallel: Option<Vec<i64>> = None;
        let mut last_block: Vec<Option<Vec<i64>>> = vec![None; k.operands.len()];
        let mut last_point: Option<Vec<i64>> = None;
        for point in order {
            let par: Vec<i64> = parallel.iter().map(|&d| point[d]).collect();
            if last_parallel.as_ref() != Some(&par) {
                if last_parallel.is_some() {
                    self.none_in_flight(
                        "a parallel grid index changes (the next step may run on another core)",
                    )?;
                }
                for s in &mut self.scratch {
                    s.state.fill(UNWRITTEN);
                }
                last_parallel = Some(par);
            }
            self.sync()?;
            self.step(point.clone())?;
            let Some(trace) = trace.as_deref_mut() else {
                last_point = Some(point);
                continue;
            };
            for (i, o) in k.operands.iter().enumerate() {
                if o.space == MemorySpace::Any {
                    continue;
                }
                let block = self.indices[i].clone();
                if last_block[i].as_ref() != Some(&block) {
                    if o.role.is_output()
                        && let (Some(prev), Some(at)) = (&last_block[i], &last_point)
                    {
                        trace.writebacks.push(BlockFetch {
                            operand: o.name.clone(),
                            point: at.clone(),
                            block: prev.clone(),
                        });
                    }
                    if o.role.is_input() {
                        trace.fetches.push(BlockFetch {
                            operand: o.name.clone(),
                            point: point.clone(),
                            block: block.clone(),
                        });
                    }
                    last_block[i] = Some(block);
                }
            }
            last_point = Some(point);
        }
        if let (Some(trace), Some(at)) = (trace, &last_point) {
            for (i, o) in k.operands.iter().enumerate() {
                if o.role.is_output()
                    && o.space != MemorySpace::Any
                    && let Some(prev) = &last_block[i]
                {
                    trace.writebacks.push(BlockFetch {
                        operand: o.name.clone(),
                        point: at.clone(),
                        block: prev.clone(),
                    });
                }
            }
            trace.flops = self.flops;
            trace.dots = self.dots.iter().map(|(s, n)| (*s, *n)).collect();
            trace.dma_bytes = self.dma_bytes.clone();
        }
        Ok(())
    }
}

fn bind_args(k: &Kernel, args: &[Array]) -> Result<(Vec<Buf>, Vec<Buf>), KernelError> {
    k.check_arguments(args.iter().map(|a| (Some(a.dtype()), a.shape())))
        .map_err(ErrorKind::Arguments)?;
    // Checked above: one array per prefetch and per input, in that order.
    let (prefetch_args, input_args) = args.split_at(k.prefetch.len());
    let mut input_args = input_args.iter();
    let prefetch = k
        .prefetch
        .iter()
        .zip(prefetch_args)
        .map(|(p, a)| {
            Buf::new(
                &p.name,
                "scalar prefetch",
                &p.shape,
                a.data().to_vec(),
                DEFINED,
            )
        })
        .collect();
    let mut operands = Vec::new();
    for o in &k.operands {
        if let Some(a) = o.role.is_input().then(|| input_args.next()).flatten() {
            let what = if o.role == Role::In {
                "input"
            } else {
                "output"
            };
            operands.push(Buf::new(
                &o.name,
                what,
                &o.shape,
                a.data().to_vec(),
                DEFINED,
            ));
        } else {
            let n = o.shape.iter().product();
            operands.push(Buf::new(
                &o.name,
                "output",
                &o.shape,
                vec![0.0; n],
                UNWRITTEN,
            ));
        }
    }
    Ok((prefetch, operands))
}

/// Grid points in execution order: row-major, or with the parallel index
/// tuples shuffled (each keeping its arbitrary steps in order).
fn grid_order(k: &Kernel, shuffle: Option<u64>) -> Vec<Vec<i64>> {
    let points: Vec<Vec<i64>> = k.grid.points().collect();
    let Some(seed) = shuffle else {
        return points;
    };
    let parallel: Vec<usize> = (0..k.grid.rank())
        .filter(|&d| k.grid.dims[d].semantics.is_parallel())
        .collect();
    let mut groups: Vec<(Vec<i64>, Vec<Vec<i64>>)> = Vec::new();
    for pt in points {
        let key: Vec<i64> = parallel.iter().map(|&d| pt[d]).collect();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(pt),
            None => groups.push((key, vec![pt])),
        }
    }
    let mut rng = SplitMix64(seed);
    for i in (1..groups.len()).rev() {
        let j = rng.below(i + 1);
        groups.swap(i, j);
    }
    groups.into_iter().flat_map(|(_, g)| g).collect()
}

fn collect_outputs(k: &Kernel, operands: Vec<Buf>) -> Result<Vec<Array>, KernelError> {
    let mut out = Vec::new();
    for (o, b) in k.operands.iter().zip(operands) {
        if !o.role.is_output() {
            continue;
        }
        let unravel = |flat: usize| -> Vec<i64> {
            b.strides
                .iter()
                .zip(&b.shape)
                .map(|(&s, &n)| ((flat / s) % n) as i64)
                .collect()
        };
        let unwritten = b.state.iter().filter(|&&s| s == UNWRITTEN).count();
        if unwritten > 0 {
            let first = b.state.iter().position(|&s| s == UNWRITTEN).unwrap_or(0);
            return Err(ErrorKind::UnwrittenOutput {
                operand: o.name.clone(),
                count: unwritten,
                total: b.state.len(),
                first: unravel(first),
            }
            .into());
        }
        if let Some(first) = b.state.iter().position(|&s| s == POISON) {
            return Err(ErrorKind::PoisonRead {
                buffer: "output",
                name: o.name.clone(),
                element: unravel(first),
                why: ": it was computed from elements past the end of an input array (a partial last block); mask the load or the reduction".into(),
            }
            .into());
        }
        out.push(Array::from_parts(o.dtype, b.shape, b.data));
    }
    Ok(out)
}

impl eval::Machine<'_> {
    /// Runs one grid step.
    fn step(&mut self, point: Vec<i64>) -> Result<(), KernelError> {
        let k = self.k;
        for (i, o) in k.operands.iter().enumerate() {
            if o.space == MemorySpace::Any {
                self.offsets[i] = vec![0; o.shape.len()];
                self.indices[i] = vec![0; o.shape.len()];
                continue;
            }
            let prefetch = &self.prefetch;
            let read = |p: usize, idx: &[i64]| -> Result<i64, crate::IndexEvalError> {
                let b = prefetch.get(p).ok_or_else(|| {
                    crate::IndexEvalError::Prefetch(format!("no scalar prefetch {p}"))
                })?;
                let mut flat = 0usize;
                for (d, (&i, &n)) in idx.iter().zip(&b.shape).enumerate() {
                    if i < 0 || i as usize >= n {
                        return Err(crate::IndexEvalError::Prefetch(format!(
                            "`{}` index {i} in dim {d} is outside 0..{n}",
                            b.name
                        )));
                    }
                    flat += i as usize * b.strides[d];
                }
                Ok(b.data[flat] as i64)
            };
            let bidx = k.block_index(i, &point, &read)?;
            self.offsets[i] = o.block.window_start(&bidx);
            self.indices[i] = bidx;
        }
        self.grid_point = point;
        let region = &k.body.region;
        self.region(region, Vec::new())?;
        Ok(())
    }
}
