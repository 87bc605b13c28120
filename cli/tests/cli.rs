//! Drives the `tessera` binary end to end: run with `.npy` inputs the test
//! makes, diff, lower, list, help, and bad invocations (exit status 2, one
//! line on stderr, no panic).

use kernel_ir::{Array, DType};
use kernels::check::{ErrorStats, Tolerance};

mod common;
#[path = "cli/cpu.rs"]
mod cpu;
#[path = "cli/gpu.rs"]
mod gpu;
#[path = "cli/tpu.rs"]
mod tpu;
use common::{dir, save, stderr, stdout, tessera};

#[test]
fn run_writes_every_backends_outputs_and_they_match_the_reference() {
    let d = dir("run");
    let x = Array::random(DType::F32, [40, 200], 1, -3.0, 3.0);
    let y = Array::random(DType::F32, [40, 200], 2, -3.0, 3.0);
    let (ix, iy) = (save(&d, "x", &x), save(&d, "y", &y));
    let out = d.join("out");
    let o = tessera(&[
        "run",
        "add",
        "--input",
        &ix,
        "--input",
        &iy,
        "--backend",
        "all",
        "--out",
        out.to_str().unwrap(),
        "--config",
        "block_rows=8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = kernels::reference::add(&x, &y);
    for b in ["interp", "jit", "pjrt-decomposed", "pjrt-ffi"] {
        let got = tooling::npy::read(&out.join(b).join("o.npy")).unwrap();
        assert_eq!(got.shape(), &[40, 200]);
        let s = ErrorStats::between(&got, &want, Tolerance::for_dtype(DType::F32));
        assert!(s.passes(), "{b}: {s}");
    }
    assert!(stdout(&o).contains("wrote"), "{}", stdout(&o));
}

#[test]
fn a_two_output_kernel_writes_one_file_per_output_and_bf16_goes_through_f32_files() {
    let d = dir("attn");
    let mk = |s| Array::random(DType::F32, [1, 2, 64, 32], s, -1.0, 1.0);
    let (q, k, v) = (mk(1), mk(2), mk(3));
    let args = [save(&d, "q", &q), save(&d, "k", &k), save(&d, "v", &v)];
    let out = d.join("out");
    let o = tessera(&[
        "run",
        "flash_attention",
        "--input",
        &args[0],
        "--input",
        &args[1],
        "--input",
        &args[2],
        "--config",
        "dtype=bf16",
        "--config",
        "causal=true",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = tooling::npy::read(&out.join("o.npy")).unwrap();
    let lse = tooling::npy::read(&out.join("lse.npy")).unwrap();
    assert_eq!(got.dtype(), DType::F32, "bf16 is stored as f32");
    assert_eq!(lse.shape(), &[1, 2, 64, 1]);
    let spec = kernels::reference::AttnSpec::new(true, 1.0 / (32f64).sqrt());
    let (o_ref, _) = kernels::reference::attention_full(
        &q.cast(DType::BF16),
        &k.cast(DType::BF16),
        &v.cast(DType::BF16),
        &spec,
    );
    let s = ErrorStats::between(&got, &o_ref, Tolerance::attention(DType::BF16));
    assert!(s.passes(), "{s}");
}

#[test]
fn diff_reports_errors_ulps_and_divergent_elements() {
    let d = dir("diff");
    let x = Array::random(DType::F32, [32, 512], 5, -4.0, 4.0);
    let ix = save(&d, "x", &x);
    let o = tessera(&[
        "diff",
        "softmax",
        "--input",
        &ix,
        "--backends",
        "jit,reference",
        "--first",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("output `o` f32[32, 512]: jit vs reference"),
        "{text}"
    );
    assert!(text.contains("max abs"), "{text}");
    assert!(text.contains("ulp histogram (f32): 0: "), "{text}");
    // The interpreter rounds exactly: it and the reference rounded to f32
    // agree on most elements, and diff lists at most --first of the rest.
    let o = tessera(&[
        "diff",
        "softmax",
        "--input",
        &ix,
        "--backends",
        "interp,jit",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed = stdout(&o)
        .lines()
        .filter(|l| l.trim_start().starts_with('['))
        .count();
    assert!(listed <= 10, "{}", stdout(&o));
}

#[test]
fn lower_prints_or_writes_every_target() {
    let o = tessera(&[
        "lower",
        "flash_attention",
        "--config",
        "causal=true",
        "--target",
        "mosaic",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("tpu_custom_call"));
    let d = dir("lower");
    let f = d.join("mm.mlir");
    let o = tessera(&[
        "lower",
        "matmul",
        "--shape",
        "x=64x128",
        "--shape",
        "y=128x256",
        "--target",
        "decomposed",
        "--out",
        f.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(
        text.contains("tensor<64x128xf32>") && text.contains("stablehlo"),
        "{text}"
    );
    for t in ["kernel", "mosaic-body", "host"] {
        let o = tessera(&["lower", "flash_attention_causal_bf16", "--target", t]);
        assert!(o.status.success(), "{t}: {}", stderr(&o));
        assert!(stdout(&o).contains("func.func"), "{t}");
    }
}

#[test]
fn list_and_help_describe_everything() {
    let o = tessera(&["list"]);
    assert!(o.status.success());
    let text = stdout(&o);
    for k in kernels::ENTRIES {
        assert!(text.contains(k.name), "{} missing from list", k.name);
        for p in k.params {
            assert!(
                text.contains(&format!("--config {}=", p.name)),
                "{}: {}",
                k.name,
                p.name
            );
        }
    }
    assert!(
        text.contains("outputs: o f32[1, 2, 256, 64], lse f32[1, 2, 256, 1]"),
        "{text}"
    );
    let o = tessera(&["--help"]);
    assert!(o.status.success());
    for cmd in ["demo", "list", "lower", "compile", "run", "diff", "bench"] {
        assert!(stdout(&o).contains(cmd));
        let o = tessera(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd}");
        assert!(
            stdout(&o).contains(&format!("tessera {cmd}")),
            "{cmd}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn bad_invocations_are_one_line_and_exit_status_2() {
    let d = dir("bad");
    let x = save(&d, "x", &Array::random(DType::F32, [16, 128], 1, 0.0, 1.0));
    let y = save(&d, "y", &Array::random(DType::F32, [16, 128], 2, 0.0, 1.0));
    let i32s = save(&d, "i", &Array::zeros(DType::I32, vec![16, 128])).replace("i=", "x=");
    let wrong_shape = save(&d, "w", &Array::zeros(DType::F32, vec![8, 128])).replace("w=", "x=");
    std::fs::write(d.join("junk.npy"), b"not numpy").unwrap();
    let junk = format!("x={}", d.join("junk.npy").display());
    let missing = format!("x={}", d.join("nope.npy").display());
    let out = d.join("o");
    let out = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["frobnicate"], "unknown command"),
        (vec!["run", "nope", "--out", out], "unknown kernel `nope`"),
        (
            vec![
                "run",
                "add",
                "--input",
                &x,
                "--input",
                &y,
                "--config",
                "colour=red",
                "--out",
                out,
            ],
            "unknown config key `colour`",
        ),
        (
            vec![
                "run",
                "add",
                "--input",
                &x,
                "--input",
                &y,
                "--config",
                "block_rows=zero",
                "--out",
                out,
            ],
            "must be a positive integer",
        ),
        (
            vec!["run", "add", "--input", &x, "--out", out],
            "missing --input for y",
        ),
        (
            vec!["run", "add", "--input", &junk, "--input", &y, "--out", out],
            "not a .npy file",
        ),
        (
            vec![
                "run", "add", "--input", &missing, "--input", &y, "--out", out,
            ],
            "cannot read",
        ),
        (
            vec!["run", "add", "--input", &i32s, "--input", &y, "--out", out],
            "input `x` is i32",
        ),
        (
            vec![
                "run",
                "add",
                "--input",
                &wrong_shape,
                "--input",
                &y,
                "--out",
                out,
            ],
            "input `y` has shape [16, 128]",
        ),
        (
            vec![
                "run",
                "add",
                "--input",
                &x,
                "--input",
                &y,
                "--backend",
                "gpu",
                "--out",
                out,
            ],
            "unknown backend `gpu`",
        ),
        (
            vec!["run", "add", "--input", &x, "--input", &y],
            "give --out",
        ),
        (
            vec!["lower", "add", "--target", "ptx"],
            "unknown target `ptx`",
        ),
        (
            vec!["lower", "add", "--shape", "x=16xq", "--target", "kernel"],
            "bad shape `16xq`",
        ),
        (
            vec!["lower", "add", "--shape", "z=16x128", "--target", "kernel"],
            "has no input `z`",
        ),
        (
            vec![
                "diff",
                "add",
                "--input",
                &x,
                "--input",
                &y,
                "--backends",
                "jit",
            ],
            "two names",
        ),
        (vec!["bench", "softmax"], "no benchmark for `softmax`"),
        (vec!["list", "--verbose"], "unknown option `--verbose`"),
    ];
    assert!(cases.len() >= 8);
    for (args, want) in cases {
        let o = tessera(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line, got: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `tessera numerics` prints one row per depth and scheme, and refuses
/// depths that are not multiples of 512. fp8 inputs go through uint8
/// `.npy` files (their bit patterns) and come back bit for bit.
#[test]
fn numerics_prints_its_table_and_fp8_files_are_bit_patterns() {
    let o = tessera(&[
        "numerics",
        "--k",
        "512,1024",
        "--m",
        "8",
        "--backend",
        "interp",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for scheme in [
        "| 512 | f32 |",
        "| 1024 | bf16 partials |",
        "| 1024 | split-K 4 |",
    ] {
        assert!(out.contains(scheme), "{out}");
    }
    let o = tessera(&["numerics", "--k", "100"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("multiples of 512"), "{}", stderr(&o));

    // An FP8 GEMM run from .npy files: the fp8 inputs as uint8 bits.
    let d = dir("fp8");
    let x = Array::random(DType::F8E4M3FN, [256, 512], 1, -8.0, 8.0);
    let w = Array::random(DType::F8E4M3FN, [512, 256], 2, -8.0, 8.0);
    let one = Array::new(DType::F32, [1, 1], vec![1.0]).unwrap();
    let bias = Array::zeros(DType::F32, [1, 256]);
    let args = [
        save(&d, "x", &x),
        save(&d, "w", &w),
        save(&d, "sx", &one),
        save(&d, "sw", &one),
        save(&d, "bias", &bias),
    ];
    let bytes = std::fs::read(args[0].trim_start_matches("x=")).unwrap();
    assert!(String::from_utf8_lossy(&bytes[..64]).contains("'|u1'"));
    let out = d.join("out");
    let o = tessera(&[
        "run",
        "fp8_gemm",
        "--config",
        "scaling=tensor",
        "--config",
        "out_dtype=f32",
        "--input",
        &args[0],
        "--input",
        &args[1],
        "--input",
        &args[2],
        "--input",
        &args[3],
        "--input",
        &args[4],
        "--backend",
        "jit",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = tooling::npy::read(&out.join("jit").join("o.npy"))
        .or_else(|_| tooling::npy::read(&out.join("o.npy")))
        .unwrap();
    let want = kernels::reference::matmul(&x, &w);
    // Within the library's f32 matmul tolerance at k = 512.
    let bad = got
        .data()
        .iter()
        .zip(&want)
        .filter(|(g, r)| (*g - *r).abs() > 512e-6 + 1e-4 * r.abs())
        .count();
    assert_eq!(bad, 0);
}

#[test]
fn out_never_replaces_what_is_not_a_regular_file() {
    use std::os::unix::fs::FileTypeExt;
    let d = dir("out-nonregular");
    let sub = d.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    for out in ["/dev/null", sub.to_str().unwrap()] {
        for cmd in [
            &["lower", "add_f32", "--target", "kernel", "--out", out][..],
            &["compile", "add_f32", "--tpu", "v5e", "--out", out],
        ] {
            let o = tessera(cmd);
            assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
            assert_eq!(stderr(&o).lines().count(), 1, "{cmd:?}: {}", stderr(&o));
        }
    }
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
    );
    assert!(sub.is_dir());
}

#[test]
fn module_inputs_must_be_regular_files_and_out_needs_a_kernel() {
    let d = dir("module-input");
    let fifo = d.join("fifo.mlir");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let module = d.join("m.mlir");
    std::fs::write(&module, "module {}").unwrap();
    let (f, m, dev) = (
        fifo.to_str().unwrap(),
        module.to_str().unwrap(),
        "/dev/zero",
    );
    for cmd in [
        &["compile", "--module", f, "--tpu", "v5e"][..],
        &["compile", "--module", dev, "--tpu", "v5e"],
        &["estimate", "--module", f, "--tpu", "v5e"],
        &["estimate", "--module", dev, "--tpu", "v5e"],
        &["compile", "--module", m, "--tpu", "v5e", "--out", "x.bin"],
    ] {
        let t = std::time::Instant::now();
        let o = tessera(cmd);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{cmd:?}: {}", stderr(&o));
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "{cmd:?} hung"
        );
    }
}

#[test]
fn late_or_unclear_messages_are_early_and_say_what_to_do() {
    let d = dir("messages");
    for (cmd, want) in [
        (
            &["numerics", "--backend", "all"][..],
            "one back end per run",
        ),
        (
            &["export", "flash_attention", "--out", ""],
            "--out is empty",
        ),
        (
            &["profile", "nosuchkernel"],
            "unknown kernel `nosuchkernel`",
        ),
        // Refused at once, not after the whole benchmark.
        (
            &["bench", "matmul", "--svg", "/nonexistent/dir/chart.svg"],
            "--svg",
        ),
        (&["bench", "matmul", "--svg", "/dev/null"], "--svg"),
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(cmd)
            .current_dir(&d)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(want) && e.lines().count() == 1, "{cmd:?}: {e}");
    }
    // Nothing was written into the current directory.
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
}

#[test]
fn bucket_takes_the_first_array_input_and_refuses_repeated_sizes() {
    let d = dir("bucket");
    // A valid-length kernel: the sequence (axis 2 of q, k, v) is bucketed,
    // the scalar-prefetch length never is.
    let out = d.join("kv_len");
    let o = tessera(&[
        "export",
        "flash_attention_kv_len",
        "--bucket",
        "2=128,256",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("2_128/manifest.json")).unwrap())
            .unwrap();
    let text = m.to_string();
    assert!(
        text.contains("[1,2,128,64]") && text.contains("[1]"),
        "{text}"
    );
    for bad in [
        &[
            "export",
            "flash_attention",
            "--bucket",
            "2=128,128",
            "--out",
        ][..],
        &["export", "flash_attention", "--bucket", "5=128", "--out"],
    ] {
        let mut cmd = bad.to_vec();
        let target = d.join("bad");
        cmd.push(target.to_str().unwrap());
        let o = tessera(&cmd);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
        assert!(!target.exists(), "{cmd:?} wrote something");
    }
}

#[test]
fn exports_replace_only_earlier_exports_and_a_failed_bucket_changes_nothing() {
    let d = dir("export-whole");
    let fam = d.join("fam");
    let o = tessera(&[
        "export",
        "flash_attention",
        "--config",
        "causal=true",
        "--bucket",
        "2=128,256",
        "--out",
        fam.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let before = read(&fam.join("buckets.json"));
    let bucket = read(&fam.join("2_128/manifest.json"));
    // A sequence past the i32 index range: that bucket fails to build,
    // after the first one built.
    let o = tessera(&[
        "export",
        "flash_attention",
        "--bucket",
        "2=128,4000000000",
        "--out",
        fam.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("bucket 4000000000"), "{}", stderr(&o));
    assert_eq!(read(&fam.join("buckets.json")), before);
    assert_eq!(read(&fam.join("2_128/manifest.json")), bucket);
    // A directory that is not an earlier export is never replaced.
    let mine = d.join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("notes.txt"), b"mine").unwrap();
    let o = tessera(&["export", "rms_norm", "--out", mine.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not an earlier Tessera export"),
        "{}",
        stderr(&o)
    );
    assert_eq!(read(&mine.join("notes.txt")), b"mine");
    // The manifest says what it was made from.
    let m: serde_json::Value =
        serde_json::from_slice(&read(&fam.join("2_256/manifest.json"))).unwrap();
    assert_eq!(m["entry"], "flash_attention");
    assert_eq!(m["config"]["causal"], "true");
    assert_eq!(m["tessera_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(m["files"].as_object().unwrap().len(), 3, "{m}");
    assert!(std::fs::read_dir(&d).unwrap().count() == 2, "staging left");
}

/// A `.kir` kernel file is a kernel for `lower` and `compile`: a kernel
/// across chips lowers to Mosaic with its communication flags and compiles
/// with libtpu; a file whose kernel breaks a rule is refused at its line;
/// a missing file, a directory and `--config` are usage errors.
#[test]
fn kernel_files_lower_and_compile() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/filetests");
    let ring = root.join("lower/ring-permute-tpu-custom-call.kir");
    let ring = ring.to_str().unwrap();
    let o = tessera(&["lower", ring, "--target", "mosaic"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("has_communication\\22: true"),
        "{}",
        stdout(&o)
    );
    let o = tessera(&["lower", ring, "--target", "mosaic-body"]);
    assert!(stdout(&o).contains("tpu.enqueue_dma"), "{}", stdout(&o));
    let o = tessera(&["compile", ring, "--tpu", "v5e"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("v5e  ok"), "{}", stdout(&o));
    // `cost` runs it on its 4 devices and counts the bytes sent over ICI.
    let o = tessera(&["cost", ring]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("ring_permute on 4 devices")
            && stdout(&o).contains("ICI sent 4096 B in 1 copies"),
        "{}",
        stdout(&o)
    );
    // The decomposed form is one SPMD program of its 4 devices, the copy
    // a permute around the ring.
    let o = tessera(&["lower", ring, "--target", "decomposed"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("mhlo.num_replicas = 4")
            && stdout(&o).contains("source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]>"),
        "{}",
        stdout(&o)
    );
    // A single-device target refuses it, naming the devices.
    let o = tessera(&["lower", ring, "--target", "host"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("runs on the 4 devices of its mesh"),
        "{}",
        stderr(&o)
    );
    let bad = root.join("verify/dot-dtypes.kir");
    let o = tessera(&["lower", bad.to_str().unwrap(), "--target", "mosaic"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("dot-dtypes.kir:12:3: [dot-dtype]"),
        "{}",
        stderr(&o)
    );
    for args in [
        vec!["lower", "/nonexistent/k.kir", "--target", "mosaic"],
        vec!["lower", "/tmp", "--target", "mosaic"],
        vec![
            "lower",
            ring,
            "--target",
            "mosaic",
            "--config",
            "dtype=bf16",
        ],
    ] {
        let o = tessera(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{args:?}: {}", stderr(&o));
    }
}
