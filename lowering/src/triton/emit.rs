//! Writes a kernel's Triton program: the launch, the grid loops, the
//! buffers' homes ([`super::plan`]) and one line per body op.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write;

use kernel_ir::{
    BinaryOp, BufferRef, CompareOp, DType, DotDims, Index, IndexExpr, IndexOp, IndexValue, Kernel,
    Literal, Loc, MemorySpace, Op, OpKind, ReduceOp, Region, Role, UnaryOp, ValueId,
};

use super::plan::{Plan, Residency, is_whole};

mod split;
use super::{ParamRole, TritonOptions, TritonParam, TritonProgram};
use crate::LoweringError;

const TARGET: &str = "Triton (GPU)";

/// Helper functions a program may call, with their source; a program
/// includes the ones it uses.
const HELPERS: &[(&str, &str)] = &[
    (
        "_tsr_floordiv",
        "@triton.jit\ndef _tsr_floordiv(a, b):\n    # Floor division (index maps); Triton's `//` truncates toward zero.\n    q = a // b\n    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)\n",
    ),
    (
        "_tsr_mod",
        "@triton.jit\ndef _tsr_mod(a, b):\n    # The remainder with the divisor's sign (index maps).\n    r = a % b\n    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)\n",
    ),
    (
        "_tsr_max",
        "@triton.jit\ndef _tsr_max(a, b):\n    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
    ),
    (
        "_tsr_min",
        "@triton.jit\ndef _tsr_min(a, b):\n    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
    ),
    (
        "_tsr_to_int",
        "@triton.jit\ndef _tsr_to_int(x, dtype: tl.constexpr, lo: tl.constexpr, hi: tl.constexpr, imax: tl.constexpr):\n    # f32 to an integer type: truncate toward zero, saturate at the type's bounds (lo, the largest f32 below -lo, imax); NaN is 0.\n    t = tl.where(x == x, tl.minimum(tl.maximum(x, lo), hi), 0.0)\n    return tl.where(x >= -lo, imax, t.to(dtype)).to(dtype)\n",
    ),
    (
        "_tsr_to_f8e4m3fn",
        r#"@triton.jit
def _tsr_to_f8e4m3fn(x):
    # f32 to f8e4m3fn by the bits, rounding to nearest even (the hardware
    # conversion saturates, Triton's interpreter rounds ties up): past the
    # largest finite value (448) is NaN, S.1111.111 (no infinity).
    bits = x.to(tl.uint32, bitcast=True)
    sign = ((bits >> 31) << 7).to(tl.uint8)
    a = bits & 0x7FFFFFFF
    # Below 2^-6: multiples of 2^-9, rounded by an f32 add.
    q = (a.to(tl.float32, bitcast=True) * 512.0 + 8388608.0) - 8388608.0
    sub = q.to(tl.uint32)
    # Normal: keep 3 of f32's 23 mantissa bits, then rebias 127 -> 7.
    r = ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)
    mag = tl.where(a < 0x3C800000, sub, r)
    mag = tl.where((mag > 0x7E) | (a > 0x7F800000), 0x7F, mag)
    return (sign | mag.to(tl.uint8)).to(tl.float8e4nv, bitcast=True)
"#,
    ),
    (
        "_tsr_from_f8e4m3fn",
        r#"@triton.jit
def _tsr_from_f8e4m3fn(x):
    # f8e4m3fn to f32 by the bits: S.1111.111 is NaN (no infinity).
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 3) & 0xF
    m = b & 7
    normal = ((e + 120) << 23) | (m << 20)
    mag = tl.where(e == 0, (m.to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True), normal)
    mag = tl.where((b & 0x7F) == 0x7F, 0x7FC00000, mag)
    return (mag | ((b >> 7) << 31)).to(tl.float32, bitcast=True)
"#,
    ),
    (
        "_tsr_from_f8e5m2",
        r#"@triton.jit
def _tsr_from_f8e5m2(x):
    # f8e5m2 to f32 by the bits (exponent 31: infinity or NaN).
    b = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    e = (b >> 2) & 0x1F
    m = b & 3
    normal = ((e + 112) << 23) | (m << 21)
    mag = tl.where(e == 0, (m.to(tl.float32) * 0.0000152587890625).to(tl.uint32, bitcast=True), normal)
    mag = tl.where(e == 31, tl.where(m == 0, 0x7F800000, 0x7FC00000), mag)
    return (mag | ((b >> 7) << 31)).to(tl.float32, bitcast=True)
"#,
    ),
    (
        "_tsr_to_f8e5m2",
        r#"@triton.jit
def _tsr_to_f8e5m2(x):
    # f32 to f8e5m2 by the bits, rounding to nearest even (the hardware
    # conversion saturates): past the largest finite value (57344) is
    # infinity; NaN stays NaN.
    bits = x.to(tl.uint32, bitcast=True)
    sign = ((bits >> 31) << 7).to(tl.uint8)
    a = bits & 0x7FFFFFFF
    # Below 2^-14: multiples of 2^-16, rounded by an f32 add.
    q = (a.to(tl.float32, bitcast=True) * 65536.0 + 8388608.0) - 8388608.0
    sub = q.to(tl.uint32)
    # Normal: keep 2 of f32's 23 mantissa bits, then rebias 127 -> 15.
    r = ((a + 0xFFFFF + ((a >> 21) & 1)) >> 21) - (112 << 2)
    mag = tl.where(a < 0x38800000, sub, r)
    mag = tl.where(mag > 0x7C, 0x7C, mag)
    mag = tl.where(a > 0x7F800000, 0x7E, mag)
    return (sign | mag.to(tl.uint8)).to(tl.float8e5, bitcast=True)
"#,
    ),
];

/// A lowered index expression: a constant (folded here, so Python never
/// divides integers itself) or tensor code.
#[derive(Clone)]
enum Expr {
    Const(i64),
    Code(String),
}

impl Expr {
    fn code(&self) -> String {
        match self {
            Expr::Const(c) => c.to_string(),
            Expr::Code(s) => s.clone(),
        }
    }
}

/// A step of a loop a branch is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `program_id(d) == 0`.
    First,
    /// `program_id(d) == num_programs(d) - 1`.
    Last,
}

struct Line {
    indent: usize,
    text: String,
    loc: Option<Loc>,
}

struct Emitter<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    lines: Vec<Line>,
    indent: usize,
    helpers: BTreeSet<&'static str>,
    uses: HashMap<ValueId, usize>,
    /// Dots emitted at the add that accumulates them (`tl.dot(a, b, acc)`).
    fused: HashSet<ValueId>,
    /// Per operand and dim: the element offset of its window.
    offsets: Vec<Vec<Expr>>,
    /// The op defining each value.
    defs: HashMap<ValueId, &'a Op>,
    /// While a piece of a split loop is written: its work branch and arm
    /// ([`split`]).
    piece: Option<split::Piece>,
}

