//! The kernel-body transform.
//!
//! Tiles already overload arithmetic and their methods record ops, so most
//! of a kernel body passes through untouched. What Rust cannot overload is
//! rewritten here:
//!
//! * `==`, `!=`, `<`, `<=`, `>`, `>=`, `&&`, `||` call generic functions that
//!   compare Rust values as usual and record ops on tiles;
//! * `if` becomes `dsl::branch`, which runs one branch for a Rust `bool` and
//!   records both for a bool scalar tile; variables from outside that a
//!   branch assigns are passed in and yielded back;
//! * `for i in a..b` becomes a kernel loop (`for_range`), with the outside
//!   variables it assigns carried through it; `#[unroll] for` stays a Rust
//!   loop, unrolled while the kernel is built;
//! * calls of free functions are checked to be `#[kernel_fn]`s;
//! * `scoped(|#[shape(..)] buf: Vmem<T>, sem: DmaSemaphores| { .. })`, the
//!   one closure a body may hold, allocates its parameters for its body
//!   (see `scoped`).
//!
//! Everything else that cannot become kernel IR (`match`, `loop`, `while`,
//! closures, `return`, `break`, ...) is a compile error at its span that
//! says what to write instead.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Block, Expr, Ident, Pat, RangeLimits, Stmt};

/// Free functions kernel bodies may call without `#[kernel_fn]`.
const BUILTINS: &[&str] = &[
    "dot",
    "dot_general",
    "select",
    "program_id",
    "num_programs",
    "iota",
    "constant",
    "ds",
    "make_async_copy",
    "make_async_remote_copy",
    "device_id",
    "axis_index",
    "top_k",
    "sort_by_key",
    "concat",
];

/// Path roots whose functions are ordinary Rust, run while building.
const RUST_ROOTS: &[&str] = &[
    "std",
    "core",
    "alloc",
    "usize",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "i8",
    "i16",
    "i32",
    "i64",
    "f32",
    "f64",
    "bool",
    "kernel_ir",
];

/// Rewrites a kernel body (or a `#[kernel_fn]` body) in place.
pub struct BodyTransform {
    pub errors: Vec<syn::Error>,
}

impl BodyTransform {
    pub fn new() -> Self {
        BodyTransform { errors: Vec::new() }
    }

    /// Records an error and returns a placeholder (a block, so it is valid
    /// in statement position too) of type `Tile`, the type most rejected
    /// constructs would have had, so the error is reported once.
    fn reject(&mut self, span: Span, msg: &str) -> Expr {
        self.errors.push(syn::Error::new(span, msg));
        syn::parse_quote_spanned!(span=> { ::kernel_ir::dsl::unsupported() })
    }

    /// Like [`BodyTransform::reject`] for statements: the placeholder is `()`.
    fn reject_unit(&mut self, span: Span, msg: &str) -> Expr {
        self.errors.push(syn::Error::new(span, msg));
        syn::parse_quote_spanned!(span=> {})
    }

    /// Like [`BodyTransform::reject`] with a placeholder of an inferred type.
    fn reject_any(&mut self, span: Span, msg: &str) -> Expr {
        self.errors.push(syn::Error::new(span, msg));
        syn::parse_quote_spanned!(span=> { ::kernel_ir::dsl::unsupported_any() })
    }
}

/// Names assigned in `block` that it does not declare itself, in order of
/// first assignment.
pub fn assigned_outer(block: &Block) -> Vec<Ident> {
    let mut a = Assigned {
        scopes: vec![HashSet::new()],
        found: Vec::new(),
    };
    a.block(block);
    a.found
}

struct Assigned {
    scopes: Vec<HashSet<String>>,
    found: Vec<Ident>,
}

