//! Reverse mode over the graph: every op's gradient against central
//! differences of an f64 host version of the op, over random shapes;
//! padding, collectives and record-time errors.

use crate::common::{fresh_runtime, within};
use graph::{Buckets, Runtime, RuntimeOptions, Tensor, grad, vjp};
use kernel_ir::DotDims;
use kernel_ir::prelude::*;
use proptest::prelude::*;

/// A row-major f64 array: the host side of the checks.
#[derive(Clone, Debug)]
pub struct H {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Every multi-index of `shape`, row-major.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0; shape.len()];
    for _ in 0..n {
        out.push(idx.clone());
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

impl H {
    pub fn of(a: &Array) -> H {
        H {
            shape: a.shape().to_vec(),
            data: a.data().to_vec(),
        }
    }
    fn at(&self, i: &[usize]) -> f64 {
        let s = strides(&self.shape);
        self.data[i.iter().zip(&s).map(|(a, b)| a * b).sum::<usize>()]
    }
    fn build(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> H {
        H {
            shape: shape.to_vec(),
            data: indices(shape).iter().map(|i| f(i)).collect(),
        }
    }
    fn map(&self, f: impl Fn(f64) -> f64) -> H {
        H {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&x| f(x)).collect(),
        }
    }
    fn zip(&self, o: &H, f: impl Fn(f64, f64) -> f64) -> H {
        H {
            shape: self.shape.clone(),
            data: self
                .data
                .iter()
                .zip(&o.data)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        }
    }
}

/// `dot_general` in f64 (result dims: batch, lhs free, rhs free).
pub(crate) fn h_dot(a: &H, b: &H, d: &DotDims) -> H {
    let free = |r: usize, bt: &[usize], c: &[usize]| -> Vec<usize> {
        (0..r)
            .filter(|x| !bt.contains(x) && !c.contains(x))
            .collect()
    };
    let lf = free(a.shape.len(), &d.lhs_batch, &d.lhs_contract);
    let rf = free(b.shape.len(), &d.rhs_batch, &d.rhs_contract);
    let mut shape: Vec<usize> = d.lhs_batch.iter().map(|&x| a.shape[x]).collect();
    shape.extend(lf.iter().map(|&x| a.shape[x]));
    shape.extend(rf.iter().map(|&x| b.shape[x]));
    let cshape: Vec<usize> = d.lhs_contract.iter().map(|&x| a.shape[x]).collect();
    let nb = d.lhs_batch.len();
    H::build(&shape, |o| {
        let mut ai = vec![0; a.shape.len()];
        let mut bi = vec![0; b.shape.len()];
        for (j, (&l, &r)) in d.lhs_batch.iter().zip(&d.rhs_batch).enumerate() {
            ai[l] = o[j];
            bi[r] = o[j];
        }
        for (j, &l) in lf.iter().enumerate() {
            ai[l] = o[nb + j];
        }
        for (j, &r) in rf.iter().enumerate() {
            bi[r] = o[nb + lf.len() + j];
        }
        indices(&cshape)
            .iter()
            .map(|c| {
                for (j, (&l, &r)) in d.lhs_contract.iter().zip(&d.rhs_contract).enumerate() {
                    ai[l] = c[j];
                    bi[r] = c[j];
                }
                a.at(&ai) * b.at(&bi)
            })
            .sum()
    })
}

#[derive(Clone, Copy, Debug)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
}

fn h_reduce(x: &H, axes: &[usize], r: Red) -> H {
    let keep: Vec<usize> = (0..x.shape.len()).filter(|d| !axes.contains(d)).collect();
    let shape: Vec<usize> = keep.iter().map(|&d| x.shape[d]).collect();
    let rshape: Vec<usize> = axes.iter().map(|&d| x.shape[d]).collect();
    H::build(&shape, |o| {
        let vals: Vec<f64> = indices(&rshape)
            .iter()
            .map(|ri| {
                let mut i = vec![0; x.shape.len()];
                for (j, &d) in keep.iter().enumerate() {
                    i[d] = o[j];
                }
                for (j, &d) in axes.iter().enumerate() {
                    i[d] = ri[j];
                }
                x.at(&i)
            })
            .collect();
        match r {
            Red::Sum => vals.iter().sum(),
            Red::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
            Red::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Red::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
        }
    })
}

