//! Edge values give one answer on every path: NaN through max/min
//! (elementwise and reductions), overflow of exp/exp2 to +inf, float to
//! integer conversion (saturating, NaN as 0), loop steps past the span,
//! and the limits each path holds (long bodies, large grids).
//! Each kernel runs on every `Backend` and every output element is
//! compared with the value the rule gives (NaN must be NaN, +inf must be
//! +inf). `cli/tests/cli_kir.rs` finds such cases: a grammar
//! fuzzer over kernel files, checked across the same paths.

use kernel_ir::{Array, DType, parse};
use runtime::backend::{Backend, Prepared};

/// Runs `text` on every path and compares its one output with `want`
/// (NaN matches NaN only, infinities exactly, others within 1e-5 relative: exp2 is exp(x·ln 2)
/// on some paths, a few ulp off).
fn on_every_path(text: &str, args: &[Array], want: &[f64]) {
    let k = parse(text).unwrap().verify().unwrap();
    let mut failures = Vec::new();
    for b in Backend::ALL {
        let got = Prepared::new(b, &k)
            .and_then(|p| p.run(args))
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (i, (&g, &w)) in got[0].data().iter().zip(want).enumerate() {
            let same = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                (g - w).abs() <= 1e-5 * w.abs().max(1.0)
            };
            if !same {
                failures.push(format!("{b}: element {i} is {g}, want {w}"));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A kernel `name` of one step: `%0` is `x: f32[8, 128]`, `body` computes
/// `%2`, stored as `o: f32[8, cols]`.
fn of_x(name: &str, cols: usize, body: &str) -> String {
    format!(
        "kernel @{name} {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, {cols}] vmem block [8, {cols}] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
{body}  store @o[0:8, 0:{cols}], %2 : f32[8, {cols}]
}}
"
    )
}

/// A max or min over a row holding a NaN is NaN on every path (XLA's CPU
/// reduction dropped it: the decomposed path gave 1.0).
#[test]
fn max_and_min_reductions_propagate_nan_on_every_path() {
    let mut x = vec![1.0f64; 8 * 128];
    x[5] = f64::NAN; // row 0
    x[3 * 128 + 127] = f64::NAN; // row 3, last lane
    x[6 * 128] = f64::NAN; // row 6, first lane
    let x = Array::from_elems([8, 128], &x.iter().map(|&v| v as f32).collect::<Vec<_>>()).unwrap();
    let want: Vec<f64> = (0..8)
        .map(|r| {
            if [0, 3, 6].contains(&r) {
                f64::NAN
            } else {
                1.0
            }
        })
        .collect();
    for op in ["max", "min"] {
        let text = of_x(
            &format!("reduce_{op}"),
            1,
            &format!(
                "  %1 = reduce {op} %0, axes [1] : f32[8, 128] -> f32[8]\n  %2 = reshape %1 : f32[8] -> f32[8, 1]\n"
            ),
        );
        on_every_path(&text, std::slice::from_ref(&x), &want);
    }
}

/// exp and exp2 overflow to +inf on every path, and their largest finite
/// results stay finite (the JIT's polynomial saturated at 2.4e38).
#[test]
fn exp_overflows_to_infinity_on_every_path() {
    let inputs = [
        200.0f32,
        89.0,
        88.0,
        80.0,
        -200.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
    ];
    let x: Vec<f32> = inputs
        .iter()
        .flat_map(|&v| std::iter::repeat_n(v, 128))
        .collect();
    let x = Array::from_elems([8, 128], &x).unwrap();
    for (op, f) in [("exp", f64::exp as fn(f64) -> f64), ("exp2", f64::exp2)] {
        let want: Vec<f64> = inputs
            .iter()
            .flat_map(|&v| std::iter::repeat_n(DType::F32.round(f(v as f64)), 128))
            .collect();
        let text = of_x(
            &format!("overflow_{op}"),
            128,
            &format!("  %2 = {op} %0 : f32[8, 128]\n"),
        );
        on_every_path(&text, std::slice::from_ref(&x), &want);
    }
}

/// A loop whose step is larger than its span runs once on every path
/// (XLA's CPU trip-count analysis ran `0 to 1 step 3` zero times, so the
/// decomposed path gave 1 instead of 2), and a loop with a step of 3 over
/// 0..7 visits 0, 3 and 6 (its index is used, not only its count).
#[test]
fn loops_with_large_steps_run_their_trips_on_every_path() {
    for (lo, hi, step, want) in [
        (0, 1, 3, 2.0),                   // one trip: 1 + 1
        (0, 7, 3, 1.0 + 0.0 + 3.0 + 6.0), // trips at 0, 3, 6
        (5, 2, 2, 1.0),                   // none
        (-4, 4, 5, 1.0 - 4.0 + 1.0),      // trips at -4, 1
    ] {
        let body = if want == 2.0 {
            "    %5 = add %4, %4 : f32[8, 128]\n".to_string()
        } else {
            "    %10 = convert %3 : i32 -> f32\n    %11 = broadcast_in_dim %10, dims [] : f32 -> f32[8, 128]\n    %5 = add %4, %11 : f32[8, 128]\n".to_string()
        };
        let text = format!(
            "kernel @steps {{
  target v5e, vmem_limit default
  grid [1 parallel]
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %2 = constant 1.0 : f32[8, 128]
  %9 = for %3 = {lo} to {hi} step {step} iter(%4 = %2) {{
{body}    yield %5
  }}
  store @o[0:8, 0:128], %9 : f32[8, 128]
}}
"
        );
        on_every_path(&text, &[], &vec![want; 8 * 128]);
    }
}

