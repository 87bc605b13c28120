//! The hostile-input harness: malformed `.npy` files, bad flag values,
//! closed and full stdout, the hostile-input report's reproductions and a
//! stopped benchmark, all driving the `tessera` binary.

use std::process::{Command, Output};

use kernel_ir::{Array, DType};

mod common;
use common::{dir, save, stderr, tessera};

/// What every hostile invocation must give: exit status 0 (when the input
/// happens to be fine), 1 or 2; at most one line on stderr; never a panic
/// (status 101), an internal error (70) or a signal.
fn assert_civil(o: &Output, what: &str) -> Result<(), proptest::test_runner::TestCaseError> {
    let e = stderr(o);
    proptest::prop_assert!(
        matches!(o.status.code(), Some(0..=2)),
        "{what}: status {:?}\n{e}",
        o.status
    );
    proptest::prop_assert!(
        e.lines().count() <= 1,
        "{what}: {} lines:\n{e}",
        e.lines().count()
    );
    proptest::prop_assert!(
        !e.contains("panicked") && !e.contains("internal error"),
        "{what}: {e}"
    );
    Ok(())
}

/// A `.npy` file of f32 `shape` (valid unless a mutation breaks it).
fn npy_bytes(descr: &str, fortran: bool, shape: &str, data_len: usize) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend((header.len() as u16).to_le_bytes());
    b.extend(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data_len));
    b
}

mod hostile {
    use super::*;
    use proptest::prelude::*;

    fn descr() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "<f4", "<f4", "<f8", ">f4", "|u1", "<c8", "<i4", "|b1", "<f2", "zz",
        ])
    }

    fn shape() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("(64, 256)".to_string()),
            Just("(0, 256)".to_string()),
            Just("(64,)".to_string()),
            Just("(2, 64, 256)".to_string()),
            Just("(1000000000000, 1000000000)".to_string()),
            Just("(18446744073709551615, 2)".to_string()),
            Just("(-1, 256)".to_string()),
            Just("(64, 256".to_string()),
            Just("()".to_string()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Malformed `.npy` inputs: wrong dtypes and byte orders, Fortran
        /// order, zero, huge and negative dims, truncated or padded data,
        /// cut headers, random bytes.
        #[test]
        fn malformed_npy_files_get_one_line_and_no_panic(
            descr in descr(), fortran in any::<bool>(), shape in shape(),
            data_len in prop::sample::select(vec![0usize, 7, 64 * 256 * 4, 64 * 256 * 4 + 3]),
            cut in proptest::option::of(0usize..200), garbage in any::<bool>(), seed in any::<u64>(),
        ) {
            let d = dir(&format!("hostile-npy-{seed}"));
            let mut bytes = npy_bytes(descr, fortran, &shape, data_len);
            if let Some(c) = cut {
                bytes.truncate(c.min(bytes.len()));
            }
            if garbage {
                let mut r = kernel_ir::SplitMix64(seed);
                for b in bytes.iter_mut().take(16) {
                    *b = r.next_u64() as u8;
                }
            }
            let bad = d.join("x.npy");
            std::fs::write(&bad, &bytes).unwrap();
            let y = save(&d, "y", &Array::random(DType::F32, [64, 256], 1, 0.0, 1.0));
            let out = d.join("o");
            let o = tessera(&[
                "run", "add", "--input", &format!("x={}", bad.display()), "--input", &y,
                "--out", out.to_str().unwrap(),
            ]);
            assert_civil(&o, &format!("{descr} {fortran} {shape} {data_len} {cut:?} {garbage}"))?;
            // A failed run writes nothing.
            if !o.status.success() {
                prop_assert!(!out.join("o.npy").exists());
            }
            let _ = std::fs::remove_dir_all(&d);
        }

        /// Bad flag values and shapes for every command that takes them.
        #[test]
        fn bad_flag_values_get_one_line_and_no_panic(
            which in 0usize..12,
            value in prop::sample::select(vec![
                "", "0", "-1", "nan", "inf", "-inf", "1e300", "1e30", "18446744073709551616",
                "x", "1x", "0x512", "18446744073709551615x512", "4294967296x4294967296", "abc=def",
                "\u{1F600}", "v9", "all,all", " 8", "5", "3x4",
            ]),
        ) {
            let args: Vec<String> = match which {
                0 => vec!["lower".into(), "matmul".into(), "--target".into(), "kernel".into(), "--shape".into(), format!("x={value}")],
                1 => vec!["lower".into(), "add".into(), "--target".into(), value.into()],
                2 => vec!["lower".into(), "add".into(), "--target".into(), "kernel".into(), "--config".into(), format!("block_rows={value}")],
                3 => vec!["lower".into(), "flash_attention".into(), "--target".into(), "mosaic".into(), "--config".into(), format!("window={value}")],
                4 => vec!["bench".into(), "matmul".into(), "--budget".into(), value.into(), "--json".into()],
                5 => vec!["bench".into(), "matmul".into(), "--max-s".into(), value.into()],
                6 => vec!["compile".into(), "add_f32".into(), "--tpu".into(), value.into()],
                7 => vec!["lower".into(), "add".into(), "--target".into(), "kernel".into(), "--config".into(), format!("dtype={value}")],
                8 => vec!["list".into(), value.into()],
                9 => vec![value.into(), "--help".into()],
                10 => vec!["lower".into(), value.into(), "--target".into(), "kernel".into()],
                _ => vec!["lower".into(), "flash_attention".into(), "--target".into(), "kernel".into(), "--config".into(), format!("sm_scale={value}")],
            };
            // Benchmarks with a valid value would run for minutes: only
            // the bad values are tried there.
            if (which == 4 || which == 5) && value.parse::<f64>().is_ok_and(|v| v > 0.0 && v <= 3600.0) {
                return Ok(());
            }
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = tessera(&refs);
            assert_civil(&o, &format!("{args:?}"))?;
        }
    }
}

