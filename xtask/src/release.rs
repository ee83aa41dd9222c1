//! `cargo xtask release [--out DIR] [--source URL] [--allow-dirty]`: what an operator installs,
//! as one directory per version, `hugepage-agent-<version>/`:
//!
//! * the image as an OCI archive (`hugepage-agent-<version>-amd64.oci.tar`, what
//!   [`crate::image`] built, its layer gzip-compressed as a registry keeps it) and its SPDX SBOM;
//! * one rendered manifest per common choice ([`VARIANTS`]), `kubectl kustomize` of `deploy/` with
//!   the components of that choice, every reference to the agent's image replaced by the
//!   archive's manifest digest (`hugepage-agent@sha256:…`), so that what runs is what was built,
//!   whatever tag a registry later moves;
//! * `RELEASE-NOTES.md`, the version's section of `CHANGELOG.md` (no section, no release);
//! * `SHA256SUMS` of every file above, in `sha256sum -c`'s format.
//!
//! A bundle is cut from a commit: a tree whose tracked files differ from HEAD is refused unless
//! `--allow-dirty` (the bundle then says `-dirty` in its notes). `tests/release.rs` runs this
//! command and checks the bundle as an operator would use it.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    cmd::{self, Env},
    image,
};

/// One rendered manifest of the bundle: its file name and the components of `deploy/` it adds to
/// the base. Every choice has cert-manager issue the certificates (docs/install/certificates.md
/// says how to do without it).
pub struct Variant {
    pub file: &'static str,
    pub components: &'static [&'static str],
}

/// The common choices: the agents alone; with the webhook (a control plane whose kube-scheduler
/// you configure); with the webhook and the second scheduler (a managed control plane); each
/// with and without the Prometheus Operator's PodMonitors and rules.
pub const VARIANTS: [Variant; 6] = [
    Variant {
        file: "install.yaml",
        components: &["cert-manager"],
    },
    Variant {
        file: "install-webhook.yaml",
        components: &["cert-manager", "webhook"],
    },
    Variant {
        file: "install-webhook-scheduler.yaml",
        components: &["cert-manager", "webhook", "scheduler"],
    },
    Variant {
        file: "install-prometheus-operator.yaml",
        components: &["cert-manager", "prometheus-operator"],
    },
    Variant {
        file: "install-webhook-prometheus-operator.yaml",
        components: &["cert-manager", "webhook", "prometheus-operator"],
    },
    Variant {
        file: "install-webhook-scheduler-prometheus-operator.yaml",
        components: &[
            "cert-manager",
            "webhook",
            "scheduler",
            "prometheus-operator",
        ],
    },
];

/// The name the manifests of `deploy/` give the agent's image (the DaemonSet's and the webhook's).
const IMAGE_NAME: &str = "hugepage-agent";

