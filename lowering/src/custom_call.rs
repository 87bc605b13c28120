//! Target 2: the kernel in Mosaic's conventions, serialized into
//! `stablehlo.custom_call @tpu_custom_call` inside a complete StableHLO
//! module, as Pallas emits it.
//!
//! A layout hint becomes an explicit `stablehlo.transpose` into the
//! operand's physical order before the call (and back after it, for
//! outputs), and the kernel sees that operand in physical order. The call's
//! `operand_layouts`/`result_layouts` are then row-major: XLA inserts no
//! layout copies of its own, so every layout change is one visible,
//! countable transpose.

use base64::Engine;
use melior::ir::operation::{OperationLike, OperationMutLike};
use melior::ir::{BlockLike, Module, Type};

use kernel_ir::{Kernel, OpKind, Role, VerifiedKernel};

use crate::LoweringError;
use crate::convention::{Flavor, memory_dtype, physical_order};
use crate::cost::CostEstimate;
use crate::kernel_module::{self, ModuleOptions};
use crate::mlir::{Ir, Mlir, Raw};

/// A layout change the wrapper makes explicit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transpose {
    /// The operand it applies to.
    pub operand: String,
    /// The permutation (result dim i is source dim `perm[i]`).
    pub perm: Vec<usize>,
    /// Bytes it moves.
    pub bytes: u64,
}

/// A kernel lowered for TPU: the StableHLO module calling it, and what is
/// inside the call.
#[derive(Clone, Debug)]
pub struct TpuCustomCall {
    /// The complete StableHLO module (`func.func @main`).
    pub module: String,
    /// The Mosaic kernel module the call carries, printed (the call holds
    /// its serialized bytecode).
    pub body: String,
    /// The serialized body, with Mosaic's `stable_mosaic.` op names as
    /// the Mosaic deserializer expects: MLIR bytecode, or MLIR text for a
    /// kernel with semaphores (whose tpu-dialect types bytecode written
    /// here cannot carry).
    pub serialized_body: Vec<u8>,
    /// The `backend_config` JSON string.
    pub backend_config: String,
    /// The cost estimate in it.
    pub cost: CostEstimate,
    /// Scoped VMEM limit in it.
    pub vmem_limit: u64,
    /// The explicit layout changes around the call.
    pub transposes: Vec<Transpose>,
}

/// Lowers `kernel` to a `tpu_custom_call` module.
pub fn tpu_custom_call(kernel: &VerifiedKernel) -> Result<TpuCustomCall, LoweringError> {
    crate::tpu_platform(kernel, "tpu_custom_call")?;
    let body = MosaicBody::of(kernel)?;
    let m = Mlir::new();
    let (module, transposes) = wrapper(&m, kernel, CallTarget::Tpu(&body.backend_config))?;
    Ok(TpuCustomCall {
        module,
        body: body.printed,
        serialized_body: body.serialized,
        backend_config: body.backend_config,
        cost: body.cost,
        vmem_limit: body.vmem_limit,
        transposes,
    })
}

/// A kernel's Mosaic body and the `backend_config` of its call, built on
/// a context of their own (the call carries the body serialized).
pub(crate) struct MosaicBody {
    printed: String,
    serialized: Vec<u8>,
    pub(crate) backend_config: String,
    cost: CostEstimate,
    vmem_limit: u64,
}

impl MosaicBody {
    pub(crate) fn of(k: &Kernel) -> Result<MosaicBody, LoweringError> {
        let m = Mlir::new();
        let opts = ModuleOptions {
            flavor: Flavor::Mosaic,
            no_memory_spaces: false,
        };
        let plain = kernel_module::build(&Ir::new(&m.ctx, ""), k, opts)?;
        m.verify(&plain, "Mosaic kernel module")?;
        let printed = plain.as_operation().to_string();
        // The serialized form: every op renamed `stable_mosaic.<op>` (so
        // unregistered here), which the deserializer maps back and upgrades.
        let serialized = kernel_module::build(&Ir::new(&m.ctx, "stable_mosaic."), k, opts)?;
        // Semaphore element types belong to the tpu dialect, which this MLIR
        // does not have: bytecode would carry them as opaque types the TPU
        // compiler does not read back as semaphores, while text is parsed by
        // the consumer's own dialects (libtpu and jaxlib both take a text
        // body). Text keeps locations so compiler errors name Rust lines.
        let serialized = if k.semaphores.is_empty() {
            serialized.as_operation().write_bytecode()
        } else {
            use melior::ir::operation::{OperationLike, OperationPrintingFlags};
            serialized
                .as_operation()
                .to_string_with_flags(OperationPrintingFlags::new().enable_debug_info(true, false))
                .map_err(|e| LoweringError::Internal(format!("printing the Mosaic body: {e}")))?
                .into_bytes()
        };
        let cost = CostEstimate::of(k);
        let vmem_limit = k.effective_vmem_limit();
        let backend_config = backend_config(&serialized, Communication::of(k), &cost, vmem_limit);
        Ok(MosaicBody {
            printed,
            serialized,
            backend_config,
            cost,
            vmem_limit,
        })
    }
}