/// A closed standard output (`tessera list | head -1`) ends the command
/// cleanly, and a full one (`> /dev/full`) is one line and status 1.
#[test]
fn closed_or_full_stdout_is_a_clean_stop() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("list")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let full = std::fs::File::create("/dev/full").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("list")
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("cannot write to standard output"), "{e}");
}

/// The reproductions of the hostile-input report, each with its answer.
#[test]
fn hostile_repros_get_their_documented_answers() {
    let d = dir("repros");
    let out = d.join("o");
    let out = out.to_str().unwrap();
    // Zero-size input: a usage error naming it.
    let z = save(&d, "x", &Array::zeros(DType::F32, vec![64, 256]));
    let bytes = npy_bytes("<f4", false, "(0, 256)", 0);
    std::fs::write(d.join("z.npy"), bytes).unwrap();
    let zx = format!("x={}", d.join("z.npy").display());
    let o = tessera(&[
        "run",
        "add",
        "--input",
        &zx,
        "--input",
        &z.replace("x=", "y="),
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("zero-size dim"), "{}", stderr(&o));
    // An endless input is refused from its first bytes.
    let o = tessera(&[
        "run",
        "add",
        "--input",
        "x=/dev/zero",
        "--input",
        &z.replace("x=", "y="),
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a .npy file"), "{}", stderr(&o));
    // Limits on flags: a timeout past a day, a tune search past
    // MAX_TUNE_CANDIDATES (1,000 sizes for three blocks built 10^9
    // combinations up front).
    let many = (1..=1000)
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    for (args, says) in [
        (vec!["estimate", "add", "--timeout", "1e20"], "up to 86400"),
        (
            vec!["tune", "matmul", "--cpu", "--values", many.as_str()],
            "MAX_TUNE_CANDIDATES",
        ),
    ] {
        let started = std::time::Instant::now();
        let o = tessera(&args);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
        assert!(started.elapsed().as_secs() < 20, "{args:?}");
    }
    // A kernel file's input of the wrong dtype is a usage error before
    // anything compiles (it failed with exit 1 after compiling), and a
    // generation named twice compiles once.
    let kir = d.join("copy.kir");
    std::fs::write(
        &kir,
        "kernel @copy {\n  target v5e, vmem_limit default\n  grid [1 parallel]\n  in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\n  out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\nbody:\n  %0 = load @x[0:8, 0:128] : f32[8, 128]\n  store @o[0:8, 0:128], %0 : f32[8, 128]\n}\n",
    )
    .unwrap();
    let ints = save(&d, "xi", &Array::zeros(DType::I32, vec![8, 128])).replace("xi=", "x=");
    let kir_s = kir.to_str().unwrap();
    let o = tessera(&["run", kir_s, "--input", &ints, "--out", out]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is i32 but kernel `copy` takes f32"),
        "{}",
        stderr(&o)
    );
    let o = tessera(&["compile", kir_s, "--tpu", "v5e,v5e"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        common::stdout(&o).matches("v5e  ok").count(),
        1,
        "{}",
        common::stdout(&o)
    );
    // A tuning folder that cannot be written is reported with its path
    // and the OS error (it said only "could not write the tuning file").
    let blocker = d.join("a-file");
    std::fs::write(&blocker, "not a folder").unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["tune", "--cpu"])
        .env("TESSERA_CACHE", blocker.join("cache"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&blocker.display().to_string())
            && stderr(&o).contains("Not a directory"),
        "{}",
        stderr(&o)
    );
    // A malformed TESSERA_HOST_TUNING is a bad invocation (exit 2), said
    // before anything compiles (it was a run failure, exit 1).
    let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["run", kir_s, "--input", &ints, "--out", out])
        .env("TESSERA_HOST_TUNING", "banana")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("TESSERA_HOST_TUNING: `banana` is not a register tile"),
        "{}",
        stderr(&o)
    );
    // A kernel the flags make invalid is reported with the flags first
    // (the location after them is the library's line).
    let o = tessera(&["lower", "matmul", "--config", "bm=1", "--target", "mosaic"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("tessera lower: with --config bm=1: "),
        "{}",
        stderr(&o)
    );
    // A FIFO as an input is refused at once (opening it blocked).
    let fifo = d.join("fifo.npy");
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let fx = format!("x={}", fifo.display());
        let o = tessera(&[
            "run",
            "add",
            "--input",
            &fx,
            "--input",
            &z.replace("x=", "y="),
            "--out",
            out,
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("not a regular file"), "{}", stderr(&o));
    }
    // A shape too large to index.
    let o = tessera(&[
        "lower",
        "matmul",
        "--target",
        "mosaic",
        "--shape",
        "x=18446744073709551615x512",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // Benchmark parameters out of range.
    for (flag, v) in [
        ("--budget", "inf"),
        ("--budget", "1e300"),
        ("--max-s", "1e30"),
        ("--rounds", "0"),
        ("--rounds", "2.5"),
        ("--rounds", "1e9"),
    ] {
        let o = tessera(&["bench", "matmul", flag, v]);
        assert_eq!(o.status.code(), Some(2), "{flag} {v}: {}", stderr(&o));
    }
    // GQA head counts that do not divide are named as such.
    for (k, why) in [
        ("1x3x256x64", "h = 2 query heads and hkv = 3"),
        ("1x0x256x64", "bad shape"),
    ] {
        let o = tessera(&[
            "lower",
            "flash_attention",
            "--target",
            "kernel",
            "--shape",
            &format!("k={k}"),
            "--shape",
            &format!("v={k}"),
        ]);
        assert_eq!(o.status.code(), Some(2), "{k}: {}", stderr(&o));
        assert!(stderr(&o).contains(why), "{k}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1);
    }
    // An unknown command with --help names it.
    let o = tessera(&["frobnicate", "--help"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown command `frobnicate`"));
    // --out pointing at a file is refused before anything runs.
    std::fs::write(d.join("file"), b"x").unwrap();
    let y = z.replace("x=", "y=");
    let o = tessera(&[
        "run",
        "add",
        "--input",
        &z,
        "--input",
        &y,
        "--out",
        d.join("file").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a file"), "{}", stderr(&o));
    // Paged decode: a length past the table's capacity, and a page past
    // the pool, are errors before any back end runs.
    let lens = save(
        &d,
        "lengths",
        &Array::from_elems([4], &[16i32, 16, 16, 1000]).unwrap(),
    );
    let tabs = save(
        &d,
        "block_tables",
        &Array::from_elems([4, 8], &(0..32).map(|i| i % 8).collect::<Vec<i32>>()).unwrap(),
    );
    let q = save(
        &d,
        "q",
        &Array::random(DType::F32, [4, 2, 8, 64], 1, -1.0, 1.0),
    );
    let kp = save(
        &d,
        "k_pages",
        &Array::random(DType::F32, [2, 8, 16, 64], 2, -1.0, 1.0),
    );
    let vp = save(
        &d,
        "v_pages",
        &Array::random(DType::F32, [2, 8, 16, 64], 3, -1.0, 1.0),
    );
    let o = tessera(&[
        "diff",
        "paged_decode_attention",
        "--input",
        &lens,
        "--input",
        &tabs,
        "--input",
        &q,
        "--input",
        &kp,
        "--input",
        &vp,
        "--backends",
        "interp,reference",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("lengths"), "{}", stderr(&o));
    // A PJRT run is quiet: the plugin's own logging stays off the
    // terminal; and with HOME unset the cache is still the account's, not
    // a folder relative to the working directory.
    let o = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "run",
            "add",
            "--input",
            &z,
            "--input",
            &y,
            "--backend",
            "pjrt",
            "--out",
            out,
        ])
        .env_remove("HOME")
        .env_remove("TESSERA_PLUGIN_LOG")
        .current_dir(&d)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).is_empty(),
        "plugin logging leaked: {}",
        stderr(&o)
    );
    // Scores that overflow f32 are refused with the fix.
    let big = save(
        &d,
        "q",
        &Array::from_elems([1, 2, 256, 64], &vec![1e30f32; 2 * 256 * 64]).unwrap(),
    );
    let k = save(
        &d,
        "k",
        &Array::from_elems([1, 2, 256, 64], &vec![1e30f32; 2 * 256 * 64]).unwrap(),
    );
    let v = save(
        &d,
        "v",
        &Array::random(DType::F32, [1, 2, 256, 64], 4, -1.0, 1.0),
    );
    let o = tessera(&[
        "run",
        "flash_attention",
        "--input",
        &big,
        "--input",
        &k,
        "--input",
        &v,
        "--out",
        out,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("overflow f32"), "{}", stderr(&o));
}

/// Stopping `tessera bench` (SIGTERM) stops its measurement child too.
#[test]
fn a_stopped_bench_leaves_no_measurement_running() {
    use std::time::{Duration, Instant};
    let mut parent = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["bench", "matmul", "--budget", "60", "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = parent.id();
    let children = format!("/proc/{pid}/task/{pid}/children");
    let start = Instant::now();
    let child: u32 = loop {
        let list = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(c) = list.split_whitespace().next() {
            break c.parse().unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no measurement child started"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: a signal to the child process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = parent.wait();
    let start = Instant::now();
    loop {
        let state = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting to be reaped: not running.
        if state.is_empty() || state.split_whitespace().nth(2) == Some("Z") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "measurement {child} still runs: {state}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 70's fifth and sixth findings: `cost`, `estimate` and `tune` with
/// `--shape x=65536x65536` aborted (SIGABRT, a failed 32 GiB allocation
/// while sampling inputs), and a loop of 2^24 trips in every grid step ran
/// for minutes. Each is now refused before any work, one line with the
/// numbers and the flag that raises the limit; the flags themselves are
/// checked.
#[test]
fn large_shapes_and_long_loops_are_refused_before_any_work() {
    let big = ["--shape", "x=65536x65536", "--shape", "y=65536x65536"];
    for cmd in [
        &["cost", "add"][..],
        &["estimate", "add"],
        &["tune", "add", "--cpu"],
    ] {
        let args: Vec<&str> = cmd.iter().chain(&big).copied().collect();
        let o = tessera(&args);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(e.contains("144.0 GiB") && e.contains("--max-memory"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    let d = dir("limits");
    let kir = d.join("spin.kir");
    std::fs::write(
        &kir,
        "kernel @spin {\n  target v5e, vmem_limit default\n  grid [4 parallel]\n  \
         in @x: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\n  \
         out @o: f32[8, 128] vmem block [8, 128] at (0, 0) row_major\nbody:\n  \
         %0 = load @x[0:8, 0:128] : f32[8, 128]\n  \
         %3 = for %1 = 0 to 16777216 step 1 iter(%2 = %0) {\n    \
         %4 = add %2, %2 : f32[8, 128]\n    yield %4\n  }\n  \
         store @o[0:8, 0:128], %3 : f32[8, 128]\n}\n",
    )
    .unwrap();
    let x = save(&d, "x", &Array::zeros(DType::F32, [8, 128]));
    let out = d.join("out");
    let run = |backend: &str, extra: &[&str]| {
        let mut args = vec![
            "run",
            kir.to_str().unwrap(),
            "--input",
            &x,
            "--backend",
            backend,
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend(extra);
        tessera(&args)
    };
    let started = std::time::Instant::now();
    let o = run("interp", &[]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("68719489024 element-ops") && e.contains("--max-work"),
        "{e}"
    );
    assert!(
        started.elapsed().as_secs() < 30,
        "refused only after {:?}",
        started.elapsed()
    );
    assert!(!out.exists(), "a refused run wrote its outputs");
    // A run within the limits but past --timeout on Triton's interpreter
    // is killed (it had no time limit), exit 1 with the limit named.
    std::fs::write(
        &kir,
        std::fs::read_to_string(&kir)
            .unwrap()
            .replace("to 16777216", "to 65536"),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let o = run("triton-interp", &["--timeout", "1"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("within 1 s (killed)") && e.contains("--timeout"),
        "{e}"
    );
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    // The limits' own values: a memory limit below the arrays refuses a
    // small kernel, bad values are usage errors naming the flag.
    let o = run("interp", &["--max-work", "1e30", "--max-memory", "1K"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--max-work `1e30`"), "{}", stderr(&o));
    let o = run("interp", &["--max-memory", "1K"]);
    assert!(
        stderr(&o).contains("more than --max-memory 1.0 KiB"),
        "{}",
        stderr(&o)
    );
    for bad in ["-5", "12Q", ""] {
        let o = run("interp", &["--max-memory", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("--max-memory"), "{}", stderr(&o));
    }
}
