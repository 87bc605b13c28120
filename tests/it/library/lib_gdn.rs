//! The chunked gated delta rule on every CPU path against the recurrence
//! run token by token in f64: several chunks with the state carried
//! between them, a ragged last chunk, dk ≠ dv, one token; and the chunked
//! algorithm's answer does not depend on the chunk size.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::gdn::{
    backward_reference, causal_conv1d_gated_delta_rule, fused_reference, gated_delta_rule,
    gated_delta_rule_backward, gated_delta_rule_states, reference, states_reference,
};
use proptest::prelude::*;

use crate::common::all_paths;

/// Unit-norm rows, as the models feed q and k.
fn unit_rows(shape: [usize; 4], seed: u64) -> Array {
    let a = Array::random(F32, shape, seed, -1.0, 1.0);
    let d = shape[3];
    let data: Vec<f64> = a
        .data()
        .chunks(d)
        .flat_map(|r| {
            let n = r.iter().map(|e| e * e).sum::<f64>().sqrt();
            r.iter().map(move |e| e / n).collect::<Vec<_>>()
        })
        .collect();
    Array::new(F32, shape, data).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    #[test]
    fn the_chunked_rule_is_the_recurrence_on_every_path(
        b in 1usize..3, h in 1usize..3, t in 1usize..150,
        chunk in prop::sample::select(vec![16usize, 32, 64]),
        dv in prop::sample::select(vec![64usize, 128]), seed in any::<u64>(),
    ) {
        let dk = 64;
        let q = unit_rows([b, h, t, dk], seed);
        let k = unit_rows([b, h, t, dk], seed + 1);
        let v = Array::random(F32, [b, h, t, dv], seed + 2, -1.0, 1.0);
        let g = Array::random(F32, [b, h, t, 1], seed + 3, -0.5, 0.0);
        let beta = Array::random(F32, [b, h, t, 1], seed + 4, 0.05, 0.95);
        let args = [q, k, v, g, beta];
        let scale = 1.0 / (dk as f64).sqrt();
        let (o, state) = reference(&args, scale);
        let tol = Tolerance { abs: 1e-4, rel: 1e-3 };
        all_paths(
            gated_delta_rule::build_for(F32, chunk.min(t), scale as f32, gated_delta_rule::Dims { b, h, t, dk, dv }),
            &args,
            vec![o, state],
            &[tol, tol],
        )?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, ..ProptestConfig::default() })]

    /// The backward's two passes on every path: the chunk start states
    /// against the recurrence's, then the five cotangents against the
    /// recurrence's adjoint, for random cotangents of `o` and the final
    /// state (the kernel reads the states it is given: the reference's).
    #[test]
    fn the_backward_is_the_recurrences_adjoint_on_every_path(
        h in 1usize..3, t in 1usize..100,
        chunk in prop::sample::select(vec![16usize, 32]),
        dv in prop::sample::select(vec![64usize, 128]), seed in any::<u64>(),
    ) {
        let (b, dk) = (1, 64);
        let c = chunk.min(t);
        let q = unit_rows([b, h, t, dk], seed);
        let k = unit_rows([b, h, t, dk], seed + 1);
        let v = Array::random(F32, [b, h, t, dv], seed + 2, -1.0, 1.0);
        let g = Array::random(F32, [b, h, t, 1], seed + 3, -0.5, 0.0);
        let beta = Array::random(F32, [b, h, t, 1], seed + 4, 0.05, 0.95);
        let args = vec![q, k, v, g, beta];
        let scale = 1.0 / (dk as f64).sqrt();
        let states = states_reference(&args, c);
        let tol = Tolerance { abs: 1e-4, rel: 1e-3 };
        let dims = gated_delta_rule_states::Dims { b, h, t, dk, dv };
        all_paths(gated_delta_rule_states::build_for(F32, c, dims), &args, vec![states.clone()], &[tol])?;

        let chunks = t.div_ceil(c);
        let d_o = Array::random(F32, [b, h, t, dv], seed + 5, -1.0, 1.0);
        let d_state = Array::random(F32, [b, h, dk, dv], seed + 6, -1.0, 1.0);
        let want = backward_reference(&args, d_o.data(), d_state.data(), scale);
        let mut all = args;
        all.extend([Array::new(F32, [b, h, chunks * dk, dv], states).unwrap(), d_o, d_state]);
        let dims = gated_delta_rule_backward::Dims { b, h, t, d_k: dk, d_v: dv };
        let tol = Tolerance { abs: 2e-4, rel: 2e-3 };
        all_paths(
            gated_delta_rule_backward::build_for(F32, c, scale as f32, dims),
            &all,
            want.to_vec(),
            &[tol; 5],
        )?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, ..ProptestConfig::default() })]

    /// The fused layer core (conv1d + SiLU, unit q and k rows, the gates,
    /// the chunked rule) on every path against the definitions composed in
    /// f64: several heads side by side in the channels, 1 to 5 taps, a
    /// ragged last chunk, sequences shorter than the conv. (Heads side by
    /// side need lane-aligned head widths on the TPU: 128; one head may be
    /// narrower.)
    #[test]
    fn the_fused_conv_and_rule_is_the_composition_on_every_path(
        batch in 1usize..3, h in 1usize..3, t in 1usize..100, taps in 1usize..6,
        chunk in prop::sample::select(vec![16usize, 32]), narrow in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let (h, dk, dv) = if narrow { (1, 64, 32) } else { (h, 128, 128) };
        let c = chunk.min(t);
        let (halo, window) = {
            let halo = (taps - 1).div_ceil(8) * 8;
            (halo, (halo + c).div_ceil(8) * 8)
        };
        let r = |shape: Vec<usize>, s: u64, lo: f64, hi: f64| Array::random(F32, shape, seed + s, lo, hi);
        let args = [
            r(vec![batch, t, h * dk], 0, -1.0, 1.0),
            r(vec![batch, t, h * dk], 1, -1.0, 1.0),
            r(vec![batch, t, h * dv], 2, -1.0, 1.0),
            r(vec![taps, h * dk], 3, -0.5, 0.5),
            r(vec![taps, h * dk], 4, -0.5, 0.5),
            r(vec![taps, h * dv], 5, -0.5, 0.5),
            r(vec![batch, t, h], 6, -2.0, 2.0),
            r(vec![batch, t, h], 7, -3.0, 3.0),
            r(vec![1, h], 8, -1.5, 0.5),
            r(vec![1, h], 9, -1.0, 1.0),
        ];
        let scale = 1.0 / (dk as f64).sqrt();
        let (o, state) = fused_reference(&args, h, scale);
        let tol = Tolerance { abs: 1e-4, rel: 1e-3 };
        let dims = causal_conv1d_gated_delta_rule::Dims { batch, t, hk: h * dk, hv: h * dv, h, taps };
        all_paths(
            causal_conv1d_gated_delta_rule::build_for(F32, c, dk, dv, halo, window, scale as f32, dims),
            &args,
            vec![o, state],
            &[tol, tol],
        )?;
    }
}
