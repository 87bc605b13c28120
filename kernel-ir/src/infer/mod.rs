//! Result types of ops: the one place that knows each op's typing rule.
//!
//! The builder calls it to type values as they are built; the verifier calls
//! it again on the finished body, so a kernel put together by hand gets the
//! same checks.

use crate::error::ErrorKind;
use crate::ops::ShapeDisplay;
use crate::{
    BinaryOp, BufferRef, DType, DotDims, Index, IndexValue, Kernel, OpKind, ReduceOp, Role,
    SemaphoreKind, SemaphoreSlot, TileType, UnaryOp, ValueId,
};

/// Looks up the type of a value that is in scope.
pub(crate) type TypeOf<'a> = dyn Fn(ValueId) -> Result<TileType, ErrorKind> + 'a;

mod moves;
mod sync;
use sync::*;

fn shape_str(s: &[usize]) -> String {
    ShapeDisplay(s).to_string()
}

/// Result types of `kind` in kernel `sig` (whose body is not read).
pub(crate) fn result_types(
    sig: &Kernel,
    kind: &OpKind,
    ty: &TypeOf<'_>,
) -> Result<Vec<TileType>, ErrorKind> {
    let one = |t: TileType| Ok(vec![t]);
    match kind {
        OpKind::Constant { value, ty: t } => {
            let ok = match value {
                crate::Literal::Float(_) => t.dtype.is_float(),
                crate::Literal::Int(_) => t.dtype.is_numeric(),
                crate::Literal::Bool(_) => t.dtype == DType::Bool,
            };
            if !ok {
                return Err(ErrorKind::DType {
                    op: "constant",
                    detail: format!("literal {value:?} cannot be a {} constant", t.dtype),
                });
            }
            // An integer constant holds its value exactly or is an error
            // (it would wrap: 1000 as i8 is -24).
            let range = match t.dtype {
                DType::I32 => Some((i64::from(i32::MIN), i64::from(i32::MAX))),
                DType::I8 => Some((i64::from(i8::MIN), i64::from(i8::MAX))),
                _ => None,
            };
            if let (crate::Literal::Int(n), Some((lo, hi))) = (value, range)
                && !(lo..=hi).contains(n)
            {
                return Err(ErrorKind::DType {
                    op: "constant",
                    detail: format!(
                        "{n} does not fit {} ({lo} to {hi}); it would wrap: use a wider type or a value in range",
                        t.dtype
                    ),
                });
            }
            one(t.clone())
        }
        OpKind::ProgramId { dim } | OpKind::NumPrograms { dim } => {
            if *dim >= sig.grid.rank() {
                return Err(ErrorKind::Axis {
                    op: kind.mnemonic(),
                    detail: format!(
                        "grid dim {dim} does not exist; the grid has {} dims",
                        sig.grid.rank()
                    ),
                });
            }
            one(TileType::scalar(DType::I32))
        }
        OpKind::Iota { ty: t, dim } => {
            if *dim >= t.shape.len() {
                return Err(ErrorKind::Axis {
                    op: "iota",
                    detail: format!(
                        "dim {dim} is out of range for shape {}",
                        shape_str(&t.shape)
                    ),
                });
            }
            if t.dtype == DType::Bool {
                return Err(ErrorKind::DType {
                    op: "iota",
                    detail: "iota needs a numeric dtype, not bool".into(),
                });
            }
            one(t.clone())
        }
        OpKind::Load {
            buffer,
            indices,
            mask,
        } => {
            let (name, dtype, shape) = buffer_info(sig, *buffer)?;
            let out = check_indices(sig, "load", *buffer, &name, &shape, indices, ty)?;
            let result = TileType::new(dtype, out);
            if let Some(m) = mask {
                let mt = ty(*m)?;
                if mt.dtype != DType::Bool || mt.shape != result.shape {
                    return Err(ErrorKind::Shape {
                        op: "load",
                        detail: format!(
                            "the mask is {mt} but must be a bool tile of the loaded shape {}",
                            shape_str(&result.shape)
                        ),
                    });
                }
            }
            one(result)
        }
        OpKind::Store {
            buffer,
            indices,
            value,
            mask,
        } => {
            let (name, dtype, shape) = buffer_info(sig, *buffer)?;
            match buffer {
                BufferRef::Operand(i) if sig.operands[*i].role == Role::In => {
                    return Err(ErrorKind::ReadOnly {
                        buffer: name,
                        what: "an input operand",
                    });
                }
                BufferRef::Prefetch(_) => {
                    return Err(ErrorKind::ReadOnly {
                        buffer: name,
                        what: "scalar prefetch",
                    });
                }
                _ => {}
            }
            let view = check_indices(sig, "store", *buffer, &name, &shape, indices, ty)?;
            let vt = ty(*value)?;
            if vt.dtype != dtype {
                return Err(ErrorKind::DType {
                    op: "store",
                    detail: format!(
                        "`{name}` holds {dtype} but the value is {}; convert it first",
                        vt.dtype
                    ),
                });
            }
            if vt.shape != view {
                return Err(ErrorKind::Shape {
                    op: "store",
                    detail: format!(
                        "the indexed view of `{name}` is {} but the value is {}",
                        shape_str(&view),
                        shape_str(&vt.shape)
                    ),
                });
            }
            if let Some(m) = mask {
                let mt = ty(*m)?;
                if mt.dtype != DType::Bool || mt.shape != view {
                    return Err(ErrorKind::Shape {
                        op: "store",
                        detail: format!(
                            "the mask is {mt} but must be a bool tile of shape {}",
                            shape_str(&view)
                        ),
                    });
                }
            }
            Ok(vec![])
        }
        OpKind::Unary { op, x } => {
            let t = ty(*x)?;
            let ok = match op {
                UnaryOp::Not => !t.dtype.is_float(),
                UnaryOp::Neg | UnaryOp::Abs => t.dtype.is_numeric(),
                _ => t.dtype.is_float(),
            };
            if !ok {
                let want = match op {
                    UnaryOp::Not => "a bool or integer",
                    UnaryOp::Neg | UnaryOp::Abs => "a numeric",
                    _ => "a float (convert integers first)",
                };
                return Err(ErrorKind::DType {
                    op: op.name(),
                    detail: format!("operand is {}, needs {want} dtype", t.dtype),
                });
            }
            one(t)
        }
        OpKind::Binary { op, lhs, rhs } => {
            let (a, b) = (ty(*lhs)?, ty(*rhs)?);
            same_type(op.name(), &a, &b)?;
            let ok = if op.is_logical() {
                !a.dtype.is_float()
            } else if op.is_shift() {
                !a.dtype.is_float() && a.dtype != DType::Bool
            } else if *op == BinaryOp::Pow {
                a.dtype.is_float()
            } else {
                a.dtype.is_numeric()
            };
            if !ok {
                return Err(ErrorKind::DType {
                    op: op.name(),
                    detail: format!(
                        "operands are {}, which {} does not take",
                        a.dtype,
                        op.name()
                    ),
                });
            }
            one(a)
        }
        OpKind::Compare { op: _, lhs, rhs } => {
            let (a, b) = (ty(*lhs)?, ty(*rhs)?);
            same_type("cmp", &a, &b)?;
            one(TileType::new(DType::Bool, a.shape))
        }
        OpKind::Select {
            cond,
            on_true,
            on_false,
        } => {
            let (c, a, b) = (ty(*cond)?, ty(*on_true)?, ty(*on_false)?);
            same_type("select", &a, &b)?;
            if c.dtype != DType::Bool || c.shape != a.shape {
                return Err(ErrorKind::Shape {
                    op: "select",
                    detail: format!(
                        "the condition is {c} but must be a bool tile of shape {}",
                        shape_str(&a.shape)
                    ),
                });
            }
            one(a)
        }
        OpKind::Convert { x, dtype } => one(TileType::new(*dtype, ty(*x)?.shape)),
        OpKind::Bitcast { x, dtype } => {
            let t = ty(*x)?;
            let pair = [t.dtype, *dtype];
            if !pair.iter().all(|d| matches!(d, DType::F32 | DType::I32)) {
                return Err(ErrorKind::DType {
                    op: "bitcast",
                    detail: format!(
                        "{} to {dtype}: bitcast reads f32 bits as i32 or i32 bits as f32 (the one pair every path supports); use `convert` to change a value's type",
                        t.dtype
                    ),
                });
            }
            one(TileType::new(*dtype, t.shape))
        }
        OpKind::BroadcastInDim { x, shape, dims } => {
            let t = ty(*x)?;
            let bad = |detail: String| ErrorKind::Shape {
                op: "broadcast_in_dim",
                detail,
            };
            if dims.len() != t.shape.len() {
                return Err(bad(format!(
                    "operand {} has rank {} but {} dims were given",
                    t,
                    t.shape.len(),
                    dims.len()
                )));
            }
            for (i, &d) in dims.iter().enumerate() {
                if d >= shape.len() || (i > 0 && d <= dims[i - 1]) {
                    return Err(bad(format!(
                        "dims {dims:?} must be increasing and below the result rank {}",
                        shape.len()
                    )));
                }
                if t.shape[i] != 1 && t.shape[i] != shape[d] {
                    return Err(bad(format!(
                        "operand dim {i} is {} and cannot broadcast to result dim {d} of size {}",
                        t.shape[i], shape[d]
                    )));
                }
            }
            one(TileType::new(t.dtype, shape.clone()))
        }
        OpKind::Reshape { x, shape } => {
            let t = ty(*x)?;
            let n: Option<usize> = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if n != Some(t.elements()) {
                return Err(ErrorKind::Shape {
                    op: "reshape",
                    detail: format!(
                        "cannot reshape {} ({} elements) to {}",
                        shape_str(&t.shape),
                        t.elements(),
                        shape_str(shape)
                    ),
                });
            }
            one(TileType::new(t.dtype, shape.clone()))
        }
        OpKind::Transpose { x, perm } => {
            let t = ty(*x)?;
            if !is_permutation(perm, t.shape.len()) {
                return Err(ErrorKind::Axis {
                    op: "transpose",
                    detail: format!("{perm:?} is not a permutation of 0..{}", t.shape.len()),
                });
            }
            one(TileType::new(
                t.dtype,
                perm.iter().map(|&p| t.shape[p]).collect::<Vec<_>>(),
            ))
        }
        OpKind::Roll { x, shift, axis } => one(moves::roll(ty(*x)?, *shift, *axis)?),
        OpKind::Slice {
            x,
            axis,
            start,
            len,
        } => one(moves::slice(ty(*x)?, *axis, *start, *len)?),
        OpKind::Concat { lhs, rhs, axis } => one(moves::concat(ty(*lhs)?, ty(*rhs)?, *axis)?),
        OpKind::Reduce { op, x, axes } => {
            let t = ty(*x)?;
            for (i, &a) in axes.iter().enumerate() {
                if a >= t.shape.len() || (i > 0 && a <= axes[i - 1]) {
                    return Err(ErrorKind::Axis {
                        op: "reduce",
                        detail: format!(
                            "axes {axes:?} must be increasing and below the rank {} of {t}",
                            t.shape.len()
                        ),
                    });
                }
            }
            if !t.dtype.is_numeric() || (*op == ReduceOp::Sum && t.dtype == DType::Bool) {
                return Err(ErrorKind::DType {
                    op: "reduce",
                    detail: format!("cannot {} a {} tile", op.name(), t.dtype),
                });
            }
            let shape: Vec<usize> = t
                .shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect();
            one(TileType::new(t.dtype, shape))
        }
        OpKind::Dot {
            lhs,
            rhs,
            dims,
            acc,
        } => dot_type(&ty(*lhs)?, &ty(*rhs)?, dims, *acc).map(|t| vec![t]),
        OpKind::For {
            lower,
            upper,
            step,
            init,
            body,
            ..
        } => {
            for b in [lower, upper] {
                if let IndexValue::Dynamic(v) = b {
                    scalar_i32("for", "loop bound", &ty(*v)?)?;
                }
            }
            if *step <= 0 || *step > i64::from(i32::MAX) {
                return Err(ErrorKind::NotScalar {
                    op: "for",
                    detail: format!("step is {step}; it must be positive and fit i32"),
                });
            }
            // The induction variable is i32: so are its bounds, and the
            // trip count and every index value fit i64 arithmetic.
            for b in [lower, upper] {
                if let IndexValue::Static(n) = b
                    && i32::try_from(*n).is_err()
                {
                    return Err(ErrorKind::NotScalar {
                        op: "for",
                        detail: format!(
                            "the loop bound {n} is outside i32 ({} to {}); the induction variable is i32",
                            i32::MIN,
                            i32::MAX
                        ),
                    });
                }
            }
            let init_types = init.iter().map(|v| ty(*v)).collect::<Result<Vec<_>, _>>()?;
            if body.args.len() != init.len() + 1 {
                return Err(ErrorKind::Yield {
                    op: "for",
                    detail: format!(
                        "the body takes {} args but needs the index and {} carried values",
                        body.args.len(),
                        init.len()
                    ),
                });
            }
            check_yields("for", &init_types, &body.yields, ty)?;
            Ok(init_types)
        }
        OpKind::If {
            cond,
            then_region,
            else_region,
        } => {
            let c = ty(*cond)?;
            if c != TileType::scalar(DType::Bool) {
                return Err(ErrorKind::NotScalar {
                    op: "if",
                    detail: format!(
                        "the condition is {c}; it must be a bool scalar (reduce a tile first, or use select for elementwise choice)"
                    ),
                });
            }
            if !then_region.args.is_empty() || !else_region.args.is_empty() {
                return Err(ErrorKind::Yield {
                    op: "if",
                    detail: "branches take no arguments".into(),
                });
            }
            let then_types = then_region
                .yields
                .iter()
                .map(|v| ty(*v))
                .collect::<Result<Vec<_>, _>>()?;
            check_yields("if", &then_types, &else_region.yields, ty)?;
            Ok(then_types)
        }
        OpKind::DmaStart(c) | OpKind::DmaWait(c) | OpKind::DmaWaitSend(c) => {
            let op = kind.mnemonic();
            check_copy(sig, op, c, ty)?;
            match &c.remote {
                Some(r) => {
                    check_device(sig, op, &r.device, ty)?;
                    check_sem(sig, op, &r.send_sem, &[SemaphoreKind::Dma], ty)?;
                }
                None if matches!(kind, OpKind::DmaWaitSend(_)) => {
                    return Err(ErrorKind::Dma {
                        op,
                        detail: "a local copy has no send side; wait for it with `dma_wait`".into(),
                    });
                }
                None => {}
            }
            Ok(vec![])
        }
        OpKind::DeviceId => {
            mesh_of(sig, "device_id")?;
            one(TileType::scalar(DType::I32))
        }
        OpKind::AxisIndex { axis } => {
            let mesh = mesh_of(sig, "axis_index")?;
            if *axis >= mesh.axes.len() {
                return Err(ErrorKind::Dma {
                    op: "axis_index",
                    detail: format!(
                        "mesh axis {axis} does not exist; the mesh has {} axes",
                        mesh.axes.len()
                    ),
                });
            }
            one(TileType::scalar(DType::I32))
        }
        OpKind::RemoteSignal {
            sem,
            amount,
            device,
        } => {
            let op = "remote_signal";
            check_sem(
                sig,
                op,
                sem,
                &[SemaphoreKind::Regular, SemaphoreKind::Barrier],
                ty,
            )?;
            check_device(sig, op, device, ty)?;
            check_amount(op, amount, ty)?;
            Ok(vec![])
        }
        OpKind::SemSignal { sem, amount } | OpKind::SemWait { sem, amount } => {
            let op = kind.mnemonic();
            // A kernel waits on its barrier semaphore; others signal it.
            let kinds: &[SemaphoreKind] = match kind {
                OpKind::SemWait { .. } => &[SemaphoreKind::Regular, SemaphoreKind::Barrier],
                _ => &[SemaphoreKind::Regular],
            };
            check_sem(sig, op, sem, kinds, ty)?;
            match amount {
                IndexValue::Static(n) if *n < 0 => Err(ErrorKind::Dma {
                    op,
                    detail: format!(
                        "the amount is {n}; semaphores count up from zero, so it must be ≥ 0"
                    ),
                }),
                IndexValue::Static(_) => Ok(vec![]),
                IndexValue::Dynamic(v) => {
                    scalar_i32(op, "amount", &ty(*v)?)?;
                    Ok(vec![])
                }
            }
        }
        OpKind::SemRead { sem } => {
            check_sem(sig, "sem_read", sem, &[SemaphoreKind::Regular], ty)?;
            one(TileType::scalar(DType::I32))
        }
        OpKind::Scope {
            scratch,
            semaphores,
            body,
        } => {
            let bad = |detail: String| ErrorKind::Dma {
                op: "scope",
                detail,
            };
            if !body.args.is_empty() || !body.yields.is_empty() {
                return Err(bad("a scope's body takes no args and yields nothing".into()));
            }
            for &i in scratch {
                match sig.scratch.get(i) {
                    Some(s) if s.scoped => {}
                    Some(s) => {
                        return Err(bad(format!(
                            "scratch `{}` is the kernel's, not a scoped buffer",
                            s.name
                        )));
                    }
                    None => return Err(bad(format!("scratch {i} does not exist"))),
                }
            }
            for &i in semaphores {
                match sig.semaphores.get(i) {
                    Some(s) if s.scoped => {}
                    Some(s) => {
                        return Err(bad(format!(
                            "semaphores `{}` are the kernel's, not scoped ones",
                            s.name
                        )));
                    }
                    None => return Err(bad(format!("semaphore array {i} does not exist"))),
                }
            }
            Ok(vec![])
        }
    }
}

