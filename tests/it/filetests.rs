//! The IR file tests: every `tests/filetests/{verify,interp,lower}/*.kir`
//! is a kernel in the printed form ([`kernel_ir::parse_file`]) with its
//! expectations in `;` comments beside the lines they are about.
//!
//! * First line: `; test: verify`, `; test: interp` or
//!   `; test: lower <target>` (`kernel_module`, `tpu_custom_call`,
//!   `decomposed`, `host_module`); then `;` lines saying what the file
//!   tests.
//! * `; error: [rule] text` (verify): the verifier reports an error whose
//!   message (location aside) contains `[rule] text`, located at the line
//!   the expectation is on (a trailing comment) or the code line above it
//!   (a comment line of its own). An error without a location is expected
//!   on the `kernel @name {` line. Every error must be expected; a verify
//!   file without `error:` lines must verify.
//! * `; input: @name = iota | fill V | random SEED` (interp): the value of
//!   every input (`iota` counts 0, 1, 2, ... in row-major order; `random`
//!   is uniform in −1..1); `; option: shuffle SEED | dma_seed SEED |
//!   max_loop_trips N` sets an interpreter option.
//! * `; expect: @out[i, j] = V` / `; expect: sum @out = V` (interp): an
//!   element or the sum of an output, within 1e-6 relative; `; run-error:
//!   [rule] text` instead: the run fails with that error at that line.
//! * A kernel with a mesh runs on all its devices ([`interpret_mesh`]):
//!   each input is given per device (`device` fills it with the device's
//!   id, `random SEED` adds the id to the seed); `; expect: device D
//!   @out[..] = V` checks device `D`, an expect without `device D` every
//!   device; `; option: mesh_seed SEED` picks the interleaving.
//! * `; check: text` (lower): the lowered text contains each check's text,
//!   in order, each after the one before.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use kernel_ir::{
    Array, InterpOptions, KernelError, VerifiedKernel, interpret_mesh, interpret_with, parse_file,
};

/// One `;` expectation and the line it is about.
#[derive(Debug)]
struct Directive {
    line: u32,
    key: String,
    value: String,
}

/// The directives of a file; `kernel_line` is the `kernel @` line.
fn directives(text: &str) -> (Vec<Directive>, u32) {
    let mut out = Vec::new();
    let mut last_code = 0;
    let mut kernel_line = 0;
    for (i, l) in text.lines().enumerate() {
        let n = i as u32 + 1;
        let (code, comment) = match l.split_once(';') {
            Some((c, m)) => (c.trim(), Some(m.trim())),
            None => (l.trim(), None),
        };
        if !code.is_empty() {
            last_code = n;
            if code.starts_with("kernel @") {
                kernel_line = n;
            }
        }
        if let Some(m) = comment
            && let Some((key, value)) = m.split_once(':')
            && !key.contains(' ')
        {
            out.push(Directive {
                // A comment line is about the code line above it; one
                // above all code (the header) about itself.
                line: if code.is_empty() && last_code > 0 {
                    last_code
                } else {
                    n
                },
                key: key.trim().to_string(),
                value: value.trim().to_string(),
            });
        }
    }
    (out, kernel_line)
}

/// An error's line (0 when it has none) and message without location.
fn located(e: &KernelError) -> (u32, String) {
    (e.loc.as_ref().map_or(0, |l| l.line), e.kind.to_string())
}

/// Each expected error found at its line, and no other error: the
/// mismatches, one per line of the result.
fn match_errors(
    expected: &[&Directive],
    actual: &[KernelError],
    kernel_line: u32,
    file: &str,
) -> Vec<String> {
    let mut actual: Vec<Option<(u32, String)>> = actual.iter().map(|e| Some(located(e))).collect();
    let mut problems = Vec::new();
    for d in expected {
        let hit = actual.iter_mut().find(|a| {
            a.as_ref().is_some_and(|(line, msg)| {
                let line = if *line == 0 { kernel_line } else { *line };
                line == d.line && msg.contains(&d.value)
            })
        });
        match hit {
            Some(a) => *a = None,
            None => problems.push(format!(
                "{file}:{}: expected error `{}` was not reported there",
                d.line, d.value
            )),
        }
    }
    for (line, msg) in actual.into_iter().flatten() {
        let line = if line == 0 { kernel_line } else { line };
        problems.push(format!("{file}:{line}: unexpected error: {msg}"));
    }
    problems
}

