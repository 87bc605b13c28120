//! The MoE router's top-k: for each token, the `k` experts with the
//! largest logits (ties to the lower expert index) and their softmax
//! weights, optionally renormalized over the chosen `k` (Mixtral,
//! DeepSeek). Built on [`kernel_ir::top_k`]: compare-and-select passes the
//! TPU compiler takes, where `lax.top_k` does not lower in a Pallas kernel.

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param};
#[cfg(feature = "graph")]
use crate::recording::{backward_error, build_error};
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};

/// Router top-k over `x[tokens, experts]`: `weights[tokens, k]` (f32) and
/// `experts[tokens, k]` (i32), largest first.
#[tpu_kernel(grid = (kernel_ir::cdiv(tokens, bt),), semantics = (parallel,))]
pub fn router_top_k<T: Float>(
    bt: usize,
    k: usize,
    normalize: bool,
    #[shape(tokens, experts)]
    #[block([bt, experts], |i| (i, 0))]
    x: In<T>,
    #[shape(tokens, k)]
    #[block([bt, k], |i| (i, 0))]
    weights: Out<f32>,
    #[shape(tokens, k)]
    #[block([bt, k], |i| (i, 0))]
    ids: Out<i32>,
) {
    let (chosen, w, _) = route(x.load(..).convert(F32), k, normalize);
    weights.store(.., w);
    ids.store(.., chosen);
}

/// The choice and its weights from `logits[rows, experts]` (f32):
/// `(chosen experts, their weights, without normalize every expert's
/// exp(logit − max) and their sum)`: the softmax's parts, divided only
/// by the backward that needs them. Ranked by logit (softmax is
/// monotone), so f32 rounding of the probabilities cannot reorder
/// near-equal experts.
#[kernel_fn]
fn route(logits: Tile, k: usize, normalize: bool) -> (Tile, Tile, Option<(Tile, Tile)>) {
    let (top, chosen) = top_k(logits, k, 1);
    let m = logits.max_keep(1);
    let e = (top - m).exp();
    if normalize {
        (chosen, e / e.sum_keep(1), None)
    } else {
        let all = (logits - m).exp();
        let total = all.sum_keep(1);
        (chosen, e / total, Some((all, total)))
    }
}

/// The router's backward: `dx[tokens, experts]` from the weights'
/// cotangent `dweights[tokens, k]`, the top k chosen again from `x` (the
/// choice itself carries no gradient). With `normalize` only the chosen
/// logits move: `dx[c_j] = w_j·(dw_j − Σ_i w_i·dw_i)`; without it every
/// logit does, through the full softmax `p`: `dx = p·(dw scattered to the
/// chosen experts − Σ_i w_i·dw_i)`.
#[tpu_kernel(grid = (kernel_ir::cdiv(tokens, bt),), semantics = (parallel,))]
pub fn router_top_k_backward<T: Float>(
    bt: usize,
    k: usize,
    normalize: bool,
    #[shape(tokens, experts)]
    #[block([bt, experts], |i| (i, 0))]
    x: In<T>,
    #[shape(tokens, k)]
    #[block([bt, k], |i| (i, 0))]
    dweights: In<f32>,
    #[shape(tokens, experts)]
    #[block([bt, experts], |i| (i, 0))]
    dx: Out<T>,
) {
    let logits = x.load(..).convert(F32);
    let (chosen, w, p) = route(logits, k, normalize);
    let g = dweights.load(..);
    let wg = (w * g).sum_keep(1);
    // Each chosen expert's term, put in its column: lane j of the k
    // choices compared with every expert's index (f32: exact ids, and
    // lane sums the TPU reduces).
    let (lane, ids) = (iota(I32, [bt, k], 1), chosen.convert(F32));
    let column = iota(F32, [bt, experts], 1);
    let mut acc = select(column < 0.0, logits, 0.0);
    #[unroll]
    for j in 0..k {
        let hit = column == choice(lane, j, ids);
        let term = if normalize {
            choice(lane, j, w) * (choice(lane, j, g) - wg)
        } else {
            choice(lane, j, g)
        };
        acc = acc + select(hit, term, 0.0);
    }
    let grad = if let Some((all, total)) = p {
        all / total * (acc - wg)
    } else {
        acc
    };
    dx.store(.., grad.cast::<T>());
}

