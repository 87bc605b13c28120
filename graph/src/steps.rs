//! A recorded program as *steps*: its kernel calls as Triton programs and
//! the ops between them as plain array ops, in order. What a host that
//! launches Triton programs itself (PyTorch, through `tessera_torch`) runs
//! instead of the StableHLO module of [`Runtime::export`]: the same
//! program, op for op, with the same kernels. The JSON form is
//! [`STEPS_FORMAT`]'s doc.

use std::collections::HashMap;
use std::sync::Arc;

use kernel_ir::VerifiedKernel;
use serde_json::{Value, json};

use super::lower::topo_order;
use super::node::{Node, Op, State};
use super::{Runtime, RuntimeError, Tensor};
use runtime::triton::{dtype_name, program_json};

/// The `format` of a steps program.
///
/// The JSON form (version [`STEPS_VERSION`]):
///
/// ```text
/// {"format": "tessera-triton-steps", "format_version": 2,
///  "inputs":   [{"dtype": "bfloat16", "shape": [..]}, ..],   values 0..n
///  "programs": [<runtime::triton::program_json>, ..],
///  "steps":    [{"op": .., "args": [value, ..], "out": [value, ..], ..}, ..],
///  "outputs":  [value, ..]}
/// ```
///
/// Values are numbered: the inputs first, then each step's results in
/// order. Step ops: `kernel` (`program`: an index into `programs`; args in
/// the kernel's argument order, one result per kernel output), `constant`
/// (`value`), `literal` (`data`: the array's little-endian bytes in hex),
/// `iota` (`dim`), `unary` / `binary` / `compare` (`name`: the op's name in
/// the kernel IR's text form, e.g. `exp`, `sub`, `lt`), `select`, `convert`,
/// `reshape`, `transpose` (`perm`), `broadcast` (`dims`: output dim of each
/// input dim), `slice` (`start`, `limit`), `concat` (`axis`) and `reduce`
/// (`name`, `axes`, `mean`). Every step names its result's `dtype` and
/// `shape`. Dots, softmax, padded (bucketed) reductions and collectives
/// have no step form: exporting a program with one is an error that names
/// it.
pub const STEPS_FORMAT: &str = "tessera-triton-steps";

/// Its version (2: every program carries its fields' digests).
pub const STEPS_VERSION: u32 = 2;

impl Runtime {
    /// The program computing `outputs` from `inputs` as steps
    /// ([`STEPS_FORMAT`]): every kernel call a Triton program
    /// ([`lowering::triton()`](fn@lowering::triton)), every other op a
    /// plain array op. `inputs` must be every tensor the outputs read.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let rt = graph::Runtime::cpu()?;
    /// let x = rt.tensor(&kernel_ir::Array::from_elems([4], &[1.0f32, 2.0, 3.0, 4.0])?)?;
    /// let y = x.exp()?.sub(&x)?;
    /// let steps = rt.export_steps(&[&x], &[&y])?;
    /// assert_eq!(steps["steps"].as_array().unwrap().len(), 2);
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn export_steps(
        &self,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
    ) -> Result<Value, RuntimeError> {
        let loc = std::panic::Location::caller().to_string();
        self.sync(inputs)?;
        let outs: Vec<Arc<Node>> = outputs.iter().map(|t| t.node.clone()).collect();
        let mut w = Writer::default();
        for t in inputs {
            let n = &t.node;
            w.input(n);
        }
        let record = |message: String| RuntimeError::Record {
            message,
            loc: loc.clone(),
        };
        let order = topo_order(&outs)?;
        for (n, op, ins) in &order {
            for i in ins {
                if !w.values.contains_key(&i.id) && matches!(&*i.lock(), State::Ready(_)) {
                    return Err(record(format!(
                        "the outputs read a tensor (shape {:?}) that is not among the inputs; pass every tensor they read",
                        i.shape
                    )));
                }
            }
            w.node(n, op, ins).map_err(record)?;
        }
        let mut rets = Vec::new();
        for o in &outs {
            rets.push(w.value(o).map_err(record)?);
        }
        Ok(w.finish(rets))
    }
}

/// The steps program of one call of `kernel`: its Triton program on all
/// its arguments (scalar prefetch, then inputs), returning its outputs
/// (an exported forward's `triton.json`).
pub fn kernel_steps(kernel: &VerifiedKernel) -> Result<Value, lowering::LoweringError> {
    let mut w = Writer::default();
    let args: Vec<usize> = kernel
        .arguments()
        .map(|a| w.new_input(a.dtype, a.shape))
        .collect();
    let first = w.kernel_step(kernel, args)?;
    let count = kernel.outputs().count();
    Ok(w.finish((first..first + count).collect()))
}

#[derive(Default)]
struct Writer {
    inputs: Vec<Value>,
    programs: Vec<Value>,
    steps: Vec<Value>,
    /// Node id → value number.
    values: HashMap<u64, usize>,
    next: usize,
    /// Kernel call → its first result's value number.
    calls: HashMap<usize, usize>,
}

impl Writer {
    fn input(&mut self, n: &Node) {
        if self.values.contains_key(&n.id) {
            return;
        }
        let v = self.new_input(n.dtype, &n.shape);
        self.values.insert(n.id, v);
    }

    /// A new input value of this dtype and shape.
    fn new_input(&mut self, dtype: kernel_ir::DType, shape: &[usize]) -> usize {
        self.inputs
            .push(json!({"dtype": dtype_name(dtype), "shape": shape}));
        self.next += 1;
        self.next - 1
    }

