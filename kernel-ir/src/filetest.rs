//! The `.kir` file tests: a kernel in the printed form ([`parse_file`])
//! with the tests to run on it and their expectations in `;` comments,
//! in the manner of cranelift's filetests. `tests/filetests` holds them;
//! kernel-ir's own tests run the IR kinds (verify, interp, without MLIR),
//! the workspace's integration tests the lowerings.
//!
//! * **Test lines**, at the top: `; test: verify`, `; test: interp`,
//!   `; test: lower TARGET` or `; test: lower TARGET precise-output`; a
//!   file may hold several (one kernel, its verifier errors or run, and
//!   its lowering to several targets). Then `;` lines saying what the
//!   file tests.
//! * `; error: [rule] text` (verify): the verifier reports an error whose
//!   message (location aside) contains `[rule] text`, at the line the
//!   expectation is on (a trailing comment) or the code line above it (a
//!   comment line of its own); an error without a location is expected on
//!   the `kernel @name {` line. Every error must be expected; without
//!   `error:` lines the kernel must verify.
//! * `; input: @name = iota | fill V | device | random SEED` (interp): the
//!   value of every input (`iota` counts 0, 1, 2, ... in row-major order;
//!   `random` is uniform in −1..1; `device` is the device's id; on a mesh,
//!   `random SEED` adds the id to the seed); `; option: shuffle SEED |
//!   dma_seed SEED | max_loop_trips N | mesh_seed SEED`.
//! * `; expect: [device D] @out[i, j] = V` / `; expect: sum @out = V`
//!   (interp): an element or the sum of an output, within 1e-6 relative;
//!   or `; run-error: [rule] text`: the run fails with that error there.
//! * `; check: text` (lower): the lowered text contains each check's text,
//!   in order, each after the one before (for every lower test of the
//!   file without `precise-output`).
//! * **Precise output** (lower): the whole lowered text is kept at the end
//!   of the file, each line behind `; `, under `; output: lower TARGET`.
//!   A run with `TESSERA_BLESS=1` rewrites those sections with what the
//!   lowering prints now (all or nothing); without it a difference fails,
//!   naming the first line that differs. Only for text that does not
//!   depend on the machine (the host module of a kernel with a `dot`
//!   carries the CPU's register tile: check lines instead).
//!
//! ```
//! use kernel_ir::filetest::FileTest;
//!
//! let text = "\
//! ; test: interp
//! ; input: @x = fill 2
//! ; expect: sum @o = 2048
//! kernel @copy {
//!   target v5e, vmem_limit default
//!   grid [1 parallel]
//!   in @x: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
//!   out @o: f32[8, 128] vmem block [8, 128] at (g0, 0) row_major
//! body:
//!   %0 = load @x[0:8, 0:128] : f32[8, 128]
//!   store @o[0:8, 0:128], %0 : f32[8, 128]
//! }
//! ";
//! let t = FileTest::read("copy.kir", text).unwrap();
//! let outcome = t.run_ir();
//! assert_eq!(outcome.ran, ["interp"]);
//! assert!(outcome.problems.is_empty(), "{:?}", outcome.problems);
//! ```

use crate::{
    Array, InterpOptions, Kernel, KernelError, VerifiedKernel, interpret_mesh, interpret_with,
    parse_file,
};

/// The environment variable that makes precise-output tests rewrite
/// their expected text instead of failing.
pub const BLESS_ENV: &str = "TESSERA_BLESS";

/// The header of a precise-output section.
const OUTPUT: &str = "; output: ";

/// Directive keys a file may use.
const KEYS: [&str; 7] = [
    "test",
    "error",
    "input",
    "option",
    "expect",
    "run-error",
    "check",
];

/// One `;` directive and the line it is about.
#[derive(Clone, Debug)]
struct Directive {
    line: u32,
    key: String,
    value: String,
}

/// What a `; test:` line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TestKind {
    /// The verifier's errors (or none).
    Verify,
    /// A run on the reference interpreter.
    Interp,
    /// A lowering to `target`, checked by `check` lines or, with
    /// `precise`, against the text kept in the file.
    Lower {
        /// The lowering target's name.
        target: String,
        /// Whether the whole text is compared.
        precise: bool,
    },
}