/// Choice `j`'s value of each row of `t[rows, k]`, as `[rows, 1]`.
#[kernel_fn]
fn choice(lane: Tile, j: usize, t: Tile) -> Tile {
    select(lane == j as i32, t, 0.0).sum_keep(1)
}

/// The f64 reference of the backward from the definition: the reference's
/// choice and weights, then `∂w_j/∂x_i` of the (renormalized) softmax.
pub fn backward_reference(x: &Array, dweights: &Array, k: usize, normalize: bool) -> Vec<f64> {
    let (tokens, experts) = (x.shape()[0], x.shape()[1]);
    let (w, ids) = reference(x, k, normalize);
    let mut dx = vec![0.0; tokens * experts];
    for t in 0..tokens {
        let row = &x.data()[t * experts..(t + 1) * experts];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let (wt, gt) = (&w[t * k..(t + 1) * k], &dweights.data()[t * k..(t + 1) * k]);
        let wg: f64 = wt.iter().zip(gt).map(|(a, b)| a * b).sum();
        for i in 0..experts {
            let chosen = (0..k).find(|&j| ids[t * k + j] as usize == i);
            dx[t * experts + i] = match (normalize, chosen) {
                (true, Some(j)) => wt[j] * (gt[j] - wg),
                (true, None) => 0.0,
                (false, c) => (row[i] - m).exp() / total * (c.map_or(0.0, |j| gt[j]) - wg),
            };
        }
    }
    dx
}

/// The router's backward for one call's config.
#[cfg(feature = "graph")]
fn router_vjp(bt: usize, k: usize, normalize: bool) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let x = &call.inputs[0];
        let dw = call.cotangent(0)?;
        let kernel = backward_kernel(x.dtype(), bt, k, normalize, x.shape())
            .map_err(|e| backward_error("router_top_k", e))?;
        let dx = x.runtime().call(&kernel, &[x, &dw])?.remove(0);
        Ok(vec![Some(dx)])
    })
}

fn backward_kernel(
    dtype: DType,
    bt: usize,
    k: usize,
    normalize: bool,
    x: &[usize],
) -> Result<kernel_ir::VerifiedKernel, EntryError> {
    let [tokens, experts] = dims(x, "x")?;
    check_k(k, experts)?;
    Ok(router_top_k_backward::build_for(
        dtype,
        bt.min(tokens),
        k,
        normalize,
        router_top_k_backward::Dims { tokens, experts },
    )?)
}

fn check_k(k: usize, experts: usize) -> Result<(), EntryError> {
    if k > experts {
        return Err(EntryError::Shape(format!(
            "k = {k} experts per token, but x has {experts}; pick k <= {experts}"
        )));
    }
    Ok(())
}

/// Records [`router_top_k`](mod@router_top_k) of `x[tokens, experts]` on
/// the graph runtime with its backward: `(weights, ids)`, `[tokens, k]`
/// f32 and i32; the weights carry the gradient to `x`.
#[cfg(feature = "graph")]
pub fn call_router_top_k(
    x: &Tensor,
    k: usize,
    normalize: bool,
) -> Result<(Tensor, Tensor), RuntimeError> {
    let bt = 64;
    let [tokens, experts] = dims(x.shape(), "x").map_err(|e| build_error("router_top_k", e))?;
    check_k(k, experts).map_err(|e| build_error("router_top_k", e))?;
    let kernel = router_top_k::build_for(
        x.dtype(),
        bt.min(tokens),
        k,
        normalize,
        router_top_k::Dims { tokens, experts },
    )
    .map_err(|e| build_error("router_top_k", e))?;
    let mut out = x
        .runtime()
        .call_with_vjp(&kernel, &[x], router_vjp(bt, k, normalize))?;
    let ids = out.remove(1);
    Ok((out.remove(0), ids))
}

