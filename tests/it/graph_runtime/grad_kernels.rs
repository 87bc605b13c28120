//! Kernels' declared backwards (through `Entry::call` and `grad`) against
//! central differences of each entry's own f64 reference, over random
//! shapes and configs; the padded transformer block's gradients against
//! central differences of its f64 host reference.

use crate::common::{fresh_runtime, within};
use graph::{Tensor, vjp};
use kernel_ir::prelude::*;
use kernels::{Config, find};
use proptest::prelude::*;

/// The gradient of `Σ_o ⟨w_o, output_o⟩` for `kernel` at `inputs`, by the
/// entry's backward on the runtime and by central differences of the
/// entry's f64 reference; every float input is compared.
fn check_entry(
    name: &str,
    config: &[(&str, &str)],
    inputs: &[Array],
    seed: u64,
) -> Result<(), String> {
    check_entry_at(name, config, inputs, seed, None)
}

/// [`check_entry`] at `per_input` elements of each input drawn from
/// `seed` (all of them with `None`): for inputs too large to difference
/// whole.
fn check_entry_at(
    name: &str,
    config: &[(&str, &str)],
    inputs: &[Array],
    seed: u64,
    per_input: Option<usize>,
) -> Result<(), String> {
    let rt = fresh_runtime();
    let entry = find(name).unwrap();
    let pairs: Vec<(String, String)> = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = Config::parse(entry, &pairs).unwrap();
    let tensors: Vec<Tensor> = inputs
        .iter()
        .map(|a| {
            let t = rt.tensor(a).unwrap();
            if a.dtype().is_float() {
                t.requires_grad().unwrap()
            } else {
                t
            }
        })
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let outs = entry.call(&rt, &cfg, &refs).map_err(|e| e.to_string())?;
    // Integer outputs (a router's expert ids) carry no cotangent: weight 0.
    let ws: Vec<Array> = outs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let w = Array::random(F32, o.shape().to_vec(), seed + i as u64, -1.0, 1.0);
            if o.dtype().is_float() {
                w
            } else {
                Array::zeros(F32, o.shape().to_vec())
            }
        })
        .collect();
    let floats: Vec<usize> = (0..outs.len())
        .filter(|&i| outs[i].dtype().is_float())
        .collect();
    let wt: Vec<Tensor> = floats.iter().map(|&i| rt.tensor(&ws[i]).unwrap()).collect();
    let params: Vec<&Tensor> = tensors.iter().filter(|t| t.dtype().is_float()).collect();
    let grads = vjp(
        &floats.iter().map(|&i| &outs[i]).collect::<Vec<_>>(),
        &wt.iter().collect::<Vec<_>>(),
        &params,
    )
    .map_err(|e| e.to_string())?;
    let loss = |xs: &[Array]| -> f64 {
        let o = entry.reference(&cfg, xs).unwrap();
        o.iter()
            .zip(&ws)
            .map(|(o, w)| {
                // A dead row's lse is −∞ whatever the inputs: a constant,
                // left out so the differences stay finite (NaN still counts).
                o.iter()
                    .zip(w.data())
                    .filter(|(a, _)| !a.is_infinite())
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
            })
            .sum()
    };
    let mut gi = 0;
    for (k, a) in inputs.iter().enumerate() {
        if !a.dtype().is_float() {
            continue;
        }
        let got = grads[gi].to_host().map_err(|e| e.to_string())?;
        gi += 1;
        let picked: Vec<usize> = match per_input {
            None => (0..a.len()).collect(),
            Some(n) => (0..n as u64)
                .map(|i| {
                    (seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(i.wrapping_mul(1442695040888963407))
                        >> 17) as usize
                        % a.len()
                })
                .collect(),
        };
        let mut num = Vec::with_capacity(picked.len());
        for &e in &picked {
            let bump = |d: f64| {
                let mut v = a.data().to_vec();
                v[e] += d;
                let arr = Array::new(a.dtype(), a.shape().to_vec(), v).unwrap();
                let x = arr.data()[e];
                let mut xs = inputs.to_vec();
                xs[k] = arr;
                (loss(&xs), x)
            };
            let h = 1e-3 * a.data()[e].abs().max(1.0);
            let ((lp, xp), (lm, xm)) = (bump(h), bump(-h));
            // The step the f32 input really took.
            num.push((lp - lm) / (xp - xm));
        }
        let scale = num.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let got: Vec<f64> = picked.iter().map(|&e| got.data()[e]).collect();
        within(&got, &num, 2e-3 * scale, 5e-3)
            .map_err(|e| format!("{name} d/d(input {k}): {e}"))?;
    }
    Ok(())
}

