//! Operand groups: `#[operands]` on a struct of operands, and a kernel
//! parameter `#[operands] _: Group<T>` that stands for them.
//!
//! A proc macro sees one item at a time, so the kernel cannot read the
//! group's fields where it is expanded. The group therefore carries its
//! fields itself: `#[operands] struct Group<T> { .. }` becomes a
//! `macro_rules! Group` holding the field tokens. A kernel with a group
//! parameter expands to a call of that macro around the kernel
//! (`Group! { #[tpu_kernel(..)] fn .. }`), which hands the fields and the
//! kernel to `__splice_operands`; that replaces the parameter by the fields
//! and gives the kernel back to `#[tpu_kernel]`, once per group.
//!
//! Tokens that come out of a `macro_rules` body are hygienic: a field name
//! or a shape symbol written in the group would not be the same variable as
//! one written in the kernel. Every spliced identifier is therefore resolved
//! at the `_` of the kernel's parameter (keeping its own location for error
//! messages), as if the fields had been written there.

use proc_macro2::{Group, Ident, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Attribute, FnArg, GenericArgument, ItemFn, ItemStruct, Pat, PathArguments, Token, Type};

/// The parameter attribute that marks a group parameter.
const MARK: &str = "operands";

/// Expands `#[operands] struct Group<T> { fields }`.
pub fn operands(attr: TokenStream, item: TokenStream) -> TokenStream {
    group_macro(attr, item).unwrap_or_else(|e| e.to_compile_error())
}

