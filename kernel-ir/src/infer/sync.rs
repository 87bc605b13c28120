//! The typing rules of the ops that cross devices or synchronize: the
//! mesh they need, device ids, semaphore amounts and slots, copy
//! descriptors, and the values a region yields.

use super::*;

/// The kernel's mesh, which `op` needs.
pub(super) fn mesh_of<'k>(sig: &'k Kernel, op: &'static str) -> Result<&'k crate::Mesh, ErrorKind> {
    sig.mesh.as_ref().ok_or_else(|| ErrorKind::Dma {
        op,
        detail: "the kernel declares no mesh; give it one naming the devices it runs on together (`mesh [x 4]` after the grid in a kernel file, `KernelBuilder::mesh` in Rust)".into(),
    })
}

/// A device id: an i32 scalar, or a number of a device in the mesh.
pub(super) fn check_device(
    sig: &Kernel,
    op: &'static str,
    device: &IndexValue,
    ty: &TypeOf<'_>,
) -> Result<(), ErrorKind> {
    let n = mesh_of(sig, op)?.devices();
    match device {
        IndexValue::Static(d) if *d < 0 || *d as usize >= n => Err(ErrorKind::Dma {
            op,
            detail: format!("device {d} is outside the mesh's devices 0..{n}"),
        }),
        IndexValue::Static(_) => Ok(()),
        IndexValue::Dynamic(v) => scalar_i32(op, "device", &ty(*v)?),
    }
}

/// A semaphore amount: ≥ 0, or an i32 scalar.
pub(super) fn check_amount(
    op: &'static str,
    amount: &IndexValue,
    ty: &TypeOf<'_>,
) -> Result<(), ErrorKind> {
    match amount {
        IndexValue::Static(n) if *n < 0 => Err(ErrorKind::Dma {
            op,
            detail: format!("the amount is {n}; semaphores count up from zero, so it must be ≥ 0"),
        }),
        IndexValue::Static(_) => Ok(()),
        IndexValue::Dynamic(v) => scalar_i32(op, "amount", &ty(*v)?),
    }
}

/// Checks a semaphore reference: the array exists, is of one of the `want`
/// kinds, and is indexed once per dim in bounds.
pub(super) fn check_sem(
    sig: &Kernel,
    op: &'static str,
    sem: &SemaphoreSlot,
    want: &[SemaphoreKind],
    ty: &TypeOf<'_>,
) -> Result<(), ErrorKind> {
    let bad = |detail: String| ErrorKind::Dma { op, detail };
    let Some(a) = sig.semaphores.get(sem.array) else {
        return Err(bad(format!("semaphore array {} does not exist", sem.array)));
    };
    if a.kind == SemaphoreKind::Barrier && sig.mesh.is_none() {
        return Err(bad(format!(
            "`{}` is the barrier semaphore, which only kernels with a mesh have; declare the mesh",
            a.name
        )));
    }
    if !want.contains(&a.kind) {
        let (what, fix) = match want[0] {
            SemaphoreKind::Dma => (
                "copy",
                "declare a DMA semaphore array (`dma_semaphores`) for copies",
            ),
            SemaphoreKind::Regular | SemaphoreKind::Barrier => (
                "signal, wait or read",
                "DMA semaphores are signalled by copies and waited by `wait` on the copy; declare a regular semaphore array (`semaphores`) to count yourself",
            ),
        };
        return Err(bad(format!(
            "`{}` is a {} array, which a {what} cannot use; {fix}",
            a.name, a.kind
        )));
    }
    if sem.at.len() != a.shape.len() {
        return Err(bad(format!(
            "`{}` has shape {} but {} indices were given; give one per dim",
            a.name,
            shape_str(&a.shape),
            sem.at.len()
        )));
    }
    for (d, (i, &n)) in sem.at.iter().zip(&a.shape).enumerate() {
        match i {
            IndexValue::Static(s) if *s < 0 || *s >= n as i64 => {
                return Err(bad(format!(
                    "`{}` index {s} in dim {d} is outside 0..{n}",
                    a.name
                )));
            }
            IndexValue::Static(_) => {}
            IndexValue::Dynamic(v) => scalar_i32(op, "semaphore index", &ty(*v)?)?,
        }
    }
    Ok(())
}

/// Checks a copy: both views index their buffers, have the same shape and
/// dtype, the destination can be written and the semaphore is a DMA one.
pub(super) fn check_copy(
    sig: &Kernel,
    op: &'static str,
    c: &crate::CopyDescriptor,
    ty: &TypeOf<'_>,
) -> Result<(), ErrorKind> {
    let bad = |detail: String| ErrorKind::Dma { op, detail };
    let (sname, sdtype, sshape) = buffer_info(sig, c.src.buffer)?;
    let (dname, ddtype, dshape) = buffer_info(sig, c.dst.buffer)?;
    if matches!(c.src.buffer, BufferRef::Prefetch(_)) {
        return Err(bad(format!(
            "the source `{sname}` is scalar prefetch, which kernels read with loads; copy from an operand or scratch"
        )));
    }
    match c.dst.buffer {
        BufferRef::Prefetch(_) => {
            return Err(ErrorKind::ReadOnly {
                buffer: dname,
                what: "scalar prefetch",
            });
        }
        BufferRef::Operand(i) if sig.operands[i].role == Role::In => {
            return Err(ErrorKind::ReadOnly {
                buffer: dname,
                what: "an input operand",
            });
        }
        _ => {}
    }
    for (b, name) in [(c.src.buffer, &sname), (c.dst.buffer, &dname)] {
        if let BufferRef::Operand(i) = b
            && !sig.operands[i]
                .layout
                .is_row_major(sig.operands[i].shape.len())
        {
            return Err(bad(format!(
                "operand `{name}` has a layout hint; copies move row-major buffers only, so drop the hint or copy through a blocked window"
            )));
        }
    }
    let sview = check_indices(sig, op, c.src.buffer, &sname, &sshape, &c.src.indices, ty)?;
    let dview = check_indices(sig, op, c.dst.buffer, &dname, &dshape, &c.dst.indices, ty)?;
    if sdtype != ddtype {
        return Err(bad(format!(
            "the source `{sname}` holds {sdtype} but the destination `{dname}` holds {ddtype}; a copy moves bytes and converts nothing"
        )));
    }
    if sview != dview {
        return Err(bad(format!(
            "the source view of `{sname}` is {} but the destination view of `{dname}` is {}; both sides must have the same shape",
            shape_str(&sview),
            shape_str(&dview)
        )));
    }
    check_sem(sig, op, &c.sem, &[SemaphoreKind::Dma], ty)
}

pub(super) fn check_yields(
    op: &'static str,
    want: &[TileType],
    yields: &[ValueId],
    ty: &TypeOf<'_>,
) -> Result<(), ErrorKind> {
    if yields.len() != want.len() {
        return Err(ErrorKind::Yield {
            op,
            detail: format!("expected {} values, got {}", want.len(), yields.len()),
        });
    }
    for (i, (w, y)) in want.iter().zip(yields).enumerate() {
        let t = ty(*y)?;
        if &t != w {
            return Err(ErrorKind::Yield {
                op,
                detail: format!("value {i} is {t} but must be {w}"),
            });
        }
    }
    Ok(())
}