/// Checks a value used as a dynamic index or bound: an i32 scalar.
pub(crate) fn scalar_i32(op: &'static str, what: &str, t: &TileType) -> Result<(), ErrorKind> {
    if *t != TileType::scalar(DType::I32) {
        return Err(ErrorKind::NotScalar {
            op,
            detail: format!("the {what} is {t}; it must be an i32 scalar"),
        });
    }
    Ok(())
}

fn same_type(op: &'static str, a: &TileType, b: &TileType) -> Result<(), ErrorKind> {
    if a.dtype != b.dtype {
        return Err(ErrorKind::DType {
            op,
            detail: format!(
                "operands are {} and {}; convert one so both match",
                a.dtype, b.dtype
            ),
        });
    }
    if a.shape != b.shape {
        return Err(ErrorKind::Shape {
            op,
            detail: format!(
                "operand shapes {} and {} differ; broadcast one explicitly",
                shape_str(&a.shape),
                shape_str(&b.shape)
            ),
        });
    }
    Ok(())
}

/// True when `perm` is a permutation of `0..rank`.
pub(crate) fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm
            .iter()
            .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

fn buffer_info(sig: &Kernel, b: BufferRef) -> Result<(String, DType, Vec<usize>), ErrorKind> {
    sig.buffer(b)
        .map(|(n, d, s)| (n.to_string(), d, s.to_vec()))
        .ok_or_else(|| ErrorKind::UnknownBuffer(format!("{b:?} does not exist in this kernel")))
}

