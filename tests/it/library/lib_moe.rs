//! The MoE grouped matmul on every CPU path against its f64 reference:
//! random group sizes (empty groups, one group holding every row, tiles
//! straddling boundaries), ragged m and k, both rhs layouts; and the
//! schedule check that keeps a wrong schedule from leaving rows unwritten.

use kernel_ir::prelude::*;
use kernels::check::Tolerance;
use kernels::moe::{GroupedMatmulConfig, group_metadata, grouped_matmul, reference};
use proptest::prelude::*;

use crate::common::all_paths;

fn ints(v: &[i32]) -> Array {
    Array::new(I32, [v.len()], v.iter().map(|&x| x as f64).collect()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn grouped_matmul_on_every_path(
        bf in any::<bool>(), e in 1usize..5, m_tiles in 1usize..4, m_extra in 0usize..8,
        k_extra in prop::sample::select(vec![0usize, 72]), transpose in any::<bool>(),
        cuts in prop::collection::vec(0usize..1000, 4), seed in any::<u64>(),
    ) {
        let d = if bf { BF16 } else { F32 };
        let bm = 8 * d.packing();
        let m = m_tiles * bm + m_extra;
        let (k, n) = (128 + k_extra, 128);
        // Group sizes from sorted cut points (repeats make empty groups).
        let mut c: Vec<usize> = cuts[..e - 1].iter().map(|x| x * m / 1000).collect();
        c.sort_unstable();
        let mut bounds = vec![0];
        bounds.extend(c);
        bounds.push(m);
        let sizes: Vec<usize> = bounds.windows(2).map(|w| w[1] - w[0]).collect();
        let meta = group_metadata(&sizes, m, bm);
        let x = Array::random(d, [m, k], seed, -1.0, 1.0);
        let w = if transpose {
            Array::random(d, [e, n, k], seed + 1, -0.2, 0.2)
        } else {
            Array::random(d, [e, k, n], seed + 1, -0.2, 0.2)
        };
        let want = reference(&x, &w, &bounds, transpose);
        let cfg = GroupedMatmulConfig { m, k, n, e, bm, bk: 128, bn: 128, transpose_rhs: transpose, dtype: d, out_dtype: F32 };
        all_paths(
            grouped_matmul(&cfg),
            &[ints(&meta.offsets), ints(&meta.group_ids), ints(&meta.m_tile_ids), x, w],
            vec![want],
            &[Tolerance::matmul(k, F32)],
        )?;
    }
}

/// A schedule that is not the group offsets' is refused before anything
/// runs (it would leave rows unwritten), and so are offsets that do not
/// rise from 0 to m.
#[test]
fn a_wrong_schedule_is_an_input_error() {
    let e = kernels::find("grouped_matmul").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let k = e.build_at_default_shapes(&cfg).unwrap();
    let good = e.sample_inputs(&cfg, &k, 3);
    e.check_inputs(&cfg, &k, &good).unwrap();
    let mut bad = good.clone();
    let mut ids: Vec<i32> = bad[1].data().iter().map(|&v| v as i32).collect();
    ids[0] = (ids[0] + 1) % 4;
    bad[1] = ints(&ids);
    let err = e.check_inputs(&cfg, &k, &bad).unwrap_err().to_string();
    assert!(err.contains("group_metadata"), "{err}");
    let mut bad = good.clone();
    bad[0] = ints(&[0, 10, 5, 300, 384]);
    let err = e.check_inputs(&cfg, &k, &bad).unwrap_err().to_string();
    assert!(err.contains("must rise from 0 to m = 384"), "{err}");
    // The schedule is what the module docs say: tiles split at boundaries.
    let meta = group_metadata(&[100, 0, 28], 128, 64);
    assert_eq!(meta.group_ids, [0, 0, 2, 2]);
    assert_eq!(meta.m_tile_ids, [0, 1, 1, 1]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// The weight gradient against `Σ_r x[r]ᵀ dy[r]` per group from the
    /// group sizes: empty groups (zero, though their block is visited),
    /// one group holding every row, tiles straddling boundaries, ragged m.
    #[test]
    fn tgmm_on_every_path(
        bf in any::<bool>(), e in 1usize..5, m_tiles in 1usize..4, m_extra in 0usize..8,
        cuts in prop::collection::vec(0usize..1000, 4), seed in any::<u64>(),
    ) {
        use kernels::tgmm::{tgmm_metadata, weight_gradient};
        let d = if bf { BF16 } else { F32 };
        let bm = 8 * d.packing();
        let m = m_tiles * bm + m_extra;
        let (k, n) = (128, 128);
        let mut c: Vec<usize> = cuts[..e - 1].iter().map(|x| x * m / 1000).collect();
        c.sort_unstable();
        let mut bounds = vec![0];
        bounds.extend(c);
        bounds.push(m);
        let sizes: Vec<usize> = bounds.windows(2).map(|w| w[1] - w[0]).collect();
        let (meta, count) = tgmm_metadata(&sizes, m, bm);
        let x = Array::random(d, [m, k], seed, -1.0, 1.0);
        let dy = Array::random(d, [m, n], seed + 1, -1.0, 1.0);
        // From the definition, group by group.
        let mut want = vec![0.0; e * k * n];
        for g in 0..e {
            for r in bounds[g]..bounds[g + 1] {
                for a in 0..k {
                    for b in 0..n {
                        want[(g * k + a) * n + b] += x.data()[r * k + a] * dy.data()[r * n + b];
                    }
                }
            }
        }
        all_paths(
            weight_gradient((m, k, n, e), (bm, 128, 128), d, F32),
            &[ints(&meta.offsets), ints(&meta.group_ids), ints(&meta.m_tile_ids), ints(&[count as i32]), x, dy],
            vec![want],
            &[Tolerance::matmul(m, F32)],
        )?;
    }
}

/// The weight gradient's schedule visits every group, and a schedule that
/// is not the offsets' (here grouped_matmul's, which skips empty groups)
/// is refused by its entry.
#[test]
fn the_weight_gradient_visits_every_group_and_checks_its_schedule() {
    use kernels::tgmm::tgmm_metadata;
    let (meta, count) = tgmm_metadata(&[0, 64, 0, 0], 64, 16);
    assert_eq!(&meta.group_ids[..count], &[0, 1, 1, 1, 1, 2, 3]);
    assert_eq!(&meta.m_tile_ids[..count], &[0, 0, 1, 2, 3, 3, 3]);
    let e = kernels::find("tgmm").unwrap();
    let cfg = kernels::Config::parse(e, &[]).unwrap();
    let k = e.build_at_default_shapes(&cfg).unwrap();
    let mut inputs = e.sample_inputs(&cfg, &k, 5);
    e.check_inputs(&cfg, &k, &inputs).unwrap();
    let sizes: Vec<usize> = inputs[0]
        .data()
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .collect();
    let skipping = group_metadata(&sizes, 384, 128);
    inputs[1] = ints(&skipping.group_ids);
    let err = e.check_inputs(&cfg, &k, &inputs).unwrap_err().to_string();
    assert!(err.contains("tgmm_metadata"), "{err}");
}
