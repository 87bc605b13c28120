//! Index-map expressions as i32 arithmetic in MLIR, for the transform
//! functions of a Mosaic kernel's windows and for the kernel body (an
//! element window's rotation recomputes its map there).

use melior::ir::Block;

use kernel_ir::{IndexExpr, IndexOp};

use crate::LoweringError;
use crate::mlir::{Ir, Raw};

/// Emits an index expression as i32 arithmetic.
pub(crate) fn index_expr<'c>(
    ir: &Ir<'c>,
    block: &Block<'c>,
    e: &IndexExpr,
    grid: &[Raw],
    prefetch: &[Raw],
) -> Result<Raw, LoweringError> {
    let i32t = ir.i32();
    let c = |v: i64| {
        ir.op1(
            block,
            "arith.constant",
            &[],
            i32t,
            vec![("value", ir.i32_attr(v))],
        )
    };
    Ok(match e {
        IndexExpr::Const(v) => c(*v)?,
        IndexExpr::Grid(d) => *grid
            .get(*d)
            .ok_or_else(|| LoweringError::Internal(format!("grid dim {d}")))?,
        IndexExpr::Prefetch { operand, at } => {
            let mut idx = Vec::new();
            for a in at {
                let v = index_expr(ir, block, a, grid, prefetch)?;
                idx.push(ir.op1(block, "arith.index_cast", &[v], ir.index(), Vec::new())?);
            }
            let base = *prefetch
                .get(*operand)
                .ok_or_else(|| LoweringError::Internal(format!("prefetch {operand}")))?;
            let mut ops = vec![base];
            ops.extend(idx);
            ir.op1(block, "memref.load", &ops, i32t, Vec::new())?
        }
        IndexExpr::Binary(op, a, b) => {
            let x = index_expr(ir, block, a, grid, prefetch)?;
            let y = index_expr(ir, block, b, grid, prefetch)?;
            let bin = |name: &str, x: Raw, y: Raw| ir.op1(block, name, &[x, y], i32t, Vec::new());
            // Mosaic legalizes no `arith.floordivsi` (nor a signed modulo
            // with the divisor's sign), so both are built from the
            // truncating `divsi`/`remsi`: when the remainder is non-zero
            // and its sign differs from the divisor's, floor is one below
            // the truncated quotient and the remainder one divisor above.
            let floor_fix = || -> Result<(Raw, Raw), LoweringError> {
                let r = bin("arith.remsi", x, y)?;
                let zero = c(0)?;
                let i1 = ir.i1();
                let cmp = |p: i64, a: Raw, b: Raw| {
                    ir.op1(
                        block,
                        "arith.cmpi",
                        &[a, b],
                        i1,
                        vec![("predicate", ir.i64_attr(p))],
                    )
                };
                // A constant divisor (the usual case) has a known sign.
                let fix = match **b {
                    IndexExpr::Const(d) if d > 0 => cmp(2, r, zero)?,
                    IndexExpr::Const(d) if d < 0 => cmp(4, r, zero)?,
                    _ => {
                        let nonzero = cmp(1, r, zero)?;
                        let r_neg = cmp(2, r, zero)?;
                        let y_neg = cmp(2, y, zero)?;
                        let differ =
                            ir.op1(block, "arith.xori", &[r_neg, y_neg], i1, Vec::new())?;
                        ir.op1(block, "arith.andi", &[differ, nonzero], i1, Vec::new())?
                    }
                };
                Ok((r, fix))
            };
            match op {
                IndexOp::Add => bin("arith.addi", x, y)?,
                IndexOp::Sub => bin("arith.subi", x, y)?,
                IndexOp::Mul => bin("arith.muli", x, y)?,
                IndexOp::FloorDiv => {
                    let q = bin("arith.divsi", x, y)?;
                    let (_, fix) = floor_fix()?;
                    let one = c(1)?;
                    let below = bin("arith.subi", q, one)?;
                    ir.op1(block, "arith.select", &[fix, below, q], i32t, Vec::new())?
                }
                IndexOp::Min => bin("arith.minsi", x, y)?,
                IndexOp::Max => bin("arith.maxsi", x, y)?,
                IndexOp::Rem => {
                    let (r, fix) = floor_fix()?;
                    let shifted = bin("arith.addi", r, y)?;
                    ir.op1(block, "arith.select", &[fix, shifted, r], i32t, Vec::new())?
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;

    use kernel_ir::{IndexExpr, IndexOp};
    use melior::ir::{BlockLike, Module};

    use super::index_expr;
    use crate::host::jit::{Engine, lower_to_llvm};
    use crate::mlir::{Ir, Mlir};

    /// JIT-compiles `f(a, b) = op(a, b)` as `index_expr` emits it, or
    /// `op(a, d)` for a constant divisor `d`.
    fn compiled(m: &Mlir, op: IndexOp, divisor: Option<i64>) -> Engine {
        let ir = Ir::new(&m.ctx, "");
        let i32t = ir.i32();
        let block = ir.block(&[i32t, i32t]);
        let args = ir.args(&block);
        let e = IndexExpr::Binary(
            op,
            Box::new(IndexExpr::Grid(0)),
            Box::new(divisor.map_or(IndexExpr::Grid(1), IndexExpr::Const)),
        );
        let r = index_expr(&ir, &block, &e, &args, &[]).unwrap();
        ir.op(&block, "func.return", &[r], &[], Vec::new(), Vec::new())
            .unwrap();
        let f = ir
            .build(
                "func.func",
                &[],
                &[],
                vec![
                    ("sym_name", ir.str_attr("f")),
                    (
                        "function_type",
                        ir.type_attr(ir.func_type(&[i32t, i32t], &[i32t])),
                    ),
                ],
                vec![ir.region(block)],
            )
            .unwrap();
        let mut module = Module::new(ir.loc());
        module.body().append_operation(f);
        m.verify(&module, "index function").unwrap();
        lower_to_llvm(m, &mut module).unwrap();
        Engine::new(m, &module, "f").unwrap()
    }

    /// Floor division and the divisor-signed remainder, as lowered (from
    /// truncating `divsi`/`remsi`, since Mosaic has no `floordivsi`), agree
    /// with floor(a / b) in f64 for every sign combination.
    #[test]
    fn floor_division_and_remainder_lower_exactly_for_every_sign() {
        let m = Mlir::new();
        let div = compiled(&m, IndexOp::FloorDiv, None);
        let rem = compiled(&m, IndexOp::Rem, None);
        let call = |e: &Engine, mut a: i32, mut b: i32| {
            let mut out = 0i32;
            let mut args = [
                &mut a as *mut i32 as *mut c_void,
                &mut b as *mut i32 as *mut c_void,
                &mut out as *mut i32 as *mut c_void,
            ];
            // SAFETY: two i32 arguments and one i32 result, as compiled.
            unsafe { e.call(&mut args) };
            out
        };
        for a in -23..=23 {
            for b in (-7..=7).filter(|&b| b != 0) {
                let q = (f64::from(a) / f64::from(b)).floor() as i32;
                assert_eq!(call(&div, a, b), q, "{a} floordiv {b}");
                assert_eq!(call(&rem, a, b), a - b * q, "{a} rem {b}");
            }
        }
        for d in [-5i32, -1, 1, 3, 128] {
            let div = compiled(&m, IndexOp::FloorDiv, Some(i64::from(d)));
            let rem = compiled(&m, IndexOp::Rem, Some(i64::from(d)));
            for a in -300..=300 {
                let q = (f64::from(a) / f64::from(d)).floor() as i32;
                assert_eq!(call(&div, a, 0), q, "{a} floordiv const {d}");
                assert_eq!(call(&rem, a, 0), a - d * q, "{a} rem const {d}");
            }
        }
    }
}
