//! Element math of the interpreter: unary and binary ops with the
//! dtype's rounding, NaN-propagating max/min, compares, reductions and
//! dots, on host values.

use super::value::Val;
use crate::error::ErrorKind;
use crate::{BinaryOp, CompareOp, DType, DotDims, ReduceOp, UnaryOp};

pub(super) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Calls `f(flat, index)` for every index of `shape`, row-major.
pub(super) fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// A tile of `shape` whose element at each index is `from(index)`: a
/// source tile and an element of it (row-major), poison kept.
pub(super) fn gathered<'v>(
    dtype: DType,
    shape: Vec<usize>,
    from: impl Fn(&[usize]) -> (&'v Val, usize),
) -> Val {
    let n: usize = shape.iter().product();
    let mut data = Vec::with_capacity(n);
    let mut poison = Vec::with_capacity(n);
    for_each_index(&shape, |_, idx| {
        let (src, at) = from(idx);
        data.push(src.data[at]);
        poison.push(src.is_poison(at));
    });
    let poison = poison.iter().any(|&p| p).then_some(poison);
    Val {
        dtype,
        shape,
        data,
        poison,
    }
}

pub(super) fn int(v: f64) -> i64 {
    v as i64
}

pub(super) fn merge(vals: &[&Val]) -> Option<Vec<bool>> {
    if vals.iter().all(|v| v.poison.is_none()) {
        return None;
    }
    let n = vals[0].data.len();
    Some(
        (0..n)
            .map(|i| vals.iter().any(|v| v.is_poison(i)))
            .collect(),
    )
}

pub(super) fn unary(op: UnaryOp, dtype: DType, x: f64) -> f64 {
    op.eval(dtype, x)
}

pub(super) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

pub(super) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

pub(super) fn binary(op: BinaryOp, dtype: DType, x: f64, y: f64) -> Result<f64, ErrorKind> {
    if dtype.is_float() {
        return Ok(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Rem => x % y,
            BinaryOp::Max => nan_max(x, y),
            BinaryOp::Min => nan_min(x, y),
            BinaryOp::Pow => x.powf(y),
            // The verifier rejects logical ops on floats.
            BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
            | BinaryOp::ShiftLeft
            | BinaryOp::ShiftRightLogical
            | BinaryOp::ShiftRightArithmetic => f64::NAN,
        });
    }
    let (a, b) = (int(x), int(y));
    Ok(match op {
        BinaryOp::Add => a.wrapping_add(b) as f64,
        BinaryOp::Sub => a.wrapping_sub(b) as f64,
        BinaryOp::Mul => a.wrapping_mul(b) as f64,
        BinaryOp::Div | BinaryOp::Rem if b == 0 => {
            return Err(ErrorKind::DivisionByZero {
                op: if op == BinaryOp::Div { "div" } else { "rem" },
            });
        }
        BinaryOp::Div => a.wrapping_div(b) as f64,
        BinaryOp::Rem => a.wrapping_rem(b) as f64,
        BinaryOp::Max => a.max(b) as f64,
        BinaryOp::Min => a.min(b) as f64,
        BinaryOp::Pow => (x).powf(y),
        BinaryOp::And => (a & b) as f64,
        BinaryOp::Or => (a | b) as f64,
        BinaryOp::Xor => (a ^ b) as f64,
        BinaryOp::ShiftLeft | BinaryOp::ShiftRightLogical | BinaryOp::ShiftRightArithmetic => {
            op.shift(a, b, dtype.bits()).unwrap_or(0) as f64
        }
    })
}

pub(super) fn compare(op: CompareOp, x: f64, y: f64) -> bool {
    match op {
        CompareOp::Eq => x == y,
        CompareOp::Ne => x != y,
        CompareOp::Lt => x < y,
        CompareOp::Le => x <= y,
        CompareOp::Gt => x > y,
        CompareOp::Ge => x >= y,
    }
}

