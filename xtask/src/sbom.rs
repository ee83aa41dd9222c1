//! The image's software bill of materials: an SPDX 2.3 JSON document of what the shipped binary
//! is built from, written beside the image by `cargo xtask image`. Its packages are the agent
//! and every crate its build for the image's target links in (`cargo metadata --locked
//! --filter-platform`, the normal dependencies reached from the agent: build scripts and proc
//! macros run at build time and are not in the binary), each with its version, declared
//! license, where it was downloaded (crates.io), the SHA-256 `Cargo.lock` pins it to and its
//! package URL (`pkg:cargo/…`); relationships say which crate depends on which. The toolchains
//! that compiled it (the stable `rustc`, and the nightly that built the eBPF object) are named
//! in the document's creation info. The document's time is the commit's, so the same commit
//! gives the same document.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// What the document says of the build.
pub struct Build<'a> {
    pub package: &'a str,
    pub version: &'a str,
    pub revision: &'a str,
    /// Seconds since the epoch: the commit's.
    pub time: i64,
    pub target: &'a str,
    /// `rustc -V` of each toolchain used.
    pub toolchains: Vec<String>,
}

/// The SPDX document for `build`, from `metadata` (`cargo metadata` output) and `lock` (the text
/// of `Cargo.lock`).
pub fn document(build: &Build<'_>, metadata: &Value, lock: &str) -> Result<Value> {
    let checksums = lock_checksums(lock);
    let packages: BTreeMap<&str, &Value> = metadata["packages"]
        .as_array()
        .context("cargo metadata: no packages")?
        .iter()
        .filter_map(|p| Some((p["id"].as_str()?, p)))
        .collect();
    let nodes: BTreeMap<&str, &Value> = metadata["resolve"]["nodes"]
        .as_array()
        .context("cargo metadata: no resolve graph")?
        .iter()
        .filter_map(|n| Some((n["id"].as_str()?, n)))
        .collect();
    let root = packages
        .iter()
        .find(|(_, p)| p["name"] == build.package && p["source"].is_null())
        .map(|(id, _)| *id)
        .with_context(|| format!("cargo metadata: no workspace package {}", build.package))?;
    // The normal dependencies reached from the agent, and who depends on whom.
    let mut reached = BTreeSet::from([root]);
    let mut edges = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        let node = nodes
            .get(id)
            .with_context(|| format!("cargo metadata: {id} not resolved"))?;
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            let Some(to) = dep["pkg"].as_str().filter(|_| normal) else {
                continue;
            };
            // A proc macro runs in the compiler; nothing of it is linked in.
            if packages.get(to).is_some_and(|p| is_proc_macro(p)) {
                continue;
            }
            edges.insert((id, to));
            if reached.insert(to) {
                todo.push(to);
            }
        }
    }
    let mut spdx_packages = Vec::new();
    for id in &reached {
        let p = packages
            .get(id)
            .with_context(|| format!("cargo metadata: no package {id}"))?;
        let (name, version) = (
            p["name"].as_str().unwrap_or_default(),
            p["version"].as_str().unwrap_or_default(),
        );
        let registry = p["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("registry+"));
        let mut entry = json!({
            "SPDXID": spdx_id(name, version),
            "name": name,
            "versionInfo": version,
            "downloadLocation": if registry {
                format!("https://crates.io/api/v1/crates/{name}/{version}/download")
            } else {
                "NOASSERTION".to_owned()
            },
            "filesAnalyzed": false,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": p["license"].as_str().map_or("NOASSERTION", |l| l),
            "copyrightText": "NOASSERTION",
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": format!("pkg:cargo/{name}@{version}"),
            }],
        });
        if registry {
            let sum = checksums
                .get(&(name, version))
                .with_context(|| format!("Cargo.lock pins no checksum for {name} {version}"))?;
            entry["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": sum}]);
        }
        spdx_packages.push(entry);
    }
    let id_of = |id: &str| -> String {
        let p = packages.get(id);
        spdx_id(
            p.and_then(|p| p["name"].as_str()).unwrap_or_default(),
            p.and_then(|p| p["version"].as_str()).unwrap_or_default(),
        )
    };
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": id_of(root),
    })];
    relationships.extend(edges.iter().map(|(from, to)| {
        json!({
            "spdxElementId": id_of(from),
            "relationshipType": "DEPENDS_ON",
            "relatedSpdxElement": id_of(to),
        })
    }));
    let created = humane_utc(build.time)?;
    Ok(json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}", build.package, build.version),
        "documentNamespace": format!(
            "https://hugepage-agent.invalid/spdx/{}-{}-{}",
            build.package, build.version, build.revision
        ),
        "creationInfo": {
            "created": created,
            "creators": ["Tool: cargo-xtask-image"],
            "comment": format!(
                "the {} binary for {}, commit {}, built --locked with {}",
                build.package, build.target, build.revision, build.toolchains.join(" and ")
            ),
        },
        "packages": spdx_packages,
        "relationships": relationships,
    }))
}

