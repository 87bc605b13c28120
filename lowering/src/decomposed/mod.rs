//! Target 3: the kernel as plain StableHLO, runnable on any PJRT back end.
//!
//! * Arrays are padded to whole blocks, so the last (partial) block of a
//!   dim is sliced like any other, and the padding is cut off at the end.
//! * The grid is one `stablehlo.while` over all steps in row-major order;
//!   each step derives its grid indices, evaluates the index maps, and
//!   takes its windows with `dynamic_slice`. Output arrays and scratch are
//!   loop-carried; an output window is read from the carried array (so a
//!   block revisited across steps accumulates) and written back with
//!   `dynamic_update_slice`.
//! * Inside a step, a buffer (window, scratch) is an SSA tensor: a store
//!   makes a new one. Kernel `for` loops become `stablehlo.while` and
//!   conditionals `stablehlo.if`, threading the buffers they write.
//!
//! Ops are generic-form StableHLO (the dialect is not part of upstream
//! MLIR), which PJRT plugins accept.

use melior::ir::operation::OperationMutLike;
use melior::ir::{BlockLike, Module, Type};

use kernel_ir::{BufferRef, CompareOp, DType, Kernel, MemorySpace, VerifiedKernel};

use crate::LoweringError;
use crate::lowered_values::LoweredValues;
use crate::mlir::{Ir, Mlir, Raw};

mod remote;
mod step;

use crate::hlo::Hlo;
use step::Step;

/// Lowers `kernel` to a StableHLO module `@main(prefetch.., inputs..) ->
/// outputs..`, printed.
///
/// A kernel across chips becomes one SPMD program for its mesh's devices
/// (`mhlo.num_replicas`; see the `remote` module): run it replicated, one
/// replica per device, each with its own shard's inputs.
pub fn decomposed(kernel: &VerifiedKernel) -> Result<String, LoweringError> {
    decomposed_as(kernel, Spmd::Replicas)
}

/// How the devices of a kernel across chips are numbered in its SPMD
/// program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spmd {
    /// One replica per device (`stablehlo.replica_id`, cross-replica
    /// collectives): the program runs replicated, as
    /// `runtime::across_devices` and the graph runtime run it.
    Replicas,
    /// One partition per device (`stablehlo.partition_id`, collectives
    /// with channel handles over global device ids): the form a per-shard
    /// call inside `jax.shard_map` needs, where the program is partitioned
    /// and the kernel's mesh is the shard_map's.
    Partitions,
}

/// [`decomposed`] with the devices numbered as `spmd` says (the same
/// module for a kernel without a mesh).
pub fn decomposed_as(kernel: &VerifiedKernel, spmd: Spmd) -> Result<String, LoweringError> {
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    // StableHLO has no DMA: copies become synchronous.
    let module = build(&ir, &kernel.with_synchronous_copies(), spmd)?;
    m.verify(&module, "decomposed StableHLO module")?;
    Ok(module.as_operation().to_string())
}

/// Slots of the buffers a step can touch: prefetch, operands, scratch.
#[derive(Clone, Copy)]
struct Slots {
    prefetch: usize,
    operands: usize,
}

impl Slots {
    fn of(&self, b: BufferRef) -> usize {
        match b {
            BufferRef::Prefetch(i) => i,
            BufferRef::Operand(i) => self.prefetch + i,
            BufferRef::Scratch(i) => self.prefetch + self.operands + i,
        }
    }
}

/// Padded extent of each dim of operand `i`: whole blocks (the array for
/// `any`), or for an element window the part of its padded array the run
/// touches ([`Kernel::element_reach`]; all of it when that is not known).
fn padded_shape(k: &Kernel, i: usize) -> Vec<usize> {
    let o = &k.operands[i];
    if o.space == MemorySpace::Any {
        return o.shape.clone();
    }
    if let Some(pad) = &o.block.element {
        return match k.element_reach(i) {
            Some(reach) => reach.iter().map(|(lo, hi)| hi - lo).collect(),
            None => (0..o.shape.len())
                .map(|d| pad.low[d] + o.shape[d] + pad.high[d])
                .collect(),
        };
    }
    o.shape
        .iter()
        .zip(&o.block.shape)
        .map(|(&n, &b)| n.div_ceil(b) * b)
        .collect()
}