/// Runs one file; the problems found (empty when it passes).
fn run_file(name: &str, text: &str) -> Vec<String> {
    let (ds, kernel_line) = directives(text);
    let mode = match ds.first() {
        Some(d) if d.key == "test" && d.line == 1 => d.value.clone(),
        _ => {
            return vec![format!(
                "{name}:1: the first line must be `; test: verify|interp|lower <target>`"
            )];
        }
    };
    const KEYS: [&str; 7] = [
        "test",
        "error",
        "input",
        "option",
        "expect",
        "run-error",
        "check",
    ];
    if let Some(d) = ds.iter().find(|d| !KEYS.contains(&d.key.as_str())) {
        return vec![format!(
            "{name}:{}: unknown directive `{}:` (the directives are {}; reword a comment so no single word precedes a colon)",
            d.line,
            d.key,
            KEYS.join(", ")
        )];
    }
    let kernel = match parse_file(name, text) {
        Ok(k) => k,
        Err(e) => return vec![format!("{name}: does not read: {e}")],
    };
    let get = |key: &str| -> Vec<&Directive> { ds.iter().filter(|d| d.key == key).collect() };
    let mut words = mode.split_whitespace();
    match words.next() {
        Some("verify") => match kernel.verify() {
            Ok(_) => get("error")
                .iter()
                .map(|d| {
                    format!(
                        "{name}:{}: expected error `{}`, but the kernel verified",
                        d.line, d.value
                    )
                })
                .collect(),
            Err(errs) => match_errors(&get("error"), &errs.0, kernel_line, name),
        },
        Some("interp") => match kernel.verify() {
            Err(e) => vec![format!("{name}: an interp test must verify: {e}")],
            Ok(k) => run_interp(
                name,
                &k,
                &get("input"),
                &get("option"),
                &get("expect"),
                &get("run-error"),
                kernel_line,
            ),
        },
        Some("lower") => match kernel.verify() {
            Err(e) => vec![format!("{name}: a lower test must verify: {e}")],
            Ok(k) => run_lower(name, &k, words.next().unwrap_or(""), &get("check")),
        },
        _ => vec![format!("{name}:1: unknown test kind `{mode}`")],
    }
}

fn run_interp(
    name: &str,
    k: &VerifiedKernel,
    inputs: &[&Directive],
    options: &[&Directive],
    expects: &[&Directive],
    run_errors: &[&Directive],
    kernel_line: u32,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut opts = InterpOptions::default();
    for o in options {
        let mut w = o.value.split_whitespace();
        let (key, n) = (
            w.next().unwrap_or(""),
            w.next().and_then(|n| n.parse::<u64>().ok()),
        );
        match (key, n) {
            ("shuffle", Some(s)) => opts.shuffle_seed = Some(s),
            ("dma_seed", Some(s)) => opts.dma_seed = Some(s),
            ("max_loop_trips", Some(n)) => opts.max_loop_trips = n,
            ("mesh_seed", Some(s)) => opts.mesh_seed = s,
            _ => problems.push(format!("{name}:{}: unknown option `{}`", o.line, o.value)),
        }
    }
    let devices = k.kernel().mesh.as_ref().map_or(1, |m| m.devices());
    let mut per_device = vec![Vec::new(); devices];
    for (device, args) in per_device.iter_mut().enumerate() {
        problems.extend(file_inputs(name, k, inputs, device, args));
    }
    if !problems.is_empty() {
        return problems;
    }
    let outputs: Vec<String> = k.outputs().map(|o| o.name.clone()).collect();
    let ran = if k.kernel().mesh.is_some() {
        interpret_mesh(k, &per_device, &opts).map(|r| r.outputs)
    } else {
        interpret_with(k, &per_device[0], &opts).map(|o| vec![o])
    };
    match ran {
        Err(e) => {
            if run_errors.is_empty() {
                problems.push(format!("{name}: the run failed: {e}"));
            } else {
                problems.extend(match_errors(run_errors, &[e], kernel_line, name));
            }
        }
        Ok(out) => {
            for d in run_errors {
                problems.push(format!(
                    "{name}:{}: expected run error `{}`, but the run succeeded",
                    d.line, d.value
                ));
            }
            for d in expects {
                let (only, spec) = match d.value.strip_prefix("device ") {
                    Some(rest) => {
                        let (n, spec) = rest.split_once(' ').unwrap_or((rest, ""));
                        (n.parse::<usize>().ok().or(Some(usize::MAX)), spec)
                    }
                    None => (None, d.value.as_str()),
                };
                for (device, o) in out.iter().enumerate() {
                    if only.is_some_and(|n| n != device) {
                        continue;
                    }
                    if let Err(p) = check_expect(spec, &outputs, o) {
                        problems.push(format!("{name}:{}: device {device}: {p}", d.line));
                    }
                }
                if only.is_some_and(|n| n >= out.len()) {
                    problems.push(format!("{name}:{}: no such device", d.line));
                }
            }
            if expects.is_empty() && run_errors.is_empty() {
                problems.push(format!(
                    "{name}: an interp test needs `expect` or `run-error` lines"
                ));
            }
        }
    }
    problems
}

