//! The kernel module: the kernel `func.func` over grid indices, scalar
//! prefetch, operand windows and scratch, plus one `@transform_i` per
//! blocked operand, in one of two flavors:
//!
//! * **upstream** (target 1): only upstream dialects (func, memref, vector,
//!   arith, math, scf); memory spaces are integers (1 = vmem, 2 = smem, none
//!   = any), a non-row-major layout is a strided memref, alignment is the
//!   `llvm.align` argument attribute. It round-trips through `mlir-opt` and is
//!   what the host JIT compiles.
//! * **Mosaic** (target 2): the conventions Pallas emits for TPU:
//!   `#tpu.memory_space<..>`, `#tpu.dimension_semantics<..>`,
//!   `tpu.core_type`, `tpu.matmul`, `tpu.iota`, `tpu.vector_store`, and
//!   `stable_mosaic.version`. An operand with a layout hint is seen in its
//!   *physical* dimension order (the wrapper transposes it at the boundary),
//!   and loads and stores of it transpose in registers.
//!
//! Both flavors come from the same walk over the kernel IR (`body`).

use melior::ir::operation::OperationMutLike;
use melior::ir::{BlockLike, Module};

use kernel_ir::{DimSemantics, IndexExpr, Kernel, MemorySpace, Role};

use crate::LoweringError;
use crate::body::BodyEmitter;
use crate::convention::{ArgLayout, Flavor, Window, memory_dtype, memory_space, window};
use crate::index_expr::index_expr;
use crate::mlir::{Attrs, Ir, Raw};

/// The `stable_mosaic.version` that jax 0.11.2's Pallas emits (read from
/// its TPU export); the Mosaic deserializer upgrades older versions.
pub const MOSAIC_VERSION: i64 = 15;

/// Options of one kernel-module build.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModuleOptions {
    pub flavor: Flavor,
    /// Leave memory spaces out of memref types (the host JIT's form).
    pub no_memory_spaces: bool,
}