/// Elementwise max and min with a NaN operand are NaN on every path, on
/// either side (XLA's CPU `maximum` dropped it: `min(-1, NaN)` was -1 on
/// the decomposed path).
#[test]
fn elementwise_max_and_min_propagate_nan_on_every_path() {
    let pairs = [
        (f32::NAN, -1.0),
        (-1.0, f32::NAN),
        (f32::NAN, f32::NAN),
        (f32::INFINITY, f32::NAN),
        (f32::NAN, f32::NEG_INFINITY),
        (2.0, -0.5),
        (-3.0, f32::INFINITY),
        (0.0, 4.0),
    ];
    let rows = |side: usize| -> Array {
        let v: Vec<f32> = pairs
            .iter()
            .flat_map(|p| std::iter::repeat_n(if side == 0 { p.0 } else { p.1 }, 128))
            .collect();
        Array::from_elems([8, 128], &v).unwrap()
    };
    let args = [rows(0), rows(1)];
    for op in ["max", "min"] {
        let want: Vec<f64> = pairs
            .iter()
            .flat_map(|&(a, b)| {
                let (a, b) = (f64::from(a), f64::from(b));
                let v = if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else if op == "max" {
                    a.max(b)
                } else {
                    a.min(b)
                };
                std::iter::repeat_n(v, 128)
            })
            .collect();
        let text = format!(
            "kernel @elementwise_{op} {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  in @y: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = load @y[0:8, 0:128] : f32[8, 128]
  %2 = {op} %0, %1 : f32[8, 128]
  store @o[0:8, 0:128], %2 : f32[8, 128]
}}
"
        );
        on_every_path(&text, &args, &want);
    }
}

/// A float converted to an integer type truncates toward zero and
/// saturates at the type's bounds, ±∞ included, with NaN as 0, on every
/// path (the JIT gave i32::MIN for NaN and ∞, x86's answer; the Triton
/// program and the interpreter wrapped past the range; XLA saturated).
#[test]
fn float_to_int_conversion_saturates_on_every_path() {
    let inputs = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        3.0e9,
        -3.0e9,
        2_147_483_520.0,
        2_147_483_648.0,
        -2_147_483_648.0,
        200.0,
        -200.0,
        127.9,
        -128.5,
        -129.0,
        2.7,
        -2.7,
        -0.0,
    ];
    let x: Vec<f32> = (0..8 * 128).map(|i| inputs[i % inputs.len()]).collect();
    let x = Array::from_elems([8, 128], &x).unwrap();
    for (to, low, high) in [
        ("i32", -2_147_483_648.0, 2_147_483_647.0),
        ("i8", -128.0, 127.0),
    ] {
        let want: Vec<f64> = (0..8 * 128)
            .map(|i| {
                let v = f64::from(inputs[i % inputs.len()]);
                if v.is_nan() {
                    0.0
                } else {
                    v.trunc().clamp(low, high)
                }
            })
            .collect();
        let text = format!(
            "kernel @to_{to} {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: {to}[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = convert %0 : f32[8, 128] -> {to}[8, 128]
  store @o[0:8, 0:128], %1 : {to}[8, 128]
}}
"
        );
        on_every_path(&text, std::slice::from_ref(&x), &want);
    }
}

