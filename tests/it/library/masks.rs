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
                                // A computable mask's partial steps compute
                                // visibility from positions: no element mask.
                                BlockKind::Partial if m.computable() => {
                                    prop_assert_eq!(t.mask_index[cell], -1);
                                    prop_assert!(t.masks.is_empty());
                                }
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
/// causal has 2016 empty, 64 partial and 2016 full steps; a causal window
/// of 4096 and Llama 4's chunked causal of 8192 are as sparse as their
/// bands; per head the tables are 48 KiB, whatever the sequence's
/// content. These masks are computable, so no element mask is kept (an
/// explicit mask adds 256 KiB per distinct partial block).
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
    assert_eq!(causal.partial_masks(), 0);
    assert_eq!(causal.bytes(), 3 * 4 * 4096);
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
    // Partial steps compute visibility from positions.
    assert_eq!(t.partial_masks(), 0);
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

/// f64 attention of one (batch, head) under `mask` and segment ids:
/// `(o [sq, d], lse [sq])`, rows with no visible key 0 and −∞.
#[allow(clippy::too_many_arguments)]
fn masked_reference(
    mask: &Mask,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    qs: &[i32],
    ks: &[i32],
    d: usize,
    scale: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (sq, skv) = (qs.len(), ks.len());
    let mut o = vec![0.0; sq * d];
    let mut lse = vec![f64::NEG_INFINITY; sq];
    for i in 0..sq {
        let vis: Vec<usize> = (0..skv)
            .filter(|&j| qs[i] == ks[j] && mask.visible(i as u64, j as u64))
            .collect();
        if vis.is_empty() {
            continue;
        }
        let s: Vec<f64> = vis
            .iter()
            .map(|&j| scale * (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>())
            .collect();
        let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (w, &j) in e.iter().zip(&vis) {
            for c in 0..d {
                o[i * d + c] += w / sum * v[j * d + c];
            }
        }
        lse[i] = mx + sum.ln();
    }
    (o, lse)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Masked attention from random masks (per head), segment layouts and
    /// GQA on every CPU path against the f64 reference, dead rows included.
    #[test]
    fn masked_attention_matches_f64_on_every_path(
        heads in prop::collection::vec(mask(), 2..3),
        seq_blocks in 1usize..4, kv_blocks in 1usize..4, ragged in 0usize..3,
        segments in 1i32..4, seed in any::<u64>(),
    ) {
        use kernel_ir::{Array, DType};
        use kernels::attention::masked::{MaskedConfig, masked_attention};
        use runtime::backend::{Backend, Prepared};
        let (b, h, hkv, d, bq, bk) = (1usize, 2usize, 1usize, 128usize, 8usize, 128usize);
        let sq = seq_blocks * bq;
        let skv = kv_blocks * bk + ragged * 40;
        let m = MultiHeadMask { heads };
        let t = BlockTables::build(&m, sq, skv, bq, bk).unwrap();
        let (pre, masks) = t.arrays();
        let mut r = kernel_ir::SplitMix64(seed);
        let mut seg = |n: usize| -> Vec<i32> {
            let mut s: Vec<i32> = (0..n).map(|_| r.below(segments as usize) as i32).collect();
            s.sort();
            s
        };
        let (qs, ks) = (seg(sq), seg(skv));
        let rnd = |shape: Vec<usize>, s: u64| Array::random(DType::F32, shape, s, -1.0, 1.0);
        let q = rnd(vec![b, h, sq, d], seed ^ 1);
        let k = rnd(vec![b, hkv, skv, d], seed ^ 2);
        let v = rnd(vec![b, hkv, skv, d], seed ^ 3);
        let qseg = Array::new(DType::I32, [b, sq, 1], qs.iter().map(|&x| x as f64).collect()).unwrap();
        let kseg = Array::new(DType::I32, [b, 1, skv], ks.iter().map(|&x| x as f64).collect()).unwrap();
        let cfg = MaskedConfig { sm_scale: 1.0 / (d as f32).sqrt(), softcap: None, block_q: bq, block_k: bk, rule: MaskedConfig::rule_of(&m) };
        let dims = kernels::attention::masked::masked_attention::Dims::from_shapes(&[
            pre[0].shape(), pre[1].shape(), pre[2].shape(), q.shape(), k.shape(), v.shape(),
            masks.shape(), qseg.shape(), kseg.shape(),
        ]).unwrap();
        let kern = masked_attention::build_for(DType::F32, &cfg, dims).unwrap();
        let mut args = pre.to_vec();
        args.extend([q.clone(), k.clone(), v.clone(), masks.clone(), qseg, kseg]);
        for backend in Backend::ALL {
            let out = Prepared::new(backend, &kern).and_then(|p| p.run(&args))
                .unwrap_or_else(|e| panic!("{backend}: {e}"));
            for hh in 0..h {
                let qh = &q.data()[hh * sq * d..(hh + 1) * sq * d];
                let (o_ref, lse_ref) = masked_reference(&m.heads[hh], qh, k.data(), v.data(), &qs, &ks, d, cfg.sm_scale as f64);
                let o = &out[0].data()[hh * sq * d..(hh + 1) * sq * d];
                let lse = &out[1].data()[hh * sq..(hh + 1) * sq];
                for (i, (a, w)) in o.iter().zip(&o_ref).enumerate() {
                    prop_assert!(!a.is_nan() && (a - w).abs() <= 2e-5 + 2e-5 * w.abs(),
                        "{backend} head {hh} o[{i}] = {a}, f64 {w}");
                }
                for (i, (a, w)) in lse.iter().zip(&lse_ref).enumerate() {
                    let ok = if w.is_infinite() { *a == f64::NEG_INFINITY } else { (a - w).abs() <= 2e-5 + 2e-5 * w.abs() };
                    prop_assert!(ok, "{backend} head {hh} lse[{i}] = {a}, f64 {w}");
                }
            }
        }
    }
}

/// A random masked-attention case: tables of `heads` at `bq × bk`, sorted
/// random segment ids in `0..segments`, and q, k, v, dO.
struct Case {
    m: MultiHeadMask,
    t: BlockTables,
    q: kernel_ir::Array,
    k: kernel_ir::Array,
    v: kernel_ir::Array,
    g: kernel_ir::Array,
    qs: Vec<i32>,
    ks: Vec<i32>,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        heads: Vec<Mask>,
        hkv: usize,
        (sq, skv): (usize, usize),
        (bq, bk): (usize, usize),
        d: usize,
        dtype: kernel_ir::DType,
        segments: i32,
        seed: u64,
    ) -> Case {
        use kernel_ir::Array;
        let h = heads.len();
        let m = MultiHeadMask { heads };
        let t = BlockTables::build(&m, sq, skv, bq, bk).unwrap();
        let mut r = kernel_ir::SplitMix64(seed);
        let mut seg = |n: usize| -> Vec<i32> {
            let mut s: Vec<i32> = (0..n).map(|_| r.below(segments as usize) as i32).collect();
            s.sort();
            s
        };
        let (qs, ks) = (seg(sq), seg(skv));
        let rnd = |shape: Vec<usize>, s: u64| Array::random(dtype, shape, s, -1.0, 1.0);
        Case {
            q: rnd(vec![1, h, sq, d], seed ^ 1),
            k: rnd(vec![1, hkv, skv, d], seed ^ 2),
            v: rnd(vec![1, hkv, skv, d], seed ^ 3),
            g: rnd(vec![1, h, sq, d], seed ^ 4),
            m,
            t,
            qs,
            ks,
        }
    }

    fn segs(&self) -> (kernel_ir::Array, kernel_ir::Array) {
        use kernel_ir::{Array, DType};
        let ids = |v: &[i32], shape: [usize; 3]| {
            Array::new(DType::I32, shape, v.iter().map(|&x| x as f64).collect()).unwrap()
        };
        (
            ids(&self.qs, [1, self.qs.len(), 1]),
            ids(&self.ks, [1, 1, self.ks.len()]),
        )
    }

    fn visible(&self, h: usize, i: usize, j: usize) -> bool {
        self.m.heads[h].visible(i as u64, j as u64)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2, ..ProptestConfig::default() })]

    /// The dq and dk/dv kernels, driven by the forward's tables and their
    /// transpose, on every CPU path against the f64 gradients: random
    /// per-head masks, packed segments (dead rows included), GQA, ragged
    /// ends, soft-cap, f32 and bf16.
    #[test]
    fn masked_attention_backward_matches_f64_on_every_path(
        heads in prop::collection::vec(mask(), 2..3),
        gqa in any::<bool>(),
        seq_blocks in 1usize..4, kv_blocks in 1usize..3, ragged_q in 0usize..2, ragged_kv in 0usize..3,
        segments in 1i32..4, softcap in prop::option::of(0.3f32..3.0), bf in any::<bool>(),
        seed in any::<u64>(),
    ) {
        use kernel_ir::{Array, DType};
        use kernels::attention::backward::attention_delta;
        use kernels::attention::masked::MaskedConfig;
        use kernels::attention::masked_backward::{masked_attention_dkv, masked_attention_dq};
        use kernels::tolerance::Tolerance;
        let dtype = if bf { DType::BF16 } else { DType::F32 };
        let (hkv, d, bk) = (if gqa { 1 } else { 2 }, 128usize, 128usize);
        let sq = seq_blocks * 16 - ragged_q * 5;
        let skv = kv_blocks * bk + ragged_kv * 40;
        // A block spans at most the sequence.
        let bq = 16.min(sq);
        let c = Case::new(heads, hkv, (sq, skv), (bq, bk), d, dtype, segments, seed);
        let h = c.m.heads.len();
        let cfg = MaskedConfig { sm_scale: 1.0 / (d as f32).sqrt(), softcap, block_q: bq, block_k: bk, rule: MaskedConfig::rule_of(&c.m) };
        let visible = |h, i, j| c.visible(h, i, j);
        let spec = kernels::reference::MaskedSpec {
            mask: &visible, q_seg: &c.qs, kv_seg: &c.ks, scale: cfg.sm_scale as f64, softcap: softcap.map(f64::from),
        };
        let (o, lse) = kernels::reference::masked_attention(&c.q, &c.k, &c.v, &spec);
        let (dq, dk, dv) = kernels::reference::masked_attention_backward(&c.q, &c.k, &c.v, &c.g, &spec);
        let o_arr = Array::new(dtype, [1, h, sq, d], o).unwrap();
        let lse_arr = Array::new(DType::F32, [1, h, sq, 1], lse).unwrap();
        let delta = kernels::reference::attention_delta(o_arr.data(), &c.g);
        let delta_arr = Array::new(DType::F32, [1, h, sq, 1], delta.clone()).unwrap();
        crate::common::all_paths(
            attention_delta::build_for(dtype, bq, attention_delta::Dims { b: 1, h, sq, d }),
            &[o_arr, c.g.clone()],
            vec![delta],
            &[Tolerance { abs: 1e-4, rel: 1e-4 }],
        )?;
        let (pre, masks) = c.t.arrays();
        let pre_t = c.t.transposed_arrays();
        let (qseg, kseg) = c.segs();
        let rest = [c.q.clone(), c.k.clone(), c.v.clone(), c.g.clone(), lse_arr, delta_arr, masks, qseg, kseg];
        let (nq, nk) = (c.t.q_blocks, c.t.k_blocks);
        let n = rest[6].shape()[0];
        let tol = Tolerance::attention_grad(dtype);
        let mut args = pre.to_vec();
        args.extend(rest.iter().cloned());
        crate::common::all_paths(
            masked_attention_dq::build_for(dtype, &cfg, masked_attention_dq::Dims { h, nq, nk, b: 1, sq, d, hkv, skv, n }),
            &args,
            vec![dq],
            &[tol],
        )?;
        let mut args = pre_t.to_vec();
        args.extend(rest.iter().cloned());
        crate::common::all_paths(
            masked_attention_dkv::build_for(dtype, &cfg, masked_attention_dkv::Dims { h, nk, nq, b: 1, sq, d, hkv, skv, n }),
            &args,
            vec![dk, dv],
            &[tol],
        )?;
    }
}

