//! Token permutation for mixture-of-experts layers: the gather that puts
//! each token's `k` routed copies in expert order before the grouped
//! matmul, and the weighted gather-reduce that brings the experts' outputs
//! back to their tokens after it (tokamax's `RaggedGather` /
//! `RaggedGatherReduce`, Megatron's permute / unpermute).
//!
//! A token's `k` choices are its *slots* `s = t·k + j` (the router's
//! `[tokens, k]` outputs, row-major). Sorting the slots by expert, stably,
//! gives each slot its *position* `pos[s]` in the expert-sorted buffer:
//! [`slot_positions`] on the host, [`crate::routing`] on the device (what
//! a training step uses). Both kernels take `pos`:
//!
//! * [`moe_permute`](mod@moe_permute): `xs[pos[s]] = x[s / k]`;
//! * [`moe_unpermute`](mod@moe_unpermute): `y[t] = Σ_j w[t, j] · ys[pos[t·k + j]]`,
//!   accumulated in f32;
//! * [`moe_unpermute_backward`](mod@moe_unpermute_backward): its cotangents,
//!   `dys[pos[t·k + j]] = w[t, j] · dy[t]` and `dw[t, j] = ⟨dy[t], ys[pos[t·k + j]]⟩`.
//!
//! The permute's backward is an unpermute with weights 1 (each token sums
//! the cotangents of its copies); the unpermute's is the last kernel.
//! Both are declared on the entries, so `grad` and `tessera export` reach
//! them, and [`call_moe_permute`] / [`call_moe_unpermute`] record them.
//!
//! Rows are `[rows, 1, d]` arrays, one row a block (its last two dims are
//! whole, which the TPU's tiling takes for any `d`), so the index maps
//! read the permutation from scalar prefetch and each grid step moves one
//! row, as Pallas's paged attention moves pages.
//!
//! ```
//! use kernels::permute::{inverse, order_by_expert, slot_positions};
//! // Two tokens, two choices each: token 0 → experts 1, 0; token 1 → 2, 1.
//! let order = order_by_expert(&[1, 0, 2, 1], 3);
//! assert_eq!(order, [1, 0, 3, 2]); // expert 0: slot 1; expert 1: slots 0, 3; expert 2: slot 2
//! assert_eq!(slot_positions(&[1, 0, 2, 1], 3), [1, 0, 3, 2]);
//! assert_eq!(inverse(&order), slot_positions(&[1, 0, 2, 1], 3));
//! ```

#[cfg(feature = "graph")]
use std::sync::Arc;

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, arg, dims, param, uniform_inputs,
};
#[cfg(feature = "graph")]
use crate::recording::{backward_error, build_error, shapes_of};
use crate::tolerance::Tolerance;
#[cfg(feature = "graph")]
use graph::{KernelVjp, RuntimeError, Tensor, VjpCall};

/// The slots `0..ids.len()` sorted stably by their expert `ids[s]` (each
/// below `experts`): `order[p]` is the slot at position `p`.
pub fn order_by_expert(ids: &[usize], experts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&s| ids[s].min(experts));
    order
}

/// Each slot's position in expert order, the `pos` the kernels take:
/// `inverse(order_by_expert(ids, experts))`.
pub fn slot_positions(ids: &[usize], experts: usize) -> Vec<usize> {
    inverse(&order_by_expert(ids, experts))
}

/// The inverse permutation: `inverse(order)[order[p]] = p`.
pub fn inverse(order: &[usize]) -> Vec<usize> {
    let mut pos = vec![0; order.len()];
    for (p, &s) in order.iter().enumerate() {
        if let Some(q) = pos.get_mut(s) {
            *q = p;
        }
    }
    pos
}

/// Puts each slot's token row at its place in expert order: `xs[pos[s],
/// 0, :] = x[s / k, 0, :]`. One grid step per slot; consecutive slots of a
/// token read the same block, so each token row is fetched once.
#[tpu_kernel(grid = (n,), semantics = (parallel,))]
pub fn moe_permute<T: Float>(
    k: usize,
    #[shape(n)] pos: Prefetch,
    #[shape(tokens, 1, d)]
    #[block([1, 1, d], |s| (s / k, 0, 0))]
    x: In<T>,
    #[shape(n, 1, d)]
    #[block([1, 1, d], |s| (pos[s], 0, 0))]
    xs: Out<T>,
) {
    xs.store(.., x.load(..));
}