impl Assigned {
    fn declared(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.contains(name))
    }

    fn declare_pat(&mut self, p: &Pat) {
        let mut names = Vec::new();
        pat_idents(p, &mut names);
        if let Some(s) = self.scopes.last_mut() {
            s.extend(names.into_iter().map(|i| i.to_string()));
        }
    }

    fn target(&mut self, e: &Expr) {
        match e {
            Expr::Path(p) => {
                if let Some(id) = p.path.get_ident() {
                    let s = id.to_string();
                    if !self.declared(&s) && !self.found.iter().any(|f| *f == s) {
                        self.found.push(id.clone());
                    }
                }
            }
            Expr::Tuple(t) => t.elems.iter().for_each(|e| self.target(e)),
            Expr::Paren(p) => self.target(&p.expr),
            _ => {}
        }
    }

    fn block(&mut self, b: &Block) {
        self.scopes.push(HashSet::new());
        for s in &b.stmts {
            match s {
                Stmt::Local(l) => {
                    if let Some(init) = &l.init {
                        self.expr(&init.expr);
                    }
                    self.declare_pat(&l.pat);
                }
                Stmt::Expr(e, _) => self.expr(e),
                _ => {}
            }
        }
        self.scopes.pop();
    }

    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Assign(a) => {
                self.target(&a.left);
                self.expr(&a.right);
            }
            Expr::Binary(b)
                if matches!(
                    b.op,
                    BinOp::AddAssign(_)
                        | BinOp::SubAssign(_)
                        | BinOp::MulAssign(_)
                        | BinOp::DivAssign(_)
                        | BinOp::RemAssign(_)
                        | BinOp::BitAndAssign(_)
                        | BinOp::BitOrAssign(_)
                        | BinOp::BitXorAssign(_)
                ) =>
            {
                self.target(&b.left);
                self.expr(&b.right);
            }
            Expr::Block(b) => self.block(&b.block),
            Expr::If(i) => {
                self.expr(&i.cond);
                self.block(&i.then_branch);
                if let Some((_, e)) = &i.else_branch {
                    self.expr(e);
                }
            }
            Expr::ForLoop(f) => {
                self.expr(&f.expr);
                self.scopes.push(HashSet::new());
                self.declare_pat(&f.pat);
                self.block(&f.body);
                self.scopes.pop();
            }
            _ => {
                // Assignments only matter as statements or in blocks; other
                // expressions are searched for nested blocks.
                struct Inner<'a>(&'a mut Assigned);
                impl<'ast> syn::visit::Visit<'ast> for Inner<'_> {
                    fn visit_expr(&mut self, e: &'ast Expr) {
                        match e {
                            Expr::Assign(_)
                            | Expr::Block(_)
                            | Expr::If(_)
                            | Expr::ForLoop(_)
                            | Expr::Binary(_) => self.0.expr(e),
                            _ => syn::visit::visit_expr(self, e),
                        }
                    }
                }
                syn::visit::visit_expr(&mut Inner(self), e);
            }
        }
    }
}