/// The arrays of device `device` from the `input` lines.
fn file_inputs(
    name: &str,
    k: &VerifiedKernel,
    inputs: &[&Directive],
    device: usize,
    args: &mut Vec<Array>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for a in k.arguments() {
        let given = inputs.iter().find(|d| {
            d.value.starts_with(&format!("@{} ", a.name))
                || d.value.starts_with(&format!("@{}=", a.name))
        });
        let Some(d) = given else {
            problems.push(format!("{name}: no `; input: @{} = ...` line", a.name));
            continue;
        };
        let spec = d.value.split_once('=').map_or("", |(_, s)| s.trim());
        let n: usize = a.shape.iter().product();
        let mut w = spec.split_whitespace();
        let arr = match (w.next(), w.next().and_then(|v| v.parse::<f64>().ok())) {
            (Some("iota"), None) => Array::new(
                a.dtype,
                a.shape.to_vec(),
                (0..n).map(|i| i as f64).collect(),
            )
            .ok(),
            (Some("fill"), Some(v)) => Array::new(a.dtype, a.shape.to_vec(), vec![v; n]).ok(),
            (Some("device"), None) => {
                Array::new(a.dtype, a.shape.to_vec(), vec![device as f64; n]).ok()
            }
            (Some("random"), Some(s)) => Some(Array::random(
                a.dtype,
                a.shape.to_vec(),
                s as u64 + device as u64,
                -1.0,
                1.0,
            )),
            _ => None,
        };
        match arr {
            Some(x) => args.push(x),
            None => problems.push(format!("{name}:{}: cannot read input `{spec}`", d.line)),
        }
    }
    problems
}

/// `@o[i, j] = V` or `sum @o = V` against the outputs.
fn check_expect(spec: &str, names: &[String], out: &[Array]) -> Result<(), String> {
    let (lhs, want) = spec.split_once('=').ok_or("an expect needs `= value`")?;
    let want: f64 = want
        .trim()
        .parse()
        .map_err(|_| format!("`{}` is not a number", want.trim()))?;
    let lhs = lhs.trim();
    let (sum, target) = match lhs.strip_prefix("sum ") {
        Some(t) => (true, t.trim()),
        None => (false, lhs),
    };
    let target = target
        .strip_prefix('@')
        .ok_or("an expect names an output as `@name`")?;
    let (oname, index) = match target.split_once('[') {
        Some((n, i)) => (n, Some(i.trim_end_matches(']'))),
        None => (target, None),
    };
    let i = names
        .iter()
        .position(|n| n == oname)
        .ok_or(format!("no output `@{oname}`"))?;
    let a = &out[i];
    let got = if sum {
        a.data().iter().sum::<f64>()
    } else {
        let idx: Vec<usize> = index
            .ok_or("an element expect needs `[i, j, ...]`")?
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("bad index `{s}`"))
            })
            .collect::<Result<_, _>>()?;
        if idx.len() != a.shape().len() || idx.iter().zip(a.shape()).any(|(i, n)| i >= n) {
            return Err(format!("index {idx:?} is outside shape {:?}", a.shape()));
        }
        let flat = idx.iter().zip(a.shape()).fold(0, |f, (i, n)| f * n + i);
        a.data()[flat]
    };
    if (got - want).abs() <= 1e-6 * want.abs().max(1.0) {
        Ok(())
    } else {
        Err(format!("expected {lhs} = {want}, got {got}"))
    }
}

