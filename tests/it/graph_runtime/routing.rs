//! The MoE routing tables made on the device (`kernels::routing`) are the
//! host's definitions: positions a stable sort by expert, offsets the
//! running count, and the visit schedules of the grouped matmul and of its
//! weight gradient what `group_metadata` and `tgmm_metadata` give, over
//! empty groups, one group taking every row, and a ragged last tile.

use kernel_ir::prelude::*;
use kernels::moe::group_metadata;
use kernels::permute::slot_positions;
use kernels::routing::{offsets_reference, route, schedule};
use kernels::tgmm::tgmm_metadata;
use proptest::prelude::*;

use crate::common::fresh_runtime;

fn ints(v: &Array) -> Vec<i64> {
    v.data().iter().map(|&x| x as i64).collect()
}

fn wide(v: &[i32]) -> Vec<i64> {
    v.iter().map(|&x| i64::from(x)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn device_tables_are_the_host_definitions(
        tokens in 1usize..90, k in 1usize..4, experts in 1usize..9,
        bm in prop::sample::select(vec![8usize, 16, 128]),
        skew in any::<bool>(), seed in any::<u64>(),
    ) {
        let rt = fresh_runtime();
        let n = tokens * k;
        let mut rng = kernel_ir::SplitMix64(seed);
        let ids: Vec<usize> = (0..n)
            .map(|_| if skew { experts - 1 } else { rng.below(experts) / 2 * 2 % experts })
            .collect();
        let arr = Array::new(I32, [tokens, k], ids.iter().map(|&v| v as f64).collect()).unwrap();
        let r = route(&rt.tensor(&arr).unwrap(), experts, bm).unwrap();
        let off = offsets_reference(&ids, experts);
        let host = |t: &graph::Tensor| ints(&t.to_host().unwrap());
        let pos: Vec<i64> = slot_positions(&ids, experts).iter().map(|&p| p as i64).collect();
        prop_assert_eq!(host(&r.pos), pos);
        let offsets: Vec<i64> = off.iter().map(|&o| o as i64).collect();
        prop_assert_eq!(host(&r.schedule.offsets), offsets);
        let sizes: Vec<usize> = off.windows(2).map(|w| w[1] - w[0]).collect();
        let want = group_metadata(&sizes, n, bm);
        prop_assert_eq!(host(&r.schedule.group_ids), wide(&want.group_ids));
        prop_assert_eq!(host(&r.schedule.m_tile_ids), wide(&want.m_tile_ids));
        let t = schedule(&r.schedule.offsets, n, bm, true).unwrap();
        let (want, count) = tgmm_metadata(&sizes, n, bm);
        prop_assert_eq!(host(&t.group_ids), wide(&want.group_ids));
        prop_assert_eq!(host(&t.m_tile_ids), wide(&want.m_tile_ids));
        prop_assert_eq!(host(&t.visit_count), vec![count as i64]);
    }
}

/// Routing nothing, or over no experts, is refused with the reason.
#[test]
fn routing_nothing_is_an_error() {
    let rt = fresh_runtime();
    let ids = rt.tensor(&Array::zeros(I32, [4, 2])).unwrap();
    let e = route(&ids, 0, 8).unwrap_err().to_string();
    assert!(e.contains("0 experts"), "{e}");
}
