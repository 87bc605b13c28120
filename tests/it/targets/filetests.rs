//! The lowerings of the `.kir` file tests (`tests/filetests`, format in
//! [`kernel_ir::filetest`]): every `; test: lower TARGET` line, checked by
//! its `check` lines or against its kept `precise-output` text
//! (`TESSERA_BLESS=1` rewrites those). The verify and interp tests of the
//! same files run from kernel-ir's own tests, without MLIR.

use std::path::Path;

use kernel_ir::VerifiedKernel;
use kernel_ir::filetest::{FileTest, bless_requested, files, write_blessed};

/// The lowering targets a file test may name.
fn lower(target: &str, k: &VerifiedKernel) -> Result<String, String> {
    let text = match target {
        "kernel_module" => lowering::kernel_module(k),
        // The module, then the Mosaic body it carries (as text).
        "tpu_custom_call" => {
            lowering::tpu_custom_call(k).map(|c| format!("{}\n{}", c.module, c.body))
        }
        "decomposed" => lowering::decomposed(k),
        "host_module" => lowering::host_module(k),
        "triton" => lowering::triton(k).map(|p| p.source),
        t => {
            return Err(format!(
                "unknown lowering target `{t}` (kernel_module, tpu_custom_call, decomposed, host_module, triton)"
            ));
        }
    };
    text.map_err(|e| e.to_string())
}

#[test]
fn every_lower_file_test_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("filetests");
    let bless = bless_requested();
    let mut problems = Vec::new();
    let mut ran = Vec::new();
    for f in files(&dir).expect("tests/filetests reads") {
        let name = f.strip_prefix(&dir).unwrap_or(&f).display().to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        let t = match FileTest::read(&name, &text) {
            Ok(t) => t,
            Err(p) => {
                problems.extend(p);
                continue;
            }
        };
        let o = t.run_lower(&lower, bless);
        if let Some(new) = &o.blessed {
            write_blessed(&f, new).unwrap_or_else(|e| panic!("{name}: cannot bless: {e}"));
        }
        ran.extend(o.ran.into_iter().map(|r| format!("{name}: {r}")));
        problems.extend(o.problems);
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let targets = [
        "kernel_module",
        "tpu_custom_call",
        "decomposed",
        "host_module",
        "triton",
    ];
    for t in targets {
        let n = ran
            .iter()
            .filter(|r| r.ends_with(&format!("lower {t}")))
            .count();
        assert!(n >= 2, "only {n} lower {t} tests:\n{}", ran.join("\n"));
    }
    assert!(
        ran.len() >= 15,
        "{} lower tests:\n{}",
        ran.len(),
        ran.join("\n")
    );
}
