//! Mask descriptions and their block tables (issue 30's first half): every
//! table entry agrees with the mask's element-wise visibility on random
//! masks, combinations and block sizes, skipped steps fetch nothing new,
//! and the tables of 32k-long sequences in blocks of 512 are small.

use kernels::attention::block_table::BlockTables;
use kernels::attention::mask::{BlockKind, Mask, MultiHeadMask};
use proptest::prelude::*;

fn leaf() -> impl Strategy<Value = Mask> {
    prop_oneof![
        Just(Mask::Full),
        (-3i64..4).prop_map(|offset| Mask::Causal { offset }),
        (prop::option::of(0u64..9), prop::option::of(0u64..9))
            .prop_map(|(left, right)| Mask::Local { left, right }),
        (1u64..12).prop_map(|chunk| Mask::ChunkedCausal { chunk }),
        (0u64..20).prop_map(|len| Mask::Prefix { len }),
        (1usize..30, 1usize..30, any::<u64>()).prop_map(|(rows, cols, seed)| {
            let mut r = kernel_ir::SplitMix64(seed);
            let data = (0..rows * cols).map(|_| r.below(3) == 0).collect();
            Mask::explicit(rows, cols, data).unwrap()
        }),
    ]
}

fn mask() -> impl Strategy<Value = Mask> {
    leaf().prop_recursive(2, 6, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| a.and(b)),
            (inner.clone(), inner).prop_map(|(a, b)| a.or(b)),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every step's kind and element mask is the mask's visibility; every
    /// rectangle the structure settles (empty or full) is exactly that.
    #[test]
    fn block_tables_agree_with_visibility(
        heads in prop::collection::vec(mask(), 1..3),
        sq in 1usize..40, skv in 1usize..40, bq in 1usize..9, bk in 1usize..9,
    ) {
        let m = MultiHeadMask { heads };
        let t = BlockTables::build(&m, sq, skv, bq, bk).unwrap();
        for (h, mh) in m.heads.iter().enumerate() {
            for qi in 0..t.q_blocks {
                for ki in 0..t.k_blocks {
                    let cell = (h * t.q_blocks + qi) * t.k_blocks + ki;
                    let kind = t.kind_at(h, qi, ki);
                    let (q0, q1) = (qi * bq, ((qi + 1) * bq).min(sq));
                    let (k0, k1) = (ki * bk, ((ki + 1) * bk).min(skv));
                    let structural = mh.block(q0 as u64, q1 as u64, k0 as u64, k1 as u64);
                    for q in qi * bq..(qi + 1) * bq {
                        for k in ki * bk..(ki + 1) * bk {
                            let inside = q < sq && k < skv;
                            let v = inside && mh.visible(q as u64, k as u64);
                            match kind {
                                BlockKind::Empty => prop_assert!(!v, "h{h} ({q},{k}) visible in an empty block"),
                                BlockKind::Full => prop_assert!(v, "h{h} ({q},{k}) hidden in a full block"),
                                BlockKind::Partial => {
                                    let e = &t.masks[t.mask_index[cell] as usize];
                                    prop_assert_eq!(e[(q - q0) * bk + (k - k0)], v);
                                }
                            }
                            if inside {
                                prop_assert!(structural != BlockKind::Empty || !v);
                                prop_assert!(structural != BlockKind::Full || v);
                            }
                        }
                    }
                    // Computed steps name their own block; a skipped one the
                    // next computed block of its row, else what the step before named.
                    let f = t.fetch[cell];
                    if kind != BlockKind::Empty {
                        prop_assert_eq!(f, ki as i32);
                    } else {
                        let row = (h * t.q_blocks + qi) * t.k_blocks;
                        let next = (ki..t.k_blocks).find(|&j| t.kind[row + j] != 0);
                        match next {
                            Some(j) => prop_assert_eq!(f, j as i32),
                            None if cell > 0 => prop_assert_eq!(f, t.fetch[cell - 1]),
                            None => prop_assert_eq!(f, 0),
                        }
                    }
                }
            }
        }
        // Distinct element masks only.
        for (i, a) in t.masks.iter().enumerate() {
            prop_assert!(t.masks[..i].iter().all(|b| b != a));
        }
    }
}

/// The size stated for s = 32k in blocks of 512: 64 × 64 steps per head;
/// causal has 2016 empty, 64 partial (one distinct mask) and 2016 full
/// steps; a causal window of 4096 and Llama 4's chunked causal of 8192
/// are as sparse as their bands; per head the tables are 48 KiB plus
/// 256 KiB per distinct partial mask, whatever the sequence's content.
#[test]
fn the_tables_of_32k_sequences_in_blocks_of_512() {
    let s = 32 * 1024;
    let b = 512;
    let causal = BlockTables::build(
        &MultiHeadMask::uniform(Mask::Causal { offset: 0 }, 1),
        s,
        s,
        b,
        b,
    )
    .unwrap();
    assert_eq!(
        (
            causal.count(BlockKind::Empty),
            causal.count(BlockKind::Partial),
            causal.count(BlockKind::Full)
        ),
        (2016, 64, 2016)
    );
    assert_eq!(causal.partial_masks(), 1);
    assert_eq!(causal.bytes(), 3 * 4 * 4096 + b * b);
    let window = Mask::Local {
        left: Some(4095),
        right: Some(0),
    };
    let chunked = Mask::ChunkedCausal { chunk: 8192 };
    let m = MultiHeadMask {
        heads: vec![window.clone(), chunked, Mask::Causal { offset: 0 }],
    };
    let t = BlockTables::build(&m, s, s, b, b).unwrap();
    // Per row of the window: 7 full blocks and 2 partial at most.
    let computed = t.count(BlockKind::Full) + t.count(BlockKind::Partial);
    let window_steps: usize = (0..64)
        .map(|qi| {
            (0..64)
                .filter(|&ki| t.kind_at(0, qi, ki) != BlockKind::Empty)
                .count()
        })
        .sum();
    assert!(window_steps <= 64 * 9, "{window_steps}");
    // Chunked: 4 chunks of 16 blocks, each causal inside.
    let chunked_steps: usize = (0..64)
        .map(|qi| {
            (0..64)
                .filter(|&ki| t.kind_at(1, qi, ki) != BlockKind::Empty)
                .count()
        })
        .sum();
    assert_eq!(chunked_steps, 4 * (16 * 17 / 2));
    // The diagonal mask is shared by every head; the window adds its edge.
    assert!(t.partial_masks() <= 2, "{}", t.partial_masks());
    assert!(computed < 3 * 64 * 64 / 2);
    eprintln!(
        "32k, blocks of 512, 3 heads: {} steps computed of {}, {} distinct partial masks, {} KiB",
        computed,
        3 * 64 * 64,
        t.partial_masks(),
        t.bytes() / 1024
    );
}

/// Bad sizes and explicit arrays are errors naming the fix.
#[test]
fn bad_mask_sizes_are_errors() {
    let e = Mask::explicit(2, 3, vec![true; 5]).unwrap_err();
    assert!(
        e.to_string().contains("needs 6 visibilities but has 5"),
        "{e}"
    );
    let m = MultiHeadMask::uniform(Mask::Full, 1);
    let e = BlockTables::build(&m, 0, 8, 4, 4).unwrap_err();
    assert!(e.to_string().contains("sq is 0"), "{e}");
    let e = BlockTables::build(&MultiHeadMask { heads: vec![] }, 8, 8, 4, 4).unwrap_err();
    assert!(e.to_string().contains("heads is 0"), "{e}");
}
