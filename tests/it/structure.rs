//! The module structure stays one-way: within each crate, no two top-level
//! modules reach each other (directly or around a longer circle), and below
//! the top level only the listed circles stay, so each module can be read,
//! tested and replaced with only what it imports. Read from the `crate::`,
//! `super::` and `self::` paths of the sources, comments and test modules
//! left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            // The command's modules are a binary crate of their own.
            if p.file_name().is_some_and(|n| n != "bin") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules of [`submodule_graph`]: each module counted as
/// the top-level one it sits in, edges inside one top-level module dropped.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or("").to_string();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in submodule_graph(src) {
        for to in tos {
            let (a, b) = (top(&from), top(&to));
            if a != b {
                graph.entry(a).or_default().insert(b);
            }
        }
    }
    graph
}

/// A circle of modules, if the graph has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The crates whose sources are scanned.
const CRATES: [&str; 10] = [
    "kernel-macros",
    "kernel-ir",
    "lowering",
    "runtime",
    "graph",
    "libtpu",
    "kernels",
    "tooling",
    "testing",
    "cli",
];

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut edges = 0;
    for krate in CRATES {
        let mut graph = module_graph(&root.join(krate).join("src"));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        // A listed circle between top-level modules (checked to exist by
        // the submodule test, which sees every edge).
        for (_, a, b, _) in KNOWN_CIRCLES.iter().filter(|c| c.0 == krate) {
            if let Some(s) = graph.get_mut(*a) {
                s.remove(*b);
            }
        }
        assert_eq!(
            circle(&graph),
            None,
            "{krate}: these modules import each other in a circle; move what both need into a module of its own"
        );
    }
    assert!(edges > 20, "the scan found only {edges} imports");
}

/// The scan sees a circle when there is one.
#[test]
fn the_circle_check_finds_circles() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(circle(&g).map(|c| c.len()), Some(4));
    let mut g2 = g.clone();
    g2.remove("c");
    assert_eq!(circle(&g2), None);
}

/// Every module (a file: `graph/autodiff/mod.rs` is `graph::autodiff`) of
/// the crate at `src`, and the modules each names through `crate::`,
/// `super::` or `self::` paths, not counting a module's own ancestors or
/// descendants (a parent declares its children; a child uses its parent's
/// items).
fn submodule_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let id = |p: &Path| -> String {
        let rel = p.strip_prefix(src).unwrap().with_extension("");
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|c| c != "mod" && c != "lib" && c != "main")
            .collect();
        parts.join("::")
    };
    let modules: BTreeSet<String> = files.iter().map(|p| id(p)).collect();
    // The longest known module that `path` (a :: path from the crate root)
    // names.
    let resolve = |path: &[String]| -> Option<String> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].join("::"))
            .find(|m| modules.contains(m))
    };
    let related = |a: &str, b: &str| {
        a.is_empty()
            || b.is_empty()
            || a == b
            || a.starts_with(&format!("{b}::"))
            || b.starts_with(&format!("{a}::"))
    };
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &files {
        let me = id(p);
        let me_parts: Vec<String> = if me.is_empty() {
            Vec::new()
        } else {
            me.split("::").map(String::from).collect()
        };
        // `super` of a file module is its parent; of `x/mod.rs` the same.
        let text = std::fs::read_to_string(p).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (prefix, base) in [
                ("crate::", Vec::new()),
                (
                    "super::",
                    me_parts[..me_parts.len().saturating_sub(1)].to_vec(),
                ),
                ("self::", me_parts.clone()),
            ] {
                for (i, _) in line.match_indices(prefix) {
                    if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                        continue; // `super::` inside `crate::x::super::` etc.
                    }
                    let mut rest = &line[i + prefix.len()..];
                    let mut base = base.clone();
                    while let Some(r) = rest.strip_prefix("super::") {
                        base.pop();
                        rest = r;
                    }
                    // `super::{a, b::c}` names each; `super::a::b` one.
                    let heads: Vec<String> = match rest.strip_prefix('{') {
                        Some(list) => list.split(',').map(|x| ident(x.trim_start())).collect(),
                        None => vec![rest.to_string()],
                    };
                    for head in heads {
                        let mut path = base.clone();
                        path.extend(head.split("::").map(ident).take_while(|s| !s.is_empty()));
                        if let Some(m) = resolve(&path)
                            && !related(&me, &m)
                        {
                            graph.entry(me.clone()).or_default().insert(m);
                        }
                    }
                }
            }
        }
    }
    graph
}