/// What a kernel across chips tells libtpu: that it talks to other
/// devices (remote copies or signals; without it libtpu refuses "Remote op
/// used, but has_communication not specified"), and the collective id of
/// its barrier (without one libtpu aborts the process on a kernel using
/// the barrier semaphore). One kernel per program gets id 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Communication {
    /// Remote copies or signals.
    pub remote: bool,
    /// The collective id, when the barrier semaphore is used.
    pub collective_id: Option<u32>,
}

impl Communication {
    /// What `k` needs.
    pub fn of(k: &Kernel) -> Communication {
        let mut remote = false;
        k.body.walk(&mut |op| {
            remote |= match &op.kind {
                OpKind::DmaStart(c) | OpKind::DmaWait(c) | OpKind::DmaWaitSend(c) => {
                    c.remote.is_some()
                }
                OpKind::RemoteSignal { .. } => true,
                _ => false,
            }
        });
        let barrier = k
            .semaphores
            .iter()
            .any(|s| s.kind == kernel_ir::SemaphoreKind::Barrier);
        Communication {
            remote: remote || barrier,
            collective_id: barrier.then_some(0),
        }
    }
}

/// The JSON `backend_config`, keys in the order Pallas writes them.
fn backend_config(
    body: &[u8],
    comm: Communication,
    cost: &CostEstimate,
    vmem_limit: u64,
) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(body);
    let mut comms = String::new();
    if comm.remote {
        comms.push_str(", \"has_communication\": true");
    }
    if let Some(id) = comm.collective_id {
        comms.push_str(&format!(", \"collective_id\": {id}"));
    }
    format!(
        concat!(
            "{{\"custom_call_config\": {{\"body\": \"{}\"{}, ",
            "\"cost_estimate\": {{\"bytes_accessed\": {}, \"flops\": {}, ",
            "\"remote_bytes_transferred\": 0, \"transcendentals\": {}}}, ",
            "\"serialization_format\": 1, \"needs_layout_passes\": true}}, ",
            "\"scoped_memory_configs\": [{{\"memory_space\": 1, \"offset\": 0, \"size\": {}}}]}}"
        ),
        b64, comms, cost.bytes_accessed, cost.flops, cost.transcendentals, vmem_limit
    )
}

/// The custom call name a host kernel call uses; the runtime registers its
/// XLA FFI handler under it.
pub const HOST_CALL_TARGET: &str = "tessera_host_kernel";

/// A StableHLO module (`func.func @main`) that calls a native host kernel
/// through XLA's typed FFI: `stablehlo.custom_call @tessera_host_kernel`
/// with `api_version = 4` and a dictionary `backend_config` whose `kernel`
/// entry is `key`, the name under which the runtime registered the
/// compiled kernel. Operands are row-major: the host driver applies layout
/// hints itself, so no transposes surround the call.
pub fn host_custom_call(kernel: &VerifiedKernel, key: &str) -> Result<String, LoweringError> {
    let m = Mlir::new();
    Ok(wrapper(&m, kernel, CallTarget::Host(key))?.0)
}

/// The custom call target XLA's GPU back ends compile a Triton kernel
/// through (CUDA and ROCm alike): Pallas's Triton lowering emits it.
pub const TRITON_CALL_TARGET: &str = "__gpu$xla.gpu.triton";

