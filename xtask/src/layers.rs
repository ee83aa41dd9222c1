//! `cargo xtask layers`: the agent's modules as floors, every import pointing down, checked. It
//! reads `agent/src` as text: each file is a module (`admission/verify.rs` is
//! `admission::verify`), and each path it names through `crate::` or `super::` (in `use` items,
//! braces included, and inline) is an edge to the module that path reaches. Two graphs must have
//! no circle: the top-level modules (`admission`, `memorymanager`, …), and the files of one
//! folder among themselves (a parent's `mod.rs` and its children excepted: a folder's root names
//! its children to declare them). It also holds the rules that keep pure logic pure: the
//! Topology Manager's merge, the Memory Manager's hint generation and the parsing and merging
//! of the kubelet's settings import no reader. And `run.rs` stays the wiring: 250 lines at most.
//!
//! It reads imports as text, line comments (documentation included) left out: a doc link is not
//! an import.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context, Result, bail};

/// Module path (`["admission", "verify"]`) → the module paths it names.
pub type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// Modules of pure logic and the modules they must not import.
const PURE: [(&str, &[&str]); 5] = [
    ("topologymanager", &["sysfs", "numa", "probes", "psi"]),
    ("memorymanager::hints", &["sysfs", "probes", "psi"]),
    ("kubeletconfig::file", &["sysfs", "numa", "probes", "psi"]),
    (
        "kubeletconfig::cmdline",
        &["sysfs", "numa", "probes", "psi"],
    ),
    (
        "kubeletconfig::settings",
        &["sysfs", "numa", "probes", "psi"],
    ),
];

/// Reads every `.rs` file under `src` (tests excluded: `tests.rs` and `tests/` folders).
pub fn read(src: &Path) -> Result<Graph> {
    let mut files = Vec::new();
    collect(src, src, &mut files)?;
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = Graph::new();
    for (module, text) in &files {
        let edges = graph.entry(module.clone()).or_default();
        for path in paths(text) {
            let absolute = resolve(module, &path);
            if let Some(target) = longest_module(&modules, &absolute)
                && &target != module
            {
                edges.insert(target);
            }
        }
    }
    Ok(graph)
}

fn collect(src: &Path, dir: &Path, out: &mut Vec<(Vec<String>, String)>) -> Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if path.is_dir() {
            if name.as_deref() != Some("tests") && name.as_deref() != Some("testdata") {
                collect(src, &path, out)?;
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || name.as_deref() == Some("tests.rs") {
            continue;
        }
        let rel = path.strip_prefix(src).unwrap_or(&path).with_extension("");
        let mut module: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module
            .last()
            .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
        {
            module.pop();
        }
        let text = fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        out.push((module, strip_test_module(&text)));
    }
    Ok(())
}

/// The text before a file's `#[cfg(test)] mod tests` block (what tests import is not a layer),
/// without line comments.
fn strip_test_module(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => text,
    };
    code.lines()
        .map(|line| match line.find("//") {
            Some(at) if line[..at].trim().is_empty() || line[..at].ends_with(' ') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path the text names from `crate::` or `super::`, expanded through `use` braces:
/// `use crate::{a::{b, c}, d}` gives `crate::a::b`, `crate::a::c`, `crate::d`.
fn paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 8)].iter().collect();
        let starts = rest.starts_with("crate::") || rest.starts_with("super::");
        let boundary = i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_');
        if starts && boundary {
            let (found, end) = expand(&bytes, i, Vec::new());
            out.extend(found);
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Reads a path starting at `at` with `prefix` before it; returns its expansions and the end.
fn expand(chars: &[char], mut at: usize, mut prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    loop {
        let start = at;
        while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
            at += 1;
        }
        if at > start {
            prefix.push(chars[start..at].iter().collect());
        }
        if chars[at..].starts_with(&[':', ':']) {
            at += 2;
            if chars.get(at) == Some(&'{') {
                let mut out = Vec::new();
                at += 1;
                loop {
                    while chars
                        .get(at)
                        .is_some_and(|c| c.is_whitespace() || *c == ',')
                    {
                        at += 1;
                    }
                    match chars.get(at) {
                        None => return (out, at),
                        Some('}') => return (out, at + 1),
                        Some(_) => {
                            let (inner, end) = expand(chars, at, prefix.clone());
                            out.extend(inner);
                            // Skip what follows an item (`as name`, `self`) up to `,` or `}`.
                            at = end;
                            while chars.get(at).is_some_and(|c| *c != ',' && *c != '}') {
                                at += 1;
                            }
                        }
                    }
                }
            }
            continue;
        }
        return (vec![prefix], at);
    }
}

/// `crate::a::b` → `[a, b]`; `super::x` from module `m::n` → `[m, x]`.
fn resolve(module: &[String], path: &[String]) -> Vec<String> {
    let mut base: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super") => {
            base = module.to_vec();
            while rest.first().is_some_and(|p| p == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => {}
    }
    base.extend(rest.iter().cloned());
    base
}

/// The longest known module that `path` starts with.
fn longest_module(modules: &BTreeSet<Vec<String>>, path: &[String]) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

/// Edges between top-level modules.
pub fn top_level(graph: &Graph) -> Graph {
    let mut top = Graph::new();
    for (from, to) in graph {
        let Some(a) = from.first() else { continue };
        let edges = top.entry(vec![a.clone()]).or_default();
        for t in to {
            if let Some(b) = t.first()
                && b != a
            {
                edges.insert(vec![b.clone()]);
            }
        }
    }
    top
}