fn h_transpose(x: &H, p: &[usize]) -> H {
    let shape: Vec<usize> = p.iter().map(|&d| x.shape[d]).collect();
    H::build(&shape, |o| {
        let mut i = vec![0; p.len()];
        for (j, &d) in p.iter().enumerate() {
            i[d] = o[j];
        }
        x.at(&i)
    })
}

fn h_broadcast(x: &H, shape: &[usize], dims: &[usize]) -> H {
    H::build(shape, |o| {
        let i: Vec<usize> = dims
            .iter()
            .enumerate()
            .map(|(j, &d)| if x.shape[j] == 1 { 0 } else { o[d] })
            .collect();
        x.at(&i)
    })
}

fn h_slice(x: &H, start: &[usize], limit: &[usize]) -> H {
    let shape: Vec<usize> = start.iter().zip(limit).map(|(a, b)| b - a).collect();
    H::build(&shape, |o| {
        let i: Vec<usize> = o.iter().zip(start).map(|(a, b)| a + b).collect();
        x.at(&i)
    })
}

fn h_concat(xs: &[&H], axis: usize) -> H {
    let mut shape = xs[0].shape.clone();
    shape[axis] = xs.iter().map(|x| x.shape[axis]).sum();
    H::build(&shape, |o| {
        let mut i = o.to_vec();
        for x in xs {
            if i[axis] < x.shape[axis] {
                return x.at(&i);
            }
            i[axis] -= x.shape[axis];
        }
        f64::NAN
    })
}

fn h_softmax(x: &H, axis: usize) -> H {
    let mx = h_reduce(x, &[axis], Red::Max);
    let keep: Vec<usize> = (0..x.shape.len()).filter(|&d| d != axis).collect();
    let e = x.zip(&h_broadcast(&mx, &x.shape, &keep), |a, m| (a - m).exp());
    let s = h_reduce(&e, &[axis], Red::Sum);
    e.zip(&h_broadcast(&s, &x.shape, &keep), |a, b| a / b)
}

/// Central differences of `Σ w · f(xs)` with respect to every element of
/// every input.
fn numeric_grad(f: &dyn Fn(&[H]) -> H, xs: &[H], w: &H) -> Vec<Vec<f64>> {
    let loss = |xs: &[H]| -> f64 { f(xs).data.iter().zip(&w.data).map(|(a, b)| a * b).sum() };
    (0..xs.len())
        .map(|k| {
            (0..xs[k].data.len())
                .map(|e| {
                    let h = 1e-6 * xs[k].data[e].abs().max(1.0);
                    let mut p = xs.to_vec();
                    p[k].data[e] += h;
                    let mut m = xs.to_vec();
                    m[k].data[e] -= h;
                    (loss(&p) - loss(&m)) / (2.0 * h)
                })
                .collect()
        })
        .collect()
}

/// The gradient of `Σ w · graph(xs)` on the runtime against central
/// differences of `host(xs)`, with a random cotangent `w`.
fn check_op(
    rt: &Runtime,
    xs: &[Array],
    graph: &dyn Fn(&[Tensor]) -> Result<Tensor, graph::RuntimeError>,
    host: &dyn Fn(&[H]) -> H,
    seed: u64,
) -> Result<(), String> {
    check_op_within(rt, xs, graph, host, seed, (2e-4, 2e-3))
}

/// [`check_op`] within `(abs, rel)`.
fn check_op_within(
    rt: &Runtime,
    xs: &[Array],
    graph: &dyn Fn(&[Tensor]) -> Result<Tensor, graph::RuntimeError>,
    host: &dyn Fn(&[H]) -> H,
    seed: u64,
    (abs, rel): (f64, f64),
) -> Result<(), String> {
    let params: Vec<Tensor> = xs
        .iter()
        .map(|a| rt.tensor(a).unwrap().requires_grad().unwrap())
        .collect();
    let y = graph(&params).map_err(|e| e.to_string())?;
    let hs: Vec<H> = xs.iter().map(H::of).collect();
    let want_y = host(&hs);
    assert_eq!(y.shape(), want_y.shape.as_slice(), "the op's shape");
    let w = Array::random(F32, y.shape().to_vec(), seed, -1.0, 1.0);
    let wt = rt.tensor(&w).unwrap();
    let refs: Vec<&Tensor> = params.iter().collect();
    let g = vjp(&[&y], &[&wt], &refs).map_err(|e| e.to_string())?;
    let num = numeric_grad(host, &hs, &H::of(&w));
    for (k, (g, n)) in g.iter().zip(&num).enumerate() {
        let got = g.to_host().map_err(|e| e.to_string())?;
        within(got.data(), n, abs, rel).map_err(|e| format!("input {k}: {e}"))?;
    }
    Ok(())
}