pub(super) fn program(k: &Kernel, options: TritonOptions) -> Result<TritonProgram, LoweringError> {
    let plan = Plan::of(k);
    let mut e = Emitter {
        k,
        plan: &plan,
        lines: Vec::new(),
        indent: 1,
        helpers: BTreeSet::new(),
        uses: HashMap::new(),
        fused: HashSet::new(),
        offsets: vec![Vec::new(); k.operands.len()],
        defs: HashMap::new(),
        piece: None,
    };
    count_uses(&k.body.region, &mut e.uses);
    definitions(&k.body.region, &mut e.defs);
    let params = params(k, &plan);
    e.prologue();
    e.level(0, &[])?;
    let function = format!("{}_kernel", k.name);
    let mut source = String::new();
    let _ = writeln!(
        source,
        "# Triton program of Tessera kernel `{}` (generated by Tessera {}).\n# A comment names the Rust source of each op.\nimport triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n# The precision of f32 dots: exact in Triton's interpreter; a compile for a\n# GPU sets the tensor cores' f32 scheme (3xTF32 on NVIDIA, whose tensor cores\n# have no IEEE f32; AMD's matrix cores multiply f32 natively).\nF32_DOT = tl.constexpr(\"ieee\")\n",
        k.name,
        env!("CARGO_PKG_VERSION")
    );
    for (name, text) in HELPERS {
        if e.helpers.contains(name) {
            let _ = writeln!(source, "\n{text}");
        }
    }
    let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let _ = writeln!(
        source,
        "\n@triton.jit\ndef {function}({}):",
        names.join(", ")
    );
    for l in &e.lines {
        let text = format!("{}{}", "    ".repeat(l.indent), l.text);
        match &l.loc {
            Some(loc) => {
                let _ = writeln!(source, "{text}  # {loc}");
            }
            None => {
                let _ = writeln!(source, "{text}");
            }
        }
    }
    let workspace_bytes = plan.workspace_per_program * plan.programs(k);
    Ok(TritonProgram {
        function,
        source,
        params,
        grid: plan.launch_grid(k),
        workspace_bytes,
        options,
    })
}

fn params(k: &Kernel, plan: &Plan) -> Vec<TritonParam> {
    let mut out = Vec::new();
    for (i, p) in k.prefetch.iter().enumerate() {
        out.push(TritonParam {
            name: format!("{}_ptr", p.name),
            role: ParamRole::Prefetch(i),
            dtype: p.dtype,
            shape: p.shape.clone(),
        });
    }
    for (i, o) in k.operands.iter().enumerate() {
        if o.role.is_input() {
            out.push(TritonParam {
                name: input_ptr(k, i),
                role: ParamRole::Input(i),
                dtype: o.dtype,
                shape: o.shape.clone(),
            });
        }
    }
    for (i, o) in k.operands.iter().enumerate() {
        if o.role.is_output() {
            out.push(TritonParam {
                name: format!("{}_ptr", o.name),
                role: ParamRole::Output(i),
                dtype: o.dtype,
                shape: o.shape.clone(),
            });
        }
    }
    let bytes = plan.workspace_per_program * plan.programs(k);
    if bytes > 0 {
        out.push(TritonParam {
            name: "workspace".into(),
            role: ParamRole::Workspace,
            dtype: DType::I8,
            shape: vec![bytes as usize],
        });
    }
    out
}

fn input_ptr(k: &Kernel, i: usize) -> String {
    let o = &k.operands[i];
    match o.role {
        Role::InOut => format!("{}_ptr_in", o.name),
        _ => format!("{}_ptr", o.name),
    }
}

fn definitions<'a>(r: &'a Region, defs: &mut HashMap<ValueId, &'a Op>) {
    for op in &r.ops {
        for &v in &op.results {
            defs.insert(v, op);
        }
        for sub in op.kind.regions() {
            definitions(sub, defs);
        }
    }
}

/// The shape of a lane-replicated buffer's column: its last dim 1.
fn column(shape: &[usize]) -> Vec<usize> {
    let mut c = shape.to_vec();
    if let Some(l) = c.last_mut() {
        *l = 1;
    }
    c
}

fn count_uses(r: &Region, uses: &mut HashMap<ValueId, usize>) {
    for op in &r.ops {
        for v in op.kind.operands() {
            *uses.entry(v).or_default() += 1;
        }
        for sub in op.kind.regions() {
            count_uses(sub, uses);
        }
    }
    for &y in &r.yields {
        *uses.entry(y).or_default() += 1;
    }
}

/// The Triton dtype of `d`.
fn tl_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "tl.float32",
        DType::BF16 => "tl.bfloat16",
        DType::F16 => "tl.float16",
        DType::I32 => "tl.int32",
        DType::I8 => "tl.int8",
        DType::Bool => "tl.int1",
        DType::F8E4M3FN => "tl.float8e4nv",
        DType::F8E5M2 => "tl.float8e5",
    }
}

/// Floats other than f32: stored in their type, computed in f32.
fn narrow(d: DType) -> bool {
    d.is_float() && d != DType::F32
}

fn shape_list(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// Row-major element strides.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1].saturating_mul(shape[d + 1]);
    }
    s
}

/// `x` with new unit axes so that its one axis lands at `axis` of `rank`.
fn expand_to(x: &str, axis: usize, rank: usize) -> String {
    if rank <= 1 {
        return x.to_string();
    }
    let idx: Vec<&str> = (0..rank)
        .map(|a| if a == axis { ":" } else { "None" })
        .collect();
    format!("({x})[{}]", idx.join(", "))
}

fn float_literal(v: f64) -> String {
    if v.is_nan() {
        "float(\"nan\")".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "float(\"inf\")".into()
        } else {
            "float(\"-inf\")".into()
        }
    } else {
        let s = format!("{v:?}");
        s.replace("inf", "float(\"inf\")")
    }
}

fn literal(value: Literal, dtype: DType) -> String {
    match dtype {
        DType::Bool => {
            if value.as_f64() != 0.0 {
                "True".into()
            } else {
                "False".into()
            }
        }
        DType::I32 | DType::I8 => {
            let v = match value {
                Literal::Int(i) => i as f64,
                other => other.as_f64(),
            };
            format!("{}", dtype.round(v) as i64)
        }
        _ => float_literal(value.as_f64()),
    }
}

fn fold(op: IndexOp, a: i64, b: i64) -> Option<i64> {
    Some(match op {
        IndexOp::Add => a.checked_add(b)?,
        IndexOp::Sub => a.checked_sub(b)?,
        IndexOp::Mul => a.checked_mul(b)?,
        IndexOp::FloorDiv => {
            if b == 0 {
                return None;
            }
            let q = a / b;
            if (a % b != 0) && ((a < 0) != (b < 0)) {
                q - 1
            } else {
                q
            }
        }
        IndexOp::Rem => {
            if b == 0 {
                return None;
            }
            let r = a % b;
            if r != 0 && ((r < 0) != (b < 0)) {
                r + b
            } else {
                r
            }
        }
        IndexOp::Min => a.min(b),
        IndexOp::Max => a.max(b),
    })
}

impl<'a> Emitter<'a> {
    fn line(&mut self, text: impl Into<String>, loc: Option<&Loc>) {
        self.lines.push(Line {
            indent: self.indent,
            text: text.into(),
            loc: loc.cloned(),
        });
    }

    fn ty(&self, v: ValueId) -> (DType, Vec<usize>) {
        let t = &self.k.body.values[v.index()];
        (t.dtype, t.shape.clone())
    }

    fn v(v: ValueId) -> String {
        format!("v{}", v.0)
    }

    fn unsupported(op: &Op, reason: impl Into<String>) -> LoweringError {
        LoweringError::Unsupported {
            op: op.kind.mnemonic().into(),
            loc: op.loc.clone(),
            target: TARGET,
            reason: reason.into(),
        }
    }

    // ---- program structure ----

