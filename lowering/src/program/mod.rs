//! StableHLO programs that call kernels: the graph runtime's subgraphs
//! (and their exports) and the multi-platform module of an exported
//! artifact ([`platform_switch`]) are built here, with the op helpers the
//! decomposed lowering uses, so StableHLO is spelled in one crate.
//!
//! A kernel call is built straight into the program as a private function
//! (`kernel_N`) in the form the caller names ([`CallForm`]): nothing is
//! printed and parsed again on the way. The program is verified by MLIR
//! and printed once; the text is deterministic for the same sequence of
//! builder calls, which is what the compile cache keys on.
//!
//! ```
//! use kernel_ir::{BinaryOp, DType};
//! use lowering::program::program;
//!
//! let text = program("example", 1, |p| {
//!     let x = p.param(&[4], DType::F32)?;
//!     let two = p.constant(2.0, &[4], DType::F32)?;
//!     Ok::<_, lowering::LoweringError>(vec![p.binary(BinaryOp::Mul, x, two)?])
//! })?;
//! assert!(text.contains("stablehlo.multiply"));
//! # Ok::<(), lowering::LoweringError>(())
//! ```

mod switch;

pub use switch::{Branch, Port, platform_switch};

use melior::ir::operation::OperationMutLike;
use melior::ir::{Block, BlockLike, Module, Operation, Type, ValueLike};

use kernel_ir::{Array, BinaryOp, CompareOp, DType, DotDims, ReduceOp, UnaryOp, VerifiedKernel};

use crate::LoweringError;
use crate::custom_call::{CallTarget, MosaicBody, call_function};
use crate::decomposed::Spmd;
use crate::hlo::Hlo;
use crate::mlir::{Ir, Mlir, Raw};
use crate::op_names;

/// How a kernel call is built into a program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallForm {
    /// The native host kernel registered under `key`, through XLA's FFI
    /// (`@tessera_host_kernel`).
    Host {
        /// The registry key.
        key: String,
    },
    /// `stablehlo.custom_call @tpu_custom_call` with the Mosaic body.
    TpuCustomCall,
    /// Plain StableHLO, the grid as a loop, devices numbered as `Spmd`
    /// says.
    Decomposed(Spmd),
    /// XLA's Triton call with this TTIR (Triton's front end's output for
    /// [`crate::triton()`]'s program).
    Triton {
        /// The TTIR module, as text.
        ttir: String,
    },
}

/// A value of a program under construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Value(usize);

/// The builder [`program`] hands its closure: `@main`'s parameters, its
/// ops, the kernel functions it calls.
pub struct ProgramBuilder<'a, 'c> {
    hlo: Hlo<'a, 'c>,
    block: Block<'c>,
    values: Vec<(Raw, Vec<usize>, DType)>,
    inputs: Vec<Type<'c>>,
    functions: Vec<Operation<'c>>,
    replicas: usize,
}

/// Builds the program `@name`: `build` adds parameters and ops and returns
/// the values `@main` returns; `replicas` is the number of devices it runs
/// on (collectives span all of them). Returns the verified module, printed.
pub fn program<E: From<LoweringError>>(
    name: &str,
    replicas: usize,
    build: impl FnOnce(&mut ProgramBuilder<'_, '_>) -> Result<Vec<Value>, E>,
) -> Result<String, E> {
    let m = Mlir::new();
    let ir = Ir::new(&m.ctx, "");
    let mut p = ProgramBuilder {
        hlo: Hlo { ir: &ir },
        block: ir.block(&[]),
        values: Vec::new(),
        inputs: Vec::new(),
        functions: Vec::new(),
        replicas,
    };
    let outputs = build(&mut p)?;
    Ok(p.finish(&m, name, &outputs)?)
}