/// Where the materialised part of operand `i`'s padded array starts, per
/// dim, in padded coordinates (0 unless [`Kernel::element_reach`] leaves
/// out low padding no window reads).
fn reach_start(k: &Kernel, i: usize) -> Vec<usize> {
    match k.element_reach(i) {
        Some(reach) => reach.iter().map(|(lo, _)| *lo).collect(),
        None => vec![0; k.operands[i].shape.len()],
    }
}

fn build<'c>(ir: &Ir<'c>, k: &Kernel, spmd: Spmd) -> Result<Module<'c>, LoweringError> {
    let mut module = Module::new(ir.loc());
    module.body().append_operation(main_function(ir, k, spmd)?);
    module.as_operation_mut().set_attribute(
        "sym_name",
        ir.str_attr(&format!("tessera_{}_decomposed", k.name)),
    );
    if let Some(mesh) = &k.mesh {
        let n = mesh.devices() as i64;
        let (replicas, partitions) = match spmd {
            Spmd::Replicas => (n, 1),
            Spmd::Partitions => (1, n),
        };
        let mut op = module.as_operation_mut();
        op.set_attribute("mhlo.num_replicas", ir.i32_attr(replicas));
        op.set_attribute("mhlo.num_partitions", ir.i32_attr(partitions));
    }
    Ok(module)
}

