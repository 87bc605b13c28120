//! Optimizers as deferred ops: each step records the update of every
//! parameter (and its state) as graph ops, so the forward, the backward and
//! the update are one module at the next sync, compiled once. State lives
//! in tensors ([`Sgd::state`], [`AdamW::state`]), uploaded at the start so
//! every step has the same structure (the first step's module is the
//! steady state's: a cache hit from the second step on), and per-step
//! scalars (learning rate, bias corrections) are uploaded as tensors, so a
//! value that changes per step never changes the module.
//!
//! ```no_run
//! # fn main() -> Result<(), graph::RuntimeError> {
//! use kernel_ir::{Array, DType};
//! use graph::{AdamW, Runtime, grad};
//!
//! let rt = Runtime::cpu()?;
//! let mut w = vec![rt.tensor(&Array::random(DType::F32, [8, 2], 2, -1.0, 1.0))?.requires_grad()?];
//! let mut opt = AdamW::new(&rt, &w, 1e-3, 0.01)?;
//! let x = rt.tensor(&Array::random(DType::F32, [4, 8], 1, -1.0, 1.0))?;
//! for _ in 0..10 {
//!     let loss = x.matmul(&w[0])?.tanh()?.sum(&[0, 1])?;
//!     let g = grad(&loss, &[&w[0]])?;
//!     w = opt.step(&w, &g)?;               // recorded
//!     rt.sync(&[&loss, &w[0]])?;           // forward, backward, update: one run
//! }
//! # Ok(()) }
//! ```

use kernel_ir::{Array, DType};

use super::node::without_grad;
use super::{Runtime, RuntimeError, Tensor};

fn record_err(message: String) -> RuntimeError {
    RuntimeError::Record {
        message,
        loc: std::panic::Location::caller().to_string(),
    }
}

/// Zeros shaped like each parameter, uploaded.
fn zeros_like_all(rt: &Runtime, params: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
    params
        .iter()
        .map(|p| rt.tensor(&Array::zeros(p.dtype(), p.shape().to_vec())))
        .collect()
}

/// A step's scalars as uploaded rank-0 tensors, once per dtype (not per
/// parameter).
struct StepScalars<'a> {
    values: &'a [f64],
    uploaded: Vec<(DType, Vec<Tensor>)>,
}

impl<'a> StepScalars<'a> {
    fn new(values: &'a [f64]) -> Self {
        StepScalars {
            values,
            uploaded: Vec::new(),
        }
    }