fn uniform(shape: &[usize], seed: u64, lo: f64, hi: f64) -> Array {
    Array::random(F32, shape.to_vec(), seed, lo, hi)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]

    #[test]
    fn norm_backwards_match_central_differences(rows in 1usize..9, cols in prop::sample::select(vec![8usize, 16, 128]), seed in any::<u64>()) {
        let x = uniform(&[rows, cols], seed, -1.0, 1.0);
        let g = uniform(&[cols], seed ^ 1, 0.5, 1.5);
        let b = uniform(&[cols], seed ^ 2, -0.5, 0.5);
        let cfg = [("block_rows", "8"), ("eps", "1e-5")];
        check_entry("rms_norm", &cfg, &[x.clone(), g.clone()], seed).map_err(TestCaseError::fail)?;
        check_entry("layer_norm", &cfg, &[x, g, b], seed).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn flash_attention_backward_matches_central_differences(
        s in prop::sample::select(vec![8usize, 16]),
        heads in prop::sample::select(vec![(1usize, 1usize), (2, 2), (2, 1)]),
        causal in any::<bool>(),
        len_pick in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let (h, hkv) = heads;
        let d = 8;
        let q = uniform(&[1, h, s, d], seed, -1.0, 1.0);
        let k = uniform(&[1, hkv, s, d], seed ^ 1, -1.0, 1.0);
        let v = uniform(&[1, hkv, s, d], seed ^ 2, -1.0, 1.0);
        // K is col-major: its block must span the whole sequence (lanes).
        let sk = s.to_string();
        let cfg = [("causal", if causal { "true" } else { "false" }), ("block_q", "8"), ("block_k", sk.as_str())];
        // Both outputs carry a cotangent: o, and the lse (as delta − ct_lse).
        check_entry("flash_attention", &cfg, &[q.clone(), k.clone(), v.clone()], seed)
            .map_err(TestCaseError::fail)?;
        // With a sink per head: dq, dk, dv from the sink-counting lse, and
        // the sinks' own gradient.
        let sinks = uniform(&[h], seed ^ 3, -2.0, 2.0);
        check_entry("flash_attention_sinks", &cfg, &[q.clone(), k.clone(), v.clone(), sinks], seed)
            .map_err(TestCaseError::fail)?;
        // Keys padded past a valid length: their gradients are zero and
        // the others do not see them.
        let len = 1 + (len_pick as usize) % s;
        let kv_len = Array::new(I32, [1], vec![len as f64]).unwrap();
        check_entry("flash_attention_kv_len", &cfg, &[kv_len, q.clone(), k.clone(), v.clone()], seed)
            .map_err(TestCaseError::fail)?;
        // Dropout at 0.3: the backward kernels draw the forward's mask
        // again from the key (a different mask would fail dq, dk and dv).
        let key = Array::new(I32, [2], vec![(seed as u32 as i32).into(), 7.0]).unwrap();
        let mut cfg = cfg.to_vec();
        cfg.push(("rate", "0.3"));
        check_entry("flash_attention_dropout", &cfg, &[key, q, k, v], seed)
            .map_err(TestCaseError::fail)?;
    }

    #[test]
    fn matmul_swiglu_and_rope_backwards_match_central_differences(m in 1usize..6, k in 1usize..9, n in 1usize..7, seed in any::<u64>()) {
        let x = uniform(&[m, k], seed, -1.0, 1.0);
        let w = uniform(&[k, n], seed ^ 1, -0.5, 0.5);
        let bias = uniform(&[1, n], seed ^ 2, -0.5, 0.5);
        let res = uniform(&[m, n], seed ^ 3, -1.0, 1.0);
        for act in ["none", "gelu", "silu"] {
            check_entry("matmul_epilogue", &[("activation", act)], &[x.clone(), w.clone(), bias.clone()], seed)
                .map_err(TestCaseError::fail)?;
        }
        check_entry("matmul_epilogue", &[("activation", "gelu"), ("residual", "true")], &[x.clone(), w.clone(), bias, res], seed)
            .map_err(TestCaseError::fail)?;
        let wu = uniform(&[k, n], seed ^ 4, -0.5, 0.5);
        check_entry("swiglu", &[], &[x, w, wu], seed).map_err(TestCaseError::fail)?;
        let s = m + 1;
        let half = 1 + k % 4;
        let xr = uniform(&[1, 2, s, 2 * half], seed ^ 5, -1.0, 1.0);
        let cos = uniform(&[s, half], seed ^ 6, -1.0, 1.0);
        let sin = uniform(&[s, half], seed ^ 7, -1.0, 1.0);
        check_entry("rope", &[], &[xr, cos, sin], seed).map_err(TestCaseError::fail)?;
        // Dropout's backward is the forward on the cotangent (same mask).
        let key = Array::new(I32, [2], vec![seed as u32 as i32 as f64, 7.0]).unwrap();
        let xd = uniform(&[m + 8, 128 + n], seed ^ 8, -1.0, 1.0);
        check_entry("dropout", &[("rate", "0.3")], &[key, xd], seed).map_err(TestCaseError::fail)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]

    /// Masked attention's declared backward (delta, dq over the tables,
    /// dk/dv over their transpose) against central differences of its f64
    /// reference: per-head masks, packed segments, GQA, soft-cap; both
    /// outputs carry a cotangent.
    #[test]
    fn masked_attention_backward_matches_central_differences(
        masks in prop::sample::select(vec!["causal", "local:3:0;chunked:5&causal", "prefix:4;local:-:2", "causal:-2;full"]),
        s in prop::sample::select(vec![8usize, 16]),
        hkv in 1usize..3,
        softcap in any::<bool>(),
        seed in any::<u64>(),
    ) {
        use kernels::attention::block_table::BlockTables;
        use kernels::attention::mask::MultiHeadMask;
        let (h, d) = (2, 8);
        let m = MultiHeadMask::parse(masks, h).unwrap();
        let t = BlockTables::build(&m, s, s, 8, s).unwrap();
        let ([kind, fetch, mask_fetch], el) = t.arrays();
        let mut r = kernel_ir::SplitMix64(seed);
        let mut ids: Vec<f64> = (0..s).map(|_| r.below(2) as f64).collect();
        ids.sort_by(f64::total_cmp);
        let q_seg = Array::new(I32, [1, s, 1], ids.clone()).unwrap();
        let kv_seg = Array::new(I32, [1, 1, s], ids).unwrap();
        let q = uniform(&[1, h, s, d], seed, -1.0, 1.0);
        let k = uniform(&[1, hkv, s, d], seed ^ 1, -1.0, 1.0);
        let v = uniform(&[1, hkv, s, d], seed ^ 2, -1.0, 1.0);
        let sk = s.to_string();
        let mut cfg = vec![("mask", masks), ("block_q", "8"), ("block_k", sk.as_str())];
        if softcap {
            cfg.push(("softcap", "2"));
        }
        check_entry("masked_attention", &cfg, &[kind, fetch, mask_fetch, q, k, v, el, q_seg, kv_seg], seed)
            .map_err(TestCaseError::fail)?;
    }
}

