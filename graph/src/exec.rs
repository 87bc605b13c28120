//! Materialization: what the background worker does at a sync.

use std::collections::HashMap;
use std::sync::Arc;

use kernel_ir::{Array, VerifiedKernel};
use lowering::Spmd;
use lowering::program::CallForm;

use super::lower::{self, Param};
use super::node::{Node, State, Tape};
use super::plan;
use super::{Inner, RuntimeError};
use runtime::cache::Tier;
use runtime::pjrt::{Buffer, CompileOptions};

/// Computes `requested` (the deferred ones), every pending collective, and
/// the intermediates of the same subgraph that handles still point at (so
/// they are not recomputed later). On failure every one of them stores the
/// error.
pub(crate) fn materialize(inner: &Inner, requested: &[Arc<Node>]) {
    let mut outputs: Vec<Arc<Node>> = Vec::new();
    let push = |n: &Arc<Node>, outputs: &mut Vec<Arc<Node>>| {
        if n.deferred().is_some() && !outputs.iter().any(|o| o.id == n.id) {
            outputs.push(n.clone());
        }
    };
    for n in requested {
        push(n, &mut outputs);
    }
    let collectives: Vec<Arc<Node>> = std::mem::take(
        &mut *inner
            .pending_collectives
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    for n in &collectives {
        push(n, &mut outputs);
    }
    drop(collectives);
    if outputs.is_empty() {
        return;
    }
    let mut span = inner.tracer.span("materialize");
    if let Some(s) = span.as_mut() {
        s.arg("requested", outputs.len());
    }
    match run(inner, &mut outputs) {
        Ok(()) => {}
        Err(e) => {
            for n in &outputs {
                let mut e = e.clone();
                if let RuntimeError::Failed { recorded_at, .. } = &mut e
                    && recorded_at.is_none()
                {
                    *recorded_at = Some(n.loc.clone());
                }
                *n.lock() = State::Failed(e);
            }
        }
    }
}

/// Plans (the live intermediates added, the structure's fingerprint),
/// then runs a cached plan, or lowers, compiles (through the cache) and
/// executes; stores the results.
fn run(inner: &Inner, outputs: &mut Vec<Arc<Node>>) -> Result<(), RuntimeError> {
    let order = lower::topo_order(outputs)?;
    add_live_intermediates(&order, outputs);
    let platform = kernel_platform(inner);
    // `order` is still this subgraph's: the outputs added above are nodes
    // of it, so a walk from the longer list visits the same nodes in the
    // same order.
    let shape = plan::shape_of(&order, outputs, &format!("{} {platform}", inner.devices));
    trace_subgraph(inner, &order, outputs);
    drop(order);
    // The fast path: a structure seen before runs its cached executable
    // without lowering.
    if let Some(shape) = &shape
        && let Some(done) = run_planned(inner, shape, outputs)
    {
        return done;
    }
    let program = {
        let _span = inner.tracer.span("lower");
        let forms = |k: &VerifiedKernel| kernel_form(inner, &platform, k);
        lower::lower(outputs, inner.devices, &forms)?
    };
    let executable = compile(inner, &program, &platform)?;
    let results = execute(
        inner,
        &program.params,
        program.outputs.len(),
        &executable,
        program.transposes,
    )?;
    if let Some(shape) = &shape {
        remember_plan(inner, shape, &program, executable);
    }
    store(inner, &program.outputs, results)
}

/// Adds to `outputs` the deferred nodes of `order` referenced from outside
/// this subgraph (a user's handle, or a pending node elsewhere): they are
/// materialized now, not recomputed later.
fn add_live_intermediates(order: &[lower::Pending], outputs: &mut Vec<Arc<Node>>) {
    // References from inside the subgraph, per node: per use, the user's
    // deferred state and the copy of its input list in `order`, plus the
    // user's tape when it is tracked (the same inputs); and a kernel
    // output's tape holding its later siblings.
    let mut internal: HashMap<u64, usize> = HashMap::new();
    for (n, _, inputs) in order {
        let taped = matches!(n.tape, Tape::Op { .. });
        for i in inputs {
            *internal.entry(i.id).or_default() += 2 + usize::from(taped);
        }
        if let Tape::Op { siblings, .. } = &n.tape {
            for s in siblings {
                *internal.entry(s.id).or_default() += 1;
            }
        }
    }
    for (n, op, _) in order {
        let held = internal.get(&n.id).copied().unwrap_or(0);
        // One more reference: `order`'s own entry.
        let is_output = outputs.iter().any(|o| o.id == n.id);
        // A program constant stays one: every program that reads it
        // carries it, so it is never stored as a buffer on the way.
        let literal = matches!(op, super::node::Op::Literal(_));
        if !is_output && !literal && Arc::strong_count(n) > 1 + held {
            outputs.push(n.clone());
        }
    }
}

/// The lowering of kernel calls: the platform's, or decomposed.
fn kernel_platform(inner: &Inner) -> String {
    match inner.options.kernels {
        super::KernelLowering::Auto => inner.client.platform().to_string(),
        super::KernelLowering::Decomposed => "decomposed".to_string(),
    }
}

/// The trace's spans of a subgraph: its collectives and its size.
fn trace_subgraph(inner: &Inner, order: &[lower::Pending], outputs: &[Arc<Node>]) {
    if !inner.tracer.is_on() {
        return;
    }
    let collectives = order.iter().filter(|(_, op, _)| op.is_collective()).count();
    for (_, op, _) in order.iter().filter(|(_, op, _)| op.is_collective()) {
        if let Some(mut s) = inner.tracer.span("collective") {
            s.arg("op", op.name());
        }
    }
    if let Some(mut s) = inner.tracer.span("subgraph") {
        s.arg("nodes", order.len());
        s.arg("outputs", outputs.len());
        s.arg("collectives", collectives);
    }
}

/// Runs the cached plan of a structure seen before, if its inputs bind;
/// `None` when there is none (lower and compile instead).
fn run_planned(
    inner: &Inner,
    shape: &plan::Shape,
    outputs: &[Arc<Node>],
) -> Option<Result<(), RuntimeError>> {
    let cached = inner
        .plans
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&shape.fingerprint)
        .cloned()?;
    let params = plan::bind(&cached, shape)?;
    if let Some(mut s) = inner.tracer.span("cache lookup") {
        s.arg("tier", "plan");
    }
    {
        let mut s = inner.stats();
        s.hits_memory += 1;
        s.transposes += cached.transposes.0;
        s.transpose_bytes += cached.transposes.1;
    }
    Some(
        execute(
            inner,
            &params,
            outputs.len(),
            &cached.executable,
            cached.transposes,
        )
        .and_then(|results| store(inner, outputs, results)),
    )
}