fn shape_strategy(rank: std::ops::RangeInclusive<usize>) -> impl Strategy<Value = Vec<usize>> {
    rank.prop_flat_map(|r| prop::collection::vec(1usize..5, r))
}

/// Unary ops on inputs in their domain.
#[test]
fn unary_op_gradients_match_central_differences() {
    let rt = fresh_runtime();
    type G = fn(&Tensor) -> Result<Tensor, graph::RuntimeError>;
    type Case = (&'static str, G, fn(f64) -> f64, (f64, f64));
    let cases: Vec<Case> = vec![
        ("neg", |t| t.neg(), |x| -x, (-1.0, 1.0)),
        ("abs", |t| t.abs(), f64::abs, (0.1, 1.0)),
        ("exp", |t| t.exp(), f64::exp, (-1.0, 1.0)),
        ("exp2", |t| t.exp2(), f64::exp2, (-1.0, 1.0)),
        ("log", |t| t.log(), f64::ln, (0.5, 2.0)),
        ("log1p", |t| t.log1p(), f64::ln_1p, (-0.5, 1.0)),
        ("tanh", |t| t.tanh(), f64::tanh, (-1.0, 1.0)),
        ("sqrt", |t| t.sqrt(), f64::sqrt, (0.5, 2.0)),
        ("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), (0.5, 2.0)),
        ("sin", |t| t.sin(), f64::sin, (-2.0, 2.0)),
        ("cos", |t| t.cos(), f64::cos, (-2.0, 2.0)),
        ("erf", |t| t.erf(), erf64, (-1.5, 1.5)),
        (
            "logistic",
            |t| t.logistic(),
            |x| 1.0 / (1.0 + (-x).exp()),
            (-2.0, 2.0),
        ),
        // Piecewise constant: zero gradient away from the integers.
        ("floor", |t| t.floor(), f64::floor, (0.1, 0.9)),
        ("ceil", |t| t.ceil(), f64::ceil, (0.1, 0.9)),
    ];
    for (name, g, h, (lo, hi)) in cases {
        // A runner per op: one runner counts its cases over all its runs.
        proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(3))
            .run(&(shape_strategy(0..=3), any::<u64>()), |(shape, seed)| {
                let x = Array::random(F32, shape.clone(), seed, lo, hi);
                // `abs` on both signs, away from 0.
                let x = if name == "abs" {
                    let d: Vec<f64> = x
                        .data()
                        .iter()
                        .enumerate()
                        .map(|(i, v)| if i % 2 == 0 { *v } else { -v })
                        .collect();
                    Array::new(F32, shape.clone(), d).unwrap()
                } else {
                    x
                };
                check_op(&rt, &[x], &|t| g(&t[0]), &|x| x[0].map(h), seed ^ 1)
                    .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))
            })
            .unwrap();
    }
}