    /// Program ids, register buffers, workspace pointers.
    fn prologue(&mut self) {
        let k = self.k;
        let plan = self.plan;
        match &plan.axes {
            Some(axes) => {
                for (&d, &a) in plan.parallel.iter().zip(axes) {
                    self.line(format!("g{d} = tl.program_id({a})"), None);
                }
            }
            None => {
                self.line("pid = tl.program_id(0)", None);
                for (n, &d) in plan.parallel.iter().enumerate().rev() {
                    let bound = k.grid.dims[d].bound;
                    if n == 0 {
                        self.line(format!("g{d} = pid"), None);
                    } else {
                        self.line(format!("g{d} = pid % {bound}"), None);
                        self.line(format!("pid = pid // {bound}"), None);
                    }
                }
            }
        }
        if plan.workspace_per_program > 0 {
            let mut lin = String::from("tl.full([], 0, tl.int64)");
            for &d in &plan.parallel {
                let bound = k.grid.dims[d].bound;
                lin = format!("{lin} * {bound} + g{d}");
            }
            self.line(format!("pid_lin = {lin}"), None);
            for (i, s) in k.scratch.iter().enumerate() {
                if let Some(off) = plan.workspace_offset[i] {
                    self.line(
                        format!(
                            "{}_sptr = (workspace + pid_lin * {} + {off}).to(tl.pointer_type({}), bitcast=True)",
                            s.name,
                            plan.workspace_per_program,
                            tl_dtype(s.dtype)
                        ),
                        s.loc.as_ref(),
                    );
                }
            }
        }
        for (i, s) in k.scratch.iter().enumerate() {
            if plan.residency(BufferRef::Scratch(i)) == Residency::Registers {
                let held = if plan.replicated.contains(&i) {
                    column(&s.shape)
                } else {
                    s.shape.clone()
                };
                self.line(
                    format!(
                        "{}_s = tl.zeros({}, {})",
                        s.name,
                        shape_list(&squeezed(&held)),
                        tl_dtype(s.dtype)
                    ),
                    s.loc.as_ref(),
                );
            }
        }
        for (i, o) in k.operands.iter().enumerate() {
            if plan.residency(BufferRef::Operand(i)) == Residency::Registers {
                self.line(
                    format!(
                        "{}_w = tl.zeros({}, {})",
                        o.name,
                        shape_list(&squeezed(&o.block.shape)),
                        tl_dtype(o.dtype)
                    ),
                    o.loc.as_ref(),
                );
            }
        }
    }

    /// Level `l` of the loop nest: its operands' windows, the next loop or
    /// the body (without the top-level ops in `skip`, hoisted out of the
    /// innermost loop), the write-backs.
    fn level(&mut self, l: usize, skip: &[usize]) -> Result<(), LoweringError> {
        let k = self.k;
        let at_level: Vec<usize> = (0..k.operands.len())
            .filter(|&i| self.plan.level[i] == l)
            .collect();
        for &i in &at_level {
            self.window_offsets(i)?;
            let r = self.plan.residency(BufferRef::Operand(i));
            let o = &k.operands[i];
            let fetch =
                r == Residency::Fetched || (r == Residency::Registers && o.role == Role::InOut);
            if fetch {
                let (ptr, mask) = self.window_pointers(i, &input_ptr(k, i));
                let load = masked_load(&ptr, mask.as_deref(), o.dtype);
                self.line(format!("{}_w = {load}", o.name), o.loc.as_ref());
            }
        }
        if l < self.plan.loops.len() {
            let d = self.plan.loops[l];
            let bound = k.grid.dims[d].bound;
            let innermost = l + 1 == self.plan.loops.len();
            // The first step's prologue (`if k == 0`) runs before the loop
            // and the last step's epilogue (`if k == last`) after it, as a
            // GPU kernel writes them: no branch in the loop, and nothing
            // the loop keeps live (the q block) stays live beside the
            // epilogue's buffers.
            let (prologue, epilogue) = if innermost {
                (
                    self.hoistable(d, Step::First, l + 1),
                    self.sinkable(d, l + 1),
                )
            } else {
                (None, None)
            };
            let body = &k.body.region;
            let mut skip = Vec::new();
            if let Some((at, inputs)) = &prologue {
                self.line(
                    format!("g{d} = tl.full([], 0, tl.int32)"),
                    k.grid_loc.as_ref(),
                );
                self.hoisted(body, (*at, d), inputs)?;
                skip.push(*at);
            }
            if let Some((start, _)) = &epilogue {
                skip.extend(*start..body.ops.len());
            }
            let split = if innermost {
                self.split_plan(d, l + 1, &skip)
            } else {
                None
            };
            let pieces = match &split {
                Some(s) => self.pieces(d, bound, s),
                None => vec![("0".to_string(), bound.to_string(), None)],
            };
            for (start, end, piece) in pieces {
                self.line(
                    format!("for g{d} in range({start}, {end}):"),
                    k.grid_loc.as_ref(),
                );
                self.indent += 1;
                self.piece = piece;
                self.level(l + 1, &skip)?;
                self.piece = None;
                self.indent -= 1;
            }
            if let Some((start, inputs)) = &epilogue {
                self.line(
                    format!("g{d} = tl.full([], {}, tl.int32)", bound - 1),
                    k.grid_loc.as_ref(),
                );
                for &i in inputs {
                    self.op(&body.ops[i], body)?;
                }
                for op in &body.ops[*start..] {
                    match &op.kind {
                        OpKind::If {
                            cond, then_region, ..
                        } if self.step_of(*cond, d, Step::Last) == Some(true) => {
                            self.region(then_region)?
                        }
                        _ => self.op(op, body)?,
                    }
                }
            }
        } else {
            let body = &k.body.region;
            for (i, op) in body.ops.iter().enumerate() {
                match self.piece {
                    _ if skip.contains(&i) => {}
                    Some((outer, arm)) if outer == i => self.piece_work(op, arm)?,
                    _ => self.op(op, body)?,
                }
            }
        }
        for &i in &at_level {
            let o = &k.operands[i];
            if o.role.is_output()
                && self.plan.residency(BufferRef::Operand(i)) == Residency::Registers
            {
                let (ptr, mask) = self.window_pointers(i, &format!("{}_ptr", o.name));
                let store = match mask {
                    Some(m) => format!("tl.store({ptr}, {}_w, mask={m})", o.name),
                    None => format!("tl.store({ptr}, {}_w)", o.name),
                };
                self.line(store, o.loc.as_ref());
            }
        }
        Ok(())
    }

    /// A hoisted first-step branch (op `at` of the loop over grid dim
    /// `d`): the ops it reads values of, then its body, or the whole branch
    /// when its condition says more than the step.
    fn hoisted(
        &mut self,
        body: &Region,
        (at, d): (usize, usize),
        inputs: &[usize],
    ) -> Result<(), LoweringError> {
        for &i in inputs {
            self.op(&body.ops[i], body)?;
        }
        match &body.ops[at].kind {
            OpKind::If {
                cond, then_region, ..
            } if self.step_of(*cond, d, Step::First) == Some(true) => self.region(then_region),
            _ => self.op(&body.ops[at], body),
        }
    }