/// The executable of `program`, through the compile cache (memory, disk,
/// remote, or compiled now; the cache's error keeps its PJRT cause), with
/// the host kernels it calls registered in this process on the CPU.
fn compile(
    inner: &Inner,
    program: &lower::Program,
    platform: &str,
) -> Result<Arc<runtime::pjrt::Executable>, RuntimeError> {
    let options = CompileOptions {
        num_replicas: inner.devices,
        num_partitions: 1,
        static_assignment: false,
        shardy: false,
    };
    let mut lookup_span = inner.tracer.span("cache lookup");
    let key = runtime::cache::key(&program.text, &options, &inner.client);
    let lookup = inner
        .cache
        .get(&key, &program.text, &options, &inner.client)
        .map_err(|e| RuntimeError::failed("compiling the graph", e))?;
    if let Some(s) = lookup_span.as_mut() {
        let tier = match lookup.tier {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
            Tier::Remote => "remote",
            Tier::Compiled => "miss",
        };
        s.arg("tier", tier);
        s.arg("module_bytes", program.text.len());
        if lookup.tier == Tier::Compiled {
            inner
                .tracer
                .push_ended("compile", lookup.compile_time, Vec::new());
        }
    }
    drop(lookup_span);
    {
        let mut s = inner.stats();
        match lookup.tier {
            Tier::Memory => s.hits_memory += 1,
            Tier::Disk => s.hits_disk += 1,
            Tier::Remote => s.hits_remote += 1,
            Tier::Compiled => s.compiles += 1,
        }
        s.compile_time += lookup.compile_time;
        s.corrupt_entries += lookup.corrupt;
        s.transposes += program.transposes.0;
        s.transpose_bytes += program.transposes.1;
    }
    if platform == "cpu" {
        // The executable calls host kernels by key: they must be compiled
        // in this process (a disk hit skips XLA's compile, not this).
        // (A kernel across chips is decomposed StableHLO: nothing to JIT.)
        for k in program.kernels.iter().filter(|k| k.mesh.is_none()) {
            let mut span = inner.tracer.span("kernel jit");
            if let Some(s) = span.as_mut() {
                s.arg("kernel", &k.name);
            }
            runtime::host_call::register_kernel(k)
                .map_err(|e| RuntimeError::failed(format!("kernel `{}`", k.name), e))?;
        }
    }
    Ok(lookup.executable)
}

/// Keeps the executable as the plan of this structure (the memo is
/// cleared when full: a program that records ever new structures must not
/// grow it without bound).
fn remember_plan(
    inner: &Inner,
    shape: &plan::Shape,
    program: &lower::Program,
    executable: Arc<runtime::pjrt::Executable>,
) {
    let Some(slots) = plan::slots(program, shape) else {
        return;
    };
    let mut plans = inner.plans.lock().unwrap_or_else(|p| p.into_inner());
    if plans.len() >= plan::CAPACITY {
        plans.clear();
    }
    plans.insert(
        shape.fingerprint,
        Arc::new(plan::Plan {
            executable,
            slots,
            transposes: program.transposes,
        }),
    );
}

