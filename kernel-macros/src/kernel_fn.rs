//! `#[kernel_fn]`: helpers callable from kernel bodies.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ItemFn;
use syn::visit_mut::VisitMut;

use crate::body::BodyTransform;

/// Expands `#[kernel_fn] fn helper(..) -> .. { .. }` into the helper with a
/// rewritten body (as kernel bodies are) and a `const helper:
/// KernelFn<fn(..) -> ..>` that kernel bodies may call.
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let e = e.to_compile_error();
            return quote!(#e #item);
        }
    };
    let mut errors = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new_spanned(
            &attr,
            "`#[kernel_fn]` takes no arguments",
        ));
    }
    if !func.sig.generics.params.is_empty() {
        errors.push(syn::Error::new_spanned(
            &func.sig.generics,
            "a kernel function cannot be generic; pass sizes and flags as ordinary arguments",
        ));
    }
    let mut tr = BodyTransform::new();
    tr.visit_block_mut(&mut func.block);
    errors.extend(tr.errors);
    let errs = errors.iter().map(syn::Error::to_compile_error);
    if !errors.is_empty() {
        return quote!(#(#errs)* #[allow(unused, dead_code)] #func);
    }
    let name = func.sig.ident.clone();
    let vis = func.vis.clone();
    let docs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .cloned()
        .collect();
    let inner = format_ident!("__tessera_kernel_fn_{}", name);
    let arg_types = func.sig.inputs.iter().map(|a| match a {
        syn::FnArg::Typed(t) => {
            let ty = &t.ty;
            quote!(#ty)
        }
        syn::FnArg::Receiver(r) => quote!(#r),
    });
    let ret = &func.sig.output;
    func.sig.ident = inner.clone();
    func.attrs.retain(|a| !a.path().is_ident("doc"));
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        #func

        #(#docs)*
        #[allow(non_upper_case_globals)]
        #vis const #name: ::kernel_ir::dsl::KernelFn<fn(#(#arg_types),*) #ret> =
            ::kernel_ir::dsl::KernelFn(#inner);
    }
}