/// The transposed tables are the forward's cells read by key block, and a
/// skipped step names the query block the next computed one needs.
#[test]
fn the_transposed_tables_are_the_forwards_read_by_key_block() {
    // An explicit (all-visible) array makes the mask not computable, so
    // its partial steps keep element masks whose fetches are checked too.
    let everything = Mask::explicit(100, 90, vec![true; 9000]).unwrap();
    let m = MultiHeadMask {
        heads: vec![
            Mask::Causal { offset: 0 },
            Mask::Local {
                left: Some(20),
                right: Some(3),
            }
            .and(everything),
        ],
    };
    let t = BlockTables::build(&m, 100, 90, 16, 16).unwrap();
    assert!(t.partial_masks() > 1);
    let [kind, fetch, mask_fetch] = t.transposed_arrays();
    let (nq, nk) = (t.q_blocks, t.k_blocks);
    assert_eq!(kind.shape(), &[2, nk, nq]);
    let at = |a: &kernel_ir::Array, h: usize, ki: usize, qi: usize| {
        a.data()[(h * nk + ki) * nq + qi] as i32
    };
    for h in 0..2 {
        for ki in 0..nk {
            for qi in 0..nq {
                let want = match t.kind_at(h, qi, ki) {
                    BlockKind::Empty => 0,
                    BlockKind::Partial => 1,
                    BlockKind::Full => 2,
                };
                assert_eq!(
                    at(&kind, h, ki, qi),
                    want,
                    "head {h} k block {ki} q block {qi}"
                );
                let f = at(&fetch, h, ki, qi);
                if want != 0 {
                    assert_eq!(f, qi as i32);
                } else if let Some(next) = (qi..nq).find(|&j| at(&kind, h, ki, j) != 0) {
                    assert_eq!(f, next as i32);
                }
                let cell = (h * nq + qi) * nk + ki;
                if want == 1 {
                    assert_eq!(at(&mask_fetch, h, ki, qi), t.mask_index[cell]);
                }
            }
        }
    }
}

/// Mask descriptions parse as the command writes them, and bad ones are
/// errors naming the grammar.
#[test]
fn mask_descriptions_parse() {
    let m: Mask = "chunked:64&causal|prefix:4".parse().unwrap();
    assert_eq!(
        m,
        Mask::ChunkedCausal { chunk: 64 }
            .and(Mask::Causal { offset: 0 })
            .or(Mask::Prefix { len: 4 })
    );
    assert_eq!(
        "local:-:0".parse::<Mask>().unwrap(),
        Mask::Local {
            left: None,
            right: Some(0)
        }
    );
    assert_eq!(
        "causal:-2".parse::<Mask>().unwrap(),
        Mask::Causal { offset: -2 }
    );
    for bad in ["", "diagonal", "local:1", "chunked:0", "prefix:x"] {
        let e = bad.parse::<Mask>().unwrap_err().to_string();
        assert!(e.contains("write full, causal[:OFFSET]"), "{bad}: {e}");
    }
}
