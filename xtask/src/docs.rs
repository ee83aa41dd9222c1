//! `cargo xtask docs [--check]`: the documentation's three machine checks.
//!
//! * `docs/reference/` is written from the code by the tests crate's `reference` binary (it
//!   needs the agent's library, which xtask does not build); `--check` fails when what is
//!   committed is not what the code gives now.
//! * Every relative link of `README.md` and `docs/**/*.md` resolves: the file exists inside the
//!   repository and, for `#anchor`, the target page has a heading of that slug (GitHub's: lower
//!   case, punctuation but `-` and `_` dropped, spaces to `-`, repeats numbered `-1`, `-2`).
//!   Nothing points outside the repository. Code blocks and code spans are not read for links.
//! * Every figure quoted beside the bench it comes from is the one that bench's section of
//!   `docs/benchmarks.md` records ([`figures`]).

use std::{
    collections::BTreeMap,
    fs,
    path::{Component, Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use crate::{
    cmd::{self, Env},
    figures,
    markdown::{prose, without_code},
};

/// Writes the reference (or with `check` compares it), then checks every link.
pub fn run(env: &Env, check: bool) -> Result<()> {
    let root = cmd::workspace();
    let dir = root.join("docs/reference");
    let dir = dir.to_string_lossy();
    let mut args = vec![
        "run",
        "--quiet",
        "--package",
        "hugepage-agent-tests",
        "--bin",
        "reference",
        "--",
        "--dir",
        &dir,
    ];
    if check {
        args.push("--check");
    }
    cmd::cargo(env, &args)?;
    fail_on(
        &check_links(&root)?,
        "broken link(s) in README.md and docs/",
    )?;
    println!("every relative link of README.md and docs/ resolves");
    let pages = pages(&root)?;
    let relative: Vec<&Path> = pages
        .iter()
        .filter_map(|p| p.strip_prefix(&root).ok())
        .collect();
    fail_on(
        &figures::check(&root, &relative)?,
        "figure(s) of README.md and docs/ not as their bench's section of docs/benchmarks.md records them",
    )?;
    println!("every figure quoted beside its bench is the one docs/benchmarks.md records");
    Ok(())
}

/// Prints each finding and fails naming how many of `what` there are; nothing when none.
fn fail_on(findings: &[String], what: &str) -> Result<()> {
    for line in findings {
        eprintln!("  {line}");
    }
    if !findings.is_empty() {
        bail!("{} {what} (above)", findings.len());
    }
    Ok(())
}

/// Every Markdown file of the documentation: `README.md` and `docs/**/*.md`.
fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The broken links of every page, each as `page: target: why`.
pub fn check_links(root: &Path) -> Result<Vec<String>> {
    let mut anchors: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    let mut broken = Vec::new();
    for page in pages(root)? {
        let text =
            fs::read_to_string(&page).with_context(|| format!("reading {}", page.display()))?;
        let shown = page
            .strip_prefix(root)
            .unwrap_or(&page)
            .display()
            .to_string();
        for target in links(&text) {
            if let Err(why) = resolve(root, &page, &target, &mut anchors) {
                broken.push(format!("{shown}: {target}: {why}"));
            }
        }
    }
    Ok(broken)
}

/// Whether `target`, linked from `page`, exists (with its anchor); why not.
fn resolve(
    root: &Path,
    page: &Path,
    target: &str,
    anchors: &mut BTreeMap<PathBuf, Vec<String>>,
) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalize(&page.parent().unwrap_or(root).join(path))
    };
    if !file.starts_with(root) {
        return Err("points outside the repository".to_owned());
    }
    if !file.exists() {
        return Err("no such file".to_owned());
    }
    if anchor.is_empty() {
        return Ok(());
    }
    if file.extension().is_none_or(|e| e != "md") {
        return Err("an anchor into a file that is not Markdown".to_owned());
    }
    let known = match anchors.get(&file) {
        Some(known) => known,
        None => {
            let text = fs::read_to_string(&file).map_err(|e| e.to_string())?;
            anchors.entry(file.clone()).or_insert_with(|| slugs(&text))
        }
    };
    if known.iter().any(|a| a == anchor) {
        Ok(())
    } else {
        Err(format!("no heading with the anchor #{anchor}"))
    }
}

/// `path` with `.` and `..` taken out.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The targets of the inline links (`[text](target)`, images too) outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let line = without_code(line, |_| false);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            // `\]` is a literal bracket, as Markdown escapes it: no link ends there.
            let escaped = rest[..at].ends_with('\\');
            rest = &rest[at + 2..];
            if escaped {
                continue;
            }
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() {
                out.push(target.to_owned());
            }
            rest = &rest[end..];
        }
    }
    out
}

/// The anchors of a page's headings, as GitHub makes them.
fn slugs(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug = slug(heading.trim());
        let n = seen.entry(slug.clone()).or_insert(0);
        out.push(match *n {
            0 => slug.clone(),
            k => format!("{slug}-{k}"),
        });
        *n += 1;
    }
    out
}

/// GitHub's anchor of a heading's text: link text kept and targets dropped, lower case, every
/// character but letters, digits, `-`, `_` and spaces dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        rest = &rest[at + 2..];
        rest = rest.find(')').map_or("", |end| &rest[end + 1..]);
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_slug_as_github_makes_them() {
        assert_eq!(slug("The two commands"), "the-two-commands");
        assert_eq!(
            slug("`hugepage-agent webhook`: the cluster side"),
            "hugepage-agent-webhook-the-cluster-side"
        );
        assert_eq!(slug("POST /v1/admit"), "post-v1admit");
        assert_eq!(slug("The agent's metrics"), "the-agents-metrics");
        assert_eq!(slug("See [this](x.md) page"), "see-this-page");
        let text = "# A\n```\n# not a heading\n```\n## A\n### B (C)\n";
        assert_eq!(slugs(text), ["a", "a-1", "b-c"]);
    }

    #[test]
    fn links_outside_code_are_found_and_resolved() {
        let text = "See [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n![d](img.png \"t\") \\[0,2\\](closest)\n";
        assert_eq!(links(text), ["a.md#x", "img.png"]);
        let dir = tempfile::tempdir().expect("a directory");
        let root = dir.path();
        fs::create_dir_all(root.join("docs")).expect("docs");
        fs::write(root.join("README.md"), "# Top\n[ok](docs/p.md#one) [bad](docs/p.md#two)\n[gone](docs/q.md) [out](../x.md) [self](#top)\n").expect("readme");
        fs::write(root.join("docs/p.md"), "# One\n[up](../README.md#top)\n").expect("page");
        let broken = check_links(root).expect("checked");
        assert_eq!(
            broken,
            [
                "README.md: docs/p.md#two: no heading with the anchor #two",
                "README.md: docs/q.md: no such file",
                "README.md: ../x.md: points outside the repository",
            ]
        );
    }
}