/// Checks load/store indices against the buffer view; returns the shape of
/// the indexed view.
fn check_indices(
    _sig: &Kernel,
    op: &'static str,
    _buffer: BufferRef,
    name: &str,
    shape: &[usize],
    indices: &[Index],
    ty: &TypeOf<'_>,
) -> Result<Vec<usize>, ErrorKind> {
    let bad = |detail: String| ErrorKind::Index {
        op,
        buffer: name.to_string(),
        detail,
    };
    if indices.len() != shape.len() {
        return Err(bad(format!(
            "{} indices given for a buffer of shape {}; give one index per dim",
            indices.len(),
            shape_str(shape)
        )));
    }
    let mut out = Vec::new();
    for (d, (ix, &size)) in indices.iter().zip(shape).enumerate() {
        let (start, len) = match ix {
            Index::Slice { start, len } => {
                out.push(*len);
                if *len == 0 {
                    return Err(bad(format!("dim {d}: a slice must have length ≥ 1")));
                }
                (start, *len)
            }
            Index::Point(start) => (start, 1),
        };
        match start {
            IndexValue::Static(s) => {
                let end = (*s).checked_add(len as i64);
                if *s < 0 || end.is_none_or(|e| e > size as i64) {
                    return Err(bad(format!(
                        "dim {d}: elements {s}..{} are outside 0..{size}",
                        s.saturating_add(len as i64)
                    )));
                }
            }
            IndexValue::Dynamic(v) => {
                scalar_i32(op, "dynamic index", &ty(*v)?)?;
                if len > size {
                    return Err(bad(format!(
                        "dim {d}: a slice of {len} elements cannot fit in {size}"
                    )));
                }
            }
        }
    }
    Ok(out)
}

