//! Where a value lives and how it is read and written: window offsets,
//! pointer arithmetic for every index form, values replicated across
//! programs, masked loads and stores.

use super::*;

impl<'a> Emitter<'a> {
    /// Defines `<name>_o<d>`, the element offsets of operand `i`'s window.
    pub(super) fn window_offsets(&mut self, i: usize) -> Result<(), LoweringError> {
        let o = &self.k.operands[i];
        let big = o.shape.iter().product::<usize>() > i32::MAX as usize;
        let mut offs = Vec::new();
        for (d, e) in o.block.index_map.exprs.iter().enumerate() {
            if o.space == MemorySpace::Any {
                offs.push(Expr::Const(0));
                continue;
            }
            // Whole blocks: index × block. Element windows: the map's
            // offset into the padded array, less its low padding.
            let (block, low) = match &o.block.element {
                Some(pad) => (1, pad.low[d] as i64),
                None => (o.block.shape[d] as i64, 0),
            };
            let e = self.index_expr(e);
            let e = self.index_binary(IndexOp::Sub, e, Expr::Const(low));
            match e {
                Expr::Const(c) => offs.push(Expr::Const(c * block)),
                Expr::Code(s) => {
                    let name = format!("{}_o{d}", o.name);
                    let s = if big {
                        format!("tl.cast({s}, tl.int64)")
                    } else {
                        s
                    };
                    if block == 1 {
                        self.line(format!("{name} = {s}"), o.loc.as_ref());
                    } else {
                        self.line(format!("{name} = ({s}) * {block}"), o.loc.as_ref());
                    }
                    offs.push(Expr::Code(name));
                }
            }
        }
        if o.space == MemorySpace::Any {
            offs = vec![Expr::Const(0); o.shape.len()];
        }
        self.offsets[i] = offs;
        Ok(())
    }

    /// Pointers to the whole window of operand `i` from base `base`, and the
    /// mask of its in-bounds elements (if it can reach past the array).
    pub(super) fn window_pointers(&self, i: usize, base: &str) -> (String, Option<String>) {
        let o = &self.k.operands[i];
        let indices: Vec<Index> = o
            .block
            .shape
            .iter()
            .map(|&len| match len {
                1 => Index::Point(IndexValue::Static(0)),
                len => Index::Slice {
                    start: IndexValue::Static(0),
                    len,
                },
            })
            .collect();
        self.pointers(BufferRef::Operand(i), base, &indices)
    }

    pub(super) fn index_expr(&mut self, e: &IndexExpr) -> Expr {
        match e {
            IndexExpr::Const(c) => Expr::Const(*c),
            IndexExpr::Grid(d) => Expr::Code(format!("g{d}")),
            IndexExpr::Prefetch { operand, at } => {
                let p = &self.k.prefetch[*operand];
                let st = strides(&p.shape);
                let mut flat = Expr::Const(0);
                for (a, &s) in at.iter().zip(&st) {
                    let term = self.index_expr(a);
                    let scaled = self.index_binary(IndexOp::Mul, term, Expr::Const(s as i64));
                    flat = self.index_binary(IndexOp::Add, flat, scaled);
                }
                Expr::Code(format!("tl.load({}_ptr + {})", p.name, flat.code()))
            }
            IndexExpr::Binary(op, a, b) => {
                let (a, b) = (self.index_expr(a), self.index_expr(b));
                self.index_binary(*op, a, b)
            }
        }
    }

    pub(super) fn index_binary(&mut self, op: IndexOp, a: Expr, b: Expr) -> Expr {
        if let (Expr::Const(x), Expr::Const(y)) = (&a, &b)
            && let Some(v) = fold(op, *x, *y)
        {
            return Expr::Const(v);
        }
        match (op, &a, &b) {
            (IndexOp::Add, Expr::Const(0), e)
            | (IndexOp::Add | IndexOp::Sub, e, Expr::Const(0)) => {
                return e.clone();
            }
            (IndexOp::Mul | IndexOp::FloorDiv, e, Expr::Const(1))
            | (IndexOp::Mul, Expr::Const(1), e) => {
                return e.clone();
            }
            _ => {}
        }
        let (x, y) = (a.code(), b.code());
        Expr::Code(match op {
            IndexOp::Add => format!("({x} + {y})"),
            IndexOp::Sub => format!("({x} - {y})"),
            IndexOp::Mul => format!("({x} * {y})"),
            IndexOp::FloorDiv => {
                self.helpers.insert("_tsr_floordiv");
                format!("_tsr_floordiv({x}, {y})")
            }
            IndexOp::Rem => {
                self.helpers.insert("_tsr_mod");
                format!("_tsr_mod({x}, {y})")
            }
            IndexOp::Min => format!("tl.minimum({x}, {y})"),
            IndexOp::Max => format!("tl.maximum({x}, {y})"),
        })
    }