    /// The scalars in `p`'s dtype, on `p`'s runtime.
    fn of(&mut self, p: &Tensor) -> Result<&[Tensor], RuntimeError> {
        let d = p.dtype();
        let i = match self.uploaded.iter().position(|(e, _)| *e == d) {
            Some(i) => i,
            None => {
                let ts = self
                    .values
                    .iter()
                    .map(|&v| {
                        let a = Array::new(d, Vec::<usize>::new(), vec![v])
                            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
                        p.runtime().tensor(&a)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.uploaded.push((d, ts));
                self.uploaded.len() - 1
            }
        };
        Ok(&self.uploaded[i].1)
    }
}

fn check_step(state: &[Tensor], params: &[Tensor], grads: &[Tensor]) -> Result<(), RuntimeError> {
    if params.len() != state.len() || grads.len() != state.len() {
        return Err(record_err(format!(
            "the optimizer holds state for {} parameters; got {} parameters and {} gradients",
            state.len(),
            params.len(),
            grads.len()
        )));
    }
    for (i, ((p, g), s)) in params.iter().zip(grads).zip(state).enumerate() {
        if p.shape() != s.shape() || g.shape() != s.shape() || p.dtype() != g.dtype() {
            return Err(record_err(format!(
                "parameter {i}: {}{:?} with gradient {}{:?}, the optimizer's state is {:?}; pass the parameters in the order the optimizer was made with",
                p.dtype(),
                p.shape(),
                g.dtype(),
                g.shape(),
                s.shape()
            )));
        }
    }
    Ok(())
}

/// The new parameters as parameters again (leaves of the next step's
/// tape).
fn as_params(ps: Vec<Tensor>) -> Result<Vec<Tensor>, RuntimeError> {
    ps.iter().map(Tensor::requires_grad).collect()
}

/// Stochastic gradient descent with momentum and (coupled) weight decay,
/// as PyTorch's `SGD`: `g' = g + wd·p`, `b = μ·b + g'`, `p = p − lr·b`.
#[derive(Debug)]
pub struct Sgd {
    /// Learning rate (may change between steps without a recompile).
    pub lr: f64,
    /// Momentum `μ`.
    pub momentum: f64,
    /// Weight decay added to the gradient.
    pub weight_decay: f64,
    velocity: Vec<Tensor>,
}

impl Sgd {
    /// An optimizer for `params` (its velocity starts at zero).
    pub fn new(
        rt: &Runtime,
        params: &[Tensor],
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    ) -> Result<Sgd, RuntimeError> {
        Ok(Sgd {
            lr,
            momentum,
            weight_decay,
            velocity: zeros_like_all(rt, params)?,
        })
    }

    /// Records one step; returns the new parameters (same order).
    pub fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        check_step(&self.velocity, params, grads)?;
        let mut scalars = StepScalars::new(std::slice::from_ref(&self.lr));
        without_grad(|| {
            let mut out = Vec::with_capacity(params.len());
            for ((p, g), b) in params.iter().zip(grads).zip(self.velocity.iter_mut()) {
                let lr = scalars.of(p)?[0].clone();
                let g = if self.weight_decay != 0.0 {
                    g.add(&p.scale(self.weight_decay)?)?
                } else {
                    g.clone()
                };
                *b = b.scale(self.momentum)?.add(&g)?;
                out.push(p.sub(&b.mul(&lr)?)?);
            }
            as_params(out)
        })
    }

    /// The velocity of each parameter.
    pub fn state(&self) -> Vec<&Tensor> {
        self.velocity.iter().collect()
    }

    /// Replaces the velocity (from a checkpoint); shapes must match.
    pub fn set_state(&mut self, velocity: Vec<Tensor>) -> Result<(), RuntimeError> {
        check_state(&self.velocity, &velocity)?;
        self.velocity = velocity;
        Ok(())
    }
}

fn check_state(old: &[Tensor], new: &[Tensor]) -> Result<(), RuntimeError> {
    if old.len() != new.len()
        || old
            .iter()
            .zip(new)
            .any(|(a, b)| a.shape() != b.shape() || a.dtype() != b.dtype())
    {
        return Err(record_err(
            "the state does not match the optimizer's parameters (count, shapes or dtypes)".into(),
        ));
    }
    Ok(())
}

/// Adam with decoupled weight decay, as PyTorch's `AdamW`:
/// `p = p·(1 − lr·wd)`, `m = β₁m + (1−β₁)g`, `v = β₂v + (1−β₂)g²`,
/// `p = p − lr·m̂/(√v̂ + ε)` with `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`.
#[derive(Debug)]
pub struct AdamW {
    /// Learning rate (may change between steps without a recompile).
    pub lr: f64,
    /// `β₁`.
    pub beta1: f64,
    /// `β₂`.
    pub beta2: f64,
    /// `ε`.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Steps taken.
    pub t: u64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl AdamW {
    /// An optimizer for `params` with PyTorch's defaults (β = 0.9, 0.999,
    /// ε = 1e-8).
    pub fn new(
        rt: &Runtime,
        params: &[Tensor],
        lr: f64,
        weight_decay: f64,
    ) -> Result<AdamW, RuntimeError> {
        Ok(AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            t: 0,
            m: zeros_like_all(rt, params)?,
            v: zeros_like_all(rt, params)?,
        })
    }

    /// Records one step; returns the new parameters (same order).
    pub fn step(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
    ) -> Result<Vec<Tensor>, RuntimeError> {
        check_step(&self.m, params, grads)?;
        self.t += 1;
        let t = self.t as i32;
        let c1 = 1.0 - self.beta1.powi(t);
        let c2 = 1.0 - self.beta2.powi(t);
        let values = [
            1.0 - self.lr * self.weight_decay,
            self.lr / c1,
            1.0 / c2.sqrt(),
        ];
        let mut scalars = StepScalars::new(&values);
        without_grad(|| {
            let mut out = Vec::with_capacity(params.len());
            for (i, (p, g)) in params.iter().zip(grads).enumerate() {
                let s = scalars.of(p)?;
                let (decay, step, rc2) = (s[0].clone(), s[1].clone(), s[2].clone());
                let m = self.m[i]
                    .scale(self.beta1)?
                    .add(&g.scale(1.0 - self.beta1)?)?;
                let v = self.v[i]
                    .scale(self.beta2)?
                    .add(&g.mul(g)?.scale(1.0 - self.beta2)?)?;
                let denom = v.sqrt()?.mul(&rc2)?.add_scalar(self.eps)?;
                out.push(p.mul(&decay)?.sub(&m.mul(&step)?.div(&denom)?)?);
                self.m[i] = m;
                self.v[i] = v;
            }
            as_params(out)
        })
    }

    /// First moments, then second moments, one per parameter each.
    pub fn state(&self) -> Vec<&Tensor> {
        self.m.iter().chain(&self.v).collect()
    }

    /// Replaces the moments and the step count (from a checkpoint).
    pub fn set_state(
        &mut self,
        m: Vec<Tensor>,
        v: Vec<Tensor>,
        t: u64,
    ) -> Result<(), RuntimeError> {
        check_state(&self.m, &m)?;
        check_state(&self.v, &v)?;
        (self.m, self.v, self.t) = (m, v, t);
        Ok(())
    }
}
