//! `--target triton` and `compile --gpu` end to end: the Triton program
//! printed, compiled for NVIDIA and AMD, run under Triton's interpreter.

use kernel_ir::{Array, DType};

use crate::common::{dir, save, stderr, stdout, tessera};

/// The GPU target from the command line: the Triton program, a compile
/// per target with its resources, the kept stages under `--out`, the
/// `triton-interp` path, each kernel's targets in `list`, and bad GPU
/// flags as usage errors.
#[test]
fn the_gpu_target_lowers_compiles_runs_and_lists() {
    let o = tessera(&["lower", "add", "--target", "triton"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("@triton.jit")
            && text.contains("def add_kernel(")
            && text.contains("# kernels/src/"),
        "{text}"
    );
    let d = dir("gpu");
    let out = d.join("kept");
    let o = tessera(&[
        "compile",
        "add",
        "--gpu",
        "sm_90,gfx942",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for t in ["sm_90", "gfx942"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(t))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            line.contains(" ok ") && line.contains("registers") && line.contains("spills"),
            "{line}"
        );
    }
    assert!(out.join("add/add_kernel.py").is_file());
    assert!(out.join("add/sm_90/kernel.cubin").is_file());
    assert!(out.join("add/gfx942/kernel.hsaco").is_file());
    // A kernel with an f8e4m3fn operand is refused on sm_80 with the reason.
    let o = tessera(&["compile", "fp8_gemm", "--gpu", "sm_80"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("REFUSED") && stdout(&o).contains("f8e4m3fn"),
        "{}",
        stdout(&o)
    );
    // The Triton program run on the CPU matches the native JIT.
    let x = Array::random(DType::F32, [64, 256], 7, -1.0, 1.0);
    let y = Array::random(DType::F32, [64, 256], 8, -1.0, 1.0);
    let (xf, yf) = (save(&d, "x", &x), save(&d, "y", &y));
    let o = tessera(&[
        "diff",
        "add",
        "--input",
        &xf,
        "--input",
        &yf,
        "--backends",
        "triton-interp,reference",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Each side's subnormal policy is said (issue 70, finding 2).
    assert!(
        stdout(&o).contains("f32 subnormals: triton-interp kept, reference kept\n"),
        "{}",
        stdout(&o)
    );
    let o = tessera(&["list"]);
    let text = stdout(&o);
    assert!(
        text.contains("targets: cpu, tpu, gpu (sm_80, sm_90, sm_100, gfx942, gfx950)"),
        "{text}"
    );
    assert!(text.contains("not sm_80 ("), "{text}");
    for (args, says) in [
        (
            &["compile", "add", "--gpu", "sm_99"][..],
            "unknown GPU target `sm_99`",
        ),
        (
            &["compile", "add", "--gpu", "sm_90", "--warps", "3"][..],
            "--warps 3",
        ),
        (
            &["run", "add", "--backend", "triton", "--out", "x"][..],
            "triton-interp",
        ),
        // gfx942's wavefront is 64 threads: 32 of them are 2,048 threads.
        (
            &["compile", "add", "--gpu", "sm_90,gfx942", "--warps", "32"][..],
            "--warps 32 on gfx942 is 2048 threads",
        ),
        // --out is checked before any kernel is built (`all` builds 120).
        (
            &["compile", "all", "--gpu", "sm_90", "--out", "/proc/self"][..],
            "is not an earlier `tessera compile --gpu --out` folder",
        ),
    ] {
        let started = std::time::Instant::now();
        let o = tessera(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        assert!(
            started.elapsed().as_secs() < 10,
            "{args:?}: {:?}",
            started.elapsed()
        );
    }
}

/// `tessera cases`: every catalog kernel and preset as a GPU check case
/// (`tests/gpu/run.sh`), its data consistent with its description (`add`'s
/// f64 reference is the sum of its inputs), a bad seed a usage error, and
/// a path that is not a cases folder never replaced.
#[test]
fn cases_writes_every_catalog_kernel_as_a_gpu_check_case() {
    let d = dir("cases");
    let out = d.join("cases");
    let o = tessera(&["cases", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("cases.json")).unwrap()).unwrap();
    assert_eq!(index["format"], "tessera-gpu-cases");
    let cases = index["cases"].as_array().unwrap();
    assert_eq!(
        cases.len(),
        kernels::ENTRIES.len() + kernels::presets().count()
    );
    let runnable = cases.iter().filter(|c| c.get("program").is_some()).count();
    assert!(runnable + 2 >= cases.len(), "{runnable} of {}", cases.len());
    for c in cases.iter().filter(|c| c.get("skipped").is_some()) {
        assert!(c["skipped"].as_str().unwrap().contains("GPU"), "{c}");
    }
    let add = cases.iter().find(|c| c["name"] == "add").unwrap();
    let read_f32 = |f: &str| -> Vec<f32> {
        std::fs::read(out.join(f))
            .unwrap()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    let x = read_f32(add["inputs"][0]["file"].as_str().unwrap());
    let y = read_f32(add["inputs"][1]["file"].as_str().unwrap());
    let reference: Vec<f64> =
        std::fs::read(out.join(add["outputs"][0]["reference"].as_str().unwrap()))
            .unwrap()
            .chunks(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
    assert_eq!(x.len(), 64 * 256);
    assert_eq!(reference.len(), x.len());
    for ((a, b), r) in x.iter().zip(&y).zip(&reference) {
        assert_eq!(f64::from(*a) + f64::from(*b), *r);
    }
    assert_eq!(add["program"]["function"], "add_kernel");
    assert!(add["outputs"][0]["abs"].as_f64().unwrap() > 0.0);
    // A bad seed is a usage error; a regular file is never replaced, and
    // is refused before any kernel is built (it took 20 s).
    let o = tessera(&["cases", "--out", out.to_str().unwrap(), "--seed", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let file = d.join("a-file");
    std::fs::write(&file, b"keep").unwrap();
    for cmd in [&["cases"][..], &["export", "flash_attention", "--gpu"]] {
        let started = std::time::Instant::now();
        let mut args = cmd.to_vec();
        args.extend(["--out", file.to_str().unwrap()]);
        let o = tessera(&args);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("is not a directory"), "{}", stderr(&o));
        assert!(
            started.elapsed().as_secs() < 2,
            "{cmd:?}: {:?}",
            started.elapsed()
        );
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }
}

/// A kernel file whose path holds Python: the newline in the folder's name
/// would end the `# file:line:col` comment of every op's line in the
/// Triton program, and the text after it would run when the program is
/// loaded. Issue 70's first finding: it ran, and the kernel's body was cut
/// short (0.0 where it computes 2·x). Now the path is an escaped comment:
/// `run --backend triton-interp` computes 2·x, `compile --gpu` compiles the
/// whole kernel, `export --gpu` writes a `triton.json` whose program holds
/// no line of the path, and nothing writes the marker file.
#[test]
fn a_file_name_never_runs_as_code() {
    let d = dir("hostile-name");
    let marker = d.join("pwned");
    let payload = format!(
        "k\nopen({:?}, 'w').close()\n# \u{2028}open({:?}, 'w').close()\r",
        marker.to_str().unwrap(),
        marker.to_str().unwrap()
    )
    .replace('/', "\\x2f");
    let folder = d.join(&payload);
    std::fs::create_dir_all(&folder).unwrap();
    let kir = folder.join("double.kir");
    std::fs::write(
        &kir,
        "kernel @double {\n  target v5e, vmem_limit default\n  grid [2 parallel]\n  \
         in @x: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major\n  \
         out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major\nbody:\n  \
         %0 = load @x[0:8, 0:128] : f32[8, 128]\n  %1 = add %0, %0 : f32[8, 128]\n  \
         store @o[0:8, 0:128], %1 : f32[8, 128]\n}\n",
    )
    .unwrap();
    let kir = kir.to_str().unwrap();
    let x = Array::random(DType::F32, [16, 128], 3, -1.0, 1.0);
    let xf = save(&d, "x", &x);
    let out = d.join("out");
    let o = tessera(&[
        "run",
        kir,
        "--input",
        &xf,
        "--backend",
        "triton-interp",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = tooling::npy::read(&out.join("o.npy")).unwrap();
    let want: Vec<f64> = x.data().iter().map(|v| 2.0 * v).collect();
    assert_eq!(got.data(), want, "the Triton program computes 2x");

    let kept = d.join("kept");
    let o = tessera(&[
        "compile",
        kir,
        "--gpu",
        "sm_90",
        "--out",
        kept.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let program = std::fs::read_to_string(kept.join("double/double_kernel.py")).unwrap();
    assert!(program.contains("tl.store("), "{program}");
    assert!(
        program.is_ascii() && !program.lines().any(|l| l.starts_with("open(")),
        "{program}"
    );

    let art = d.join("art");
    let o = tessera(&["export", kir, "--gpu", "--out", art.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let steps: serde_json::Value =
        serde_json::from_slice(&std::fs::read(art.join("triton.json")).unwrap()).unwrap();
    let source = steps["programs"][0]["source"].as_str().unwrap();
    assert!(
        source.contains("tl.store(") && !source.lines().any(|l| l.starts_with("open(")),
        "{source}"
    );
    assert_eq!(
        steps["programs"][0]["digests"]["source"].as_str(),
        Some(kernel_ir::sha256_hex(source.as_bytes()).as_str())
    );
    assert!(!marker.exists(), "the file name ran as code");
}

/// Issue 70's ninth finding: `compile --gpu` read the Triton child's stdout
/// until every holder of the pipe closed it, so a grandchild that lingered
/// 20 s (Triton runs `ptxas` with `close_fds=False`) made a compile take
/// 20 s; and a child killed by SIGKILL left its stderr unshown. A stand-in
/// for Triton's Python (`TESSERA_TRITON_PYTHON`) plays both.
#[test]
fn a_lingering_or_killed_compile_child_neither_hangs_nor_hides_its_stderr() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("gpu-child");
    let python = |name: &str, body: &str| {
        let p = d.join(name);
        std::fs::write(&p, format!("#!/bin/sh\nread -r line\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    };
    let lingering = python(
        "lingering",
        "sleep 20 &\necho 'tessera-report {\"target\": \"sm_90\", \"ok\": false, \"error\": \"a stand-in compiler\"}'",
    );
    let killed = python(
        "killed",
        "echo 'ptxas ran out of memory' >&2\nkill -KILL $$",
    );
    let compile = |py: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["compile", "add", "--gpu", "sm_90"])
            .env("TESSERA_TRITON_PYTHON", py)
            .output()
            .unwrap()
    };
    let start = std::time::Instant::now();
    let o = compile(&lingering);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("a stand-in compiler"), "{}", stdout(&o));
    let o = compile(&killed);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("SIGKILL") && e.contains("ptxas ran out of memory"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}
