//! The reader of the stable text form: [`parse`] is the inverse of
//! `Kernel`'s `Display` (`parse(&k.to_string())` prints as `k` does), so a
//! kernel can be written, reviewed and tested as a `.kir` file.
//!
//! The reader is syntax and name resolution only: a kernel that reads
//! back is not yet valid, and [`Kernel::verify`] is what says so. That is
//! the point of the file tests (`tests/filetests`): an invalid kernel is a
//! file, and each op, operand and declaration gets its file and line as its
//! location (see [`parse_file`]), so a verifier error names the line it is
//! about. `;` starts a comment that runs to the end of the line; the reader
//! skips it (the file tests read their expectations from it).
//!
//! ```
//! use kernel_ir::parse;
//! let text = "\
//! kernel @double {
//!   target v5e, vmem_limit default
//!   grid [2 parallel]
//!   in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
//!   out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
//! body:
//!   %0 = load @x[0:8, 0:128] : f32[8, 128]
//!   %1 = add %0, %0 : f32[8, 128]
//!   store @o[0:8, 0:128], %1 : f32[8, 128]
//! }
//! ";
//! let k = parse(text).unwrap();
//! assert_eq!(k.to_string(), text);
//! assert!(k.verify().is_ok());
//! ```

use std::borrow::Cow;

use crate::index_map::IndexOp;
use crate::{
    BinaryOp, BlockSpec, Body, BufferRef, BufferSlice, CompareOp, CopyDescriptor, DType,
    DimSemantics, DotDims, Grid, GridDim, Index, IndexExpr, IndexMap, IndexValue, Kernel, Layout,
    Literal, Loc, MemorySpace, Op, OpKind, Operand, Order, ReduceOp, Region, Role, ScalarPrefetch,
    Scratch, SemaphoreDecl, SemaphoreKind, SemaphoreSlot, Target, TileType, UnaryOp, ValueId,
};

/// Why a text did not read as a kernel: where (1-based line and column)
/// and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
    /// What was wrong.
    pub message: String,
}

/// Reads a kernel from its printed form, without locations.
pub fn parse(text: &str) -> Result<Kernel, ParseError> {
    read(text, None)
}

/// Reads a kernel from `text`, the contents of `file`: every op, operand,
/// scratch buffer, semaphore and the grid get `file:line:column` as their
/// location, so errors about them point into the file.
pub fn parse_file(file: &str, text: &str) -> Result<Kernel, ParseError> {
    read(text, Some(file))
}

/// One line without its comment, with where it starts.
struct Line<'a> {
    text: &'a str,
    number: u32,
    indent: u32,
}

fn read(text: &str, file: Option<&str>) -> Result<Kernel, ParseError> {
    let lines: Vec<Line<'_>> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let code = l.split(';').next().unwrap_or("").trim_end();
            let trimmed = code.trim_start();
            Line {
                text: trimmed,
                number: i as u32 + 1,
                indent: (code.len() - trimmed.len()) as u32,
            }
        })
        .filter(|l| !l.text.is_empty())
        .collect();
    let mut r = Reader {
        lines,
        next: 0,
        file: file.map(str::to_string),
        kernel: Kernel {
            name: String::new(),
            target: Target::V5e,
            vmem_limit: None,
            grid: Grid::default(),
            grid_loc: None,
            prefetch: Vec::new(),
            operands: Vec::new(),
            scratch: Vec::new(),
            semaphores: Vec::new(),
            body: Body::default(),
        },
        types: Vec::new(),
    };
    r.kernel()?;
    let mut k = r.kernel;
    k.body.values = r
        .types
        .into_iter()
        .map(|t| t.unwrap_or_else(|| TileType::scalar(DType::I32)))
        .collect();
    Ok(k)
}

struct Reader<'a> {
    lines: Vec<Line<'a>>,
    next: usize,
    file: Option<String>,
    kernel: Kernel,
    /// The type of each value id defined so far.
    types: Vec<Option<TileType>>,
}

