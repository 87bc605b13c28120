//! A grammar fuzzer for kernel files: a well-typed `.kir` kernel from a
//! seed, its inputs, and mutations of its text.
//!
//! The kernels are the shapes authors write: a grid of one or two dims
//! (parallel or arbitrary), 1 to 3 inputs of f32, bf16, i32 or bool over
//! row blocks (ragged last blocks included), an output accumulated over
//! an arbitrary dim through scratch, and a body of elementwise math,
//! compares and selects, conversions, row and column reductions, iota
//! masks, two chained dots, loops carrying values and branches on the
//! program id, over inputs that hold NaN, ±∞ and −0 now and then.
//!
//! Every path must give the same answer, so the generator keeps apart what
//! is exact from what is rounded: a value is `Exact` while it is a dyadic
//! number that fits an f32 significand (inputs are multiples of 1/4, so
//! sums, products, max, floor are exact on every path whatever the order),
//! and only exact values reach the ops whose result jumps on a last-bit
//! difference (floor, ceil, compares, rem, conversions to integers, a
//! divisor, pow). Rounded values (transcendentals, quotients) go only
//! through continuous ops, so a path differs from another by rounding, not
//! by a flipped branch: what is left to disagree is a real difference of
//! semantics.

use kernel_ir::{Array, SplitMix64};

mod generate;
mod mutate;
pub use generate::generate;
pub use mutate::mutate;

/// One generated case.
pub struct Case {
    /// The kernel file's text.
    pub text: String,
    /// The inputs, by name.
    pub inputs: Vec<(String, Array)>,
    /// The mutations applied, if any (for the report).
    pub mutations: Vec<String>,
}

/// A seeded choice.
type Choose = SplitMix64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ty {
    F32,
    I32,
    Bool,
}

impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::I32 => "i32",
            Ty::Bool => "bool",
        }
    }
}

/// What is known of a value on every path.
#[derive(Clone, Copy, Debug)]
enum Ex {
    /// A multiple of 2^-frac below 2^int in magnitude (or NaN, ±∞ from
    /// the inputs): every path computes it exactly.
    Exact { frac: u32, int: u32 },
    /// Rounded; below `mag` in magnitude when finite.
    Rounded { mag: f64 },
}

impl Ex {
    const SIGNIFICAND: u32 = 24;

    fn exact(frac: u32, int: u32) -> Ex {
        if frac + int <= Ex::SIGNIFICAND {
            Ex::Exact { frac, int }
        } else {
            Ex::Rounded {
                mag: 2f64.powi(int as i32),
            }
        }
    }
    fn mag(self) -> f64 {
        match self {
            Ex::Exact { int, .. } => 2f64.powi(int as i32),
            Ex::Rounded { mag } => mag,
        }
    }
    fn is_exact(self) -> bool {
        matches!(self, Ex::Exact { .. })
    }
}

#[derive(Clone, Copy, Debug)]
struct Val {
    id: usize,
    ty: Ty,
    ex: Ex,
}

/// The kernel being written.
struct Gen {
    c: Choose,
    lines: Vec<String>,
    indent: usize,
    next: usize,
    /// Visible tile values, innermost region last.
    vals: Vec<Val>,
    /// Rows and lanes of every tile.
    rows: usize,
    lanes: usize,
    grid_dims: usize,
    ops_left: usize,
}

impl Gen {
    fn tile(&self, ty: Ty) -> String {
        format!("{}[{}, {}]", ty.name(), self.rows, self.lanes)
    }
    fn emit(&mut self, line: String) {
        self.lines
            .push(format!("{}{line}", "  ".repeat(self.indent + 1)));
    }
    fn fresh(&mut self) -> usize {
        self.next += 1;
        self.next - 1
    }
    /// Defines `%N = rhs : type` and makes it visible.
    fn def(&mut self, rhs: String, ty: Ty, ex: Ex) -> Val {
        let id = self.fresh();
        let t = self.tile(ty);
        self.emit(format!("%{id} = {rhs} : {t}"));
        let v = Val { id, ty, ex };
        self.vals.push(v);
        v
    }
    /// Defines `%N = rhs T` for ops whose text ends `: A ->`.
    fn def_to(&mut self, rhs: String, ty: Ty, ex: Ex) -> Val {
        let id = self.fresh();
        let t = self.tile(ty);
        self.emit(format!("%{id} = {rhs} {t}"));
        let v = Val { id, ty, ex };
        self.vals.push(v);
        v
    }
    fn scalar(&mut self, rhs: String) -> usize {
        let id = self.fresh();
        self.emit(format!("%{id} = {rhs} : i32"));
        id
    }

