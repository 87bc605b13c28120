//! The vector-Jacobian product of each recorded op, as tensor ops.
//!
//! Each rule gets the node (its op and inputs from the tape), the
//! cotangent of its value, and returns one cotangent per input (`None`
//! where an input has none: integers, bools, valid lengths). Forward
//! values a rule needs are read from the nodes themselves (they are
//! materialized with the forward or computed again in the same module).

use std::collections::HashMap;
use std::sync::Arc;

use kernel_ir::{BinaryOp, DType, DotDims, ReduceOp, UnaryOp};

use super::super::node::{Node, Op, Tape};
use super::super::{Runtime, RuntimeError, Tensor};
use super::{VjpCall, zeros_like};

type Cots = Vec<Option<Tensor>>;

/// The input cotangents of the unit whose first-found node is `n`.
pub(super) fn unit_vjp(
    rt: &Runtime,
    n: &Arc<Node>,
    cot: &HashMap<u64, Tensor>,
) -> Result<Cots, RuntimeError> {
    let Tape::Op { op, inputs, .. } = &n.tape else {
        return Ok(Vec::new());
    };
    let t = |m: &Arc<Node>| Tensor::from_node(rt.clone(), m.clone());
    let ins: Vec<Tensor> = inputs.iter().map(t).collect();
    if let Op::Kernel { call, .. } = op {
        let outs: Vec<Option<Tensor>> = call
            .outputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|w| w.upgrade().map(|m| t(&m)))
            .collect();
        let cots: Vec<Option<Tensor>> = outs
            .iter()
            .map(|o| o.as_ref().and_then(|o| cot.get(&o.node.id).cloned()))
            .collect();
        if cots.iter().all(Option::is_none) {
            return Ok(vec![None; ins.len()]);
        }
        let Some(vjp) = &call.vjp else {
            return Err(RuntimeError::Record {
                message: format!(
                    "kernel `{}` declares no backward, so gradients cannot flow through it; call it with Runtime::call_with_vjp (the library's Entry::call passes the kernel's own backward), or keep it off the path to the loss",
                    call.kernel.name
                ),
                loc: n.loc.clone(),
            });
        };
        let got = vjp.vjp(&VjpCall {
            kernel: &call.kernel,
            inputs: &ins,
            outputs: &outs,
            cotangents: &cots,
        })?;
        if got.len() != ins.len() {
            return Err(RuntimeError::Internal(format!(
                "the backward of kernel `{}` gave {} cotangents for {} inputs",
                call.kernel.name,
                got.len(),
                ins.len()
            )));
        }
        return Ok(got);
    }
    let Some(g) = cot.get(&n.id) else {
        return Ok(vec![None; ins.len()]);
    };
    let y = t(n);
    op_vjp(rt, op, &ins, &y, g)
}

fn some(t: Tensor) -> Option<Tensor> {
    Some(t)
}

/// A constant `v` broadcast to `like`'s shape (and padding).
fn full(like: &Tensor, v: f64) -> Result<Tensor, RuntimeError> {
    let c = like.rt.scalar(v, like.dtype());
    c.broadcast_scalar(
        &like.node.shape,
        &like.node.dims,
        std::panic::Location::caller(),
    )
}

/// True at the valid positions of `x` along the padded `axes` (bool of
/// `x`'s shape), `None` when none of them is padded.
fn valid_mask(x: &Tensor, axes: &[usize]) -> Result<Option<Tensor>, RuntimeError> {
    let mut mask: Option<Tensor> = None;
    for &a in axes {
        let Some(d) = &x.node.dims[a] else { continue };
        let len = Tensor::from_node(x.rt.clone(), d.node.clone())
            .reshape(&[])?
            .broadcast_to(&x.node.shape)?;
        let pos = x.rt.iota(&x.node.shape, a, DType::I32)?;
        let m = pos.lt(&len)?;
        mask = Some(match mask {
            Some(prev) => prev.binary(BinaryOp::And, &m, std::panic::Location::caller())?,
            None => m,
        });
    }
    Ok(mask)
}

/// `g` where `mask` holds, else 0.
fn masked(g: Tensor, mask: &Option<Tensor>) -> Result<Tensor, RuntimeError> {
    match mask {
        Some(m) => m.select(&g, &zeros_like(&g)?),
        None => Ok(g),
    }
}

