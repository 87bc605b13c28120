//! The runtime's trace: valid Chrome trace-event JSON, spans that nest and
//! never overlap on one track, and totals that agree with
//! `Runtime::stats()`.

use std::collections::BTreeMap;

use graph::Trace;
use tooling::profile::{kernel, transformer};

/// Every track's spans either nest or follow each other.
fn check_nesting(t: &Trace) {
    let mut by_track: BTreeMap<u64, Vec<(f64, f64, &str)>> = BTreeMap::new();
    for s in &t.spans {
        by_track
            .entry(s.track)
            .or_default()
            .push((s.start_us, s.start_us + s.dur_us, s.name));
    }
    // Timestamps are printed to 1 ns; allow that much slack.
    let eps = 1e-3;
    for (track, mut spans) in by_track {
        // Parents first: earlier start, then longer.
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<(f64, f64, &str)> = Vec::new();
        for s in spans {
            while let Some(top) = open.last() {
                if s.0 >= top.1 - eps {
                    open.pop();
                } else {
                    break;
                }
            }
            if let Some(top) = open.last() {
                assert!(
                    s.1 <= top.1 + eps,
                    "track {track}: `{}` [{}, {}] overlaps `{}` [{}, {}] without nesting",
                    s.2,
                    s.0,
                    s.1,
                    top.2,
                    top.0,
                    top.1
                );
            }
            open.push(s);
        }
    }
}

#[test]
fn the_trace_is_valid_trace_event_json_and_its_spans_nest() {
    let p = transformer(8, &[40, 100, 200, 64], &[64, 128, 256]).unwrap();
    let json: serde_json::Value = serde_json::from_str(&p.trace.to_chrome_json()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert!(events.len() > 50);
    let mut names = std::collections::BTreeSet::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        match ph {
            "X" => {
                assert!(
                    e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0,
                    "{e}"
                );
                assert!(e["args"].is_object());
                names.insert(e["name"].as_str().unwrap().to_string());
            }
            "M" => assert_eq!(e["name"], "thread_name"),
            other => panic!("unexpected phase {other}"),
        }
    }
    for want in [
        "record",
        "sync",
        "materialize",
        "lower",
        "cache lookup",
        "compile",
        "kernel jit",
        "h2d",
        "d2h",
        "execute",
        "bucket",
    ] {
        assert!(names.contains(want), "no `{want}` span in {names:?}");
    }
    // Every span is on a named track (materializations run on the caller's).
    assert!(!p.trace.tracks.is_empty());
    assert!(
        p.trace
            .spans
            .iter()
            .all(|s| p.trace.tracks.contains_key(&s.track))
    );
    check_nesting(&p.trace);
}

#[test]
fn the_trace_totals_agree_with_the_runtime_stats() {
    for p in [
        transformer(10, &[40, 100, 200, 64, 250], &[64, 128, 256]).unwrap(),
        kernel("rms_norm", 5).unwrap(),
    ] {
        let s = p.trace.summary();
        let st = &p.stats;
        let tier = |t: &str| s.lookups.get(t).copied().unwrap_or(0);
        assert_eq!(tier("miss"), st.compiles, "{}", p.workload);
        assert_eq!(
            tier("memory") + tier("plan"),
            st.hits_memory,
            "{}",
            p.workload
        );
        assert_eq!(tier("disk"), st.hits_disk);
        assert_eq!(s.executions, st.materializations);
        assert_eq!(s.bytes_to_device, st.bytes_to_device, "{}", p.workload);
        assert_eq!(s.bytes_to_host, st.bytes_to_host, "{}", p.workload);
        assert_eq!(s.padding_bytes, st.padding_bytes);
        assert_eq!(s.transposes, st.transposes);
        assert_eq!(s.transpose_bytes, st.transpose_bytes);
        let hist: BTreeMap<usize, u64> = s.buckets.iter().map(|(k, v)| (*k, v.0)).collect();
        assert_eq!(hist, st.buckets, "{}", p.workload);
        check_nesting(&p.trace);
    }
    // The transformer run hits three buckets, compiles once per bucket and
    // reuses each after.
    let p = transformer(12, &[40, 100, 200, 64, 130, 250], &[64, 128, 256]).unwrap();
    let s = p.trace.summary();
    assert_eq!(s.buckets.len(), 3);
    assert_eq!(s.lookups.get("miss").copied(), Some(3));
    assert!(s.hit_rate() > 0.7);
}

#[test]
fn tracing_off_records_nothing_and_a_restart_clears() {
    use kernel_ir::{Array, DType};
    let rt = crate::common::fresh_runtime();
    let x = rt.tensor(&Array::zeros(DType::F32, [4, 4])).unwrap();
    x.exp().unwrap().to_host().unwrap();
    assert!(rt.stop_tracing().spans.is_empty());
    rt.start_tracing();
    x.exp().unwrap().to_host().unwrap();
    let t = rt.stop_tracing();
    assert!(!t.spans.is_empty());
    rt.start_tracing();
    let t2 = rt.stop_tracing();
    assert!(t2.spans.is_empty(), "a new trace starts empty");
    // After stopping, nothing more is recorded.
    x.exp().unwrap().to_host().unwrap();
    assert!(rt.stop_tracing().spans.is_empty());
}

/// The structural fast path: the same graph over new values (and a new
/// non-structural constant) reuses its executable with the right results;
/// a structural constant (1.0) or a new shape is a new structure.
#[test]
fn a_seen_structure_runs_its_executable_with_the_new_values() {
    use kernel_ir::{Array, DType};
    let rt = crate::common::fresh_runtime();
    let run = |n: usize, c: f64, seed: u64| -> (f64, f64) {
        let x = Array::random(DType::F32, [n, 3], seed, -1.0, 1.0);
        let want: f64 = x.data().iter().map(|v| (v * c as f32 as f64).tanh()).sum();
        let t = rt.tensor(&x).unwrap();
        let got = t
            .scale(c)
            .unwrap()
            .tanh()
            .unwrap()
            .sum(&[0, 1])
            .unwrap()
            .item()
            .unwrap();
        (got, want)
    };
    rt.start_tracing();
    for (i, (n, c)) in [
        (4, 0.5),
        (4, 0.25),
        (4, -2.0),
        (4, 1.0),
        (5, 0.5),
        (4, 0.75),
    ]
    .into_iter()
    .enumerate()
    {
        let (got, want) = run(n, c, i as u64);
        assert!((got - want).abs() < 1e-5, "n={n} c={c}: {got} vs {want}");
    }
    let s = rt.stop_tracing().summary();
    // Compiles: c = 0.5 (and 0.25, -2, 0.75 after it), c = 1 (inline),
    // n = 5; the other three reuse the first's executable.
    assert_eq!(s.lookups.get("miss").copied(), Some(3), "{:?}", s.lookups);
    assert_eq!(s.lookups.get("plan").copied(), Some(3), "{:?}", s.lookups);
}