/// Stores each output's buffers in its node.
fn store(
    inner: &Inner,
    outputs: &[Arc<Node>],
    results: Vec<Vec<Buffer>>,
) -> Result<(), RuntimeError> {
    let mut s = inner.stats();
    s.materializations += 1;
    s.nodes_materialized += outputs.len() as u64;
    drop(s);
    for (n, bufs) in outputs.iter().zip(results) {
        *n.lock() = State::Ready(Arc::new(bufs));
    }
    Ok(())
}

/// Binds parameters per device and runs; returns per output its buffers
/// (one per device).
fn execute(
    inner: &Inner,
    params: &[Param],
    n_outputs: usize,
    exe: &runtime::pjrt::Executable,
    transposes: (u64, u64),
) -> Result<Vec<Vec<Buffer>>, RuntimeError> {
    let fail = |e: runtime::pjrt::PjrtError| RuntimeError::failed("running the graph", e);
    let mut scalars: Vec<Vec<Buffer>> = Vec::new();
    let mut node_bufs: Vec<Arc<Vec<Buffer>>> = Vec::new();
    // Per parameter: (is scalar, index into the matching list).
    let mut slots = Vec::new();
    let mut bytes = 0u64;
    let mut h2d = inner.tracer.span("h2d");
    for p in params {
        match p {
            Param::Node(n) => match n.ready() {
                Some(Ok(b)) => {
                    slots.push((false, node_bufs.len()));
                    node_bufs.push(b);
                }
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(RuntimeError::Internal(format!(
                        "parameter node {} is not materialized",
                        n.id
                    )));
                }
            },
            Param::Scalar(v, d) => {
                let a = Array::new(*d, Vec::<usize>::new(), vec![*v])
                    .map_err(|e| RuntimeError::Internal(e.to_string()))?;
                let per: Vec<Buffer> = (0..inner.devices)
                    .map(|dev| inner.client.upload(&a, dev))
                    .collect::<Result<_, _>>()
                    .map_err(fail)?;
                bytes += (d.bytes() * inner.devices) as u64;
                slots.push((true, scalars.len()));
                scalars.push(per);
            }
        }
    }
    inner.stats().bytes_to_device += bytes;
    if let Some(s) = h2d.as_mut() {
        s.arg("bytes", bytes);
        s.arg("what", "scalar parameters");
    }
    drop(h2d);
    let args: Vec<Vec<&Buffer>> = (0..inner.devices)
        .map(|dev| {
            slots
                .iter()
                .map(|&(scalar, i)| {
                    if scalar {
                        &scalars[i][dev]
                    } else {
                        &node_bufs[i][dev]
                    }
                })
                .collect()
        })
        .collect();
    let mut span = inner.tracer.span("execute");
    if let Some(s) = span.as_mut() {
        s.arg("transposes", transposes.0);
        s.arg("transpose_bytes", transposes.1);
    }
    let per_device = exe.execute_replicated(&args).map_err(fail)?;
    drop(span);
    // [device][output] → [output][device]
    let mut per_output: Vec<Vec<Buffer>> = (0..n_outputs).map(|_| Vec::new()).collect();
    for outs in per_device {
        for (i, b) in outs.into_iter().enumerate() {
            if let Some(v) = per_output.get_mut(i) {
                v.push(b);
            }
        }
    }
    Ok(per_output)
}

/// How a kernel call is built for `platform`: `cpu` the host custom call
/// (a kernel across chips the decomposed SPMD program), `tpu` the Mosaic
/// custom call, a GPU platform the Triton call (its TTIR made once per
/// kernel), anything else decomposed.
pub(crate) fn kernel_form(
    inner: &Inner,
    platform: &str,
    k: &VerifiedKernel,
) -> Result<CallForm, RuntimeError> {
    Ok(match platform {
        // The native JIT runs one device; a kernel across chips is the
        // decomposed SPMD program, whose collectives span the runtime's
        // replicas (its mesh, checked when the call was recorded).
        "cpu" if k.mesh.is_some() => CallForm::Decomposed(Spmd::Replicas),
        "cpu" => CallForm::Host {
            key: runtime::host_call::kernel_key(k),
        },
        "tpu" => CallForm::TpuCustomCall,
        // A GPU plugin compiles the kernel's Triton program, called
        // through XLA's Triton custom call.
        p if let Some(target) = runtime::triton::platform_target(p) => {
            let key = runtime::host_call::kernel_key(k);
            let memo = |m: &Inner| {
                m.kernel_ttir
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                    .cloned()
            };
            let ttir = match memo(inner) {
                Some(t) => t,
                None => {
                    let t = runtime::triton::kernel_ttir(k, target)
                        .map_err(|e| RuntimeError::failed(format!("kernel `{}`", k.name), e))?;
                    inner
                        .kernel_ttir
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, t.clone());
                    t
                }
            };
            CallForm::Triton { ttir }
        }
        _ => CallForm::Decomposed(Spmd::Replicas),
    })
}