/// The transformer block (graph rms_norm and projections, the flash
/// attention kernel with its backward): gradients of `Σ w·y` for x and
/// every weight against central differences of the f64 block reference,
/// causal and not, in a padded bucket and not. The padding must not change
/// the gradients of valid positions (the host never sees it).
#[test]
fn transformer_block_gradients_match_the_f64_host_gradient() {
    use graph::{Buckets, grad};
    use tooling::transformer::{BlockWeights, block_forward, block_reference};
    let rt = fresh_runtime();
    let (s, d) = (12, 32);
    let buckets = Buckets::new([16]).unwrap();
    for causal in [true, false] {
        let mut w = BlockWeights::random(d, 2, 21);
        w.causal = causal;
        let x = Array::random(F32, [s, d], 22, -1.0, 1.0);
        let cot = Array::random(F32, [s, d], 23, -1.0, 1.0);
        // Host: central differences of Σ cot·block(x) over every input.
        let loss = |w: &BlockWeights, x: &Array| -> f64 {
            block_reference(w, x)
                .iter()
                .zip(cot.data())
                .map(|(a, b)| a * b)
                .sum()
        };
        let perturbed = |which: usize, e: usize, v: f64| -> f64 {
            let mut w2 = w.clone();
            let mut x2 = x.clone();
            let set = |a: &mut Array| {
                let mut d = a.data().to_vec();
                d[e] = v;
                *a = Array::new(a.dtype(), a.shape().to_vec(), d).unwrap();
            };
            match which {
                0 => set(&mut x2),
                1 => set(&mut w2.gamma),
                2 => set(&mut w2.wq),
                3 => set(&mut w2.wk),
                4 => set(&mut w2.wv),
                _ => set(&mut w2.wo),
            }
            loss(&w2, &x2)
        };
        let arrays = [&x, &w.gamma, &w.wq, &w.wk, &w.wv, &w.wo];
        let want: Vec<Vec<f64>> = arrays
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (0..a.len())
                    .map(|e| {
                        // A power-of-two step: the f32 inputs move by ±h
                        // up to one rounding (6e-5 of h).
                        let v = a.data()[e];
                        let h = 1.0 / 1024.0;
                        (perturbed(i, e, v + h) - perturbed(i, e, v - h)) / (2.0 * h)
                    })
                    .collect()
            })
            .collect();
        for padded in [false, true] {
            let xt = if padded {
                rt.dynamic(&x, 0, &buckets).unwrap()
            } else {
                rt.tensor(&x).unwrap()
            }
            .requires_grad()
            .unwrap();
            let ct = if padded {
                rt.dynamic(&cot, 0, &buckets).unwrap()
            } else {
                rt.tensor(&cot).unwrap()
            };
            let params = w.upload_params(&rt).unwrap();
            let y = block_forward(&w, &params, &xt).unwrap();
            let l = y.mul(&ct).unwrap().sum(&[0, 1]).unwrap();
            let mut wrt = vec![&xt];
            wrt.extend(params.params());
            let g = grad(&l, &wrt).unwrap();
            let names = ["x", "gamma", "wq", "wk", "wv", "wo"];
            for ((gt, want), name) in g.iter().zip(&want).zip(names) {
                let got = gt.to_host().unwrap();
                let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                within(got.data(), want, 2e-3 * scale, 2e-3)
                    .unwrap_or_else(|e| panic!("causal={causal} padded={padded} d/d{name}: {e}"));
            }
        }
    }
}