/// Edges between the files of one folder (a parent module and its own children excepted).
pub fn siblings(graph: &Graph) -> Graph {
    let mut out = Graph::new();
    for (from, to) in graph {
        let edges = out.entry(from.clone()).or_default();
        for t in to {
            let same_folder = from.len() == t.len() && from[..from.len() - 1] == t[..t.len() - 1];
            if same_folder {
                edges.insert(t.clone());
            }
        }
    }
    out
}

/// Every circle in `graph`, each as the modules around it.
pub fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let names = |m: &Vec<String>| m.join("::");
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if next == start {
                    let mut circle: Vec<String> = path.iter().map(names).collect();
                    let min = circle
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, n)| (*n).clone())
                        .map_or(0, |(i, _)| i);
                    circle.rotate_left(min);
                    found.insert(circle);
                } else if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found.into_iter().collect()
}

/// Floors from the bottom: each module one above the highest module it imports.
pub fn floors(graph: &Graph) -> BTreeMap<usize, Vec<String>> {
    let mut floor: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for _ in 0..=graph.len() {
        for (m, to) in graph {
            let f = to
                .iter()
                .map(|t| floor.get(t).copied().unwrap_or(0) + 1)
                .max()
                .unwrap_or(0);
            floor.insert(m.clone(), f.min(graph.len()));
        }
    }
    let mut out: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (m, f) in floor {
        out.entry(f).or_default().push(m.join("::"));
    }
    out
}

/// The pure-logic rules broken: `(module, what it imports that it must not)`.
pub fn impure(graph: &Graph) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, forbidden) in PURE {
        let prefix: Vec<String> = module.split("::").map(str::to_owned).collect();
        for (from, to) in graph {
            if !from.starts_with(&prefix) {
                continue;
            }
            for t in to {
                if t.first()
                    .is_some_and(|top| forbidden.contains(&top.as_str()))
                {
                    out.push((from.join("::"), t.join("::")));
                }
            }
        }
    }
    out
}

/// `run.rs` is the wiring only (#15): what starts, in what order, what stops it.
const WIRING_LINES: usize = 250;

/// Prints the floors and fails on a circle, a broken purity rule, or a `run.rs` grown beyond the
/// wiring.
pub fn check(src: &Path) -> Result<()> {
    let graph = read(src)?;
    let top = top_level(&graph);
    for (floor, modules) in floors(&top).iter().rev() {
        println!("floor {floor:>2}  {}", modules.join(", "));
    }
    let mut problems = Vec::new();
    for circle in circles(&top).into_iter().chain(circles(&siblings(&graph))) {
        problems.push(format!("circle: {}", circle.join(" -> ")));
    }
    for (from, to) in impure(&graph) {
        problems.push(format!(
            "{from} imports {to}, a reader: pure logic must not"
        ));
    }
    let wiring = src.join("run.rs");
    let lines = fs::read_to_string(&wiring)
        .with_context(|| format!("reading {}", wiring.display()))?
        .lines()
        .count();
    if lines > WIRING_LINES {
        problems.push(format!(
            "{} has {lines} lines: it is the wiring only (at most {WIRING_LINES}); move a running concern to the module that owns its state",
            wiring.display()
        ));
    }
    for p in &problems {
        eprintln!("{p}");
    }
    if !problems.is_empty() {
        bail!(
            "{} layering problem(s) in {}",
            problems.len(),
            src.display()
        );
    }
    println!(
        "no circle among the {} top-level modules nor among the files of any folder",
        top.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> Vec<String> {
        s.split("::").map(str::to_owned).collect()
    }

    #[test]
    fn use_braces_expand_into_every_path() {
        let found = paths(
            "use crate::{\n    admission::{plan, request::{self, Pod}},\n    numa::PageSize as P,\n};\nlet x = crate::quantity::parse(y);",
        );
        assert_eq!(
            found,
            [
                path("crate::admission::plan"),
                path("crate::admission::request::self"),
                path("crate::admission::request::Pod"),
                path("crate::numa::PageSize"),
                path("crate::quantity::parse"),
            ]
        );
    }

    #[test]
    fn a_doc_link_is_not_an_import() {
        let text = strip_test_module(
            "//! See [`crate::telemetry`].\nuse crate::numa::PageSize; // crate::api\n",
        );
        assert_eq!(paths(&text), [path("crate::numa::PageSize")]);
    }

    #[test]
    fn super_is_resolved_against_the_module() {
        let m = path("admission::verify");
        assert_eq!(
            resolve(&m, &path("super::reservations::Store")),
            path("admission::reservations::Store")
        );
        assert_eq!(
            resolve(&path("a::b::c"), &path("super::super::x")),
            path("a::x")
        );
    }

    #[test]
    fn a_circle_between_two_modules_is_found_and_a_chain_is_not() {
        let graph: Graph = [
            (path("a"), BTreeSet::from([path("b")])),
            (path("b"), BTreeSet::from([path("a"), path("c")])),
            (path("c"), BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        assert_eq!(circles(&graph), [vec!["a".to_owned(), "b".to_owned()]]);
        let chain: Graph = [
            (path("a"), BTreeSet::from([path("b")])),
            (path("b"), BTreeSet::from([path("c")])),
            (path("c"), BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        assert!(circles(&chain).is_empty());
        assert_eq!(floors(&chain)[&2], ["a"]);
    }

    #[test]
    fn the_agent_has_no_circle_and_its_pure_logic_imports_no_reader() {
        let src = crate::cmd::workspace().join("agent/src");
        let graph = read(&src).expect("agent/src reads");
        let top = top_level(&graph);
        assert!(top.len() > 10, "{top:?}");
        assert_eq!(circles(&top), Vec::<Vec<String>>::new());
        assert_eq!(circles(&siblings(&graph)), Vec::<Vec<String>>::new());
        assert_eq!(impure(&graph), Vec::<(String, String)>::new());
    }
}