    /// Pointers (and the in-bounds mask, if needed) for `indices` into
    /// memory buffer `b` from base pointer `base`.
    pub(super) fn pointers(
        &self,
        b: BufferRef,
        base: &str,
        indices: &[Index],
    ) -> (String, Option<String>) {
        let k = self.k;
        let (shape, window): (Vec<usize>, Option<usize>) = match b {
            BufferRef::Operand(i) => (k.operands[i].shape.clone(), Some(i)),
            BufferRef::Scratch(i) => (k.scratch[i].shape.clone(), None),
            BufferRef::Prefetch(i) => (k.prefetch[i].shape.clone(), None),
        };
        let big = shape.iter().product::<usize>() > i32::MAX as usize;
        let st = strides(&shape);
        let rank = indices
            .iter()
            .filter(|i| matches!(i, Index::Slice { .. }))
            .count();
        let (mut scalars, mut tiles) = (Vec::new(), Vec::new());
        let mut masks = Vec::new();
        let mut axis = 0;
        for (d, idx) in indices.iter().enumerate() {
            let origin = window
                .map(|w| self.offsets[w][d].clone())
                .unwrap_or(Expr::Const(0));
            // A window can reach past its array only when the array is not
            // a whole number of blocks along this dim.
            // An element window reaches past it only into high padding.
            let edge = window.is_some_and(|w| {
                let o = &k.operands[w];
                o.space != MemorySpace::Any
                    && match &o.block.element {
                        Some(p) => p.high[d] > 0,
                        None => !o.shape[d].is_multiple_of(o.block.shape[d]),
                    }
            });
            // An element window may also start before its array.
            let below = window.is_some_and(|w| {
                let o = &k.operands[w];
                o.space != MemorySpace::Any
                    && o.block.element.as_ref().is_some_and(|p| p.low[d] > 0)
            });
            let (start, len) = match idx {
                Index::Slice { start, len } => (*start, Some(*len)),
                Index::Point(p) => (*p, None),
            };
            let start = match start {
                IndexValue::Static(s) => Expr::Const(s),
                IndexValue::Dynamic(v) => Expr::Code(Self::v(v)),
            };
            let first = match (&origin, &start) {
                (Expr::Const(a), Expr::Const(s)) => Expr::Const(a + s),
                (Expr::Const(0), e) | (e, Expr::Const(0)) => e.clone(),
                (a, s) => Expr::Code(format!("({} + {})", a.code(), s.code())),
            };
            // The pointer is the scalar start of the tile plus the tile's
            // pattern, which does not change from step to step (the form
            // Triton's tutorials write, which its compiler keeps cheap).
            let scale = |x: String| match st[d] {
                1 => x,
                s => format!("{x} * {s}"),
            };
            let widen = |x: String| {
                if big {
                    format!("tl.cast({x}, tl.int64)")
                } else {
                    x
                }
            };
            match &first {
                Expr::Const(0) => {}
                Expr::Const(c) => scalars.push(scale(c.to_string())),
                f => scalars.push(scale(widen(f.code()))),
            }
            let position = match len {
                Some(len) => {
                    let r = expand_to(&format!("tl.arange(0, {len})"), axis, rank);
                    axis += 1;
                    tiles.push(scale(r.clone()));
                    match &first {
                        Expr::Const(0) => r,
                        f => format!("({} + {r})", f.code()),
                    }
                }
                None => first.code(),
            };
            if below {
                masks.push(format!("({position} >= 0)"));
            }
            if edge {
                masks.push(format!("({position} < {})", shape[d]));
            }
        }
        let join = |v: &[String]| {
            if v.is_empty() {
                "0".to_string()
            } else {
                v.join(" + ")
            }
        };
        let offset = match (scalars.is_empty(), tiles.is_empty()) {
            (true, true) => "0".to_string(),
            (false, true) => join(&scalars),
            (true, false) => join(&tiles),
            (false, false) => format!("({}) + ({})", join(&scalars), join(&tiles)),
        };
        let ptr = format!("{base} + ({offset})");
        let mask = (!masks.is_empty()).then(|| masks.join(" & "));
        (ptr, mask)
    }

    // ---- the body ----