#[test]
fn binary_op_gradients_match_central_differences() {
    let rt = fresh_runtime();
    type G = fn(&Tensor, &Tensor) -> Result<Tensor, graph::RuntimeError>;
    type Case = (&'static str, G, fn(f64, f64) -> f64, (f64, f64));
    let cases: Vec<Case> = vec![
        ("add", |a, b| a.add(b), |a, b| a + b, (-1.0, 1.0)),
        ("sub", |a, b| a.sub(b), |a, b| a - b, (-1.0, 1.0)),
        ("mul", |a, b| a.mul(b), |a, b| a * b, (-1.0, 1.0)),
        ("div", |a, b| a.div(b), |a, b| a / b, (0.5, 2.0)),
        ("max", |a, b| a.maximum(b), f64::max, (-1.0, 1.0)),
        ("min", |a, b| a.minimum(b), f64::min, (-1.0, 1.0)),
        ("pow", |a, b| a.pow(b), f64::powf, (0.5, 2.0)),
        ("rem", |a, b| a.rem(b), |a, b| a % b, (0.3, 2.0)),
        (
            "select",
            |a, b| a.gt(b)?.select(&a.mul(a)?, b),
            |a, b| if a > b { a * a } else { b },
            (-1.0, 1.0),
        ),
        (
            "cast",
            |a, b| a.cast(BF16)?.cast(F32)?.mul(b),
            |a, b| a * b,
            (-1.0, 1.0),
        ),
    ];
    for (name, g, h, (lo, hi)) in cases {
        // A runner per op: one runner counts its cases over all its runs.
        proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(3))
            .run(&(shape_strategy(0..=3), any::<u64>()), |(shape, seed)| {
                let a = Array::random(F32, shape.clone(), seed, lo, hi);
                let mut b = Array::random(F32, shape.clone(), seed ^ 7, lo, hi);
                if name == "cast" {
                    // The reference of a conversion is the identity: take
                    // the operand already rounded to bf16.
                    b = Array::new(
                        F32,
                        shape.clone(),
                        b.data().iter().map(|v| BF16.round(*v)).collect(),
                    )
                    .unwrap();
                }
                let scalar_rhs = name == "mul" && shape.len() == 2;
                if scalar_rhs {
                    // A rank-0 operand broadcasts: its gradient sums.
                    let b = Array::random(F32, Vec::<usize>::new(), seed ^ 9, lo, hi);
                    return check_op(
                        &rt,
                        &[a, b],
                        &|t| t[0].mul(&t[1]),
                        &|x| x[0].map(|v| v * x[1].data[0]),
                        seed ^ 3,
                    )
                    .map_err(|e| TestCaseError::fail(format!("{name} by a scalar: {e}")));
                }
                if name == "cast" {
                    // d/da only through the conversion (b is exact in bf16);
                    // the cotangent crossing the bf16 value is rounded to
                    // bf16, as in JAX.
                    let a_r = Array::new(
                        F32,
                        shape.clone(),
                        a.data().iter().map(|v| BF16.round(*v)).collect(),
                    )
                    .unwrap();
                    return check_op_within(
                        &rt,
                        &[b, a_r],
                        &|t| g(&t[1], &t[0]),
                        &|x| x[0].zip(&x[1], |b, a| h(a, b)),
                        seed ^ 3,
                        (1e-4, 8e-3),
                    )
                    .map_err(|e| TestCaseError::fail(format!("{name}: {e}")));
                }
                check_op(
                    &rt,
                    &[a, b],
                    &|t| g(&t[0], &t[1]),
                    &|x| x[0].zip(&x[1], h),
                    seed ^ 3,
                )
                .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))
            })
            .unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn dot_general_gradients_match(m in 1usize..5, k in 1usize..5, n in 1usize..5, b in 1usize..4, seed in any::<u64>()) {
        let rt = fresh_runtime();
        // A matmul, a batched one, and contracting/batch dims in unusual
        // places: lhs [k, b, m], rhs [n, b, k].
        let cases: Vec<(Vec<usize>, Vec<usize>, DotDims)> = vec![
            (vec![m, k], vec![k, n], DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![1], rhs_contract: vec![0] }),
            (vec![b, m, k], vec![b, k, n], DotDims { lhs_batch: vec![0], rhs_batch: vec![0], lhs_contract: vec![2], rhs_contract: vec![1] }),
            (vec![k, b, m], vec![n, b, k], DotDims { lhs_batch: vec![1], rhs_batch: vec![1], lhs_contract: vec![0], rhs_contract: vec![2] }),
            (vec![k, m, b], vec![b, n, k], DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contract: vec![0, 2], rhs_contract: vec![2, 0] }),
        ];
        for (sa, sb, d) in cases {
            let a = Array::random(F32, sa, seed, -1.0, 1.0);
            let bb = Array::random(F32, sb, seed ^ 5, -1.0, 1.0);
            let dd = d.clone();
            check_op(&rt, &[a, bb], &move |t| t[0].dot_general(&t[1], dd.clone()), &|x| h_dot(&x[0], &x[1], &d), seed ^ 2)
                .map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn reduction_and_softmax_gradients_match(shape in shape_strategy(1..=3), pick in any::<u64>(), seed in any::<u64>()) {
        let rt = fresh_runtime();
        let r = shape.len();
        let axes: Vec<usize> = (0..r).filter(|d| pick >> d & 1 == 1).collect();
        let axes = if axes.is_empty() { vec![(pick as usize / 8) % r] } else { axes };
        let x = Array::random(F32, shape.clone(), seed, -1.0, 1.0);
        for red in [Red::Sum, Red::Mean, Red::Max, Red::Min] {
            let ax = axes.clone();
            check_op(&rt, std::slice::from_ref(&x), &move |t| match red {
                Red::Sum => t[0].sum(&ax),
                Red::Mean => t[0].mean(&ax),
                Red::Max => t[0].max(&ax),
                Red::Min => t[0].min(&ax),
            }, &|h| h_reduce(&h[0], &axes, red), seed ^ 4).map_err(|e| TestCaseError::fail(format!("{red:?} over {axes:?}: {e}")))?;
        }
        let axis = axes[0];
        check_op(&rt, &[x], &|t| t[0].softmax(axis), &|h| h_softmax(&h[0], axis), seed ^ 6)
            .map_err(|e| TestCaseError::fail(format!("softmax: {e}")))?;
    }

    #[test]
    fn movement_gradients_match(shape in shape_strategy(1..=3), pick in any::<u64>(), seed in any::<u64>()) {
        let rt = fresh_runtime();
        let r = shape.len();
        let x = Array::random(F32, shape.clone(), seed, -1.0, 1.0);
        // reshape (to the flat size, then back to a 2-d split)
        let total: usize = shape.iter().product();
        check_op(&rt, std::slice::from_ref(&x), &|t| t[0].reshape(&[total]), &|h| H { shape: vec![total], data: h[0].data.clone() }, seed)
            .map_err(TestCaseError::fail)?;
        // transpose (a rotation of the dims)
        let perm: Vec<usize> = (0..r).map(|d| (d + pick as usize) % r).collect();
        check_op(&rt, std::slice::from_ref(&x), &|t| t[0].transpose(&perm), &|h| h_transpose(&h[0], &perm), seed ^ 1)
            .map_err(TestCaseError::fail)?;
        // broadcast: a new leading dim, and a size-1 dim expanded
        let mut one = shape.clone();
        one[0] = 1;
        let x1 = Array::random(F32, one.clone(), seed ^ 2, -1.0, 1.0);
        let mut out = vec![3];
        out.extend(shape.iter().copied());
        out[1] = 4;
        let dims: Vec<usize> = (1..=r).collect();
        check_op(&rt, &[x1], &|t| t[0].broadcast_in_dim(&out, &dims), &|h| h_broadcast(&h[0], &out, &dims), seed ^ 3)
            .map_err(TestCaseError::fail)?;
        // slice
        let start: Vec<usize> = shape.iter().map(|&s| (pick as usize) % s).collect();
        let limit: Vec<usize> = shape.iter().zip(&start).map(|(&s, &a)| a + 1 + (pick as usize / 3) % (s - a)).collect();
        check_op(&rt, std::slice::from_ref(&x), &|t| t[0].slice(&start, &limit), &|h| h_slice(&h[0], &start, &limit), seed ^ 4)
            .map_err(TestCaseError::fail)?;
        // concat along a dim, of three parts
        let axis = (pick as usize) % r;
        let y = Array::random(F32, shape.clone(), seed ^ 5, -1.0, 1.0);
        check_op(&rt, &[x.clone(), y, x], &|t| t[0].concat(&[&t[1], &t[2]], axis), &|h| h_concat(&[&h[0], &h[1], &h[2]], axis), seed ^ 6)
            .map_err(TestCaseError::fail)?;
    }
}