/// `g` (of a reduction's kept dims) broadcast back over `x`'s shape.
fn unreduce(g: &Tensor, x: &Tensor, axes: &[usize]) -> Result<Tensor, RuntimeError> {
    let keep: Vec<usize> = (0..x.node.shape.len())
        .filter(|d| !axes.contains(d))
        .collect();
    g.broadcast_in_dim(&x.node.shape, &keep)
}

fn op_vjp(
    rt: &Runtime,
    op: &Op,
    ins: &[Tensor],
    y: &Tensor,
    g: &Tensor,
) -> Result<Cots, RuntimeError> {
    let float = |t: &Tensor| t.dtype().is_float();
    Ok(match op {
        Op::Constant(_) | Op::Iota(_) | Op::Literal(_) | Op::Compare(_) => vec![None; ins.len()],
        Op::Unary(u) => vec![unary(*u, &ins[0], y, g)?],
        Op::Binary(b) => {
            if !float(&ins[0]) {
                return Ok(vec![None, None]);
            }
            let (ga, gb) = binary(*b, &ins[0], &ins[1], y, g)?;
            vec![ga, gb]
        }
        Op::Select => {
            let z = zeros_like(g)?;
            vec![
                None,
                some(ins[0].select(g, &z)?),
                some(ins[0].select(&z, g)?),
            ]
        }
        Op::Convert => {
            if float(&ins[0]) {
                vec![some(g.cast(ins[0].dtype())?)]
            } else {
                vec![None]
            }
        }
        Op::Dot(d) => {
            let (ga, gb) = dot(d, &ins[0], &ins[1], g)?;
            vec![some(ga), some(gb)]
        }
        Op::Reduce { op, axes, mean, .. } => {
            let x = &ins[0];
            let mask = valid_mask(x, axes)?;
            let gb = unreduce(g, x, axes)?;
            let gx = match op {
                ReduceOp::Sum if *mean => {
                    // The count of valid elements, with the forward's own
                    // masking of padded axes.
                    let count = full(x, 1.0)?.sum(axes)?;
                    gb.div(&unreduce(&count, x, axes)?)?
                }
                ReduceOp::Sum => gb,
                ReduceOp::Max | ReduceOp::Min => {
                    // Ties share the cotangent equally.
                    let hit = masked(x.eq(&unreduce(y, x, axes)?)?.cast(x.dtype())?, &mask)?;
                    let ties = unreduce(&hit.sum(axes)?, x, axes)?;
                    gb.mul(&hit)?.div(&ties)?
                }
            };
            let mut v = vec![some(masked(gx, &mask)?)];
            v.resize(ins.len(), None);
            v
        }
        Op::Reshape => vec![some(g.reshape(&ins[0].node.shape)?)],
        Op::Transpose(p) => {
            let mut inv = vec![0; p.len()];
            for (i, &pi) in p.iter().enumerate() {
                inv[pi] = i;
            }
            vec![some(g.transpose(&inv)?)]
        }
        Op::Broadcast(dims) => vec![some(unbroadcast(g, &ins[0], dims)?)],
        Op::Slice { start, limit } => vec![some(unslice(rt, g, &ins[0], start, limit)?)],
        Op::Concat(axis) => {
            let mut at = 0;
            let mut v = Vec::new();
            for i in ins {
                let mut start = vec![0; g.node.shape.len()];
                let mut limit = g.node.shape.clone();
                start[*axis] = at;
                at += i.node.shape[*axis];
                limit[*axis] = at;
                v.push(some(g.slice(&start, &limit)?));
            }
            v
        }
        Op::Softmax { axis, .. } => {
            let others: Vec<usize> = (0..y.node.shape.len()).filter(|d| d != axis).collect();
            let dot = g.mul(y)?.sum(&[*axis])?;
            let gx = y.mul(&g.sub(&dot.broadcast_in_dim(&y.node.shape, &others)?)?)?;
            let mut v = vec![some(gx)];
            v.resize(ins.len(), None);
            v
        }
        Op::AllReduce => vec![some(g.all_reduce_sum()?)],
        Op::AllGather(axis) => vec![some(g.reduce_scatter_sum(*axis)?)],
        Op::ReduceScatter(axis) => vec![some(g.all_gather(*axis)?)],
        Op::Kernel { .. } => {
            return Err(RuntimeError::Internal(
                "a kernel output outside its call".into(),
            ));
        }
    })
}

