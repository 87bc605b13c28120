//! The kernel's parameters: config values, array operands, scratch and
//! scalar prefetch, with their attributes.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, ExprClosure, FnArg, GenericArgument, Ident, PatType, PathArguments, Token,
    Type,
};

/// In, out or in-out.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    In,
    Out,
    InOut,
}

/// Memory space of an operand or scratch buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Vmem,
    Smem,
    Any,
}

/// The layout attribute of an operand.
#[allow(clippy::enum_variant_names)] // the names are the layouts' names
pub enum LayoutAttr {
    RowMajor,
    ColMajor,
    MinorToMajor(Vec<Expr>),
}

/// An operand's `#[block(..)]`.
pub enum BlockAttr {
    /// `#[block([..], |g0, g1| (..))]`: a shape and an index map.
    Inline(Block),
    /// `#[block(spec(..))]`: an expression giving a
    /// `kernel_ir::BlockMap` (a shape and an index map built by a named
    /// function, so operands and kernels can share one).
    Named(Expr),
}

/// `#[block([..], |g0, g1| (..))]`.
pub struct Block {
    pub shape: Vec<Expr>,
    pub map: ExprClosure,
    pub span: Span,
}

/// An element type named in `In<f32>` and friends: a dtype name, or a
/// type parameter of the kernel (`In<T>`, `T: Element`).
pub struct DTypeName {
    pub ident: Ident,
    pub generic: bool,
}

impl DTypeName {
    /// Bytes per element; `None` for a type parameter or an unknown name.
    pub fn bytes(&self) -> Option<usize> {
        if self.generic {
            return None;
        }
        Some(match self.ident.to_string().as_str() {
            "f32" | "i32" => 4,
            "bf16" | "f16" => 2,
            "i8" | "bool" | "f8e4m3fn" | "f8e5m2" => 1,
            _ => return None,
        })
    }