/// A StableHLO module (`func.func @main`) that calls the kernel's Triton
/// program through XLA's GPU custom call `__gpu$xla.gpu.triton`
/// ([`TRITON_CALL_TARGET`]), as Pallas's Triton back end does: typed FFI
/// (`api_version = 4`) with a dictionary `backend_config` holding the
/// kernel's `name`, its Triton IR `ir` (`ttir`: the TTIR module Triton's
/// front end makes of [`crate::triton()`]'s program, as text; XLA parses
/// text or bytecode), the launch grid (`grid_x/y/z`), `num_warps`,
/// `num_stages` and `debug`. Operands are the program's pointer
/// arguments in order (prefetch, inputs) and the results its outputs,
/// row-major; an in-out operand aliases its result, and a program with a
/// global workspace gets it as one more (dropped) `i8` result, which XLA
/// allocates.
pub fn triton_custom_call(kernel: &VerifiedKernel, ttir: &str) -> Result<String, LoweringError> {
    let program = crate::triton(kernel)?;
    let m = Mlir::new();
    Ok(wrapper(&m, kernel, CallTarget::Triton(&program, ttir))?.0)
}

/// What a wrapper module calls.
#[derive(Clone, Copy)]
pub(crate) enum CallTarget<'a> {
    /// `tpu_custom_call` with this JSON backend config.
    Tpu(&'a str),
    /// The host FFI handler, with this registry key.
    Host(&'a str),
    /// XLA's Triton call of this program, with its TTIR.
    Triton(&'a crate::TritonProgram, &'a str),
}

fn wrapper(
    m: &Mlir,
    k: &Kernel,
    target: CallTarget<'_>,
) -> Result<(String, Vec<Transpose>), LoweringError> {
    let ir = Ir::new(&m.ctx, "");
    let (func, transposes) = call_function(&ir, k, target)?;
    let mut module = Module::new(ir.loc());
    module.body().append_operation(func);
    let mut op = module.as_operation_mut();
    op.set_attribute("sym_name", ir.str_attr(&format!("tessera_{}", k.name)));
    // A kernel across chips runs once per device of its mesh, each on its
    // own shard: one partition per device (Mosaic's collectives refuse
    // replicas).
    let partitions = k.mesh.as_ref().map_or(1, |m| m.devices());
    op.set_attribute("mhlo.num_partitions", ir.i32_attr(partitions as i64));
    op.set_attribute("mhlo.num_replicas", ir.i32_attr(1));
    m.verify(&module, "custom call module")?;
    Ok((module.as_operation().to_string(), transposes))
}

/// The public `func.func @main` that calls `k` through `target`, built
/// with `ir` (into a module of its own, or into a program calling it), and
/// the layout changes around the call.
pub(crate) fn call_function<'c>(
    ir: &Ir<'c>,
    k: &Kernel,
    target: CallTarget<'_>,
) -> Result<(melior::ir::Operation<'c>, Vec<Transpose>), LoweringError> {
    let tpu = matches!(target, CallTarget::Tpu(_));
    let physical_order = |o: &kernel_ir::Operand| if tpu { physical_order(o) } else { None };
    let mut main_in: Vec<Type> = Vec::new();
    for p in &k.prefetch {
        main_in.push(ir.tensor(&p.shape, p.dtype));
    }
    let inputs: Vec<usize> = k
        .operands
        .iter()
        .enumerate()
        .filter(|(_, o)| o.role.is_input())
        .map(|(i, _)| i)
        .collect();
    let outputs: Vec<usize> = k
        .operands
        .iter()
        .enumerate()
        .filter(|(_, o)| o.role.is_output())
        .map(|(i, _)| i)
        .collect();
    for &i in &inputs {
        main_in.push(ir.tensor(&k.operands[i].shape, k.operands[i].dtype));
    }
    let main_out: Vec<Type> = outputs
        .iter()
        .map(|&i| ir.tensor(&k.operands[i].shape, k.operands[i].dtype))
        .collect();
    let block = ir.block(&main_in);
    let args = ir.args(&block);
    let mut transposes = Vec::new();
    let mut call_args: Vec<Raw> = args[..k.prefetch.len()].to_vec();
    let mut layouts = Vec::new();
    for p in &k.prefetch {
        layouts.push(row_major_layout(ir, p.shape.len())?);
    }
    for (n, &i) in inputs.iter().enumerate() {
        let o = &k.operands[i];
        let mut v = args[k.prefetch.len() + n];
        if let Some(perm) = physical_order(o) {
            let shape: Vec<usize> = perm.iter().map(|&d| o.shape[d]).collect();
            v = transpose(ir, &block, v, &perm, ir.tensor(&shape, o.dtype))?;
            transposes.push(Transpose {
                operand: o.name.clone(),
                perm: perm.clone(),
                bytes: (o.shape.iter().product::<usize>() * o.dtype.bytes()) as u64,
            });
        }
        if let Some(mem) = memory_in_call(tpu, o.dtype) {
            let shape = physical_shape(o, physical_order(o));
            v = ir.op1(
                &block,
                "stablehlo.convert",
                &[v],
                ir.tensor(&shape, mem),
                Vec::new(),
            )?;
        }
        call_args.push(v);
        layouts.push(row_major_layout(ir, o.shape.len())?);
    }
    let mut result_types = Vec::new();
    let mut result_layouts = Vec::new();
    for &i in &outputs {
        let o = &k.operands[i];
        let shape = physical_shape(o, physical_order(o));
        let dtype = memory_in_call(tpu, o.dtype).unwrap_or(o.dtype);
        result_types.push(ir.tensor(&shape, dtype));
        result_layouts.push(row_major_layout(ir, o.shape.len())?);
    }
    // A Triton program's global workspace: one more result, allocated by
    // XLA and dropped.
    if let CallTarget::Triton(p, _) = target
        && p.workspace_bytes > 0
    {
        let bytes = p.workspace_bytes as usize;
        result_types.push(ir.tensor(&[bytes], kernel_ir::DType::I8));
        result_layouts.push(row_major_layout(ir, 1)?);
    }
    let mut attrs = match target {
        CallTarget::Tpu(backend_config) => vec![
            ("api_version", ir.i32_attr(1)),
            ("backend_config", ir.str_attr(backend_config)),
            ("call_target_name", ir.str_attr("tpu_custom_call")),
            ("kernel_name", ir.str_attr(&k.name)),
            (
                "mhlo.frontend_attributes",
                ir.dict(&[("kernel_metadata", ir.str_attr(&kernel_metadata(k)))]),
            ),
            ("operand_layouts", ir.array_attr(&layouts)),
            ("result_layouts", ir.array_attr(&result_layouts)),
        ],
        CallTarget::Host(key) => vec![
            ("api_version", ir.i32_attr(4)),
            ("backend_config", ir.dict(&[("kernel", ir.str_attr(key))])),
            ("call_target_name", ir.str_attr(HOST_CALL_TARGET)),
            ("operand_layouts", ir.array_attr(&layouts)),
            ("result_layouts", ir.array_attr(&result_layouts)),
        ],
        CallTarget::Triton(p, ttir) => {
            let i32 = |v: u64| ir.i32_attr(v as i64);
            vec![
                ("api_version", ir.i32_attr(4)),
                (
                    "backend_config",
                    ir.dict(&[
                        ("debug", ir.bool_attr(false)),
                        ("grid_x", i32(p.grid[0])),
                        ("grid_y", i32(p.grid[1])),
                        ("grid_z", i32(p.grid[2])),
                        ("ir", ir.str_attr(ttir)),
                        ("name", ir.str_attr(&p.function)),
                        ("num_stages", i32(p.options.num_stages as u64)),
                        ("num_warps", i32(p.options.num_warps as u64)),
                    ]),
                ),
                ("call_target_name", ir.str_attr(TRITON_CALL_TARGET)),
                ("operand_layouts", ir.array_attr(&layouts)),
                ("result_layouts", ir.array_attr(&result_layouts)),
            ]
        }
    };
    // In-out operands: result r aliases the call operand it came in as.
    let mut aliases = Vec::new();
    for (r, &i) in outputs.iter().enumerate() {
        if k.operands[i].role == Role::InOut {
            let operand = k.prefetch.len() + inputs.iter().position(|&x| x == i).unwrap_or(0);
            let out_idx = if outputs.len() > 1 {
                format!("[{r}]")
            } else {
                "[]".into()
            };
            aliases.push(ir.parse_attr(&format!(
                "#stablehlo.output_operand_alias<output_tuple_indices = {out_idx}, operand_index = {operand}, operand_tuple_indices = []>"
            ))?);
        }
    }
    if !aliases.is_empty() {
        attrs.push(("output_operand_aliases", ir.array_attr(&aliases)));
    }
    let results = ir.op(
        &block,
        "stablehlo.custom_call",
        &call_args,
        &result_types,
        attrs,
        Vec::new(),
    )?;
    let mut rets = Vec::new();
    for (r, &i) in outputs.iter().enumerate() {
        let o = &k.operands[i];
        let mut v = results[r];
        if memory_in_call(tpu, o.dtype).is_some() {
            let shape = physical_shape(o, physical_order(o));
            v = ir.op1(
                &block,
                "stablehlo.convert",
                &[v],
                ir.tensor(&shape, o.dtype),
                Vec::new(),
            )?;
        }
        if let Some(perm) = physical_order(o) {
            let inverse: Vec<usize> = (0..perm.len())
                .map(|d| perm.iter().position(|&p| p == d).unwrap_or(0))
                .collect();
            v = transpose(ir, &block, v, &inverse, ir.tensor(&o.shape, o.dtype))?;
            transposes.push(Transpose {
                operand: o.name.clone(),
                perm: inverse,
                bytes: (o.shape.iter().product::<usize>() * o.dtype.bytes()) as u64,
            });
        }
        rets.push(v);
    }
    ir.op(&block, "func.return", &rets, &[], Vec::new(), Vec::new())?;
    // On a TPU an in-out operand's argument is donated to its result, as
    // a caller that writes in place (a serving step's cache) donates it:
    // otherwise XLA copies the argument before the call, a copy the
    // kernel's compile and estimate would count. The CPU and GPU modules
    // run here, on buffers their callers keep: not donated.
    let donated: Vec<(usize, usize)> = if tpu {
        outputs
            .iter()
            .enumerate()
            .filter(|(_, i)| k.operands[**i].role == Role::InOut)
            .map(|(r, i)| {
                let arg = k.prefetch.len() + inputs.iter().position(|x| x == i).unwrap_or(0);
                (arg, r)
            })
            .collect()
    } else {
        Vec::new()
    };
    let func = ir.public_main_donating(block, &main_in, &main_out, &donated)?;
    Ok((func, transposes))
}