/// Builds the image and writes the bundle; returns its directory.
pub fn run(
    env: &Env,
    out: Option<PathBuf>,
    source: Option<&str>,
    allow_dirty: bool,
) -> Result<PathBuf> {
    let built = image::build(env, source)?;
    if built.revision.ends_with("-dirty") && !allow_dirty {
        bail!(
            "tracked files differ from HEAD ({}): a release is cut from a commit (commit, or pass --allow-dirty for a bundle that says it is not one)",
            built.revision
        );
    }
    let root = cmd::workspace();
    let notes = changelog_section(
        &fs::read_to_string(root.join("CHANGELOG.md")).context("reading CHANGELOG.md")?,
        &built.version,
    )?;
    let dir = out
        .unwrap_or_else(|| cmd::target_dir().join("release"))
        .join(format!("hugepage-agent-{}", built.version));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    cmd::step(&format!(
        "the image as an OCI archive, into {}",
        dir.display()
    ));
    let archive = format!("hugepage-agent-{}-amd64.oci.tar", built.version);
    // Layers gzip-compressed in the archive, as a registry keeps them: `skopeo copy
    // --preserve-digests` to a registry then keeps the manifest, and so the digest, as it is.
    // podman, not skopeo, reads its own storage: skopeo leaves the storage's overlay directory
    // mounted on itself, podman unmounts it when done.
    let mut save = Command::new("podman");
    save.args(["push", "--quiet", "--compression-format", "gzip"])
        .arg(&built.reference)
        .arg(format!(
            "oci-archive:{}:{}",
            dir.join(&archive).display(),
            built.version
        ));
    cmd::run(save)?;
    let digest = archive_digest(&dir.join(&archive))?;
    let sbom = format!("hugepage-agent-{}.spdx.json", built.version);
    fs::copy(&built.sbom, dir.join(&sbom))
        .with_context(|| format!("copying {}", built.sbom.display()))?;

    cmd::step(&format!(
        "{} manifests, the image by its digest {digest}",
        VARIANTS.len()
    ));
    let overlays = root.join(OVERLAYS);
    for variant in &VARIANTS {
        let rendered = render(&overlays, variant, &digest)?;
        ensure_by_digest(&rendered, &digest)
            .with_context(|| format!("{} as rendered", variant.file))?;
        fs::write(dir.join(variant.file), rendered)?;
    }
    let _ = fs::remove_dir_all(&overlays);

    let dirty = if built.revision.ends_with("-dirty") {
        "\n\nThis bundle was built from a tree that differs from its commit (`--allow-dirty`).\n"
    } else {
        "\n"
    };
    fs::write(
        dir.join("RELEASE-NOTES.md"),
        format!(
            "# hugepage-agent {}\n\nCommit {}; image `{IMAGE_NAME}@{digest}`.\n\n{notes}{dirty}",
            built.version, built.revision
        ),
    )?;

    let mut files: Vec<String> = VARIANTS.iter().map(|v| v.file.to_owned()).collect();
    files.extend([archive, sbom, "RELEASE-NOTES.md".to_owned()]);
    files.sort();
    let mut sums = Command::new("sha256sum");
    sums.args(&files).current_dir(&dir);
    let out = sums.output().context("starting sha256sum")?;
    ensure!(
        out.status.success(),
        "sha256sum: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::write(dir.join("SHA256SUMS"), &out.stdout)?;
    println!(
        "release bundle: {} ({} files and SHA256SUMS; docs/install/release.md says how to push and apply it)",
        dir.display(),
        files.len()
    );
    Ok(dir)
}

/// The section of a Keep-a-Changelog file for `version`: the lines after its `## [version]`
/// heading up to the next `## ` heading, trimmed; an error when it has none or it is empty.
pub fn changelog_section(changelog: &str, version: &str) -> Result<String> {
    let heading = format!("## [{version}]");
    let mut lines = changelog
        .lines()
        .skip_while(|line| !line.starts_with(&heading));
    if lines.next().is_none() {
        bail!(
            "CHANGELOG.md has no section `{heading} …`: write what this version changes before releasing it"
        );
    }
    let section: Vec<&str> = lines.take_while(|line| !line.starts_with("## ")).collect();
    let text = section.join("\n").trim().to_owned();
    if text.is_empty() {
        bail!("CHANGELOG.md's section {heading} is empty");
    }
    Ok(text)
}

/// The digest of the image manifest an OCI archive holds (its `index.json`'s only manifest):
/// what a registry keeps when the archive is copied with `skopeo copy --preserve-digests`.
fn archive_digest(archive: &Path) -> Result<String> {
    let index = cmd::output(
        "tar",
        &["-xOf", &archive.display().to_string(), "index.json"],
    )?;
    manifest_digest(&index)
}

/// The digest of the one manifest of an OCI `index.json`.
pub fn manifest_digest(index: &str) -> Result<String> {
    let index: Value = serde_json::from_str(index).context("the archive's index.json")?;
    let manifests = index["manifests"]
        .as_array()
        .context("index.json has no manifests")?;
    ensure!(
        manifests.len() == 1,
        "index.json lists {} manifests, one expected",
        manifests.len()
    );
    let digest = manifests[0]["digest"]
        .as_str()
        .context("the manifest has no digest")?;
    ensure!(
        digest.len() == 71
            && digest.starts_with("sha256:")
            && digest[7..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{digest:?} is not a sha256 digest"
    );
    Ok(digest.to_owned())
}

/// Where the overlays are written, in the workspace (kustomize takes only relative paths, so
/// they sit at a known depth below `deploy/`'s parent), in the ignored `target/`.
const OVERLAYS: &str = "target/release-overlays";

/// `kubectl kustomize` of an overlay over `deploy/` with the variant's components and the image
/// by digest.
fn render(overlays: &Path, variant: &Variant, digest: &str) -> Result<String> {
    let overlay = overlays.join(variant.file.trim_end_matches(".yaml"));
    fs::create_dir_all(&overlay)?;
    let deploy = Path::new("../../../deploy");
    let mut kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n",
        deploy.display()
    );
    for component in variant.components {
        kustomization.push_str(&format!(
            "  - {}\n",
            deploy.join("components").join(component).display()
        ));
    }
    kustomization.push_str(&format!(
        "images:\n  - name: {IMAGE_NAME}\n    newName: {IMAGE_NAME}\n    digest: {digest}\n"
    ));
    fs::write(overlay.join("kustomization.yaml"), kustomization)?;
    let rendered = cmd::output("kubectl", &["kustomize", &overlay.display().to_string()])?;
    Ok(format!(
        "# hugepage-agent: {} (deploy/ with the components {}), the image by digest.\n{rendered}",
        variant.file,
        variant.components.join(", ")
    ))
}

/// Every `image:` of the agent's in `manifest` is `hugepage-agent@<digest>`, and there is at
/// least one (other images, kube-scheduler's, keep their tags).
pub fn ensure_by_digest(manifest: &str, digest: &str) -> Result<()> {
    let wanted = format!("{IMAGE_NAME}@{digest}");
    let mut ours = 0;
    for line in manifest.lines() {
        let Some(image) = line.trim_start().strip_prefix("image:") else {
            continue;
        };
        let image = image.trim().trim_matches('"');
        let name = image.split(['@', ':']).next().unwrap_or(image);
        if name.rsplit('/').next() == Some(IMAGE_NAME) {
            ensure!(
                image == wanted,
                "the agent's image is {image:?}, not {wanted:?}"
            );
            ours += 1;
        }
    }
    ensure!(ours > 0, "no container runs the agent's image");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHANGELOG: &str = "# Changelog\n\n## [Unreleased]\n\n- next\n\n## [0.2.0] - 2026-12-01\n\n### Added\n- b\n\n## [0.1.0] - 2026-11-28\n\n- a\n";

    #[test]
    fn the_versions_section_is_its_lines_up_to_the_next_heading() {
        assert_eq!(
            changelog_section(CHANGELOG, "0.2.0").unwrap(),
            "### Added\n- b"
        );
        assert_eq!(changelog_section(CHANGELOG, "0.1.0").unwrap(), "- a");
        let missing = changelog_section(CHANGELOG, "0.3.0")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("## [0.3.0]"), "{missing}");
        let empty = changelog_section("## [0.1.0]\n\n## [0.0.9]\n- x\n", "0.1.0");
        assert!(empty.unwrap_err().to_string().contains("empty"));
        // A version that is a prefix of another is not that one.
        assert!(changelog_section("## [0.1.0.1]\n- x\n", "0.1.0").is_err());
    }

    #[test]
    fn the_archives_digest_is_its_one_manifests() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{digest}","size":1}}]}}"#
        );
        assert_eq!(manifest_digest(&index).unwrap(), digest);
        assert!(manifest_digest(r#"{"manifests":[]}"#).is_err());
        assert!(manifest_digest(r#"{"manifests":[{"digest":"sha256:AB"}]}"#).is_err());
        let upper = format!(
            r#"{{"manifests":[{{"digest":"sha256:{}"}}]}}"#,
            "AB".repeat(32)
        );
        assert!(manifest_digest(&upper).is_err());
    }

    #[test]
    fn only_the_agents_image_must_be_by_digest_and_it_must_be_there() {
        let digest = format!("sha256:{}", "0f".repeat(32));
        let good = format!(
            "        image: registry.k8s.io/kube-scheduler:v1.37.0\n        image: hugepage-agent@{digest}\n"
        );
        ensure_by_digest(&good, &digest).unwrap();
        let tagged = "        image: hugepage-agent:0.1.0\n";
        assert!(ensure_by_digest(tagged, &digest).is_err());
        let other = format!("        image: hugepage-agent@sha256:{}\n", "1f".repeat(32));
        assert!(ensure_by_digest(&other, &digest).is_err());
        let registry = format!("        image: localhost/hugepage-agent@{digest}\n");
        assert!(ensure_by_digest(&registry, &digest).is_err());
        assert!(ensure_by_digest("        image: busybox:1\n", &digest).is_err());
    }
}
