//! `scoped(|#[shape(8, 128)] buf: Vmem<f32>, sem: DmaSemaphores| { .. })` in
//! a kernel body: the one closure the body accepts, rewritten into a
//! `kernel_ir::scoped` block that allocates each parameter for the body
//! (Pallas's `run_scoped(f, pltpu.VMEM(..), pltpu.SemaphoreType.DMA)`).

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprCall, ExprClosure, GenericArgument, Ident, Pat, PathArguments, Token, Type};

use crate::sig::DTypeName;

/// True for a call `scoped(|..| ..)`.
pub fn is_scoped_call(c: &ExprCall) -> bool {
    matches!(&*c.func, Expr::Path(p) if p.path.is_ident("scoped"))
        && c.args.len() == 1
        && matches!(c.args.first(), Some(Expr::Closure(_)))
}

/// The allocations of the closure's parameters, or the error at the first
/// one that is not `name: Vmem<T>`, `Smem<T>`, `DmaSemaphores` or
/// `Semaphores` (with `#[shape(..)]` for buffers and semaphore arrays).
pub fn allocations(cl: &ExprClosure, scope: &Ident) -> syn::Result<Vec<TokenStream>> {
    let mut out = Vec::new();
    for input in &cl.inputs {
        let Pat::Type(pt) = input else {
            return Err(syn::Error::new_spanned(
                input,
                "give each scoped allocation a name and a type: `#[shape(8, 128)] buf: Vmem<f32>`, `sem: DmaSemaphores`",
            ));
        };
        let Pat::Ident(name) = &*pt.pat else {
            return Err(syn::Error::new_spanned(
                &pt.pat,
                "name a scoped allocation with a plain identifier",
            ));
        };
        let name = &name.ident;
        let ns = name.to_string();
        let mut shape: Vec<Expr> = Vec::new();
        for a in &pt.attrs {
            if a.path().is_ident("shape") {
                shape = a
                    .parse_args_with(Punctuated::<Expr, Token![,]>::parse_terminated)?
                    .into_iter()
                    .collect();
            } else {
                return Err(syn::Error::new_spanned(
                    a,
                    "a scoped allocation takes only `#[shape(..)]`",
                ));
            }
        }
        let Type::Path(tp) = &*pt.ty else {
            return Err(syn::Error::new_spanned(
                &pt.ty,
                "write `Vmem<T>`, `Smem<T>`, `DmaSemaphores` or `Semaphores`",
            ));
        };
        let Some(seg) = tp.path.segments.last() else {
            return Err(syn::Error::new_spanned(
                &pt.ty,
                "write `Vmem<T>`, `Smem<T>`, `DmaSemaphores` or `Semaphores`",
            ));
        };
        let sp = name.span();
        let kind = seg.ident.to_string();
        let dims = quote_spanned!(sp=> [#((#shape) as usize),*]);
        out.push(match kind.as_str() {
            "Vmem" | "Smem" => {
                let dtype = match &seg.arguments {
                    PathArguments::AngleBracketed(a) => match a.args.iter().collect::<Vec<_>>()[..] {
                        [GenericArgument::Type(Type::Path(t))] if t.path.get_ident().is_some() => {
                            let ident = t.path.get_ident().cloned().expect("checked");
                            let generic = DTypeName { ident: ident.clone(), generic: false }.bytes().is_none();
                            DTypeName { ident, generic }.tokens()
                        }
                        _ => return Err(syn::Error::new_spanned(seg, format!("write `{kind}<dtype>`, e.g. `{kind}<f32>`"))),
                    },
                    _ => return Err(syn::Error::new_spanned(seg, format!("write `{kind}<dtype>`, e.g. `{kind}<f32>`"))),
                };
                if shape.is_empty() {
                    return Err(syn::Error::new_spanned(
                        name,
                        format!("declare the shape of scoped buffer `{name}` with `#[shape(..)]`"),
                    ));
                }
                let ctor = Ident::new(if kind == "Vmem" { "vmem" } else { "smem" }, sp);
                quote_spanned!(sp=> let #name = #scope.#ctor(#ns, #dtype, #dims);)
            }
            "DmaSemaphores" | "Semaphores" => {
                let ctor = Ident::new(if kind == "Semaphores" { "semaphores" } else { "dma_semaphores" }, sp);
                quote_spanned!(sp=> let #name = #scope.#ctor(#ns, #dims);)
            }
            _ => {
                return Err(syn::Error::new_spanned(
                    &pt.ty,
                    format!("`{kind}` cannot be allocated by a scope; write `Vmem<T>`, `Smem<T>`, `DmaSemaphores` or `Semaphores`"),
                ));
            }
        });
    }
    let _ = cl.span();
    Ok(out)
}