fn pat_idents(p: &Pat, out: &mut Vec<Ident>) {
    match p {
        Pat::Ident(i) => out.push(i.ident.clone()),
        Pat::Tuple(t) => t.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::Type(t) => pat_idents(&t.pat, out),
        Pat::Reference(r) => pat_idents(&r.pat, out),
        Pat::Slice(s) => s.elems.iter().for_each(|p| pat_idents(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| pat_idents(&f.pat, out)),
        _ => {}
    }
}

/// `(a, b,)` as an expression and as a `let` pattern with `mut`.
fn carried(names: &[Ident]) -> (TokenStream, TokenStream) {
    (quote!((#(#names,)*)), quote!((#(mut #names,)*)))
}

impl VisitMut for BodyTransform {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        let span = e.span();
        match e {
            Expr::If(_) => {
                let Expr::If(i) = std::mem::replace(e, Expr::Verbatim(TokenStream::new())) else {
                    unreachable!("matched above")
                };
                *e = self.rewrite_if(i);
            }
            Expr::ForLoop(_) => {
                let Expr::ForLoop(f) = std::mem::replace(e, Expr::Verbatim(TokenStream::new())) else {
                    unreachable!("matched above")
                };
                *e = self.rewrite_for(f);
            }
            Expr::Binary(b) => {
                visit_mut::visit_expr_binary_mut(self, b);
                let (l, r) = (&b.left, &b.right);
                let op_span = b.op.span();
                let call = |f: &str| {
                    let f = Ident::new(f, op_span);
                    let tr = Ident::new(&trait_of(&f.to_string()), op_span);
                    quote_spanned!(op_span=> ::kernel_ir::dsl::#tr::#f(#l, #r))
                };
                let new = match b.op {
                    BinOp::Eq(_) => call("dsl_eq"),
                    BinOp::Ne(_) => call("dsl_ne"),
                    BinOp::Lt(_) => call("dsl_lt"),
                    BinOp::Le(_) => call("dsl_le"),
                    BinOp::Gt(_) => call("dsl_gt"),
                    BinOp::Ge(_) => call("dsl_ge"),
                    BinOp::And(_) => quote_spanned!(op_span=> ::kernel_ir::dsl::DslLogic::dsl_and(#l, || #r)),
                    BinOp::Or(_) => quote_spanned!(op_span=> ::kernel_ir::dsl::DslLogic::dsl_or(#l, || #r)),
                    _ => return,
                };
                *e = Expr::Verbatim(new);
            }
            Expr::Call(c) if crate::scoped::is_scoped_call(c) => {
                let Some(Expr::Closure(cl)) = c.args.first_mut() else {
                    return;
                };
                let scope = Ident::new("__tessera_scope", Span::call_site());
                let allocs = match crate::scoped::allocations(cl, &scope) {
                    Ok(a) => a,
                    Err(err) => {
                        // The whole block goes, so rustc adds no errors
                        // about the closure it was.
                        self.errors.push(err);
                        *e = syn::parse_quote_spanned!(span=> {});
                        return;
                    }
                };
                self.visit_expr_mut(&mut cl.body);
                let body = &cl.body;
                let fspan = c.func.span();
                *e = Expr::Verbatim(quote_spanned!(fspan=>
                    ::kernel_ir::scoped(|#scope: &mut ::kernel_ir::Scope| {
                        #(#allocs)*
                        let _: () = #body;
                    })
                ));
            }
            Expr::Call(c) => {
                visit_mut::visit_expr_call_mut(self, c);
                if let Expr::Path(p) = &*c.func
                    && needs_kernel_fn(&p.path)
                {
                    let f = &c.func;
                    let args = &c.args;
                    let fspan = f.span();
                    *e = Expr::Verbatim(quote_spanned!(fspan=> (::kernel_ir::dsl::kernel_fn(&#f))(#args)));
                }
            }
            Expr::Match(_) => {
                *e = self.reject(
                    span,
                    "`match` is not supported in a kernel body; use `if`/`else if` (on build-time values or scalar tiles) or `select` for an elementwise choice",
                )
            }
            Expr::Loop(_) => {
                *e = self.reject_unit(
                    span,
                    "`loop` is not supported in a kernel body: kernel loops have bounds; write `for i in a..b { .. }` and assign the values it carries",
                )
            }
            Expr::While(_) => {
                *e = self.reject_unit(
                    span,
                    "`while` is not supported in a kernel body: write `for i in a..b { .. }` with a (possibly dynamic) bound, and use `if` inside for early exits",
                )
            }
            Expr::Closure(_) => {
                // Left in place: the error is the macro's, and calls of the
                // closure report it as not a kernel function.
                self.errors.push(syn::Error::new(
                    span,
                    "closures are not supported in a kernel body (tiles they capture would escape the kernel's control flow); move the code into a `#[kernel_fn]` helper",
                ));
            }
            Expr::Return(_) => {
                *e = self.reject_unit(
                    span,
                    "`return` is not supported in a kernel body; a kernel ends at the end of its body, use `if` to skip work",
                )
            }
            Expr::Break(_) | Expr::Continue(_) => {
                *e = self.reject_unit(
                    span,
                    "`break`/`continue` are not supported in a kernel body; kernel loops run all their iterations, use `if` to skip work in some",
                )
            }
            Expr::Async(_) | Expr::Await(_) => {
                *e = self.reject(span, "`async`/`.await` have no meaning in a kernel body")
            }
            Expr::Unsafe(_) => {
                *e = self.reject(span, "`unsafe` blocks are not allowed in a kernel body")
            }
            Expr::TryBlock(_) | Expr::Try(_) => {
                *e = self.reject_any(
                    span,
                    "`?` is not supported in a kernel body; errors are reported when the kernel is built",
                )
            }
            Expr::Let(_) => {
                *e = self.reject_unit(
                    span,
                    "`let` chains are not supported in a kernel body: `if let` takes one build-time pattern; nest an `if` inside it for the other conditions",
                )
            }
            _ => visit_mut::visit_expr_mut(self, e),
        }
    }

    fn visit_stmt_mut(&mut self, s: &mut Stmt) {
        match s {
            Stmt::Item(item) => {
                let span = item.span();
                self.errors.push(syn::Error::new(
                    span,
                    "items (fn, struct, use, ...) cannot be declared inside a kernel body; declare them outside",
                ));
                *s = Stmt::Expr(Expr::Verbatim(TokenStream::new()), None);
            }
            Stmt::Local(l) if l.init.as_ref().is_some_and(|i| i.diverge.is_some()) => {
                let span = l.span();
                self.errors.push(syn::Error::new(
                    span,
                    "`let ... else` is not supported in a kernel body",
                ));
            }
            _ => visit_mut::visit_stmt_mut(self, s),
        }
    }
}

fn trait_of(f: &str) -> String {
    match f {
        "dsl_eq" => "DslEq",
        "dsl_ne" => "DslNe",
        "dsl_lt" => "DslLt",
        "dsl_le" => "DslLe",
        "dsl_gt" => "DslGt",
        _ => "DslGe",
    }
    .to_string()
}

/// Where a `let` stands in an `&&`/`||` chain of conditions, if one does.
fn let_in_chain(e: &Expr) -> Option<Span> {
    match e {
        Expr::Let(l) => Some(l.let_token.span),
        Expr::Binary(b) if matches!(b.op, BinOp::And(_) | BinOp::Or(_)) => {
            let_in_chain(&b.left).or_else(|| let_in_chain(&b.right))
        }
        Expr::Paren(p) => let_in_chain(&p.expr),
        _ => None,
    }
}

/// True when a call of `path` must be a `#[kernel_fn]`.
fn needs_kernel_fn(path: &syn::Path) -> bool {
    let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let first = segs.first().map(String::as_str).unwrap_or("");
    let upper = |s: &String| s.chars().next().is_some_and(|c| c.is_ascii_uppercase());
    !(path.leading_colon.is_some()
        || (segs.len() == 1 && BUILTINS.contains(&first))
        || RUST_ROOTS.contains(&first)
        || segs.iter().any(upper))
}

impl BodyTransform {
    fn rewrite_if(&mut self, mut i: syn::ExprIf) -> Expr {
        let if_span = i.if_token.span;
        if matches!(&*i.cond, Expr::Let(_)) {
            return self.rewrite_if_let(i);
        }
        if let Some(span) = let_in_chain(&i.cond) {
            return self.reject_unit(
                span,
                "`let` chains are not supported in a kernel body: `if let` takes one build-time pattern; nest an `if` inside it for the other conditions",
            );
        }
        // Which outside variables the branches assign (analysed before the
        // branches are rewritten).
        let mut names = assigned_outer(&i.then_branch);
        if let Some((_, e)) = &i.else_branch {
            let wrapped: Block = syn::parse_quote!({ #e });
            for n in assigned_outer(&wrapped) {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        self.visit_expr_mut(&mut i.cond);
        self.visit_block_mut(&mut i.then_branch);
        let else_body: TokenStream = match i.else_branch.take() {
            Some((_, mut e)) => {
                self.visit_expr_mut(&mut e);
                quote!(#e)
            }
            None => quote!({}),
        };
        let cond = &i.cond;
        let then = &i.then_branch;
        let (tuple, pat) = carried(&names);
        Expr::Verbatim(quote_spanned! {if_span=>
            {
                #[allow(clippy::let_unit_value)]
                let (__tessera_value, __tessera_carried) = ::kernel_ir::dsl::branch(
                    #cond,
                    || {
                        #[allow(unused_mut)]
                        let #pat = #tuple;
                        #[allow(clippy::let_unit_value)]
                        let __tessera_value = #then;
                        (__tessera_value, #tuple)
                    },
                    || {
                        #[allow(unused_mut)]
                        let #pat = #tuple;
                        #[allow(clippy::let_unit_value)]
                        let __tessera_value = #else_body;
                        (__tessera_value, #tuple)
                    },
                );
                #[allow(unused_assignments)]
                { #tuple = __tessera_carried; }
                __tessera_value
            }
        })
    }

    /// `if let` matches a build-time value (an `Option` of the config, an
    /// optional operand): no tile has a pattern, so it stays a Rust `if
    /// let` and only the branches are rewritten. Assignments in them need
    /// no carrying: one branch runs while the kernel is built.
    fn rewrite_if_let(&mut self, mut i: syn::ExprIf) -> Expr {
        if let Expr::Let(l) = &mut *i.cond {
            self.visit_expr_mut(&mut l.expr);
        }
        self.visit_block_mut(&mut i.then_branch);
        if let Some((_, e)) = &mut i.else_branch {
            self.visit_expr_mut(e);
        }
        Expr::If(i)
    }

    fn rewrite_for(&mut self, mut f: syn::ExprForLoop) -> Expr {
        let for_span = f.for_token.span;
        let unroll = f.attrs.iter().position(|a| a.path().is_ident("unroll"));
        if let Some(pos) = unroll {
            f.attrs.remove(pos);
            visit_mut::visit_expr_for_loop_mut(self, &mut f);
            return Expr::ForLoop(f);
        }
        if !matches!(&*f.pat, Pat::Ident(_) | Pat::Wild(_)) {
            return self.reject(
                f.pat.span(),
                "the loop variable of a kernel `for` is a name or `_`",
            );
        }
        let names = assigned_outer(&f.body);
        let mut range = match *f.expr {
            Expr::Range(r) => r,
            other => {
                return self.reject(
                    other.span(),
                    "a kernel `for` iterates over a range `a..b` (bounds may be numbers or i32 scalar tiles); use `#[unroll] for` for a loop unrolled while building",
                );
            }
        };
        if matches!(range.limits, RangeLimits::Closed(_)) {
            return self.reject(
                range.span(),
                "write the kernel loop range as `a..b` (half-open), not `a..=b`",
            );
        }
        let (Some(mut lo), Some(mut hi)) = (range.start.take(), range.end.take()) else {
            return self.reject(
                range.span(),
                "a kernel loop range needs both bounds: `a..b`",
            );
        };
        self.visit_expr_mut(&mut lo);
        self.visit_expr_mut(&mut hi);
        self.visit_block_mut(&mut f.body);
        let pat = &f.pat;
        let body = &f.body;
        let (tuple, mut_pat) = carried(&names);
        Expr::Verbatim(quote_spanned! {for_span=>
            {
                let __tessera_carried = ::kernel_ir::for_range(#lo, #hi, #tuple, |#pat, __tessera_carried| {
                    #[allow(unused_mut)]
                    let #mut_pat = __tessera_carried;
                    #body;
                    #tuple
                });
                #[allow(unused_assignments)]
                { #tuple = __tessera_carried; }
            }
        })
    }
}
