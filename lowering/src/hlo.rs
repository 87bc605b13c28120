//! StableHLO op helpers on tensors: splats, compares, reductions, dots,
//! slices, pads and index expressions, shared by the decomposed lowering
//! (its grid loop and each step) and the programs that call kernels
//! (`program`).

use melior::ir::{Block, Type};

use kernel_ir::{CompareOp, DType, DotDims, IndexExpr, IndexOp, Kernel, ReduceOp};

use crate::LoweringError;
use crate::mlir::{Ir, Raw};
use crate::op_names;

/// StableHLO op helpers on tensors.
pub(crate) struct Hlo<'a, 'c> {
    pub(crate) ir: &'a Ir<'c>,
}

impl<'c> Hlo<'_, 'c> {
    pub(crate) fn t(&self, shape: &[usize], d: DType) -> Type<'c> {
        self.ir.tensor(shape, d)
    }

    pub(crate) fn splat(
        &self,
        b: &Block<'c>,
        v: f64,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let ty = self.t(shape, d);
        let attr = self.ir.literal(v, d, ty)?;
        self.ir
            .op1(b, "stablehlo.constant", &[], ty, vec![("value", attr)])
    }

    pub(crate) fn scalar_i32(&self, b: &Block<'c>, v: i64) -> Result<Raw, LoweringError> {
        self.splat(b, v as f64, DType::I32, &[])
    }

    pub(crate) fn bin(
        &self,
        b: &Block<'c>,
        name: &str,
        x: Raw,
        y: Raw,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        self.ir.op1(b, name, &[x, y], self.t(shape, d), Vec::new())
    }

    /// `r` (a max or min of `operands`) with a NaN operand in its place:
    /// NaN wins, as on every other path. XLA's CPU `maximum`/`minimum`
    /// drop it (`max(-1, NaN)` is -1, a row [1, NaN] reduces to 1), so
    /// the program picks it itself.
    pub(crate) fn nan_wins(
        &self,
        b: &Block<'c>,
        mut r: Raw,
        operands: [Raw; 2],
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        for v in operands {
            let nan = self.compare(b, CompareOp::Ne, v, v, d, shape)?;
            r = self.ir.op1(
                b,
                "stablehlo.select",
                &[nan, v, r],
                self.t(shape, d),
                Vec::new(),
            )?;
        }
        Ok(r)
    }

    pub(crate) fn compare(
        &self,
        b: &Block<'c>,
        c: CompareOp,
        x: Raw,
        y: Raw,
        d: DType,
        shape: &[usize],
    ) -> Result<Raw, LoweringError> {
        let dir = op_names::comparison_direction(c);
        let kind = if d.is_float() {
            "FLOAT"
        } else if d == DType::Bool {
            "UNSIGNED"
        } else {
            "SIGNED"
        };
        self.ir.op1(
            b,
            "stablehlo.compare",
            &[x, y],
            self.t(shape, DType::Bool),
            vec![
                (
                    "comparison_direction",
                    self.ir
                        .parse_attr(&format!("#stablehlo<comparison_direction {dir}>"))?,
                ),
                (
                    "compare_type",
                    self.ir
                        .parse_attr(&format!("#stablehlo<comparison_type {kind}>"))?,
                ),
            ],
        )
    }

    /// `stablehlo.reduce` of `x` over `axes` with `r` (result `shape`);
    /// with `nan_wins` a NaN operand beats a float max or min.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn reduce(
        &self,
        b: &Block<'c>,
        x: Raw,
        r: ReduceOp,
        axes: &[usize],
        shape: &[usize],
        d: DType,
        nan_wins: bool,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let init = self.splat(b, r.identity(d), d, &[])?;
        let inner = self.combiner(r, d, nan_wins)?;
        let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        ir.op(
            b,
            "stablehlo.reduce",
            &[x, init],
            &[self.t(shape, d)],
            vec![("dimensions", ir.i64_array(&ax))],
            vec![ir.region(inner)],
        )?
        .first()
        .copied()
        .ok_or_else(|| LoweringError::Internal("reduce".into()))
    }

    /// The block combining two scalars of `d` with `r` (the body of a
    /// reduction or a summing collective); with `nan_wins` a NaN operand
    /// beats a float max or min.
    pub(crate) fn combiner(
        &self,
        r: ReduceOp,
        d: DType,
        nan_wins: bool,
    ) -> Result<Block<'c>, LoweringError> {
        let ir = self.ir;
        let scalar = self.t(&[], d);
        let inner = ir.block(&[scalar, scalar]);
        let a = ir.args(&inner);
        let mut s = ir.op1(
            &inner,
            op_names::reduction(r),
            &[a[0], a[1]],
            scalar,
            Vec::new(),
        )?;
        if nan_wins {
            s = self.nan_wins(&inner, s, [a[1], a[0]], d, &[])?;
        }
        ir.op(
            &inner,
            "stablehlo.return",
            &[s],
            &[],
            Vec::new(),
            Vec::new(),
        )?;
        Ok(inner)
    }

    /// `stablehlo.dot_general` of `l` and `r` (result `shape`, `d`).
    pub(crate) fn dot_general(
        &self,
        b: &Block<'c>,
        l: Raw,
        r: Raw,
        dims: &DotDims,
        shape: &[usize],
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let list = |v: &[usize]| {
            let s: Vec<String> = v.iter().map(usize::to_string).collect();
            format!("[{}]", s.join(", "))
        };
        let dn = format!(
            "#stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
            list(&dims.lhs_batch),
            list(&dims.rhs_batch),
            list(&dims.lhs_contract),
            list(&dims.rhs_contract)
        );
        self.ir.op1(
            b,
            "stablehlo.dot_general",
            &[l, r],
            self.t(shape, d),
            vec![("dot_dimension_numbers", self.ir.parse_attr(&dn)?)],
        )
    }

    pub(crate) fn reshape(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        to: &[usize],
    ) -> Result<Raw, LoweringError> {
        self.ir
            .op1(b, "stablehlo.reshape", &[x], self.t(to, d), Vec::new())
    }

    pub(crate) fn dynamic_slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        starts: &[Raw],
        sizes: &[usize],
        d: DType,
    ) -> Result<Raw, LoweringError> {
        let mut ops = vec![x];
        ops.extend(starts);
        let s: Vec<i64> = sizes.iter().map(|&v| v as i64).collect();
        self.ir.op1(
            b,
            "stablehlo.dynamic_slice",
            &ops,
            self.t(sizes, d),
            vec![("slice_sizes", self.ir.i64_array(&s))],
        )
    }

    pub(crate) fn dynamic_update_slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        update: Raw,
        starts: &[Raw],
        ty: Type<'c>,
    ) -> Result<Raw, LoweringError> {
        let mut ops = vec![x, update];
        ops.extend(starts);
        self.ir
            .op1(b, "stablehlo.dynamic_update_slice", &ops, ty, Vec::new())
    }

    pub(crate) fn pad(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        from: &[usize],
        low: &[usize],
        to: &[usize],
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(x);
        }
        let zero = self.splat(b, 0.0, d, &[])?;
        let lo: Vec<i64> = low.iter().map(|&l| l as i64).collect();
        let hi: Vec<i64> = (0..from.len())
            .map(|i| (to[i] - from[i] - low[i]) as i64)
            .collect();
        let interior = vec![0i64; from.len()];
        self.ir.op1(
            b,
            "stablehlo.pad",
            &[x, zero],
            self.t(to, d),
            vec![
                ("edge_padding_low", self.ir.i64_array(&lo)),
                ("edge_padding_high", self.ir.i64_array(&hi)),
                ("interior_padding", self.ir.i64_array(&interior)),
            ],
        )
    }

    pub(crate) fn unpad(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        from: &[usize],
        to: &[usize],
    ) -> Result<Raw, LoweringError> {
        if from == to {
            return Ok(x);
        }
        self.slice(b, x, d, &vec![0; to.len()], to)
    }

    pub(crate) fn slice(
        &self,
        b: &Block<'c>,
        x: Raw,
        d: DType,
        start: &[i64],
        sizes: &[usize],
    ) -> Result<Raw, LoweringError> {
        let limit: Vec<i64> = start
            .iter()
            .zip(sizes)
            .map(|(&s, &n)| s + n as i64)
            .collect();
        self.ir.op1(
            b,
            "stablehlo.slice",
            &[x],
            self.t(sizes, d),
            vec![
                ("start_indices", self.ir.i64_array(start)),
                ("limit_indices", self.ir.i64_array(&limit)),
                ("strides", self.ir.i64_array(&vec![1; sizes.len()])),
            ],
        )
    }

    /// An index expression as an i32 scalar tensor.
    pub(crate) fn index_expr(
        &self,
        b: &Block<'c>,
        e: &IndexExpr,
        grid: &[Raw],
        prefetch: &[Raw],
        k: &Kernel,
    ) -> Result<Raw, LoweringError> {
        let i32t = DType::I32;
        Ok(match e {
            IndexExpr::Const(v) => self.scalar_i32(b, *v)?,
            IndexExpr::Grid(d) => *grid
                .get(*d)
                .ok_or_else(|| LoweringError::Internal(format!("grid dim {d}")))?,
            IndexExpr::Prefetch { operand, at } => {
                let p = k
                    .prefetch
                    .get(*operand)
                    .ok_or_else(|| LoweringError::Internal("prefetch".into()))?;
                let idx = at
                    .iter()
                    .map(|a| self.index_expr(b, a, grid, prefetch, k))
                    .collect::<Result<Vec<_>, _>>()?;
                let one = vec![1usize; p.shape.len()];
                let v = self.dynamic_slice(b, prefetch[*operand], &idx, &one, i32t)?;
                self.reshape(b, v, i32t, &[])?
            }
            IndexExpr::Binary(op, x, y) => {
                let x = self.index_expr(b, x, grid, prefetch, k)?;
                let y = self.index_expr(b, y, grid, prefetch, k)?;
                match op {
                    IndexOp::Add => self.bin(b, "stablehlo.add", x, y, i32t, &[])?,
                    IndexOp::Sub => self.bin(b, "stablehlo.subtract", x, y, i32t, &[])?,
                    IndexOp::Mul => self.bin(b, "stablehlo.multiply", x, y, i32t, &[])?,
                    IndexOp::Min => self.bin(b, "stablehlo.minimum", x, y, i32t, &[])?,
                    IndexOp::Max => self.bin(b, "stablehlo.maximum", x, y, i32t, &[])?,
                    IndexOp::FloorDiv | IndexOp::Rem => {
                        // Truncating division fixed up to floor semantics.
                        let q = self.bin(b, "stablehlo.divide", x, y, i32t, &[])?;
                        let r = self.bin(b, "stablehlo.remainder", x, y, i32t, &[])?;
                        let zero = self.scalar_i32(b, 0)?;
                        let nonzero = self.compare(b, CompareOp::Ne, r, zero, i32t, &[])?;
                        let r_neg = self.compare(b, CompareOp::Lt, r, zero, i32t, &[])?;
                        let y_neg = self.compare(b, CompareOp::Lt, y, zero, i32t, &[])?;
                        let differ =
                            self.bin(b, "stablehlo.xor", r_neg, y_neg, DType::Bool, &[])?;
                        let fix =
                            self.bin(b, "stablehlo.and", differ, nonzero, DType::Bool, &[])?;
                        let t = self.t(&[], i32t);
                        if *op == IndexOp::FloorDiv {
                            let one = self.scalar_i32(b, 1)?;
                            let q1 = self.bin(b, "stablehlo.subtract", q, one, i32t, &[])?;
                            self.ir
                                .op1(b, "stablehlo.select", &[fix, q1, q], t, Vec::new())?
                        } else {
                            let r1 = self.bin(b, "stablehlo.add", r, y, i32t, &[])?;
                            self.ir
                                .op1(b, "stablehlo.select", &[fix, r1, r], t, Vec::new())?
                        }
                    }
                }
            }
        })
    }
}