/// A chain of `n` op pairs (`x + x`, then `- x`), each value used twice:
/// the shape that made the JIT's LLVM pipeline take minutes. (Not
/// `(x + x) · 0.5`: XLA's CPU compiler turns 500 of those into NaN.)
fn chain(n: usize) -> String {
    let mut body = String::new();
    let mut last = 0;
    for i in 0..n {
        let (a, m) = (1 + 2 * i, 2 + 2 * i);
        body += &format!("  %{a} = add %{last}, %{last} : f32[8, 128]\n");
        body += &format!("  %{m} = sub %{a}, %{last} : f32[8, 128]\n");
        last = m;
    }
    format!(
        "kernel @chain {{
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
{body}  store @o[0:8, 0:128], %{last} : f32[8, 128]
}}
"
    )
}

/// A long straight-line body still compiles on every path and gives `x`
/// back (1,000 ops: the JIT's module, 24.5k LLVM ops, stays below its
/// `OPTIMIZED_OPS`, so it is compiled optimized, at -O2: -O3 took 35 s on
/// it); one past
/// `limits::MAX_HOST_OPS` is refused by the JIT and the PJRT FFI path with
/// a `[limit]` error naming the limit, while the interpreter and the
/// decomposed path run it.
#[test]
fn long_bodies_compile_or_are_refused_by_the_limit() {
    let x: Vec<f32> = (0..8 * 128).map(|i| (i % 7) as f32 - 3.0).collect();
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let x = Array::from_elems([8, 128], &x).unwrap();
    on_every_path(&chain(500), std::slice::from_ref(&x), &want);
    let k = parse(&chain(2000)).unwrap().verify().unwrap();
    for b in Backend::ALL {
        let got = Prepared::new(b, &k).and_then(|p| p.run(std::slice::from_ref(&x)));
        match b {
            Backend::Native | Backend::HostCall => {
                let e = got.err().map(|e| e.to_string()).unwrap_or_default();
                assert!(
                    e.contains("[limit]") && e.contains("MAX_HOST_OPS"),
                    "{b}: {e}"
                );
            }
            _ => assert_eq!(
                got.unwrap_or_else(|e| panic!("{b}: {e}"))[0].data(),
                &want[..],
                "{b}"
            ),
        }
    }
}

/// A copy over a grid of `steps` arbitrary steps.
fn copy_over(steps: u64) -> String {
    format!(
        "kernel @copy_over_grid {{
  target v5e, vmem_limit default
  grid [{steps} arbitrary]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}}
"
    )
}

/// A legal grid too large for a CPU path is refused by it at once with a
/// `[limit]` error naming the limit (the JIT ran a 10^9-step grid past
/// any timeout, PJRT hung): 10^8 steps on every path; 2^16 + 1 steps on
/// Triton's interpreter only, which the JIT still runs.
#[test]
fn grids_past_a_paths_limit_are_refused_at_once() {
    let x = Array::from_elems([8, 128], &[1.5f32; 8 * 128]).unwrap();
    let k = parse(&copy_over(100_000_000)).unwrap().verify().unwrap();
    for b in Backend::ALL {
        let e = Prepared::new(b, &k)
            .and_then(|p| p.run(std::slice::from_ref(&x)))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let says = if b == Backend::Interpreter {
            "MAX_INTERP_STEPS"
        } else if b == Backend::TritonInterp {
            "MAX_TRITON_INTERP_STEPS"
        } else {
            "MAX_CPU_STEPS"
        };
        assert!(e.contains("limit") && e.contains(says), "{b}: {e}");
    }
    let k = parse(&copy_over((1 << 16) + 1)).unwrap().verify().unwrap();
    let e = Prepared::new(Backend::TritonInterp, &k)
        .err()
        .map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("MAX_TRITON_INTERP_STEPS")),
        "{e:?}"
    );
    let got = Prepared::new(Backend::Native, &k)
        .and_then(|p| p.run(std::slice::from_ref(&x)))
        .unwrap();
    assert_eq!(got[0].data(), x.data());
}