impl std::fmt::Display for TestKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TestKind::Verify => f.write_str("verify"),
            TestKind::Interp => f.write_str("interp"),
            TestKind::Lower { target, .. } => write!(f, "lower {target}"),
        }
    }
}

/// A file test read: its kernel, tests and expectations.
#[derive(Clone, Debug)]
pub struct FileTest {
    name: String,
    /// The file up to its first output section.
    head: String,
    kernel: Kernel,
    kernel_line: u32,
    tests: Vec<TestKind>,
    directives: Vec<Directive>,
    /// The kept outputs: (`lower TARGET`, text).
    outputs: Vec<(String, String)>,
}

/// What running a file's tests found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The tests that ran (`verify`, `interp`, `lower TARGET`).
    pub ran: Vec<String>,
    /// Every problem, as `file:line: what`.
    pub problems: Vec<String>,
    /// With blessing on and an output that changed: the file's new text.
    pub blessed: Option<String>,
}

impl FileTest {
    /// Reads a file test; the problems of a malformed one (no test line,
    /// an unknown directive or test kind, a kernel that does not parse).
    pub fn read(name: &str, text: &str) -> Result<FileTest, Vec<String>> {
        let (head, outputs) = split_outputs(text);
        let (directives, kernel_line) = directives(&head);
        let mut problems = Vec::new();
        if let Some(d) = directives.iter().find(|d| !KEYS.contains(&d.key.as_str())) {
            problems.push(format!(
                "{name}:{}: unknown directive `{}:` (the directives are {}; reword a comment so no single word precedes a colon)",
                d.line,
                d.key,
                KEYS.join(", ")
            ));
        }
        let mut tests = Vec::new();
        for d in directives.iter().filter(|d| d.key == "test") {
            let words: Vec<&str> = d.value.split_whitespace().collect();
            match words.as_slice() {
                ["verify"] => tests.push(TestKind::Verify),
                ["interp"] => tests.push(TestKind::Interp),
                ["lower", t] => tests.push(TestKind::Lower {
                    target: t.to_string(),
                    precise: false,
                }),
                ["lower", t, "precise-output"] => tests.push(TestKind::Lower {
                    target: t.to_string(),
                    precise: true,
                }),
                _ => problems.push(format!(
                    "{name}:{}: unknown test `{}` (verify, interp, lower TARGET [precise-output])",
                    d.line, d.value
                )),
            }
            if kernel_line > 0 && d.line > kernel_line {
                problems.push(format!("{name}:{}: test lines go above the kernel", d.line));
            }
        }
        if tests.is_empty() && problems.is_empty() {
            problems.push(format!(
                "{name}:1: no `; test: verify|interp|lower TARGET` line"
            ));
        }
        for (key, _) in &outputs {
            let kept = tests.iter().any(|t| {
                matches!(t, TestKind::Lower { precise: true, .. }) && t.to_string() == *key
            });
            if !kept {
                problems.push(format!(
                    "{name}: an output section `{key}` without a `; test: {key} precise-output` line"
                ));
            }
        }
        let kernel = match parse_file(name, &head) {
            Ok(k) => Some(k),
            Err(e) => {
                problems.push(format!("{name}: does not read: {e}"));
                None
            }
        };
        match kernel {
            Some(kernel) if problems.is_empty() => Ok(FileTest {
                name: name.to_string(),
                head,
                kernel,
                kernel_line,
                tests,
                directives,
                outputs,
            }),
            _ => Err(problems),
        }
    }

    /// The tests the file asks for.
    pub fn tests(&self) -> &[TestKind] {
        &self.tests
    }

    /// Runs the IR tests (verify, interp); lower tests are left to
    /// [`FileTest::run_lower`].
    pub fn run_ir(&self) -> Outcome {
        let mut out = Outcome::default();
        for t in &self.tests {
            let problems = match t {
                TestKind::Verify => self.verify_test(),
                TestKind::Interp => self.interp_test(),
                TestKind::Lower { .. } => continue,
            };
            out.ran.push(t.to_string());
            out.problems.extend(problems);
        }
        out
    }