/// Gradients through a bucketed sequence compile once per bucket: new
/// lengths in a seen bucket reuse its program (forward and backward).
#[test]
fn gradients_compile_once_per_bucket() {
    use graph::{Buckets, grad};
    use tooling::transformer::{BlockWeights, block_forward};
    let rt = fresh_runtime();
    let buckets = Buckets::new([16, 32]).unwrap();
    let w = BlockWeights::random(32, 2, 5);
    let params = w.upload_params(&rt).unwrap();
    let mut compiles = Vec::new();
    for (i, len) in [12usize, 20, 13, 28, 16, 32].into_iter().enumerate() {
        let x = Array::random(F32, [len, 32], i as u64, -1.0, 1.0);
        let xt = rt.dynamic(&x, 0, &buckets).unwrap();
        let y = block_forward(&w, &params, &xt).unwrap();
        let loss = y.mul(&y).unwrap().mean(&[0, 1]).unwrap();
        let g = grad(&loss, &params.params()).unwrap();
        let mut all: Vec<&Tensor> = vec![&loss];
        all.extend(g.iter());
        rt.sync(&all).unwrap();
        assert!(loss.item().unwrap().is_finite());
        compiles.push(rt.stats().compiles);
    }
    // Bucket 16 compiles at the first length, 32 at the second; the rest
    // are hits.
    assert_eq!(compiles, vec![1, 2, 2, 2, 2, 2], "{compiles:?}");
}