    /// A load from a lane-replicated buffer: the column, broadcast back
    /// along the last dim where the load reads more than one lane.
    pub(super) fn replicated_load(&self, b: BufferRef, indices: &[Index]) -> Option<String> {
        let BufferRef::Scratch(i) = b else {
            return None;
        };
        if !self.plan.replicated.contains(&i) {
            return None;
        }
        let shape = self.buffer_shape(b);
        let (last, rest) = indices.split_last()?;
        let mut col_idx = rest.to_vec();
        let lanes = match last {
            Index::Slice { len, .. } => {
                col_idx.push(Index::Slice {
                    start: IndexValue::Static(0),
                    len: 1,
                });
                Some(*len)
            }
            Index::Point(_) => {
                col_idx.push(Index::Point(IndexValue::Static(0)));
                None
            }
        };
        let dt = self.k.buffer(b).map_or(DType::F32, |x| x.1);
        let col = slice(&self.var(b), &column(&shape), &col_idx, dt)?;
        Some(match lanes {
            Some(n) if n > 1 => {
                let mut full: Vec<usize> = col_idx
                    .iter()
                    .filter_map(|i| match i {
                        Index::Slice { len, .. } => Some(*len),
                        Index::Point(_) => None,
                    })
                    .collect();
                if let Some(l) = full.last_mut() {
                    *l = n;
                }
                format!("tl.broadcast_to({col}, {})", shape_list(&full))
            }
            _ => col,
        })
    }

    /// A max or min over the last dim of a whole-lane load of a
    /// lane-replicated buffer: the column itself.
    pub(super) fn replicated_reduce(
        &self,
        r: ReduceOp,
        x: ValueId,
        axes: &[usize],
        result: Option<ValueId>,
    ) -> Option<String> {
        if r == ReduceOp::Sum {
            return None;
        }
        let def = self.defs.get(&x)?;
        let OpKind::Load {
            buffer: b @ BufferRef::Scratch(i),
            indices,
            mask: None,
        } = &def.kind
        else {
            return None;
        };
        let (_, xs) = self.ty(x);
        if !self.plan.replicated.contains(i) || axes != [xs.len().checked_sub(1)?] {
            return None;
        }
        let shape = self.buffer_shape(*b);
        let (_, rest) = indices.split_last()?;
        let mut col_idx = rest.to_vec();
        col_idx.push(Index::Point(IndexValue::Static(0)));
        let dt = self.k.buffer(*b).map_or(DType::F32, |x| x.1);
        let col = slice(&self.var(*b), &column(&shape), &col_idx, dt)?;
        let want = self.ty(result?).1;
        let got: Vec<usize> = col_idx
            .iter()
            .filter_map(|i| match i {
                Index::Slice { len, .. } => Some(*len),
                Index::Point(_) => None,
            })
            .collect();
        Some(reshape(&col, &got, &want, self.k.scratch[*i].dtype))
    }

    /// The column of a value stored whole into a lane-replicated buffer of
    /// `shape`: the broadcast's operand, or the splat constant.
    pub(super) fn replicated_value(
        &mut self,
        value: ValueId,
        shape: &[usize],
    ) -> Result<String, LoweringError> {
        let target = squeezed(&column(shape));
        let def = self.defs.get(&value).copied().ok_or_else(|| {
            LoweringError::Internal("a lane-replicated store of an undefined value".into())
        })?;
        match &def.kind {
            OpKind::Constant { value: lit, ty } => {
                let f = format!(
                    "tl.full({}, {}, {})",
                    shape_list(&target),
                    literal(
                        *lit,
                        if narrow(ty.dtype) {
                            DType::F32
                        } else {
                            ty.dtype
                        }
                    ),
                    if narrow(ty.dtype) {
                        "tl.float32"
                    } else {
                        tl_dtype(ty.dtype)
                    }
                );
                Ok(if narrow(ty.dtype) {
                    self.down(&f, ty.dtype)
                } else {
                    f
                })
            }
            OpKind::BroadcastInDim { x, dims, shape: to } => {
                let (_, xs) = self.ty(*x);
                let col_full = column(to);
                let b = broadcast(&Self::v(*x), &xs, &col_full, dims);
                let (dt, _) = self.ty(*x);
                Ok(reshape(&b, &col_full, &target, dt))
            }
            _ => Err(LoweringError::Internal(
                "a lane-replicated store of a value that is no broadcast".into(),
            )),
        }
    }

    // ---- buffers ----

    /// The tensor variable of a register or fetched buffer.
    pub(super) fn var(&self, b: BufferRef) -> String {
        match b {
            BufferRef::Operand(i) => format!("{}_w", self.k.operands[i].name),
            BufferRef::Scratch(i) => format!("{}_s", self.k.scratch[i].name),
            BufferRef::Prefetch(i) => format!("{}_ptr", self.k.prefetch[i].name),
        }
    }

    pub(super) fn base(&self, b: BufferRef, store: bool) -> String {
        match b {
            BufferRef::Operand(i) if store => format!("{}_ptr", self.k.operands[i].name),
            BufferRef::Operand(i) => input_ptr(self.k, i),
            BufferRef::Scratch(i) => format!("{}_sptr", self.k.scratch[i].name),
            BufferRef::Prefetch(i) => format!("{}_ptr", self.k.prefetch[i].name),
        }
    }

