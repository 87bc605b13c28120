//! The module structure stays one-way: within each crate, no two top-level
//! modules reach each other through `crate::` paths (directly or around a
//! longer circle), so each module can be read, tested and replaced with
//! only what it imports. Read from the sources, comments and test modules
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

/// Top-level module of each file, and the top-level modules it names.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(src).ok()?;
            let first = rel.components().next()?.as_os_str().to_str()?.to_string();
            let name = first.trim_end_matches(".rs").to_string();
            (name != "lib" && name != "main").then_some(name)
        })
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &files {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let me = first.trim_end_matches(".rs").to_string();
        if !tops.contains(&me) {
            continue;
        }
        let text = std::fs::read_to_string(p).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let rest = &line[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name != me && tops.contains(&name) {
                    graph.entry(me.clone()).or_default().insert(name);
                }
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

#[test]
fn no_crate_has_an_import_circle_between_its_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut edges = 0;
    for krate in [
        "kernel-macros",
        "kernel-ir",
        "lowering",
        "runtime",
        "kernels",
    ] {
        let graph = module_graph(&root.join(krate).join("src"));
        edges += graph.values().map(BTreeSet::len).sum::<usize>();
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
