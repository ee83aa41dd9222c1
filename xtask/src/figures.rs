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

use crate::markdown::{prose, without_code};

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
            let commands = names_after(&passage, COMMAND);
            for bench in commands.iter().filter(|b| !sections.contains_key(**b)) {
                wrong.push(format!(
                    "{name}: bench {bench}: no section `{bench}` in {}",
                    SOURCES[0]
                ));
            }
            let mut cited: Vec<&str> = commands
                .into_iter()
                .chain(names_after(&passage, LINK))
                .filter(|b| sections.contains_key(*b))
                .collect();
            cited.sort_unstable();
            cited.dedup();
            if cited.is_empty() {
                continue;
            }
            for (number, unit) in figures(&passage) {
                let found = cited.iter().any(|bench| {
                    recorded[&bench.to_string()]
                        .get(number)
                        .is_some_and(|units| units.contains(unit) || units.contains(""))
                });
                if !found {
                    wrong.push(format!(
                        "{name}: bench {}: {number} {unit}",
                        cited.join(", ")
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

/// The passages of a page outside fenced code, code spans removed but for those that name a
/// bench (which say where the passage's figures come from), white space runs as one space: its
/// paragraphs, each list item and each table row.
fn passages(text: &str) -> Vec<String> {
    let mut gathered = Vec::new();
    let mut current = String::new();
    for line in prose(text) {
        let trimmed = line.trim();
        let starts = trimmed.is_empty()
            || trimmed.starts_with('|')
            || trimmed.starts_with("* ")
            || trimmed.starts_with("- ")
            || trimmed.starts_with('#');
        if starts {
            gathered.push(std::mem::take(&mut current));
        }
        current.push_str(trimmed);
        current.push(' ');
        if trimmed.starts_with('|') {
            gathered.push(std::mem::take(&mut current));
        }
    }
    gathered.push(current);
    gathered
        .iter()
        .map(|p| {
            let kept = without_code(p, |span| {
                span.split_whitespace()
                    .take(3)
                    .eq(COMMAND.split_whitespace())
            });
            kept.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// How a passage names a bench by its command, and by a link to its section.
const COMMAND: &str = "cargo xtask bench ";
const LINK: &str = "benchmarks.md#";

/// The names after each `prefix` in `text` (lower case, digits and `-`: `NAME` is a placeholder).
fn names_after<'t>(text: &'t str, prefix: &str) -> Vec<&'t str> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            (end > 0 && !rest.starts_with('-')).then(|| &rest[..end])
        })
        .collect()
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
        assert_eq!(passage, "a 1.5 ms (cargo xtask bench psi, ) b 2 ms");
        assert_eq!(names_after(passage, COMMAND), ["psi"]);
        assert_eq!(figures(passage), [("1.5", "ms"), ("2", "ms")]);
    }
}
