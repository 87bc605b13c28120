//! Evaluation of ops on host values.

use super::math::{
    binary, compare, dot, for_each_index, gathered, int, merge, reduce, strides_of, unary,
};
pub(crate) use super::value::{Ranges, Val};
use super::{Buf, DEFINED, InterpOptions, POISON, UNWRITTEN};
use crate::error::{ErrorKind, KernelError};
use crate::{Array, BufferRef, DType, Index, IndexValue, Kernel, Loc, Op, OpKind, Region, ValueId};

pub(crate) struct Machine<'a> {
    pub k: &'a Kernel,
    pub opts: &'a InterpOptions,
    pub prefetch: Vec<Buf>,
    pub operands: Vec<Buf>,
    pub scratch: Vec<Buf>,
    /// Element offset of each operand's window in this step.
    pub offsets: Vec<Vec<i64>>,
    /// Each operand's index map value in this step (its block index, or
    /// its element offset for an element window).
    pub indices: Vec<Vec<i64>>,
    pub env: Vec<Option<Val>>,
    pub grid_point: Vec<i64>,
    /// Copies in flight and semaphore values.
    pub dma: super::dma::DmaState,
    /// Multiply-add flops of the dots executed so far (2 per product).
    pub flops: u64,
    /// Executed dots by shape.
    pub dots: std::collections::BTreeMap<super::DotShape, u64>,
    /// Per operand, bytes manual copies moved from it (an `any` operand,
    /// in HBM) and to it.
    pub dma_bytes: Vec<(u64, u64)>,
    /// This device in a mesh run (`None` on one device).
    pub link: Option<super::Link<'a>>,
    /// Bytes this device's remote copies sent.
    pub ici_bytes: u64,
    /// At each remote copy this device started: its bytes, the flops run
    /// before it, and the device it goes to.
    pub sends: Vec<(u64, u64, usize)>,
}

pub(super) type R<T> = Result<T, KernelError>;