/// The fused cross-entropy's backward (the dx and dw kernels, from the
/// saved lse) against central differences of its f64 reference, both
/// outputs carrying a cotangent: two vocabulary tiles, the second ragged,
/// and an ignored row (its loss is constant, its lse is not).
#[test]
fn linear_cross_entropy_backward_matches_central_differences() {
    for (n, v, seed) in [(5usize, 130usize, 1u64), (3, 7, 2)] {
        let x = uniform(&[n, 8], seed, -1.0, 1.0);
        let w = uniform(&[8, v], seed ^ 1, -0.5, 0.5);
        let labels = (0..n)
            .map(|r| {
                if r == 1 {
                    -100.0
                } else {
                    ((r * 37) % v) as f64
                }
            })
            .collect();
        let labels = Array::new(I32, [n, 1], labels).unwrap();
        check_entry(
            "linear_cross_entropy",
            &[("bv", "128")],
            &[x, w, labels],
            seed,
        )
        .unwrap();
    }
}

fn ints(shape: &[usize], v: &[usize]) -> Array {
    Array::new(I32, shape.to_vec(), v.iter().map(|&x| x as f64).collect()).unwrap()
}

/// The MoE layer's kernels' declared backwards (permute, unpermute, the
/// router's top-k weights, the grouped matmul in both rhs forms) against
/// central differences of their f64 references; routings with an empty
/// expert, grouped-matmul tiles that straddle groups.
#[test]
fn moe_backwards_match_central_differences() {
    let (tokens, k, d, experts) = (5, 2, 8, 4);
    let ids = [1, 0, 3, 1, 0, 3, 3, 1, 0, 1];
    let pos = kernels::permute::slot_positions(&ids, experts);
    let x = uniform(&[tokens, 1, d], 1, -1.0, 1.0);
    check_entry("moe_permute", &[("k", "2")], &[ints(&[10], &pos), x], 1).unwrap();
    let ys = uniform(&[tokens * k, 1, d], 2, -1.0, 1.0);
    let w = uniform(&[tokens, 1, k], 3, 0.1, 1.0);
    check_entry("moe_unpermute", &[], &[ints(&[10], &pos), ys, w], 2).unwrap();
    for (normalize, seed) in [("true", 4), ("false", 5)] {
        // Logits a few units apart, so no difference step reorders them.
        let logits: Vec<f64> = (0..tokens * 6)
            .map(|i| ((i * 7 + seed as usize) % 13) as f64 * 0.25)
            .collect();
        let logits = Array::new(F32, [tokens, 6], logits).unwrap();
        let cfg = [("k", "2"), ("normalize", normalize)];
        check_entry("router_top_k", &cfg, &[logits], seed).unwrap();
    }
    // 20 rows in tiles of 8, group 1 empty, groups 0 and 2 sharing tile 1.
    let sizes = [9, 0, 7, 4];
    let meta = kernels::moe::group_metadata(&sizes, 20, 8);
    let as_i = |v: &[i32]| {
        ints(
            &[v.len()],
            &v.iter().map(|&x| x as usize).collect::<Vec<_>>(),
        )
    };
    for (t, w_shape) in [("false", [4, 6, 5]), ("true", [4, 5, 6])] {
        let args = [
            as_i(&meta.offsets),
            as_i(&meta.group_ids),
            as_i(&meta.m_tile_ids),
            uniform(&[20, 6], 6, -1.0, 1.0),
            uniform(&w_shape, 7, -0.5, 0.5),
        ];
        let cfg = [("transpose_rhs", t), ("bm", "8"), ("bk", "8"), ("bn", "8")];
        check_entry("grouped_matmul", &cfg, &args, 8).unwrap();
    }
}