/// Builds the kernel module into a fresh module of `ir`'s context.
pub(crate) fn build<'c>(
    ir: &Ir<'c>,
    k: &Kernel,
    opts: ModuleOptions,
) -> Result<Module<'c>, LoweringError> {
    let flavor = opts.flavor;
    // Mosaic takes window parameters only with explicit iteration bounds
    // ("window attributes can only be specified when explicit
    // iteration_bounds are used"): a grid-free kernel with a windowed
    // operand is lowered as the same kernel on a grid of one step.
    let one_step;
    let k = if flavor == Flavor::Mosaic
        && k.grid.dims.is_empty()
        && k.operands.iter().any(|o| o.space != MemorySpace::Any)
    {
        let mut g = k.clone();
        g.grid.dims.push(kernel_ir::GridDim {
            bound: 1,
            semantics: DimSemantics::Arbitrary,
        });
        one_step = g;
        &one_step
    } else {
        k
    };
    let module = Module::new(ir.loc());
    let space = |s: MemorySpace| -> Result<_, LoweringError> {
        if opts.no_memory_spaces {
            Ok(None)
        } else {
            memory_space(ir, s, flavor)
        }
    };
    let layout = ArgLayout::of(k);

    // Argument types.
    let mut arg_types = vec![ir.i32(); layout.grid];
    for p in &k.prefetch {
        arg_types.push(ir.memref(&p.shape, p.dtype, None, space(MemorySpace::Smem)?));
    }
    let mut windows = Vec::new();
    for &(i, _) in &layout.call_order {
        let o = &k.operands[i];
        let w = window(o, flavor);
        arg_types.push(ir.memref(
            &w.shape,
            memory_dtype(opts.flavor, o.dtype),
            w.strides.as_deref(),
            space(o.space)?,
        ));
        windows.push(w);
    }
    for s in k.scratch.iter().filter(|s| !s.scoped) {
        arg_types.push(ir.memref(
            &s.shape,
            memory_dtype(opts.flavor, s.dtype),
            None,
            space(s.space)?,
        ));
    }
    for s in k
        .semaphores
        .iter()
        .filter(|s| crate::convention::is_semaphore_arg(s))
    {
        arg_types.push(crate::convention::semaphore_type(ir, s.kind, &s.shape));
    }

    // The kernel body.
    let entry = ir.block(&arg_types);
    let args = ir.args(&entry);
    let op_windows: Vec<Window> = k.operands.iter().map(|o| window(o, flavor)).collect();
    let mut emitter = BodyEmitter::new(ir, k, flavor, &layout, &args, &op_windows);
    emitter.top(&entry)?;
    ir.op(&entry, "func.return", &[], &[], Vec::new(), Vec::new())?;

    // Function attributes, as Pallas writes them.
    let mut window_params = Vec::new();
    let mut transforms = Vec::new();
    for (n, &(i, _)) in layout.call_order.iter().enumerate() {
        let o = &k.operands[i];
        if o.space == MemorySpace::Any {
            window_params.push(ir.dict(&[]));
            continue;
        }
        let name = format!("transform_{n}");
        let w = &windows[n];
        let bounds: Vec<i64> = w.shape.iter().map(|&d| d as i64).collect();
        let mut entries: Vec<(&str, melior::ir::Attribute<'c>)> = Vec::new();
        let constant = o
            .block
            .index_map
            .exprs
            .iter()
            .all(|e| matches!(e, IndexExpr::Const(_)));
        // As Pallas writes it: an explicit depth, else synchronous for a
        // block every step shares.
        let mode = match o.block.buffers {
            Some(1) => Some("synchronous"),
            Some(_) => Some("double_buffered"),
            None if constant && k.grid.steps() > 1 => Some("synchronous"),
            None => None,
        };
        if let (Flavor::Mosaic, Some(mode)) = (flavor, mode) {
            entries.push((
                "pipeline_mode",
                ir.parse_attr(&format!("#tpu.pipeline_mode<{mode}>"))?,
            ));
        }
        if let Some(pad) = &o.block.element {
            // As Pallas's `pl.Element` dims: the transform returns element
            // offsets into the array padded by these amounts (physical
            // order, as the bounds).
            let order: Vec<usize> = if w.physical.is_empty() {
                (0..pad.low.len()).collect()
            } else {
                w.physical.clone()
            };
            let list = |v: &[usize]| {
                let items: Vec<String> = order.iter().map(|&d| v[d].to_string()).collect();
                format!("[{}]", items.join(", "))
            };
            // libtpu takes no low padding: the low padding moves after
            // the array, the transform clamps at 0 and loads rotate the
            // window into place (`body/element.rs`).
            let high: Vec<usize> = match flavor {
                Flavor::Mosaic => (0..pad.low.len())
                    .map(|d| pad.low[d] + pad.high[d])
                    .collect(),
                Flavor::Upstream => pad.high.clone(),
            };
            let low = match flavor {
                Flavor::Mosaic => vec![0; pad.low.len()],
                Flavor::Upstream => pad.low.clone(),
            };
            let (low, high) = (list(&low), list(&high));
            let kind = match flavor {
                Flavor::Mosaic => ir.parse_attr(&format!("#tpu.element_window<{low},{high}>"))?,
                Flavor::Upstream => ir.str_attr(&format!("element_window<{low},{high}>")),
            };
            entries.push(("window_kind", kind));
        }
        entries.push(("transform_indices", ir.symbol(&name)));
        entries.push(("window_bounds", ir.i64_array(&bounds)));
        window_params.push(ir.dict(&entries));
        let rebased = rebased_map(k, o, flavor);
        let logical = rebased.as_ref().unwrap_or(&o.block.index_map.exprs);
        let exprs: Vec<&IndexExpr> = if w.physical.is_empty() {
            logical.iter().collect()
        } else {
            w.physical.iter().map(|&d| &logical[d]).collect()
        };
        transforms.push(transform_fn(ir, k, &name, &exprs, flavor, opts)?);
    }
    let sem: Vec<melior::ir::Attribute<'c>> = k
        .grid
        .dims
        .iter()
        .map(|d| {
            let s = match d.semantics {
                DimSemantics::Parallel => "parallel",
                DimSemantics::Arbitrary => "arbitrary",
                DimSemantics::CoreParallel => "core_parallel",
            };
            match flavor {
                Flavor::Mosaic => ir.parse_attr(&format!("#tpu.dimension_semantics<{s}>")),
                Flavor::Upstream => Ok(ir.str_attr(s)),
            }
        })
        .collect::<Result<_, _>>()?;
    let bounds: Vec<i64> = k.grid.dims.iter().map(|d| d.bound as i64).collect();
    let mut attrs: Attrs<'c> = vec![
        ("sym_name", ir.str_attr(&k.name)),
        ("function_type", ir.type_attr(ir.func_type(&arg_types, &[]))),
        ("dimension_semantics", ir.array_attr(&sem)),
        ("iteration_bounds", ir.i64_array(&bounds)),
        ("scalar_prefetch", ir.i64_attr(k.prefetch.len() as i64)),
        (
            "scratch_operands",
            ir.i64_attr(
                (k.scratch.iter().filter(|s| !s.scoped).count()
                    + k.semaphores
                        .iter()
                        .filter(|s| crate::convention::is_semaphore_arg(s))
                        .count()) as i64,
            ),
        ),
        ("window_params", ir.array_attr(&window_params)),
    ];
    if flavor == Flavor::Mosaic {
        attrs.push(("tpu.core_type", ir.parse_attr("#tpu.core_type<tc>")?));
    }
    if flavor == Flavor::Upstream && k.operands.iter().any(|o| o.layout.align.is_some()) {
        // Alignment travels as LLVM's argument attribute, which the host
        // lowering turns into `align` on the pointer.
        let mut arg_attrs = vec![ir.dict(&[]); arg_types.len()];
        for &(i, role) in &layout.call_order {
            if let Some(a) = k.operands[i].layout.align {
                let arg = if role == Role::In {
                    layout.load[i]
                } else {
                    layout.store[i]
                };
                arg_attrs[arg] = ir.dict(&[("llvm.align", ir.i64_attr(a as i64))]);
            }
        }
        attrs.push(("arg_attrs", ir.array_attr(&arg_attrs)));
    }
    let func = ir.build("func.func", &[], &[], attrs, vec![ir.region(entry)])?;
    module.body().append_operation(func);
    for t in transforms {
        module.body().append_operation(t);
    }
    if flavor == Flavor::Mosaic {
        let mut m = module;
        m.as_operation_mut()
            .set_attribute("stable_mosaic.version", ir.i64_attr(MOSAIC_VERSION));
        return Ok(m);
    }
    Ok(module)
}

