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
//! skips it (the file tests read their expectations from it). A kernel
//! verified by the GPU's rules says so on its target line
//! (`target v5e, vmem_limit default, platform gpu`).
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

mod body;
mod cursor;

use std::borrow::Cow;

use cursor::Cursor;

use crate::index_map::IndexOp;
use crate::{
    BlockSpec, Body, DType, DimSemantics, Grid, GridDim, IndexExpr, IndexMap, Kernel, Loc,
    MemorySpace, Operand, Role, ScalarPrefetch, Scratch, SemaphoreDecl, SemaphoreKind, Target,
    TileType,
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
            platform: crate::Platform::Tpu,
            vmem_limit: None,
            grid: Grid::default(),
            grid_loc: None,
            loc: None,
            mesh: None,
            prefetch: Vec::new(),
            operands: Vec::new(),
            scratch: Vec::new(),
            semaphores: Vec::new(),
            body: Body::default(),
        },
        types: Vec::new(),
        depth: 0,
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
    /// How many regions enclose the line being read.
    depth: usize,
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
        self.kernel.loc = self.loc(&c);
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
        if c.eat(",") {
            c.word("platform")?;
            self.kernel.platform = if c.eat_word("gpu") {
                crate::Platform::Gpu
            } else {
                c.word("tpu")?;
                crate::Platform::Tpu
            };
        }
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
        if self.peek().is_some_and(|l| l.starts_with("mesh ")) {
            let mut c = self.line()?;
            let loc = self.loc(&c);
            c.word("mesh")?;
            let axes = c.list('[', ']', |c| {
                let name = c.ident()?.to_string();
                Ok((name, c.usize()?))
            })?;
            self.kernel.mesh = Some(crate::Mesh { axes, loc });
            c.end()?;
        }
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
                    if c.eat_word("element") {
                        c.word("low")?;
                        let low = c.shape()?;
                        c.word("high")?;
                        let high = c.shape()?;
                        block.element = Some(crate::ElementPad { low, high });
                    }
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
            "dma_semaphore" | "semaphore" | "barrier_semaphore" => {
                let kind = match what {
                    "semaphore" => SemaphoreKind::Regular,
                    "barrier_semaphore" => SemaphoreKind::Barrier,
                    _ => SemaphoreKind::Dma,
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
        self.index_expr_in(c, 0)
    }

    fn index_expr_in(&self, c: &mut Cursor<'_>, depth: usize) -> Result<IndexExpr, ParseError> {
        c.ws();
        if depth > crate::limits::MAX_NESTING {
            return Err(c.error(format!(
                "[limit] index expressions nest more than {} deep here (kernel_ir::limits::MAX_NESTING); compute part of it in a separate value",
                crate::limits::MAX_NESTING
            )));
        }
        let depth = depth + 1;
        if c.eat("(") {
            let a = self.index_expr_in(c, depth)?;
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
            let b = self.index_expr_in(c, depth)?;
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
            let at = c.list('[', ']', |c| self.index_expr_in(c, depth))?;
            return Ok(IndexExpr::Prefetch { operand, at });
        }
        for (word, op) in [("min", IndexOp::Min), ("max", IndexOp::Max)] {
            if c.rest().starts_with(&format!("{word}(")) {
                c.at += word.len() + 1;
                let a = self.index_expr_in(c, depth)?;
                c.sym(",")?;
                let b = self.index_expr_in(c, depth)?;
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
}