    /// A visible value of type `ty` passing `ok`, or a new constant.
    fn pick(&mut self, ty: Ty, ok: impl Fn(&Val) -> bool) -> Val {
        let found: Vec<Val> = self
            .vals
            .iter()
            .filter(|v| v.ty == ty && ok(v))
            .copied()
            .collect();
        // Recent values more often: chains, not only fans from the loads.
        if !found.is_empty() && !self.c.chance(10) {
            let n = found.len();
            let i = if self.c.chance(50) {
                n - 1 - self.c.below(n.min(3))
            } else {
                self.c.below(n)
            };
            return found[i];
        }
        self.constant(ty, ok)
    }

    /// A new constant tile passing `ok` (every list has exact values).
    fn constant(&mut self, ty: Ty, ok: impl Fn(&Val) -> bool) -> Val {
        match ty {
            Ty::F32 => {
                let table = [
                    ("0.0", Ex::exact(0, 0)),
                    ("1.0", Ex::exact(0, 1)),
                    ("-2.5", Ex::exact(1, 2)),
                    ("0.25", Ex::exact(2, 0)),
                    ("3.0", Ex::exact(0, 2)),
                    ("-0.0", Ex::exact(0, 0)),
                    ("inf", Ex::exact(0, 0)),
                    ("-inf", Ex::exact(0, 0)),
                    ("NaN", Ex::exact(0, 0)),
                    ("1.0e30", Ex::Rounded { mag: 1e30 }),
                ];
                let fits: Vec<(&str, Ex)> = table
                    .into_iter()
                    .filter(|(_, ex)| ok(&Val { id: 0, ty, ex: *ex }))
                    .collect();
                let (text, ex) = self.c.pick(&fits);
                let t = self.tile(Ty::F32);
                let id = self.fresh();
                self.emit(format!("%{id} = constant {text} : {t}"));
                let v = Val { id, ty, ex };
                self.vals.push(v);
                v
            }
            Ty::I32 => {
                let k = self.c.pick(&[0i64, 1, -3, 7, 100]);
                let bits = 64 - k.unsigned_abs().leading_zeros();
                self.def(format!("constant {k}"), ty, Ex::exact(0, bits))
            }
            Ty::Bool => {
                let b = self.c.pick(&["true", "false"]);
                self.def(format!("constant {b}"), ty, Ex::exact(0, 1))
            }
        }
    }

    fn float_unary(&mut self) {
        let x = self.pick(Ty::F32, |_| true);
        let m = x.ex.mag();
        let ops: Vec<(&str, bool)> = vec![
            ("neg", true),
            ("abs", true),
            ("floor", x.ex.is_exact()),
            ("ceil", x.ex.is_exact()),
            ("exp", m <= 60.0),
            ("exp2", m <= 60.0),
            ("log", true),
            ("log1p", true),
            ("sqrt", true),
            ("rsqrt", x.ex.is_exact()),
            ("tanh", true),
            ("sin", m <= 64.0),
            ("cos", m <= 64.0),
            ("erf", true),
            ("logistic", true),
        ];
        let ops: Vec<&str> = ops.into_iter().filter(|o| o.1).map(|o| o.0).collect();
        let op = self.c.pick(&ops);
        let ex = match (op, x.ex) {
            ("neg" | "abs" | "floor" | "ceil", e) => e,
            ("exp" | "exp2", _) => Ex::Rounded { mag: m.exp() * 2.0 },
            ("log" | "log1p", _) => Ex::Rounded { mag: 100.0 },
            ("sqrt", _) => Ex::Rounded {
                mag: m.sqrt() * 2.0,
            },
            // rsqrt of an exact value: at most 2^(frac/2).
            ("rsqrt", Ex::Exact { frac, .. }) => Ex::Rounded {
                mag: 2f64.powi(frac as i32),
            },
            _ => Ex::Rounded { mag: 1.0 },
        };
        self.def(format!("{op} %{}", x.id), Ty::F32, ex);
    }

