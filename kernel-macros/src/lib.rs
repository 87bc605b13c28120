//! The `#[tpu_kernel]` and `#[kernel_fn]` attribute macros of Tessera.
//!
//! Use them through `kernel_ir` (`kernel_ir::tpu_kernel`), which documents
//! the syntax in full. The macro parses the kernel's signature into its own
//! small model (`sig`), checks what it can while compiling (`checks`),
//! rewrites the body where Rust cannot be overloaded (`body`), and expands to
//! a module with `Dims`, `kernel` and `build` (`expand`), and `build_for`
//! where the type parameters' bounds name their dtypes (`dispatch`). On error it emits
//! the errors, and the function itself so IDEs keep working. A kernel with
//! an operand group (`operands`) expands in two steps: through the group's
//! own macro, which splices the operands in, and back.

mod attr;
mod body;
mod checks;
mod dispatch;
mod expand;
mod kernel_fn;
mod operands;
mod scoped;
mod sig;

use proc_macro::TokenStream;

/// Turns a function into a Tessera kernel; see `kernel_ir::tpu_kernel`.
#[proc_macro_attribute]
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::tpu_kernel(attr.into(), item.into()).into()
}

/// An operand group: a struct of operands that kernels take as one
/// parameter; see `kernel_ir::operands`.
#[proc_macro_attribute]
pub fn operands(attr: TokenStream, item: TokenStream) -> TokenStream {
    operands::operands(attr.into(), item.into()).into()
}

/// What an operand group's macro calls: the kernel with the group's
/// operands in place of its group parameter. Not for direct use.
#[doc(hidden)]
#[proc_macro]
pub fn __splice_operands(input: TokenStream) -> TokenStream {
    operands::splice(input.into()).into()
}

/// Makes a function callable from kernel bodies; see `kernel_ir::kernel_fn`.
#[proc_macro_attribute]
pub fn kernel_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel_fn::kernel_fn(attr.into(), item.into()).into()
}