impl<'a> Reader<'a> {
    fn line(&mut self) -> Result<Cursor<'a>, ParseError> {
        let Some(l) = self.lines.get(self.next) else {
            let last = self.lines.last().map_or(1, |l| l.number);
            return Err(ParseError {
                line: last,
                column: 1,
                message: "the text ends inside the kernel; a `}` is missing".into(),
            });
        };
        self.next += 1;
        Ok(Cursor {
            text: l.text,
            at: 0,
            line: l.number,
            indent: l.indent,
        })
    }

    fn peek(&self) -> Option<&'a str> {
        self.lines.get(self.next).map(|l| l.text)
    }

    fn loc(&self, c: &Cursor<'_>) -> Option<Loc> {
        self.file.as_ref().map(|f| Loc {
            file: Cow::Owned(f.clone()),
            line: c.line,
            column: c.indent + 1,
        })
    }

    fn kernel(&mut self) -> Result<(), ParseError> {
        let mut c = self.line()?;
        c.word("kernel")?;
        self.kernel.name = c.name()?.to_string();
        c.sym("{")?;
        c.end()?;
        let mut c = self.line()?;
        c.word("target")?;
        let t = c.ident()?;
        self.kernel.target = t.parse().map_err(|e| c.error_at(t, format!("{e}")))?;
        c.sym(",")?;
        c.word("vmem_limit")?;
        self.kernel.vmem_limit = if c.eat_word("default") {
            None
        } else {
            Some(c.int()? as u64)
        };
        c.end()?;
        let mut c = self.line()?;
        c.word("grid")?;
        self.kernel.grid_loc = self.loc(&c);
        let dims = c.list('[', ']', |c| {
            let bound = c.usize()?;
            let s = c.ident()?;
            let semantics = match s {
                "parallel" => DimSemantics::Parallel,
                "arbitrary" => DimSemantics::Arbitrary,
                "core_parallel" => DimSemantics::CoreParallel,
                _ => return Err(c.error_at(s, "expected parallel, arbitrary or core_parallel")),
            };
            Ok(GridDim { bound, semantics })
        })?;
        self.kernel.grid = Grid { dims };
        c.end()?;
        loop {
            let mut c = self.line()?;
            if c.eat_word("body") {
                c.sym(":")?;
                c.end()?;
                break;
            }
            self.declaration(&mut c)?;
        }
        let (region, close) = self.region(Vec::new())?;
        if close != "}" {
            return Err(ParseError {
                line: self.lines[self.next - 1].number,
                column: 1,
                message: format!("expected `}}` closing the kernel, found `{close}`"),
            });
        }
        self.kernel.body.region = region;
        if let Some(l) = self.lines.get(self.next) {
            return Err(ParseError {
                line: l.number,
                column: l.indent + 1,
                message: "text after the kernel's closing `}`".into(),
            });
        }
        Ok(())
    }

    /// One signature line: prefetch, an operand, scratch or a semaphore.
    fn declaration(&mut self, c: &mut Cursor<'a>) -> Result<(), ParseError> {
        let loc = self.loc(c);
        let scoped = c.eat_word("scoped");
        let what = c.ident()?;
        let name = c.name()?.to_string();
        c.sym(":")?;
        match what {
            "prefetch" | "in" | "out" | "inout" | "scratch" if scoped && what != "scratch" => {
                Err(c.error_at(what, "only scratch and semaphores can be scoped"))
            }
            "prefetch" => {
                let (dtype, shape) = (c.dtype()?, c.shape()?);
                self.kernel.prefetch.push(ScalarPrefetch {
                    name,
                    dtype,
                    shape,
                    loc,
                });
                c.end()
            }
            "in" | "out" | "inout" => {
                let role = match what {
                    "in" => Role::In,
                    "out" => Role::Out,
                    _ => Role::InOut,
                };
                let (dtype, shape) = (c.dtype()?, c.shape()?);
                let space = c.space()?;
                let mut block = BlockSpec::full(&shape);
                if space != MemorySpace::Any {
                    c.word("block")?;
                    block.shape = c.shape()?;
                    c.word("at")?;
                    let exprs = c.list('(', ')', |c| self.index_expr(c))?;
                    block.index_map = IndexMap::new(exprs);
                    if c.eat_word("buffers") {
                        block.buffers = Some(c.usize()?);
                    }
                }
                let layout = c.layout()?;
                self.kernel.operands.push(Operand {
                    name,
                    role,
                    dtype,
                    shape,
                    space,
                    block,
                    layout,
                    loc,
                });
                c.end()
            }
            "scratch" => {
                let (dtype, shape) = (c.dtype()?, c.shape()?);
                let space = c.space()?;
                self.kernel.scratch.push(Scratch {
                    name,
                    dtype,
                    shape,
                    space,
                    scoped,
                    loc,
                });
                c.end()
            }
            "dma_semaphore" | "semaphore" => {
                let kind = if what == "semaphore" {
                    SemaphoreKind::Regular
                } else {
                    SemaphoreKind::Dma
                };
                let shape = c.shape()?;
                self.kernel.semaphores.push(SemaphoreDecl {
                    name,
                    kind,
                    shape,
                    scoped,
                    loc,
                });
                c.end()
            }
            _ => Err(c.error_at(
                what,
                "expected a declaration (prefetch, in, out, inout, scratch, dma_semaphore, semaphore) or `body:`",
            )),
        }
    }

    /// An index-map expression: `g0`, `3`, `@table[g0]`, `(a + b)`,
    /// `min(a, b)`.
    fn index_expr(&self, c: &mut Cursor<'_>) -> Result<IndexExpr, ParseError> {
        c.ws();
        if c.eat("(") {
            let a = self.index_expr(c)?;
            c.ws();
            let op = match c.rest().chars().next() {
                Some('+') => IndexOp::Add,
                Some('-') => IndexOp::Sub,
                Some('*') => IndexOp::Mul,
                Some('/') => IndexOp::FloorDiv,
                Some('%') => IndexOp::Rem,
                _ => return Err(c.error("expected one of + - * / % in an index expression")),
            };
            c.at += 1;
            let b = self.index_expr(c)?;
            c.sym(")")?;
            return Ok(IndexExpr::Binary(op, Box::new(a), Box::new(b)));
        }
        if c.rest().starts_with('@') {
            let name = c.name()?;
            let operand = self
                .kernel
                .prefetch
                .iter()
                .position(|p| p.name == name)
                .ok_or_else(|| {
                    c.error(format!(
                        "`@{name}` is not a scalar-prefetch operand declared above"
                    ))
                })?;
            let at = c.list('[', ']', |c| self.index_expr(c))?;
            return Ok(IndexExpr::Prefetch { operand, at });
        }
        for (word, op) in [("min", IndexOp::Min), ("max", IndexOp::Max)] {
            if c.rest().starts_with(&format!("{word}(")) {
                c.at += word.len() + 1;
                let a = self.index_expr(c)?;
                c.sym(",")?;
                let b = self.index_expr(c)?;
                c.sym(")")?;
                return Ok(IndexExpr::Binary(op, Box::new(a), Box::new(b)));
            }
        }
        if let Some(d) = c.rest().strip_prefix('g')
            && d.starts_with(|ch: char| ch.is_ascii_digit())
        {
            c.at += 1;
            return Ok(IndexExpr::Grid(c.usize()?));
        }
        Ok(IndexExpr::Const(c.int()?))
    }

    /// Ops up to the line closing this region (`}` or `} else {`, which
    /// is returned), then its `yield`, if any, last.
    fn region(&mut self, args: Vec<ValueId>) -> Result<(Region, &'a str), ParseError> {
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
        Ok(CopyDescriptor { src, dst, sem })
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
            match results[..] {
                [v] => {
                    r.define(v, t.clone());
                    Ok(t)
                }
                _ => Err(c.error(format!("`{m}` has one result, not {}", results.len()))),
            }
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
                self.define_each(&results, TileType::new(DType::Bool, operand.shape), c)?;
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
            "convert" | "reshape" => {
                let x = c.value()?;
                c.sym(":")?;
                c.tile_type()?;
                c.sym("->")?;
                let to = one_result(self, c)?;
                if m == "convert" {
                    OpKind::Convert { x, dtype: to.dtype }
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

    fn define_each(
        &mut self,
        results: &[ValueId],
        ty: TileType,
        c: &Cursor<'_>,
    ) -> Result<(), ParseError> {
        match results {
            [v] => {
                self.define(*v, ty);
                Ok(())
            }
            _ => Err(c.error(format!("this op has one result, not {}", results.len()))),
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

const BINARY: [BinaryOp; 11] = [
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
];

/// A position in one line.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
    line: u32,
    indent: u32,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.at += r.len() - r.trim_start().len();
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            column: self.indent + self.at as u32 + 1,
            message: message.into(),
        }
    }

    /// An error about `token`, which ends at the cursor.
    fn error_at(&self, token: &str, message: impl Into<String>) -> ParseError {
        let start = self.at.saturating_sub(token.len());
        ParseError {
            line: self.line,
            column: self.indent + start as u32 + 1,
            message: message.into(),
        }
    }

    fn found(&self) -> String {
        match self.rest().trim_start() {
            "" => "the end of the line".into(),
            r => format!("`{}`", r.chars().take(20).collect::<String>()),
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        if self.rest().starts_with(s) {
            self.at += s.len();
            true
        } else {
            false
        }
    }

    /// `s` after optional spaces.
    fn sym(&mut self, s: &str) -> Result<(), ParseError> {
        self.ws();
        if self.eat(s) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{s}`, found {}", self.found())))
        }
    }

    /// The word `w`, if it is next (whole).
    fn eat_word(&mut self, w: &str) -> bool {
        self.ws();
        let r = self.rest();
        if r.starts_with(w) && !r[w.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        {
            self.at += w.len();
            true
        } else {
            false
        }
    }

    fn word(&mut self, w: &str) -> Result<(), ParseError> {
        if self.eat_word(w) {
            Ok(())
        } else {
            Err(self.error(format!("expected `{w}`, found {}", self.found())))
        }
    }

    fn end(&mut self) -> Result<(), ParseError> {
        self.ws();
        if self.rest().is_empty() {
            Ok(())
        } else {
            Err(self.error(format!(
                "unexpected {} at the end of the line",
                self.found()
            )))
        }
    }

    fn ident(&mut self) -> Result<&'a str, ParseError> {
        self.ws();
        let r = self.rest();
        let n = r
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(r.len());
        if n == 0 {
            return Err(self.error(format!("expected a word, found {}", self.found())));
        }
        self.at += n;
        Ok(&r[..n])
    }

    /// Everything up to the next space, comma or bracket.
    fn token(&mut self) -> &'a str {
        self.ws();
        let r = self.rest();
        let n = r
            .find(|c: char| c.is_whitespace() || ",:()[]".contains(c))
            .unwrap_or(r.len());
        self.at += n;
        &r[..n]
    }

    /// `@name`.
    fn name(&mut self) -> Result<&'a str, ParseError> {
        self.sym("@")?;
        self.ident()
    }

    fn int(&mut self) -> Result<i64, ParseError> {
        self.ws();
        let r = self.rest();
        let n = r
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && c == '-')))
            .map_or(r.len(), |(i, _)| i);
        let t = &r[..n];
        let v = t
            .parse()
            .map_err(|_| self.error(format!("expected an integer, found {}", self.found())))?;
        self.at += n;
        Ok(v)
    }

    fn usize(&mut self) -> Result<usize, ParseError> {
        let v = self.int()?;
        usize::try_from(v).map_err(|_| self.error(format!("expected a size ≥ 0, found {v}")))
    }

    /// `%N`.
    fn value(&mut self) -> Result<ValueId, ParseError> {
        self.sym("%")?;
        let v = self.int()?;
        u32::try_from(v)
            .map(ValueId)
            .map_err(|_| self.error(format!("value numbers are 0 to 2^32-1, found {v}")))
    }

    /// A number or a value.
    fn index_value(&mut self) -> Result<IndexValue, ParseError> {
        self.ws();
        if self.rest().starts_with('%') {
            Ok(IndexValue::Dynamic(self.value()?))
        } else {
            Ok(IndexValue::Static(self.int()?))
        }
    }

    /// Items separated by commas, to the end of what they can take.
    fn separated<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        let mut out = vec![item(self)?];
        loop {
            self.ws();
            if !self.eat(",") {
                return Ok(out);
            }
            out.push(item(self)?);
        }
    }

    /// `open item, item close`, possibly empty.
    fn list<T>(
        &mut self,
        open: char,
        close: char,
        mut item: impl FnMut(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.sym(&open.to_string())?;
        self.ws();
        if self.eat(&close.to_string()) {
            return Ok(Vec::new());
        }
        let out = self.separated(&mut item)?;
        self.sym(&close.to_string())?;
        Ok(out)
    }

    fn shape(&mut self) -> Result<Vec<usize>, ParseError> {
        self.list('[', ']', |c| c.usize())
    }

    fn dtype(&mut self) -> Result<DType, ParseError> {
        let t = self.ident()?;
        t.parse().map_err(|e| self.error_at(t, format!("{e}")))
    }

    /// `f32` (a scalar) or `f32[8, 128]`.
    fn tile_type(&mut self) -> Result<TileType, ParseError> {
        let dtype = self.dtype()?;
        let shape = if self.rest().starts_with('[') {
            self.shape()?
        } else {
            Vec::new()
        };
        Ok(TileType::new(dtype, shape))
    }

    fn space(&mut self) -> Result<MemorySpace, ParseError> {
        let s = self.ident()?;
        match s {
            "vmem" => Ok(MemorySpace::Vmem),
            "smem" => Ok(MemorySpace::Smem),
            "any" => Ok(MemorySpace::Any),
            _ => Err(self.error_at(s, "expected a memory space: vmem, smem or any")),
        }
    }

    fn layout(&mut self) -> Result<Layout, ParseError> {
        let o = self.ident()?;
        let order = match o {
            "row_major" => Order::RowMajor,
            "col_major" => Order::ColMajor,
            "minor_to_major" => Order::MinorToMajor(self.shape()?),
            _ => {
                return Err(self.error_at(
                    o,
                    "expected a layout: row_major, col_major or minor_to_major[..]",
                ));
            }
        };
        self.ws();
        let align = if self.eat(",") {
            self.word("align")?;
            Some(self.int()? as u64)
        } else {
            None
        };
        Ok(Layout { order, align })
    }

    /// `[0:8, %3:+128, 2, %5]`.
    fn indices(&mut self) -> Result<Vec<Index>, ParseError> {
        self.list('[', ']', |c| {
            let start = c.index_value()?;
            if !c.eat(":") {
                return Ok(Index::Point(start));
            }
            match start {
                IndexValue::Static(s) => {
                    let end = c.int()?;
                    let len = usize::try_from(end - s)
                        .map_err(|_| c.error(format!("a slice {s}:{end} ends before it starts")))?;
                    Ok(Index::Slice { start, len })
                }
                IndexValue::Dynamic(_) => {
                    c.sym("+")?;
                    let len = c.usize()?;
                    Ok(Index::Slice { start, len })
                }
            }
        })
    }
}
