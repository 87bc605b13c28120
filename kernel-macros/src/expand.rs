//! Code generation for `#[tpu_kernel]`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, Ident, ItemFn, Pat};

use crate::attr::KernelAttr;
use crate::body::BodyTransform;
use crate::checks;
use crate::sig::{self, ArrayParam, BlockAttr, LayoutAttr, Param, Role, Space};

const MIB: u64 = 1 << 20;

/// Expands `#[tpu_kernel(attr)] item`.
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            // Not even a function: give the error and the input back.
            let e = e.to_compile_error();
            return quote!(#e #item);
        }
    };
    // A group parameter: the group's macro splices its operands in and
    // hands the kernel back to this macro.
    match crate::operands::find_group(&func) {
        Ok(Some(g)) => return crate::operands::defer_to_group(&g, attr, item),
        Ok(None) => {}
        Err(e) => return e.to_compile_error(),
    }
    let mut errors = Vec::new();
    let attr = match syn::parse2::<KernelAttr>(attr) {
        Ok(a) => Some(a),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let type_params: Vec<Ident> = func
        .sig
        .generics
        .type_params()
        .map(|t| t.ident.clone())
        .collect();
    let mut params = Vec::new();
    for arg in &func.sig.inputs {
        match sig::parse_param(arg, &type_params) {
            Ok(p) => params.push(p),
            Err(e) => errors.push(e),
        }
    }
    let signature_ok = errors.is_empty();
    if let Some(a) = &func.sig.asyncness {
        errors.push(syn::Error::new_spanned(a, "a kernel cannot be `async`"));
    }
    if !matches!(func.sig.output, syn::ReturnType::Default) {
        errors.push(syn::Error::new_spanned(
            &func.sig.output,
            "a kernel returns nothing: it writes its `Out<T>` operands",
        ));
    }

    let config_names: Vec<Ident> = params
        .iter()
        .filter_map(|p| match p {
            Param::Config(pt) => match &*pt.pat {
                Pat::Ident(i) => Some(i.ident.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    for p in &params {
        if let Param::Config(pt) = p
            && !matches!(&*pt.pat, Pat::Ident(_))
        {
            errors.push(syn::Error::new_spanned(
                &pt.pat,
                "name config parameters with a plain identifier",
            ));
        }
    }
    let symbols = shape_symbols(&params, &config_names);

    let mut body = func.block.clone();
    let mut tr = BodyTransform::new();
    tr.visit_block_mut(&mut body);
    errors.extend(tr.errors);

    let checked = attr.as_ref().filter(|_| signature_ok);
    if let Some(attr) = checked {
        check_literals(attr, &params, &func, &mut errors);
    }
    // With errors, the module keeps its API (so call sites resolve) but not
    // the body, which lives in the fallback only: each error once.
    let stub = !errors.is_empty();
    let module =
        checked.map(|attr| module(&func, attr, &params, &config_names, &symbols, &body, stub));

    let errs = errors.iter().map(syn::Error::to_compile_error);
    let fallback = stub.then(|| fallback(&func, &symbols, &body));
    quote! {
        #(#errs)*
        #module
        #fallback
    }
}

/// The compile-time TPU checks over literal shapes (see `checks`).
fn check_literals(
    attr: &KernelAttr,
    params: &[Param],
    func: &ItemFn,
    errors: &mut Vec<syn::Error>,
) {
    let grid_rank = attr.grid.len();
    let arrays: Vec<&ArrayParam> = params
        .iter()
        .filter_map(|p| match p {
            Param::Array(a) => Some(&**a),
            _ => None,
        })
        .collect();
    for a in &arrays {
        checks::check_array(a, grid_rank, errors);
    }
    let scratch: Vec<_> = params
        .iter()
        .filter_map(|p| match p {
            Param::Scratch(s) => Some(s),
            _ => None,
        })
        .collect();
    // Every target's default scoped limit (kernel_ir::Target).
    let default_limit = 32 * MIB;
    checks::check_vmem(
        &arrays,
        &scratch,
        attr.vmem_limit.as_ref().and_then(checks::literal),
        default_limit,
        func.sig.ident.span(),
        errors,
    );
}

/// Shape symbols in first-occurrence order: bare lowercase identifiers in
/// the shapes of scalar prefetch and array operands that are not config
/// parameters.
fn shape_symbols(params: &[Param], config: &[Ident]) -> Vec<Ident> {
    let mut out: Vec<Ident> = Vec::new();
    for p in params {
        let shape = match p {
            Param::Array(a) => &a.shape,
            Param::Prefetch(pf) => &pf.shape,
            _ => continue,
        };
        for e in shape {
            if let Some(id) = sig::symbol(e)
                && !config.contains(id)
                && !out.contains(id)
            {
                out.push(id.clone());
            }
        }
    }
    out
}

/// The user's function, emitted when there are errors so that IDEs keep
/// analysing it: our parameter attributes removed, operands typed as the
/// `Ref` they are inside a kernel, shape symbols bound, and the rewritten
/// body.
fn fallback(func: &ItemFn, symbols: &[Ident], body: &syn::Block) -> TokenStream {
    let mut f = func.clone();
    for arg in &mut f.sig.inputs {
        if let syn::FnArg::Typed(pt) = arg {
            pt.attrs.retain(|a| !sig::is_our_attr(a));
            if sig::is_semaphore_type(&pt.ty) {
                *pt.ty = syn::parse_quote_spanned!(pt.ty.span()=> ::kernel_ir::SemArray);
            } else if sig::is_barrier_type(&pt.ty) {
                *pt.ty = syn::parse_quote_spanned!(pt.ty.span()=> ::kernel_ir::Sem);
            } else if sig::is_operand_type(&pt.ty) {
                *pt.ty = syn::parse_quote_spanned!(pt.ty.span()=> ::kernel_ir::Ref);
            } else if sig::optional_operand(&pt.ty).is_some() {
                *pt.ty = syn::parse_quote_spanned!(pt.ty.span()=> ::core::option::Option<::kernel_ir::Ref>);
            }
        }
    }
    let stmts = &body.stmts;
    f.block = syn::parse_quote!({
        #(let #symbols: usize = 0;)*
        #(#stmts)*
    });
    quote! {
        #[allow(unused, dead_code, clippy::all)]
        #f
    }
}

/// `let name = ctor;`, or for an optional operand
/// `let name = if present { Some(ctor) } else { None };`: an absent operand
/// is not declared at all, so it is no argument of the kernel.
fn declare(name: &Ident, ctor: TokenStream, present: Option<&Expr>) -> TokenStream {
    match present {
        None => quote_spanned!(name.span()=> let #name = #ctor;),
        Some(cond) => quote_spanned!(name.span()=>
            let #name = if #cond { ::core::option::Option::Some(#ctor) } else { ::core::option::Option::None };
        ),
    }
}

fn semantics_tokens(i: &Ident) -> TokenStream {
    let v = if i == "parallel" {
        quote!(Parallel)
    } else if i == "core_parallel" {
        quote!(CoreParallel)
    } else {
        quote!(Arbitrary)
    };
    quote_spanned!(i.span()=> ::kernel_ir::DimSemantics::#v)
}

/// Rewrites an index-map closure into one over `[IndexExpr; N]`.
fn index_map(map: &syn::ExprClosure, prefetch: &[Ident], rank: usize) -> TokenStream {
    let mut names = Vec::new();
    let mut binds = Vec::new();
    let gs: Vec<Ident> = (0..rank)
        .map(|i| format_ident!("__tessera_g{}", i))
        .collect();
    for (i, p) in map.inputs.iter().enumerate() {
        let Some(g) = gs.get(i) else { break };
        match p {
            Pat::Ident(pi) => {
                let n = &pi.ident;
                names.push(n.clone());
                binds.push(quote!(let #n: ::kernel_ir::IndexExpr = #g;));
            }
            _ => binds.push(quote!(let _ = #g;)),
        }
    }
    struct Rewrite<'a> {
        names: &'a [Ident],
        prefetch: &'a [Ident],
    }
    impl VisitMut for Rewrite<'_> {
        fn visit_expr_mut(&mut self, e: &mut Expr) {
            match e {
                Expr::Path(p) if p.path.get_ident().is_some_and(|i| self.names.contains(i)) => {
                    let id = p.path.get_ident().cloned();
                    *e = syn::parse_quote_spanned!(p.span()=> ::core::clone::Clone::clone(&#id));
                }
                Expr::Index(ix) if matches!(&*ix.expr, Expr::Path(p) if p.path.get_ident().is_some_and(|i| self.prefetch.contains(i))) =>
                {
                    self.visit_expr_mut(&mut ix.index);
                    let (t, i) = (&ix.expr, &ix.index);
                    *e = syn::parse_quote_spanned!(ix.span()=> #t.at(#i));
                }
                _ => syn::visit_mut::visit_expr_mut(self, e),
            }
        }
    }
    let mut body = (*map.body).clone();
    Rewrite {
        names: &names,
        prefetch,
    }
    .visit_expr_mut(&mut body);
    quote_spanned!(map.span()=> |[#(#gs),*]: [::kernel_ir::IndexExpr; #rank]| {
        #(#binds)*
        #body
    })
}

fn module(
    func: &ItemFn,
    attr: &KernelAttr,
    params: &[Param],
    config_names: &[Ident],
    symbols: &[Ident],
    body: &syn::Block,
    stub: bool,
) -> TokenStream {
    let name = &func.sig.ident;
    let name_str = name.to_string();
    let vis = &func.vis;
    // Call-site hygiene: `#[track_caller]` reports a span's location only when
    // it comes from the user's own tokens, so builder calls are written with
    // the operand's span and must see this name from there.
    let b = Ident::new("__tessera_builder", Span::call_site());
    let rank = attr.grid.len();
    let grid = &attr.grid;
    let kernel_name = match &attr.name {
        Some(e) => quote_spanned!(e.span()=> #e),
        None => quote!(#name_str),
    };
    let sem = attr.semantics.iter().map(semantics_tokens);
    let check = attr.check.as_ref().map(|c| {
        quote_spanned! {c.span()=>
            let __tessera_check: ::core::result::Result<(), ::kernel_ir::KernelErrors> = #c;
            __tessera_check?;
        }
    });
    // `#[track_caller]` reports the grid at the attribute's `grid` key.
    let grid_b = Ident::new("__tessera_builder", attr.grid_span);
    let grid_fn = Ident::new("grid", attr.grid_span);
    let grid_call =
        quote_spanned!(attr.grid_span=> #grid_b.#grid_fn([#((#grid) as usize),*], [#(#sem),*]););
    let target = attr.target.as_ref().map(|t| {
        let v = match t.to_string().as_str() {
            "v5p" => quote!(V5p),
            "v6e" => quote!(V6e),
            "v7x" => quote!(V7x),
            _ => quote!(V5e),
        };
        quote_spanned!(t.span()=> #b.target(::kernel_ir::Target::#v);)
    });
    let vmem = attr
        .vmem_limit
        .as_ref()
        .map(|v| quote_spanned!(v.span()=> #b.vmem_limit((#v) as u64);));
    let mesh = (!attr.mesh.is_empty()).then(|| {
        let names = attr.mesh.iter().map(|(a, _)| a.to_string());
        let sizes = attr.mesh.iter().map(|(_, s)| s);
        quote!(#b.mesh([#((#names, (#sizes) as usize)),*]);)
    });
    let prefetch_names: Vec<Ident> = params
        .iter()
        .filter_map(|p| match p {
            // An optional prefetch is an `Option<Ref>` in index maps too.
            Param::Prefetch(pf) if pf.present.is_none() => Some(pf.name.clone()),
            _ => None,
        })
        .collect();

    let mut decls = Vec::new();
    for p in params {
        match p {
            Param::Config(_) => {}
            Param::Prefetch(pf) => {
                let (n, s) = (&pf.name, &pf.shape);
                let ns = n.to_string();
                let sp = n.span();
                let b = Ident::new("__tessera_builder", sp);
                let ctor = quote_spanned!(sp=> #b.scalar_prefetch(#ns, [#((#s) as usize),*]));
                decls.push(declare(n, ctor, pf.present.as_ref()));
            }
            Param::Semaphores(sm) => {
                let (n, s) = (&sm.name, &sm.shape);
                let ns = n.to_string();
                let sp = n.span();
                let b = Ident::new("__tessera_builder", sp);
                if sm.kind == "BarrierSemaphore" {
                    decls.push(quote_spanned!(sp=>
                        let #n = #b.barrier_semaphore();
                    ));
                    continue;
                }
                let ctor = Ident::new(
                    if sm.kind == "Semaphores" {
                        "semaphores"
                    } else {
                        "dma_semaphores"
                    },
                    sp,
                );
                decls.push(quote_spanned!(sp=>
                    let #n = #b.#ctor(#ns, [#((#s) as usize),*]);
                ));
            }
            Param::Scratch(sc) => {
                let (n, s) = (&sc.name, &sc.shape);
                let ns = n.to_string();
                let dt = sc.dtype.tokens();
                let space = (sc.space == Space::Smem)
                    .then(|| quote!(.space(::kernel_ir::MemorySpace::Smem)));
                let sp = n.span();
                let b = Ident::new("__tessera_builder", sp);
                decls.push(quote_spanned!(sp=>
                    let #n = #b.scratch(#ns, #dt, [#((#s) as usize),*])#space;
                ));
            }
            Param::Array(a) => {
                let (n, s) = (&a.name, &a.shape);
                let ns = n.to_string();
                let dt = a.dtype.tokens();
                // `#[track_caller]` reports a method call at its name: give
                // it the operand's span.
                let ctor = Ident::new(
                    match a.role {
                        Role::In => "input",
                        Role::Out => "output",
                        Role::InOut => "inout",
                    },
                    n.span(),
                );
                let block = a.block.as_ref().map(|blk| match blk {
                    BlockAttr::Inline(blk) => {
                        let bs = &blk.shape;
                        let map = index_map(&blk.map, &prefetch_names, rank);
                        quote_spanned!(blk.span=> .block([#((#bs) as usize),*], #map))
                    }
                    BlockAttr::Named(e) => quote_spanned!(e.span()=> .block_of(#e)),
                });
                let buffered = a
                    .buffered
                    .as_ref()
                    .map(|b| quote_spanned!(b.span()=> .buffered((#b) as usize)));
                let element = a
                    .element
                    .as_ref()
                    .map(|(lo, hi)| quote_spanned!(lo.span()=> .element_window(#lo, #hi)));
                let layout = match &a.layout {
                    LayoutAttr::RowMajor => None,
                    LayoutAttr::ColMajor => Some(quote!(.col_major())),
                    LayoutAttr::MinorToMajor(es) => Some(
                        quote!(.layout(::kernel_ir::Layout::minor_to_major(vec![#((#es) as usize),*]))),
                    ),
                };
                let align = a
                    .align
                    .as_ref()
                    .map(|al| quote_spanned!(al.span()=> .align((#al) as u64)));
                let space = match a.space {
                    Space::Vmem => None,
                    Space::Smem => Some(quote!(.space(::kernel_ir::MemorySpace::Smem))),
                    Space::Any => Some(quote!(.space(::kernel_ir::MemorySpace::Any))),
                };
                let sp = n.span();
                let b = Ident::new("__tessera_builder", sp);
                let ctor = quote_spanned!(sp=>
                    #b.#ctor(#ns, #dt, [#((#s) as usize),*])#block #element #buffered #layout #align #space
                );
                decls.push(declare(n, ctor, a.present.as_ref()));
            }
        }
    }

    let config_params: Vec<&syn::PatType> = params
        .iter()
        .filter_map(|p| match p {
            Param::Config(pt) => Some(pt),
            _ => None,
        })
        .collect();
    let (impl_generics, ty_generics, where_clause) = func.sig.generics.split_for_impl();
    let turbofish = ty_generics.as_turbofish();
    let type_params: Vec<&Ident> = func.sig.generics.type_params().map(|t| &t.ident).collect();
    let build_for = crate::dispatch::build_for(func, &kernel_name, &config_params);
    let stmts = &body.stmts;

    let kernel_body = if stub {
        quote!(::core::unreachable!("kernel `{}` did not compile", #name_str))
    } else {
        quote! {
            let Dims { #(#symbols,)* } = dims;
            #check
            let mut #b = ::kernel_ir::KernelBuilder::new(#kernel_name);
            #grid_call
            #target
            #vmem
            #mesh
            #(#decls)*
            let _: () = { #(#stmts)* };
            #b.finish()
        }
    };

    // Dims::from_shapes: bind symbols from the inputs' shapes.
    let inputs: Vec<(String, &Vec<Expr>)> = params
        .iter()
        .filter_map(|p| match p {
            // Optional operands bind no symbols: whether they are there
            // depends on the config, which `from_shapes` does not see.
            Param::Prefetch(pf) if pf.present.is_none() => Some((pf.name.to_string(), &pf.shape)),
            Param::Array(a) if a.role != Role::Out && a.present.is_none() => {
                Some((a.name.to_string(), &a.shape))
            }
            _ => None,
        })
        .collect();
    let n_inputs = inputs.len();
    let input_list = inputs
        .iter()
        .map(|(n, s)| format!("{n} (rank {})", s.len()))
        .collect::<Vec<_>>()
        .join(", ");
    let bind = inputs.iter().enumerate().map(|(i, (n, shape))| {
        let rank = shape.len();
        let entries = shape.iter().enumerate().filter_map(|(j, e)| {
            let sym = sig::symbol(e).filter(|id| symbols.contains(id))?;
            let ss = sym.to_string();
            Some(quote! {
                match #sym {
                    None => #sym = Some(__s[#j]),
                    Some(v) if v != __s[#j] => return Err(::kernel_ir::dsl::input_error(format!(
                        "shape symbol `{}` is {} from an earlier input but dim {} of `{}` is {}", #ss, v, #j, #n, __s[#j]
                    ))),
                    Some(_) => {}
                }
            })
        });
        quote! {
            let __s = shapes[#i];
            if __s.len() != #rank {
                return Err(::kernel_ir::dsl::input_error(format!(
                    "`{}` must have rank {} but its shape has {} dims", #n, #rank, __s.len()
                )));
            }
            #(#entries)*
        }
    });
    let sym_strs: Vec<String> = symbols.iter().map(Ident::to_string).collect();
    let dims_doc = format!(
        "The shape symbols of kernel `{name_str}`: {}.",
        if sym_strs.is_empty() {
            "none".to_string()
        } else {
            sym_strs.join(", ")
        }
    );
    let from_doc = format!(
        "Binds the shape symbols from the shapes of the kernel's required inputs (optional operands are left out), in call order: {}.",
        if input_list.is_empty() {
            "none".to_string()
        } else {
            input_list.clone()
        }
    );
    let mod_doc = format!("Kernel `{name_str}`, generated by `#[tpu_kernel]`.");

    quote! {
        #[doc = #mod_doc]
        #[allow(unused_imports, unused_variables, unused_mut, unused_parens, non_snake_case, clippy::all)]
        #vis mod #name {
            use super::*;

            #[doc = #dims_doc]
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
            pub struct Dims {
                #(
                    #[doc = "A shape symbol."]
                    pub #symbols: usize,
                )*
            }

            impl Dims {
                #[doc = #from_doc]
                pub fn from_shapes(shapes: &[&[usize]]) -> ::core::result::Result<Dims, ::kernel_ir::KernelErrors> {
                    if shapes.len() != #n_inputs {
                        return Err(::kernel_ir::dsl::input_error(format!(
                            "kernel `{}` takes {} inputs ({}), got {} shapes", #name_str, #n_inputs, #input_list, shapes.len()
                        )));
                    }
                    #(let mut #symbols: Option<usize> = None;)*
                    #(#bind)*
                    Ok(Dims {
                        #(#symbols: #symbols.ok_or_else(|| ::kernel_ir::dsl::input_error(format!(
                            "shape symbol `{}` appears in no input of `{}`; build with explicit `Dims`", #sym_strs, #name_str
                        )))?,)*
                    })
                }
            }

            /// Builds the kernel IR for a config and shape symbols, without verifying it.
            pub fn kernel #impl_generics (#(#config_params,)* dims: Dims) -> ::core::result::Result<::kernel_ir::Kernel, ::kernel_ir::KernelErrors> #where_clause {
                #kernel_body
            }

            /// Builds and verifies the kernel for a config and shape symbols,
            /// once per process ([`kernel_ir::memo`]): a second call with the
            /// same arguments returns the same kernel.
            pub fn build #impl_generics (#(#config_params,)* dims: Dims) -> ::core::result::Result<::kernel_ir::VerifiedKernel, ::kernel_ir::KernelErrors> #where_clause {
                let __tessera_key = ::std::format!(
                    "{}::{}<{}>{:?}{:?}",
                    ::core::module_path!(),
                    #name_str,
                    {
                        let __types: &[&str] = &[#(::core::any::type_name::<#type_params>()),*];
                        __types.join(",")
                    },
                    [#(&#config_names as &dyn ::core::fmt::Debug,)* &dims as &dyn ::core::fmt::Debug],
                    ::kernel_ir::current_platform(),
                );
                ::kernel_ir::memo::verified(__tessera_key, move || kernel #turbofish (#(#config_names,)* dims)?.verify())
            }

            #build_for
        }
    }
}