/// The f64 reference from the definition: each row's experts sorted by
/// logit, descending, ties by index (a stable sort), NaN first; weights
/// from the f64 softmax.
pub fn reference(x: &Array, k: usize, normalize: bool) -> (Vec<f64>, Vec<f64>) {
    let (tokens, experts) = (x.shape()[0], x.shape()[1]);
    let (mut w, mut ids) = (Vec::new(), Vec::new());
    for row in x.data().chunks(experts.max(1)).take(tokens) {
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| {
            let (va, vb) = (row[a], row[b]);
            match (va.is_nan(), vb.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Less,
                (false, true) => std::cmp::Ordering::Greater,
                _ => vb.total_cmp(&va),
            }
        });
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let all: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let picked: Vec<usize> = order.into_iter().take(k).collect();
        let top: f64 = picked.iter().map(|&e| (row[e] - m).exp()).sum();
        for &e in &picked {
            w.push((row[e] - m).exp() / if normalize { top } else { all });
            ids.push(e as f64);
        }
    }
    (w, ids)
}

/// [`router_top_k`](mod@router_top_k) in the library.
pub const ROUTER_TOP_K: Entry = Entry {
    name: "router_top_k",
    fixed_inputs: None,
    backward: crate::entry::backward!(|c, _| Ok(router_vjp(
        c.usize("bt")?,
        c.usize("k")?,
        c.bool("normalize")?
    ))),
    about: "MoE router: each token's top-k experts by logit (ties to the lower index) and their softmax weights",
    params: &[
        DTYPE,
        param("k", ParamKind::Positive, "2", "experts per token"),
        param(
            "normalize",
            ParamKind::Bool,
            "false",
            "weights renormalized over the chosen k (they sum to 1)",
        ),
        param("bt", ParamKind::Positive, "64", "tokens per block"),
    ],
    inputs: |_| Ok(vec![("x", vec![256, 128])]),
    build: |c, s| {
        let [tokens, experts] = dims(&s[0], "x")?;
        let k = c.usize("k")?;
        check_k(k, experts)?;
        Ok(router_top_k::build_for(
            c.dtype("dtype")?,
            c.usize("bt")?.min(tokens),
            k,
            c.bool("normalize")?,
            router_top_k::Dims { tokens, experts },
        )?)
    },
    reference: |c, a| {
        let (w, ids) = reference(&a[0], c.usize("k")?, c.bool("normalize")?);
        Ok(vec![w, ids])
    },
    check: no_check,
    tolerance: |_, _| {
        vec![
            Tolerance::for_dtype(DType::F32),
            Tolerance { abs: 0.0, rel: 0.0 },
        ]
    },
    sample: crate::entry::uniform_inputs,
    presets: &[Preset {
        name: "router_top_8_bf16",
        about: "top 8 of 64 experts from bf16 logits (many ties), renormalized",
        config: &[("dtype", "bf16"), ("k", "8"), ("normalize", "true")],
        shapes: &[("x", &[256, 64])],
    }],
};

/// [`router_top_k_backward`](mod@router_top_k_backward) in the library.
pub const ROUTER_TOP_K_BACKWARD: Entry = Entry {
    name: "router_top_k_backward",
    fixed_inputs: None,
    backward: None,
    about: "MoE router backward: the logits' gradient from the top-k weights' (the choice made again from x)",
    params: ROUTER_TOP_K.params,
    inputs: |c| {
        Ok(vec![
            ("x", vec![256, 128]),
            ("dweights", vec![256, c.usize("k")?]),
        ])
    },
    build: |c, s| {
        let k = c.usize("k")?;
        if s[1] != [s[0][0], k] {
            return Err(EntryError::Shape(format!(
                "dweights is {:?}; give one cotangent per token and choice, [{}, {k}]",
                s[1], s[0][0]
            )));
        }
        backward_kernel(
            c.dtype("dtype")?,
            c.usize("bt")?,
            k,
            c.bool("normalize")?,
            &s[0],
        )
    },
    reference: |c, a| {
        Ok(vec![backward_reference(
            &a[0],
            &a[1],
            c.usize("k")?,
            c.bool("normalize")?,
        )])
    },
    check: no_check,
    tolerance: |c, _| vec![Tolerance::for_dtype(c.dtype("dtype").unwrap_or(DType::F32))],
    sample: crate::entry::uniform_inputs,
    presets: &[],
};
