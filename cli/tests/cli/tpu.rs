//! The TPU commands end to end: `compile` for every generation, libtpu's
//! schedule `estimate` with its guards, `tune` ranked by estimate, and
//! libtpu's failures (an abort, a tensor larger than HBM) as one-line
//! errors.

use crate::common::{dir, stderr, stdout, tessera};

#[test]
fn compile_reports_every_generation_and_writes_executables() {
    let d = dir("compile");
    // One kernel, every generation (the default): a line per generation.
    let o = tessera(&["compile", "flash_attention", "--config", "causal=true"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for t in ["v5e", "v6e", "v5p", "v7x"] {
        assert!(text.contains(&format!("  {t:<4} ok")), "{t}: {text}");
    }
    assert!(text.contains("code") && text.contains("HBM"), "{text}");
    // One kernel on one generation: --out is the executable file.
    let file = d.join("add.v6e.bin");
    let o = tessera(&[
        "compile",
        "add_f32",
        "--tpu",
        "v6e",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes.len() > 1000, "{} bytes", bytes.len());
    // Several: --out is a directory with one file per kernel and generation.
    let out = d.join("many");
    let o = tessera(&[
        "compile",
        "add_f32",
        "--tpu",
        "v5e,v7x",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for t in ["v5e", "v7x"] {
        assert!(
            out.join(format!("add_f32.{t}.tpu-executable")).is_file(),
            "{t}"
        );
    }
    // Bad invocations: one line, status 2, before any compile.
    for (args, want) in [
        (vec!["compile", "nope"], "unknown kernel `nope`"),
        (
            vec!["compile", "add_f32", "--tpu", "v9"],
            "unknown TPU generation `v9`",
        ),
        (
            vec!["compile", "presets", "--config", "dtype=bf16"],
            "--config and --shape need one kernel",
        ),
        (
            vec![
                "compile",
                "add_f32",
                "--tpu",
                "v6e",
                "--out",
                d.to_str().unwrap(),
            ],
            "is a directory",
        ),
    ] {
        let o = tessera(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert_eq!(e.lines().count(), 1, "{args:?}: {e}");
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

/// `tessera estimate --json` rows for one kernel.
fn estimate_json(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["estimate"];
    all.extend_from_slice(args);
    all.push("--json");
    let o = tessera(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str::<Vec<serde_json::Value>>(&stdout(&o))
        .expect("estimate --json prints a JSON array")
}

/// Flash attention at d = 128 (d = 64 aborts the profiler), bf16, 128 × 128
/// blocks, then `extra`.
fn attn_128<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "flash_attention",
        "--config",
        "dtype=bf16",
        "--config",
        "block_q=128",
        "--config",
        "block_k=128",
        "--shape",
        "q=1x2x512x128",
        "--shape",
        "k=1x2x512x128",
        "--shape",
        "v=1x2x512x128",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn estimate_trusts_flash_attention_whose_trace_runs_every_mxu_pass() {
    for causal in ["false", "true"] {
        let c = format!("causal={causal}");
        let rows = estimate_json(&attn_128(&["--config", &c, "--tpu", "v5e,v6e"]));
        assert_eq!(rows.len(), 2);
        for r in &rows {
            let (ran, needed) = (
                r["vmatmul"].as_u64().unwrap(),
                r["needed_passes"].as_u64().unwrap(),
            );
            // The causal skip is a division-free test of grid indices,
            // which the profiler follows (a divided one ran 0 passes).
            assert!(needed > 0 && ran == needed, "causal={causal}: {r}");
            assert_eq!(r["trusted"], true, "causal={causal}: {r}");
            assert!(r["cycles"].as_u64().unwrap() > 0);
            assert!(r["over_roofline"].as_f64().unwrap() >= 1.0, "{r}");
        }
    }
}

#[test]
fn estimate_guards_trip_on_the_kernels_that_fool_the_profiler() {
    let reasons = |r: &serde_json::Value| r["reasons"].to_string();
    // Scalar-prefetch-driven control flow: the page table steers the work
    // and the profiler runs none of it.
    let [paged] = &estimate_json(&["paged_decode_attention", "--tpu", "v6e"])[..] else {
        panic!("one row")
    };
    assert_eq!(paged["trusted"], false);
    assert!(reasons(paged).contains("dropped work"), "{paged}");
    assert!(paged["vmatmul"].as_u64().unwrap() < paged["needed_passes"].as_u64().unwrap());
    // A large add: memory-bound, and with wide blocks the profiler's
    // unshared DMAs put it below the bandwidth bound.
    let add = |cols: &str| {
        let c = format!("block_cols={cols}");
        estimate_json(&[
            "add",
            "--shape",
            "x=2048x2048",
            "--shape",
            "y=2048x2048",
            "--config",
            "block_rows=256",
            "--config",
            &c,
            "--tpu",
            "v6e",
        ])
        .remove(0)
    };
    let narrow = add("128");
    assert_eq!(narrow["trusted"], false);
    assert!(reasons(&narrow).contains("memory-bound"), "{narrow}");
    let bw = narrow["roofline_seconds"].as_f64().unwrap();
    assert!(narrow["seconds"].as_f64().unwrap() >= bw, "{narrow}");
    let wide = add("2048");
    assert!(reasons(&wide).contains("below the roofline"), "{wide}");
    // No published clock: cycles only.
    let [v7x] = &estimate_json(&attn_128(&["--tpu", "v7x"]))[..] else {
        panic!("one row")
    };
    assert_eq!(v7x["trusted"], false);
    assert!(
        v7x["seconds"].is_null() && reasons(v7x).contains("no published"),
        "{v7x}"
    );
}

#[test]
fn a_profiler_abort_is_a_row_without_an_estimate_not_a_crash() {
    // head_dim 64 aborts libtpu 0.0.48.1's profiler (Pallas's flash
    // attention at d=64 too): the command names it and goes on.
    let o = tessera(&["estimate", "flash_attention", "--tpu", "v6e"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("NO ESTIMATE") && text.contains("static profiler aborted"),
        "{text}"
    );
    assert!(!text.contains("Check failure stack trace"), "{text}");
}

#[test]
fn tune_ranks_verified_blocks_and_names_the_winner() {
    for how in [&["--tpu", "v6e"][..], &["--cpu"][..]] {
        let mut args = vec![
            "tune",
            "matmul",
            "--values",
            "128,256",
            "--shape",
            "x=256x512",
            "--shape",
            "y=512x256",
        ];
        args.extend_from_slice(how);
        let o = tessera(&args);
        assert!(o.status.success(), "{how:?}: {}", stderr(&o));
        let text = stdout(&o);
        assert!(text.contains("8 candidates"), "{how:?}: {text}");
        let winner = text
            .lines()
            .find_map(|l| l.strip_prefix("winner: "))
            .expect("a winner line");
        assert!(
            winner.contains("--config bm=") && winner.contains("bk="),
            "{winner}"
        );
        // The winner is the first row.
        let first = text
            .lines()
            .find(|l| l.trim_start().starts_with("1."))
            .unwrap();
        for kv in winner
            .split("--config ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            assert!(first.contains(kv), "{first} vs {winner}");
        }
    }
    for bad in [
        &["tune", "matmul"][..],
        &["tune", "matmul", "--tpu", "v6e", "--cpu"],
        &["tune", "matmul", "--cpu", "--config", "bm=128"],
        &["tune", "matmul", "--cpu", "--values", "0"],
        &["tune", "add_f32", "--cpu"],
        &["estimate", "--module", "/nonexistent.mlir"],
        &["estimate", "--module", "/dev/null"],
    ] {
        let o = tessera(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{bad:?}: {}", stderr(&o));
    }
}

#[test]
fn a_module_tensor_larger_than_hbm_is_refused_before_libtpu() {
    let d = dir("huge-module");
    let m = d.join("huge.mlir");
    let ty = "tensor<4000000000x4000000000xf32>";
    std::fs::write(
        &m,
        format!("module {{\n  func.func public @main(%a: {ty}) -> {ty} {{\n    return %a : {ty}\n  }}\n}}\n"),
    )
    .unwrap();
    for cmd in ["compile", "estimate"] {
        let o = tessera(&[cmd, "--module", m.to_str().unwrap(), "--tpu", "v5e"]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {e}");
        assert!(
            e.lines().count() == 1 && e.contains(ty) && e.contains("HBM"),
            "{cmd}: {e}"
        );
    }
}

#[test]
fn a_libtpu_abort_is_one_line_with_its_own_exit_status() {
    // Under an address-space limit of about 1.2-1.5 GB libtpu cannot get
    // the memory it maps and aborts (signal 6) inside the compile's child
    // process within a second, while the CLI itself fits. (Lower limits
    // crash it slowly or stop the CLI from starting; higher ones let the
    // compile pass.) The first limit that gives the abort is used.
    use std::os::unix::process::CommandExt;
    let mut seen = Vec::new();
    for limit in [1_300_000_000u64, 1_200_000_000, 1_450_000_000] {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
        c.args(["compile", "matmul", "--tpu", "v5e"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        // SAFETY: only setrlimit between fork and exec.
        unsafe {
            c.pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                libc::setrlimit(libc::RLIMIT_AS, &l);
                Ok(())
            });
        }
        let mut child = c.spawn().unwrap();
        let t0 = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        let (e, out) = (stderr(&o), stdout(&o));
        if o.status.code() == Some(3) {
            assert!(
                e.lines().count() == 1 && e.contains("libtpu aborted"),
                "{e}"
            );
            assert!(
                out.contains("libtpu aborted the compile for v5e (signal"),
                "{out}"
            );
            return;
        }
        seen.push(format!("{limit}: {:?} {e}", o.status));
    }
    panic!("no limit made libtpu abort: {seen:?}");
}

/// The MoE model's whole training step (router, routing tables, permutes,
/// grouped matmuls with their weight gradients, attention with sinks and
/// dropout, the fused loss, and every backward) compiles with libtpu, and
/// the compile reports its peak HBM beside the dense model's.
#[test]
fn a_moe_training_step_compiles_for_a_tpu() {
    let d = dir("moe-step");
    let mut peaks = Vec::new();
    for model in ["dense", "moe"] {
        let m = d.join(format!("{model}.mlir"));
        let path = m.to_str().unwrap();
        let o = tessera(&["train", "--model", model, "--step-module", path]);
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        let o = tessera(&["compile", "--module", path, "--tpu", "v6e"]);
        let out = stdout(&o);
        assert!(
            o.status.success() && out.contains(" ok "),
            "{model}: {out}{}",
            stderr(&o)
        );
        let peak = out.split("peak ").nth(1).unwrap_or_else(|| panic!("{out}"));
        peaks.push(peak.trim().to_string());
    }
    // The experts' parameters and their routed copies take more than the
    // dense FFN's: the two reports differ.
    assert_ne!(peaks[0], peaks[1], "{peaks:?}");
    // A file that cannot be written is an error naming it, and leaves
    // nothing behind.
    let bad = d.join("missing").join("step.mlir");
    let o = tessera(&["train", "--step-module", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("writing the step module"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("missing").exists());
    let _ = std::fs::remove_dir_all(&d);
}
