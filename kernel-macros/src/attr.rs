//! The arguments of `#[tpu_kernel(...)]`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Ident, Token};

/// Parsed `#[tpu_kernel(grid = (..), semantics = (..), target = .., vmem_limit = .., mesh = (..), name = .., check = ..)]`.
pub struct KernelAttr {
    /// One bound per grid dim (Rust `usize` expressions).
    pub grid: Vec<Expr>,
    /// Where `grid` was written.
    pub grid_span: Span,
    /// `parallel` or `arbitrary`, one per grid dim.
    pub semantics: Vec<Ident>,
    /// Where `semantics` was written, if it was.
    pub semantics_span: Option<Span>,
    /// `v5e`, `v5p`, `v6e` or `v7x`.
    pub target: Option<Ident>,
    /// Scoped VMEM limit in bytes.
    pub vmem_limit: Option<Expr>,
    /// The kernel's name (a `&str` expression over the config), when one
    /// function builds kernels that are told apart by name.
    pub name: Option<Expr>,
    /// `mesh = (x = 4, y = 2)`: the devices it runs on together, by axis.
    pub mesh: Vec<(Ident, Expr)>,
    /// `check = expr`: a `Result<(), KernelErrors>` over the config and
    /// shape symbols, run before the kernel is built (rules its verifier
    /// cannot see, such as a config table's consistency).
    pub check: Option<Expr>,
}

/// A tuple `(a, b, c)`, a unit `()`, or a single expression.
fn tuple_items(e: Expr) -> Vec<Expr> {
    match e {
        Expr::Tuple(t) => t.elems.into_iter().collect(),
        Expr::Paren(p) => vec![*p.expr],
        e => vec![e],
    }
}

impl Parse for KernelAttr {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut attr = KernelAttr {
            grid: Vec::new(),
            grid_span: Span::call_site(),
            semantics: Vec::new(),
            semantics_span: None,
            target: None,
            vmem_limit: None,
            name: None,
            mesh: Vec::new(),
            check: None,
        };
        let items = Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated(input)?;
        for item in items {
            let Some(key) = item.path.get_ident() else {
                return Err(syn::Error::new_spanned(
                    &item.path,
                    "expected `grid`, `semantics`, `target`, `vmem_limit`, `mesh`, `name` or `check`",
                ));
            };
            match key.to_string().as_str() {
                "grid" => {
                    attr.grid_span = key.span();
                    attr.grid = tuple_items(item.value);
                }
                "semantics" => {
                    attr.semantics_span = Some(key.span());
                    for e in tuple_items(item.value) {
                        match &e {
                            Expr::Path(p)
                                if p.path.get_ident().is_some_and(|i| {
                                    i == "parallel" || i == "arbitrary" || i == "core_parallel"
                                }) =>
                            {
                                attr.semantics
                                    .push(p.path.get_ident().cloned().expect("checked above"));
                            }
                            _ => {
                                return Err(syn::Error::new_spanned(
                                    e,
                                    "dimension semantics are `parallel` (independent steps), `core_parallel` (independent, split across the chip's TensorCores) or `arbitrary` (sequential, may carry state)",
                                ));
                            }
                        }
                    }
                }
                "target" => match &item.value {
                    Expr::Path(p)
                        if p.path.get_ident().is_some_and(|i| {
                            ["v5e", "v5p", "v6e", "v7x"].contains(&i.to_string().as_str())
                        }) =>
                    {
                        attr.target = p.path.get_ident().cloned();
                    }
                    v => {
                        return Err(syn::Error::new_spanned(
                            v,
                            "unknown TPU target; expected one of v5e, v5p, v6e, v7x",
                        ));
                    }
                },
                "vmem_limit" => attr.vmem_limit = Some(item.value),
                "name" => attr.name = Some(item.value),
                "check" => attr.check = Some(item.value),
                "mesh" => {
                    for e in tuple_items(item.value) {
                        match e {
                            Expr::Assign(a) if matches!(&*a.left, Expr::Path(p) if p.path.get_ident().is_some()) =>
                            {
                                let Expr::Path(p) = *a.left else {
                                    unreachable!()
                                };
                                let axis = p.path.get_ident().cloned().expect("checked above");
                                attr.mesh.push((axis, *a.right));
                            }
                            e => {
                                return Err(syn::Error::new_spanned(
                                    e,
                                    "a mesh names its axes with their sizes: `mesh = (x = 4)` or `mesh = (x = 2, y = 2)`",
                                ));
                            }
                        }
                    }
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        key,
                        format!(
                            "unknown `#[tpu_kernel]` argument `{key}`; expected `grid`, `semantics`, `target`, `vmem_limit`, `mesh`, `name` or `check`"
                        ),
                    ));
                }
            }
        }
        if let Some(span) = attr.semantics_span {
            if attr.semantics.len() != attr.grid.len() {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "the grid has {} dims but {} semantics are given; give one `parallel` or `arbitrary` per grid dim",
                        attr.grid.len(),
                        attr.semantics.len()
                    ),
                ));
            }
        } else {
            attr.semantics = attr
                .grid
                .iter()
                .map(|_| Ident::new("arbitrary", Span::call_site()))
                .collect();
        }
        Ok(attr)
    }
}