/// A composite: one parameter used by several ops (the cotangents add),
/// a rank-0 loss through `grad`.
#[test]
fn a_parameter_used_twice_gets_the_sum_of_both_paths() {
    let rt = fresh_runtime();
    let x = Array::random(F32, [3, 4], 11, -1.0, 1.0);
    let w = Array::random(F32, [4, 2], 12, -1.0, 1.0);
    let host = |h: &[H]| {
        let d = DotDims {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
        };
        let y = h_dot(&h[0], &h[1], &d);
        let t = y.map(f64::tanh).zip(&y, |a, b| a * b);
        H {
            shape: vec![],
            data: vec![t.data.iter().sum::<f64>() / 6.0],
        }
    };
    let xt = rt.tensor(&x).unwrap().requires_grad().unwrap();
    let wt = rt.tensor(&w).unwrap().requires_grad().unwrap();
    let y = xt.matmul(&wt).unwrap();
    let loss = y.tanh().unwrap().mul(&y).unwrap().mean(&[0, 1]).unwrap();
    let g = grad(&loss, &[&xt, &wt]).unwrap();
    let one = H {
        shape: vec![],
        data: vec![1.0],
    };
    let num = numeric_grad(&host, &[H::of(&x), H::of(&w)], &one);
    for (g, n) in g.iter().zip(&num) {
        within(g.to_host().unwrap().data(), n, 1e-5, 1e-4).unwrap();
    }
    // The loss itself, after the gradients ran in the same program.
    let l = loss.item().unwrap();
    assert!((l - host(&[H::of(&x), H::of(&w)]).data[0]).abs() < 1e-5);
}

