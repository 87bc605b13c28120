//! The catalog itself: names, presets and config parsing, the shapes every
//! entry refuses, and the error statistics every comparison uses. (Here, not
//! as unit tests of `tessera-kernels`: those compiled the whole library a
//! second time, in test mode, for tests that need only its public API.)

use kernel_ir::{Array, DType};
use kernels::check::{ErrorStats, Tolerance};
use kernels::{Config, ENTRIES, find, presets};

/// The names `tessera list` prints (the kernel's arguments) are the
/// names `--input` and `--shape` take (the entry's shapes).
#[test]
fn input_names_are_the_kernels_argument_names() {
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).unwrap();
        let shapes = e.default_shapes(&cfg).unwrap();
        let k = e.build_at_default_shapes(&cfg).unwrap();
        let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
        let args: Vec<&str> = k.arguments().map(|a| a.name).collect();
        assert_eq!(names, args, "{}", e.name);
    }
}

/// Names are unique across kernels and presets (a preset named like a
/// kernel could not be reached by name: `lower`, `compile`, `cost` and
/// `estimate` look kernels up first, and `compile all --out` wrote both
/// to one file), every preset builds, and every preset's override names
/// a parameter or an input of its kernel.
#[test]
fn presets_build_and_names_are_unique() {
    let mut names = std::collections::HashSet::new();
    for e in ENTRIES {
        assert!(names.insert(e.name), "two kernels are called {}", e.name);
    }
    let mut presets_seen = std::collections::HashSet::new();
    for p in presets() {
        assert!(
            presets_seen.insert(p.name()),
            "two presets are called {}",
            p.name()
        );
        assert!(
            find(p.name()).is_none(),
            "preset {} has a kernel's name, so it cannot be reached by name",
            p.name()
        );
        p.build().unwrap_or_else(|e| panic!("{}: {e}", p.name()));
    }
    // The 20 presets the library started with; more are welcome.
    assert!(presets_seen.len() >= 20, "{}", presets_seen.len());
}

/// Values of the wrong kind are refused when parsed, with the kind.
#[test]
fn config_values_are_checked_by_kind() {
    let e = find("flash_attention").unwrap();
    let bad = |k: &str, v: &str| {
        Config::parse(e, &[(k.into(), v.into())])
            .unwrap_err()
            .to_string()
    };
    assert!(bad("block_q", "0").contains("a positive integer"));
    assert!(bad("causal", "yes").contains("true or false"));
    assert!(bad("dtype", "i32").contains("f32, bf16 or f16"));
    assert!(bad("window", "-3").contains("none or a positive integer"));
    assert!(bad("softcap", "0").contains("none or a positive number"));
    assert!(bad("sm_scale", "nan").contains("auto or a number"));
    assert!(bad("nope", "1").contains("its keys are: dtype, causal"));
    let e = find("matmul_epilogue").unwrap();
    assert!(
        Config::parse(e, &[("activation".into(), "relu".into())])
            .unwrap_err()
            .to_string()
            .contains("none, gelu, silu")
    );
}

/// A zero-size dim in any input of any kernel is an error from the
/// build (the verifier's `[zero-size]` or a shape error), never a
/// panic: every path runs only verified kernels, so this is the one
/// answer on all of them.
#[test]
fn zero_size_dims_are_errors_for_every_kernel() {
    let mut tried = 0;
    for e in ENTRIES {
        let cfg = Config::parse(e, &[]).unwrap();
        let shapes: Vec<Vec<usize>> = e
            .default_shapes(&cfg)
            .unwrap()
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        for i in 0..shapes.len() {
            for d in 0..shapes[i].len() {
                let mut s = shapes.clone();
                s[i][d] = 0;
                tried += 1;
                // Either the build refuses it, or the kernel built
                // from the other inputs takes another shape there (an
                // argument error when it is called with this one).
                match e.build(&cfg, &s) {
                    Err(_) => {}
                    Ok(k) => {
                        let want: Vec<Vec<usize>> =
                            k.arguments().map(|a| a.shape.to_vec()).collect();
                        assert_ne!(want[i], s[i], "{} input {i} dim {d}", e.name);
                    }
                }
            }
        }
    }
    assert!(tried > 40, "{tried}");
}

#[test]
fn nan_never_passes() {
    let a = Array::new(DType::F32, [2], vec![1.0, f64::NAN]).unwrap();
    let s = ErrorStats::between(&a, &[1.0, 1.0], Tolerance { abs: 1e9, rel: 1e9 });
    assert!(!s.passes());
    assert_eq!(s.nan_count, 1);
}

#[test]
fn tolerance_is_abs_plus_rel() {
    let a = Array::new(DType::F32, [2], vec![1.0, 100.5]).unwrap();
    let t = Tolerance {
        abs: 0.1,
        rel: 0.004,
    };
    assert!(ErrorStats::between(&a, &[1.05, 100.0], t).passes());
    assert!(!ErrorStats::between(&a, &[1.2, 100.0], t).passes());
    let b = Array::new(DType::F32, [1], vec![1.0]).unwrap();
    assert!(!ErrorStats::between(&b, &[1.0, 2.0], t).passes());
}