impl<'c> ProgramBuilder<'_, 'c> {
    fn ir(&self) -> &Ir<'c> {
        self.hlo.ir
    }

    fn value(&mut self, raw: Raw, shape: &[usize], d: DType) -> Value {
        self.values.push((raw, shape.to_vec(), d));
        Value(self.values.len() - 1)
    }

    fn get(&self, v: Value) -> Result<&(Raw, Vec<usize>, DType), LoweringError> {
        self.values
            .get(v.0)
            .ok_or_else(|| LoweringError::Internal(format!("value {} of another program", v.0)))
    }

    fn raw(&self, v: Value) -> Result<Raw, LoweringError> {
        Ok(self.get(v)?.0)
    }

    /// The shape of `v`.
    pub fn shape(&self, v: Value) -> Result<Vec<usize>, LoweringError> {
        Ok(self.get(v)?.1.clone())
    }

    /// The element type of `v`.
    pub fn dtype(&self, v: Value) -> Result<DType, LoweringError> {
        Ok(self.get(v)?.2)
    }

    fn op(
        &mut self,
        name: &str,
        operands: &[Value],
        shape: &[usize],
        d: DType,
        attrs: crate::mlir::Attrs<'c>,
    ) -> Result<Value, LoweringError> {
        let raws: Vec<Raw> = operands
            .iter()
            .map(|&v| self.raw(v))
            .collect::<Result<_, _>>()?;
        let raw = self
            .ir()
            .op1(&self.block, name, &raws, self.hlo.t(shape, d), attrs)?;
        Ok(self.value(raw, shape, d))
    }

    /// The next parameter of `@main`.
    pub fn param(&mut self, shape: &[usize], d: DType) -> Result<Value, LoweringError> {
        let ty = self.hlo.t(shape, d);
        self.inputs.push(ty);
        let raw = self.block.add_argument(ty, self.ir().loc()).to_raw();
        Ok(self.value(raw, shape, d))
    }

    /// `v` in every element.
    pub fn constant(&mut self, v: f64, shape: &[usize], d: DType) -> Result<Value, LoweringError> {
        let raw = self.hlo.splat(&self.block, v, d, shape)?;
        Ok(self.value(raw, shape, d))
    }

    /// The array `a` as a constant.
    pub fn literal(&mut self, a: &Array) -> Result<Value, LoweringError> {
        let ty = self.hlo.t(a.shape(), a.dtype());
        let attr = self
            .ir()
            .parse_attr(&format!("{} : {ty}", crate::mlir::dense_literal(a)))?;
        self.op(
            "stablehlo.constant",
            &[],
            a.shape(),
            a.dtype(),
            vec![("value", attr)],
        )
    }

    /// Each element's index along `axis`.
    pub fn iota(&mut self, axis: usize, shape: &[usize], d: DType) -> Result<Value, LoweringError> {
        let attr = self.ir().i64_attr(axis as i64);
        self.op(
            "stablehlo.iota",
            &[],
            shape,
            d,
            vec![("iota_dimension", attr)],
        )
    }

    /// `u` of each element.
    pub fn unary(&mut self, u: UnaryOp, x: Value) -> Result<Value, LoweringError> {
        let (shape, d) = (self.shape(x)?, self.dtype(x)?);
        if let Some(name) = op_names::unary(u) {
            return self.op(name, &[x], &shape, d, Vec::new());
        }
        match u {
            // StableHLO has no base-2 exponential: e^(x ln 2).
            UnaryOp::Exp2 => {
                let ln2 = self.constant(std::f64::consts::LN_2, &shape, d)?;
                let y = self.binary(BinaryOp::Mul, x, ln2)?;
                self.op("stablehlo.exponential", &[y], &shape, d, Vec::new())
            }
            other => Err(LoweringError::Internal(format!(
                "{other:?} has no StableHLO op and no expansion in programs"
            ))),
        }
    }

    /// `b` of each pair of elements (same shapes).
    pub fn binary(&mut self, b: BinaryOp, x: Value, y: Value) -> Result<Value, LoweringError> {
        let (shape, d) = (self.shape(x)?, self.dtype(x)?);
        self.op(op_names::binary(b), &[x, y], &shape, d, Vec::new())
    }

    /// `c` of each pair of elements: a bool array.
    pub fn compare(&mut self, c: CompareOp, x: Value, y: Value) -> Result<Value, LoweringError> {
        let (shape, d) = (self.shape(x)?, self.dtype(x)?);
        let raw = self
            .hlo
            .compare(&self.block, c, self.raw(x)?, self.raw(y)?, d, &shape)?;
        Ok(self.value(raw, &shape, DType::Bool))
    }

    /// `x` where `cond`, else `y`.
    pub fn select(&mut self, cond: Value, x: Value, y: Value) -> Result<Value, LoweringError> {
        let (shape, d) = (self.shape(x)?, self.dtype(x)?);
        self.op("stablehlo.select", &[cond, x, y], &shape, d, Vec::new())
    }

    /// `x` converted to `d`.
    pub fn convert(&mut self, x: Value, d: DType) -> Result<Value, LoweringError> {
        let shape = self.shape(x)?;
        self.op("stablehlo.convert", &[x], &shape, d, Vec::new())
    }

    /// `x` in `shape` (as many elements).
    pub fn reshape(&mut self, x: Value, shape: &[usize]) -> Result<Value, LoweringError> {
        let d = self.dtype(x)?;
        self.op("stablehlo.reshape", &[x], shape, d, Vec::new())
    }

    /// `x` with its dims permuted: result dim `i` is `x`'s dim `perm[i]`.
    pub fn transpose(&mut self, x: Value, perm: &[usize]) -> Result<Value, LoweringError> {
        let (from, d) = (self.shape(x)?, self.dtype(x)?);
        let shape: Vec<usize> = perm.iter().map(|&p| from[p]).collect();
        let attr = self.ir().i64_array(&i64s(perm));
        self.op(
            "stablehlo.transpose",
            &[x],
            &shape,
            d,
            vec![("permutation", attr)],
        )
    }

    /// `x` broadcast to `shape`, its dim `i` becoming dim `dims[i]`.
    pub fn broadcast(
        &mut self,
        x: Value,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<Value, LoweringError> {
        let d = self.dtype(x)?;
        let attr = self.ir().i64_array(&i64s(dims));
        self.op(
            "stablehlo.broadcast_in_dim",
            &[x],
            shape,
            d,
            vec![("broadcast_dimensions", attr)],
        )
    }

    /// Elements `start..limit` of `x` along every dim.
    pub fn slice(
        &mut self,
        x: Value,
        start: &[usize],
        limit: &[usize],
    ) -> Result<Value, LoweringError> {
        let sizes: Vec<usize> = limit.iter().zip(start).map(|(l, s)| l - s).collect();
        let (raw, d) = (self.raw(x)?, self.dtype(x)?);
        let out = self.hlo.slice(&self.block, raw, d, &i64s(start), &sizes)?;
        Ok(self.value(out, &sizes, d))
    }

    /// `xs` joined along `axis`.
    pub fn concat(&mut self, xs: &[Value], axis: usize) -> Result<Value, LoweringError> {
        let first = xs
            .first()
            .ok_or_else(|| LoweringError::Internal("concat of nothing".into()))?;
        let (mut shape, d) = (self.shape(*first)?, self.dtype(*first)?);
        shape[axis] = xs
            .iter()
            .map(|&x| self.shape(x).map(|s| s[axis]))
            .sum::<Result<usize, _>>()?;
        let attr = self.ir().i64_attr(axis as i64);
        self.op(
            "stablehlo.concatenate",
            xs,
            &shape,
            d,
            vec![("dimension", attr)],
        )
    }

    /// `x` reduced over `axes` with `r` (the dims kept in order).
    pub fn reduce(
        &mut self,
        x: Value,
        r: ReduceOp,
        axes: &[usize],
    ) -> Result<Value, LoweringError> {
        let (from, d) = (self.shape(x)?, self.dtype(x)?);
        let shape: Vec<usize> = (0..from.len())
            .filter(|i| !axes.contains(i))
            .map(|i| from[i])
            .collect();
        let raw = self
            .hlo
            .reduce(&self.block, self.raw(x)?, r, axes, &shape, d, false)?;
        Ok(self.value(raw, &shape, d))
    }

    /// The dot product of `x` and `y` with `dims`, of `shape` and `d`.
    pub fn dot(
        &mut self,
        x: Value,
        y: Value,
        dims: &DotDims,
        shape: &[usize],
        d: DType,
    ) -> Result<Value, LoweringError> {
        let raw = self
            .hlo
            .dot_general(&self.block, self.raw(x)?, self.raw(y)?, dims, shape, d)?;
        Ok(self.value(raw, shape, d))
    }

    /// `x` with positions at or past the valid length `len` (an `i32[1]`)
    /// along `axis` replaced by `fill`.
    pub fn mask(
        &mut self,
        x: Value,
        axis: usize,
        len: Value,
        fill: f64,
    ) -> Result<Value, LoweringError> {
        let (shape, d) = (self.shape(x)?, self.dtype(x)?);
        let index = self.iota(axis, &shape, DType::I32)?;
        let len = self.reshape(len, &[])?;
        let len = self.broadcast(len, &shape, &[])?;
        let keep = self.compare(CompareOp::Lt, index, len)?;
        let fill = self.constant(fill, &shape, d)?;
        self.select(keep, x, fill)
    }

    /// The sum of `x` over every device.
    pub fn all_reduce(&mut self, x: Value) -> Result<Value, LoweringError> {
        let shape = self.shape(x)?;
        self.summing("stablehlo.all_reduce", x, &shape, Vec::new())
    }

    /// The sum of `x` over every device, each keeping its part along
    /// `axis`.
    pub fn reduce_scatter(&mut self, x: Value, axis: usize) -> Result<Value, LoweringError> {
        let mut shape = self.shape(x)?;
        shape[axis] /= self.replicas.max(1);
        let attr = self.ir().i64_attr(axis as i64);
        self.summing(
            "stablehlo.reduce_scatter",
            x,
            &shape,
            vec![("scatter_dimension", attr)],
        )
    }

    /// Every device's `x` joined along `axis`.
    pub fn all_gather(&mut self, x: Value, axis: usize) -> Result<Value, LoweringError> {
        let (mut shape, d) = (self.shape(x)?, self.dtype(x)?);
        shape[axis] *= self.replicas;
        let mut attrs = vec![("all_gather_dim", self.ir().i64_attr(axis as i64))];
        attrs.push(("replica_groups", self.replica_groups()?));
        self.op("stablehlo.all_gather", &[x], &shape, d, attrs)
    }

    fn replica_groups(&self) -> Result<melior::ir::Attribute<'c>, LoweringError> {
        let ids: Vec<String> = (0..self.replicas).map(|i| i.to_string()).collect();
        self.ir().parse_attr(&format!(
            "dense<[[{}]]> : tensor<1x{}xi64>",
            ids.join(", "),
            self.replicas
        ))
    }

    /// A collective that sums over every device.
    fn summing(
        &mut self,
        name: &str,
        x: Value,
        shape: &[usize],
        mut attrs: crate::mlir::Attrs<'c>,
    ) -> Result<Value, LoweringError> {
        let d = self.dtype(x)?;
        let ir = self.hlo.ir;
        let inner = self.hlo.combiner(ReduceOp::Sum, d, false)?;
        attrs.push(("replica_groups", self.replica_groups()?));
        let raw = ir
            .op(
                &self.block,
                name,
                &[self.raw(x)?],
                &[self.hlo.t(shape, d)],
                attrs,
                vec![ir.region(inner)],
            )?
            .first()
            .copied()
            .ok_or_else(|| LoweringError::Internal(format!("{name} made no result")))?;
        Ok(self.value(raw, shape, d))
    }

    /// Calls `kernel` on `args` (its prefetch operands, then its inputs),
    /// built as `form` into a private function of this program; returns
    /// its outputs.
    pub fn call_kernel(
        &mut self,
        kernel: &VerifiedKernel,
        form: &CallForm,
        args: &[Value],
    ) -> Result<Vec<Value>, LoweringError> {
        let ir = self.hlo.ir;
        let name = format!("kernel_{}", self.functions.len());
        let func = private_kernel_function(ir, kernel, form, &name)?;
        self.functions.push(func);
        let outs: Vec<(Vec<usize>, DType)> = kernel
            .outputs()
            .map(|o| (o.shape.clone(), o.dtype))
            .collect();
        let types: Vec<Type<'c>> = outs.iter().map(|(s, d)| self.hlo.t(s, *d)).collect();
        let raws: Vec<Raw> = args
            .iter()
            .map(|&v| self.raw(v))
            .collect::<Result<_, _>>()?;
        let results = ir.op(
            &self.block,
            "func.call",
            &raws,
            &types,
            vec![("callee", ir.symbol(&name))],
            Vec::new(),
        )?;
        Ok(results
            .into_iter()
            .zip(&outs)
            .map(|(r, (s, d))| self.value(r, s, *d))
            .collect())
    }

    fn finish(self, m: &Mlir, name: &str, outputs: &[Value]) -> Result<String, LoweringError> {
        let ir = self.hlo.ir;
        let mut rets = Vec::new();
        let mut types = Vec::new();
        for &o in outputs {
            let (raw, shape, d) = self.get(o)?;
            rets.push(*raw);
            types.push(self.hlo.t(shape, *d));
        }
        ir.op(
            &self.block,
            "func.return",
            &rets,
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        let main = ir.public_main(self.block, &self.inputs, &types)?;
        let mut module = Module::new(ir.loc());
        module.body().append_operation(main);
        for f in self.functions {
            module.body().append_operation(f);
        }
        let mut op = module.as_operation_mut();
        op.set_attribute("sym_name", ir.str_attr(name));
        op.set_attribute("mhlo.num_partitions", ir.i32_attr(1));
        op.set_attribute("mhlo.num_replicas", ir.i32_attr(self.replicas as i64));
        m.verify(&module, "program")?;
        Ok(module.as_operation().to_string())
    }
}

