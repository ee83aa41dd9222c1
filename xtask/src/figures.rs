//! The documentation's figures against their one source. The benches' output is recorded in
//! `docs/benchmarks.md`, one section a bench (`` ## `NAME` ``), and the VM test's in
//! `docs/kernels.md`; every other page that quotes a measured figure cites its bench
//! (`cargo xtask bench NAME`, or a link to `benchmarks.md#NAME`). In each paragraph, list item or
//! table row of those pages that cites a bench, every number with a unit of time or memory
//! (`µs`, `ms`, `KiB`, `MiB`, `MB`, `GB`) must be written as that bench's section writes it
//! somewhere, in the same unit or in a table cell without one: a figure rounded on the way, or
//! kept from an older run the section no longer shows, is reported with its page, bench and
//! figure. A bench cited that has no section is reported too.

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
/// passage cites, each as `page: bench NAME: figure`, and every bench cited with no section.
pub fn check(root: &Path, pages: &[&Path]) -> Result<Vec<String>> {
    let benchmarks = fs::read_to_string(root.join(SOURCES[0]))
        .with_context(|| format!("reading {}", SOURCES[0]))?;
    let sections = sections(&benchmarks);
    let recorded: BTreeMap<&String, BTreeMap<&str, BTreeSet<&str>>> = sections
        .iter()
        .map(|(bench, text)| (bench, units_of(text)))
        .collect();
    let mut wrong = Vec::new();
    for page in pages {
        let name = page.to_string_lossy();
        if SOURCES.contains(&name.as_ref()) || name.starts_with("docs/reference/") {
            continue;
        }
        let text =
            fs::read_to_string(root.join(page)).with_context(|| format!("reading {name}"))?;
        for passage in passages(&text) {
            for bench in commands(&passage) {
                if !sections.contains_key(bench) {
                    wrong.push(format!(
                        "{name}: bench {bench}: no section `{bench}` in {}",
                        SOURCES[0]
                    ));
                }
            }
            let cited: Vec<&String> = sections
                .keys()
                .filter(|bench| cites(&passage, bench))
                .collect();
            if cited.is_empty() {
                continue;
            }
            for (number, unit) in figures(&passage) {
                let found = cited.iter().any(|bench| {
                    recorded[bench]
                        .get(number)
                        .is_some_and(|units| units.contains(unit) || units.contains(""))
                });
                if !found {
                    let benches: Vec<&str> = cited.iter().map(|b| b.as_str()).collect();
                    wrong.push(format!(
                        "{name}: bench {}: {number} {unit}",
                        benches.join(", ")
                    ));
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
        let trimmed = line.trim();
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
        if starts && !current.trim().is_empty() {
            out.push(std::mem::take(&mut current));
        }
        if starts {
            current.clear();
        }
        current.push_str(trimmed);
        current.push(' ');
        if trimmed.starts_with('|') {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out.iter().map(|p| without_code(p)).collect()
}

/// `passage` without its code spans, but for those that name a bench (`cargo xtask bench NAME`),
/// which say where the passage's figures come from; runs of white space as one space.
fn without_code(passage: &str) -> String {
    let kept: Vec<&str> = passage
        .split('`')
        .enumerate()
        .filter(|(i, part)| {
            i % 2 == 0
                || part
                    .split_whitespace()
                    .take(3)
                    .eq(["cargo", "xtask", "bench"])
        })
        .map(|(_, part)| part)
        .collect();
    kept.join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The benches `passage` names by their command (lower case: `NAME` is a placeholder).
fn commands(passage: &str) -> Vec<&str> {
    passage
        .match_indices("cargo xtask bench ")
        .map(|(at, m)| {
            let rest = &passage[at + m.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| !name.is_empty() && !name.starts_with('-'))
        .collect()
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

/// Every number of `text` with the unit that follows it, empty where none of [`UNITS`] does.
fn numbers(text: &str) -> Vec<(&str, &'static str)> {
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
        out.push((number, unit.copied().unwrap_or("")));
        at = end;
    }
    out
}

/// The figures of `passage`: its numbers that carry a unit.
fn figures(passage: &str) -> Vec<(&str, &'static str)> {
    numbers(passage)
        .into_iter()
        .filter(|(_, unit)| !unit.is_empty())
        .collect()
}

/// The units each number of `text` is written with (`""` for none, as in a table cell).
fn units_of(text: &str) -> BTreeMap<&str, BTreeSet<&'static str>> {
    let mut out: BTreeMap<&str, BTreeSet<&'static str>> = BTreeMap::new();
    for (number, unit) in numbers(text) {
        out.entry(number).or_default().insert(unit);
    }
    out
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
            "# B\n## `psi`\n| tick | 21.96 µs |\n```\nwalk 377.7\n```\n50 µs\n## `holders-x`\n1.5 ms\n## Other\n9 ms\n",
        )
        .expect("benchmarks");
        fs::write(
            root.join("docs/concepts/p.md"),
            "One tick 21.96 µs and 377.7 ms (`cargo xtask\nbench psi`), a threshold of 50 ms.\n\n\
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
                "docs/concepts/p.md: bench psi: 50 ms",
                "docs/concepts/p.md: bench psi: 22 µs",
                "docs/concepts/p.md: bench holders: no section `holders` in docs/benchmarks.md",
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
                ("1,264.65", "ms"),
                ("3.3", ""),
                ("14", "KiB"),
                ("2", ""),
                ("5", "MiB"),
            ]
        );
    }

    #[test]
    fn a_code_span_across_lines_keeps_the_passage_s_citation() {
        let passage =
            &passages("a 1.5 ms (`cargo xtask\nbench psi`, `--rounds\n20 ms`) b 2 ms\n")[0];
        assert_eq!(passage, "a 1.5 ms ( cargo xtask bench psi , ) b 2 ms");
        assert_eq!(commands(passage), ["psi"]);
        assert_eq!(figures(passage), [("1.5", "ms"), ("2", "ms")]);
    }
}
