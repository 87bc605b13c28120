//! `build_for`: the dispatch from run-time dtypes to a generic kernel's
//! instance, written from the type parameters' bounds so that no library
//! kernel repeats it by hand.

use proc_macro2::{TokenStream, TokenTree};
use quote::{format_ident, quote};
use syn::{GenericParam, Ident, ItemFn, TypeParamBound};

/// A bound `build_for` knows the instances of: the last segment of the
/// trait's path, and the Rust types it is implemented for (the traits are
/// sealed in `kernel_ir`, so this list is the whole of each), in dispatch
/// order.
struct DTypeSet {
    trait_name: &'static str,
    types: fn() -> Vec<(TokenStream, TokenStream)>,
}

const SETS: &[DTypeSet] = &[
    DTypeSet {
        trait_name: "Float",
        types: || {
            vec![
                (quote!(F32), quote!(f32)),
                (quote!(BF16), quote!(::kernel_ir::bf16)),
                (quote!(F16), quote!(::kernel_ir::f16)),
            ]
        },
    },
    DTypeSet {
        trait_name: "Fp8",
        types: || {
            vec![
                (quote!(F8E4M3FN), quote!(::kernel_ir::f8e4m3fn)),
                (quote!(F8E5M2), quote!(::kernel_ir::f8e5m2)),
            ]
        },
    },
];

/// One type parameter with the set its bound names.
struct Choice {
    param: Ident,
    arg: Ident,
    set: &'static DTypeSet,
}

/// `build_for`, when every generic parameter is a type bounded by `Float`
/// or `Fp8` and no config parameter's type names one of them; nothing
/// otherwise (the author dispatches by hand, as for any generic fn).
///
/// `name` is the kernel's name as `build` gives it (the `name = ..`
/// expression over the config where the attribute has one), so a refusal
/// names the kernel that was asked for.
pub fn build_for(
    func: &ItemFn,
    name: &TokenStream,
    config: &[&syn::PatType],
) -> Option<TokenStream> {
    let generics = &func.sig.generics;
    if generics.params.is_empty() || generics.where_clause.is_some() {
        return None;
    }
    let several = generics.params.len() > 1;
    let mut choices = Vec::new();
    for p in &generics.params {
        let GenericParam::Type(t) = p else {
            return None;
        };
        let set = t.bounds.iter().find_map(|b| match b {
            TypeParamBound::Trait(tb) => {
                let last = tb.path.segments.last()?.ident.to_string();
                SETS.iter().find(|s| s.trait_name == last)
            }
            _ => None,
        })?;
        let arg = if several {
            format_ident!("dtype_{}", t.ident.to_string().to_lowercase())
        } else {
            format_ident!("dtype")
        };
        choices.push(Choice {
            param: t.ident.clone(),
            arg,
            set,
        });
    }
    let params: Vec<&Ident> = choices.iter().map(|c| &c.param).collect();
    if config
        .iter()
        .any(|pt| mentions(quote!(#pt).into_iter(), &params))
    {
        return None;
    }
    let names: Vec<&Ident> = config
        .iter()
        .filter_map(|pt| match &*pt.pat {
            syn::Pat::Ident(i) => Some(&i.ident),
            _ => None,
        })
        .collect();
    let body = dispatch(&choices, &mut Vec::new(), name, several, &names);
    let args = choices.iter().map(|c| &c.arg);
    let picks = choices
        .iter()
        .map(|c| {
            let types = (c.set.types)()
                .into_iter()
                .map(|(d, _)| d.to_string().to_lowercase())
                .collect::<Vec<_>>()
                .join(", ");
            format!("`{}` picks `{}` ({types})", c.arg, c.param)
        })
        .collect::<Vec<_>>()
        .join("; ");
    let doc = format!(
        "Builds the kernel for dtypes known at run time: {picks}. [`build`] for that \
         instance, or the error naming the dtypes the bounds admit."
    );
    Some(quote! {
        #[doc = #doc]
        pub fn build_for(
            #(#args: ::kernel_ir::DType,)*
            #(#config,)*
            dims: Dims,
        ) -> ::core::result::Result<::kernel_ir::VerifiedKernel, ::kernel_ir::KernelErrors> {
            #body
        }
    })
}

/// The nested `match` over each choice in turn, `chosen` the Rust types
/// picked by the enclosing arms.
fn dispatch(
    choices: &[Choice],
    chosen: &mut Vec<TokenStream>,
    name: &TokenStream,
    several: bool,
    config: &[&Ident],
) -> TokenStream {
    let Some((first, rest)) = choices.split_first() else {
        return quote!(build::<#(#chosen),*>(#(#config,)* dims));
    };
    let arg = &first.arg;
    let what = if several {
        let param = first.param.to_string();
        quote!(&::std::format!("{} ({})", #name, #param))
    } else {
        quote!(#name)
    };
    let types = (first.set.types)();
    let dtypes: Vec<&TokenStream> = types.iter().map(|(d, _)| d).collect();
    let arms = types.iter().map(|(d, ty)| {
        chosen.push(ty.clone());
        let inner = dispatch(rest, chosen, name, several, config);
        chosen.pop();
        quote!(::kernel_ir::DType::#d => #inner,)
    });
    quote! {
        match #arg {
            #(#arms)*
            other => Err(::kernel_ir::unsupported_dtype(
                #what,
                other,
                &[#(::kernel_ir::DType::#dtypes),*],
            )),
        }
    }
}

/// True when `tokens` (a config parameter) names one of the type parameters.
fn mentions(tokens: impl Iterator<Item = TokenTree>, params: &[&Ident]) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => params.iter().any(|p| **p == i),
        TokenTree::Group(g) => mentions(g.stream().into_iter(), params),
        _ => false,
    })
}