pub(super) fn reduce(x: &Val, op: ReduceOp, axes: &[usize]) -> Val {
    let shape: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    let rs = strides_of(&shape);
    let n: usize = shape.iter().product();
    let init = match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let mut acc = vec![init; n];
    let mut poison = vec![false; n];
    for_each_index(&x.shape, |flat, idx| {
        let mut r = 0usize;
        let mut k = 0usize;
        for (d, &i) in idx.iter().enumerate() {
            if !axes.contains(&d) {
                r += i * rs[k];
                k += 1;
            }
        }
        let v = x.data[flat];
        acc[r] = match op {
            ReduceOp::Sum => acc[r] + v,
            ReduceOp::Max => nan_max(acc[r], v),
            ReduceOp::Min => nan_min(acc[r], v),
        };
        poison[r] |= x.is_poison(flat);
    });
    Val {
        dtype: x.dtype,
        shape,
        data: acc.into_iter().map(|v| x.dtype.round(v)).collect(),
        poison: poison.iter().any(|&p| p).then_some(poison),
    }
}

pub(super) fn dot(a: &Val, b: &Val, dims: &DotDims, acc: DType) -> Val {
    let free = |rank: usize, batch: &[usize], contract: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|d| !batch.contains(d) && !contract.contains(d))
            .collect()
    };
    let (as_, bs) = (strides_of(&a.shape), strides_of(&b.shape));
    let a_free = free(a.shape.len(), &dims.lhs_batch, &dims.lhs_contract);
    let b_free = free(b.shape.len(), &dims.rhs_batch, &dims.rhs_contract);
    // Offsets of every contracting index combination in each operand.
    let cshape: Vec<usize> = dims.lhs_contract.iter().map(|&d| a.shape[d]).collect();
    let mut a_c = Vec::new();
    let mut b_c = Vec::new();
    for_each_index(&cshape, |_, idx| {
        a_c.push(
            dims.lhs_contract
                .iter()
                .zip(idx)
                .map(|(&d, &i)| i * as_[d])
                .sum::<usize>(),
        );
        b_c.push(
            dims.rhs_contract
                .iter()
                .zip(idx)
                .map(|(&d, &i)| i * bs[d])
                .sum::<usize>(),
        );
    });
    let mut shape: Vec<usize> = dims.lhs_batch.iter().map(|&d| a.shape[d]).collect();
    shape.extend(a_free.iter().map(|&d| a.shape[d]));
    shape.extend(b_free.iter().map(|&d| b.shape[d]));
    let nb = dims.lhs_batch.len();
    let nf = a_free.len();
    let n: usize = shape.iter().product();
    let mut data = Vec::with_capacity(n);
    let track = a.poison.is_some() || b.poison.is_some();
    let mut poison = vec![false; if track { n } else { 0 }];
    for_each_index(&shape, |flat, idx| {
        let mut abase = 0usize;
        let mut bbase = 0usize;
        for (j, (&la, &lb)) in dims.lhs_batch.iter().zip(&dims.rhs_batch).enumerate() {
            abase += idx[j] * as_[la];
            bbase += idx[j] * bs[lb];
        }
        for (j, &d) in a_free.iter().enumerate() {
            abase += idx[nb + j] * as_[d];
        }
        for (j, &d) in b_free.iter().enumerate() {
            bbase += idx[nb + nf + j] * bs[d];
        }
        let mut sum = 0.0;
        for (oa, ob) in a_c.iter().zip(&b_c) {
            sum += a.data[abase + oa] * b.data[bbase + ob];
        }
        data.push(acc.round(sum));
        if track {
            poison[flat] = a_c
                .iter()
                .zip(&b_c)
                .any(|(oa, ob)| a.is_poison(abase + oa) || b.is_poison(bbase + ob));
        }
    });
    Val {
        dtype: acc,
        shape,
        data,
        poison: (track && poison.iter().any(|&p| p)).then_some(poison),
    }
}