/// NaN payloads survive an `i32 → f32 → i32` bitcast round trip bit for
/// bit on every path, a signalling NaN included (issue 70's third finding:
/// the interpreter held f32 values as f64 through `as`, which quiets a
/// signalling NaN, and 0x7f800001 came back 0x7fc00001).
#[test]
fn nan_payloads_survive_a_bitcast_round_trip_on_every_path() {
    let text = "kernel @nan_bits {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: i32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: i32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : i32[8, 128]
  %1 = bitcast %0 : i32[8, 128] -> f32[8, 128]
  %2 = bitcast %1 : f32[8, 128] -> i32[8, 128]
  store @o[0:8, 0:128], %2 : i32[8, 128]
}
";
    let patterns: [u32; 8] = [
        0x7f80_0001, // the smallest signalling NaN
        0xff80_0001, // negative
        0x7fbf_ffff, // the largest signalling NaN
        0x7fc0_0000, // the quiet NaN
        0xffc1_2345, // a quiet NaN with a payload
        0x7f80_0000, // +inf
        0x0000_0001, // the smallest subnormal
        0x8000_0000, // -0
    ];
    let want: Vec<f64> = (0..8 * 128)
        .map(|i| patterns[i % patterns.len()] as i32 as f64)
        .collect();
    let x = Array::new(DType::I32, [8, 128], want.clone()).unwrap();
    let k = parse(text).unwrap().verify().unwrap();
    for b in Backend::ALL {
        let got = Prepared::new(b, &k)
            .and_then(|p| p.run(std::slice::from_ref(&x)))
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (i, (&g, &w)) in got[0].data().iter().zip(&want).enumerate() {
            assert_eq!(
                g as i32 as u32, w as i32 as u32,
                "{b}: element {i} is {:#010x}, want {:#010x}",
                g as i32 as u32, w as i32 as u32
            );
        }
    }
}

/// Issue 70's second finding: f32 subnormals are kept on some paths and
/// flushed on others (XLA's CPU runtime flushes). Each path gives the
/// answer its documented policy (`Backend::subnormals`) says for
/// `y / (x + x)` at x = 1e-40, y = 1e-30: 5e9 where kept, +inf where
/// flushed (x + x reads as 0), so a path that changes its policy fails
/// here and its documentation with it.
#[test]
fn each_path_follows_its_documented_subnormal_policy() {
    use runtime::backend::Subnormals;
    let text = "kernel @subnormal {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  in @y: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  %1 = load @y[0:8, 0:128] : f32[8, 128]
  %2 = add %0, %0 : f32[8, 128]
  %3 = div %1, %2 : f32[8, 128]
  store @o[0:8, 0:128], %3 : f32[8, 128]
}
";
    let x = Array::new(DType::F32, [8, 128], vec![1e-40f32 as f64; 1024]).unwrap();
    let y = Array::new(DType::F32, [8, 128], vec![1e-30f32 as f64; 1024]).unwrap();
    let k = parse(text).unwrap().verify().unwrap();
    let kept = (1e-30f32 / (1e-40f32 + 1e-40f32)) as f64;
    assert!(
        kept.is_finite() && (kept / 5e9 - 1.0).abs() < 1e-4,
        "{kept}"
    );
    for b in Backend::ALL {
        let got = Prepared::new(b, &k)
            .and_then(|p| p.run(&[x.clone(), y.clone()]))
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        let want = match b.subnormals() {
            Subnormals::Kept => kept,
            Subnormals::Flushed => f64::INFINITY,
        };
        assert!(
            got[0].data().iter().all(|&v| v == want),
            "{b} ({} subnormals): {}, want {want}",
            b.subnormals().name(),
            got[0].data()[0]
        );
    }
}
