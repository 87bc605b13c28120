//! `dot`: `vector.contract` upstream, `tpu.matmul` in the Mosaic flavor.

use melior::ir::Block;

use kernel_ir::{DotDims, TileType, ValueId};

use super::*;
use crate::LoweringError;
use crate::convention::Flavor;
use crate::mlir::Raw;

impl<'c> BodyEmitter<'_, 'c> {
    pub(super) fn dot(
        &self,
        block: &Block<'c>,
        l: ValueId,
        r: ValueId,
        dims: &DotDims,
        rt: &TileType,
    ) -> Result<Raw, LoweringError> {
        let ir = self.ir;
        let (lt, rtt) = (self.ty(l).clone(), self.ty(r).clone());
        let acc = self.constant(block, 0.0, rt)?;
        let free = |rank: usize, b: &[usize], c: &[usize]| -> Vec<usize> {
            (0..rank)
                .filter(|d| !b.contains(d) && !c.contains(d))
                .collect()
        };
        let lf = free(lt.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
        let rf = free(rtt.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
        match self.flavor {
            Flavor::Mosaic => {
                let list = |v: &[usize]| {
                    let s: Vec<String> = v.iter().map(usize::to_string).collect();
                    format!("[{}]", s.join(", "))
                };
                let mut order: Vec<String> = Vec::new();
                for &d in &dims.lhs_batch {
                    order.push(format!("0, {d}"));
                }
                for &d in &lf {
                    order.push(format!("0, {d}"));
                }
                for &d in &rf {
                    order.push(format!("1, {d}"));
                }
                let dn = format!(
                    "#tpu.dot_dimension_numbers<{}, {}, {}, {}, [{}], {}, {}>",
                    list(&dims.lhs_contract),
                    list(&dims.rhs_contract),
                    list(&lf),
                    list(&rf),
                    order.join(", "),
                    list(&dims.lhs_batch),
                    list(&dims.rhs_batch)
                );
                ir.op1(
                    block,
                    "tpu.matmul",
                    &[self.v(l)?, self.v(r)?, acc],
                    ir.tile(rt),
                    vec![
                        ("dimension_numbers", ir.parse_attr(&dn)?),
                        ("transpose_lhs_hint", ir.parse_attr("false")?),
                    ],
                )
            }
            Flavor::Upstream => {
                // Iteration space: batch, lhs free, rhs free, contracting.
                let nb = dims.lhs_batch.len();
                let (nl, nr, nc) = (lf.len(), rf.len(), dims.lhs_contract.len());
                let n = nb + nl + nr + nc;
                let d = |i: usize| format!("d{i}");
                let lhs_map: Vec<String> = (0..lt.shape.len())
                    .map(|dim| {
                        if let Some(p) = dims.lhs_batch.iter().position(|&x| x == dim) {
                            d(p)
                        } else if let Some(p) = lf.iter().position(|&x| x == dim) {
                            d(nb + p)
                        } else {
                            d(nb + nl
                                + nr
                                + dims
                                    .lhs_contract
                                    .iter()
                                    .position(|&x| x == dim)
                                    .unwrap_or(0))
                        }
                    })
                    .collect();
                let rhs_map: Vec<String> = (0..rtt.shape.len())
                    .map(|dim| {
                        if let Some(p) = dims.rhs_batch.iter().position(|&x| x == dim) {
                            d(p)
                        } else if let Some(p) = rf.iter().position(|&x| x == dim) {
                            d(nb + nl + p)
                        } else {
                            d(nb + nl
                                + nr
                                + dims
                                    .rhs_contract
                                    .iter()
                                    .position(|&x| x == dim)
                                    .unwrap_or(0))
                        }
                    })
                    .collect();
                let out_map: Vec<String> = (0..nb + nl + nr).map(d).collect();
                let all: Vec<String> = (0..n).map(d).collect();
                let map = |m: &[String]| {
                    format!("affine_map<({}) -> ({})>", all.join(", "), m.join(", "))
                };
                let maps = format!("[{}, {}, {}]", map(&lhs_map), map(&rhs_map), map(&out_map));
                let iters: Vec<&str> = (0..n)
                    .map(|i| {
                        if i < nb + nl + nr {
                            "#vector.iterator_type<parallel>"
                        } else {
                            "#vector.iterator_type<reduction>"
                        }
                    })
                    .collect();
                // Widen the inputs to the accumulator type first: the host
                // lowering handles same-type contractions best.
                let widen = |v: ValueId, t: &TileType| -> Result<Raw, LoweringError> {
                    self.convert(block, self.v(v)?, t.clone(), rt.dtype)
                };
                let (lv, rv) = (widen(l, &lt)?, widen(r, &rtt)?);
                ir.op1(
                    block,
                    "vector.contract",
                    &[lv, rv, acc],
                    ir.tile(rt),
                    vec![
                        ("indexing_maps", ir.parse_attr(&maps)?),
                        (
                            "iterator_types",
                            ir.parse_attr(&format!("[{}]", iters.join(", ")))?,
                        ),
                        ("kind", ir.parse_attr("#vector.kind<add>")?),
                    ],
                )
            }
        }
    }
}