/// Circles between submodules that stay, each with why. Every one must
/// still exist (the list stays true) and no other may appear.
/// Each is (crate, module, the module it names, why); the edge listed is
/// the one taken out before the check for other circles.
const KNOWN_CIRCLES: &[(&str, &str, &str, &str)] = &[
    (
        "kernel-ir",
        "interp::eval",
        "interp::dma",
        "dma.rs is the DMA half of the interpreter's `Machine` (an `impl Machine` block using eval's `Val` and `Ranges`); `Machine` owns the `DmaState` it defines",
    ),
    (
        "graph",
        "node",
        "autodiff",
        "a kernel call node carries the backward its caller declared (`KernelVjp`, defined with the rest of autodiff), which autodiff's walk over the nodes calls",
    ),
    (
        "tooling",
        "bench::measure",
        "bench::torch",
        "measure runs each method's measurement and hands the PyTorch one to torch.rs, which answers in measure's child-result format and run cap",
    ),
];

#[test]
fn no_submodules_import_each_other_in_a_circle_but_the_listed_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut edges = 0;
    for krate in CRATES {
        let mut graph = submodule_graph(&root.join(krate).join("src"));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
        for (k, a, b, why) in KNOWN_CIRCLES.iter().filter(|c| c.0 == krate) {
            let has = graph.get(*a).is_some_and(|s| s.contains(*b));
            assert!(
                has,
                "{k}: the listed circle edge {a} -> {b} ({why}) is gone; remove it from the list"
            );
            graph.get_mut(*a).unwrap().remove(*b);
        }
        assert_eq!(
            circle(&graph),
            None,
            "{krate}: these submodules import each other in a circle; move what both need into a module of its own, or list it with its reason"
        );
    }
    assert!(edges > 60, "the scan found only {edges} imports");
}

/// The library knows no tool: the kernel crate's dependencies name
/// neither the tooling crate nor the command (Cargo then refuses any
/// `use tooling::` in the library), and the tooling crate does not name
/// the command. The library reaches the runtime only through its `graph`
/// feature (the test command builds it without).
#[test]
fn the_library_depends_on_no_tool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let deps = |krate: &str| -> Vec<String> {
        let text = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        let mut in_deps = false;
        let mut names = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_deps = line == "[dependencies]";
            } else if in_deps && let Some((name, _)) = line.split_once(['=', '.']) {
                names.push(name.trim().to_string());
            }
        }
        names
    };
    let library = deps("kernels");
    assert!(library.contains(&"kernel-ir".to_string()), "{library:?}");
    for tool in ["tooling", "tessera", "tessera-cli"] {
        assert!(
            !library.contains(&tool.to_string()),
            "kernels depends on {tool}"
        );
    }
    // Without its `graph` feature the library needs only the IR: the
    // layers that link MLIR and PJRT are optional dependencies.
    let manifest = std::fs::read_to_string(root.join("kernels/Cargo.toml")).unwrap();
    let mut in_deps = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps
            && ["runtime", "lowering", "graph"]
                .iter()
                .any(|l| line.starts_with(l))
        {
            assert!(
                line.contains("optional = true"),
                "kernels needs the layers below the IR only for its graph feature: `{line}`"
            );
        }
    }
    assert!(
        manifest.contains("graph = [\"dep:graph\"]"),
        "the graph feature is what brings in the graph runtime"
    );
    let tooling = deps("tooling");
    assert!(tooling.contains(&"kernels".to_string()), "{tooling:?}");
    assert!(
        !tooling.contains(&"tessera".to_string()) && !tooling.contains(&"tessera-cli".to_string()),
        "tooling depends on the command"
    );
}

/// The JAX loader's package (`python`) is Tessera's version: its
/// `__version__` (which `pyproject.toml` reads) is the workspace's, so the
/// loader's check of an artifact's `tessera_version` means what it says.
#[test]
fn the_python_package_has_the_workspace_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let quoted = |text: &str, key: &str| -> Option<String> {
        let line = text.lines().find(|l| l.trim_start().starts_with(key))?;
        Some(line.split('"').nth(1)?.to_string())
    };
    let cargo = read("Cargo.toml");
    let workspace = quoted(&cargo, "version =").expect("the workspace names its version");
    let init = read("python/src/tessera_artifact.py");
    let package = quoted(&init, "__version__ =").expect("tessera_artifact names __version__");
    assert_eq!(
        package, workspace,
        "set __version__ in python/src/tessera_artifact.py"
    );
    assert_eq!(workspace, env!("CARGO_PKG_VERSION"));
    let pyproject = read("python/pyproject.toml");
    assert!(
        pyproject.contains("version = { attr = \"tessera_artifact.__version__\" }"),
        "pyproject.toml must read its version from tessera_artifact.__version__"
    );
}

