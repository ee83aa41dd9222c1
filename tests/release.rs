//! `cargo xtask release`, run as an operator's build would run it, and its bundle used as the
//! install page says: the checksums verify with `sha256sum -c`; the OCI archive is consistent
//! (its manifest's digest is the SHA-256 of the blob it names, and its one layer holds the agent
//! binary); every manifest validates strictly for the oldest and newest Kubernetes supported,
//! holds what its choice of components adds and nothing it leaves out, and names the agent's
//! image by that digest only; pushed to a real registry with `skopeo copy --preserve-digests`,
//! the tag names that digest; an operator's overlay that moves the image to a registry keeps the
//! digest; the release notes are the version's section of `CHANGELOG.md`. Builds the image
//! (podman), so it needs what `cargo xtask image` needs; it changes nothing on the host but
//! podman's image store, where the image of that name is replaced by the same build.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use hugepage_agent_tests::{
    free_port,
    manifests::{NEWEST, OLDEST, validate},
    peers::workspace,
    rendered::{Rendered, yaml_documents},
};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The files of a bundle besides `SHA256SUMS`, and what each manifest must hold and must not.
const MANIFESTS: [(&str, &[&str], &[&str]); 6] = [
    (
        "install.yaml",
        &["Certificate"],
        &["Deployment", "PodMonitor"],
    ),
    (
        "install-webhook.yaml",
        &["ValidatingWebhookConfiguration"],
        &["ConfigMap", "PodMonitor"],
    ),
    (
        "install-webhook-scheduler.yaml",
        &["ValidatingWebhookConfiguration", "ConfigMap"],
        &["PodMonitor"],
    ),
    (
        "install-prometheus-operator.yaml",
        &["PodMonitor", "PrometheusRule"],
        &["Deployment"],
    ),
    (
        "install-webhook-prometheus-operator.yaml",
        &["ValidatingWebhookConfiguration", "PodMonitor"],
        &["ConfigMap"],
    ),
    (
        "install-webhook-scheduler-prometheus-operator.yaml",
        &["ValidatingWebhookConfiguration", "ConfigMap", "PodMonitor"],
        &[],
    ),
];

fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The mount points of this mount namespace, in /proc/mounts order.
fn mount_points() -> Vec<String> {
    fs::read_to_string("/proc/mounts")
        .expect("/proc/mounts")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
        .collect()
}

fn bundle(into: &Path) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = into.display().to_string();
    // --allow-dirty: the test runs on whatever tree it is given; the notes then say so.
    run(
        &cargo,
        &["xtask", "release", "--out", &out, "--allow-dirty"],
        &workspace(),
    );
    into.join(format!("hugepage-agent-{VERSION}"))
}

/// The images of every container of every workload of `documents`.
fn images(documents: &[Value]) -> Vec<String> {
    let mut found = Vec::new();
    for document in documents {
        let spec = &document["spec"]["template"]["spec"];
        for list in ["initContainers", "containers"] {
            for container in spec[list].as_array().into_iter().flatten() {
                found.push(container["image"].as_str().expect("an image").to_owned());
            }
        }
    }
    found
}

