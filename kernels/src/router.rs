//! The MoE router's top-k: for each token, the `k` experts with the
//! largest logits (ties to the lower expert index) and their softmax
//! weights, optionally renormalized over the chosen `k` (Mixtral,
//! DeepSeek). Built on [`kernel_ir::top_k`]: compare-and-select passes the
//! TPU compiler takes, where `lax.top_k` does not lower in a Pallas kernel.

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{DTYPE, Entry, EntryError, ParamKind, Preset, dims, no_check, param};
use crate::tolerance::Tolerance;

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
    let logits = x.load(..).convert(F32);
    // Ranked by logit (softmax is monotone), so f32 rounding of the
    // probabilities cannot reorder near-equal experts.
    let (top, chosen) = top_k(logits, k, 1);
    let m = logits.max_keep(1);
    let e = (top - m).exp();
    let w = if normalize {
        e / e.sum_keep(1)
    } else {
        e / (logits - m).exp().sum_keep(1)
    };
    weights.store(.., w);
    ids.store(.., chosen);
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
    backward: None,
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
        if k > experts {
            return Err(EntryError::Shape(format!(
                "k = {k} experts per token, but x has {experts}; pick k <= {experts}"
            )));
        }
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