    /// A call of `kernel` on `args`: its first result's value number (the
    /// others follow).
    fn kernel_step(
        &mut self,
        kernel: &VerifiedKernel,
        args: Vec<usize>,
    ) -> Result<usize, lowering::LoweringError> {
        let program = lowering::triton(kernel)?;
        self.programs.push(program_json(&program));
        let count = kernel.outputs().count();
        let first = self.next;
        self.next += count;
        self.steps.push(json!({
            "op": "kernel",
            "program": self.programs.len() - 1,
            "args": args,
            "out": (first..first + count).collect::<Vec<_>>(),
            "kernel": kernel.name,
        }));
        Ok(first)
    }

    /// The program returning `outputs`.
    fn finish(self, outputs: Vec<usize>) -> Value {
        json!({
            "format": STEPS_FORMAT,
            "format_version": STEPS_VERSION,
            "inputs": self.inputs,
            "programs": self.programs,
            "steps": self.steps,
            "outputs": outputs,
        })
    }

    fn value(&self, n: &Node) -> Result<usize, String> {
        self.values
            .get(&n.id)
            .copied()
            .ok_or_else(|| format!("a value (shape {:?}) used before it is computed", n.shape))
    }

    fn node(&mut self, n: &Node, op: &Op, ins: &[Arc<Node>]) -> Result<(), String> {
        let args: Vec<usize> = ins
            .iter()
            .map(|i| self.value(i))
            .collect::<Result<_, _>>()?;
        if let Op::Kernel { call, output } = op {
            let key = Arc::as_ptr(call) as usize;
            let first = match self.calls.get(&key) {
                Some(&f) => f,
                None => {
                    let first = self
                        .kernel_step(&call.kernel, args)
                        .map_err(|e| format!("kernel `{}`: {e}", call.kernel.name))?;
                    self.calls.insert(key, first);
                    first
                }
            };
            self.values.insert(n.id, first + output);
            return Ok(());
        }
        let mut step = match op {
            Op::Constant(v) => json!({"op": "constant", "value": v}),
            Op::Literal(a) => json!({"op": "literal", "data": kernel_ir::hex(&a.to_le_bytes())}),
            Op::Iota(d) => json!({"op": "iota", "dim": d}),
            Op::Unary(u) => json!({"op": "unary", "name": u.name()}),
            Op::Binary(b) => json!({"op": "binary", "name": b.name()}),
            Op::Compare(c) => json!({"op": "compare", "name": c.name()}),
            Op::Select => json!({"op": "select"}),
            Op::Convert => json!({"op": "convert"}),
            Op::Reshape => json!({"op": "reshape"}),
            Op::Transpose(p) => json!({"op": "transpose", "perm": p}),
            Op::Broadcast(dims) => json!({"op": "broadcast", "dims": dims}),
            Op::Slice { start, limit } => json!({"op": "slice", "start": start, "limit": limit}),
            Op::Concat(axis) => json!({"op": "concat", "axis": axis}),
            Op::Reduce {
                op,
                axes,
                mean,
                masked,
            } if masked.is_empty() => {
                json!({"op": "reduce", "name": op.name(), "axes": axes, "mean": mean})
            }
            other => {
                return Err(format!(
                    "`{}` has no steps form (kernel calls and element, shape and plain reduce ops do); keep it inside a kernel",
                    other.name()
                ));
            }
        };
        step["args"] = json!(args);
        step["out"] = json!([self.next]);
        step["dtype"] = json!(dtype_name(n.dtype));
        step["shape"] = json!(n.shape);
        self.steps.push(step);
        self.values.insert(n.id, self.next);
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernel_ir::Array;

    #[test]
    fn element_ops_become_numbered_steps_after_the_inputs() {
        let rt = Runtime::cpu().unwrap();
        let x = rt
            .tensor(&Array::from_elems([2, 2], &[1.0f32, 2.0, 3.0, 4.0]).unwrap())
            .unwrap();
        let y = rt
            .tensor(&Array::from_elems([2, 2], &[0.5f32; 4]).unwrap())
            .unwrap();
        let z = x.sub(&y).unwrap().exp().unwrap();
        let s = rt.export_steps(&[&x, &y], &[&z]).unwrap();
        assert_eq!(s["inputs"].as_array().unwrap().len(), 2);
        let steps = s["steps"].as_array().unwrap();
        assert_eq!(steps[0]["op"], "binary");
        assert_eq!(steps[0]["name"], "sub");
        assert_eq!(steps[0]["args"], json!([0, 1]));
        assert_eq!(steps[1]["name"], "exp");
        assert_eq!(steps[1]["args"], json!([2]));
        assert_eq!(s["outputs"], json!([3]));
    }

    #[test]
    fn a_tensor_read_but_not_given_is_an_error_naming_the_fix() {
        let rt = Runtime::cpu().unwrap();
        let x = rt
            .tensor(&Array::from_elems([2], &[1.0f32, 2.0]).unwrap())
            .unwrap();
        let y = rt
            .tensor(&Array::from_elems([2], &[1.0f32, 2.0]).unwrap())
            .unwrap();
        let z = x.add(&y).unwrap();
        let e = rt.export_steps(&[&x], &[&z]).unwrap_err().to_string();
        assert!(e.contains("pass every tensor they read"), "{e}");
    }
}