/// A registry on loopback, stopped on drop.
struct Registry {
    child: std::process::Child,
    address: String,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        let address = format!("127.0.0.1:{}", free_port());
        let config = dir.join("registry.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
                dir.join("registry").display()
            ),
        )
        .expect("the registry's configuration");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            // Its log (every blob probe a "blob unknown" error) in a file beside its data.
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(dir.join("registry.log")).expect("the registry's log"))
            .spawn()
            .expect("start docker-registry (cargo xtask setup installs it)");
        let registry = Registry { child, address };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not listen on {} within 10 s",
                registry.address
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_release_bundle_installs_the_image_it_carries_by_digest() {
    let out = tempfile::Builder::new()
        .prefix("hugepage-agent-release-")
        .tempdir()
        .expect("a temporary directory");
    let mounts = mount_points();
    let dir = bundle(out.path());
    // Building and packing the image leaves no mount behind (skopeo reading podman's storage
    // left its overlay directory mounted on itself).
    assert_eq!(
        mount_points(),
        mounts,
        "mount points before and after the release"
    );

    // Every file is listed, and each checksum verifies.
    let sums = run("sha256sum", &["-c", "SHA256SUMS"], &dir);
    let archive = format!("hugepage-agent-{VERSION}-amd64.oci.tar");
    let sbom = format!("hugepage-agent-{VERSION}.spdx.json");
    let mut expected: Vec<&str> = MANIFESTS.iter().map(|(file, _, _)| *file).collect();
    expected.extend([archive.as_str(), sbom.as_str(), "RELEASE-NOTES.md"]);
    for file in &expected {
        assert!(sums.contains(&format!("{file}: OK")), "{file}: {sums}");
    }
    let mut present: Vec<String> = fs::read_dir(&dir)
        .expect("the bundle")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    present.sort();
    let mut listed: Vec<String> = expected.iter().map(|f| (*f).to_owned()).collect();
    listed.push("SHA256SUMS".into());
    listed.sort();
    assert_eq!(present, listed, "the bundle holds exactly its files");

    // The archive: one manifest, its digest the SHA-256 of its blob, one layer with the binary.
    let unpacked = out.path().join("archive");
    fs::create_dir(&unpacked).expect("mkdir");
    run(
        "tar",
        &["-xf", &dir.join(&archive).display().to_string()],
        &unpacked,
    );
    let index: Value =
        serde_json::from_slice(&fs::read(unpacked.join("index.json")).expect("index.json"))
            .expect("JSON");
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .expect("the manifest's digest")
        .to_owned();
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let blob = unpacked.join("blobs/sha256").join(hex);
    let sum = run("sha256sum", &[&blob.display().to_string()], &unpacked);
    assert!(sum.starts_with(hex), "{sum} for the blob named {hex}");
    let manifest: Value =
        serde_json::from_slice(&fs::read(&blob).expect("the manifest blob")).expect("JSON");
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer = layers[0]["digest"].as_str().expect("a layer digest");
    let layer = unpacked
        .join("blobs/sha256")
        .join(layer.trim_start_matches("sha256:"));
    let listing = run("tar", &["-tf", &layer.display().to_string()], &unpacked);
    assert!(
        listing
            .lines()
            .any(|l| l.trim_start_matches("./") == "hugepage-agent"),
        "{listing}"
    );

    // Each manifest: strictly valid, its components' objects, the image by that digest.
    let ours = format!("hugepage-agent@{digest}");
    for (file, has, lacks) in MANIFESTS {
        let yaml = fs::read_to_string(dir.join(file)).expect("a manifest");
        let rendered = Rendered {
            documents: yaml_documents(&yaml),
            yaml,
        };
        for version in [OLDEST, NEWEST] {
            let (ok, report) = validate(&rendered, version);
            assert!(ok, "{file} against {version}:\n{report}");
        }
        let kinds: Vec<&str> = rendered
            .documents
            .iter()
            .filter_map(|d| d["kind"].as_str())
            .collect();
        assert!(kinds.contains(&"DaemonSet"), "{file}: {kinds:?}");
        for kind in has {
            assert!(kinds.contains(kind), "{file} lacks a {kind}: {kinds:?}");
        }
        for kind in lacks {
            assert!(!kinds.contains(kind), "{file} has a {kind}: {kinds:?}");
        }
        let agent_images: Vec<String> = images(&rendered.documents)
            .into_iter()
            .filter(|image| !image.starts_with("registry.k8s.io/"))
            .collect();
        assert!(!agent_images.is_empty(), "{file}");
        for image in &agent_images {
            assert_eq!(image, &ours, "{file}");
        }
    }

    // Pushed to a real registry (the CNCF Distribution registry, Debian's docker-registry, on
    // loopback over plain HTTP) as the install page says, the tag names that digest.
    let registry = Registry::start(out.path());
    let tagged = format!("{}/platform/hugepage-agent:{VERSION}", registry.address);
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
            &format!("oci-archive:{}", dir.join(&archive).display()),
            &format!("docker://{tagged}"),
        ],
        out.path(),
    );
    let pushed = run(
        "skopeo",
        &[
            "inspect",
            "--tls-verify=false",
            "--format",
            "{{.Digest}}",
            &format!("docker://{tagged}"),
        ],
        out.path(),
    );
    assert_eq!(pushed.trim(), digest, "the registry's digest for {tagged}");
    drop(registry);

    // An operator's overlay moving the image to a registry keeps the digest.
    let overlay = out.path().join("overlay");
    fs::create_dir(&overlay).expect("mkdir");
    fs::copy(
        dir.join("install-webhook.yaml"),
        overlay.join("install-webhook.yaml"),
    )
    .expect("copy");
    fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [install-webhook.yaml]\nimages:\n  - name: hugepage-agent\n    newName: registry.example.com/platform/hugepage-agent\n",
    )
    .expect("the overlay");
    let moved = run("kubectl", &["kustomize", "."], &overlay);
    let moved = images(&yaml_documents(&moved));
    let pushed = format!("registry.example.com/platform/{ours}");
    assert_eq!(
        moved.iter().filter(|i| **i == pushed).count(),
        2,
        "the DaemonSet and the webhook's Deployment: {moved:?}"
    );

    // The notes are the version's section of the changelog, with the commit and the digest.
    let changelog = fs::read_to_string(workspace().join("CHANGELOG.md")).expect("CHANGELOG.md");
    let heading = format!("## [{VERSION}]");
    let section: String = changelog
        .lines()
        .skip_while(|l| !l.starts_with(&heading))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!section.trim().is_empty(), "CHANGELOG.md has {heading}");
    let notes = fs::read_to_string(dir.join("RELEASE-NOTES.md")).expect("the notes");
    assert!(notes.contains(section.trim()), "{notes}");
    assert!(notes.contains(&ours), "{notes}");
}