impl Machine<'_> {
    fn get(&self, v: ValueId) -> R<&Val> {
        self.env
            .get(v.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| ErrorKind::UndefinedValue { id: v.0 }.into())
    }

    fn set(&mut self, v: ValueId, val: Val) {
        if let Some(slot) = self.env.get_mut(v.index()) {
            *slot = Some(val);
        }
    }

    /// Reads an i32 scalar used for control or indexing; poison is an error.
    fn scalar(&self, v: ValueId, what: &str, loc: &Option<Loc>) -> R<i64> {
        let val = self.get(v)?;
        if val.any_poison() {
            return Err(KernelError::new(
                ErrorKind::PoisonRead {
                    buffer: "value",
                    name: v.to_string(),
                    element: Vec::new(),
                    why: format!(
                        " (it is used as {what} but depends on elements past the end of an array)"
                    ),
                },
                loc.clone(),
            ));
        }
        Ok(int(val.data.first().copied().unwrap_or(0.0)))
    }

    /// Counts a copy's bytes against the `any` (HBM) operand it reads or
    /// writes. A remote copy counts here for both ends: its destination is
    /// the same operand on the peer, which in an SPMD ring receives as much
    /// as it sends.
    fn count_hbm(&mut self, c: &crate::CopyDescriptor) {
        let hbm = |v: &crate::BufferSlice| match v.buffer {
            crate::BufferRef::Operand(i) => self
                .k
                .operands
                .get(i)
                .map(|o| (i, o.space == crate::MemorySpace::Any, o.dtype)),
            _ => None,
        };
        let (src, dst) = (hbm(&c.src), hbm(&c.dst));
        if let Some((i, true, d)) = src {
            self.dma_bytes[i].0 += c.bytes(d);
            if c.remote.is_none() {
                return;
            }
        }
        if let Some((i, true, d)) = dst {
            self.dma_bytes[i].1 += c.bytes(d);
        }
    }

    pub(super) fn index_value(&self, iv: &IndexValue, what: &str, loc: &Option<Loc>) -> R<i64> {
        match iv {
            IndexValue::Static(s) => Ok(*s),
            IndexValue::Dynamic(v) => self.scalar(*v, what, loc),
        }
    }

    pub(crate) fn region(&mut self, r: &Region, args: Vec<Val>) -> R<Vec<Val>> {
        for (a, v) in r.args.iter().zip(args) {
            self.set(*a, v);
        }
        for op in &r.ops {
            self.op(op)?;
        }
        r.yields.iter().map(|y| self.get(*y).cloned()).collect()
    }

    fn op(&mut self, op: &Op) -> R<()> {
        let loc = &op.loc;
        let at = |kind: ErrorKind| KernelError::new(kind, loc.clone());
        let result = match &op.kind {
            OpKind::Constant { value, ty } => {
                let v = ty.dtype.round(value.as_f64());
                Val::clean(ty.dtype, ty.shape.clone(), vec![v; ty.elements()])
            }
            OpKind::ProgramId { dim } => Val::clean(
                DType::I32,
                vec![],
                vec![self.grid_point.get(*dim).copied().unwrap_or(0) as f64],
            ),
            OpKind::NumPrograms { dim } => Val::clean(
                DType::I32,
                vec![],
                vec![self.k.grid.dims.get(*dim).map_or(0, |d| d.bound) as f64],
            ),
            OpKind::Iota { ty, dim } => {
                let mut data = Vec::with_capacity(ty.elements());
                for_each_index(&ty.shape, |_, idx| {
                    data.push(ty.dtype.round(idx[*dim] as f64))
                });
                Val::clean(ty.dtype, ty.shape.clone(), data)
            }
            OpKind::Load {
                buffer,
                indices,
                mask,
            } => self.load(*buffer, indices, *mask, loc)?,
            OpKind::Store {
                buffer,
                indices,
                value,
                mask,
            } => {
                self.store(*buffer, indices, *value, *mask, loc)?;
                return Ok(());
            }
            OpKind::Unary { op: u, x } => {
                let x = self.get(*x)?;
                let data = x
                    .data
                    .iter()
                    .map(|&v| x.dtype.round(unary(*u, x.dtype, v)))
                    .collect();
                Val { data, ..x.clone() }
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let (a, c) = (self.get(*lhs)?, self.get(*rhs)?);
                let mut data = Vec::with_capacity(a.data.len());
                for (&x, &y) in a.data.iter().zip(&c.data) {
                    data.push(a.dtype.round(binary(*b, a.dtype, x, y).map_err(at)?));
                }
                Val {
                    dtype: a.dtype,
                    shape: a.shape.clone(),
                    data,
                    poison: merge(&[a, c]),
                }
            }
            OpKind::Compare { op: c, lhs, rhs } => {
                let (a, b) = (self.get(*lhs)?, self.get(*rhs)?);
                let data = a
                    .data
                    .iter()
                    .zip(&b.data)
                    .map(|(&x, &y)| compare(*c, x, y) as u8 as f64)
                    .collect();
                Val {
                    dtype: DType::Bool,
                    shape: a.shape.clone(),
                    data,
                    poison: merge(&[a, b]),
                }
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => {
                let (c, a, b) = (self.get(*cond)?, self.get(*on_true)?, self.get(*on_false)?);
                let mut data = Vec::with_capacity(c.data.len());
                let mut poison = Vec::with_capacity(c.data.len());
                for (i, &cv) in c.data.iter().enumerate() {
                    let pick = if cv != 0.0 { a } else { b };
                    data.push(pick.data[i]);
                    poison.push(c.is_poison(i) || pick.is_poison(i));
                }
                Val {
                    dtype: a.dtype,
                    shape: a.shape.clone(),
                    data,
                    poison: poison.iter().any(|&p| p).then_some(poison),
                }
            }
            OpKind::Convert { x, dtype } => {
                let x = self.get(*x)?;
                let from = x.dtype;
                let data = x
                    .data
                    .iter()
                    .map(|&v| dtype.convert_from(from, v))
                    .collect();
                Val {
                    dtype: *dtype,
                    data,
                    ..x.clone()
                }
            }
            OpKind::Bitcast { x, dtype } => {
                let x = self.get(*x)?;
                // Through the bytes memory holds (Array's own encoding).
                let n = x.data.len();
                let bytes = Array::new(x.dtype, [n], x.data.clone())
                    .map(|a| a.to_le_bytes())
                    .unwrap_or_default();
                let data = Array::from_le_bytes(*dtype, [n], &bytes)
                    .map(|a| a.data().to_vec())
                    .unwrap_or_else(|_| vec![0.0; n]);
                Val {
                    dtype: *dtype,
                    data,
                    ..x.clone()
                }
            }
            OpKind::BroadcastInDim { x, shape, dims } => {
                let x = self.get(*x)?;
                let xs = strides_of(&x.shape);
                let n: usize = shape.iter().product();
                let mut data = Vec::with_capacity(n);
                let mut poison = x.poison.as_ref().map(|_| Vec::with_capacity(n));
                for_each_index(shape, |_, idx| {
                    let src: usize = dims
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| if x.shape[i] == 1 { 0 } else { idx[d] * xs[i] })
                        .sum();
                    data.push(x.data[src]);
                    if let Some(p) = poison.as_mut() {
                        p.push(x.is_poison(src));
                    }
                });
                Val {
                    dtype: x.dtype,
                    shape: shape.clone(),
                    data,
                    poison,
                }
            }
            OpKind::Reshape { x, shape } => {
                let x = self.get(*x)?;
                Val {
                    shape: shape.clone(),
                    ..x.clone()
                }
            }
            OpKind::Transpose { x, perm } => {
                let x = self.get(*x)?;
                let xs = strides_of(&x.shape);
                let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
                let mut data = Vec::with_capacity(x.data.len());
                let mut poison = x.poison.as_ref().map(|_| Vec::with_capacity(x.data.len()));
                for_each_index(&shape, |_, idx| {
                    let src: usize = perm.iter().enumerate().map(|(i, &p)| idx[i] * xs[p]).sum();
                    data.push(x.data[src]);
                    if let Some(p) = poison.as_mut() {
                        p.push(x.is_poison(src));
                    }
                });
                Val {
                    dtype: x.dtype,
                    shape,
                    data,
                    poison,
                }
            }
            OpKind::Roll { x, shift, axis } => {
                let x = self.get(*x)?;
                let xs = strides_of(&x.shape);
                let n = x.shape[*axis];
                let mut data = Vec::with_capacity(x.data.len());
                let mut poison = x.poison.as_ref().map(|_| Vec::with_capacity(x.data.len()));
                for_each_index(&x.shape, |flat, idx| {
                    let from = (idx[*axis] + n - shift) % n;
                    let src = flat - idx[*axis] * xs[*axis] + from * xs[*axis];
                    data.push(x.data[src]);
                    if let Some(p) = poison.as_mut() {
                        p.push(x.is_poison(src));
                    }
                });
                Val {
                    dtype: x.dtype,
                    shape: x.shape.clone(),
                    data,
                    poison,
                }
            }
            OpKind::Slice {
                x,
                axis,
                start,
                len,
            } => {
                let x = self.get(*x)?;
                let xs = strides_of(&x.shape);
                let mut shape = x.shape.clone();
                shape[*axis] = *len;
                gathered(x.dtype, shape, |idx| {
                    let at: usize = idx.iter().zip(&xs).map(|(i, s)| i * s).sum();
                    (x, at + start * xs[*axis])
                })
            }
            OpKind::Concat { lhs, rhs, axis } => {
                let (a, b) = (self.get(*lhs)?, self.get(*rhs)?);
                let (sa, sb) = (strides_of(&a.shape), strides_of(&b.shape));
                let na = a.shape[*axis];
                let mut shape = a.shape.clone();
                shape[*axis] += b.shape[*axis];
                gathered(a.dtype, shape, |idx| {
                    let (src, strides, back) = if idx[*axis] < na {
                        (a, &sa, 0)
                    } else {
                        (b, &sb, na)
                    };
                    let at: usize = idx.iter().zip(strides).map(|(i, s)| i * s).sum();
                    (src, at - back * strides[*axis])
                })
            }
            OpKind::Reduce { op: r, x, axes } => reduce(self.get(*x)?, *r, axes),
            OpKind::Dot {
                lhs,
                rhs,
                dims,
                acc,
            } => {
                let (a, b) = (self.get(*lhs)?, self.get(*rhs)?);
                let depth: usize = dims.lhs_contract.iter().map(|&d| a.shape[d]).product();
                // The MXU's view: batch products of [m, k] x [k, n], the
                // free dims of each side flattened.
                let batch: usize = dims.lhs_batch.iter().map(|&d| a.shape[d]).product();
                let per = (batch * depth).max(1);
                let shape = super::DotShape {
                    batch,
                    m: a.data.len() / per,
                    k: depth,
                    n: b.data.len() / per,
                    lhs: a.dtype,
                };
                let r = dot(a, b, dims, *acc);
                self.flops += 2 * (r.data.len() * depth) as u64;
                *self.dots.entry(shape).or_insert(0) += 1;
                r
            }
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                ..
            } => {
                let lo = self.index_value(lower, "a loop bound", loc)?;
                let hi = self.index_value(upper, "a loop bound", loc)?;
                let step = (*step).max(1);
                let trips = if hi > lo {
                    (hi - lo + step - 1) / step
                } else {
                    0
                };
                if trips as u64 > self.opts.max_loop_trips {
                    return Err(at(ErrorKind::LoopLimit {
                        trips,
                        limit: self.opts.max_loop_trips,
                    }));
                }
                let mut carried: Vec<Val> = init
                    .iter()
                    .map(|v| self.get(*v).cloned())
                    .collect::<R<_>>()?;
                let mut i = lo;
                while i < hi {
                    let mut args = vec![Val::clean(
                        DType::I32,
                        vec![],
                        vec![DType::I32.round(i as f64)],
                    )];
                    args.extend(carried);
                    carried = self.region(body, args)?;
                    i += step;
                }
                for (r, v) in op.results.iter().zip(carried) {
                    self.set(*r, v);
                }
                return Ok(());
            }
            OpKind::DmaStart(c) if c.remote.is_some() => {
                self.remote_start(c, loc)?;
                self.count_hbm(c);
                return Ok(());
            }
            OpKind::DmaWait(c) if c.remote.is_some() => {
                self.remote_wait_recv(c, loc)?;
                return Ok(());
            }
            OpKind::DmaWaitSend(c) => {
                self.remote_wait_send(c, loc)?;
                return Ok(());
            }
            OpKind::DeviceId => self.device_id(),
            OpKind::AxisIndex { axis } => self.axis_index(*axis),
            OpKind::RemoteSignal {
                sem,
                amount,
                device,
            } => {
                self.remote_signal(sem, amount, device, loc)?;
                return Ok(());
            }
            OpKind::DmaStart(c) => {
                self.dma_start(c, loc)?;
                self.count_hbm(c);
                return Ok(());
            }
            OpKind::DmaWait(c) => {
                self.dma_wait(c, loc)?;
                return Ok(());
            }
            OpKind::SemSignal { sem, amount } => {
                self.sem_signal(sem, amount, loc)?;
                return Ok(());
            }
            OpKind::SemWait { sem, amount } => {
                self.sem_wait(sem, amount, loc)?;
                return Ok(());
            }
            OpKind::SemRead { sem } => self.sem_read(sem, loc)?,
            OpKind::Scope {
                scratch,
                semaphores,
                body,
            } => {
                self.scope(scratch, semaphores, body, loc)?;
                return Ok(());
            }
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                let c = self.scalar(*cond, "a condition", loc)?;
                let region = if c != 0 { then_region } else { else_region };
                let out = self.region(region, Vec::new())?;
                for (r, v) in op.results.iter().zip(out) {
                    self.set(*r, v);
                }
                return Ok(());
            }
        };
        if let Some(r) = op.results.first() {
            self.set(*r, result);
        }
        Ok(())
    }

    /// Resolves a buffer: which store, window offset, view shape.
    pub(super) fn view(&self, b: BufferRef) -> (Vec<i64>, Vec<usize>) {
        match b {
            BufferRef::Operand(i) => (
                self.offsets[i].clone(),
                self.k.operands[i].view_shape().to_vec(),
            ),
            BufferRef::Scratch(i) => (
                vec![0; self.scratch[i].shape.len()],
                self.scratch[i].shape.clone(),
            ),
            BufferRef::Prefetch(i) => (
                vec![0; self.prefetch[i].shape.len()],
                self.prefetch[i].shape.clone(),
            ),
        }
    }

    fn buf(&self, b: BufferRef) -> &Buf {
        match b {
            BufferRef::Operand(i) => &self.operands[i],
            BufferRef::Scratch(i) => &self.scratch[i],
            BufferRef::Prefetch(i) => &self.prefetch[i],
        }
    }

    fn buf_mut(&mut self, b: BufferRef) -> &mut Buf {
        match b {
            BufferRef::Operand(i) => &mut self.operands[i],
            BufferRef::Scratch(i) => &mut self.scratch[i],
            BufferRef::Prefetch(i) => &mut self.prefetch[i],
        }
    }

    /// Start and length per dim (points have length 1), and the result
    /// shape.
    pub(super) fn ranges(
        &self,
        op: &'static str,
        b: BufferRef,
        indices: &[Index],
        loc: &Option<Loc>,
    ) -> R<(Ranges, Vec<usize>)> {
        let (_, view) = self.view(b);
        let mut ranges = Vec::with_capacity(indices.len());
        let mut shape = Vec::new();
        for (d, ix) in indices.iter().enumerate() {
            let (start, len, keep) = match ix {
                Index::Slice { start, len } => (start, *len, true),
                Index::Point(start) => (start, 1, false),
            };
            let s = self.index_value(start, "an index", loc)?;
            let size = view.get(d).copied().unwrap_or(0);
            if s < 0 || s as u64 + len as u64 > size as u64 {
                return Err(KernelError::new(
                    ErrorKind::DynamicOutOfBounds {
                        op,
                        buffer: self.buf(b).name.clone(),
                        detail: format!(
                            "dim {d}: elements {s}..{} are outside the {} 0..{size} (grid index {:?})",
                            s + len as i64,
                            if matches!(b, BufferRef::Operand(_)) {
                                "block"
                            } else {
                                "buffer"
                            },
                            self.grid_point
                        ),
                    },
                    loc.clone(),
                ));
            }
            ranges.push((s, len));
            if keep {
                shape.push(len);
            }
        }
        Ok((ranges, shape))
    }

    fn load(
        &self,
        b: BufferRef,
        indices: &[Index],
        mask: Option<ValueId>,
        loc: &Option<Loc>,
    ) -> R<Val> {
        let (ranges, shape) = self.ranges("load", b, indices, loc)?;
        let (offset, _) = self.view(b);
        self.check_access("load", b, &ranges, &offset, false, loc)?;
        let mask = match mask {
            Some(m) => Some(self.get(m)?),
            None => None,
        };
        self.read(b, &ranges, &offset, shape, mask, loc)
    }

    /// Reads `ranges` of buffer `b` (whose view starts at `offset`) as a
    /// value of the kept `shape`.
    pub(super) fn read(
        &self,
        b: BufferRef,
        ranges: &Ranges,
        offset: &[i64],
        shape: Vec<usize>,
        mask: Option<&Val>,
        loc: &Option<Loc>,
    ) -> R<Val> {
        let buf = self.buf(b);
        let lens: Vec<usize> = ranges.iter().map(|r| r.1).collect();
        let n: usize = lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut poison = vec![false; n];
        let mut err = None;
        for_each_index(&lens, |k, idx| {
            if err.is_some() {
                return;
            }
            if let Some(m) = mask {
                if m.is_poison(k) {
                    poison[k] = true;
                }
                if m.data[k] == 0.0 {
                    data.push(0.0);
                    return;
                }
            }
            let mut flat = 0usize;
            let mut inside = true;
            let mut coord = Vec::with_capacity(idx.len());
            for d in 0..idx.len() {
                let c = offset[d] + ranges[d].0 + idx[d] as i64;
                coord.push(c);
                if c as usize >= buf.shape[d] {
                    inside = false;
                } else {
                    flat += c as usize * buf.strides[d];
                }
            }
            if !inside {
                data.push(0.0);
                poison[k] = true;
                return;
            }
            match buf.state[flat] {
                UNWRITTEN => {
                    err = Some(KernelError::new(
                        ErrorKind::PoisonRead {
                            buffer: buf.what,
                            name: buf.name.clone(),
                            element: coord,
                            why: if buf.what == "scratch" {
                                format!(
                                    " in this grid step {:?} (scratch starts undefined and is reset when a parallel grid index changes; initialize it under `when(program_id(d) == 0)`)",
                                    self.grid_point
                                )
                            } else {
                                format!(" (grid index {:?})", self.grid_point)
                            },
                        },
                        loc.clone(),
                    ));
                    data.push(0.0);
                }
                POISON => {
                    data.push(buf.data[flat]);
                    poison[k] = true;
                }
                _ => data.push(buf.data[flat]),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        let dtype = self.k.buffer(b).map_or(DType::F32, |x| x.1);
        Ok(Val {
            dtype,
            shape,
            data,
            poison: poison.iter().any(|&p| p).then_some(poison),
        })
    }

    fn store(
        &mut self,
        b: BufferRef,
        indices: &[Index],
        value: ValueId,
        mask: Option<ValueId>,
        loc: &Option<Loc>,
    ) -> R<()> {
        let (ranges, _) = self.ranges("store", b, indices, loc)?;
        let (offset, _) = self.view(b);
        let value = self.get(value)?.clone();
        let mask = match mask {
            Some(m) => {
                let m = self.get(m)?;
                if m.any_poison() {
                    return Err(KernelError::new(
                        ErrorKind::PoisonRead {
                            buffer: "value",
                            name: "mask".into(),
                            element: Vec::new(),
                            why: " (a store mask depends on elements past the end of an array)"
                                .into(),
                        },
                        loc.clone(),
                    ));
                }
                Some(m.data.clone())
            }
            None => None,
        };
        self.check_access("store", b, &ranges, &offset, true, loc)?;
        self.write(b, &ranges, &offset, &value, mask.as_deref());
        Ok(())
    }

    /// Writes `value` into `ranges` of buffer `b` (whose view starts at
    /// `offset`) where `mask` is nonzero.
    pub(super) fn write(
        &mut self,
        b: BufferRef,
        ranges: &Ranges,
        offset: &[i64],
        value: &Val,
        mask: Option<&[f64]>,
    ) {
        let buf = self.buf_mut(b);
        let lens: Vec<usize> = ranges.iter().map(|r| r.1).collect();
        for_each_index(&lens, |k, idx| {
            if mask.is_some_and(|m| m[k] == 0.0) {
                return;
            }
            let mut flat = 0usize;
            for d in 0..idx.len() {
                let c = (offset[d] + ranges[d].0 + idx[d] as i64) as usize;
                if c >= buf.shape[d] {
                    // Past the end of the array in a partial block: dropped,
                    // as the hardware's write-back clips it.
                    return;
                }
                flat += c * buf.strides[d];
            }
            buf.data[flat] = value.data[k];
            buf.state[flat] = if value.is_poison(k) { POISON } else { DEFINED };
        });
    }
}