    /// The end of the innermost body that runs after the loop instead, once,
    /// for the last step: what only the last step's effect of survives.
    /// Its ops are the last-step epilogue (`if program_id(d) ==
    /// num_programs(d) - 1 { .. }`), whole unmasked stores to an output
    /// whose block stays put through the loop and that the body never
    /// reads (each step's write is overwritten by the next: the TPU writes
    /// it back once, when its index changes; a GPU writes it once, after
    /// the loop), loads of register buffers and arithmetic. Gives the first
    /// index of that end and the earlier top-level ops whose values it
    /// reads (arithmetic on grid indices and constants, run again after
    /// the loop); `None` when the body ends otherwise.
    fn sinkable(&self, d: usize, level: usize) -> Option<(usize, Vec<usize>)> {
        let k: &'a Kernel = self.k;
        let body = &k.body.region;
        let mut loaded = HashSet::new();
        walk_region(body, &mut |op| {
            if let OpKind::Load { buffer, .. } = &op.kind {
                loaded.insert(*buffer);
            }
        });
        let sinks = |op: &Op| -> bool {
            match &op.kind {
                OpKind::If {
                    cond,
                    then_region,
                    else_region,
                } => {
                    if !op.results.is_empty()
                        || !else_region.ops.is_empty()
                        || self.step_of(*cond, d, Step::Last).is_none()
                    {
                        return false;
                    }
                    let mut moving = false;
                    walk_region(then_region, &mut |op| {
                        if let OpKind::Load {
                            buffer: BufferRef::Operand(i),
                            ..
                        }
                        | OpKind::Store {
                            buffer: BufferRef::Operand(i),
                            ..
                        } = &op.kind
                        {
                            moving |= self.plan.level[*i] >= level;
                        }
                    });
                    !moving
                }
                OpKind::Store {
                    buffer: b @ BufferRef::Operand(i),
                    indices,
                    mask: None,
                    ..
                } => {
                    self.plan.level[*i] < level
                        && self.plan.residency(*b) == Residency::Memory
                        && !loaded.contains(b)
                        && is_whole(indices, k.operands[*i].view_shape())
                }
                OpKind::Load {
                    buffer, mask: None, ..
                } => {
                    matches!(self.plan.residency(*buffer), Residency::Registers)
                }
                _ => pure(op),
            }
        };
        let mut start = body.ops.len();
        while start > 0 && sinks(&body.ops[start - 1]) {
            start -= 1;
        }
        // Only an end that writes something is worth moving.
        let writes = body.ops[start..]
            .iter()
            .any(|op| matches!(op.kind, OpKind::If { .. } | OpKind::Store { .. }));
        if !writes {
            return None;
        }
        let mut free = std::collections::BTreeSet::new();
        let mut bound = HashSet::new();
        for op in &body.ops[start..] {
            for v in op.kind.operands() {
                if !bound.contains(&v) {
                    free.insert(v);
                }
            }
            for sub in op.kind.regions() {
                free_values(sub, &mut bound.clone(), &mut free);
            }
            bound.extend(op.results.iter().copied());
        }
        let picked = pure_producers(&body.ops[..start], free.into_iter().collect())?;
        Some((start, picked))
    }

    /// A top-level `if program_id(d) == 0 { .. }` (the first op with an
    /// effect) or `if program_id(d) == num_programs(d) - 1 { .. }` (the last
    /// op), with no results and no else, that can run outside the loop over
    /// `d`: its index and the top-level ops whose values it reads, when
    /// those are arithmetic on grid indices and constants and the branch
    /// touches no window that moves with the innermost loop (`level`).
    fn hoistable(&self, d: usize, step: Step, level: usize) -> Option<(usize, Vec<usize>)> {
        let k: &'a Kernel = self.k;
        let body = &k.body.region;
        let at = match step {
            Step::First => body.ops.iter().position(|op| !pure(op))?,
            Step::Last => body.ops.len().checked_sub(1)?,
        };
        let branch = &body.ops[at];
        let OpKind::If {
            cond,
            then_region,
            else_region,
        } = &branch.kind
        else {
            return None;
        };
        if !branch.results.is_empty() || !else_region.ops.is_empty() {
            return None;
        }
        let exact = self.step_of(*cond, d, step)?;
        let mut moving = false;
        walk_region(then_region, &mut |op| {
            if let OpKind::Load {
                buffer: BufferRef::Operand(i),
                ..
            }
            | OpKind::Store {
                buffer: BufferRef::Operand(i),
                ..
            } = &op.kind
            {
                moving |= self.plan.level[*i] >= level;
            }
        });
        if moving {
            return None;
        }
        let mut free = std::collections::BTreeSet::new();
        free_values(then_region, &mut HashSet::new(), &mut free);
        if !exact {
            free.insert(*cond);
        }
        let picked = pure_producers(&body.ops[..at], free.into_iter().collect())?;
        Some((at, picked))
    }

    /// Whether bool `cond` holds at `step` of the loop over grid dim `d`
    /// only: `Some(true)` when it is exactly [`Self::is_step`], `Some(false)`
    /// when it is a conjunction with that among its terms (the kernel's
    /// first step, `program_id(g) == 0 && program_id(d) == 0`, say, which
    /// is then evaluated with the step's index), `None` otherwise.
    fn step_of(&self, cond: ValueId, d: usize, step: Step) -> Option<bool> {
        if self.is_step(cond, d, step) {
            return Some(true);
        }
        let mut terms = vec![cond];
        let mut found = false;
        while let Some(c) = terms.pop() {
            if terms.len() > 64 {
                return None;
            }
            match self.defs.get(&c).map(|o| &o.kind) {
                Some(OpKind::Binary {
                    op: BinaryOp::And,
                    lhs,
                    rhs,
                }) if self.k.body.ty(c).is_some_and(|t| t.shape.is_empty()) => {
                    terms.extend([*lhs, *rhs]);
                }
                _ => found |= self.is_step(c, d, step),
            }
        }
        found.then_some(false)
    }

    /// Whether bool `cond` is `program_id(d) == 0` (first) or
    /// `program_id(d) == num_programs(d) - 1` (last).
    fn is_step(&self, cond: ValueId, d: usize, step: Step) -> bool {
        let bound = self.k.grid.dims[d].bound as i64;
        let want = match step {
            Step::First => 0,
            Step::Last => bound - 1,
        };
        let def = |v: &ValueId| self.defs.get(v).map(|o| &o.kind);
        let is_pid = |v: &ValueId| matches!(def(v), Some(OpKind::ProgramId { dim }) if *dim == d);
        let is_want = |v: &ValueId| match def(v) {
            Some(OpKind::Constant {
                value: Literal::Int(c),
                ty,
            }) => ty.shape.is_empty() && *c == want,
            Some(OpKind::Binary {
                op: BinaryOp::Sub,
                lhs,
                rhs,
            }) => {
                step == Step::Last
                    && matches!(def(lhs), Some(OpKind::NumPrograms { dim }) if *dim == d)
                    && matches!(
                        def(rhs),
                        Some(OpKind::Constant {
                            value: Literal::Int(1),
                            ..
                        })
                    )
            }
            _ => false,
        };
        match def(&cond) {
            Some(OpKind::Compare {
                op: CompareOp::Eq,
                lhs,
                rhs,
            }) => (is_pid(lhs) && is_want(rhs)) || (is_pid(rhs) && is_want(lhs)),
            _ => false,
        }
    }