/// Writes the document for `build` of the workspace at `root` to `out`; returns how many
/// packages it lists.
pub fn write(root: &Path, build: &Build<'_>, out: &Path) -> Result<usize> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            build.target,
        ])
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata --locked: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: Value =
        serde_json::from_slice(&output.stdout).context("cargo metadata's output")?;
    let lock = fs::read_to_string(root.join("Cargo.lock")).context("reading Cargo.lock")?;
    let doc = document(build, &metadata, &lock)?;
    let count = doc["packages"].as_array().map_or(0, Vec::len);
    fs::write(out, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(count)
}

/// Whether a package is a proc macro (its library target's kind).
fn is_proc_macro(package: &Value) -> bool {
    package["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| {
            t["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k == "proc-macro")
        })
}

/// `(name, version)` → the SHA-256 `Cargo.lock` pins.
fn lock_checksums(lock: &str) -> BTreeMap<(&str, &str), &str> {
    let mut out = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block.lines().find_map(|line| {
                let (k, v) = line.split_once(" = ")?;
                (k == key).then(|| v.trim_matches('"'))
            })
        };
        if let (Some(name), Some(version), Some(sum)) =
            (field("name"), field("version"), field("checksum"))
        {
            out.insert((name, version), sum);
        }
    }
    out
}

/// An SPDX element id for a package: letters, digits, `.` and `-` only.
fn spdx_id(name: &str, version: &str) -> String {
    let clean: String = format!("{name}-{version}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("SPDXRef-Package-{clean}")
}

/// `seconds` since the epoch as SPDX writes times (`YYYY-MM-DDThh:mm:ssZ`).
fn humane_utc(seconds: i64) -> Result<String> {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(1970..=9999).contains(&year) {
        bail!("a commit time of {seconds} s is not a date SPDX can write");
    }
    Ok(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_runtime_crates_are_listed_with_their_pinned_checksums_and_build_tools_are_not() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = tempfile::tempdir().expect("dir");
        let path = out.path().join("sbom.json");
        let build = Build {
            package: "hugepage-agent",
            version: "0.1.0",
            revision: "abc",
            time: 1_764_288_000,
            target: "x86_64-unknown-linux-gnu",
            toolchains: vec!["rustc 1.95.0".into()],
        };
        let count = write(&root, &build, &path).expect("the document");
        let doc: Value = serde_json::from_slice(&fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(doc["creationInfo"]["created"], "2025-11-28T00:00:00Z");
        let packages = doc["packages"].as_array().expect("packages");
        assert_eq!(packages.len(), count);
        let named = |name: &str| packages.iter().find(|p| p["name"] == name);
        let tokio = named("tokio").expect("tokio is in the binary");
        assert_eq!(
            tokio["checksums"][0]["checksumValue"]
                .as_str()
                .map(str::len),
            Some(64)
        );
        assert!(named("aya").is_some());
        // Build-time only: the eBPF build helper and the derive macros' parser.
        assert!(named("aya-build").is_none(), "a build dependency listed");
        assert!(named("syn").is_none(), "a proc macro's dependency listed");
        let agent = named("hugepage-agent").expect("the agent");
        assert_eq!(agent["downloadLocation"], "NOASSERTION");
        let describes = &doc["relationships"][0];
        assert_eq!(describes["relatedSpdxElement"], agent["SPDXID"]);
        // Every package a relationship names is listed.
        for r in doc["relationships"].as_array().expect("relationships") {
            let to = &r["relatedSpdxElement"];
            assert!(packages.iter().any(|p| &p["SPDXID"] == to), "{r}");
        }
    }
}