    /// An expression of type `kernel_ir::DType`.
    pub fn tokens(&self) -> proc_macro2::TokenStream {
        let t = &self.ident;
        if self.generic {
            return quote::quote_spanned!(t.span()=> <#t as ::kernel_ir::Element>::DTYPE);
        }
        let v = match t.to_string().as_str() {
            "f32" => "F32",
            "bf16" => "BF16",
            "f16" => "F16",
            "i32" => "I32",
            "i8" => "I8",
            "f8e4m3fn" => "F8E4M3FN",
            "f8e5m2" => "F8E5M2",
            _ => "Bool",
        };
        let v = Ident::new(v, t.span());
        quote::quote_spanned!(t.span()=> ::kernel_ir::DType::#v)
    }
}

/// An array operand.
pub struct ArrayParam {
    pub name: Ident,
    pub role: Role,
    pub dtype: DTypeName,
    pub shape: Vec<Expr>,
    pub block: Option<BlockAttr>,
    pub layout: LayoutAttr,
    pub align: Option<Expr>,
    pub space: Space,
    /// `#[buffered(n)]`: pipeline buffers of the window.
    pub buffered: Option<Expr>,
    /// `#[element(low, high)]`: element-offset windows in the array padded
    /// by `low` and `high`.
    pub element: Option<(Expr, Expr)>,
    /// `Option<In<T>>` with `#[present(cond)]`: the build-time condition
    /// under which the kernel takes this operand.
    pub present: Option<Expr>,
}

/// A scratch buffer.
pub struct ScratchParam {
    pub name: Ident,
    pub dtype: DTypeName,
    pub shape: Vec<Expr>,
    pub space: Space,
}

/// A scalar-prefetch operand.
pub struct PrefetchParam {
    pub name: Ident,
    pub shape: Vec<Expr>,
    /// As [`ArrayParam::present`].
    pub present: Option<Expr>,
}

/// An array of semaphores (`DmaSemaphores` or `Semaphores`), or the
/// barrier semaphore (`BarrierSemaphore`).
pub struct SemParam {
    pub name: Ident,
    /// `DmaSemaphores`, `Semaphores` or `BarrierSemaphore`.
    pub kind: &'static str,
    /// Empty for a single semaphore.
    pub shape: Vec<Expr>,
}

/// One kernel parameter.
pub enum Param {
    /// A value passed to `build` (block sizes, flags, a config struct).
    Config(PatType),
    Array(Box<ArrayParam>),
    Scratch(ScratchParam),
    Prefetch(PrefetchParam),
    Semaphores(SemParam),
}

const OUR_ATTRS: [&str; 11] = [
    "shape",
    "buffered",
    "element",
    "present",
    "block",
    "col_major",
    "row_major",
    "minor_to_major",
    "align",
    "smem",
    "any",
];

/// True for attributes this macro consumes on parameters.
pub fn is_our_attr(a: &Attribute) -> bool {
    a.path()
        .get_ident()
        .is_some_and(|i| OUR_ATTRS.contains(&i.to_string().as_str()) || i == "vmem")
}

fn list(a: &Attribute) -> syn::Result<Vec<Expr>> {
    Ok(
        a.parse_args_with(Punctuated::<Expr, Token![,]>::parse_terminated)?
            .into_iter()
            .collect(),
    )
}

/// The last path segment of a type and its generic arguments.
fn type_head(ty: &Type) -> Option<(Ident, Vec<GenericArgument>)> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    let args = match &seg.arguments {
        PathArguments::AngleBracketed(a) => a.args.iter().cloned().collect(),
        _ => Vec::new(),
    };
    Some((seg.ident.clone(), args))
}

fn dtype_arg(
    head: &Ident,
    args: &[GenericArgument],
    ty: &Type,
    generics: &[Ident],
) -> syn::Result<DTypeName> {
    match args {
        [GenericArgument::Type(Type::Path(p))] if p.path.get_ident().is_some() => {
            let ident = p.path.get_ident().cloned().expect("checked above");
            let generic = generics.contains(&ident);
            let d = DTypeName { ident, generic };
            if generic {
                return Ok(d);
            }
            if d.bytes().is_none() {
                return Err(syn::Error::new_spanned(
                    p,
                    format!(
                        "unknown kernel dtype `{}`; use f32, bf16, f16, i32, i8, bool, f8e4m3fn, f8e5m2, or a type parameter `T: Element`",
                        d.ident
                    ),
                ));
            }
            Ok(d)
        }
        _ => Err(syn::Error::new_spanned(
            ty,
            format!("write `{head}<dtype>`, e.g. `{head}<f32>`"),
        )),
    }
}

const OPERAND_KINDS: [&str; 8] = [
    "In",
    "Out",
    "InOut",
    "Scratch",
    "Prefetch",
    "DmaSemaphores",
    "Semaphores",
    "BarrierSemaphore",
];

/// True for the operand marker types (`In<T>`, `Out<T>`, `InOut<T>`,
/// `Scratch<T>`, `Prefetch`).
pub fn is_operand_type(ty: &Type) -> bool {
    type_head(ty).is_some_and(|(i, _)| OPERAND_KINDS.contains(&i.to_string().as_str()))
}

/// True for `DmaSemaphores` and `Semaphores` (a `SemArray` in the body).
pub fn is_semaphore_type(ty: &Type) -> bool {
    type_head(ty).is_some_and(|(i, _)| i == "DmaSemaphores" || i == "Semaphores")
}

/// True for `BarrierSemaphore` (a `Sem` in the body).
pub fn is_barrier_type(ty: &Type) -> bool {
    type_head(ty).is_some_and(|(i, _)| i == "BarrierSemaphore")
}

/// The operand type inside `Option<..>` (an optional operand), if `ty` is
/// one.
pub fn optional_operand(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ty else { return None };
    let seg = p.path.segments.last()?;
    if seg.ident != "Option" {
        return None;
    }
    let PathArguments::AngleBracketed(a) = &seg.arguments else {
        return None;
    };
    match a.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(inner)] if is_operand_type(inner) => Some(inner),
        _ => None,
    }
}

