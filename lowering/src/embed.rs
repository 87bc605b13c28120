//! Embedding a lowered kernel in a larger program: the `@main` of a
//! wrapper or decomposed module, renamed and made private, so that a graph
//! module can `func.call` it (XLA inlines the call).

use melior::ir::operation::{OperationLike, OperationMutLike};
use melior::ir::{BlockLike, Module};

use crate::LoweringError;
use crate::mlir::{Ir, Mlir};

/// The `func.func @main` of `module` (printed by one of the lowering
/// functions), renamed `@name` and private, printed on its own.
pub fn private_function(module: &str, name: &str) -> Result<String, LoweringError> {
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let parsed = Module::parse(&m.ctx, module).ok_or_else(|| LoweringError::Mlir {
        what: "module to embed",
        message: m.diagnostics(),
    })?;
    let mut op = parsed.body().first_operation_mut();
    while let Some(mut o) = op {
        let is_main = o
            .attribute("sym_name")
            .ok()
            .is_some_and(|a| a.to_string() == "\"main\"");
        if is_main {
            o.set_attribute("sym_name", ir.str_attr(name));
            o.set_attribute("sym_visibility", ir.str_attr("private"));
            return Ok(o.to_string());
        }
        op = o.next_in_block_mut();
    }
    Err(LoweringError::Internal("the module has no @main".into()))
}
