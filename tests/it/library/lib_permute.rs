//! The MoE token permute, unpermute, the unpermute's backward and the
//! device-side routing positions on every CPU path against f64 references
//! written from their definitions: random routings (experts left empty,
//! one expert taking every slot, k = 1 to 4), and a round trip (unpermute
//! with weights summing to 1 of the permuted rows gives the tokens back);
//! a table that is not a permutation is an input error.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::permute::{moe_permute, moe_unpermute, moe_unpermute_backward, slot_positions};
use kernels::routing::{moe_positions, offsets_reference};
use proptest::prelude::*;

use crate::common::all_paths;

fn ints(v: &[usize]) -> Array {
    Array::new(I32, [v.len()], v.iter().map(|&x| x as f64).collect()).unwrap()
}

/// The tokens' rows as the definition gives them, from the routing alone.
fn gathered(x: &Array, ids: &[usize], k: usize, experts: usize) -> Vec<f64> {
    let d = x.shape()[2];
    let mut rows = Vec::new();
    for e in 0..experts {
        for (s, _) in ids.iter().enumerate().filter(|(_, i)| **i == e) {
            rows.extend_from_slice(&x.data()[s / k * d..(s / k + 1) * d]);
        }
    }
    rows
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5, ..ProptestConfig::default() })]

    #[test]
    fn permute_and_unpermute_on_every_path(
        bf in any::<bool>(), tokens in 1usize..24, k in 1usize..5, experts in 1usize..6,
        one_expert in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let (n, d) = (tokens * k, 128);
        let mut rng = kernel_ir::SplitMix64(seed);
        let ids: Vec<usize> = (0..n).map(|_| if one_expert { experts - 1 } else { rng.below(experts) }).collect();
        let pos = slot_positions(&ids, experts);
        let x = Array::random(dtype, [tokens, 1, d], seed, -1.0, 1.0);
        // Written from the routing, not from `pos`: expert by expert,
        // each expert's slots in slot order.
        let want = gathered(&x, &ids, k, experts);
        all_paths(
            moe_permute::build_for(dtype, k, moe_permute::Dims { n, tokens, d }),
            &[ints(&pos), x.clone()],
            vec![want.clone()],
            &[Tolerance { abs: 0.0, rel: 0.0 }],
        )?;
        // Back: weights summing to 1 over each token's slots give the
        // token (up to the f32 sum and the output's rounding).
        let ys = Array::new(dtype, [n, 1, d], want).unwrap();
        let raw: Vec<f64> = (0..n).map(|_| 0.05 + rng.below(1000) as f64 / 1000.0).collect();
        let w: Vec<f64> = raw
            .chunks(k)
            .flat_map(|c| {
                let s: f64 = c.iter().sum();
                c.iter().map(move |v| v / s).collect::<Vec<_>>()
            })
            .collect();
        let w = Array::new(F32, [tokens, 1, k], w).unwrap();
        all_paths(
            moe_unpermute::build_for(dtype, moe_unpermute::Dims { n, d, tokens, k }),
            &[ints(&pos), ys.clone(), w.clone()],
            vec![x.data().to_vec()],
            &[Tolerance::for_dtype(dtype)],
        )?;
        // The unpermute's backward, from its definition: each slot's row
        // gets its token's cotangent times its weight; each weight the
        // dot of the cotangent with the row it weighted.
        let dy = Array::random(dtype, [tokens, 1, d], seed ^ 7, -1.0, 1.0);
        let (mut dys, mut dw) = (vec![0.0; n * d], vec![0.0; n]);
        for s in 0..n {
            let t = s / k;
            for c in 0..d {
                let g = dy.data()[t * d + c];
                dys[pos[s] * d + c] = w.data()[s] * g;
                dw[s] += g * ys.data()[pos[s] * d + c];
            }
        }
        all_paths(
            moe_unpermute_backward::build_for(dtype, moe_unpermute_backward::Dims { n, d, tokens, k }),
            &[ints(&pos), ys, w, dy],
            vec![dys, dw],
            &[Tolerance::for_dtype(dtype), Tolerance::matmul(d, F32)],
        )?;
    }

    /// The device's positions are the host's stable sort by expert, over
    /// several blocks (the running counts carried between them) and a
    /// ragged last one.
    #[test]
    fn device_positions_are_the_stable_sort_by_expert(
        n in 1usize..700, experts in 1usize..12, skew in any::<bool>(), seed in any::<u64>(),
    ) {
        let mut rng = kernel_ir::SplitMix64(seed);
        let ids: Vec<usize> = (0..n)
            .map(|_| if skew && rng.below(4) > 0 { 0 } else { rng.below(experts) })
            .collect();
        let off = offsets_reference(&ids, experts);
        let row = Array::new(I32, [1, n], ids.iter().map(|&v| v as f64).collect()).unwrap();
        let starts = Array::new(I32, [experts, 1], off[..experts].iter().map(|&v| v as f64).collect()).unwrap();
        let want: Vec<f64> = slot_positions(&ids, experts).iter().map(|&p| p as f64).collect();
        all_paths(
            moe_positions::build(128.min(n), moe_positions::Dims { n, e: experts }),
            &[row, starts],
            vec![want],
            &[Tolerance { abs: 0.0, rel: 0.0 }],
        )?;
    }
}

/// A table with a repeated or out-of-range slot is refused by the entry
/// before anything runs, naming the builder of a valid one.
#[test]
fn a_table_that_is_not_a_permutation_is_an_input_error() {
    for name in ["moe_permute", "moe_unpermute", "moe_unpermute_backward"] {
        let e = kernels::find(name).unwrap();
        let cfg = kernels::Config::parse(e, &[]).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        let mut inputs = e.sample_inputs(&cfg, &k, 3);
        e.check_inputs(&cfg, &k, &inputs).unwrap();
        let n = inputs[0].data().len();
        let mut v = inputs[0].data().to_vec();
        v[1] = v[0];
        inputs[0] = Array::new(I32, [n], v).unwrap();
        let err = e.check_inputs(&cfg, &k, &inputs).unwrap_err().to_string();
        assert!(
            err.contains("pos") && err.contains("slot_positions"),
            "{err}"
        );
        let mut v = inputs[0].data().to_vec();
        v[0] = n as f64;
        v[1] = 1.0;
        inputs[0] = Array::new(I32, [n], v).unwrap();
        assert!(e.check_inputs(&cfg, &k, &inputs).is_err());
    }
}
