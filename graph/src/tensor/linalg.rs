//! Contractions and reductions: `dot_general`, `matmul`, `sum`/`mean`/
//! `max`/`min` (padding of bucketed dims excluded) and `softmax`.

use std::panic::Location;

use kernel_ir::{DotDims, ReduceOp};

use super::*;
use crate::RuntimeError;
use crate::node::Op;

impl Tensor {
    /// A general dot product (XLA's `dot_general`): result dims are batch,
    /// lhs free, rhs free; the result has the inputs' dtype.
    #[track_caller]
    pub fn dot_general(&self, rhs: &Tensor, dims: DotDims) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        self.same_runtime(rhs, loc)?;
        let (a, b) = (&self.node, &rhs.node);
        if a.dtype != b.dtype {
            return Err(err(
                format!("dtypes differ: {} and {}; cast one", a.dtype, b.dtype),
                loc,
            ));
        }
        let check = |ds: &[usize], rank: usize, side: &str| -> Result<(), RuntimeError> {
            for &d in ds {
                if d >= rank {
                    return Err(err(
                        format!("{side} dim {d} is out of range for rank {rank}"),
                        loc,
                    ));
                }
            }
            Ok(())
        };
        check(&dims.lhs_batch, a.shape.len(), "lhs batch")?;
        check(&dims.lhs_contract, a.shape.len(), "lhs contracting")?;
        check(&dims.rhs_batch, b.shape.len(), "rhs batch")?;
        check(&dims.rhs_contract, b.shape.len(), "rhs contracting")?;
        if dims.lhs_batch.len() != dims.rhs_batch.len()
            || dims.lhs_contract.len() != dims.rhs_contract.len()
        {
            return Err(err(
                "batch and contracting dims must pair up between lhs and rhs",
                loc,
            ));
        }
        for (&l, &r) in dims
            .lhs_batch
            .iter()
            .zip(&dims.rhs_batch)
            .chain(dims.lhs_contract.iter().zip(&dims.rhs_contract))
        {
            if a.shape[l] != b.shape[r] {
                return Err(err(
                    format!(
                        "lhs dim {l} has size {} but rhs dim {r} has size {}",
                        a.shape[l], b.shape[r]
                    ),
                    loc,
                ));
            }
            if !same_dyn(&a.dims[l], &b.dims[r]) {
                return Err(err(
                    format!("lhs dim {l} and rhs dim {r} have different valid lengths"),
                    loc,
                ));
            }
        }
        let free = |rank: usize, batch: &[usize], con: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !batch.contains(d) && !con.contains(d))
                .collect()
        };
        let lf = free(a.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
        let rf = free(b.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
        let mut shape = Vec::new();
        let mut out_dims = Vec::new();
        for &d in &dims.lhs_batch {
            shape.push(a.shape[d]);
            out_dims.push(a.dims[d].clone());
        }
        for &d in &lf {
            shape.push(a.shape[d]);
            out_dims.push(a.dims[d].clone());
        }
        for &d in &rf {
            shape.push(b.shape[d]);
            out_dims.push(b.dims[d].clone());
        }
        self.record(
            Op::Dot(dims),
            vec![a.clone(), b.clone()],
            shape,
            a.dtype,
            out_dims,
            loc,
        )
    }

    /// Matrix product over the last two dims (`[.., m, k] × [.., k, n]`,
    /// equal leading batch dims; or `[.., m, k] × [k, n]`).
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let (ra, rb) = (self.node.shape.len(), rhs.node.shape.len());
        if ra < 2 || rb < 2 {
            return Err(err(
                format!("matmul needs rank ≥ 2 operands, got ranks {ra} and {rb}"),
                loc,
            ));
        }
        let dims = if rb == 2 {
            DotDims {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![ra - 1],
                rhs_contract: vec![0],
            }
        } else if ra == rb {
            DotDims {
                lhs_batch: (0..ra - 2).collect(),
                rhs_batch: (0..rb - 2).collect(),
                lhs_contract: vec![ra - 1],
                rhs_contract: vec![rb - 2],
            }
        } else {
            return Err(err(
                format!("matmul of ranks {ra} and {rb}: give the rhs rank 2 or the lhs's rank"),
                loc,
            ));
        };
        self.dot_general(rhs, dims).map_err(|e| relocate(e, loc))
    }

    pub(super) fn reduce(
        &self,
        op: ReduceOp,
        axes: &[usize],
        mean: bool,
        loc: &Location<'_>,
    ) -> Result<Tensor, RuntimeError> {
        let n = &self.node;
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != axes.len() || sorted.iter().any(|&a| a >= n.shape.len()) {
            return Err(err(
                format!(
                    "axes {axes:?} must be distinct dims of a rank-{} tensor",
                    n.shape.len()
                ),
                loc,
            ));
        }
        if mean && !n.dtype.is_float() {
            return Err(err("mean needs a float tensor", loc));
        }
        let mut inputs = vec![n.clone()];
        let mut masked = Vec::new();
        for &a in &sorted {
            if let Some(d) = &n.dims[a] {
                masked.push((a, inputs.len()));
                inputs.push(d.node.clone());
            }
        }
        let keep: Vec<usize> = (0..n.shape.len()).filter(|d| !sorted.contains(d)).collect();
        self.record(
            Op::Reduce {
                op,
                axes: sorted,
                mean,
                masked,
            },
            inputs,
            keep.iter().map(|&d| n.shape[d]).collect(),
            n.dtype,
            keep.iter().map(|&d| n.dims[d].clone()).collect(),
            loc,
        )
    }

    /// Sum over `axes` (padding of bucketed dims excluded).
    #[track_caller]
    pub fn sum(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Sum, axes, false, Location::caller())
    }

    /// Mean over `axes` (over valid elements only).
    #[track_caller]
    pub fn mean(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Sum, axes, true, Location::caller())
    }

    /// Maximum over `axes`.
    #[track_caller]
    pub fn max(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Max, axes, false, Location::caller())
    }

    /// Minimum over `axes`.
    #[track_caller]
    pub fn min(&self, axes: &[usize]) -> Result<Tensor, RuntimeError> {
        self.reduce(ReduceOp::Min, axes, false, Location::caller())
    }

    /// Softmax along `axis` (padding of a bucketed axis gets probability 0).
    #[track_caller]
    pub fn softmax(&self, axis: usize) -> Result<Tensor, RuntimeError> {
        let loc = Location::caller();
        let n = &self.node;
        if axis >= n.shape.len() || !n.dtype.is_float() {
            return Err(err(
                format!(
                    "softmax needs a float tensor and an axis below its rank {}",
                    n.shape.len()
                ),
                loc,
            ));
        }
        let mut inputs = vec![n.clone()];
        let masked = n.dims[axis].as_ref().map(|d| {
            inputs.push(d.node.clone());
            1
        });
        self.record(
            Op::Softmax { axis, masked },
            inputs,
            n.shape.clone(),
            n.dtype,
            n.dims.clone(),
            loc,
        )
    }
}
