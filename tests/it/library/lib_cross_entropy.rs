//! The fused linear + softmax cross-entropy, forward and both backward
//! kernels, on every CPU path against f64 references written from the
//! definition (`loss = lse(x·w) − (x·w)[label]`, `g = dloss·(softmax −
//! onehot) + dlse·softmax`): ragged rows and vocabulary, one row or one
//! column, ignored labels (−100 and `v`), f32 and bf16.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::cross_entropy::{
    LinearCrossEntropyConfig, linear_cross_entropy, linear_cross_entropy_dw,
    linear_cross_entropy_dx, reference, reference_backward,
};
use proptest::prelude::*;

use crate::common::all_paths;

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    #[test]
    fn loss_and_its_gradients_match_the_definition_on_every_path(
        bf in any::<bool>(), n in 1usize..40, d in prop::sample::select(vec![8usize, 128]),
        v in 1usize..600, bn in prop::sample::select(vec![8usize, 16]),
        bv in prop::sample::select(vec![128usize, 256]), ignored in 0usize..4, seed in any::<u64>(),
    ) {
        let dtype = if bf { BF16 } else { F32 };
        // bf16 row blocks are whole (16, 128) tiles.
        let bn = if bf { 16 } else { bn };
        let cfg = LinearCrossEntropyConfig { n, d, v, bn: bn.min(n), bv: bv.min(v), dtype };
        let mut rng = kernel_ir::SplitMix64(seed);
        let x = Array::random(dtype, [n, d], seed, -1.0, 1.0);
        let w = Array::random(dtype, [d, v], seed + 1, -0.5, 0.5);
        // One row in `ignored + 1` has no label: −100 (PyTorch's padding)
        // or `v`, one past the vocabulary.
        let labels: Vec<f64> = (0..n)
            .map(|_| match rng.below(ignored + 4) {
                0 if ignored > 0 => -100.0,
                1 if ignored > 1 => v as f64,
                _ => rng.below(v) as f64,
            })
            .collect();
        let labels = Array::new(I32, [n, 1], labels).unwrap();
        let (loss, lse) = reference(&x, &w, &labels);
        let fwd = Tolerance::matmul(d, F32);
        all_paths(linear_cross_entropy(&cfg), &[x.clone(), w.clone(), labels.clone()],
            vec![loss, lse.clone()], &[fwd])?;
        let dloss = Array::random(F32, [n, 1], seed + 2, -1.0, 1.0);
        let dlse = Array::random(F32, [n, 1], seed + 3, -1.0, 1.0);
        let lse = Array::new(F32, [n, 1], lse).unwrap();
        let (dx, dw) = reference_backward(&x, &w, &labels, lse.data(), (dloss.data(), dlse.data()));
        let args = [x, w, labels, lse, dloss, dlse];
        all_paths(linear_cross_entropy_dx(&cfg), &args, vec![dx], &[Tolerance::attention_grad(dtype)])?;
        all_paths(linear_cross_entropy_dw(&cfg), &args, vec![dw], &[Tolerance::sum_grad(dtype, n)])?;
    }
}

/// Shapes that do not fit together are refused by the entry, naming the
/// shape to give.
#[test]
fn mismatched_shapes_are_input_errors_naming_the_fix() {
    let e = kernels::find("linear_cross_entropy").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let err = e
        .build(&cfg, &[vec![8, 128], vec![64, 1000], vec![8, 1]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("w's rows must be x's 128 columns"), "{err}");
    let err = e
        .build(&cfg, &[vec![8, 128], vec![128, 1000], vec![8]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("labels"), "{err}");
    let err = e
        .build(&cfg, &[vec![8, 128], vec![128, 1000], vec![4, 1]])
        .unwrap_err()
        .to_string();
    assert!(err.contains("as [8, 1]"), "{err}");
}