/// `kernel` called as `form`, as the private function `@name`.
pub(crate) fn private_kernel_function<'c>(
    ir: &Ir<'c>,
    kernel: &VerifiedKernel,
    form: &CallForm,
    name: &str,
) -> Result<Operation<'c>, LoweringError> {
    let mut func = match form {
        CallForm::Host { key } => call_function(ir, kernel, CallTarget::Host(key))?.0,
        CallForm::TpuCustomCall => {
            crate::tpu_platform(kernel, "tpu_custom_call")?;
            let body = MosaicBody::of(kernel)?;
            call_function(ir, kernel, CallTarget::Tpu(&body.backend_config))?.0
        }
        CallForm::Decomposed(spmd) => {
            crate::decomposed::main_function(ir, &kernel.with_synchronous_copies(), *spmd)?
        }
        CallForm::Triton { ttir } => {
            let program = crate::triton(kernel)?;
            call_function(ir, kernel, CallTarget::Triton(&program, ttir))?.0
        }
    };
    func.set_attribute("sym_name", ir.str_attr(name));
    func.set_attribute("sym_visibility", ir.str_attr("private"));
    Ok(func)
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_ir::prelude::*;

    fn scale() -> VerifiedKernel {
        let mut k = KernelBuilder::new("scale");
        k.grid([2], [Parallel]);
        let x = k.input("x", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
        let o = k.output("o", F32, [16, 128]).block([8, 128], |[i]| (i, 0));
        o.store(.., x.load(..) * 2.0);
        k.build().unwrap()
    }

    /// Every form builds the kernel into the program as a private function
    /// that `@main` calls; two calls are two functions, and the program
    /// verifies.
    #[test]
    fn kernel_calls_are_private_functions_of_the_program() {
        let k = scale();
        for form in [
            CallForm::Host {
                key: "scale-1".into(),
            },
            CallForm::Decomposed(Spmd::Replicas),
            CallForm::TpuCustomCall,
        ] {
            let text = program("p", 1, |p| {
                let x = p.param(&[16, 128], DType::F32)?;
                let y = p.call_kernel(&k, &form, &[x])?;
                let z = p.call_kernel(&k, &form, &y)?;
                Ok::<_, LoweringError>(z)
            })
            .unwrap();
            for want in [
                "func.func private @kernel_0(",
                "func.func private @kernel_1(",
                "call @kernel_0(",
                "call @kernel_1(",
                "mhlo.num_replicas = 1",
            ] {
                assert!(text.contains(want), "{form:?}: {want}\n{text}");
            }
            assert_eq!(text.matches("func.func public @main").count(), 1);
        }
    }

    /// Values carry their types: a reduction drops its axes, a
    /// comparison is bool, a transpose permutes, a value of another
    /// program is an error rather than a panic.
    #[test]
    fn values_carry_their_shapes_and_foreign_values_are_refused() {
        let text = program("p", 2, |p| {
            let x = p.param(&[4, 8], DType::BF16)?;
            let s = p.reduce(x, ReduceOp::Sum, &[1])?;
            assert_eq!(p.shape(s)?, vec![4]);
            let t = p.transpose(x, &[1, 0])?;
            assert_eq!(p.shape(t)?, vec![8, 4]);
            let c = p.compare(CompareOp::Lt, x, x)?;
            assert_eq!(p.dtype(c)?, DType::Bool);
            let g = p.all_gather(s, 0)?;
            assert_eq!(p.shape(g)?, vec![8]);
            assert!(p.unary(UnaryOp::Exp, Value(999)).is_err());
            Ok::<_, LoweringError>(vec![g, t])
        })
        .unwrap();
        assert!(text.contains("stablehlo.all_gather") && text.contains("mhlo.num_replicas = 2"));
    }
}