/// What the unpermute and its backward read at grid step `(t, j)`: the
/// slots' positions, the row of token `t`'s slot `j` in expert order, and
/// token `t`'s router weights.
#[operands]
pub(crate) struct SlotRows<T> {
    #[shape(n)]
    pos: Prefetch,
    #[shape(n, 1, d)]
    #[block([1, 1, d], |t, j| (pos[t * k + j], 0, 0))]
    ys: In<T>,
    #[shape(tokens, 1, k)]
    #[block([1, 1, k], |t, _| (t, 0, 0))]
    w: In<f32>,
}

/// Brings the experts' rows back to their tokens, weighted: `y[t, 0, :] =
/// Σ_j w[t, 0, j] · ys[pos[t·k + j], 0, :]`, one slot per step along the
/// grid's second axis, accumulated in f32.
#[tpu_kernel(grid = (tokens, k), semantics = (parallel, arbitrary))]
pub fn moe_unpermute<T: Float>(
    #[operands] _: SlotRows<T>,
    #[shape(tokens, 1, d)]
    #[block([1, 1, d], |t, _| (t, 0, 0))]
    y: Out<T>,
    #[shape(1, d)] acc: Scratch<f32>,
) {
    let j = program_id(1);
    if j == 0 {
        acc.store(.., 0.0);
    }
    // This slot's weight: lane j of the token's k weights.
    let weights = w.load((0, .., ..));
    let wj = select(iota(I32, [1, k], 1) == j, weights, 0.0).sum_keep(1);
    acc.store(.., acc.load(..) + ys.load((0, .., ..)).convert(F32) * wj);
    if j == k - 1 {
        y.store((0, .., ..), acc.load(..).cast::<T>());
    }
}

/// The unpermute's cotangents from `dy`: each slot's row gets its
/// token's cotangent times its weight, `dys[pos[t·k + j]] = w[t, j] ·
/// dy[t]`, and each weight the dot of its token's cotangent with the row it
/// weighted, `dw[t, j] = ⟨dy[t], ys[pos[t·k + j]]⟩` (f32).
#[tpu_kernel(grid = (tokens, k), semantics = (parallel, arbitrary))]
pub fn moe_unpermute_backward<T: Float>(
    #[operands] _: SlotRows<T>,
    #[shape(tokens, 1, d)]
    #[block([1, 1, d], |t, _| (t, 0, 0))]
    dy: In<T>,
    #[shape(n, 1, d)]
    #[block([1, 1, d], |t, j| (pos[t * k + j], 0, 0))]
    dys: Out<T>,
    #[shape(tokens, 1, k)]
    #[block([1, 1, k], |t, _| (t, 0, 0))]
    dw: Out<f32>,
    #[shape(1, k)] acc: Scratch<f32>,
) {
    let j = program_id(1);
    if j == 0 {
        acc.store(.., 0.0);
    }
    let lane = iota(I32, [1, k], 1) == j;
    let wj = select(lane, w.load((0, .., ..)), 0.0).sum_keep(1);
    let g = dy.load((0, .., ..)).convert(F32);
    dys.store((0, .., ..), (g * wj).cast::<T>());
    let dot = (g * ys.load((0, .., ..)).convert(F32)).sum_keep(1);
    acc.store(.., acc.load(..) + select(lane, dot, 0.0));
    if j == k - 1 {
        dw.store((0, .., ..), acc.load(..));
    }
}

/// The f64 reference of [`moe_permute`](mod@moe_permute): each slot's
/// token row at the slot's position.
pub fn permute_reference(x: &Array, pos: &[usize], k: usize) -> Vec<f64> {
    let d = x.shape()[2];
    let mut xs = vec![0.0; pos.len() * d];
    for (s, &p) in pos.iter().enumerate() {
        let t = s / k.max(1);
        if p < pos.len() {
            xs[p * d..(p + 1) * d].copy_from_slice(&x.data()[t * d..(t + 1) * d]);
        }
    }
    xs
}

/// The f64 reference of
/// [`moe_unpermute_backward`](mod@moe_unpermute_backward): `(dys, dw)`
/// from their definitions.
pub fn unpermute_backward_reference(
    ys: &Array,
    w: &Array,
    dy: &Array,
    pos: &[usize],
) -> (Vec<f64>, Vec<f64>) {
    let (tokens, k, d) = (w.shape()[0], w.shape()[2], ys.shape()[2]);
    let (mut dys, mut dw) = (vec![0.0; tokens * k * d], vec![0.0; tokens * k]);
    for t in 0..tokens {
        let g = &dy.data()[t * d..(t + 1) * d];
        for j in 0..k {
            let p = pos[t * k + j];
            let row = &ys.data()[p * d..(p + 1) * d];
            dw[t * k + j] = g.iter().zip(row).map(|(a, b)| a * b).sum();
            for c in 0..d {
                dys[p * d + c] = w.data()[t * k + j] * g[c];
            }
        }
    }
    (dys, dw)
}