fn unary(u: UnaryOp, x: &Tensor, y: &Tensor, g: &Tensor) -> Result<Option<Tensor>, RuntimeError> {
    if !x.dtype().is_float() {
        return Ok(None);
    }
    let one = || full(x, 1.0);
    Ok(Some(match u {
        UnaryOp::Neg => g.neg()?,
        UnaryOp::Abs => x.ge(&zeros_like(x)?)?.select(g, &g.neg()?)?,
        UnaryOp::Exp => g.mul(y)?,
        UnaryOp::Exp2 => g.mul(y)?.scale(std::f64::consts::LN_2)?,
        UnaryOp::Log => g.div(x)?,
        UnaryOp::Log1p => g.div(&x.add(&one()?)?)?,
        UnaryOp::Tanh => g.mul(&one()?.sub(&y.mul(y)?)?)?,
        UnaryOp::Sqrt => g.div(&y.add(y)?)?,
        // d/dx x^-1/2 = -1/2 · y³
        UnaryOp::Rsqrt => g.mul(&y.mul(y)?.mul(y)?)?.scale(-0.5)?,
        UnaryOp::Sin => g.mul(&x.cos()?)?,
        UnaryOp::Cos => g.mul(&x.sin()?)?.neg()?,
        UnaryOp::Erf => g
            .mul(&x.mul(x)?.neg()?.exp()?)?
            .scale(std::f64::consts::FRAC_2_SQRT_PI)?,
        UnaryOp::Logistic => g.mul(&y.mul(&one()?.sub(y)?)?)?,
        UnaryOp::Floor | UnaryOp::Ceil => zeros_like(x)?,
        UnaryOp::Not => return Ok(None),
    }))
}

fn binary(
    b: BinaryOp,
    a: &Tensor,
    c: &Tensor,
    y: &Tensor,
    g: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>), RuntimeError> {
    let z = || zeros_like(g);
    Ok(match b {
        BinaryOp::Add => (some(g.clone()), some(g.clone())),
        BinaryOp::Sub => (some(g.clone()), some(g.neg()?)),
        BinaryOp::Mul => (some(g.mul(c)?), some(g.mul(a)?)),
        BinaryOp::Div => (some(g.div(c)?), some(g.mul(y)?.div(c)?.neg()?)),
        // Ties go to the left operand, as in JAX.
        BinaryOp::Max | BinaryOp::Min => {
            let left = if b == BinaryOp::Max {
                a.ge(c)?
            } else {
                a.le(c)?
            };
            (some(left.select(g, &z()?)?), some(left.select(&z()?, g)?))
        }
        BinaryOp::Pow => {
            // d/da a^c = c·a^(c−1) = c·y/a away from 0; d/dc = y·ln a for a > 0.
            let one = full(a, 1.0)?;
            let ga = g.mul(c)?.mul(&a.pow(&c.sub(&one)?)?)?;
            let pos = a.gt(&zeros_like(a)?)?;
            let gc = pos.select(&g.mul(y)?.mul(&pos.select(a, &one)?.log()?)?, &z()?)?;
            (some(ga), some(gc))
        }
        BinaryOp::Rem => {
            // a − trunc(a/c)·c
            let q = a.div(c)?;
            let trunc = q.ge(&zeros_like(&q)?)?.select(&q.floor()?, &q.ceil()?)?;
            (some(g.clone()), some(g.mul(&trunc)?.neg()?))
        }
        BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRightLogical
        | BinaryOp::ShiftRightArithmetic => (None, None),
    })
}