/// Result type of a `dot_general`.
pub(crate) fn dot_type(
    a: &TileType,
    b: &TileType,
    dims: &DotDims,
    acc: DType,
) -> Result<TileType, ErrorKind> {
    if a.dtype != b.dtype {
        return Err(ErrorKind::DotDType {
            detail: format!(
                "lhs is {} but rhs is {}; convert one so both match (the MXU multiplies equal types)",
                a.dtype, b.dtype
            ),
        });
    }
    let acc_ok = if a.dtype.is_float() {
        acc == DType::F32 || acc == a.dtype
    } else if a.dtype.is_int() {
        acc == DType::I32
    } else {
        false
    };
    if !acc_ok {
        return Err(ErrorKind::DotDType {
            detail: format!(
                "{} operands cannot accumulate in {acc}; use {}",
                a.dtype,
                if a.dtype.is_int() { "i32" } else { "f32" }
            ),
        });
    }
    let bad = |detail: String| ErrorKind::Shape {
        op: "dot_general",
        detail,
    };
    if dims.lhs_batch.len() != dims.rhs_batch.len()
        || dims.lhs_contract.len() != dims.rhs_contract.len()
    {
        return Err(bad(
            "batch and contracting dims must pair up between lhs and rhs".into(),
        ));
    }
    let check_side = |side: &str, t: &TileType, batch: &[usize], contract: &[usize]| {
        let mut seen = vec![false; t.shape.len()];
        for &d in batch.iter().chain(contract) {
            if d >= t.shape.len() || std::mem::replace(&mut seen[d], true) {
                return Err(bad(format!(
                    "{side} dim {d} is out of range or used twice for {side} of shape {}",
                    shape_str(&t.shape)
                )));
            }
        }
        Ok((0..t.shape.len()).filter(|d| !seen[*d]).collect::<Vec<_>>())
    };
    let lhs_free = check_side("lhs", a, &dims.lhs_batch, &dims.lhs_contract)?;
    let rhs_free = check_side("rhs", b, &dims.rhs_batch, &dims.rhs_contract)?;
    for (kind, l, r) in [
        ("batch", &dims.lhs_batch, &dims.rhs_batch),
        ("contracting", &dims.lhs_contract, &dims.rhs_contract),
    ] {
        for (&x, &y) in l.iter().zip(r) {
            if a.shape[x] != b.shape[y] {
                return Err(bad(format!(
                    "{kind} dims differ: lhs dim {x} is {} but rhs dim {y} is {} (lhs {}, rhs {})",
                    a.shape[x],
                    b.shape[y],
                    shape_str(&a.shape),
                    shape_str(&b.shape)
                )));
            }
        }
    }
    let mut shape: Vec<usize> = dims.lhs_batch.iter().map(|&d| a.shape[d]).collect();
    shape.extend(lhs_free.iter().map(|&d| a.shape[d]));
    shape.extend(rhs_free.iter().map(|&d| b.shape[d]));
    Ok(TileType::new(acc, shape))
}