/// The f64 reference of [`moe_unpermute`](mod@moe_unpermute): each token's
/// rows gathered from its slots' positions, weighted and summed.
pub fn unpermute_reference(ys: &Array, w: &Array, pos: &[usize]) -> Vec<f64> {
    let (tokens, k, d) = (w.shape()[0], w.shape()[2], ys.shape()[2]);
    let mut y = vec![0.0; tokens * d];
    for t in 0..tokens {
        for j in 0..k {
            let p = pos[t * k + j];
            let wj = w.data()[t * k + j];
            for c in 0..d {
                y[t * d + c] += wj * ys.data()[p * d + c];
            }
        }
    }
    y
}

fn indices(a: &Array) -> Vec<usize> {
    a.data().iter().map(|&v| v as usize).collect()
}

/// The prefetch array named `name` must be a permutation of `0..n`: each
/// position read once (a repeat would leave another row unwritten).
fn check_permutation(
    k: &kernel_ir::VerifiedKernel,
    a: &[Array],
    name: &str,
) -> Result<(), EntryError> {
    let Some(p) = arg(k, a, name) else {
        return Ok(());
    };
    let n = p.data().len();
    let mut seen = vec![false; n];
    for &v in p.data() {
        let i = v as usize;
        if v < 0.0 || i >= n || std::mem::replace(&mut seen[i], true) {
            return Err(EntryError::Input(format!(
                "{name} must be a permutation of 0..{n} (each slot once); {v} is out of range or repeated: build it with kernels::permute::slot_positions (or kernels::routing on the device)"
            )));
        }
    }
    Ok(())
}

/// A random routing of `n` slots over 8 experts (some left empty), as the
/// positions the kernels take.
fn sampled_positions(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = kernel_ir::SplitMix64(seed);
    let ids: Vec<usize> = (0..n).map(|_| rng.below(8) / 2 * 2).collect();
    slot_positions(&ids, 8)
}

fn i32_array(v: &[usize]) -> Array {
    Array::new(DType::I32, [v.len()], v.iter().map(|&x| x as f64).collect())
        .unwrap_or_else(|_| Array::zeros(DType::I32, [v.len()]))
}

/// [`moe_permute`](mod@moe_permute) in the library.
pub const MOE_PERMUTE: Entry = Entry {
    name: "moe_permute",
    fixed_inputs: None,
    backward: crate::entry::backward!(|_, s| Ok(permute_vjp(s[1][0], s[0][0] / s[1][0].max(1)))),
    about: "MoE token permute: each routed slot's token row placed in expert order, xs[pos[s]] = x[s / k] (pos from kernels::permute::slot_positions or kernels::routing)",
    params: &[
        DTYPE,
        param("k", ParamKind::Positive, "2", "experts per token"),
    ],
    inputs: |c| {
        let (tokens, d) = (128, 256);
        Ok(vec![
            ("pos", vec![tokens * c.usize("k")?]),
            ("x", vec![tokens, 1, d]),
        ])
    },
    build: |c, s| {
        let k = c.usize("k")?;
        let (n, tokens, d) = permute_dims(s, k)?;
        Ok(moe_permute::build_for(
            c.dtype("dtype")?,
            k,
            moe_permute::Dims { n, tokens, d },
        )?)
    },
    reference: |c, a| {
        Ok(vec![permute_reference(
            &a[1],
            &indices(&a[0]),
            c.usize("k")?,
        )])
    },
    check: |_, k, a| check_permutation(k, a, "pos"),
    // A copy: exact.
    tolerance: |_, _| vec![Tolerance { abs: 0.0, rel: 0.0 }],
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        v[0] = i32_array(&sampled_positions(v[0].data().len(), seed));
        v
    },
    presets: &[Preset {
        name: "moe_permute_top2_bf16",
        about: "512 bf16 tokens of 1024 routed to 2 experts each, placed in expert order",
        config: &[("dtype", "bf16")],
        shapes: &[("pos", &[1024]), ("x", &[512, 1, 1024])],
    }],
};