fn run_lower(name: &str, k: &VerifiedKernel, target: &str, checks: &[&Directive]) -> Vec<String> {
    let text = match target {
        "kernel_module" => lowering::kernel_module(k).map_err(|e| e.to_string()),
        // The module, then the Mosaic body it carries (as text).
        "tpu_custom_call" => lowering::tpu_custom_call(k)
            .map(|c| format!("{}\n{}", c.module, c.body))
            .map_err(|e| e.to_string()),
        "decomposed" => lowering::decomposed(k).map_err(|e| e.to_string()),
        "host_module" => lowering::host_module(k).map_err(|e| e.to_string()),
        t => return vec![format!("{name}:1: unknown lowering target `{t}`")],
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => return vec![format!("{name}: lowering to {target} failed: {e}")],
    };
    if checks.is_empty() {
        return vec![format!("{name}: a lower test needs `check` lines")];
    }
    let mut from = 0;
    let mut problems = Vec::new();
    for d in checks {
        match text[from..].find(&d.value) {
            Some(at) => from += at + d.value.len(),
            None => {
                let mut p = format!(
                    "{name}:{}: `{}` not found in the {target} text",
                    d.line, d.value
                );
                let _ = write!(p, " after the previous check; the text:\n{text}");
                problems.push(p);
                break;
            }
        }
    }
    problems
}

fn files(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("filetests")
        .join(kind);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kir"))
        .collect();
    v.sort();
    v
}

/// Runs every file of a folder; fails listing every problem.
fn run_folder(kind: &str, at_least: usize) {
    let fs = files(kind);
    assert!(fs.len() >= at_least, "{kind}: only {} files", fs.len());
    let mut problems = Vec::new();
    for f in &fs {
        let text = std::fs::read_to_string(f).unwrap();
        let name = format!(
            "filetests/{kind}/{}",
            f.file_name().unwrap().to_string_lossy()
        );
        if !text.starts_with(&format!("; test: {kind}")) {
            problems.push(format!(
                "{name}:1: a file in {kind}/ must start `; test: {kind}`"
            ));
        }
        problems.extend(run_file(&name, &text));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn verify_files() {
    run_folder("verify", 20);
}

#[test]
fn interp_files() {
    run_folder("interp", 5);
}

#[test]
fn lower_files() {
    run_folder("lower", 3);
}

/// The runner fails a file whose expectation is wrong, missing or extra.
#[test]
fn the_runner_catches_wrong_expectations() {
    let base = "\
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
    let with = |line: usize, comment: &str| -> String {
        base.lines()
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
    let good = with(5, "error: [tiling]");
    assert_eq!(run_file("k.kir", &good), Vec::<String>::new());
    // ...no expectation, the wrong line, the wrong rule and an extra one fail.
    assert!(!run_file("k.kir", base).is_empty());
    assert!(!run_file("k.kir", &with(6, "error: [tiling]")).is_empty());
    assert!(!run_file("k.kir", &with(5, "error: [block-bounds]")).is_empty());
    let extra = with(5, "error: [tiling]").replace("  %1 =", "  ; error: [zero-size]\n  %1 =");
    assert!(!run_file("k.kir", &extra).is_empty());
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
    assert_eq!(run_file("i.kir", interp), Vec::<String>::new());
    assert!(!run_file("i.kir", &interp.replace("2048", "2049")).is_empty());
    assert!(
        !run_file(
            "i.kir",
            &interp.replace("; expect: sum @o = 2048", "; expect: @o[7, 127] = 3")
        )
        .is_empty()
    );
}
