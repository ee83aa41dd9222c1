//! The documentation's figures against their one source. The benches' output is recorded in
//! `docs/benchmarks.md`, one section a bench (`` ## `NAME` ``), and the VM test's in
//! `docs/kernels.md`; every other page that quotes a measured figure cites its bench
//! (`cargo xtask bench NAME`, or a link to `benchmarks.md#NAME`). In each paragraph, list item or
//! table row of those pages that cites a bench, every number with a unit of time or memory
//! (`µs`, `ms`, `KiB`, `MiB`, `MB`, `GB`) must be written as that bench's section writes it
//! somewhere (a table cell without its unit counts): a figure rounded on the way, or kept from an
//! older run the section no longer shows, is reported with its page, bench and figure.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

use anyhow::{Context, Result};

/// The units a measured figure is quoted in.
const UNITS: [&str; 6] = ["µs", "ms", "KiB", "MiB", "MB", "GB"];

/// Pages that are themselves where figures are recorded.
const SOURCES: [&str; 2] = ["docs/benchmarks.md", "docs/kernels.md"];

/// Every figure of `pages` (paths relative to `root`) not found in the section of the bench its
/// passage cites, each as `page: bench NAME: figure`.
pub fn check(root: &Path, pages: &[&Path]) -> Result<Vec<String>> {
    let benchmarks = fs::read_to_string(root.join(SOURCES[0]))
        .with_context(|| format!("reading {}", SOURCES[0]))?;
    let sections = sections(&benchmarks);
    let mut wrong = Vec::new();
    for page in pages {
        let name = page.to_string_lossy();
        if SOURCES.contains(&name.as_ref()) || name.starts_with("docs/reference/") {
            continue;
        }
        let text =
            fs::read_to_string(root.join(page)).with_context(|| format!("reading {name}"))?;
        for passage in passages(&text) {
            let cited: Vec<&String> = sections
                .keys()
                .filter(|bench| cites(&passage, bench))
                .collect();
            if cited.is_empty() {
                continue;
            }
            let recorded: BTreeSet<&str> = cited
                .iter()
                .flat_map(|bench| numbers(&sections[*bench]))
                .map(|(number, _)| number)
                .collect();
            for (number, figure) in figures(&passage) {
                if !recorded.contains(number) {
                    let benches: Vec<&str> = cited.iter().map(|b| b.as_str()).collect();
                    wrong.push(format!("{name}: bench {}: {figure}", benches.join(", ")));
                }
            }
        }
    }
    Ok(wrong)
}

/// Each bench's section of `docs/benchmarks.md`, by the bench's name.
fn sections(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            out.extend(current.take());
            current = heading
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .map(|name| (name.to_owned(), String::new()));
        } else if let Some((_, body)) = current.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out.extend(current);
    out
}

/// The passages of a page outside fenced code, code spans removed: its paragraphs, each list
/// item and each table row.
fn passages(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut fenced = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let starts = trimmed.is_empty()
            || trimmed.starts_with('|')
            || trimmed.starts_with("* ")
            || trimmed.starts_with("- ")
            || trimmed.starts_with('#');
        if starts {
            if current.trim().is_empty() {
                current.clear();
            } else {
                out.push(std::mem::take(&mut current));
            }
        }
        current.push_str(&without_code(line));
        current.push(' ');
        if trimmed.starts_with('|') {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

/// `line` without its code spans, but for those that name a bench (`cargo xtask bench NAME`),
/// which say where the passage's figures come from.
fn without_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .filter(|(i, part)| i % 2 == 0 || part.starts_with("cargo xtask bench "))
        .map(|(_, part)| part)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `passage` cites `bench`, by its command or a link to its section.
fn cites(passage: &str, bench: &str) -> bool {
    let ends = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '-');
    let by = |prefix: &str| {
        passage
            .match_indices(&format!("{prefix}{bench}"))
            .any(|(at, m)| ends(&passage[at + m.len()..]))
    };
    by("cargo xtask bench ") || by("benchmarks.md#")
}

/// Every number of `text` with what follows it: `(number, number and unit)` for each, the unit
/// empty where none of [`UNITS`] follows.
fn numbers(text: &str) -> Vec<(&str, String)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let starts = bytes[at].is_ascii_digit()
            && (at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'.'));
        if !starts {
            at += 1;
            continue;
        }
        let mut end = at;
        while end < bytes.len() {
            let b = bytes[end];
            let joins =
                (b == b',' || b == b'.') && bytes.get(end + 1).is_some_and(|n| n.is_ascii_digit());
            if b.is_ascii_digit() || joins {
                end += 1;
            } else {
                break;
            }
        }
        let number = &text[at..end];
        let rest = &text[end..];
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        let unit = UNITS.iter().find(|u| {
            rest.strip_prefix(**u)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric()))
        });
        out.push((
            number,
            unit.map_or_else(String::new, |u| format!("{number} {u}")),
        ));
        at = end;
    }
    out
}

/// The figures of `passage`: its numbers that carry a unit.
fn figures(passage: &str) -> Vec<(&str, String)> {
    numbers(passage)
        .into_iter()
        .filter(|(_, figure)| !figure.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_checked_against_the_section_of_the_bench_its_passage_cites() {
        let dir = tempfile::tempdir().expect("a directory");
        let root = dir.path();
        fs::create_dir_all(root.join("docs/concepts")).expect("docs");
        fs::write(
            root.join("docs/benchmarks.md"),
            "# B\n## `psi`\n| tick | 21.96 µs |\n```\nwalk 377.7\n```\n## `holders-x`\n1.5 ms\n## Other\n9 ms\n",
        )
        .expect("benchmarks");
        fs::write(
            root.join("docs/concepts/p.md"),
            "One tick 21.96 µs and 377.7 ms (`cargo xtask bench psi`).\n\n\
             * a tick of 22 µs ([b](../benchmarks.md#psi))\n\
             * 9 ms, 1.5 ms, and 2 nodes, citing no bench\n\n\
             | 1.5 ms | `cargo xtask bench holders` |\n\
             | 4 MiB, `3 ms` | [b](../benchmarks.md#holders-x) |\n",
        )
        .expect("page");
        fs::write(
            root.join("docs/kernels.md"),
            "`cargo xtask bench psi`: 1 ms\n",
        )
        .expect("k");
        let pages = [
            Path::new("docs/concepts/p.md"),
            Path::new("docs/kernels.md"),
            Path::new("docs/benchmarks.md"),
        ];
        let wrong = check(root, &pages).expect("checked");
        assert_eq!(
            wrong,
            [
                "docs/concepts/p.md: bench psi: 22 µs",
                "docs/concepts/p.md: bench holders-x: 4 MiB",
            ]
        );
    }

    #[test]
    fn numbers_keep_their_separators_and_find_their_unit() {
        let found = numbers("p99 1,264.65 ms, 3.3 million, 14 KiB, 2x, v1.2 MB 5MiB");
        assert_eq!(
            found,
            [
                ("1,264.65", "1,264.65 ms".to_owned()),
                ("3.3", String::new()),
                ("14", "14 KiB".to_owned()),
                ("2", String::new()),
                ("5", "5 MiB".to_owned()),
            ]
        );
    }
}