    fn float_binary(&mut self) {
        let a = self.pick(Ty::F32, |_| true);
        let op = self
            .c
            .pick(&["add", "sub", "mul", "max", "min", "div", "rem", "pow"]);
        let exact = |v: &Val| v.ex.is_exact();
        let (b, ex) = match op {
            "div" => {
                let b = self.pick(Ty::F32, exact);
                let Ex::Exact { frac, .. } = b.ex else {
                    unreachable!()
                };
                let mag = a.ex.mag() * 2f64.powi(frac as i32);
                (b, Ex::Rounded { mag })
            }
            "rem" | "pow" if !a.ex.is_exact() => return self.float_unary(),
            "rem" => {
                let b = self.pick(Ty::F32, exact);
                let (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, .. }) = (a.ex, b.ex)
                else {
                    unreachable!()
                };
                (b, Ex::exact(fa.max(fb), ia))
            }
            "pow" => {
                if a.ex.mag() > 16.0 {
                    return self.float_unary();
                }
                let (text, e) = self.c.pick(&[("2.0", 2.0), ("0.5", 0.5), ("-1.0", -1.0)]);
                let t = self.tile(Ty::F32);
                let id = self.fresh();
                self.emit(format!("%{id} = constant {text} : {t}"));
                let b = Val {
                    id,
                    ty: Ty::F32,
                    ex: Ex::exact(1, 1),
                };
                let mag = if e < 0.0 {
                    1e30
                } else {
                    a.ex.mag().powf(e) * 2.0
                };
                (b, Ex::Rounded { mag })
            }
            _ => {
                let b = self.pick(Ty::F32, |_| true);
                let ex = match (a.ex, b.ex, op) {
                    (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }, "mul") => {
                        Ex::exact(fa + fb, ia + ib)
                    }
                    (
                        Ex::Exact { frac: fa, int: ia },
                        Ex::Exact { frac: fb, int: ib },
                        "max" | "min",
                    ) => Ex::exact(fa.max(fb), ia.max(ib)),
                    (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }, _) => {
                        Ex::exact(fa.max(fb), ia.max(ib) + 1)
                    }
                    (x, y, "mul") => Ex::Rounded {
                        mag: x.mag() * y.mag(),
                    },
                    (x, y, _) => Ex::Rounded {
                        mag: x.mag() + y.mag(),
                    },
                };
                (b, ex)
            }
        };
        self.def(format!("{op} %{}, %{}", a.id, b.id), Ty::F32, ex);
    }

    /// `cmp` of two exact values, then a select or a logical op.
    fn compare(&mut self) {
        let exact = |v: &Val| v.ex.is_exact();
        let ty = if self.c.chance(70) { Ty::F32 } else { Ty::I32 };
        let a = self.pick(ty, exact);
        let b = self.pick(ty, exact);
        let op = self.c.pick(&["eq", "ne", "lt", "le", "gt", "ge"]);
        let id = self.fresh();
        let t = self.tile(ty);
        self.emit(format!("%{id} = cmp {op} %{}, %{} : {t}", a.id, b.id));
        let cond = Val {
            id,
            ty: Ty::Bool,
            ex: Ex::exact(0, 1),
        };
        self.vals.push(cond);
        if self.c.chance(30) {
            let other = self.pick(Ty::Bool, |_| true);
            let op = self.c.pick(&["and", "or", "xor"]);
            self.def(
                format!("{op} %{}, %{}", cond.id, other.id),
                Ty::Bool,
                Ex::exact(0, 1),
            );
        }
        let cond = self.pick(Ty::Bool, |_| true);
        let x = self.pick(Ty::F32, |_| true);
        let y = self.pick(Ty::F32, |_| true);
        let ex = match (x.ex, y.ex) {
            (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }) => {
                Ex::exact(fa.max(fb), ia.max(ib))
            }
            (p, q) => Ex::Rounded {
                mag: p.mag().max(q.mag()),
            },
        };
        self.def(
            format!("select %{}, %{}, %{}", cond.id, x.id, y.id),
            Ty::F32,
            ex,
        );
    }

    /// To i32 and back, through integer math (wrapping, never by zero).
    fn integer(&mut self) {
        let x = self.pick(
            Ty::F32,
            |v| matches!(v.ex, Ex::Exact { int, .. } if int <= 20),
        );
        let (tf, ti) = (self.tile(Ty::F32), self.tile(Ty::I32));
        let id = self.fresh();
        self.emit(format!("%{id} = convert %{} : {tf} -> {ti}", x.id));
        let Ex::Exact { int, .. } = x.ex else {
            // A constant (NaN, ±∞ convert to 0 on every path).
            unreachable!("pick gives an exact value")
        };
        let mut i = Val {
            id,
            ty: Ty::I32,
            ex: Ex::exact(0, int),
        };
        self.vals.push(i);
        for _ in 0..1 + self.c.below(2) {
            let op = self.c.pick(&[
                "add", "sub", "mul", "max", "min", "and", "or", "xor", "div", "rem",
            ]);
            let rhs = if matches!(op, "div" | "rem") {
                let k = self.c.pick(&[3i64, -2, 5]);
                self.def(format!("constant {k}"), Ty::I32, Ex::exact(0, 3))
            } else {
                self.pick(Ty::I32, |_| true)
            };
            let Ex::Exact { int: a, .. } = i.ex else {
                unreachable!()
            };
            let Ex::Exact { int: b, .. } = rhs.ex else {
                unreachable!()
            };
            let int = match op {
                "add" | "sub" => a.max(b) + 1,
                "mul" => a + b,
                _ => a.max(b),
            };
            // Past 2^24 the value is still exact as an i32 (wrapping is
            // one rule everywhere), only not as an f32 after conversion.
            i = self.def(
                format!("{op} %{}, %{}", i.id, rhs.id),
                Ty::I32,
                Ex::Exact {
                    frac: 0,
                    int: int.min(31),
                },
            );
        }
        let Ex::Exact { int, .. } = i.ex else {
            unreachable!()
        };
        let ex = if int <= Ex::SIGNIFICAND {
            Ex::exact(0, int)
        } else {
            Ex::Rounded { mag: 2f64.powi(31) }
        };
        self.def_to(format!("convert %{} : {ti} ->", i.id), Ty::F32, ex);
    }

    /// A reduction along rows or lanes, broadcast back to a tile.
    fn reduce(&mut self) {
        let x = self.pick(Ty::F32, |_| true);
        let op = self.c.pick(&["sum", "max", "min"]);
        let axis = usize::from(self.c.chance(70));
        let (n, kept) = if axis == 1 {
            (self.lanes, self.rows)
        } else {
            (self.rows, self.lanes)
        };
        let grow = usize::BITS - n.leading_zeros();
        let ex = match (x.ex, op) {
            (Ex::Exact { frac, int }, "sum") => Ex::exact(frac, int + grow),
            (e, "sum") => Ex::Rounded {
                mag: e.mag() * n as f64,
            },
            (e, _) => e,
        };
        let tf = self.tile(Ty::F32);
        let r = self.fresh();
        self.emit(format!(
            "%{r} = reduce {op} %{}, axes [{axis}] : {tf} -> f32[{kept}]",
            x.id
        ));
        let col = self.fresh();
        let shape = if axis == 1 {
            format!("{kept}, 1")
        } else {
            format!("1, {kept}")
        };
        self.emit(format!(
            "%{col} = reshape %{r} : f32[{kept}] -> f32[{shape}]"
        ));
        self.def_to(
            format!("broadcast_in_dim %{col}, dims [0, 1] : f32[{shape}] ->"),
            Ty::F32,
            ex,
        );
    }

    /// `iota` along a dim, as an i32 and as an exact f32.
    fn iota(&mut self) {
        let dim = self.c.below(2);
        let ti = self.tile(Ty::I32);
        let i = self.fresh();
        self.emit(format!("%{i} = iota dim {dim} : {ti}"));
        self.vals.push(Val {
            id: i,
            ty: Ty::I32,
            ex: Ex::exact(0, 8),
        });
        self.def_to(format!("convert %{i} : {ti} ->"), Ty::F32, Ex::exact(0, 8));
    }

    /// `s = a·bᵀ` over lanes, then `s·c` over rows: a tile again.
    fn dots(&mut self) {
        let a = self.pick(Ty::F32, |v| v.ex.mag() <= 1e6);
        let b = self.pick(Ty::F32, |v| v.ex.mag() <= 1e6);
        let c = self.pick(Ty::F32, |v| v.ex.mag() <= 1e6);
        let (r, l) = (self.rows, self.lanes);
        let lb = usize::BITS - l.leading_zeros();
        let rb = usize::BITS - r.leading_zeros();
        let s_ex = match (a.ex, b.ex) {
            (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }) => {
                Ex::exact(fa + fb, ia + ib + lb)
            }
            (p, q) => Ex::Rounded {
                mag: p.mag() * q.mag() * l as f64,
            },
        };
        let tf = self.tile(Ty::F32);
        let s = self.fresh();
        self.emit(format!(
            "%{s} = dot_general %{}, %{}, batch []x[], contract [1]x[1] : {tf}, {tf} -> f32[{r}, {r}]",
            a.id, b.id
        ));
        let ex = match (s_ex, c.ex) {
            (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }) => {
                Ex::exact(fa + fb, ia + ib + rb)
            }
            (p, q) => Ex::Rounded {
                mag: p.mag() * q.mag() * r as f64,
            },
        };
        let id = self.fresh();
        self.emit(format!(
            "%{id} = dot_general %{s}, %{}, batch []x[], contract [1]x[0] : f32[{r}, {r}], {tf} -> {tf}",
            c.id
        ));
        self.vals.push(Val {
            id,
            ty: Ty::F32,
            ex,
        });
    }

    /// A loop carrying one tile: `acc = acc <op> x` a few times.
    fn for_loop(&mut self, depth: usize) {
        let init = self.pick(Ty::F32, |_| true);
        let (lo, hi, step) = (self.c.below(2), self.c.below(5), 1 + self.c.below(3));
        let tf = self.tile(Ty::F32);
        let (iv, arg) = (self.fresh(), self.fresh());
        let unroll = if self.c.chance(20) { " unroll" } else { "" };
        let at = self.lines.len();
        self.lines.push(String::new());
        let outer = self.indent;
        self.indent += 1;
        let mark = self.vals.len();
        // The carried value is rounded after a few trips unless exact
        // stays exact: bound it loosely.
        let carried = match init.ex {
            Ex::Exact { frac, int } => Ex::exact(frac + 2, int + 6),
            e => Ex::Rounded {
                mag: e.mag() * 64.0,
            },
        };
        self.vals.push(Val {
            id: arg,
            ty: Ty::F32,
            ex: carried,
        });
        let n = 1 + self.c.below(3);
        self.block(depth + 1, n);
        let x = self.pick(Ty::F32, |v| v.ex.mag() <= 1e6);
        let op = self.c.pick(&["add", "max", "min"]);
        let y = self.fresh();
        self.emit(format!("%{y} = {op} %{arg}, %{} : {tf}", x.id));
        self.emit(format!("yield %{y}"));
        self.vals.truncate(mark);
        self.indent = outer;
        let res = self.fresh();
        self.lines[at] = format!(
            "{}%{res} = for %{iv} = {lo} to {hi} step {step}{unroll} iter(%{arg} = %{}) {{",
            "  ".repeat(outer + 1),
            init.id
        );
        self.emit("}".into());
        let ex = match (carried, x.ex) {
            (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }) => {
                Ex::exact(fa.max(fb), ia.max(ib) + 3)
            }
            (p, q) => Ex::Rounded {
                mag: (p.mag() + q.mag()) * 8.0,
            },
        };
        self.vals.push(Val {
            id: res,
            ty: Ty::F32,
            ex,
        });
    }

    /// A branch on the program id, yielding one tile from each side.
    fn branch(&mut self, depth: usize, grid_dims: usize) {
        let dim = self.c.below(grid_dims);
        let p = self.scalar(format!("program_id {dim}"));
        let k = self.c.below(3);
        let k = self.scalar(format!("constant {k}"));
        let op = self.c.pick(&["eq", "ne", "lt", "ge"]);
        let cond = self.fresh();
        self.emit(format!("%{cond} = cmp {op} %{p}, %{k} : i32"));
        let tf = self.tile(Ty::F32);
        let at = self.lines.len();
        self.lines.push(String::new());
        let outer = self.indent;
        let mut yields = Vec::new();
        for side in 0..2 {
            if side == 1 {
                self.indent = outer;
                self.emit("} else {".into());
            }
            self.indent = outer + 1;
            let mark = self.vals.len();
            let n = self.c.below(3);
            self.block(depth + 1, n);
            let y = self.pick(Ty::F32, |_| true);
            self.emit(format!("yield %{}", y.id));
            yields.push(y.ex);
            self.vals.truncate(mark);
        }
        self.indent = outer;
        self.emit("}".into());
        let res = self.fresh();
        self.lines[at] = format!("{}%{res} = if %{cond} -> ({tf}) {{", "  ".repeat(outer + 1));
        let ex = match (yields[0], yields[1]) {
            (Ex::Exact { frac: fa, int: ia }, Ex::Exact { frac: fb, int: ib }) => {
                Ex::exact(fa.max(fb), ia.max(ib))
            }
            (p, q) => Ex::Rounded {
                mag: p.mag().max(q.mag()),
            },
        };
        self.vals.push(Val {
            id: res,
            ty: Ty::F32,
            ex,
        });
    }

    fn block(&mut self, depth: usize, n: usize) {
        for _ in 0..n {
            if self.ops_left == 0 {
                return;
            }
            self.ops_left -= 1;
            match self.c.below(20) {
                0..=4 => self.float_unary(),
                5..=9 => self.float_binary(),
                10..=11 => self.compare(),
                12 => self.integer(),
                13..=14 => self.reduce(),
                15 => self.iota(),
                16 => self.dots(),
                17 if depth < 2 => self.for_loop(depth),
                18 if depth < 2 => self.branch(depth, self.grid_dims),
                _ => self.float_binary(),
            }
        }
    }
}
