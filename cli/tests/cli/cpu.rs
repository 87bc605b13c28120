//! The CPU commands end to end: `masked` attention from a described mask,
//! `tune --cpu` keeping the JIT's register tiles, and JIT compiles that
//! leave nothing behind.

use kernel_ir::{Array, DType};
use kernels::check::{ErrorStats, Tolerance};

use crate::common::{dir, save, stderr, stdout, tessera};

#[test]
fn jit_compiles_leave_no_perf_dumps_behind() {
    // MLIR's engine writes a jitdump per process under the temp dir; the
    // engine removes it, so nothing accumulates in /tmp.
    let tmp = dir("jitdump");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["train", "--steps", "1", "--quiet"])
        .env("TMPDIR", &tmp)
        .env_remove("JITDUMPDIR")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut dumps = Vec::new();
    let mut stack = vec![tmp.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().ends_with(".dump") {
                dumps.push(e.path());
            }
        }
    }
    assert!(dumps.is_empty(), "{dumps:?}");
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `tessera masked`: a causal mask through its block tables gives causal
/// attention (the f64 reference); a bad mask, a head count the masks do
/// not match and a missing input are usage errors naming the fix.
#[test]
fn masked_runs_attention_with_a_described_mask() {
    let d = dir("masked");
    let mk = |s| Array::random(DType::F32, [1, 2, 64, 128], s, -1.0, 1.0);
    let (q, k, v) = (mk(1), mk(2), mk(3));
    let args = [save(&d, "q", &q), save(&d, "k", &k), save(&d, "v", &v)];
    let out = d.join("out");
    let run = |mask: &str| {
        tessera(&[
            "masked",
            "--mask",
            mask,
            "--input",
            &args[0],
            "--input",
            &args[1],
            "--input",
            &args[2],
            "--block-q",
            "16",
            "--cost",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let o = run("causal");
    assert!(o.status.success(), "{}", stderr(&o));
    let got = tooling::npy::read(&out.join("o.npy")).unwrap();
    let want = kernels::reference::attention(&q, &k, &v, true, 1.0 / (128f64).sqrt());
    let s = ErrorStats::between(&got, &want, Tolerance::for_dtype(DType::F32));
    assert!(s.passes(), "{s}");
    assert!(
        stdout(&o).contains("steps computed") && stdout(&o).contains("\"bytes_in\""),
        "{}",
        stdout(&o)
    );
    for (mask, says) in [
        ("diagonal", "write full, causal[:OFFSET]"),
        (
            "causal;causal;causal",
            "names 3 head masks but there are 2 heads",
        ),
    ] {
        let o = run(mask);
        assert_eq!(o.status.code(), Some(2), "{mask}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{mask}: {}", stderr(&o));
    }
    let o = tessera(&["masked", "--mask", "causal", "--out", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("missing --input q=FILE.npy"),
        "{}",
        stderr(&o)
    );
    // Inputs the kernel would misread, and flags past their range: each a
    // usage error before anything runs (each was accepted, wrote NaN or
    // panicked).
    let f32_seg = save(&d, "q_seg", &Array::zeros(DType::F32, vec![1, 64]));
    let wide_seg = save(&d, "kv_seg", &Array::zeros(DType::I32, vec![1, 64, 1]));
    let file = d.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--input", &f32_seg],
            "give int32 segment ids of shape [1, 64]",
        ),
        (
            vec!["--input", &wide_seg],
            "give int32 segment ids of shape [1, 64]",
        ),
        (
            vec!["--input", "qseg=x.npy"],
            "--input qseg: masked attention takes q, k, v, q_seg, kv_seg",
        ),
        (vec!["--input", &args[0]], "--input q is given twice"),
        (
            vec!["--softcap", "inf"],
            "--softcap inf: give a positive number",
        ),
        (
            vec!["--softcap", "nan"],
            "--softcap nan: give a positive number",
        ),
        (
            vec!["--block-k", "4294967296"],
            "give a block size from 1 to the sequence length 64",
        ),
        (vec!["--backend", "all"], "masked runs one backend"),
        (vec!["--out", file.to_str().unwrap()], "is a file"),
    ];
    for (extra, says) in cases {
        let mut all = vec!["masked", "--mask", "causal"];
        for a in &args {
            all.extend(["--input", a.as_str()]);
        }
        all.extend(&extra);
        if !extra.contains(&"--out") {
            all.extend(["--out", out.to_str().unwrap()]);
        }
        let o = tessera(&all);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{extra:?}: {}", stderr(&o));
    }
}

/// `tessera tune --cpu` alone measures the JIT's register tiles on this
/// CPU, prints each one's time, and keeps the winner in the cache folder,
/// where the next process reads it instead of measuring.
#[test]
fn tune_cpu_measures_the_jit_tiles_and_keeps_the_winner() {
    let d = dir("tune-cpu");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .env("TESSERA_CACHE", &d)
            .env_remove("TESSERA_HOST_TUNING")
            .output()
            .unwrap()
    };
    let o = run(&["tune", "--cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // One tile kept per dot class.
    let kept: Vec<&str> = out.lines().filter(|l| l.ends_with("<- kept")).collect();
    assert_eq!(kept.len(), 4, "{out}");
    let deep_wide = kept.iter().find(|l| l.starts_with("deep-wide ")).unwrap();
    let tile = deep_wide.split_whitespace().nth(1).unwrap();
    let files: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(text.starts_with("tessera host JIT tuning"), "{text}");
    assert!(
        text.contains(&format!("dot deep-wide: {tile}\n")),
        "{text}\n{out}"
    );
    // What a later JIT compile reads instead of measuring.
    let tuning = lowering::HostTuning::load(&d).expect("the kept tuning reads back");
    assert_eq!(
        tuning.dots.get(lowering::DotClass::DeepWide).to_string(),
        tile
    );
    // Kernel options without a kernel are a usage error naming them.
    let o = run(&["tune", "--cpu", "--top", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--top"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

/// `tessera cost` warns of blocks that fill few of the TPU's lanes (a
/// router's `[tokens, 8]` logits), naming the layout that fills them, and
/// stays quiet for a dense layout.
#[test]
fn cost_warns_of_lane_sparse_blocks() {
    let o = tessera(&[
        "cost",
        "router_top_k",
        "--shape",
        "x=2048x8",
        "--config",
        "bt=256",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("operand `x` has [256, 8] blocks, 8 of 128 lanes") && err.contains("minor"),
        "{err}"
    );
    let dense = tessera(&["cost", "router_top_k"]);
    assert!(dense.status.success(), "{}", stderr(&dense));
    assert!(!stderr(&dense).contains("warning:"), "{}", stderr(&dense));
}