/// Every entry with a declared backward exports it (`tessera export`'s
/// VJP) at its default shapes: the backward records from the call's
/// tensors and program constants alone, never host data the artifact
/// would not carry.
#[test]
fn every_declared_backward_exports() {
    let mut exported = Vec::new();
    for e in kernels::ENTRIES.iter().filter(|e| e.backward.is_some()) {
        let cfg = Config::parse(e, &[]).unwrap();
        let kernel = e.build_at_default_shapes(&cfg).unwrap();
        let vjp = tooling::export::vjp_for(e, &cfg, &kernel)
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
        assert!(vjp.is_some(), "{} has a backward but no VJP", e.name);
        exported.push(e.name);
    }
    for name in [
        "grouped_matmul",
        "router_top_k",
        "moe_permute",
        "moe_unpermute",
        "gated_delta_rule",
        "causal_conv1d",
    ] {
        assert!(exported.contains(&name), "{name}: {exported:?}");
    }
}

/// The gated delta rule's declared backward (its states pass, then the
/// chunks last to first) against central differences of the forward's f64
/// recurrence, through `o` and the final state: three chunks, the last
/// ragged, dk ≠ dv.
#[test]
fn the_gated_delta_rule_backward_matches_central_differences() {
    let (b, h, t, dk, dv) = (1, 2, 19, 8, 16);
    let args = [
        uniform(&[b, h, t, dk], 11, -0.5, 0.5),
        uniform(&[b, h, t, dk], 12, -0.5, 0.5),
        uniform(&[b, h, t, dv], 13, -1.0, 1.0),
        uniform(&[b, h, t, 1], 14, -0.5, 0.0),
        uniform(&[b, h, t, 1], 15, 0.1, 0.9),
    ];
    check_entry("gated_delta_rule", &[("chunk", "8")], &args, 16).unwrap();
}

/// The causal conv1d's declared backward (tensor ops: the pre-activation
/// recomputed, dx from the taps looking forward, dw and dbias summed over
/// batch and time) against central differences, with and without SiLU, a
/// sequence shorter than the filter in one case.
#[test]
fn the_causal_conv1d_backward_matches_central_differences() {
    for (seq, taps, silu) in [(13, 4, "true"), (11, 3, "false"), (2, 4, "true")] {
        let args = [
            uniform(&[2, seq, 8], 21, -1.0, 1.0),
            uniform(&[taps, 8], 22, -0.5, 0.5),
            uniform(&[1, 8], 23, -0.5, 0.5),
        ];
        let taps = taps.to_string();
        let cfg = [("taps", taps.as_str()), ("silu", silu), ("bt", "8")];
        check_entry("causal_conv1d", &cfg, &args, 24).unwrap();
    }
}

/// The fused Gated DeltaNet core's declared backward (the layer recomputed
/// unfused: conv1d kernels, the normalization and gates as tensor ops, the
/// gated delta rule kernel, each with its backward) against central
/// differences of the fused entry's f64 reference: two heads side by side
/// in the channels (lane-aligned on the TPU: 128 each, so 8 elements of
/// each input are differenced), two chunks, the last ragged.
#[test]
fn the_fused_gated_delta_rule_backward_matches_central_differences() {
    let (t, h, d, taps) = (13, 2, 128, 3);
    let args = [
        uniform(&[1, t, h * d], 31, -1.0, 1.0),
        uniform(&[1, t, h * d], 32, -1.0, 1.0),
        uniform(&[1, t, h * d], 33, -1.0, 1.0),
        uniform(&[taps, h * d], 34, -0.5, 0.5),
        uniform(&[taps, h * d], 35, -0.5, 0.5),
        uniform(&[taps, h * d], 36, -0.5, 0.5),
        uniform(&[1, t, h], 37, -2.0, 2.0),
        uniform(&[1, t, h], 38, -3.0, 3.0),
        uniform(&[1, h], 39, -1.5, 0.5),
        uniform(&[1, h], 40, -1.0, 1.0),
    ];
    check_entry_at(
        "causal_conv1d_gated_delta_rule",
        &[("chunk", "8")],
        &args,
        41,
        Some(8),
    )
    .unwrap();
}

