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
        if rename_main(&mut o, &ir, name) {
            return Ok(o.to_string());
        }
        op = o.next_in_block_mut();
    }
    Err(LoweringError::Internal("the module has no @main".into()))
}

/// Every top-level function of `module` printed on its own, for a module
/// that calls several (a graph program calling its kernels): `@main`
/// renamed `@name` and private, and every other symbol `@X` renamed
/// `@{name}_X`, its calls with it, so two programs embedded in one module
/// (an artifact's CPU and TPU branches) never clash.
pub fn private_functions(module: &str, name: &str) -> Result<String, LoweringError> {
    let m = Mlir::new();
    let parsed = Module::parse(&m.ctx, module).ok_or_else(|| LoweringError::Mlir {
        what: "module to embed",
        message: m.diagnostics(),
    })?;
    let mut symbols = Vec::new();
    let mut op = parsed.body().first_operation();
    while let Some(o) = op {
        if let Ok(a) = o.attribute("sym_name") {
            let s = a.to_string();
            symbols.push(s.trim_matches('"').to_string());
        }
        op = o.next_in_block();
    }
    if !symbols.iter().any(|s| s == "main") {
        return Err(LoweringError::Internal("the module has no @main".into()));
    }
    let ir = Ir::new(&m.ctx, "");
    let mut out = String::new();
    let mut op = parsed.body().first_operation_mut();
    while let Some(mut o) = op {
        if o.attribute("sym_name").is_ok() {
            rename_main(&mut o, &ir, name);
            let mut text = o.to_string();
            // Symbol references are `@X` followed by a delimiter; the
            // names are the module's own, so a textual rename is exact.
            for s in symbols.iter().filter(|s| *s != "main") {
                text = rename_symbol(&text, s, &format!("{name}_{s}"));
            }
            out.push_str(&text);
            out.push('\n');
        }
        op = o.next_in_block_mut();
    }
    Ok(out)
}

/// If `o` is `@main`: renames it `@name` and makes it private.
fn rename_main<'c>(
    o: &mut melior::ir::operation::OperationRefMut<'c, '_>,
    ir: &Ir<'c>,
    name: &str,
) -> bool {
    let is_main = o
        .attribute("sym_name")
        .ok()
        .is_some_and(|a| a.to_string() == "\"main\"");
    if is_main {
        o.set_attribute("sym_name", ir.str_attr(name));
        o.set_attribute("sym_visibility", ir.str_attr("private"));
    }
    is_main
}

/// `text` with every reference `@from` (not a longer name) as `@to`.
fn rename_symbol(text: &str, from: &str, to: &str) -> String {
    let pat = format!("@{from}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(&pat) {
        let after = &rest[i + pat.len()..];
        let whole = !after
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.' || c == '$');
        out.push_str(&rest[..i]);
        if whole {
            out.push('@');
            out.push_str(to);
        } else {
            out.push_str(&pat);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_is_kept_and_renamed_with_its_calls() {
        let module = r#"module {
  func.func private @k(%a: tensor<2xf32>) -> tensor<2xf32> {
    return %a : tensor<2xf32>
  }
  func.func private @k_1(%a: tensor<2xf32>) -> tensor<2xf32> {
    %0 = func.call @k(%a) : (tensor<2xf32>) -> tensor<2xf32>
    return %0 : tensor<2xf32>
  }
  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
    %0 = func.call @k_1(%a) : (tensor<2xf32>) -> tensor<2xf32>
    %1 = func.call @k(%0) : (tensor<2xf32>) -> tensor<2xf32>
    return %1 : tensor<2xf32>
  }
}"#;
        let text = private_functions(module, "cpu").unwrap();
        for want in [
            "func.func private @cpu(",
            "func.func private @cpu_k(",
            "func.func private @cpu_k_1(",
            "call @cpu_k_1(",
            "call @cpu_k(",
        ] {
            assert!(text.contains(want), "{want}:\n{text}");
        }
        assert!(!text.contains("@k(") && !text.contains("@main"), "{text}");
        // The functions embed in another module and parse there.
        let outer = format!("module {{\n{text}}}\n");
        assert!(private_functions(&outer, "x").is_err(), "no @main left");
        assert!(private_function(&outer.replace("@cpu(", "@main("), "y").is_ok());
        assert!(private_functions("module {}", "x").is_err());
    }
}