/// `@transform_i(grid indices.., scalar prefetch..) -> block indices`.
/// On Mosaic, an element window's map clamped into the array where it has
/// low padding, `max(v − low, 0)` (see `body/element.rs`), written as
/// `(.. floordiv u) × u` with `u` the dim's tile so that libtpu can prove
/// the offset tile-aligned (the verifier checks `v` and `low` are; the
/// division then changes nothing).
fn rebased_map(k: &Kernel, o: &kernel_ir::Operand, flavor: Flavor) -> Option<Vec<IndexExpr>> {
    use kernel_ir::IndexOp::{FloorDiv, Max, Mul, Sub};
    let pad = o.block.element.as_ref()?;
    if flavor != Flavor::Mosaic || pad.low.iter().all(|&l| l == 0) {
        return None;
    }
    let rank = o.shape.len();
    let bin = |op, a: IndexExpr, b: IndexExpr| IndexExpr::Binary(op, Box::new(a), Box::new(b));
    Some(
        o.block
            .index_map
            .exprs
            .iter()
            .zip(&pad.low)
            .enumerate()
            .map(|(d, (e, &l))| {
                if l == 0 {
                    return e.clone();
                }
                let clamped = bin(
                    Max,
                    bin(Sub, e.clone(), IndexExpr::Const(l as i64)),
                    IndexExpr::Const(0),
                );
                let unit = match rank - d {
                    1 => k.target.tile_lanes(),
                    2 => k.target.tile_rows(o.dtype),
                    _ => 1,
                } as i64;
                if unit == 1 {
                    clamped
                } else {
                    let tiles = bin(FloorDiv, clamped, IndexExpr::Const(unit));
                    bin(Mul, tiles, IndexExpr::Const(unit))
                }
            })
            .collect(),
    )
}

fn transform_fn<'c>(
    ir: &Ir<'c>,
    k: &Kernel,
    name: &str,
    exprs: &[&IndexExpr],
    flavor: Flavor,
    opts: ModuleOptions,
) -> Result<melior::ir::Operation<'c>, LoweringError> {
    let mut types = vec![ir.i32(); k.grid.rank()];
    for p in &k.prefetch {
        let space = if opts.no_memory_spaces {
            None
        } else {
            memory_space(ir, MemorySpace::Smem, flavor)?
        };
        types.push(ir.memref(&p.shape, p.dtype, None, space));
    }
    let block = ir.block(&types);
    let args = ir.args(&block);
    let results = exprs
        .iter()
        .map(|e| {
            index_expr(
                ir,
                &block,
                e,
                &args[..k.grid.rank()],
                &args[k.grid.rank()..],
            )
        })
        .collect::<Result<Vec<Raw>, _>>()?;
    ir.op(&block, "func.return", &results, &[], Vec::new(), Vec::new())?;
    let fty = ir.func_type(&types, &vec![ir.i32(); exprs.len()]);
    ir.build(
        "func.func",
        &[],
        &[],
        vec![
            ("sym_name", ir.str_attr(name)),
            ("function_type", ir.type_attr(fty)),
        ],
        vec![ir.region(block)],
    )
}