/// Cotangents of a `dot_general`'s operands: the cotangent contracted with
/// the other operand over that operand's free dims, then permuted back to
/// the operand's dim order.
fn dot(d: &DotDims, a: &Tensor, b: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor), RuntimeError> {
    let (ra, rb) = (a.node.shape.len(), b.node.shape.len());
    let nb = d.lhs_batch.len();
    let free = |rank: usize, batch: &[usize], con: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|x| !batch.contains(x) && !con.contains(x))
            .collect()
    };
    let lf = free(ra, &d.lhs_batch, &d.lhs_contract);
    let rf = free(rb, &d.rhs_batch, &d.rhs_contract);
    let batch: Vec<usize> = (0..nb).collect();
    let g_lf: Vec<usize> = (nb..nb + lf.len()).collect();
    let g_rf: Vec<usize> = (nb + lf.len()..nb + lf.len() + rf.len()).collect();
    // dA = g · B over B's free dims: [batch, lhs free, B's contract dims
    // in ascending order].
    let ga = g.dot_general(
        b,
        DotDims {
            lhs_batch: batch.clone(),
            rhs_batch: d.rhs_batch.clone(),
            lhs_contract: g_rf,
            rhs_contract: rf.clone(),
        },
    )?;
    let perm_a = back_perm(ra, &d.lhs_batch, &lf, &d.lhs_contract, &d.rhs_contract);
    let gb = g.dot_general(
        a,
        DotDims {
            lhs_batch: batch,
            rhs_batch: d.lhs_batch.clone(),
            lhs_contract: g_lf,
            rhs_contract: lf,
        },
    )?;
    let perm_b = back_perm(rb, &d.rhs_batch, &rf, &d.rhs_contract, &d.lhs_contract);
    Ok((ga.transpose(&perm_a)?, gb.transpose(&perm_b)?))
}

/// The permutation taking `[batch, free, partner's remaining dims]` (what
/// the cotangent product yields) to an operand's own dim order: operand
/// dim `own_con[j]` sits where `partner_con[j]` ranks among the partner's
/// contracting dims.
fn back_perm(
    rank: usize,
    batch: &[usize],
    free: &[usize],
    own_con: &[usize],
    partner_con: &[usize],
) -> Vec<usize> {
    let mut perm = vec![0; rank];
    for (i, &d) in batch.iter().enumerate() {
        perm[d] = i;
    }
    for (i, &d) in free.iter().enumerate() {
        perm[d] = batch.len() + i;
    }
    let mut sorted = partner_con.to_vec();
    sorted.sort_unstable();
    for (j, &d) in own_con.iter().enumerate() {
        let rank_in = sorted
            .iter()
            .position(|&p| p == partner_con[j])
            .unwrap_or(0);
        perm[d] = batch.len() + free.len() + rank_in;
    }
    perm
}

/// The cotangent of a broadcast's input: summed over the dims the
/// broadcast added or expanded from 1.
fn unbroadcast(g: &Tensor, x: &Tensor, dims: &[usize]) -> Result<Tensor, RuntimeError> {
    let out = &g.node.shape;
    let sum_axes: Vec<usize> = (0..out.len())
        .filter(|o| match dims.iter().position(|d| d == o) {
            None => true,
            Some(i) => x.node.shape[i] == 1 && out[*o] != 1,
        })
        .collect();
    let summed = if sum_axes.is_empty() {
        g.clone()
    } else {
        g.sum(&sum_axes)?
    };
    summed.reshape(&x.node.shape)
}

/// The cotangent of a slice's input: `g` with zeros around it.
fn unslice(
    rt: &Runtime,
    g: &Tensor,
    x: &Tensor,
    start: &[usize],
    limit: &[usize],
) -> Result<Tensor, RuntimeError> {
    let mut cur = g.clone();
    for d in 0..start.len() {
        let (before, after) = (start[d], x.node.shape[d] - limit[d]);
        if before == 0 && after == 0 {
            continue;
        }
        let zeros = |n: usize| -> Result<Tensor, RuntimeError> {
            let mut s = cur.node.shape.clone();
            s[d] = n;
            rt.scalar(0.0, g.dtype()).broadcast_to(&s)
        };
        let mut parts = Vec::new();
        if before > 0 {
            parts.push(zeros(before)?);
        }
        parts.push(cur.clone());
        if after > 0 {
            parts.push(zeros(after)?);
        }
        let refs: Vec<&Tensor> = parts[1..].iter().collect();
        cur = parts[0].concat(&refs, d)?;
    }
    Ok(cur)
}
