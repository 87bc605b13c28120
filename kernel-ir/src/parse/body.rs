//! The body's ops: one reader per op, regions, loops and branches.

use super::cursor::Cursor;
use super::{ParseError, Reader};
use crate::{
    BinaryOp, BufferRef, BufferSlice, CompareOp, CopyDescriptor, DType, DotDims, Literal, Loc, Op,
    OpKind, ReduceOp, Region, SemaphoreSlot, TileType, UnaryOp, ValueId,
};

impl<'a> Reader<'a> {
    /// Ops up to the line closing this region (`}` or `} else {`, which
    /// is returned), then its `yield`, if any, last.
    pub(super) fn region(&mut self, args: Vec<ValueId>) -> Result<(Region, &'a str), ParseError> {
        // The body itself is one region: MAX_NESTING more may nest in it.
        if self.depth > crate::limits::MAX_NESTING {
            let c = self.line()?;
            return Err(c.error(format!(
                "[limit] regions (`if`, `for`, `scope`) nest more than {} deep here (kernel_ir::limits::MAX_NESTING); move the inner part into a region of its own or unroll it",
                crate::limits::MAX_NESTING
            )));
        }
        self.depth += 1;
        let r = self.region_body(args);
        self.depth -= 1;
        r
    }

    fn region_body(&mut self, args: Vec<ValueId>) -> Result<(Region, &'a str), ParseError> {
        let mut region = Region {
            args,
            ops: Vec::new(),
            yields: Vec::new(),
        };
        loop {
            if let Some(close @ ("}" | "} else {")) = self.peek() {
                self.next += 1;
                return Ok((region, close));
            }
            let mut c = self.line()?;
            if !region.yields.is_empty() {
                return Err(c.error("`yield` must be the last line of its region"));
            }
            if c.eat_word("yield") {
                region.yields = c.separated(|c| c.value())?;
                c.end()?;
                continue;
            }
            let op = self.op(&mut c)?;
            region.ops.push(op);
        }
    }

    fn define(&mut self, v: ValueId, ty: TileType) {
        let i = v.index();
        if self.types.len() <= i {
            self.types.resize(i + 1, None);
        }
        self.types[i] = Some(ty);
    }

    fn type_of(&self, v: ValueId) -> Option<TileType> {
        self.types.get(v.index()).cloned().flatten()
    }

    fn buffer(&self, c: &mut Cursor<'_>) -> Result<BufferRef, ParseError> {
        let name = c.name()?;
        let k = &self.kernel;
        let found: Vec<BufferRef> = (k.operands.iter().position(|o| o.name == name))
            .map(BufferRef::Operand)
            .into_iter()
            .chain(
                k.scratch
                    .iter()
                    .position(|s| s.name == name)
                    .map(BufferRef::Scratch),
            )
            .chain(
                k.prefetch
                    .iter()
                    .position(|p| p.name == name)
                    .map(BufferRef::Prefetch),
            )
            .collect();
        match found[..] {
            [b] => Ok(b),
            [] => Err(c.error(format!(
                "`@{name}` is not an operand, scratch buffer or prefetch operand declared above"
            ))),
            _ => Err(c.error(format!(
                "`@{name}` names more than one buffer; give each a name of its own"
            ))),
        }
    }