fn group_macro(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if !attr.is_empty() {
        return Err(syn::Error::new_spanned(
            attr,
            "`#[operands]` takes no arguments",
        ));
    }
    let s: ItemStruct = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            "`#[operands]` goes on a struct whose named fields are kernel operands: `#[operands] struct Qkv<T> { #[shape(..)] #[block(..)] q: In<T>, .. }`",
        )
    })?;
    let syn::Fields::Named(fields) = &s.fields else {
        return Err(syn::Error::new_spanned(
            &s.fields,
            "an operand group names its operands: `struct Qkv<T> { q: In<T>, .. }`",
        ));
    };
    if let Some(a) = s.attrs.iter().find(|a| !a.path().is_ident("doc")) {
        return Err(syn::Error::new_spanned(
            a,
            "an operand group takes only doc comments; put operand attributes on its fields",
        ));
    }
    if matches!(s.vis, syn::Visibility::Public(_)) {
        return Err(syn::Error::new_spanned(
            &s.vis,
            "an operand group is used by the kernels of its own crate: write `pub(crate)` (or less), not `pub`",
        ));
    }
    let mut generics = Vec::new();
    for p in &s.generics.params {
        match p {
            syn::GenericParam::Type(t) if t.bounds.is_empty() => generics.push(t.ident.clone()),
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "an operand group's generics are bare element type names (`<T>`); the kernel bounds them",
                ));
            }
        }
    }
    let mut spliced = TokenStream::new();
    for f in &fields.named {
        let attrs: Vec<&Attribute> = f
            .attrs
            .iter()
            .filter(|a| !a.path().is_ident("doc"))
            .collect();
        let (name, ty) = (&f.ident, &f.ty);
        spliced.extend(quote!(#(#attrs)* #name: #ty,));
    }
    let name = &s.ident;
    let vis = &s.vis;
    let docs = &s.attrs;
    let shown: Vec<String> = fields
        .named
        .iter()
        .filter_map(|f| f.ident.as_ref().map(ToString::to_string))
        .collect();
    let note = format!(
        " An operand group (`#[operands]`): a kernel parameter `#[operands] _: {name}<..>` stands for its operands {}.",
        shown
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let vis_use = match vis {
        syn::Visibility::Inherited => quote!(),
        v => quote!(#v),
    };
    Ok(quote! {
        #(#docs)*
        #[doc = ""]
        #[doc = #note]
        #[allow(unused_macros)]
        macro_rules! #name {
            ($($kernel:tt)*) => {
                ::kernel_ir::__splice_operands! { #name [#(#generics),*] { #spliced } $($kernel)* }
            };
        }
        #[allow(unused_imports)]
        #vis_use use #name;
    })
}

/// The group parameter of a kernel: its position, the group's macro path
/// (its type's path without generic arguments) and the span of its `_`,
/// where the group's fields are resolved.
pub struct GroupParam {
    pub index: usize,
    pub path: syn::Path,
    pub anchor: Span,
}

/// The first `#[operands]` parameter of `func`, if any; an error for one
/// written wrongly.
pub fn find_group(func: &ItemFn) -> syn::Result<Option<GroupParam>> {
    for (index, arg) in func.sig.inputs.iter().enumerate() {
        let FnArg::Typed(pt) = arg else { continue };
        let Some(mark) = pt.attrs.iter().find(|a| a.path().is_ident(MARK)) else {
            continue;
        };
        if !matches!(mark.meta, syn::Meta::Path(_)) {
            return Err(syn::Error::new_spanned(
                mark,
                "write `#[operands] _: Group<T>`: the attribute takes no arguments",
            ));
        }
        let Pat::Wild(wild) = &*pt.pat else {
            return Err(syn::Error::new_spanned(
                &pt.pat,
                "an operand group's parameter is written `_`: its operands keep the names the group gives them (`#[operands] _: Group<T>`)",
            ));
        };
        if pt.attrs.len() > 1 {
            return Err(syn::Error::new_spanned(
                pt,
                "an operand group's parameter takes only `#[operands]`; its operands' attributes are the group's",
            ));
        }
        let Type::Path(tp) = &*pt.ty else {
            return Err(syn::Error::new_spanned(
                &pt.ty,
                "an operand group's type is the group's name: `#[operands] _: Group<T>`",
            ));
        };
        let mut path = tp.path.clone();
        if let Some(last) = path.segments.last_mut() {
            last.arguments = PathArguments::None;
        }
        return Ok(Some(GroupParam {
            index,
            path,
            anchor: wild.underscore_token.span,
        }));
    }
    Ok(None)
}

/// `Group! { #[::kernel_ir::tpu_kernel(attr)] item }`: the kernel handed
/// to its first group, which splices itself in and expands it again.
pub fn defer_to_group(g: &GroupParam, attr: TokenStream, item: TokenStream) -> TokenStream {
    let path = &g.path;
    quote! {
        #path! { #[::kernel_ir::tpu_kernel(#attr)] #item }
    }
}

/// `Group [T, ..] { fields } #[tpu_kernel(..)] fn ..`, what a group's
/// macro passes on.
struct Splice {
    name: Ident,
    generics: Vec<Ident>,
    fields: TokenStream,
    attrs: Vec<Attribute>,
    func: ItemFn,
}

impl Parse for Splice {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        let g;
        syn::bracketed!(g in input);
        let generics = Punctuated::<Ident, Token![,]>::parse_terminated(&g)?
            .into_iter()
            .collect();
        let f;
        syn::braced!(f in input);
        let fields: TokenStream = f.parse()?;
        let attrs = input.call(Attribute::parse_outer)?;
        let func: ItemFn = input.parse()?;
        Ok(Splice {
            name,
            generics,
            fields,
            attrs,
            func,
        })
    }
}

/// Expands `__splice_operands! { .. }`: the kernel with its group
/// parameter replaced by the group's operands.
pub fn splice(input: TokenStream) -> TokenStream {
    let s: Splice = match syn::parse2(input) {
        Ok(s) => s,
        Err(e) => return e.to_compile_error(),
    };
    match spliced(s) {
        Ok(t) => t,
        Err(e) => e.to_compile_error(),
    }
}

fn spliced(s: Splice) -> syn::Result<TokenStream> {
    let Splice {
        name,
        generics,
        fields,
        attrs,
        mut func,
    } = s;
    let Some(g) = find_group(&func)? else {
        return Err(syn::Error::new(
            Span::call_site(),
            format!(
                "`{name}!` splices an operand group into a kernel with an `#[operands] _: {name}<..>` parameter"
            ),
        ));
    };
    let FnArg::Typed(pt) = &func.sig.inputs[g.index] else {
        unreachable!("find_group returns typed parameters")
    };
    let args: Vec<TokenStream> = match &*pt.ty {
        Type::Path(tp) => match tp.path.segments.last().map(|s| &s.arguments) {
            Some(PathArguments::AngleBracketed(a)) => a
                .args
                .iter()
                .map(|a| match a {
                    GenericArgument::Type(t) => Ok(t.to_token_stream()),
                    other => Err(syn::Error::new_spanned(
                        other,
                        "a group's arguments are element types",
                    )),
                })
                .collect::<syn::Result<_>>()?,
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    if args.len() != generics.len() {
        return Err(syn::Error::new_spanned(
            &pt.ty,
            format!(
                "`{name}` takes {} element type argument(s) ({}), this gives {}",
                generics.len(),
                generics
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                args.len()
            ),
        ));
    }
    let fields = respan(fields, g.anchor, &generics, &args);
    let params: Punctuated<FnArg, Token![,]> =
        syn::parse::Parser::parse2(Punctuated::parse_terminated, fields)?;
    let mut inputs = Punctuated::<FnArg, Token![,]>::new();
    for (i, arg) in std::mem::take(&mut func.sig.inputs).into_iter().enumerate() {
        if i == g.index {
            inputs.extend(params.iter().cloned());
        } else {
            inputs.push(arg);
        }
    }
    func.sig.inputs = inputs;
    Ok(quote!(#(#attrs)* #func))
}

/// The group's tokens as if written at `anchor`, its type parameters
/// replaced by the kernel's arguments.
fn respan(
    tokens: TokenStream,
    anchor: Span,
    generics: &[Ident],
    args: &[TokenStream],
) -> TokenStream {
    tokens
        .into_iter()
        .flat_map(|t| -> Vec<TokenTree> {
            match t {
                TokenTree::Ident(i) => {
                    if let Some(k) = generics.iter().position(|g| *g == i) {
                        return args[k].clone().into_iter().collect();
                    }
                    let text = i.to_string();
                    let span = i.span().resolved_at(anchor);
                    let j = match text.strip_prefix("r#") {
                        Some(raw) => Ident::new_raw(raw, span),
                        None => Ident::new(&text, span),
                    };
                    vec![TokenTree::Ident(j)]
                }
                TokenTree::Group(gr) => {
                    let mut n =
                        Group::new(gr.delimiter(), respan(gr.stream(), anchor, generics, args));
                    n.set_span(gr.span());
                    vec![TokenTree::Group(n)]
                }
                other => vec![other],
            }
        })
        .collect()
}