    /// Runs the lower tests with `lower` (the target's name and the
    /// verified kernel to its text, or the error). With `bless`, a
    /// precise output that differs is rewritten into
    /// [`Outcome::blessed`] instead of failing.
    pub fn run_lower(
        &self,
        lower: &dyn Fn(&str, &VerifiedKernel) -> Result<String, String>,
        bless: bool,
    ) -> Outcome {
        let mut out = Outcome::default();
        let lowers: Vec<&TestKind> = self
            .tests
            .iter()
            .filter(|t| matches!(t, TestKind::Lower { .. }))
            .collect();
        if lowers.is_empty() {
            return out;
        }
        let name = &self.name;
        let k = match self.kernel.clone().verify() {
            Ok(k) => k,
            Err(e) => {
                out.problems
                    .push(format!("{name}: a lower test must verify: {e}"));
                return out;
            }
        };
        let checks = self.get("check");
        let mut outputs = self.outputs.clone();
        let mut changed = false;
        for t in lowers {
            let TestKind::Lower { target, precise } = t else {
                continue;
            };
            out.ran.push(t.to_string());
            let text = match lower(target, &k) {
                Ok(text) => normalize(&text),
                Err(e) => {
                    out.problems
                        .push(format!("{name}: lowering to {target} failed: {e}"));
                    continue;
                }
            };
            if !precise {
                out.problems.extend(self.checks(target, &text, &checks));
                continue;
            }
            let key = t.to_string();
            let kept = outputs.iter_mut().find(|(k, _)| *k == key);
            match kept {
                Some((_, old)) if *old == text => {}
                Some((_, old)) if bless => {
                    *old = text;
                    changed = true;
                }
                None if bless => {
                    outputs.push((key, text));
                    changed = true;
                }
                Some((_, old)) => out.problems.push(format!(
                    "{name}: the {target} text differs from the kept output{}; if the change is meant, run with {BLESS_ENV}=1",
                    first_difference(old, &text)
                )),
                None => out.problems.push(format!(
                    "{name}: no `{OUTPUT}{key}` section; run with {BLESS_ENV}=1 to write it"
                )),
            }
        }
        if changed {
            // Sections in the order of the test lines.
            let order: Vec<String> = self.tests.iter().map(|t| t.to_string()).collect();
            outputs.sort_by_key(|(k, _)| order.iter().position(|o| o == k));
            out.blessed = Some(join_outputs(&self.head, &outputs));
        }
        out
    }

    fn get(&self, key: &str) -> Vec<&Directive> {
        self.directives.iter().filter(|d| d.key == key).collect()
    }

    fn checks(&self, target: &str, text: &str, checks: &[&Directive]) -> Vec<String> {
        let name = &self.name;
        if checks.is_empty() {
            return vec![format!(
                "{name}: a lower test needs `check` lines or `precise-output`"
            )];
        }
        let mut from = 0;
        for d in checks {
            match text[from..].find(&d.value) {
                Some(at) => from += at + d.value.len(),
                None => {
                    return vec![format!(
                        "{name}:{}: `{}` not found in the {target} text after the previous check; the text:\n{text}",
                        d.line, d.value
                    )];
                }
            }
        }
        Vec::new()
    }

    fn verify_test(&self) -> Vec<String> {
        let name = &self.name;
        match self.kernel.clone().verify() {
            Ok(_) => self
                .get("error")
                .iter()
                .map(|d| {
                    format!(
                        "{name}:{}: expected error `{}`, but the kernel verified",
                        d.line, d.value
                    )
                })
                .collect(),
            Err(errs) => match_errors(&self.get("error"), &errs.0, self.kernel_line, name),
        }
    }

