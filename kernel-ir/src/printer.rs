//! The stable text form of a kernel.
//!
//! Deterministic: value names are their ids, buffers are `@name`, grid
//! indices in index maps are `g0, g1, ...`, and source locations are left
//! out (they would make snapshots depend on line numbers).

use std::fmt::{self, Write};

use crate::index_map::IndexExprDisplay;
use crate::ops::ShapeDisplay;
use crate::{BufferRef, Index, IndexValue, Kernel, Literal, MemorySpace, OpKind, Region};

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut p = Printer {
            k: self,
            out: String::new(),
        };
        p.kernel();
        f.write_str(&p.out)
    }
}

fn iv(v: &IndexValue) -> String {
    match v {
        IndexValue::Static(s) => s.to_string(),
        IndexValue::Dynamic(v) => v.to_string(),
    }
}

struct Printer<'a> {
    k: &'a Kernel,
    out: String,
}

impl Printer<'_> {
    fn kernel(&mut self) {
        let k = self.k;
        let _ = writeln!(self.out, "kernel @{} {{", k.name);
        let limit = match k.vmem_limit {
            Some(l) => l.to_string(),
            None => "default".into(),
        };
        let platform = match k.platform {
            crate::Platform::Tpu => "",
            crate::Platform::Gpu => ", platform gpu",
        };
        let _ = writeln!(
            self.out,
            "  target {}, vmem_limit {}{platform}",
            k.target, limit
        );
        let dims: Vec<String> = k
            .grid
            .dims
            .iter()
            .map(|d| format!("{} {}", d.bound, d.semantics))
            .collect();
        let _ = writeln!(self.out, "  grid [{}]", dims.join(", "));
        if let Some(mesh) = &k.mesh {
            let axes: Vec<String> = mesh.axes.iter().map(|(n, s)| format!("{n} {s}")).collect();
            let _ = writeln!(self.out, "  mesh [{}]", axes.join(", "));
        }
        let names: Vec<String> = k.prefetch.iter().map(|p| p.name.clone()).collect();
        for p in &k.prefetch {
            let _ = writeln!(
                self.out,
                "  prefetch @{}: {}{}",
                p.name,
                p.dtype,
                ShapeDisplay(&p.shape)
            );
        }
        for o in &k.operands {
            let _ = write!(
                self.out,
                "  {} @{}: {}{} {}",
                o.role,
                o.name,
                o.dtype,
                ShapeDisplay(&o.shape),
                o.space
            );
            if o.space != MemorySpace::Any {
                let map: Vec<String> = o
                    .block
                    .index_map
                    .exprs
                    .iter()
                    .map(|e| {
                        IndexExprDisplay {
                            expr: e,
                            prefetch_names: &names,
                        }
                        .to_string()
                    })
                    .collect();
                let _ = write!(
                    self.out,
                    " block {} at ({})",
                    ShapeDisplay(&o.block.shape),
                    map.join(", ")
                );
                if let Some(pad) = &o.block.element {
                    let _ = write!(
                        self.out,
                        " element low {} high {}",
                        ShapeDisplay(&pad.low),
                        ShapeDisplay(&pad.high)
                    );
                }
                if let Some(n) = o.block.buffers {
                    let _ = write!(self.out, " buffers {n}");
                }
            }
            let _ = writeln!(self.out, " {}", o.layout);
        }
        for s in &k.scratch {
            let _ = writeln!(
                self.out,
                "  {}scratch @{}: {}{} {}",
                if s.scoped { "scoped " } else { "" },
                s.name,
                s.dtype,
                ShapeDisplay(&s.shape),
                s.space
            );
        }
        for s in &k.semaphores {
            let _ = writeln!(
                self.out,
                "  {}{} @{}: {}",
                if s.scoped { "scoped " } else { "" },
                s.kind,
                s.name,
                ShapeDisplay(&s.shape)
            );
        }
        let _ = writeln!(self.out, "body:");
        self.region(&k.body.region, 1);
        let _ = writeln!(self.out, "}}");
    }

    fn buffer(&self, b: BufferRef) -> String {
        match self.k.buffer(b) {
            Some((n, _, _)) => format!("@{n}"),
            None => format!("@<invalid {b:?}>"),
        }
    }

    fn ty(&self, v: crate::ValueId) -> String {
        match self.k.body.ty(v) {
            Some(t) => t.to_string(),
            None => "<invalid>".into(),
        }
    }

    fn indices(&self, indices: &[Index]) -> String {
        let parts: Vec<String> = indices
            .iter()
            .map(|i| match i {
                Index::Slice {
                    start: IndexValue::Static(s),
                    len,
                } => format!("{s}:{}", s + *len as i64),
                Index::Slice { start, len } => format!("{}:+{len}", iv(start)),
                Index::Point(p) => iv(p),
            })
            .collect();
        format!("[{}]", parts.join(", "))
    }

    fn view(&self, v: &crate::BufferSlice) -> String {
        format!("{}{}", self.buffer(v.buffer), self.indices(&v.indices))
    }

    fn sem(&self, s: &crate::SemaphoreSlot) -> String {
        let name = self
            .k
            .semaphores
            .get(s.array)
            .map_or_else(|| format!("<invalid {}>", s.array), |a| a.name.clone());
        let at: Vec<String> = s.at.iter().map(iv).collect();
        format!("@{name}[{}]", at.join(", "))
    }

    fn copy(&self, c: &crate::CopyDescriptor) -> String {
        let mut s = format!(
            "{} -> {} sem {}",
            self.view(&c.src),
            self.view(&c.dst),
            self.sem(&c.sem)
        );
        if let Some(r) = &c.remote {
            let _ = write!(s, " to {} send {}", iv(&r.device), self.sem(&r.send_sem));
        }
        s
    }

    fn region(&mut self, r: &Region, depth: usize) {
        let pad = "  ".repeat(depth);
        for op in &r.ops {
            let _ = write!(self.out, "{pad}");
            if !op.results.is_empty() {
                let names: Vec<String> = op.results.iter().map(|v| v.to_string()).collect();
                let _ = write!(self.out, "{} = ", names.join(", "));
            }
            let m = op.kind.mnemonic();
            let res_ty = op.results.first().map(|v| self.ty(*v)).unwrap_or_default();
            let line = match &op.kind {
                OpKind::Constant { value, ty } => {
                    let v = match value {
                        // Print the value the dtype holds, in the shortest
                        // form that reads back to it.
                        Literal::Float(x) if ty.dtype == crate::DType::F32 => {
                            format!("{:?}", *x as f32)
                        }
                        Literal::Float(x) => format!("{x:?}"),
                        Literal::Int(x) => x.to_string(),
                        Literal::Bool(b) => b.to_string(),
                    };
                    format!("{m} {v} : {res_ty}")
                }
                OpKind::ProgramId { dim } | OpKind::NumPrograms { dim } => {
                    format!("{m} {dim} : {res_ty}")
                }
                OpKind::Iota { dim, .. } => format!("{m} dim {dim} : {res_ty}"),
                OpKind::Load {
                    buffer,
                    indices,
                    mask,
                } => {
                    let mask = mask.map(|m| format!(" mask {m}")).unwrap_or_default();
                    format!(
                        "{m} {}{}{mask} : {res_ty}",
                        self.buffer(*buffer),
                        self.indices(indices)
                    )
                }
                OpKind::Store {
                    buffer,
                    indices,
                    value,
                    mask,
                } => {
                    let mask = mask.map(|m| format!(" mask {m}")).unwrap_or_default();
                    format!(
                        "{m} {}{}, {value}{mask} : {}",
                        self.buffer(*buffer),
                        self.indices(indices),
                        self.ty(*value)
                    )
                }
                OpKind::Unary { x, .. } => format!("{m} {x} : {res_ty}"),
                OpKind::Binary { lhs, rhs, .. } => format!("{m} {lhs}, {rhs} : {res_ty}"),
                OpKind::Compare { op, lhs, rhs } => {
                    format!("{m} {} {lhs}, {rhs} : {}", op.name(), self.ty(*lhs))
                }
                OpKind::Select {
                    cond,
                    on_true,
                    on_false,
                } => format!("{m} {cond}, {on_true}, {on_false} : {res_ty}"),
                OpKind::Convert { x, .. } | OpKind::Bitcast { x, .. } => {
                    format!("{m} {x} : {} -> {res_ty}", self.ty(*x))
                }
                OpKind::BroadcastInDim { x, dims, .. } => {
                    format!("{m} {x}, dims {dims:?} : {} -> {res_ty}", self.ty(*x))
                }
                OpKind::Reshape { x, .. } => format!("{m} {x} : {} -> {res_ty}", self.ty(*x)),
                OpKind::Transpose { x, perm } => {
                    format!("{m} {x}, perm {perm:?} : {} -> {res_ty}", self.ty(*x))
                }
                OpKind::Roll { x, shift, axis } => {
                    format!("{m} {x}, shift {shift}, axis {axis} : {res_ty}")
                }
                OpKind::Slice {
                    x,
                    axis,
                    start,
                    len,
                } => format!(
                    "{m} {x}, axis {axis}, start {start}, len {len} : {} -> {res_ty}",
                    self.ty(*x)
                ),
                OpKind::Concat { lhs, rhs, axis } => format!(
                    "{m} {lhs}, {rhs}, axis {axis} : {}, {} -> {res_ty}",
                    self.ty(*lhs),
                    self.ty(*rhs)
                ),
                OpKind::Reduce { op, x, axes } => {
                    format!(
                        "{m} {} {x}, axes {axes:?} : {} -> {res_ty}",
                        op.name(),
                        self.ty(*x)
                    )
                }
                OpKind::Dot {
                    lhs,
                    rhs,
                    dims,
                    acc: _,
                } => format!(
                    "{m} {lhs}, {rhs}, batch {:?}x{:?}, contract {:?}x{:?} : {}, {} -> {res_ty}",
                    dims.lhs_batch,
                    dims.rhs_batch,
                    dims.lhs_contract,
                    dims.rhs_contract,
                    self.ty(*lhs),
                    self.ty(*rhs)
                ),
                OpKind::For {
                    lower,
                    upper,
                    step,
                    init,
                    body,
                    unroll,
                } => {
                    let b = |v: &IndexValue| match v {
                        IndexValue::Static(s) => s.to_string(),
                        IndexValue::Dynamic(v) => v.to_string(),
                    };
                    let iv = body.args.first().map(|v| v.to_string()).unwrap_or_default();
                    let carried: Vec<String> = body
                        .args
                        .iter()
                        .skip(1)
                        .zip(init)
                        .map(|(a, i)| format!("{a} = {i}"))
                        .collect();
                    let unroll = if *unroll { " unroll" } else { "" };
                    let mut s = format!(
                        "{m} {iv} = {} to {} step {step}{unroll}",
                        b(lower),
                        b(upper)
                    );
                    if !carried.is_empty() {
                        let _ = write!(s, " iter({})", carried.join(", "));
                    }
                    s + " {"
                }
                OpKind::DmaStart(c) | OpKind::DmaWait(c) | OpKind::DmaWaitSend(c) => {
                    format!("{m} {}", self.copy(c))
                }
                OpKind::DeviceId => format!("{m} : {res_ty}"),
                OpKind::AxisIndex { axis } => format!("{m} {axis} : {res_ty}"),
                OpKind::RemoteSignal {
                    sem,
                    amount,
                    device,
                } => format!("{m} {}, {} to {}", self.sem(sem), iv(amount), iv(device)),
                OpKind::SemSignal { sem, amount } | OpKind::SemWait { sem, amount } => {
                    format!("{m} {}, {}", self.sem(sem), iv(amount))
                }
                OpKind::SemRead { sem } => format!("{m} {} : {res_ty}", self.sem(sem)),
                OpKind::Scope {
                    scratch,
                    semaphores,
                    ..
                } => {
                    let mut names: Vec<String> = scratch
                        .iter()
                        .map(|&i| self.buffer(BufferRef::Scratch(i)))
                        .collect();
                    names.extend(semaphores.iter().map(|&i| {
                        self.k
                            .semaphores
                            .get(i)
                            .map_or_else(|| format!("@<invalid {i}>"), |s| format!("@{}", s.name))
                    }));
                    format!("{m} ({}) {{", names.join(", "))
                }
                OpKind::If { cond, .. } => {
                    let tys: Vec<String> = op.results.iter().map(|v| self.ty(*v)).collect();
                    if tys.is_empty() {
                        format!("{m} {cond} {{")
                    } else {
                        format!("{m} {cond} -> ({}) {{", tys.join(", "))
                    }
                }
            };
            let _ = writeln!(self.out, "{line}");
            match &op.kind {
                OpKind::For { body, .. } | OpKind::Scope { body, .. } => {
                    self.region(body, depth + 1);
                    let _ = writeln!(self.out, "{pad}}}");
                }
                OpKind::If {
                    then_region,
                    else_region,
                    ..
                } => {
                    self.region(then_region, depth + 1);
                    if !else_region.ops.is_empty() || !else_region.yields.is_empty() {
                        let _ = writeln!(self.out, "{pad}}} else {{");
                        self.region(else_region, depth + 1);
                    }
                    let _ = writeln!(self.out, "{pad}}}");
                }
                _ => {}
            }
        }
        if !r.yields.is_empty() {
            let names: Vec<String> = r.yields.iter().map(|v| v.to_string()).collect();
            let _ = writeln!(self.out, "{pad}yield {}", names.join(", "));
        }
    }
}
