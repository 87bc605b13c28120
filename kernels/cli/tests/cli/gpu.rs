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
    ] {
        let o = tessera(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    }
}
