//! Token permutation for mixture-of-experts layers: the gather that puts
//! each token's `k` routed copies in expert order before the grouped
//! matmul, and the weighted gather-reduce that brings the experts' outputs
//! back to their tokens after it (tokamax's `RaggedGather` /
//! `RaggedGatherReduce`, Megatron's permute / unpermute).
//!
//! A token's `k` choices are its *slots* `s = t·k + j` (the router's
//! `[tokens, k]` outputs, row-major). The caller sorts the slots by expert
//! (stably, on the host or in XLA: an argsort of the router's expert ids)
//! into `order`: position `p` of the expert-sorted buffer holds slot
//! `order[p]`. [`inverse`] gives `pos`, each slot's position.
//!
//! * [`moe_permute`](mod@moe_permute): `xs[p] = x[order[p] / k]`;
//! * [`moe_unpermute`](mod@moe_unpermute): `y[t] = Σ_j w[t, j] · ys[pos[t·k + j]]`,
//!   accumulated in f32.
//!
//! Rows are `[rows, 1, d]` arrays, one row a block (its last two dims are
//! whole, which the TPU's tiling takes for any `d`), so the index maps
//! read the permutation from scalar prefetch and each grid step moves one
//! row, as Pallas's paged attention moves pages.
//!
//! ```
//! use kernels::permute::{inverse, order_by_expert};
//! // Two tokens, two choices each: token 0 → experts 1, 0; token 1 → 1, 2.
//! let order = order_by_expert(&[1, 0, 1, 2], 3);
//! assert_eq!(order, [1, 0, 2, 3]); // expert 0: slot 1; expert 1: slots 0, 2; expert 2: slot 3
//! assert_eq!(inverse(&order), [1, 0, 2, 3]);
//! ```

use kernel_ir::Array;
use kernel_ir::prelude::*;

use crate::entry::{
    Config, DTYPE, Entry, EntryError, ParamKind, Preset, arg, dims, param, uniform_inputs,
};
use crate::tolerance::Tolerance;

/// The slots `0..ids.len()` sorted stably by their expert `ids[s]` (each
/// below `experts`): the `order` both kernels take.
pub fn order_by_expert(ids: &[usize], experts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&s| ids[s].min(experts));
    order
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

/// Gathers each slot's token row into expert order: `xs[p, 0, :] =
/// x[order[p] / k, 0, :]`.
#[tpu_kernel(grid = (n,), semantics = (parallel,))]
pub fn moe_permute<T: Float>(
    k: usize,
    #[shape(n)] order: Prefetch,
    #[shape(tokens, 1, d)]
    #[block([1, 1, d], |p| (order[p] / k, 0, 0))]
    x: In<T>,
    #[shape(n, 1, d)]
    #[block([1, 1, d], |p| (p, 0, 0))]
    xs: Out<T>,
) {
    xs.store(.., x.load(..));
}

/// Brings the experts' rows back to their tokens, weighted: `y[t, 0, :] =
/// Σ_j w[t, 0, j] · ys[pos[t·k + j], 0, :]`, one slot per step along the
/// grid's second axis, accumulated in f32.
#[tpu_kernel(grid = (tokens, k), semantics = (parallel, arbitrary))]
pub fn moe_unpermute<T: Float>(
    #[shape(n)] pos: Prefetch,
    #[shape(n, 1, d)]
    #[block([1, 1, d], |t, j| (pos[t * k + j], 0, 0))]
    ys: In<T>,
    #[shape(tokens, 1, k)]
    #[block([1, 1, k], |t, _| (t, 0, 0))]
    w: In<f32>,
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

/// The f64 reference of [`moe_permute`](mod@moe_permute): each output row
/// the token row its slot names.
pub fn permute_reference(x: &Array, order: &[usize], k: usize) -> Vec<f64> {
    let d = x.shape()[2];
    order
        .iter()
        .flat_map(|&s| {
            let t = s / k.max(1);
            x.data()[t * d..(t + 1) * d].to_vec()
        })
        .collect()
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
                "{name} must be a permutation of 0..{n} (each slot once); {v} is out of range or repeated: build it with kernels::permute::order_by_expert (and inverse for pos)"
            )));
        }
    }
    Ok(())
}

/// A random routing of `n` slots over 8 experts (some left empty), as the
/// order both kernels take.
fn sampled_order(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = kernel_ir::SplitMix64(seed);
    let ids: Vec<usize> = (0..n).map(|_| rng.below(8) / 2 * 2).collect();
    order_by_expert(&ids, 8)
}

fn i32_array(v: &[usize]) -> Array {
    Array::new(DType::I32, [v.len()], v.iter().map(|&x| x as f64).collect())
        .unwrap_or_else(|_| Array::zeros(DType::I32, [v.len()]))
}

/// [`moe_permute`](mod@moe_permute) in the library.
pub const MOE_PERMUTE: Entry = Entry {
    name: "moe_permute",
    fixed_inputs: None,
    backward: None,
    about: "MoE token permute: each routed slot's token row gathered into expert order, xs[p] = x[order[p] / k] (order from kernels::permute::order_by_expert)",
    params: &[
        DTYPE,
        param("k", ParamKind::Positive, "2", "experts per token"),
    ],
    inputs: |c| {
        let (tokens, d) = (128, 256);
        Ok(vec![
            ("order", vec![tokens * c.usize("k")?]),
            ("x", vec![tokens, 1, d]),
        ])
    },
    build: |c, s| {
        let [n] = dims(&s[0], "order")?;
        let [tokens, one, d] = dims(&s[1], "x")?;
        let k = c.usize("k")?;
        if one != 1 || n != tokens * k {
            return Err(EntryError::Shape(format!(
                "x is {:?} and order has {n} slots; give x as [tokens, 1, d] and order tokens * k = {} long",
                s[1],
                tokens * k
            )));
        }
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
    check: |_, k, a| check_permutation(k, a, "order"),
    // A copy: exact.
    tolerance: |_, _| vec![Tolerance { abs: 0.0, rel: 0.0 }],
    sample: |c, k, seed| {
        let mut v = uniform_inputs(c, k, seed);
        v[0] = i32_array(&sampled_order(v[0].data().len(), seed));
        v
    },
    presets: &[Preset {
        name: "moe_permute_top2_bf16",
        about: "512 bf16 tokens of 1024 routed to 2 experts each, gathered into expert order",
        config: &[("dtype", "bf16")],
        shapes: &[("order", &[1024]), ("x", &[512, 1, 1024])],
    }],
};

/// [`moe_unpermute`](mod@moe_unpermute) in the library.
pub const MOE_UNPERMUTE: Entry = Entry {
    name: "moe_unpermute",
    fixed_inputs: None,
    backward: None,
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
        let [n] = dims(&s[0], "pos")?;
        let [rows, one, d] = dims(&s[1], "ys")?;
        let [tokens, one_w, k] = dims(&s[2], "w")?;
        if one != 1 || one_w != 1 || rows != n || n != tokens * k {
            return Err(EntryError::Shape(format!(
                "pos {:?}, ys {:?}, w {:?}: give w as [tokens, 1, k], ys as [tokens * k, 1, d] and pos tokens * k long",
                s[0], s[1], s[2]
            )));
        }
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
        v[0] = i32_array(&inverse(&sampled_order(v[0].data().len(), seed)));
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