/// Gradients through a sum over a padded (bucketed) axis equal the
/// unpadded ones at valid positions, and padding gets exactly zero.
#[test]
fn padding_does_not_change_the_gradients_of_valid_positions() {
    let rt = fresh_runtime();
    let buckets = Buckets::new([8]).unwrap();
    for len in [3usize, 5, 8] {
        let x = Array::random(F32, [len, 3], len as u64, -1.0, 1.0);
        let g = Array::random(F32, [3], 40 + len as u64, 0.5, 1.5);
        let run = |xt: Tensor| -> (Vec<f64>, Vec<f64>) {
            let xt = xt.requires_grad().unwrap();
            let gt = rt.tensor(&g).unwrap().requires_grad().unwrap();
            let s = xt.shape()[0];
            // mean over rows of softmax(x * g) rows, then a max and a mean
            let y = xt
                .mul(&gt.broadcast_in_dim(&[s, 3], &[1]).unwrap())
                .unwrap();
            let p = y.softmax(0).unwrap().mul(&y).unwrap();
            let loss = p
                .mean(&[0])
                .unwrap()
                .add(&y.max(&[0]).unwrap())
                .unwrap()
                .sum(&[0])
                .unwrap();
            let gr = grad(&loss, &[&xt, &gt]).unwrap();
            (
                gr[0].to_host().unwrap().data().to_vec(),
                gr[1].to_host().unwrap().data().to_vec(),
            )
        };
        let (dx, dg) = run(rt.tensor(&x).unwrap());
        let padded = rt.dynamic(&x, 0, &buckets).unwrap();
        assert_eq!(padded.shape(), &[8, 3]);
        let (pdx, pdg) = run(padded);
        within(&pdx, &dx, 1e-6, 1e-5).unwrap();
        within(&pdg, &dg, 1e-6, 1e-5).unwrap();
        // The host reference too (f64).
        let host = |h: &[H]| {
            let y = H::build(&[len, 3], |i| h[0].at(i) * h[1].data[i[1]]);
            let p = h_softmax(&y, 0).zip(&y, |a, b| a * b);
            let a = h_reduce(&p, &[0], Red::Mean).zip(&h_reduce(&y, &[0], Red::Max), |a, b| a + b);
            H {
                shape: vec![],
                data: vec![a.data.iter().sum()],
            }
        };
        let one = H {
            shape: vec![],
            data: vec![1.0],
        };
        let num = numeric_grad(&host, &[H::of(&x), H::of(&g)], &one);
        within(&dx, &num[0], 1e-4, 1e-3).unwrap();
        within(&dg, &num[1], 1e-4, 1e-3).unwrap();
    }
}