/// `(n, tokens, d)` of a permute's `pos` and `x` with `k` slots a token.
fn permute_dims(s: &[Vec<usize>], k: usize) -> Result<(usize, usize, usize), EntryError> {
    let [n] = dims(&s[0], "pos")?;
    let [tokens, one, d] = dims(&s[1], "x")?;
    if one != 1 || n != tokens * k {
        return Err(EntryError::Shape(format!(
            "x is {:?} and pos has {n} slots; give x as [tokens, 1, d] and pos tokens * k = {} long",
            s[1],
            tokens * k
        )));
    }
    Ok((n, tokens, d))
}

/// `(n, d, tokens, k)` of an unpermute's `pos`, `ys` and `w` (and its
/// backward's `dy`, which must be `[tokens, 1, d]`).
fn unpermute_dims(s: &[Vec<usize>]) -> Result<(usize, usize, usize, usize), EntryError> {
    let [n] = dims(&s[0], "pos")?;
    let [rows, one, d] = dims(&s[1], "ys")?;
    let [tokens, one_w, k] = dims(&s[2], "w")?;
    let dy_fits = s.get(3).is_none_or(|dy| dy == &[tokens, 1, d]);
    if one != 1 || one_w != 1 || rows != n || n != tokens * k || !dy_fits {
        return Err(EntryError::Shape(format!(
            "pos {:?}, ys {:?}, w {:?}{}: give w as [tokens, 1, k], ys as [tokens * k, 1, d], pos tokens * k long{}",
            s[0],
            s[1],
            s[2],
            s.get(3).map_or(String::new(), |dy| format!(", dy {dy:?}")),
            if s.len() > 3 {
                " and dy as [tokens, 1, d]"
            } else {
                ""
            },
        )));
    }
    Ok((n, d, tokens, k))
}

/// The permute's backward: each token's cotangent is the sum of its
/// copies', an unpermute of `dxs` with weights 1.
#[cfg(feature = "graph")]
fn permute_vjp(tokens: usize, k: usize) -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let (pos, x) = (&call.inputs[0], &call.inputs[1]);
        let rt = x.runtime();
        let dxs = call.cotangent(0)?;
        let (n, d) = (tokens * k, x.shape()[2]);
        let kernel = moe_unpermute::build_for(x.dtype(), moe_unpermute::Dims { n, d, tokens, k })
            .map_err(|e| backward_error("moe_permute", e.into()))?;
        let ones = rt.scalar(1.0, DType::F32).broadcast_to(&[tokens, 1, k])?;
        let dx = rt.call(&kernel, &[pos, &dxs, &ones])?.remove(0);
        Ok(vec![None, Some(dx)])
    })
}

/// The unpermute's backward: `dys` and `dw` from one kernel.
#[cfg(feature = "graph")]
fn unpermute_vjp() -> Arc<dyn KernelVjp> {
    Arc::new(move |call: &VjpCall<'_>| {
        let (pos, ys, w) = (&call.inputs[0], &call.inputs[1], &call.inputs[2]);
        let dy = call.cotangent(0)?;
        let kernel = unpermute_backward_kernel(ys.dtype(), &shapes_of(&[pos, ys, w]))
            .map_err(|e| backward_error("moe_unpermute", e))?;
        let mut g = ys.runtime().call(&kernel, &[pos, ys, w, &dy])?;
        let dw = g.remove(1);
        Ok(vec![None, Some(g.remove(0)), Some(dw)])
    })
}

fn unpermute_backward_kernel(
    dtype: DType,
    s: &[Vec<usize>],
) -> Result<kernel_ir::VerifiedKernel, EntryError> {
    let (n, d, tokens, k) = unpermute_dims(s)?;
    Ok(moe_unpermute_backward::build_for(
        dtype,
        moe_unpermute_backward::Dims { n, d, tokens, k },
    )?)
}

/// Records [`moe_permute`](mod@moe_permute) of `x[tokens, 1, d]` by `pos`
/// (`[tokens·k]` i32) on the graph runtime, with its backward.
#[cfg(feature = "graph")]
pub fn call_moe_permute(pos: &Tensor, x: &Tensor, k: usize) -> Result<Tensor, RuntimeError> {
    let (n, tokens, d) =
        permute_dims(&shapes_of(&[pos, x]), k).map_err(|e| build_error("moe_permute", e))?;
    let kernel = moe_permute::build_for(x.dtype(), k, moe_permute::Dims { n, tokens, d })
        .map_err(|e| build_error("moe_permute", e))?;
    Ok(x.runtime()
        .call_with_vjp(&kernel, &[pos, x], permute_vjp(tokens, k))?
        .remove(0))
}

