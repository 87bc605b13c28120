//! The MoE token permute and unpermute on every CPU path against f64
//! references written from their definitions: random routings (experts
//! left empty, one expert taking every slot, k = 1 to 4), and a round trip
//! (unpermute with weights summing to 1 of the permuted rows gives the
//! tokens back); a table that is not a permutation is an input error.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::permute::{inverse, moe_permute, moe_unpermute, order_by_expert};
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
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn permute_and_unpermute_on_every_path(
        bf in any::<bool>(), tokens in 1usize..24, k in 1usize..5, experts in 1usize..6,
        one_expert in any::<bool>(), seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        let (n, d) = (tokens * k, 128);
        let mut rng = kernel_ir::SplitMix64(seed);
        let ids: Vec<usize> = (0..n).map(|_| if one_expert { experts - 1 } else { rng.below(experts) }).collect();
        let order = order_by_expert(&ids, experts);
        let x = Array::random(dtype, [tokens, 1, d], seed, -1.0, 1.0);
        // Written from the routing, not from `order`: expert by expert,
        // each expert's slots in slot order.
        let want = gathered(&x, &ids, k, experts);
        all_paths(
            moe_permute::build_for(dtype, k, moe_permute::Dims { n, tokens, d }),
            &[ints(&order), x.clone()],
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
            &[ints(&inverse(&order)), ys, w],
            vec![x.data().to_vec()],
            &[Tolerance::for_dtype(dtype)],
        )?;
    }
}

/// A table with a repeated or out-of-range slot is refused by the entry
/// before anything runs, naming the builder of a valid one.
#[test]
fn a_table_that_is_not_a_permutation_is_an_input_error() {
    for (name, table) in [("moe_permute", "order"), ("moe_unpermute", "pos")] {
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
            err.contains(table) && err.contains("order_by_expert"),
            "{err}"
        );
        let mut v = inputs[0].data().to_vec();
        v[0] = n as f64;
        v[1] = 1.0;
        inputs[0] = Array::new(I32, [n], v).unwrap();
        assert!(e.check_inputs(&cfg, &k, &inputs).is_err());
    }
}
