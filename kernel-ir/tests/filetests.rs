//! The IR kinds of the `.kir` file tests (`tests/filetests`, format in
//! [`kernel_ir::filetest`]): every verify and interp test, run without
//! MLIR. The lowerings of the same files run from the workspace's
//! integration tests (`tests/it/targets/filetests.rs`).

use std::path::{Path, PathBuf};

use kernel_ir::filetest::{FileTest, Outcome, TestKind};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/filetests")
}

#[test]
fn every_verify_and_interp_file_test_passes() {
    let files = kernel_ir::filetest::files(&folder()).expect("tests/filetests reads");
    let mut problems = Vec::new();
    let (mut verify, mut interp) = (0, 0);
    for f in &files {
        let name = f.strip_prefix(folder()).unwrap_or(f).display().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        match FileTest::read(&name, &text) {
            Ok(t) => {
                let o = t.run_ir();
                verify += o.ran.iter().filter(|r| *r == "verify").count();
                interp += o.ran.iter().filter(|r| *r == "interp").count();
                problems.extend(o.problems);
            }
            Err(p) => problems.extend(p),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        verify >= 35 && interp >= 13,
        "{verify} verify, {interp} interp tests"
    );
}

const VERIFY: &str = "\
; test: verify
kernel @k {
  target v5e, vmem_limit default
  grid [2 parallel]
  in @x: f32[16, 128] vmem block [8, 64] at (g0, 0) row_major
  out @o: f32[16, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:64] : f32[8, 64]
  %1 = constant 0.0 : f32[8, 128]
  store @o[0:8, 0:128], %1 : f32[8, 128]
}
";

fn problems(text: &str) -> Vec<String> {
    match FileTest::read("k.kir", text) {
        Ok(t) => t.run_ir().problems,
        Err(p) => p,
    }
}

/// The runner fails a file whose expectation is wrong, missing or extra.
#[test]
fn the_runner_catches_wrong_expectations() {
    let with = |line: usize, comment: &str| -> String {
        VERIFY
            .lines()
            .enumerate()
            .map(|(i, l)| {
                if i + 1 == line {
                    format!("{l} ; {comment}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect()
    };
    // The right expectation passes...
    assert_eq!(problems(&with(5, "error: [tiling]")), Vec::<String>::new());
    // ...no expectation, the wrong line, the wrong rule and an extra one fail.
    assert!(!problems(VERIFY).is_empty());
    assert!(!problems(&with(6, "error: [tiling]")).is_empty());
    assert!(!problems(&with(5, "error: [block-bounds]")).is_empty());
    let extra = with(5, "error: [tiling]").replace("  %1 =", "  ; error: [zero-size]\n  %1 =");
    assert!(!problems(&extra).is_empty());
    // No test line, an unknown test or directive: the file is refused.
    assert!(!problems(&VERIFY.replace("; test: verify\n", "")).is_empty());
    assert!(!problems(&VERIFY.replace("test: verify", "test: prove")).is_empty());
    assert!(!problems(&with(5, "expectation: [tiling]")).is_empty());
    // A wrong expected value fails an interp file.
    let interp = "\
; test: interp
; input: @x = fill 2
; expect: sum @o = 2048
kernel @k {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
";
    assert_eq!(problems(interp), Vec::<String>::new());
    assert!(!problems(&interp.replace("2048", "2049")).is_empty());
    let wrong = interp.replace("; expect: sum @o = 2048", "; expect: @o[7, 127] = 3");
    assert!(!problems(&wrong).is_empty());
}

const COPY: &str = "\
; test: interp
; test: lower upper precise-output
; test: lower lower
; input: @x = fill 1
; expect: sum @o = 1024
; check: kernel @copy
kernel @copy {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
";

/// A stand-in lowering: `upper` prints the kernel's text in capitals,
/// `lower` as it is.
fn fake(target: &str, k: &kernel_ir::VerifiedKernel) -> Result<String, String> {
    let text = k.kernel().to_string();
    match target {
        "upper" => Ok(text.to_uppercase()),
        "lower" => Ok(text),
        t => Err(format!("no target {t}")),
    }
}

fn lower(text: &str, bless: bool) -> Outcome {
    FileTest::read("copy.kir", text)
        .expect("reads")
        .run_lower(&fake, bless)
}

/// Several tests in one file; a precise output is written by blessing,
/// then holds, and a change fails naming its line until blessed again.
#[test]
fn precise_outputs_are_blessed_and_then_held() {
    let t = FileTest::read("copy.kir", COPY).unwrap();
    assert_eq!(t.tests().len(), 3);
    assert!(matches!(
        &t.tests()[1],
        TestKind::Lower { precise: true, .. }
    ));
    assert_eq!(t.run_ir().ran, ["interp"]);
    // No section yet: a failure that says how to write it.
    let first = lower(COPY, false);
    assert_eq!(first.ran, ["lower upper", "lower lower"]);
    assert!(
        first.problems.len() == 1 && first.problems[0].contains("TESSERA_BLESS=1"),
        "{:?}",
        first.problems
    );
    let blessed = lower(COPY, true).blessed.expect("a section written");
    assert!(blessed.starts_with(COPY.trim_end()), "{blessed}");
    assert!(
        blessed.contains("; output: lower upper\n; KERNEL @COPY {\n"),
        "{blessed}"
    );
    // The blessed file passes as it is, its IR tests still run.
    let again = lower(&blessed, false);
    assert!(
        again.problems.is_empty() && again.blessed.is_none(),
        "{again:?}"
    );
    assert!(problems(&blessed).is_empty());
    // A kept output that no longer matches fails at its first changed line.
    let stale = blessed.replace("; KERNEL @COPY {", "; KERNEL @PASTE {");
    let o = lower(&stale, false);
    assert!(
        o.problems.len() == 1
            && o.problems[0].contains("line 1")
            && o.problems[0].contains("@PASTE"),
        "{:?}",
        o.problems
    );
    assert_eq!(
        lower(&stale, true).blessed.as_deref(),
        Some(blessed.as_str())
    );
    // A failed check and a failed lowering are problems too.
    let o = lower(
        &COPY.replace("check: kernel @copy", "check: kernel @paste"),
        false,
    );
    assert!(
        o.problems.iter().any(|p| p.contains("@paste")),
        "{:?}",
        o.problems
    );
    let o = lower(&COPY.replace("lower lower", "lower sideways"), false);
    assert!(
        o.problems.iter().any(|p| p.contains("no target sideways")),
        "{:?}",
        o.problems
    );
    // A section no test line asks for is refused.
    let orphan = format!("{blessed}\n; output: lower other\n; text\n");
    assert!(FileTest::read("copy.kir", &orphan).is_err());
}

/// The bless cycle of a precise-output test, with a stand-in lowering: a
/// missing section fails and names the switch; blessing writes it (whole,
/// through `write_blessed`); the blessed file passes; a changed lowering
/// fails naming the first line that differs; blessing again takes it, and
/// the file read back passes again with nothing else of it changed.
#[test]
fn the_bless_cycle_writes_checks_and_rewrites_the_kept_output() {
    let head = "\
; test: lower fake precise-output
; A copy, lowered by a stand-in.
kernel @copy {
  target v5e, vmem_limit default
  grid [1 parallel]
  in @x: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
  out @o: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
body:
  %0 = load @x[0:8, 0:128] : f32[8, 128]
  store @o[0:8, 0:128], %0 : f32[8, 128]
}
";
    let lowering = |text: &'static str| {
        move |target: &str, _k: &kernel_ir::VerifiedKernel| -> Result<String, String> {
            assert_eq!(target, "fake");
            Ok(text.to_string())
        }
    };
    let dir = std::env::temp_dir().join(format!("tessera-bless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("copy.kir");
    std::fs::write(&path, head).unwrap();
    let read = || FileTest::read("copy.kir", &std::fs::read_to_string(&path).unwrap()).unwrap();

    let first = lowering("line one\nline two\n");
    let o = read().run_lower(&first, false);
    assert!(o.blessed.is_none());
    assert!(
        o.problems.len() == 1 && o.problems[0].contains("TESSERA_BLESS=1"),
        "{:?}",
        o.problems
    );
    let o = read().run_lower(&first, true);
    assert!(o.problems.is_empty(), "{:?}", o.problems);
    kernel_ir::filetest::write_blessed(&path, o.blessed.as_deref().unwrap()).unwrap();
    let blessed = std::fs::read_to_string(&path).unwrap();
    assert!(blessed.starts_with(head), "{blessed}");
    assert!(blessed.contains("; line one\n; line two"), "{blessed}");
    let o = read().run_lower(&first, false);
    assert!(
        o.problems.is_empty() && o.blessed.is_none(),
        "{:?}",
        o.problems
    );

    let second = lowering("line one\nline 2\n");
    let o = read().run_lower(&second, false);
    assert!(
        o.problems.len() == 1 && o.problems[0].contains("line 2"),
        "{:?}",
        o.problems
    );
    let o = read().run_lower(&second, true);
    kernel_ir::filetest::write_blessed(&path, o.blessed.as_deref().unwrap()).unwrap();
    let o = read().run_lower(&second, false);
    assert!(o.problems.is_empty(), "{:?}", o.problems);
    let again = std::fs::read_to_string(&path).unwrap();
    assert_eq!(again.replace("line 2", "line two"), blessed);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["copy.kir"]);
    let _ = std::fs::remove_dir_all(&dir);
}