    fn semaphore(&self, c: &mut Cursor<'_>) -> Result<SemaphoreSlot, ParseError> {
        let name = c.name()?;
        let array = self
            .kernel
            .semaphores
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| c.error(format!("`@{name}` is not a semaphore declared above")))?;
        let at = c.list('[', ']', |c| c.index_value())?;
        Ok(SemaphoreSlot { array, at })
    }

    fn slice(&self, c: &mut Cursor<'_>) -> Result<BufferSlice, ParseError> {
        let buffer = self.buffer(c)?;
        let indices = c.indices()?;
        Ok(BufferSlice { buffer, indices })
    }

    fn copy(&self, c: &mut Cursor<'_>) -> Result<CopyDescriptor, ParseError> {
        let src = self.slice(c)?;
        c.sym("->")?;
        let dst = self.slice(c)?;
        c.word("sem")?;
        let sem = self.semaphore(c)?;
        let remote = if c.eat_word("to") {
            let device = c.index_value()?;
            c.word("send")?;
            Some(crate::RemoteTarget {
                device,
                send_sem: self.semaphore(c)?,
            })
        } else {
            None
        };
        Ok(CopyDescriptor {
            src,
            dst,
            sem,
            remote,
        })
    }

    fn op(&mut self, c: &mut Cursor<'a>) -> Result<Op, ParseError> {
        let loc = self.loc(c);
        let results = if c.rest().starts_with('%') {
            let r = c.separated(|c| c.value())?;
            c.sym("=")?;
            r
        } else {
            Vec::new()
        };
        let m = c.ident()?;
        // The result type after ` : `, defining the op's one result.
        let one_result = |r: &mut Self, c: &mut Cursor<'_>| -> Result<TileType, ParseError> {
            let t = c.tile_type()?;
            r.define_one(m, &results, t.clone(), c)?;
            Ok(t)
        };
        let kind = match m {
            "constant" => {
                let text = c.token();
                let value = match text {
                    "true" => Literal::Bool(true),
                    "false" => Literal::Bool(false),
                    t if t.contains(['.', 'e', 'E']) || t.ends_with("inf") || t == "NaN" => {
                        Literal::Float(
                            t.parse()
                                .map_err(|_| c.error_at(t, "expected a number or true/false"))?,
                        )
                    }
                    t => Literal::Int(
                        t.parse()
                            .map_err(|_| c.error_at(t, "expected a number or true/false"))?,
                    ),
                };
                c.sym(":")?;
                let ty = one_result(self, c)?;
                // An f32 constant prints as the f32 it holds; read it as
                // that f32, so it reads back as the value printed.
                let value = match value {
                    Literal::Float(x) if ty.dtype == DType::F32 => {
                        Literal::Float(text.parse::<f32>().map_or(x, f64::from))
                    }
                    v => v,
                };
                OpKind::Constant { value, ty }
            }
            "program_id" | "num_programs" => {
                let dim = c.usize()?;
                c.sym(":")?;
                one_result(self, c)?;
                if m == "program_id" {
                    OpKind::ProgramId { dim }
                } else {
                    OpKind::NumPrograms { dim }
                }
            }
            "iota" => {
                c.word("dim")?;
                let dim = c.usize()?;
                c.sym(":")?;
                let ty = one_result(self, c)?;
                OpKind::Iota { ty, dim }
            }
            "load" => {
                let buffer = self.buffer(c)?;
                let indices = c.indices()?;
                let mask = if c.eat_word("mask") {
                    Some(c.value()?)
                } else {
                    None
                };
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::Load {
                    buffer,
                    indices,
                    mask,
                }
            }
            "store" => {
                let buffer = self.buffer(c)?;
                let indices = c.indices()?;
                c.sym(",")?;
                let value = c.value()?;
                let mask = if c.eat_word("mask") {
                    Some(c.value()?)
                } else {
                    None
                };
                c.sym(":")?;
                c.tile_type()?;
                OpKind::Store {
                    buffer,
                    indices,
                    value,
                    mask,
                }
            }
            "cmp" => {
                let name = c.ident()?;
                let op = [
                    CompareOp::Eq,
                    CompareOp::Ne,
                    CompareOp::Lt,
                    CompareOp::Le,
                    CompareOp::Gt,
                    CompareOp::Ge,
                ]
                .into_iter()
                .find(|o| o.name() == name)
                .ok_or_else(|| c.error_at(name, "expected eq, ne, lt, le, gt or ge"))?;
                let lhs = c.value()?;
                c.sym(",")?;
                let rhs = c.value()?;
                c.sym(":")?;
                let operand = c.tile_type()?;
                self.define_one(m, &results, TileType::new(DType::Bool, operand.shape), c)?;
                OpKind::Compare { op, lhs, rhs }
            }
            "select" => {
                let cond = c.value()?;
                c.sym(",")?;
                let on_true = c.value()?;
                c.sym(",")?;
                let on_false = c.value()?;
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::Select {
                    cond,
                    on_true,
                    on_false,
                }
            }
            "convert" | "bitcast" | "reshape" => {
                let x = c.value()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym("->")?;
                let to = one_result(self, c)?;
                if m == "convert" {
                    OpKind::Convert { x, dtype: to.dtype }
                } else if m == "bitcast" {
                    OpKind::Bitcast { x, dtype: to.dtype }
                } else {
                    OpKind::Reshape { x, shape: to.shape }
                }
            }
            "broadcast_in_dim" | "transpose" => {
                let x = c.value()?;
                c.sym(",")?;
                c.word(if m == "transpose" { "perm" } else { "dims" })?;
                let list = c.shape()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym("->")?;
                let to = one_result(self, c)?;
                if m == "transpose" {
                    OpKind::Transpose { x, perm: list }
                } else {
                    OpKind::BroadcastInDim {
                        x,
                        shape: to.shape,
                        dims: list,
                    }
                }
            }
            "roll" => {
                let x = c.value()?;
                c.sym(",")?;
                c.word("shift")?;
                let shift = c.usize()?;
                c.sym(",")?;
                c.word("axis")?;
                let axis = c.usize()?;
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::Roll { x, shift, axis }
            }
            "slice" => {
                let x = c.value()?;
                let mut field = |name: &str| -> Result<usize, ParseError> {
                    c.sym(",")?;
                    c.word(name)?;
                    c.usize()
                };
                let (axis, start, len) = (field("axis")?, field("start")?, field("len")?);
                c.sym(":")?;
                c.tile_type()?;
                c.sym("->")?;
                one_result(self, c)?;
                OpKind::Slice {
                    x,
                    axis,
                    start,
                    len,
                }
            }
            "concat" => {
                let lhs = c.value()?;
                c.sym(",")?;
                let rhs = c.value()?;
                c.sym(",")?;
                c.word("axis")?;
                let axis = c.usize()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym(",")?;
                c.tile_type()?;
                c.sym("->")?;
                one_result(self, c)?;
                OpKind::Concat { lhs, rhs, axis }
            }
            "reduce" => {
                let name = c.ident()?;
                let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min]
                    .into_iter()
                    .find(|o| o.name() == name)
                    .ok_or_else(|| c.error_at(name, "expected sum, max or min"))?;
                let x = c.value()?;
                c.sym(",")?;
                c.word("axes")?;
                let axes = c.shape()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym("->")?;
                one_result(self, c)?;
                OpKind::Reduce { op, x, axes }
            }
            "dot_general" => {
                let lhs = c.value()?;
                c.sym(",")?;
                let rhs = c.value()?;
                c.sym(",")?;
                c.word("batch")?;
                let lhs_batch = c.shape()?;
                c.sym("x")?;
                let rhs_batch = c.shape()?;
                c.sym(",")?;
                c.word("contract")?;
                let lhs_contract = c.shape()?;
                c.sym("x")?;
                let rhs_contract = c.shape()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym(",")?;
                c.tile_type()?;
                c.sym("->")?;
                // The result is the accumulator type.
                let acc = one_result(self, c)?.dtype;
                OpKind::Dot {
                    lhs,
                    rhs,
                    dims: DotDims {
                        lhs_batch,
                        rhs_batch,
                        lhs_contract,
                        rhs_contract,
                    },
                    acc,
                }
            }
            "for" => return self.for_op(c, results, loc),
            "if" => return self.if_op(c, results, loc),
            "scope" => {
                let names = c.list('(', ')', |c| Ok(c.name()?.to_string()))?;
                c.sym("{")?;
                c.end()?;
                let (mut scratch, mut semaphores) = (Vec::new(), Vec::new());
                for n in names {
                    if let Some(i) = self.kernel.scratch.iter().position(|s| s.name == n) {
                        scratch.push(i);
                    } else if let Some(i) = self.kernel.semaphores.iter().position(|s| s.name == n)
                    {
                        semaphores.push(i);
                    } else {
                        return Err(c.error(format!(
                            "`@{n}` is not a scratch buffer or semaphore declared above"
                        )));
                    }
                }
                let (body, close) = self.region(Vec::new())?;
                if close != "}" {
                    return Err(c.error("a scope has no else branch"));
                }
                return Ok(Op {
                    kind: OpKind::Scope {
                        scratch,
                        semaphores,
                        body,
                    },
                    results,
                    loc,
                });
            }
            "dma_start" => OpKind::DmaStart(self.copy(c)?),
            "dma_wait" => OpKind::DmaWait(self.copy(c)?),
            "dma_wait_send" => OpKind::DmaWaitSend(self.copy(c)?),
            "device_id" => {
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::DeviceId
            }
            "axis_index" => {
                let axis = c.usize()?;
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::AxisIndex { axis }
            }
            "remote_signal" => {
                let sem = self.semaphore(c)?;
                c.sym(",")?;
                let amount = c.index_value()?;
                c.word("to")?;
                let device = c.index_value()?;
                OpKind::RemoteSignal {
                    sem,
                    amount,
                    device,
                }
            }
            "sem_signal" | "sem_wait" => {
                let sem = self.semaphore(c)?;
                c.sym(",")?;
                let amount = c.index_value()?;
                if m == "sem_signal" {
                    OpKind::SemSignal { sem, amount }
                } else {
                    OpKind::SemWait { sem, amount }
                }
            }
            "sem_read" => {
                let sem = self.semaphore(c)?;
                c.sym(":")?;
                one_result(self, c)?;
                OpKind::SemRead { sem }
            }
            name => {
                if let Some(op) = UnaryOp::ALL.into_iter().find(|o| o.name() == name) {
                    let x = c.value()?;
                    c.sym(":")?;
                    one_result(self, c)?;
                    OpKind::Unary { op, x }
                } else if let Some(op) = BINARY.into_iter().find(|o| o.name() == name) {
                    let lhs = c.value()?;
                    c.sym(",")?;
                    let rhs = c.value()?;
                    c.sym(":")?;
                    one_result(self, c)?;
                    OpKind::Binary { op, lhs, rhs }
                } else {
                    return Err(c.error_at(name, format!("unknown op `{name}`")));
                }
            }
        };
        c.end()?;
        Ok(Op { kind, results, loc })
    }

    /// Defines the one result of op `m` as `ty`.
    fn define_one(
        &mut self,
        m: &str,
        results: &[ValueId],
        ty: TileType,
        c: &Cursor<'_>,
    ) -> Result<(), ParseError> {
        match results {
            [v] => {
                self.define(*v, ty);
                Ok(())
            }
            _ => Err(c.error(format!("`{m}` has one result, not {}", results.len()))),
        }
    }

    /// `for %i = LO to HI step S [unroll] [iter(%a = %x, ...)] {`.
    fn for_op(
        &mut self,
        c: &mut Cursor<'a>,
        results: Vec<ValueId>,
        loc: Option<Loc>,
    ) -> Result<Op, ParseError> {
        let iv = c.value()?;
        c.sym("=")?;
        let lower = c.index_value()?;
        c.word("to")?;
        let upper = c.index_value()?;
        c.word("step")?;
        let step = c.int()?;
        let unroll = c.eat_word("unroll");
        let mut args = vec![iv];
        let mut init = Vec::new();
        if c.eat_word("iter") {
            let pairs = c.list('(', ')', |c| {
                let a = c.value()?;
                c.sym("=")?;
                Ok((a, c.value()?))
            })?;
            for (a, i) in pairs {
                args.push(a);
                init.push(i);
            }
        }
        c.sym("{")?;
        c.end()?;
        if results.len() != init.len() {
            return Err(c.error(format!(
                "a loop carrying {} values has {} results",
                init.len(),
                results.len()
            )));
        }
        self.define(iv, TileType::scalar(DType::I32));
        // Carried values and results have the type of their initial value.
        for (k, i) in init.iter().enumerate() {
            let t = self.type_of(*i).ok_or_else(|| {
                c.error(format!("{i} is carried into the loop before it is defined"))
            })?;
            self.define(args[k + 1], t.clone());
            self.define(results[k], t);
        }
        let (body, close) = self.region(args)?;
        if close != "}" {
            return Err(c.error("a loop has no else branch"));
        }
        Ok(Op {
            kind: OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                unroll,
            },
            results,
            loc,
        })
    }

    /// `if %c [-> (types)] {` ... [`} else {` ...] `}`.
    fn if_op(
        &mut self,
        c: &mut Cursor<'a>,
        results: Vec<ValueId>,
        loc: Option<Loc>,
    ) -> Result<Op, ParseError> {
        let cond = c.value()?;
        c.ws();
        let types = if c.eat("->") {
            c.list('(', ')', |c| c.tile_type())?
        } else {
            Vec::new()
        };
        c.sym("{")?;
        c.end()?;
        if types.len() != results.len() {
            return Err(c.error(format!(
                "an if with {} results lists {} types",
                results.len(),
                types.len()
            )));
        }
        for (v, t) in results.iter().zip(types) {
            self.define(*v, t);
        }
        let (then_region, close) = self.region(Vec::new())?;
        let else_region = if close == "} else {" {
            let (r, close) = self.region(Vec::new())?;
            if close != "}" {
                return Err(c.error("an if has one else branch"));
            }
            r
        } else {
            Region::default()
        };
        Ok(Op {
            kind: OpKind::If {
                cond,
                then_region,
                else_region,
            },
            results,
            loc,
        })
    }
}

const BINARY: [BinaryOp; 14] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Rem,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Pow,
    BinaryOp::And,
    BinaryOp::Or,
    BinaryOp::Xor,
    BinaryOp::ShiftLeft,
    BinaryOp::ShiftRightLogical,
    BinaryOp::ShiftRightArithmetic,
];