/// The decomposed kernel as a public `func.func @main`, built with `ir`
/// (into its own module, or into a program that calls it). Copies must
/// already be synchronous.
pub(crate) fn main_function<'c>(
    ir: &Ir<'c>,
    k: &Kernel,
    spmd: Spmd,
) -> Result<melior::ir::Operation<'c>, LoweringError> {
    let inputs: Vec<usize> = (0..k.operands.len())
        .filter(|&i| k.operands[i].role.is_input())
        .collect();
    let outputs: Vec<usize> = (0..k.operands.len())
        .filter(|&i| k.operands[i].role.is_output())
        .collect();
    let mut main_in = Vec::new();
    for p in &k.prefetch {
        main_in.push(ir.tensor(&p.shape, p.dtype));
    }
    for &i in &inputs {
        main_in.push(ir.tensor(&k.operands[i].shape, k.operands[i].dtype));
    }
    let main_out: Vec<Type<'c>> = outputs
        .iter()
        .map(|&i| ir.tensor(&k.operands[i].shape, k.operands[i].dtype))
        .collect();
    let block = ir.block(&main_in);
    let args = ir.args(&block);
    let e = Hlo { ir };

    // Whole arrays, padded to whole blocks.
    let prefetch: Vec<Raw> = args[..k.prefetch.len()].to_vec();
    let mut arrays: Vec<Option<Raw>> = vec![None; k.operands.len()];
    for (n, &i) in inputs.iter().enumerate() {
        let o = &k.operands[i];
        let low = match &o.block.element {
            Some(pad) if o.space != MemorySpace::Any => {
                let start = reach_start(k, i);
                (0..o.shape.len()).map(|d| pad.low[d] - start[d]).collect()
            }
            _ => vec![0; o.shape.len()],
        };
        arrays[i] = Some(e.pad(
            &block,
            args[k.prefetch.len() + n],
            o.dtype,
            &o.shape,
            &low,
            &padded_shape(k, i),
        )?);
    }
    // Outputs start as zeros (in-out ones as their input).
    let mut carried_types = vec![ir.tensor(&[], DType::I32)];
    let mut init = vec![e.scalar_i32(&block, 0)?];
    for &i in &outputs {
        let o = &k.operands[i];
        let shape = padded_shape(k, i);
        let v = match arrays[i] {
            Some(v) => v,
            None => e.splat(&block, 0.0, o.dtype, &shape)?,
        };
        carried_types.push(ir.tensor(&shape, o.dtype));
        init.push(v);
    }
    for s in &k.scratch {
        carried_types.push(ir.tensor(&s.shape, s.dtype));
        init.push(e.splat(&block, 0.0, s.dtype, &s.shape)?);
    }
    let steps = k.grid.steps() as i64;

    // cond: step < steps
    let cond = ir.block(&carried_types);
    let cargs = ir.args(&cond);
    let limit = e.scalar_i32(&cond, steps)?;
    let lt = e.compare(&cond, CompareOp::Lt, cargs[0], limit, DType::I32, &[])?;
    ir.op(
        &cond,
        "stablehlo.return",
        &[lt],
        &[],
        Vec::new(),
        Vec::new(),
    )?;

    // body: one grid step
    let body = ir.block(&carried_types);
    let bargs = ir.args(&body);
    let step = bargs[0];
    let mut grid = Vec::new();
    let mut stride = 1i64;
    let bounds = k.grid.bounds();
    let mut strides = vec![0i64; bounds.len()];
    for d in (0..bounds.len()).rev() {
        strides[d] = stride;
        stride *= bounds[d] as i64;
    }
    for d in 0..bounds.len() {
        let s = e.scalar_i32(&body, strides[d])?;
        let q = e.bin(&body, "stablehlo.divide", step, s, DType::I32, &[])?;
        let b = e.scalar_i32(&body, bounds[d] as i64)?;
        grid.push(e.bin(&body, "stablehlo.remainder", q, b, DType::I32, &[])?);
    }
    let slots = Slots {
        prefetch: k.prefetch.len(),
        operands: k.operands.len(),
    };
    let mut bufs: Vec<Raw> = prefetch.clone();
    let mut starts: Vec<Vec<Raw>> = vec![Vec::new(); k.operands.len()];
    for (i, o) in k.operands.iter().enumerate() {
        let source = if o.role.is_output() {
            bargs[1 + outputs.iter().position(|&x| x == i).unwrap_or(0)]
        } else {
            arrays[i].ok_or_else(|| LoweringError::Internal("input array".into()))?
        };
        if o.space == MemorySpace::Any {
            bufs.push(source);
            continue;
        }
        let mut st = Vec::new();
        let start = reach_start(k, i);
        for (d, ex) in o.block.index_map.exprs.iter().enumerate() {
            let b = e.index_expr(&body, ex, &grid, &prefetch, k)?;
            if o.block.element.is_some() {
                // An element offset into the padded array, of which the
                // part from `start` on is materialised.
                if start[d] == 0 {
                    st.push(b);
                } else {
                    let s = e.scalar_i32(&body, start[d] as i64)?;
                    st.push(e.bin(&body, "stablehlo.subtract", b, s, DType::I32, &[])?);
                }
                continue;
            }
            let size = e.scalar_i32(&body, o.block.shape[d] as i64)?;
            st.push(e.bin(&body, "stablehlo.multiply", b, size, DType::I32, &[])?);
        }
        bufs.push(e.dynamic_slice(&body, source, &st, &o.block.shape, o.dtype)?);
        starts[i] = st;
    }
    let scratch_base = 1 + outputs.len();
    for (n, _) in k.scratch.iter().enumerate() {
        bufs.push(bargs[scratch_base + n]);
    }
    let mut em = Step {
        e: Hlo { ir },
        k,
        slots,
        grid: grid.clone(),
        values: LoweredValues::new(k),
        bufs,
        per_device: remote::per_device_values(k),
        spmd,
        channels: 0,
    };
    em.region(&body, &k.body.region)?;
    let one = e.scalar_i32(&body, 1)?;
    let mut next = vec![e.bin(&body, "stablehlo.add", step, one, DType::I32, &[])?];
    for (n, &i) in outputs.iter().enumerate() {
        let o = &k.operands[i];
        let window = em.bufs[slots.of(BufferRef::Operand(i))];
        next.push(if o.space == MemorySpace::Any {
            window
        } else {
            e.dynamic_update_slice(
                &body,
                bargs[1 + n],
                window,
                &starts[i],
                carried_types[1 + n],
            )?
        });
    }
    for n in 0..k.scratch.len() {
        next.push(em.bufs[slots.of(BufferRef::Scratch(n))]);
    }
    ir.op(
        &body,
        "stablehlo.return",
        &next,
        &[],
        Vec::new(),
        Vec::new(),
    )?;
    let results = ir.op(
        &block,
        "stablehlo.while",
        &init,
        &carried_types,
        Vec::new(),
        vec![ir.region(cond), ir.region(body)],
    )?;
    let mut rets = Vec::new();
    for (n, &i) in outputs.iter().enumerate() {
        let o = &k.operands[i];
        rets.push(e.unpad(
            &block,
            results[1 + n],
            o.dtype,
            &padded_shape(k, i),
            &o.shape,
        )?);
    }
    ir.op(&block, "func.return", &rets, &[], Vec::new(), Vec::new())?;
    ir.public_main(block, &main_in, &main_out)
}