    pub(super) fn buffer_shape(&self, b: BufferRef) -> Vec<usize> {
        self.k.buffer(b).map(|x| x.2.to_vec()).unwrap_or_default()
    }

    pub(super) fn load(
        &mut self,
        op: &Op,
        b: BufferRef,
        indices: &[Index],
        mask: Option<ValueId>,
    ) -> Result<String, LoweringError> {
        let shape = self.buffer_shape(b);
        if let Some(col) = self.replicated_load(b, indices) {
            return Ok(match mask {
                Some(m) => format!("tl.where({}, {col}, tl.zeros_like({col}))", Self::v(m)),
                None => col,
            });
        }
        match self.plan.residency(b) {
            Residency::Registers | Residency::Fetched => {
                let dt = self.k.buffer(b).map_or(DType::F32, |x| x.1);
                let x = slice(&self.var(b), &shape, indices, dt).ok_or_else(|| {
                    LoweringError::Internal(format!(
                        "a dynamic load from register buffer `{}`",
                        self.var(b)
                    ))
                })?;
                let _ = op;
                Ok(match mask {
                    Some(m) => format!("tl.where({}, {x}, tl.zeros_like({x}))", Self::v(m)),
                    None => x,
                })
            }
            Residency::Memory => {
                let (ptr, bounds) = self.pointers(b, &self.base(b, false), indices);
                let m = match (bounds, mask) {
                    (Some(a), Some(u)) => Some(format!("{a} & {}", Self::v(u))),
                    (Some(a), None) => Some(a),
                    (None, Some(u)) => Some(Self::v(u)),
                    (None, None) => None,
                };
                let dtype = self.k.buffer(b).map_or(DType::F32, |x| x.1);
                Ok(masked_load(&ptr, m.as_deref(), dtype))
            }
        }
    }

    pub(super) fn store(
        &mut self,
        op: &Op,
        b: BufferRef,
        indices: &[Index],
        value: ValueId,
        mask: Option<ValueId>,
    ) -> Result<(), LoweringError> {
        let loc = op.loc.as_ref();
        let shape = self.buffer_shape(b);
        if let BufferRef::Scratch(i) = b
            && self.plan.replicated.contains(&i)
        {
            let col = self.replicated_value(value, &shape)?;
            self.line(format!("{} = {col}", self.var(b)), loc);
            return Ok(());
        }
        match self.plan.residency(b) {
            Residency::Registers => {
                if !is_whole(indices, &shape) {
                    return Err(LoweringError::Internal(format!(
                        "a partial store to register buffer `{}`",
                        self.var(b)
                    )));
                }
                let (_, vs) = self.ty(value);
                let var = self.var(b);
                let sq = squeezed(&shape);
                let (vd, _) = self.ty(value);
                let val = reshape(&Self::v(value), &vs, &sq, vd);
                let text = match mask {
                    Some(m) => {
                        let mm = reshape(&Self::v(m), &vs, &sq, DType::Bool);
                        format!("tl.where({mm}, {val}, {var})")
                    }
                    None => val,
                };
                self.line(format!("{var} = {text}"), loc);
            }
            Residency::Fetched => {
                return Err(Self::unsupported(op, "a store to an input"));
            }
            Residency::Memory => {
                let barrier = self.plan.barriers.contains(&b);
                let (ptr, bounds) = self.pointers(b, &self.base(b, true), indices);
                let m = match (bounds, mask) {
                    (Some(a), Some(u)) => Some(format!("{a} & {}", Self::v(u))),
                    (Some(a), None) => Some(a),
                    (None, Some(u)) => Some(Self::v(u)),
                    (None, None) => None,
                };
                if barrier {
                    self.line("tl.debug_barrier()", loc);
                }
                let text = match m {
                    Some(m) => format!("tl.store({ptr}, {}, mask={m})", Self::v(value)),
                    None => format!("tl.store({ptr}, {})", Self::v(value)),
                };
                self.line(text, loc);
                if barrier {
                    self.line("tl.debug_barrier()", loc);
                }
            }
        }
        Ok(())
    }
}

/// A load of `ptr` whose masked-off elements are zero. fp8 loads go
/// through bytes: Triton's interpreter cannot make an fp8 `other`.
pub(super) fn masked_load(ptr: &str, mask: Option<&str>, dtype: DType) -> String {
    match (mask, dtype) {
        (None, _) => format!("tl.load({ptr})"),
        (Some(m), DType::F8E4M3FN | DType::F8E5M2) => format!(
            "tl.load(({ptr}).to(tl.pointer_type(tl.uint8), bitcast=True), mask={m}, other=0).to({}, bitcast=True)",
            tl_dtype(dtype)
        ),
        (Some(m), _) => format!("tl.load({ptr}, mask={m}, other=0)"),
    }
}