/// `o`'s shape in the physical dim order `perm` (logical without one).
fn physical_shape(o: &kernel_ir::Operand, perm: Option<Vec<usize>>) -> Vec<usize> {
    match perm {
        Some(perm) => perm.iter().map(|&d| o.shape[d]).collect(),
        None => o.shape.clone(),
    }
}

/// The element type a TPU call passes a `dtype` operand as, when it is not
/// `dtype` itself: bool buffers are i32 in Mosaic memory.
fn memory_in_call(tpu: bool, dtype: kernel_ir::DType) -> Option<kernel_ir::DType> {
    let mem = memory_dtype(Flavor::Mosaic, dtype);
    (tpu && mem != dtype).then_some(mem)
}

fn transpose<'c>(
    ir: &Ir<'c>,
    block: &melior::ir::Block<'c>,
    v: Raw,
    perm: &[usize],
    ty: Type<'c>,
) -> Result<Raw, LoweringError> {
    let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
    ir.op1(
        block,
        "stablehlo.transpose",
        &[v],
        ty,
        vec![("permutation", ir.i64_array(&p))],
    )
}

/// `dense<[r-1, ..., 0]> : tensor<rxindex>`: row-major minor-to-major.
fn row_major_layout<'c>(
    ir: &Ir<'c>,
    rank: usize,
) -> Result<melior::ir::Attribute<'c>, LoweringError> {
    let dims: Vec<String> = (0..rank).rev().map(|d| d.to_string()).collect();
    let text = match rank {
        0 => "dense<> : tensor<0xindex>".to_string(),
        1 => "dense<0> : tensor<1xindex>".to_string(),
        _ => format!("dense<[{}]> : tensor<{rank}xindex>", dims.join(", ")),
    };
    ir.parse_attr(&text)
}

/// The custom call's `kernel_metadata` (Pallas's form: a compact JSON
/// object whose `mesh_axes` is itself a JSON list, sorted, as a string):
/// `{}` for a kernel on one device.
fn kernel_metadata(k: &kernel_ir::Kernel) -> String {
    let Some(mesh) = &k.mesh else {
        return "{}".into();
    };
    let mut axes: Vec<&str> = mesh.axes.iter().map(|(n, _)| n.as_str()).collect();
    axes.sort_unstable();
    let list: Vec<String> = axes.iter().map(|a| kernel_ir::quote::json_str(a)).collect();
    let inner = format!("[{}]", list.join(", "));
    format!("{{\"mesh_axes\":{}}}", kernel_ir::quote::json_str(&inner))
}