/// Collectives over two devices: the all-reduce's gradient is an
/// all-reduce, the all-gather's a reduce-scatter (and back).
#[test]
fn collective_gradients_match_central_differences() {
    let rt = Runtime::new(RuntimeOptions {
        devices: 2,
        disk_cache: false,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let xs = [
        Array::random(F32, [2, 3], 1, -1.0, 1.0),
        Array::random(F32, [2, 3], 2, -1.0, 1.0),
    ];
    for which in ["all_reduce", "all_gather"] {
        let x = rt.tensor_per_device(&xs).unwrap().requires_grad().unwrap();
        let y = match which {
            "all_reduce" => x.all_reduce_sum().unwrap().mul(&x).unwrap(),
            _ => x.all_gather(0).unwrap().tanh().unwrap(),
        };
        let ws: Vec<Array> = (0..2)
            .map(|d| Array::random(F32, y.shape().to_vec(), 10 + d, -1.0, 1.0))
            .collect();
        let w = rt.tensor_per_device(&ws).unwrap();
        let g = vjp(&[&y], &[&w], &[&x])
            .unwrap()
            .remove(0)
            .to_host_all()
            .unwrap();
        // Host: the loss summed over devices, as a function of both inputs.
        let host = |h: &[H]| -> H {
            let per: Vec<H> = match which {
                "all_reduce" => {
                    let s = h[0].zip(&h[1], |a, b| a + b);
                    vec![s.zip(&h[0], |a, b| a * b), s.zip(&h[1], |a, b| a * b)]
                }
                _ => {
                    let c = h_concat(&[&h[0], &h[1]], 0).map(f64::tanh);
                    vec![c.clone(), c]
                }
            };
            let total: f64 = per
                .iter()
                .zip(&ws)
                .map(|(p, w)| p.data.iter().zip(w.data()).map(|(a, b)| a * b).sum::<f64>())
                .sum();
            H {
                shape: vec![],
                data: vec![total],
            }
        };
        let one = H {
            shape: vec![],
            data: vec![1.0],
        };
        let num = numeric_grad(&host, &[H::of(&xs[0]), H::of(&xs[1])], &one);
        for d in 0..2 {
            within(g[d].data(), &num[d], 2e-4, 2e-3)
                .unwrap_or_else(|e| panic!("{which}, device {d}: {e}"));
        }
    }
}

#[test]
fn gradient_misuse_is_an_error_naming_the_fix() {
    let rt = fresh_runtime();
    let x = rt
        .tensor(&Array::random(F32, [2, 2], 1, -1.0, 1.0))
        .unwrap();
    let y = x.exp().unwrap().sum(&[0, 1]).unwrap();
    // No parameter on the path.
    let e = grad(&y, &[&x]).unwrap_err().to_string();
    assert!(e.contains("requires_grad"), "{e}");
    let p = x.requires_grad().unwrap();
    let z = p.exp().unwrap();
    // A non-scalar loss.
    let e = grad(&z, &[&p]).unwrap_err().to_string();
    assert!(e.contains("rank-0"), "{e}");
    // A computed tensor cannot become a parameter.
    let e = z.requires_grad().unwrap_err().to_string();
    assert!(e.contains("detach"), "{e}");
    // A parameter the loss does not use gets zeros.
    let q = rt
        .tensor(&Array::random(F32, [3], 2, -1.0, 1.0))
        .unwrap()
        .requires_grad()
        .unwrap();
    let l = z.sum(&[0, 1]).unwrap();
    let g = grad(&l, &[&q]).unwrap().remove(0).to_host().unwrap();
    assert_eq!(g.data(), &[0.0, 0.0, 0.0]);
    // detach cuts the path: d/dp of detach(p)·p is detach(p), not 2p.
    let d = p.detach().unwrap().mul(&p).unwrap().sum(&[0, 1]).unwrap();
    let g = grad(&d, &[&p]).unwrap().remove(0).to_host().unwrap();
    assert_eq!(g.data(), x.to_host().unwrap().data());
    // A kernel without a declared backward: an error naming it.
    let k = kernels::find("rms_norm").unwrap();
    let cfg = kernels::Config::parse(k, &[]).unwrap();
    let kernel = k
        .build_with_shapes(&cfg, &[("x", vec![2usize, 128]), ("gamma", vec![128])])
        .unwrap();
    let xk = rt
        .tensor(&Array::random(F32, [2, 128], 3, -1.0, 1.0))
        .unwrap()
        .requires_grad()
        .unwrap();
    let gk = rt.tensor(&Array::random(F32, [128], 4, -1.0, 1.0)).unwrap();
    let out = rt
        .call(&kernel, &[&xk, &gk])
        .unwrap()
        .remove(0)
        .sum(&[0, 1])
        .unwrap();
    let e = grad(&out, &[&xk]).unwrap_err().to_string();
    assert!(
        e.contains("`rms_norm`") && e.contains("declares no backward"),
        "{e}"
    );
}

/// erf in f64 (Abramowitz–Stegun 7.1.26 is too coarse for a gradient
/// check; this is the series, exact to f64 roundoff for |x| ≤ 2).
fn erf64(x: f64) -> f64 {
    let mut term = x;
    let mut sum = x;
    for n in 1..60 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * std::f64::consts::FRAC_2_SQRT_PI
}

/// SGD with momentum and AdamW against f64 host versions of the same
/// update rules (PyTorch's), over a few steps of a loss with a known
/// gradient; after the first step, every step is a compile-cache hit.
#[test]
fn optimizers_match_their_f64_host_rules_and_compile_once() {
    use graph::{AdamW, Sgd};
    let rt = fresh_runtime();
    let shape = [3, 5];
    let w0 = Array::random(F32, shape, 1, -1.0, 1.0);
    let c = Array::random(F32, shape, 2, 0.5, 2.0);
    let d = Array::random(F32, shape, 3, -1.0, 1.0);
    let (ct, dt) = (rt.tensor(&c).unwrap(), rt.tensor(&d).unwrap());
    // loss = Σ c·w²/2 + d·w, so ∇ = c·w + d
    let host_grad = |w: &[f64]| -> Vec<f64> {
        w.iter()
            .zip(c.data())
            .zip(d.data())
            .map(|((w, c), d)| c * w + d)
            .collect()
    };
    for which in ["sgd", "adamw"] {
        let mut w = vec![rt.tensor(&w0).unwrap().requires_grad().unwrap()];
        let mut sgd = Sgd::new(&rt, &w, 0.1, 0.9, 0.01).unwrap();
        let mut adam = AdamW::new(&rt, &w, 0.05, 0.1).unwrap();
        let mut hw: Vec<f64> = w0.data().to_vec();
        let mut hb = vec![0.0; hw.len()];
        let (mut hm, mut hv) = (vec![0.0; hw.len()], vec![0.0; hw.len()]);
        let mut compiles_after_first = 0;
        for step in 1..=4 {
            let loss = w[0]
                .mul(&w[0])
                .unwrap()
                .mul(&ct)
                .unwrap()
                .scale(0.5)
                .unwrap()
                .add(&w[0].mul(&dt).unwrap())
                .unwrap()
                .sum(&[0, 1])
                .unwrap();
            let g = grad(&loss, &[&w[0]]).unwrap();
            w = if which == "sgd" {
                sgd.step(&w, &g).unwrap()
            } else {
                adam.step(&w, &g).unwrap()
            };
            rt.sync(&[&loss, &w[0]]).unwrap();
            let hg = host_grad(&hw);
            for i in 0..hw.len() {
                if which == "sgd" {
                    let g = hg[i] + 0.01 * hw[i];
                    hb[i] = 0.9 * hb[i] + g;
                    hw[i] -= 0.1 * hb[i];
                } else {
                    hw[i] *= 1.0 - 0.05 * 0.1;
                    hm[i] = 0.9 * hm[i] + 0.1 * hg[i];
                    hv[i] = 0.999 * hv[i] + 0.001 * hg[i] * hg[i];
                    let mh = hm[i] / (1.0 - 0.9f64.powi(step));
                    let vh = hv[i] / (1.0 - 0.999f64.powi(step));
                    hw[i] -= 0.05 * mh / (vh.sqrt() + 1e-8);
                }
            }
            let got = w[0].to_host().unwrap();
            within(got.data(), &hw, 1e-5, 1e-4)
                .unwrap_or_else(|e| panic!("{which} step {step}: {e}"));
            if step == 1 {
                compiles_after_first = rt.stats().compiles;
            }
        }
        assert_eq!(
            rt.stats().compiles,
            compiles_after_first,
            "{which}: steps 2..4 recompiled"
        );
    }
}