/// Parses one parameter.
pub fn parse_param(arg: &FnArg, generics: &[Ident]) -> syn::Result<Param> {
    let FnArg::Typed(pt) = arg else {
        return Err(syn::Error::new_spanned(arg, "a kernel takes no `self`"));
    };
    let optional = optional_operand(&pt.ty);
    let ty = optional.unwrap_or(&pt.ty);
    let head = type_head(ty);
    let kind = head
        .as_ref()
        .map(|(i, _)| i.to_string())
        .unwrap_or_default();
    if !OPERAND_KINDS.contains(&kind.as_str()) {
        if let Some(a) = pt.attrs.iter().find(|a| is_our_attr(a)) {
            return Err(syn::Error::new_spanned(
                a,
                "this attribute applies to array operands (`In<T>`, `Out<T>`, `InOut<T>`), `Scratch<T>` and `Prefetch` parameters",
            ));
        }
        return Ok(Param::Config(pt.clone()));
    }
    let (head, args) = head.expect("kind is known");
    let syn::Pat::Ident(pi) = &*pt.pat else {
        return Err(syn::Error::new_spanned(
            &pt.pat,
            "name operands with a plain identifier",
        ));
    };
    let name = pi.ident.clone();
    let mut shape = None;
    let mut block = None;
    let mut layout = LayoutAttr::RowMajor;
    let mut align = None;
    let mut space = Space::Vmem;
    let mut present = None;
    let mut buffered = None;
    let mut element = None;
    for a in &pt.attrs {
        let Some(id) = a.path().get_ident() else {
            continue;
        };
        match id.to_string().as_str() {
            "shape" => shape = Some(list(a)?),
            "present" => present = Some(a.parse_args::<Expr>()?),
            "buffered" => buffered = Some(a.parse_args::<Expr>()?),
            "element" => {
                let [low, high]: [Expr; 2] = list(a)?.try_into().map_err(|_| {
                    syn::Error::new_spanned(a, "write `#[element([low0, low1, ..], [high0, high1, ..])]`: the padding before and after each dim of the array, in elements (the index map then gives element offsets into the padded array)")
                })?;
                element = Some((low, high));
            }
            "block" => {
                let mut items = list(a)?;
                if items.len() == 1 {
                    block = items.pop().map(BlockAttr::Named);
                    continue;
                }
                let [shape_e, map_e]: [Expr; 2] = items.try_into().map_err(|_| {
                    syn::Error::new_spanned(a, "write `#[block([d0, d1, ..], |g0, g1, ..| (b0, b1, ..))]`: a block shape and an index map, or `#[block(spec(..))]`: a function returning a `kernel_ir::BlockMap`")
                })?;
                let Expr::Array(arr) = shape_e else {
                    return Err(syn::Error::new_spanned(
                        shape_e,
                        "the block shape is an array `[d0, d1, ..]`",
                    ));
                };
                let Expr::Closure(map) = map_e else {
                    return Err(syn::Error::new_spanned(
                        map_e,
                        "the index map is a closure from grid indices to block indices: `|i, j| (i, 0)`",
                    ));
                };
                block = Some(BlockAttr::Inline(Block {
                    shape: arr.elems.into_iter().collect(),
                    map,
                    span: a.span(),
                }));
            }
            "col_major" => layout = LayoutAttr::ColMajor,
            "row_major" => layout = LayoutAttr::RowMajor,
            "minor_to_major" => layout = LayoutAttr::MinorToMajor(list(a)?),
            "align" => align = Some(a.parse_args::<Expr>()?),
            "smem" => space = Space::Smem,
            "any" => space = Space::Any,
            "vmem" => space = Space::Vmem,
            _ => {}
        }
    }
    let need_shape = |what: &str| {
        syn::Error::new_spanned(
            &pt.pat,
            format!(
                "declare the shape of {what} `{name}` with `#[shape(..)]`, e.g. `#[shape(m, k)]` (lowercase names are shape symbols bound at build time)"
            ),
        )
    };
    match (&present, optional.is_some()) {
        (Some(_), false) => {
            return Err(syn::Error::new_spanned(
                &pt.ty,
                format!(
                    "`#[present(..)]` marks an optional operand: write its type as `Option<{}>`",
                    quote::quote!(#ty).to_string().replace(' ', "")
                ),
            ));
        }
        (None, true) => {
            return Err(syn::Error::new_spanned(
                &pt.pat,
                format!(
                    "optional operand `{name}` needs `#[present(cond)]`: the build-time condition under which the kernel takes it (e.g. `#[present(cfg.residual)]`)"
                ),
            ));
        }
        _ => {}
    }
    if let (Some(b), true) = (&buffered, !matches!(kind.as_str(), "In" | "Out" | "InOut")) {
        return Err(syn::Error::new_spanned(
            b,
            "`#[buffered(n)]` sets the pipeline buffers of an array operand's window; scratch and scalar prefetch have none",
        ));
    }
    if kind == "Scratch" && optional.is_some() {
        return Err(syn::Error::new_spanned(
            &pt.ty,
            "scratch cannot be optional; declare it always (an unused scratch buffer costs its VMEM only)",
        ));
    }
    Ok(match kind.as_str() {
        "DmaSemaphores" | "Semaphores" | "BarrierSemaphore" => {
            let barrier = kind == "BarrierSemaphore";
            if block.is_some()
                || align.is_some()
                || space != Space::Vmem
                || optional.is_some()
                || !args.is_empty()
                || (barrier && shape.is_some())
            {
                let what = if barrier {
                    "`BarrierSemaphore` is the chip's one barrier semaphore and takes no attributes"
                        .to_string()
                } else {
                    format!(
                        "`{kind}` takes only an optional `#[shape(..)]` (none for a single semaphore)"
                    )
                };
                return Err(syn::Error::new_spanned(&pt.pat, what));
            }
            Param::Semaphores(SemParam {
                name,
                kind: match kind.as_str() {
                    "Semaphores" => "Semaphores",
                    "BarrierSemaphore" => "BarrierSemaphore",
                    _ => "DmaSemaphores",
                },
                shape: shape.unwrap_or_default(),
            })
        }
        "Scratch" => {
            if block.is_some() || align.is_some() || space == Space::Any {
                return Err(syn::Error::new_spanned(
                    &pt.pat,
                    "scratch takes `#[shape(..)]` and optionally `#[smem]`, nothing else",
                ));
            }
            Param::Scratch(ScratchParam {
                dtype: dtype_arg(&head, &args, &pt.ty, generics)?,
                shape: shape.ok_or_else(|| need_shape("scratch"))?,
                name,
                space,
            })
        }
        "Prefetch" => {
            if !args.is_empty() {
                return Err(syn::Error::new_spanned(
                    ty,
                    "scalar prefetch always holds i32; write `Prefetch`",
                ));
            }
            Param::Prefetch(PrefetchParam {
                shape: shape.ok_or_else(|| need_shape("scalar prefetch"))?,
                name,
                present,
            })
        }
        _ => {
            let role = match kind.as_str() {
                "In" => Role::In,
                "Out" => Role::Out,
                _ => Role::InOut,
            };
            let dtype = dtype_arg(&head, &args, ty, generics)?;
            let shape = shape.ok_or_else(|| need_shape("array operand"))?;
            if space == Space::Any && block.is_some() {
                return Err(syn::Error::new_spanned(
                    &pt.pat,
                    "an `#[any]` operand is the whole array; drop its `#[block]`",
                ));
            }
            Param::Array(Box::new(ArrayParam {
                name,
                role,
                dtype,
                shape,
                block,
                layout,
                align,
                space,
                present,
                buffered,
                element,
            }))
        }
    })
}

/// A shape entry that is a shape symbol: a bare lowercase identifier.
pub fn symbol(e: &Expr) -> Option<&Ident> {
    let Expr::Path(p) = e else { return None };
    let id = p.path.get_ident()?;
    let s = id.to_string();
    (s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && p.qself.is_none())
    .then_some(id)
}
