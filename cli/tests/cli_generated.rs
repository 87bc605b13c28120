//! The hostile suite's command-line surface (issue 70): generated command
//! lines against the `tessera` binary, each judged; the tally lands in
//! `target/conformance/hostile/`.

use std::process::Command;

use kernel_ir::{Array, DType};

mod common;
use common::dir;

/// The hostile suite's CLI surface: `TESSERA_HOSTILE_CASES` (default
/// 2,000) generated command lines, seed 70: a command, a kernel (catalog,
/// preset, a kernel file, or not one), then flags drawn from each
/// command's own and others', with values good and bad (sizes, shapes of
/// zero, huge and malformed dims, NaN, units, non-ASCII, newlines, paths
/// outside the scratch folder). Commands that would compile or measure for
/// seconds or minutes on good values (compile, estimate, tune, bench,
/// export, cases, numerics, profile) take at least one flag, only values
/// from the bad pool, and a file for `--out`. Each case runs
/// in a scratch folder and must hold: exit 0, 1 or 2, at most one line on
/// stderr, no panic, done within 60 s (its process group killed past it),
/// and nothing written in the folder but under its `--out` (or, for
/// `profile` without one, its documented default, `target/`).
#[test]
fn generated_command_lines_hold() {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let cases: u64 = std::env::var("TESSERA_HOSTILE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(tooling::hostile::CASES);
    let root = dir("hostile-cli");
    let kir = root.join("copy.kir");
    std::fs::write(
        &kir,
        "kernel @copy {\n  target v5e, vmem_limit default\n  grid [2 parallel]\n  \
         in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major\n  \
         out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major\nbody:\n  \
         %0 = load @x[0:8, 0:128] : f32[8, 128]\n  store @o[0:8, 0:128], %0 : f32[8, 128]\n}\n",
    )
    .unwrap();
    let x = root.join("x.npy");
    tooling::npy::write(&x, &Array::random(DType::F32, [16, 128], 1, -1.0, 1.0)).unwrap();
    let x64 = root.join("x64.npy");
    tooling::npy::write(&x64, &Array::random(DType::F32, [64, 256], 2, -1.0, 1.0)).unwrap();
    let light = ["lower", "cost", "run", "diff", "list", "masked"];
    let heavy = [
        "compile", "estimate", "tune", "bench", "export", "cases", "numerics", "profile",
    ];
    let kernels = [
        "add",
        "matmul",
        "rms_norm",
        "flash_attention",
        "add_f32",
        "all",
        "presets",
        "nope",
        "",
        "-",
        "../x",
        "\u{1F600}",
        "a\nb",
    ];
    let flags = [
        "--config",
        "--shape",
        "--input",
        "--out",
        "--backend",
        "--backends",
        "--target",
        "--tpu",
        "--gpu",
        "--seed",
        "--max-memory",
        "--max-work",
        "--timeout",
        "--first",
        "--json",
        "--warps",
        "--stages",
        "--values",
        "--top",
        "--mask",
        "--budget",
        "--k",
        "--steps",
        "--help",
        "--",
        "-x",
    ];
    let bad = [
        "",
        "0",
        "-1",
        "nan",
        "inf",
        "1e300",
        "18446744073709551616",
        "x",
        "0x0",
        "x=0x512",
        "x=18446744073709551615x512",
        "x=4294967296x4294967296",
        "x=65536x65536",
        "x=1x1x1x1x1x1x1x1x1",
        "block_rows=0",
        "dtype=f64",
        "=",
        "a=b=c",
        "\u{1F600}",
        " 8",
        "v9",
        "all,all",
        "sm_99",
        "12Q",
        "1e-400",
        "\n",
        "a\nb",
        "/dev/null",
        "/proc/self",
        "x=/dev/zero",
        "x=/nonexistent.npy",
        "../../escape",
    ];
    let good = [
        "dtype=bf16",
        "block_rows=8",
        "x=16x128",
        "x=64x256",
        "interp",
        "jit",
        "all",
        "interp,jit",
        "mosaic",
        "kernel",
        "triton",
        "decomposed",
        "v5e",
        "1",
        "4",
        "2G",
        "100",
    ];
    let next = AtomicU64::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for worker in 0..2 {
            let (root, kir, x, x64) = (&root, &kir, &x, &x64);
            let (failures, next) = (&failures, &next);
            s.spawn(move || {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= cases {
                        break;
                    }
                    let mut r = kernel_ir::SplitMix64(70_000 + n);
                    let is_heavy = r.chance(30);
                    let cmd = if is_heavy {
                        r.pick(&heavy)
                    } else {
                        r.pick(&light)
                    };
                    let scratch = root.join(format!("w{worker}-case{n}"));
                    std::fs::create_dir_all(&scratch).unwrap();
                    let mut args: Vec<String> = vec![cmd.to_string()];
                    match r.below(4) {
                        0 => args.push(kir.display().to_string()),
                        _ => args.push(r.pick(&kernels).to_string()),
                    }
                    // A heavy command always gets a flag, every value bad
                    // and its --out a file: its defaults would compile or
                    // write for seconds.
                    for _ in 0..usize::from(is_heavy) + r.below(6) {
                        let flag = r.pick(&flags);
                        args.push(flag.to_string());
                        let value = match flag {
                            "--out" if is_heavy => x.display().to_string(),
                            "--out" if r.chance(70) => scratch.join("out").display().to_string(),
                            "--input" if !is_heavy && r.chance(60) => {
                                let f = if r.chance(50) { x } else { x64 };
                                format!("{}={}", r.pick(&["x", "y", "q"]), f.display())
                            }
                            _ if is_heavy || r.chance(50) => r.pick(&bad).to_string(),
                            _ => r.pick(&good).to_string(),
                        };
                        if !matches!(flag, "--json" | "--help") || r.chance(20) {
                            args.push(value);
                        }
                    }
                    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
                    c.args(&args)
                        .current_dir(&scratch)
                        .stdin(std::process::Stdio::null())
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::piped());
                    // A watchdog kills the group past 60 s; the read ends
                    // at the pipes' end (the group is gone by then).
                    let got = runtime::child::spawn(&mut c)
                        .map_err(|e| e.to_string())
                        .and_then(|child| {
                            let pid = child.id();
                            let (o, killed) = runtime::child::within(
                                pid,
                                std::time::Duration::from_secs(60),
                                || child.wait_with_output(),
                            );
                            let o = o.map_err(|e| e.to_string())?;
                            Ok(runtime::child::Collected {
                                status: (!killed).then_some(o.status),
                                lines: Vec::new(),
                                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                            })
                        });
                    let verdict = match got {
                        Err(e) => Err(format!("cannot run: {e}")),
                        Ok(g) => match g.status {
                            None => Err("ran past 60 s".to_string()),
                            Some(st) if !matches!(st.code(), Some(0..=2)) => {
                                Err(format!("{st}: {}", g.stderr))
                            }
                            Some(_) if g.stderr.lines().count() > 1 => Err(format!(
                                "{} lines on stderr: {}",
                                g.stderr.lines().count(),
                                g.stderr
                            )),
                            Some(_) if g.stderr.contains("panicked") => Err(g.stderr),
                            Some(_) => {
                                // What --out named (its first component,
                                // relative to the scratch folder), and
                                // profile's documented default.
                                let mut allowed: Vec<String> =
                                    args.windows(2)
                                        .filter(|w| w[0] == "--out")
                                        .filter_map(|w| {
                                            std::path::Path::new(&w[1]).components().next().map(
                                                |c| c.as_os_str().to_string_lossy().into_owned(),
                                            )
                                        })
                                        .collect();
                                allowed.push("out".into());
                                if cmd == "profile" {
                                    allowed.push("target".into());
                                }
                                let stray: Vec<String> = std::fs::read_dir(&scratch)
                                    .unwrap()
                                    .flatten()
                                    .map(|e| e.file_name().to_string_lossy().into_owned())
                                    .filter(|n| !allowed.contains(n))
                                    .collect();
                                if stray.is_empty() {
                                    Ok(())
                                } else {
                                    Err(format!("wrote outside --out: {stray:?}"))
                                }
                            }
                        },
                    };
                    if let Err(e) = verdict {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("case {n} {args:?}: {e}"));
                    }
                    let _ = std::fs::remove_dir_all(&scratch);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    tooling::hostile::record(
        &tooling::hostile::folder(),
        "CLI flags and shapes",
        cases,
        cases - failures.len() as u64,
        "seed 70: commands, kernels, flags and values drawn; exit 0, 1 or 2, one line, in time, nothing outside --out",
    )
    .unwrap();
    assert!(
        failures.is_empty(),
        "{} of {cases} command lines did not hold:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(&root);
}