    fn interp_test(&self) -> Vec<String> {
        let name = &self.name;
        let k = match self.kernel.clone().verify() {
            Ok(k) => k,
            Err(e) => return vec![format!("{name}: an interp test must verify: {e}")],
        };
        let mut problems = Vec::new();
        let mut opts = InterpOptions::default();
        for o in self.get("option") {
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
        let inputs = self.get("input");
        for (device, args) in per_device.iter_mut().enumerate() {
            problems.extend(file_inputs(name, &k, &inputs, device, args));
        }
        if !problems.is_empty() {
            return problems;
        }
        let outputs: Vec<String> = k.outputs().map(|o| o.name.clone()).collect();
        let ran = if k.kernel().mesh.is_some() {
            interpret_mesh(&k, &per_device, &opts).map(|r| r.outputs)
        } else {
            interpret_with(&k, &per_device[0], &opts).map(|o| vec![o])
        };
        let (expects, run_errors) = (self.get("expect"), self.get("run-error"));
        match ran {
            Err(e) if run_errors.is_empty() => {
                problems.push(format!("{name}: the run failed: {e}"));
            }
            Err(e) => problems.extend(match_errors(&run_errors, &[e], self.kernel_line, name)),
            Ok(out) => {
                for d in &run_errors {
                    problems.push(format!(
                        "{name}:{}: expected run error `{}`, but the run succeeded",
                        d.line, d.value
                    ));
                }
                for d in &expects {
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
}

/// The file before its first output section, and the sections.
fn split_outputs(text: &str) -> (String, Vec<(String, String)>) {
    let mut head = String::new();
    let mut outputs: Vec<(String, String)> = Vec::new();
    for l in text.lines() {
        if let Some(key) = l.strip_prefix(OUTPUT) {
            outputs.push((key.trim().to_string(), String::new()));
        } else if let Some((_, body)) = outputs.last_mut() {
            let line = l
                .strip_prefix("; ")
                .unwrap_or(l.strip_prefix(';').unwrap_or(l));
            body.push_str(line);
            body.push('\n');
        } else {
            head.push_str(l);
            head.push('\n');
        }
    }
    for (_, body) in &mut outputs {
        *body = normalize(body);
    }
    (head, outputs)
}

/// The file's text with `outputs` as its sections.
fn join_outputs(head: &str, outputs: &[(String, String)]) -> String {
    let mut s = head.trim_end().to_string();
    s.push('\n');
    for (key, body) in outputs {
        s.push('\n');
        s.push_str(OUTPUT);
        s.push_str(key);
        s.push('\n');
        for l in body.lines() {
            if l.is_empty() {
                s.push_str(";\n");
            } else {
                s.push_str("; ");
                s.push_str(l);
                s.push('\n');
            }
        }
    }
    s
}

/// Lines without trailing blanks, no blank lines at the end.
fn normalize(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let mut s = lines.join("\n");
    s.truncate(s.trim_end().len());
    s
}

/// `: line N kept `..`, now `..`` for the first line that differs.
fn first_difference(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let i = (0..a.len().max(b.len()))
        .find(|&i| a.get(i) != b.get(i))
        .unwrap_or(0);
    format!(
        " at its line {}: kept `{}`, now `{}`",
        i + 1,
        a.get(i).unwrap_or(&"(end)"),
        b.get(i).unwrap_or(&"(end)")
    )
}

/// The directives of a file's head; the second value is the `kernel @`
/// line.
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

/// Each expected error found at its line, and no other error: the
/// mismatches.
fn match_errors(
    expected: &[&Directive],
    actual: &[KernelError],
    kernel_line: u32,
    file: &str,
) -> Vec<String> {
    let mut actual: Vec<Option<(u32, String)>> = actual
        .iter()
        .map(|e| Some((e.loc.as_ref().map_or(0, |l| l.line), e.kind.to_string())))
        .collect();
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

/// Writes `text` to `path` through a temporary file renamed over it, so
/// a blessed file is the old one or the whole new one.
pub fn write_blessed(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("kir.bless-{}", std::process::id()));
    let r = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Whether `TESSERA_BLESS=1` is set.
pub fn bless_requested() -> bool {
    std::env::var(BLESS_ENV).is_ok_and(|v| v == "1")
}

/// Every `.kir` file under `dir`, recursively, sorted.
pub fn files(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(files(&p)?);
        } else if p.extension().is_some_and(|x| x == "kir") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}
