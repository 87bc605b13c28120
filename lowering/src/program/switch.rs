//! A program per platform in one module, as `jax.export` serializes a
//! multi-platform function: `@main` takes the platform index first and
//! branches to the platform's program with `stablehlo.case`.

use melior::ir::operation::{OperationLike, OperationMutLike};
use melior::ir::{BlockLike, Module, Type};

use kernel_ir::{Array, DType, VerifiedKernel};

use super::{CallForm, private_kernel_function};

use crate::LoweringError;
use crate::mlir::{Ir, Mlir, Raw};

/// A program's argument or result: its name, shape and element type.
pub type Port = (String, Vec<usize>, DType);

/// What one platform runs.
#[derive(Clone, Debug)]
pub enum Branch {
    /// A kernel called as this form, built into the module.
    Kernel(VerifiedKernel, CallForm),
    /// The text of private functions: `@tessera_<platform>` with any
    /// functions it calls, as [`crate::private_functions`] gives them (a
    /// graph program exported for the platform).
    Functions(String),
}

/// The module `@name` whose `@main` takes the platform index (an `i32`,
/// `jax.global_constant = "_platform_index"`), then the inputs `ins` that
/// are not `fixed`, and returns `outs` (each with its `jax.result_info`
/// name), calling branch `i`'s `@tessera_<platform>` for platform index
/// `i`.
///
/// Each branch's `@tessera_<platform>` takes `ins` and returns `outs`
/// ([`Branch`]); `fixed` inputs are constants in `@main`, checked against
/// their ports.
pub fn platform_switch(
    name: &str,
    ins: &[Port],
    outs: &[Port],
    branches: &[(&str, Branch)],
    fixed: &[(usize, Array)],
) -> Result<String, LoweringError> {
    for (i, a) in fixed {
        match ins.get(*i) {
            Some((_, shape, d)) if shape.as_slice() == a.shape() && *d == a.dtype() => {}
            other => {
                return Err(LoweringError::Internal(format!(
                    "fixed input {i} of `{name}` is {:?}{:?}, its port {other:?}",
                    a.dtype(),
                    a.shape()
                )));
            }
        }
    }
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let module = Module::new(ir.loc());
    let is_fixed = |i: usize| fixed.iter().any(|(j, _)| *j == i);
    let in_types: Vec<Type> = ins.iter().map(|(_, s, d)| ir.tensor(s, *d)).collect();
    let out_types: Vec<Type> = outs.iter().map(|(_, s, d)| ir.tensor(s, *d)).collect();
    let mut main_in = vec![ir.tensor(&[], DType::I32)];
    main_in.extend(
        in_types
            .iter()
            .enumerate()
            .filter(|(i, _)| !is_fixed(*i))
            .map(|(_, t)| *t),
    );
    let block = ir.block(&main_in);
    let args = ir.args(&block);
    // Free inputs are the arguments after the index, in order; fixed ones
    // constants.
    let mut free = args[1..].iter();
    let mut call_args: Vec<Raw> = Vec::new();
    for (i, t) in in_types.iter().enumerate() {
        match fixed.iter().find(|(j, _)| *j == i) {
            Some((_, a)) => {
                let value = ir.parse_attr(&format!("{} : {t}", crate::mlir::dense_literal(a)))?;
                call_args.push(ir.op1(
                    &block,
                    "stablehlo.constant",
                    &[],
                    *t,
                    vec![("value", value)],
                )?);
            }
            None => call_args.push(
                *free
                    .next()
                    .ok_or_else(|| LoweringError::Internal("too few arguments".into()))?,
            ),
        }
    }
    let mut regions = Vec::new();
    for (platform, branch) in branches {
        let callee = format!("tessera_{platform}");
        match branch {
            Branch::Kernel(kernel, form) => {
                module
                    .body()
                    .append_operation(private_kernel_function(&ir, kernel, form, &callee)?);
            }
            Branch::Functions(text) => {
                let parsed =
                    Module::parse(&m.ctx, &format!("module {{\n{text}\n}}")).ok_or_else(|| {
                        LoweringError::Mlir {
                            what: "branch to embed",
                            message: m.diagnostics(),
                        }
                    })?;
                let mut op = parsed.body().first_operation();
                while let Some(o) = op {
                    module.body().append_operation((*o).clone());
                    op = o.next_in_block();
                }
            }
        }
        let branch = ir.block(&[]);
        let results = ir.op(
            &branch,
            "func.call",
            &call_args,
            &out_types,
            vec![("callee", ir.symbol(&callee))],
            Vec::new(),
        )?;
        ir.op(
            &branch,
            "stablehlo.return",
            &results,
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        regions.push(ir.region(branch));
    }
    let results = ir.op(
        &block,
        "stablehlo.case",
        &args[..1],
        &out_types,
        Vec::new(),
        regions,
    )?;
    ir.op(&block, "func.return", &results, &[], Vec::new(), Vec::new())?;
    let mut arg_attrs = vec![ir.dict(&[("jax.global_constant", ir.str_attr("_platform_index"))])];
    arg_attrs.extend((1..main_in.len()).map(|_| ir.dict(&[])));
    let res_attrs: Vec<_> = outs
        .iter()
        .map(|(n, _, _)| ir.dict(&[("jax.result_info", ir.str_attr(n))]))
        .collect();
    let mut main = ir.public_main(block, &main_in, &out_types)?;
    main.set_attribute("arg_attrs", ir.array_attr(&arg_attrs));
    main.set_attribute("res_attrs", ir.array_attr(&res_attrs));
    let first = module.body().first_operation();
    match first {
        Some(f) => {
            module.body().insert_operation_before(f, main);
        }
        None => {
            module.body().append_operation(main);
        }
    }
    let mut module = module;
    let mut op = module.as_operation_mut();
    op.set_attribute("sym_name", ir.str_attr(&format!("tessera_{name}")));
    op.set_attribute("mhlo.num_partitions", ir.i32_attr(1));
    op.set_attribute("mhlo.num_replicas", ir.i32_attr(1));
    m.verify(&module, "multi-platform module")?;
    Ok(module.as_operation().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: &str = "func.func private @tessera_cpu(%a: tensor<2xf32>, %b: tensor<f32>) -> tensor<2xf32> {\n  %0 = \"stablehlo.negate\"(%a) : (tensor<2xf32>) -> tensor<2xf32>\n  return %0 : tensor<2xf32>\n}";

    fn ports() -> (Vec<Port>, Vec<Port>) {
        (
            vec![
                ("x".into(), vec![2], DType::F32),
                ("s".into(), vec![], DType::F32),
            ],
            vec![("y".into(), vec![2], DType::F32)],
        )
    }

    /// `@main` takes the index and the free inputs, a fixed input is a
    /// constant, each branch is called from its region, and results keep
    /// their names.
    #[test]
    fn main_branches_on_the_platform_index() {
        let (ins, outs) = ports();
        let tpu = NEG.replace("tessera_cpu", "tessera_tpu");
        let s = Array::new(DType::F32, Vec::<usize>::new(), vec![3.0]).unwrap();
        let text = platform_switch(
            "neg",
            &ins,
            &outs,
            &[
                ("cpu", Branch::Functions(NEG.into())),
                ("tpu", Branch::Functions(tpu)),
            ],
            &[(1, s)],
        )
        .unwrap();
        for want in [
            "module @tessera_neg",
            "func.func public @main(%arg0: tensor<i32> {jax.global_constant = \"_platform_index\"}, %arg1: tensor<2xf32>)",
            "jax.result_info = \"y\"",
            "stablehlo.case",
            "call @tessera_cpu(",
            "call @tessera_tpu(",
            "func.func private @tessera_tpu(",
            "dense<3.000000e+00>",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
    }

    /// A fixed input that does not fit its port, a branch that does not
    /// parse, and one with the wrong signature are errors.
    #[test]
    fn bad_branches_and_fixed_inputs_are_refused() {
        let (ins, outs) = ports();
        let wrong = Array::new(DType::F32, vec![3usize], vec![0.0; 3]).unwrap();
        let cpu = || vec![("cpu", Branch::Functions(NEG.into()))];
        assert!(platform_switch("n", &ins, &outs, &cpu(), &[(1, wrong)]).is_err());
        assert!(
            platform_switch(
                "n",
                &ins,
                &outs,
                &[("cpu", Branch::Functions("nonsense".into()))],
                &[]
            )
            .is_err()
        );
        let other = NEG.replace("tensor<f32>", "tensor<i32>");
        let e = platform_switch("n", &ins, &outs, &[("cpu", Branch::Functions(other))], &[])
            .unwrap_err();
        assert!(matches!(e, LoweringError::Mlir { .. }), "{e}");
    }
}