/// The GDN family's typed calls: the chunked rule's outputs against the
/// recurrence in f64 and its gradients (through `vjp`, random cotangents
/// of `o` and the final state) against the recurrence's adjoint in f64;
/// the fused layer core's and the conv1d's outputs against their
/// references.
#[test]
fn the_gdn_typed_calls_match_their_references() {
    use kernels::gdn::{
        LayerInputs, backward_reference, call_causal_conv1d_gated_delta_rule,
        call_gated_delta_rule, fused_reference, reference,
    };
    let rt = fresh_runtime();
    let (b, h, t, dk, dv) = (1, 2, 40, 64, 32);
    let args = [
        uniform(&[b, h, t, dk], 51, -0.2, 0.2),
        uniform(&[b, h, t, dk], 52, -0.2, 0.2),
        uniform(&[b, h, t, dv], 53, -1.0, 1.0),
        uniform(&[b, h, t, 1], 54, -0.5, 0.0),
        uniform(&[b, h, t, 1], 55, 0.05, 0.95),
    ];
    let ts: Vec<Tensor> = args
        .iter()
        .map(|a| rt.tensor(a).unwrap().requires_grad().unwrap())
        .collect();
    let (o, state) =
        call_gated_delta_rule([&ts[0], &ts[1], &ts[2], &ts[3], &ts[4]], 16, None).unwrap();
    let scale = 1.0 / (dk as f64).sqrt();
    let (want_o, want_s) = reference(&args, scale);
    within(o.to_host().unwrap().data(), &want_o, 1e-4, 1e-3).unwrap();
    within(state.to_host().unwrap().data(), &want_s, 1e-4, 1e-3).unwrap();
    let (w_o, w_s) = (
        uniform(&[b, h, t, dv], 56, -1.0, 1.0),
        uniform(&[b, h, dk, dv], 57, -1.0, 1.0),
    );
    let cts = [rt.tensor(&w_o).unwrap(), rt.tensor(&w_s).unwrap()];
    let grads = vjp(
        &[&o, &state],
        &[&cts[0], &cts[1]],
        &ts.iter().collect::<Vec<_>>(),
    )
    .unwrap();
    let want = backward_reference(&args, w_o.data(), w_s.data(), scale);
    for (i, (g, w)) in grads.iter().zip(&want).enumerate() {
        within(g.to_host().unwrap().data(), w, 2e-4, 2e-3)
            .map_err(|e| format!("d input {i}: {e}"))
            .unwrap();
    }

    let (t, h, d, taps) = (30, 1, 64, 4);
    let layer = [
        uniform(&[1, t, h * d], 61, -1.0, 1.0),
        uniform(&[1, t, h * d], 62, -1.0, 1.0),
        uniform(&[1, t, h * d], 63, -1.0, 1.0),
        uniform(&[taps, h * d], 64, -0.5, 0.5),
        uniform(&[taps, h * d], 65, -0.5, 0.5),
        uniform(&[taps, h * d], 66, -0.5, 0.5),
        uniform(&[1, t, h], 67, -2.0, 2.0),
        uniform(&[1, t, h], 68, -3.0, 3.0),
        uniform(&[1, h], 69, -1.5, 0.5),
        uniform(&[1, h], 70, -1.0, 1.0),
    ];
    let lt: Vec<Tensor> = layer.iter().map(|a| rt.tensor(a).unwrap()).collect();
    let x = LayerInputs {
        q: &lt[0],
        k: &lt[1],
        v: &lt[2],
        wq: &lt[3],
        wk: &lt[4],
        wv: &lt[5],
        a: &lt[6],
        b: &lt[7],
        a_log: &lt[8],
        dt_bias: &lt[9],
    };
    let (o, state) = call_causal_conv1d_gated_delta_rule(&x, 16).unwrap();
    let (want_o, want_s) = fused_reference(&layer, h, 1.0 / (d as f64).sqrt());
    within(o.to_host().unwrap().data(), &want_o, 1e-4, 1e-3).unwrap();
    within(state.to_host().unwrap().data(), &want_s, 1e-4, 1e-3).unwrap();

    let bias = uniform(&[1, h * d], 71, -0.5, 0.5);
    let y = kernels::conv1d::call_causal_conv1d(&lt[0], &lt[3], &rt.tensor(&bias).unwrap(), true)
        .unwrap();
    let want = kernels::conv1d::reference(&layer[0], &layer[3], &bias, true);
    within(y.to_host().unwrap().data(), &want, 1e-5, 1e-4).unwrap();
}