/// The crates a user depends on are publishable: a `tessera-` name that
/// cannot collide on crates.io (the library name stays short), a
/// description, the licence, a readme that exists, at most five keywords,
/// and no placeholder repository; the workspace's path dependencies carry
/// the version `cargo package` needs. Only the test crate stays
/// unpublished.
#[test]
fn the_sdk_crates_are_publishable() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        !workspace.contains("example.invalid"),
        "a placeholder repository"
    );
    for line in workspace.lines().filter(|l| l.contains("path = ")) {
        assert!(
            line.contains("version = ")
                && (line.contains("package = \"tessera-") || line.starts_with("tessera-")),
            "a workspace path dependency without a version or a tessera- package: {line}"
        );
    }
    for krate in CRATES {
        let dir = root.join(krate);
        let text = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let value = |key: &str| -> Option<String> {
            let line = text.lines().find(|l| l.starts_with(&format!("{key} =")))?;
            Some(line.split_once('=')?.1.trim().trim_matches('"').to_string())
        };
        let name = value("name").unwrap();
        assert!(name.starts_with("tessera-"), "{krate}: package `{name}`");
        assert!(
            value("description").is_some_and(|d| d.len() > 20),
            "{krate}: no description"
        );
        assert!(
            text.contains("license.workspace = true"),
            "{krate}: no licence"
        );
        let readme = value("readme").unwrap_or_else(|| panic!("{krate}: no readme"));
        assert!(
            dir.join(&readme).is_file(),
            "{krate}: readme {readme} missing"
        );
        let keywords = value("keywords").unwrap_or_else(|| panic!("{krate}: no keywords"));
        assert!(
            (1..=5).contains(&keywords.matches('"').count().div_ceil(2)),
            "{krate}: crates.io takes 1 to 5 keywords, got {keywords}"
        );
        assert!(
            !text.contains("publish = false"),
            "{krate} is not published"
        );
    }
}

/// Every Rust file of the workspace (not only what `cargo fmt` reaches:
/// it does not enter modules declared inside a macro, the template's own
/// workspace or the trybuild cases).
fn every_rust_file() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for dir in [
        "kernel-ir",
        "kernel-macros",
        "lowering",
        "runtime",
        "graph",
        "libtpu",
        "kernels",
        "tooling",
        "testing",
        "cli",
        "template",
        "tests",
    ] {
        walk(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "{} files", files.len());
    // Every folder of the top level that holds Rust is walked: a crate
    // moved or added there is checked without editing this list.
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if e.path().is_dir() && name != "target" && !name.starts_with('.') {
            let mut here = Vec::new();
            walk(&e.path(), &mut here);
            assert!(
                here.is_empty() || files.iter().any(|f| f.starts_with(e.path())),
                "`{name}/` holds Rust files this list does not walk; add it"
            );
        }
    }
    files
}

/// Every symbolic link in the repository resolves to a tracked file: a
/// relative link is written from its own folder, so moving either end
/// breaks it silently (the Python package's link to the Triton
/// interpreter did, when the package moved up a level).
#[test]
fn every_tracked_link_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let Ok(out) = std::process::Command::new("git")
        .args(["ls-files", "-s"])
        .current_dir(root)
        .output()
    else {
        return;
    };
    if !out.status.success() {
        // Not a git checkout (a packaged copy): nothing to list.
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let links: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("120000 "))
        .filter_map(|l| l.split('\t').nth(1))
        .collect();
    assert!(
        !links.is_empty(),
        "the Python package links the Triton interpreter"
    );
    for link in links {
        let path = root.join(link);
        assert!(
            path.canonicalize()
                .is_ok_and(|t| t.starts_with(root.canonicalize().unwrap()) && t.is_file()),
            "{link} points at {:?}, which is not a file of the repository",
            std::fs::read_link(&path)
        );
    }
}

/// Every Rust file is rustfmt-formatted.
#[test]
fn every_rust_file_is_formatted() {
    let files = every_rust_file();
    let out = std::process::Command::new("rustfmt")
        .args(["--edition", "2024", "--check", "-l"])
        .args(&files)
        .output()
        .expect("rustfmt runs (it comes with the toolchain, as cargo fmt does)");
    assert!(
        out.status.success(),
        "not formatted (run `rustfmt --edition 2024` on them):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// No Rust file is over 800 lines: a longer one holds more than one idea
/// and is split by idea (a module per idea, as `triton/emit/`).
#[test]
fn no_rust_file_is_over_800_lines() {
    let long: Vec<String> = every_rust_file()
        .into_iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(&f).ok()?.lines().count();
            (n > 800).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by idea:\n{}", long.join("\n"));
}