    /// Defines `<name>_o<d>`, the element offsets of operand `i`'s window.
    fn window_offsets(&mut self, i: usize) -> Result<(), LoweringError> {
        let o = &self.k.operands[i];
        let big = o.shape.iter().product::<usize>() > i32::MAX as usize;
        let mut offs = Vec::new();
        for (d, e) in o.block.index_map.exprs.iter().enumerate() {
            if o.space == MemorySpace::Any {
                offs.push(Expr::Const(0));
                continue;
            }
            let block = o.block.shape[d] as i64;
            match self.index_expr(e) {
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
    fn window_pointers(&self, i: usize, base: &str) -> (String, Option<String>) {
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

    fn index_expr(&mut self, e: &IndexExpr) -> Expr {
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

    fn index_binary(&mut self, op: IndexOp, a: Expr, b: Expr) -> Expr {
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
    fn pointers(&self, b: BufferRef, base: &str, indices: &[Index]) -> (String, Option<String>) {
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
            let edge = window.is_some_and(|w| {
                let o = &k.operands[w];
                o.space != MemorySpace::Any && !o.shape[d].is_multiple_of(o.block.shape[d])
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

    fn region(&mut self, r: &Region) -> Result<(), LoweringError> {
        for op in &r.ops {
            self.op(op, r)?;
        }
        Ok(())
    }

    fn op(&mut self, op: &Op, region: &Region) -> Result<(), LoweringError> {
        let loc = op.loc.as_ref();
        let res = |n: usize| op.results.get(n).copied();
        let out = res(0).map(Self::v).unwrap_or_default();
        match &op.kind {
            OpKind::Constant { value, ty } => {
                let text = if narrow(ty.dtype) {
                    let f32 = format!(
                        "tl.full({}, {}, tl.float32)",
                        shape_list(&ty.shape),
                        literal(*value, DType::F32)
                    );
                    self.down(&f32, ty.dtype)
                } else {
                    format!(
                        "tl.full({}, {}, {})",
                        shape_list(&ty.shape),
                        literal(*value, ty.dtype),
                        tl_dtype(ty.dtype)
                    )
                };
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::ProgramId { dim } => self.line(format!("{out} = g{dim}"), loc),
            OpKind::NumPrograms { dim } => {
                let bound = self.k.grid.dims[*dim].bound;
                self.line(format!("{out} = tl.full([], {bound}, tl.int32)"), loc)
            }
            OpKind::Iota { ty, dim } => {
                let r = expand_to(
                    &format!("tl.arange(0, {})", ty.shape[*dim]),
                    *dim,
                    ty.shape.len(),
                );
                let b = if ty.shape.len() > 1 {
                    format!("tl.broadcast_to({r}, {})", shape_list(&ty.shape))
                } else {
                    r
                };
                let text = self.convert_code(&b, DType::I32, ty.dtype);
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Load {
                buffer,
                indices,
                mask,
            } => {
                let text = self.load(op, *buffer, indices, *mask)?;
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Store {
                buffer,
                indices,
                value,
                mask,
            } => self.store(op, *buffer, indices, *value, *mask)?,
            OpKind::Unary { op: u, x } => {
                let (dtype, _) = self.ty(*x);
                let text = self.unary(op, *u, *x, dtype)?;
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Binary { op: b, lhs, rhs } => {
                let text = self.binary(op, *b, *lhs, *rhs, region)?;
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Compare { op: c, lhs, rhs } => {
                let (dtype, _) = self.ty(*lhs);
                let (a, b) = (self.up(*lhs, dtype), self.up(*rhs, dtype));
                let sym = match c {
                    CompareOp::Eq => "==",
                    CompareOp::Ne => "!=",
                    CompareOp::Lt => "<",
                    CompareOp::Le => "<=",
                    CompareOp::Gt => ">",
                    CompareOp::Ge => ">=",
                };
                self.line(format!("{out} = {a} {sym} {b}"), loc);
            }
            OpKind::Select {
                cond,
                on_true,
                on_false,
            } => self.line(
                format!(
                    "{out} = tl.where({}, {}, {})",
                    Self::v(*cond),
                    Self::v(*on_true),
                    Self::v(*on_false)
                ),
                loc,
            ),
            OpKind::Convert { x, dtype } => {
                let (from, _) = self.ty(*x);
                let text = self.convert_code(&Self::v(*x), from, *dtype);
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::BroadcastInDim { x, shape, dims } => {
                let (_, xs) = self.ty(*x);
                let text = broadcast(&Self::v(*x), &xs, shape, dims);
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Reshape { x, shape } => {
                let (_, xs) = self.ty(*x);
                let (dt, _) = self.ty(*x);
                let text = reshape(&Self::v(*x), &xs, shape, dt);
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Transpose { x, perm } => {
                let text = if perm.len() == 2 && perm[0] == 1 {
                    format!("tl.trans({})", Self::v(*x))
                } else if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    Self::v(*x)
                } else {
                    format!("tl.permute({}, {})", Self::v(*x), shape_list(perm))
                };
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Reduce { op: r, x, axes } => {
                let text = match self.replicated_reduce(*r, *x, axes, res(0)) {
                    Some(t) => t,
                    None => self.reduce(*r, *x, axes),
                };
                self.line(format!("{out} = {text}"), loc);
            }
            OpKind::Dot {
                lhs,
                rhs,
                dims,
                acc,
            } => {
                if let Some(r) = res(0)
                    && self.fusible(r, region)
                {
                    self.fused.insert(r);
                } else {
                    let text = self.dot(*lhs, *rhs, dims, *acc, None, res(0))?;
                    self.line(format!("{out} = {text}"), loc);
                }
            }
            OpKind::For {
                lower,
                upper,
                step,
                init,
                body,
                unroll,
            } => self.for_loop(op, *lower, *upper, *step, init, body, *unroll)?,
            OpKind::If {
                cond,
                then_region,
                else_region,
            } => {
                self.line(format!("if {}:", Self::v(*cond)), loc);
                for (i, r) in [then_region, else_region].into_iter().enumerate() {
                    if i == 1 {
                        if r.ops.is_empty() && op.results.is_empty() {
                            break;
                        }
                        self.line("else:", loc);
                    }
                    self.indent += 1;
                    let before = self.lines.len();
                    self.region(r)?;
                    for (&res, &y) in op.results.iter().zip(&r.yields) {
                        self.line(format!("{} = {}", Self::v(res), Self::v(y)), loc);
                    }
                    if self.lines.len() == before {
                        self.line("pass", None);
                    }
                    self.indent -= 1;
                }
            }
            OpKind::DmaStart(_)
            | OpKind::DmaWait(_)
            | OpKind::DmaWaitSend(_)
            | OpKind::SemSignal { .. }
            | OpKind::SemWait { .. }
            | OpKind::SemRead { .. }
            | OpKind::Scope { .. } => {
                return Err(crate::removed_by_synchronous_pass(op, TARGET));
            }
            OpKind::DeviceId | OpKind::AxisIndex { .. } | OpKind::RemoteSignal { .. } => {
                return Err(crate::reached_single_device(op, TARGET));
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn for_loop(
        &mut self,
        op: &Op,
        lower: IndexValue,
        upper: IndexValue,
        step: i64,
        init: &[ValueId],
        body: &Region,
        unroll: bool,
    ) -> Result<(), LoweringError> {
        let loc = op.loc.as_ref();
        let bound = |b: IndexValue| match b {
            IndexValue::Static(s) => s.to_string(),
            IndexValue::Dynamic(v) => Self::v(v),
        };
        let carried = &body.args[1..];
        for (&c, &i) in carried.iter().zip(init) {
            self.line(format!("{} = {}", Self::v(c), Self::v(i)), loc);
        }
        let iv = body.args[0];
        let statik = matches!(
            (lower, upper),
            (IndexValue::Static(_), IndexValue::Static(_))
        );
        if unroll && statik {
            self.line(
                format!(
                    "for {}_c in tl.static_range({}, {}, {step}):",
                    Self::v(iv),
                    bound(lower),
                    bound(upper)
                ),
                loc,
            );
            self.indent += 1;
            self.line(
                format!("{} = tl.full([], {}_c, tl.int32)", Self::v(iv), Self::v(iv)),
                loc,
            );
        } else {
            self.line(
                format!(
                    "for {} in range({}, {}, {step}):",
                    Self::v(iv),
                    bound(lower),
                    bound(upper)
                ),
                loc,
            );
            self.indent += 1;
        }
        self.region(body)?;
        if !carried.is_empty() {
            let lhs: Vec<String> = carried.iter().map(|&c| Self::v(c)).collect();
            let rhs: Vec<String> = body.yields.iter().map(|&y| Self::v(y)).collect();
            self.line(format!("{} = {}", lhs.join(", "), rhs.join(", ")), loc);
        } else if body.ops.is_empty() {
            self.line("pass", None);
        }
        self.indent -= 1;
        for (&r, &c) in op.results.iter().zip(carried) {
            self.line(format!("{} = {}", Self::v(r), Self::v(c)), loc);
        }
        Ok(())
    }

    // ---- values ----

    /// `v` in f32 when it is a narrow float.
    fn up(&mut self, v: ValueId, dtype: DType) -> String {
        self.widen(&Self::v(v), dtype)
    }

    /// Code `x` of a narrow float `dtype` in f32 (exactly).
    fn widen(&mut self, x: &str, dtype: DType) -> String {
        match dtype {
            DType::F8E4M3FN => {
                self.helpers.insert("_tsr_from_f8e4m3fn");
                format!("_tsr_from_f8e4m3fn({x})")
            }
            DType::F8E5M2 => {
                self.helpers.insert("_tsr_from_f8e5m2");
                format!("_tsr_from_f8e5m2({x})")
            }
            d if narrow(d) => format!("{x}.to(tl.float32)"),
            _ => x.to_string(),
        }
    }

    /// An f32 expression rounded to `dtype` (a narrow float).
    fn down(&mut self, f32: &str, dtype: DType) -> String {
        match dtype {
            DType::F8E4M3FN => {
                self.helpers.insert("_tsr_to_f8e4m3fn");
                format!("_tsr_to_f8e4m3fn({f32})")
            }
            DType::F8E5M2 => {
                self.helpers.insert("_tsr_to_f8e5m2");
                format!("_tsr_to_f8e5m2({f32})")
            }
            DType::BF16 | DType::F16 => format!("({f32}).to({})", tl_dtype(dtype)),
            _ => f32.to_string(),
        }
    }

    /// `x` (of `from`) converted to `to` by `DType::round`'s rules.
    fn convert_code(&mut self, x: &str, from: DType, to: DType) -> String {
        if from == to {
            return x.to_string();
        }
        match (from, to) {
            (DType::Bool, _) => {
                let one = if to.is_float() { "1.0" } else { "1" };
                let zero = if to.is_float() { "0.0" } else { "0" };
                let f = format!("tl.where({x}, {one}, {zero})");
                match to {
                    DType::F32 => format!("({f}).to(tl.float32)"),
                    d if narrow(d) => self.down(&format!("({f}).to(tl.float32)"), d),
                    d => format!("({f}).to({})", tl_dtype(d)),
                }
            }
            (_, DType::Bool) => {
                let f = self.widen(x, from);
                if from.is_float() {
                    format!("(({f}) != 0) & (({f}) == ({f}))")
                } else {
                    format!("({f}) != 0")
                }
            }
            (f, t) if f.is_float() && t.is_float() => {
                let f32 = self.widen(x, f);
                self.down(&f32, t)
            }
            // `tl.cast`, not `.to`: a loop index is a Python int under the
            // interpreter (a tensor only when compiled).
            (f, t) if f.is_int() && t.is_float() => {
                let f32 = format!("tl.cast({x}, tl.float32)");
                self.down(&f32, t)
            }
            (f, t) if f.is_float() && t.is_int() => {
                self.helpers.insert("_tsr_to_int");
                let f32 = self.widen(x, f);
                let (lo, hi) = t.float_to_int_clamp();
                let imax = -lo as i64 - 1;
                format!(
                    "_tsr_to_int({f32}, {}, {lo:?}, {hi:?}, {imax})",
                    tl_dtype(t)
                )
            }
            (_, t) => format!("tl.cast({x}, {})", tl_dtype(t)),
        }
    }

    fn unary(
        &mut self,
        op: &Op,
        u: UnaryOp,
        x: ValueId,
        dtype: DType,
    ) -> Result<String, LoweringError> {
        let a = self.up(x, dtype);
        let f = match u {
            UnaryOp::Neg => format!("-{a}"),
            UnaryOp::Abs => format!("tl.abs({a})"),
            UnaryOp::Not => format!("~{a}"),
            _ if !dtype.is_float() => {
                return Err(Self::unsupported(op, format!("{} of {dtype}", u.name())));
            }
            UnaryOp::Exp => format!("tl.exp({a})"),
            UnaryOp::Exp2 => format!("tl.exp2({a})"),
            UnaryOp::Log => format!("tl.log({a})"),
            UnaryOp::Log1p => format!("libdevice.log1p({a})"),
            UnaryOp::Tanh => format!("libdevice.tanh({a})"),
            UnaryOp::Sqrt => format!("tl.sqrt_rn({a})"),
            UnaryOp::Rsqrt => format!("tl.rsqrt({a})"),
            UnaryOp::Sin => format!("tl.sin({a})"),
            UnaryOp::Cos => format!("tl.cos({a})"),
            UnaryOp::Erf => format!("tl.erf({a})"),
            UnaryOp::Logistic => format!("tl.sigmoid({a})"),
            UnaryOp::Floor => format!("tl.floor({a})"),
            UnaryOp::Ceil => format!("tl.ceil({a})"),
        };
        Ok(if narrow(dtype) {
            self.down(&f, dtype)
        } else {
            f
        })
    }

    fn binary(
        &mut self,
        op: &Op,
        b: BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
        region: &Region,
    ) -> Result<String, LoweringError> {
        let (dtype, shape) = self.ty(lhs);
        if b == BinaryOp::Add {
            for (d, other) in [(lhs, rhs), (rhs, lhs)] {
                if self.fused.contains(&d)
                    && let Some(dot) = find_def(region, d)
                    && let OpKind::Dot {
                        lhs: a,
                        rhs: bb,
                        dims,
                        acc,
                    } = &dot.kind
                {
                    let acc_code = reshape_for_dot(&Self::v(other), &shape, self, dot)?;
                    return self.dot(*a, *bb, dims, *acc, Some(acc_code), Some(d));
                }
            }
        }
        let (x, y) = (self.up(lhs, dtype), self.up(rhs, dtype));
        let f = match b {
            BinaryOp::Add => format!("{x} + {y}"),
            BinaryOp::Sub => format!("{x} - {y}"),
            BinaryOp::Mul => format!("{x} * {y}"),
            BinaryOp::Div if dtype.is_float() => format!("tl.div_rn({x}, {y})"),
            BinaryOp::Div => format!("{x} // {y}"),
            BinaryOp::Rem => format!("{x} % {y}"),
            BinaryOp::Max | BinaryOp::Min if dtype.is_float() => {
                let h = if b == BinaryOp::Max {
                    "_tsr_max"
                } else {
                    "_tsr_min"
                };
                self.helpers.insert(h);
                format!("{h}({x}, {y})")
            }
            BinaryOp::Max if dtype == DType::Bool => format!("{x} | {y}"),
            BinaryOp::Min if dtype == DType::Bool => format!("{x} & {y}"),
            BinaryOp::Max => format!("tl.maximum({x}, {y})"),
            BinaryOp::Min => format!("tl.minimum({x}, {y})"),
            BinaryOp::Pow if dtype.is_float() => format!("libdevice.pow({x}, {y})"),
            BinaryOp::Pow => return Err(Self::unsupported(op, format!("pow of {dtype}"))),
            BinaryOp::And => format!("{x} & {y}"),
            BinaryOp::Or => format!("{x} | {y}"),
            BinaryOp::Xor => format!("{x} ^ {y}"),
        };
        Ok(if narrow(dtype) {
            self.down(&f, dtype)
        } else if dtype == DType::I8 && matches!(b, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) {
            format!("({f}).to(tl.int8)")
        } else {
            f
        })
    }

    fn reduce(&mut self, r: ReduceOp, x: ValueId, axes: &[usize]) -> String {
        let (dtype, _) = self.ty(x);
        let mut cur = if dtype == DType::Bool {
            format!("{}.to(tl.int8)", Self::v(x))
        } else {
            self.up(x, dtype)
        };
        for &a in axes.iter().rev() {
            cur = match r {
                ReduceOp::Sum => format!("tl.sum({cur}, axis={a})"),
                ReduceOp::Max | ReduceOp::Min if dtype.is_float() => {
                    let h = if r == ReduceOp::Max {
                        "_tsr_max"
                    } else {
                        "_tsr_min"
                    };
                    self.helpers.insert(h);
                    format!("tl.reduce({cur}, {a}, {h})")
                }
                ReduceOp::Max => format!("tl.max({cur}, axis={a})"),
                ReduceOp::Min => format!("tl.min({cur}, axis={a})"),
            };
        }
        match dtype {
            DType::Bool => format!("({cur}) != 0"),
            DType::I8 | DType::I32 => format!("({cur}).to({})", tl_dtype(dtype)),
            d if narrow(d) => self.down(&cur, d),
            _ => cur,
        }
    }

    /// Whether dot result `r` is added to something once, in the same
    /// region, so the add can be `tl.dot(a, b, acc)`.
    fn fusible(&self, r: ValueId, region: &Region) -> bool {
        if self.uses.get(&r) != Some(&1) {
            return false;
        }
        let Some(def) = find_def(region, r) else {
            return false;
        };
        let OpKind::Dot {
            lhs,
            rhs,
            dims,
            acc,
        } = &def.kind
        else {
            return false;
        };
        if *acc != DType::F32 || !self.uses_tensor_cores(*lhs, *rhs, dims) {
            return false;
        }
        region.ops.iter().any(|op| {
            matches!(op.kind, OpKind::Binary { op: BinaryOp::Add, lhs, rhs } if (lhs == r) != (rhs == r))
        })
    }

    /// The `[b?, m, k]` and `[b?, k, n]` sizes of a dot.
    fn dot_sizes(
        &self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
    ) -> (usize, usize, usize, usize) {
        let (_, ls) = self.ty(lhs);
        let (_, rs) = self.ty(rhs);
        let b: usize = dims.lhs_batch.iter().map(|&d| ls[d]).product();
        let k: usize = dims.lhs_contract.iter().map(|&d| ls[d]).product();
        let m: usize = (0..ls.len())
            .filter(|d| !dims.lhs_batch.contains(d) && !dims.lhs_contract.contains(d))
            .map(|d| ls[d])
            .product();
        let n: usize = (0..rs.len())
            .filter(|d| !dims.rhs_batch.contains(d) && !dims.rhs_contract.contains(d))
            .map(|d| rs[d])
            .product();
        (b, m, k, n)
    }

    fn uses_tensor_cores(&self, lhs: ValueId, rhs: ValueId, dims: &DotDims) -> bool {
        let (dtype, _) = self.ty(lhs);
        let (_, m, k, n) = self.dot_sizes(lhs, rhs, dims);
        let typed = matches!(
            dtype,
            DType::F32 | DType::BF16 | DType::F16 | DType::I8 | DType::F8E4M3FN | DType::F8E5M2
        );
        typed && m >= 16 && n >= 16 && k >= 16 && dims.lhs_batch.len() <= 1
    }

    /// A dot as code; `acc` (already shaped `[b?, m, n]`) is accumulated
    /// into when given.
    fn dot(
        &mut self,
        lhs: ValueId,
        rhs: ValueId,
        dims: &DotDims,
        acc_dtype: DType,
        acc: Option<String>,
        result: Option<ValueId>,
    ) -> Result<String, LoweringError> {
        let (ldt, ls) = self.ty(lhs);
        let (_, rs) = self.ty(rhs);
        let (b, m, k, n) = self.dot_sizes(lhs, rhs, dims);
        let lfree: Vec<usize> = (0..ls.len())
            .filter(|d| !dims.lhs_batch.contains(d) && !dims.lhs_contract.contains(d))
            .collect();
        let rfree: Vec<usize> = (0..rs.len())
            .filter(|d| !dims.rhs_batch.contains(d) && !dims.rhs_contract.contains(d))
            .collect();
        let batched = !dims.lhs_batch.is_empty();
        let lorder: Vec<usize> = dims
            .lhs_batch
            .iter()
            .chain(&lfree)
            .chain(&dims.lhs_contract)
            .copied()
            .collect();
        let rorder: Vec<usize> = dims
            .rhs_batch
            .iter()
            .chain(&dims.rhs_contract)
            .chain(&rfree)
            .copied()
            .collect();
        let lshape = if batched { vec![b, m, k] } else { vec![m, k] };
        let rshape = if batched { vec![b, k, n] } else { vec![k, n] };
        let a = arrange(&Self::v(lhs), &ls, &lorder, &lshape, ldt);
        let bb = arrange(&Self::v(rhs), &rs, &rorder, &rshape, ldt);
        let acc_tl = tl_dtype(acc_dtype);
        let product = if self.uses_tensor_cores(lhs, rhs, dims) {
            // f32 products at f32's precision: IEEE in the interpreter, the
            // target's multi-pass tensor-core scheme when compiled (`F32_DOT`).
            let precision = if ldt == DType::F32 {
                ", input_precision=F32_DOT"
            } else {
                ""
            };
            match acc {
                Some(c) => format!("tl.dot({a}, {bb}, {c}{precision}, out_dtype={acc_tl})"),
                None => format!("tl.dot({a}, {bb}{precision}, out_dtype={acc_tl})"),
            }
        } else {
            let (ea, eb, axis) = if batched {
                (
                    format!("({a}).to({acc_tl})[:, :, :, None]"),
                    format!("({bb}).to({acc_tl})[:, None, :, :]"),
                    2,
                )
            } else {
                (
                    format!("({a}).to({acc_tl})[:, :, None]"),
                    format!("({bb}).to({acc_tl})[None, :, :]"),
                    1,
                )
            };
            let s = format!("tl.sum({ea} * {eb}, axis={axis})");
            match acc {
                Some(c) => format!("{c} + {s}"),
                None => s,
            }
        };
        let out_shape = match result {
            Some(r) => self.ty(r).1,
            None => Vec::new(),
        };
        let flat = if batched { vec![b, m, n] } else { vec![m, n] };
        Ok(if out_shape == flat || result.is_none() {
            product
        } else {
            format!("tl.reshape({product}, {})", shape_list(&out_shape))
        })
    }

    // ---- lane-replicated scratch (held as its column) ----

    /// A load from a lane-replicated buffer: the column, broadcast back
    /// along the last dim where the load reads more than one lane.
    fn replicated_load(&self, b: BufferRef, indices: &[Index]) -> Option<String> {
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
    fn replicated_reduce(
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
    fn replicated_value(
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
    fn var(&self, b: BufferRef) -> String {
        match b {
            BufferRef::Operand(i) => format!("{}_w", self.k.operands[i].name),
            BufferRef::Scratch(i) => format!("{}_s", self.k.scratch[i].name),
            BufferRef::Prefetch(i) => format!("{}_ptr", self.k.prefetch[i].name),
        }
    }

    fn base(&self, b: BufferRef, store: bool) -> String {
        match b {
            BufferRef::Operand(i) if store => format!("{}_ptr", self.k.operands[i].name),
            BufferRef::Operand(i) => input_ptr(self.k, i),
            BufferRef::Scratch(i) => format!("{}_sptr", self.k.scratch[i].name),
            BufferRef::Prefetch(i) => format!("{}_ptr", self.k.prefetch[i].name),
        }
    }

    fn buffer_shape(&self, b: BufferRef) -> Vec<usize> {
        self.k.buffer(b).map(|x| x.2.to_vec()).unwrap_or_default()
    }

    fn load(
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

    fn store(
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
fn masked_load(ptr: &str, mask: Option<&str>, dtype: DType) -> String {
    match (mask, dtype) {
        (None, _) => format!("tl.load({ptr})"),
        (Some(m), DType::F8E4M3FN | DType::F8E5M2) => format!(
            "tl.load(({ptr}).to(tl.pointer_type(tl.uint8), bitcast=True), mask={m}, other=0).to({}, bitcast=True)",
            tl_dtype(dtype)
        ),
        (Some(m), _) => format!("tl.load({ptr}, mask={m}, other=0)"),
    }
}

/// Values `r` reads that are defined outside it.
fn free_values(
    r: &Region,
    bound: &mut HashSet<ValueId>,
    free: &mut std::collections::BTreeSet<ValueId>,
) {
    bound.extend(r.args.iter().copied());
    for op in &r.ops {
        for v in op.kind.operands() {
            if !bound.contains(&v) {
                free.insert(v);
            }
        }
        for sub in op.kind.regions() {
            free_values(sub, bound, free);
        }
        bound.extend(op.results.iter().copied());
    }
    for y in &r.yields {
        if !bound.contains(y) {
            free.insert(*y);
        }
    }
}

fn walk_region<'a>(r: &'a Region, f: &mut impl FnMut(&'a Op)) {
    for op in &r.ops {
        f(op);
        for sub in op.kind.regions() {
            walk_region(sub, f);
        }
    }
}

/// The op that defines `v` directly in `region`.
fn find_def(region: &Region, v: ValueId) -> Option<&Op> {
    region.ops.iter().find(|op| op.results.contains(&v))
}

/// The accumulator of a fused dot, shaped as the dot's `[b?, m, n]`.
fn reshape_for_dot(
    acc: &str,
    shape: &[usize],
    e: &Emitter<'_>,
    dot: &Op,
) -> Result<String, LoweringError> {
    let OpKind::Dot { lhs, rhs, dims, .. } = &dot.kind else {
        return Err(LoweringError::Internal("a fused dot that is no dot".into()));
    };
    let (b, m, _, n) = e.dot_sizes(*lhs, *rhs, dims);
    let flat = if dims.lhs_batch.is_empty() {
        vec![m, n]
    } else {
        vec![b, m, n]
    };
    Ok(reshape(acc, shape, &flat, DType::F32))
}

/// `x` (of `shape`) permuted to `order` and reshaped to `to`.
fn arrange(x: &str, shape: &[usize], order: &[usize], to: &[usize], dtype: DType) -> String {
    let identity = order.iter().enumerate().all(|(i, &o)| i == o);
    let (mut code, permuted): (String, Vec<usize>) = if identity {
        (x.to_string(), shape.to_vec())
    } else if order.len() == 2 {
        (format!("tl.trans({x})"), vec![shape[1], shape[0]])
    } else {
        (
            format!("tl.permute({x}, {})", shape_list(order)),
            order.iter().map(|&o| shape[o]).collect(),
        )
    };
    if permuted != to {
        code = reshape(&code, &permuted, to, dtype);
    }
    code
}

/// Row-major reshape of `x` from `from` to `to`: unit dims inserted by
/// indexing (`x[:, None]`), which costs nothing, a real reshape only when
/// the other dims change.
fn reshape(x: &str, from: &[usize], to: &[usize], dtype: DType) -> String {
    if from == to {
        return x.to_string();
    }
    let core: Vec<usize> = from.iter().copied().filter(|&d| d != 1).collect();
    let to_core: Vec<usize> = to.iter().copied().filter(|&d| d != 1).collect();
    if core != to_core {
        return format!("tl.reshape({x}, {})", shape_list(to));
    }
    if core.is_empty() {
        // A single element: a scalar, or units of any rank.
        let scalar = if from.is_empty() {
            x.to_string()
        } else {
            format!("tl.reshape({x}, [])")
        };
        return if to.is_empty() {
            scalar
        } else {
            format!("tl.broadcast_to({scalar}, {})", shape_list(to))
        };
    }
    // Unit dims go by a max over each (one element: no combine, and the
    // result has the layout a reduction gives, which `x[:, None]` expands
    // for free; `tl.reshape` would make a layout that needs converting).
    // Triton's max widens bf16 and f16 to f32: those keep `tl.reshape`.
    let mut squeezed = x.to_string();
    if narrow(dtype) {
        if core.len() != from.len() {
            squeezed = format!("tl.reshape({x}, {})", shape_list(&core));
        }
    } else {
        for (a, _) in from.iter().enumerate().rev().filter(|(_, d)| **d == 1) {
            squeezed = format!("tl.max({squeezed}, axis={a})");
        }
    }
    if to.len() == core.len() {
        return squeezed;
    }
    let idx: Vec<&str> = to
        .iter()
        .map(|&d| if d == 1 { "None" } else { ":" })
        .collect();
    format!("({squeezed})[{}]", idx.join(", "))
}

/// A buffer's shape without its unit dims: the shape of its register
/// variable.
pub(super) fn squeezed(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

/// StableHLO's `broadcast_in_dim` of `x`.
fn broadcast(x: &str, from: &[usize], to: &[usize], dims: &[usize]) -> String {
    if from.is_empty() {
        return format!("tl.broadcast_to({x}, {})", shape_list(to));
    }
    let mut idx = vec!["None"; to.len()];
    for &d in dims {
        idx[d] = ":";
    }
    let expanded = if from.len() == to.len() {
        x.to_string()
    } else {
        format!("({x})[{}]", idx.join(", "))
    };
    let shape: Vec<usize> = (0..to.len())
        .map(|d| match dims.iter().position(|&x| x == d) {
            Some(i) => from[i],
            None => 1,
        })
        .collect();
    if shape == to {
        expanded
    } else {
        format!("tl.broadcast_to({expanded}, {})", shape_list(to))
    }
}

/// A static slice of the register variable `x` of a buffer of `shape`
/// (held squeezed, [`squeezed`]): gathers along each narrowed dim, then
/// reshapes to the load's shape. `None` for dynamic indices.
fn slice(x: &str, shape: &[usize], indices: &[Index], dtype: DType) -> Option<String> {
    let mut cur = x.to_string();
    let mut cur_shape = squeezed(shape);
    let mut keep = Vec::new();
    let mut axis = 0;
    for (d, idx) in indices.iter().enumerate() {
        let (start, len, point) = match idx {
            Index::Slice {
                start: IndexValue::Static(s),
                len,
            } => (*s, *len, false),
            Index::Point(IndexValue::Static(p)) => (*p, 1, true),
            _ => return None,
        };
        if !point {
            keep.push(len);
        }
        if shape[d] == 1 {
            continue;
        }
        if start != 0 || len != shape[d] {
            cur_shape[axis] = len;
            let r = expand_to(
                &format!("({start} + tl.arange(0, {len}))"),
                axis,
                cur_shape.len(),
            );
            let idx = if cur_shape.len() > 1 {
                format!("tl.broadcast_to({r}, {})", shape_list(&cur_shape))
            } else {
                r
            };
            cur = format!("tl.gather({cur}, {idx}, {axis})");
        }
        axis += 1;
    }
    Some(reshape(&cur, &cur_shape, &keep, dtype))
}

/// An op without effects, cheap to compute again: what may move with a
/// hoisted prologue or a sunk epilogue.
fn pure(op: &Op) -> bool {
    matches!(
        op.kind,
        OpKind::Constant { .. }
            | OpKind::ProgramId { .. }
            | OpKind::NumPrograms { .. }
            | OpKind::Binary { .. }
            | OpKind::Compare { .. }
            | OpKind::Unary { .. }
            | OpKind::Convert { .. }
            | OpKind::Select { .. }
            | OpKind::BroadcastInDim { .. }
            | OpKind::Reshape { .. }
            | OpKind::Iota { .. }
    )
}

/// The indices, in order, of the ops among `ops` that compute the values
/// `need` reads, transitively; `None` when one has an effect or a value
/// comes from outside `ops` (the set cannot move as one).
fn pure_producers(ops: &[Op], mut need: HashSet<ValueId>) -> Option<Vec<usize>> {
    let mut picked = Vec::new();
    for (i, op) in ops.iter().enumerate().rev() {
        if !op.results.iter().any(|r| need.contains(r)) {
            continue;
        }
        if !pure(op) {
            return None;
        }
        picked.push(i);
        need.extend(op.kind.operands());
    }
    let defined: HashSet<ValueId> = picked
        .iter()
        .flat_map(|&i| ops[i].results.iter().copied())
        .collect();
    if need.iter().any(|v| !defined.contains(v)) {
        return None;
    }
    picked.reverse();
    Some(picked)
}