/// Records [`moe_unpermute`](mod@moe_unpermute) of `ys[tokens·k, 1, d]`
/// by `pos` with weights `w[tokens, 1, k]` (f32) on the graph runtime,
/// with its backward.
#[cfg(feature = "graph")]
pub fn call_moe_unpermute(pos: &Tensor, ys: &Tensor, w: &Tensor) -> Result<Tensor, RuntimeError> {
    let (n, d, tokens, k) =
        unpermute_dims(&shapes_of(&[pos, ys, w])).map_err(|e| build_error("moe_unpermute", e))?;
    let kernel = moe_unpermute::build_for(ys.dtype(), moe_unpermute::Dims { n, d, tokens, k })
        .map_err(|e| build_error("moe_unpermute", e))?;
    Ok(ys
        .runtime()
        .call_with_vjp(&kernel, &[pos, ys, w], unpermute_vjp())?
        .remove(0))
}

/// [`moe_unpermute`](mod@moe_unpermute) in the library.
pub const MOE_UNPERMUTE: Entry = Entry {
    name: "moe_unpermute",
    fixed_inputs: None,
    backward: crate::entry::backward!(|_, _| Ok(unpermute_vjp())),
    about: "MoE token unpermute: each token's expert rows gathered back and summed with its router weights, y[t] = sum_j w[t, j] * ys[pos[t*k + j]] (f32 accumulation)",
    params: &[DTYPE],
    inputs: |_| {
        let (tokens, k, d) = (128, 2, 256);
        Ok(vec![
            ("pos", vec![tokens * k]),
            ("ys", vec![tokens * k, 1, d]),
            ("w", vec![tokens, 1, k]),
        ])
    },
    build: |c, s| {
        let (n, d, tokens, k) = unpermute_dims(s)?;
        Ok(moe_unpermute::build_for(
            c.dtype("dtype")?,
            moe_unpermute::Dims { n, d, tokens, k },
        )?)
    },
    reference: |_, a| Ok(vec![unpermute_reference(&a[1], &a[2], &indices(&a[0]))]),
    check: |_, k, a| check_permutation(k, a, "pos"),
    tolerance: |c: &Config, _| vec![Tolerance::for_dtype(c.dtype("dtype").unwrap_or(DType::F32))],
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        v[0] = i32_array(&sampled_positions(v[0].data().len(), seed));
        v
    },
    presets: &[Preset {
        name: "moe_unpermute_top2_bf16",
        about: "512 bf16 tokens of 1024, each the weighted sum of its 2 experts' rows",
        config: &[("dtype", "bf16")],
        shapes: &[
            ("pos", &[1024]),
            ("ys", &[1024, 1, 1024]),
            ("w", &[512, 1, 2]),
        ],
    }],
};

/// [`moe_unpermute_backward`](mod@moe_unpermute_backward) in the library.
pub const MOE_UNPERMUTE_BACKWARD: Entry = Entry {
    name: "moe_unpermute_backward",
    fixed_inputs: None,
    backward: None,
    about: "MoE unpermute backward: dys[pos[t*k + j]] = w[t, j] * dy[t] and dw[t, j] = <dy[t], ys[pos[t*k + j]]> (f32)",
    params: &[DTYPE],
    inputs: |_| {
        let (tokens, k, d) = (128, 2, 256);
        Ok(vec![
            ("pos", vec![tokens * k]),
            ("ys", vec![tokens * k, 1, d]),
            ("w", vec![tokens, 1, k]),
            ("dy", vec![tokens, 1, d]),
        ])
    },
    build: |c, s| unpermute_backward_kernel(c.dtype("dtype")?, s),
    reference: |_, a| {
        let (dys, dw) = unpermute_backward_reference(&a[1], &a[2], &a[3], &indices(&a[0]));
        Ok(vec![dys, dw])
    },
    check: |_, k, a| check_permutation(k, a, "pos"),
    tolerance: |c: &Config, k| {
        let t = Tolerance::for_dtype(c.dtype("dtype").unwrap_or(DType::F32));
        // dw sums d products in f32.
        let d = k
            .arguments()
            .find(|a| a.name == "ys")
            .map_or(1, |a| a.shape[2]);
        vec![t, Tolerance::matmul(d, DType::F32)]
    },
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        v[0] = i32_array(&sampled_positions(v[0].data().len(), seed));
        v
    },
    presets: &[],
};
