//! `cargo xtask image`: the agent's OCI image, built offline with Debian's podman from
//! `deploy/image/Containerfile` (`FROM scratch`: nothing but the binary), then checked by
//! inspection, since these machines cannot run containers: entrypoint, user, labels, size, one
//! layer, and the binary inside byte for byte the one built.
//!
//! The binary must run without a C library in the image, so it is linked statically: the release
//! build for `x86_64-unknown-linux-gnu` with `+crt-static` (glibc's static libraries, the same
//! allocator and behaviour as the dynamically linked binary the benchmarks measured), without
//! its symbol table (a panic still prints its message and location; 21.4 MB). Host names (an OTLP collector's) still resolve from
//! `/etc/hosts` and DNS, which the kubelet mounts into every pod: glibc 2.34 and later carry
//! the `files` and `dns` lookups in libc itself, static or not (checked in a chroot holding only
//! the binary and an `/etc/hosts`).
//! The build fails unless the result has no program interpreter (`PT_INTERP`): a binary that
//! asks for `ld-linux` cannot start in a scratch image.
//!
//! The binary is built `--locked` (the crates `Cargo.lock` pins, no other) by the pinned stable
//! toolchain ([`PINNED_RUSTC`]; another one fails the build, naming both), and an SPDX SBOM of
//! what it links in is written beside the image ([`crate::sbom`]), naming the toolchains.
//!
//! Labels: `org.opencontainers.image.version` is the agent crate's version (the tag too),
//! `revision` the commit (`-dirty` when tracked files differ from it), `source` `--source` or
//! the `origin` remote (the clone's own path as a `file://` URL when it has none), `licenses`
//! the workspace's license expression. The image's timestamp is the commit's, so the same
//! binary gives the same image.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    cmd::{self, Env},
    sbom, setup,
};

/// The image's name; the tag is the agent's version. `deploy/daemonset.yaml` names the same.
pub const NAME: &str = "localhost/hugepage-agent";
/// The size the image must stay under, in bytes.
const MAX_BYTES: u64 = 25_000_000;
const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The stable toolchain the shipped binary is built with (`rustc -V`'s version).
pub const PINNED_RUSTC: &str = "1.95.0";
/// What the image runs.
const ENTRYPOINT: &str = "/hugepage-agent";
const USER: &str = "0:0";
/// Debian packages that build, inspect and copy images.
const PACKAGES: [&str; 3] = ["podman", "buildah", "skopeo"];

/// What [`build`] made: the image's reference in podman's storage, its version and commit, and
/// the SBOM written beside it.
pub struct Built {
    pub reference: String,
    pub version: String,
    pub revision: String,
    pub sbom: PathBuf,
}

/// Builds the static binary and the image, and checks both.
pub fn build(env: &Env, source: Option<&str>) -> Result<Built> {
    setup::ensure_debian_packages(&PACKAGES)?;
    let root = cmd::workspace();
    let version = toml_string(&root.join("agent/Cargo.toml"), "version")?;
    let labels = Labels {
        version: version.clone(),
        revision: revision()?,
        source: match source {
            Some(url) => url.to_owned(),
            None => origin_url().unwrap_or_else(|| format!("file://{}", root.display())),
        },
        licenses: toml_string(&root.join("Cargo.toml"), "license")?,
    };
    let toolchains = toolchains()?;
    let binary = static_binary(env)?;
    let reference = format!("{NAME}:{version}");
    let sbom = cmd::target_dir().join(format!("hugepage-agent-{version}.spdx.json"));
    let packages = sbom::write(
        &root,
        &sbom::Build {
            package: "hugepage-agent",
            version: &version,
            revision: &labels.revision,
            time: commit_time()?.parse().context("the commit's time")?,
            target: TARGET,
            toolchains,
        },
        &sbom,
    )?;
    println!("SBOM (SPDX 2.3): {} ({packages} packages)", sbom.display());

    cmd::step(&format!(
        "building {reference} from deploy/image/Containerfile"
    ));
    let context = cmd::target_dir().join("image-context");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context)?;
    fs::copy(&binary, context.join("hugepage-agent"))
        .with_context(|| format!("copying {} into the build context", binary.display()))?;
    let mut build = Command::new("podman");
    build
        .args([
            "build",
            "--pull=never",
            "--network=none",
            "--layers=false",
            "--timestamp",
        ])
        .arg(commit_time()?)
        .arg("--file")
        .arg(root.join("deploy/image/Containerfile"))
        .args(labels.build_args())
        .args(["--tag", &reference])
        .arg(&context);
    cmd::run(build)?;

    cmd::step("checking the image");
    let bytes = check(&reference, &labels, &binary)?;
    println!(
        "{reference}: {:.1} MB, entrypoint {ENTRYPOINT}, user {USER}, labels {}, one layer holding the binary built ({})",
        bytes as f64 / 1e6,
        labels.describe(),
        binary.display()
    );
    println!(
        "to load it elsewhere: podman save --format oci-archive -o hugepage-agent.tar {reference}"
    );
    Ok(Built {
        reference,
        version,
        revision: labels.revision,
        sbom,
    })
}

/// `rustc -V` of the stable toolchain, which must be [`PINNED_RUSTC`], and of the nightly that
/// builds the eBPF object.
fn toolchains() -> Result<Vec<String>> {
    let stable = cmd::output("rustc", &["-V"])?;
    let version = stable.split_whitespace().nth(1).unwrap_or_default();
    if version != PINNED_RUSTC {
        bail!(
            "the image is built with rustc {PINNED_RUSTC} (xtask/src/image.rs PINNED_RUSTC), and this machine's stable is {stable:?}: install {PINNED_RUSTC}, or change the pin in a commit of its own"
        );
    }
    let nightly = cmd::output("rustc", &["+nightly", "-V"])?;
    Ok(vec![stable.trim().to_owned(), nightly.trim().to_owned()])
}

/// The release agent, linked statically; fails when it still needs a program interpreter.
fn static_binary(env: &Env) -> Result<PathBuf> {
    cmd::step("the release agent, statically linked");
    let mut build = cmd::cargo_command(
        env,
        &[
            "build",
            "--release",
            "--locked",
            "--package",
            "hugepage-agent",
            "--target",
            TARGET,
        ],
    );
    // Only for the target: build scripts and proc macros stay dynamically linked.
    build.env(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "-C target-feature=+crt-static",
    );
    // The shipped binary without its symbol table (a quarter of it since the webhook brought
    // kube-rs and the Kubernetes types: 27.8 MB with, 21.4 MB without). Unwinding tables stay,
    // so a panic still unwinds and prints its message and location; a backtrace shows addresses.
    build.env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    cmd::run(build)?;
    let binary = cmd::target_dir()
        .join(TARGET)
        .join("release/hugepage-agent");
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    if let Some(interpreter) = interpreter(&elf)? {
        bail!(
            "{} asks for the program interpreter {interpreter}: it would not start in a scratch image",
            binary.display()
        );
    }
    Ok(binary)
}

/// The program interpreter an ELF64 little-endian executable names (`PT_INTERP`), if any.
fn interpreter(elf: &[u8]) -> Result<Option<String>> {
    ensure!(
        elf.get(..6) == Some(b"\x7fELF\x02\x01".as_slice()),
        "not a 64-bit little-endian ELF file"
    );
    let u16_at = |at: usize| -> Result<usize> {
        let b = elf.get(at..at + 2).context("truncated ELF header")?;
        Ok(usize::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u64_at = |at: usize| -> Result<usize> {
        let b = elf.get(at..at + 8).context("truncated ELF file")?;
        let mut word = [0; 8];
        word.copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(word)).context("ELF offset beyond memory")
    };
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..phnum {
        let header = phoff + i * phentsize;
        let kind = elf
            .get(header..header + 4)
            .context("truncated program header")?;
        if kind == 3u32.to_le_bytes() {
            let (offset, size) = (u64_at(header + 8)?, u64_at(header + 32)?);
            let name = elf
                .get(offset..offset + size)
                .context("PT_INTERP beyond the file")?;
            let name = String::from_utf8_lossy(name);
            return Ok(Some(name.trim_end_matches('\0').to_owned()));
        }
    }
    Ok(None)
}

struct Labels {
    version: String,
    revision: String,
    source: String,
    licenses: String,
}

impl Labels {
    fn pairs(&self) -> [(&'static str, &str); 4] {
        [
            ("VERSION", &self.version),
            ("REVISION", &self.revision),
            ("SOURCE", &self.source),
            ("LICENSES", &self.licenses),
        ]
    }

    fn build_args(&self) -> Vec<String> {
        self.pairs()
            .iter()
            .flat_map(|(k, v)| ["--build-arg".to_owned(), format!("{k}={v}")])
            .collect()
    }

    /// The labels the image must carry.
    fn expected(&self) -> [(String, &str); 4] {
        self.pairs()
            .map(|(k, v)| (format!("org.opencontainers.image.{}", k.to_lowercase()), v))
    }

    fn describe(&self) -> String {
        self.expected()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Checks the built image by inspection and by extraction; returns its size.
fn check(reference: &str, labels: &Labels, binary: &Path) -> Result<u64> {
    let inspect: Value =
        serde_json::from_str(&cmd::output("podman", &["image", "inspect", reference])?)
            .context("podman image inspect printed no JSON")?;
    let image = &inspect[0];
    let config = &image["Config"];
    ensure!(
        config["Entrypoint"] == serde_json::json!([ENTRYPOINT]),
        "{reference}: entrypoint {} (expected [{ENTRYPOINT:?}])",
        config["Entrypoint"]
    );
    ensure!(
        config["User"] == USER,
        "{reference}: user {} (expected {USER:?})",
        config["User"]
    );
    for (key, value) in labels.expected() {
        ensure!(
            config["Labels"][&key] == value,
            "{reference}: label {key} is {} (expected {value:?})",
            config["Labels"][&key]
        );
    }
    let layers = image["RootFS"]["Layers"].as_array().map_or(0, Vec::len);
    ensure!(layers == 1, "{reference}: {layers} layers (expected one)");
    let bytes = image["Size"]
        .as_u64()
        .context("podman image inspect gave no Size")?;
    ensure!(
        bytes <= MAX_BYTES,
        "{reference} is {bytes} bytes, over the {MAX_BYTES} allowed"
    );

    let dir = cmd::target_dir().join("image-check");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let files = extract(reference, &dir)?;
    ensure!(
        files == ["hugepage-agent"],
        "{reference}: the layer holds {files:?} (expected the binary alone)"
    );
    let inside = fs::read(dir.join("rootfs/hugepage-agent"))?;
    let built = fs::read(binary)?;
    ensure!(
        inside == built,
        "{reference}: /hugepage-agent differs from {}",
        binary.display()
    );
    fs::remove_dir_all(&dir)?;
    Ok(bytes)
}

/// `podman save` of `reference` unpacked into `dir/rootfs`; returns the files of its layers.
fn extract(reference: &str, dir: &Path) -> Result<Vec<String>> {
    let archive = dir.join("image.tar");
    let mut save = Command::new("podman");
    save.args(["save", "--format", "docker-archive", "--output"])
        .arg(&archive)
        .arg(reference);
    cmd::run(save)?;
    let unpacked = dir.join("archive");
    fs::create_dir_all(&unpacked)?;
    tar(&["-xf"], &archive, &unpacked)?;
    let manifest: Value = serde_json::from_slice(&fs::read(unpacked.join("manifest.json"))?)
        .context("the saved image's manifest.json")?;
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(&rootfs)?;
    let mut files = Vec::new();
    for layer in manifest[0]["Layers"].as_array().into_iter().flatten() {
        let layer = unpacked.join(layer.as_str().context("a layer name")?);
        let listing = cmd::output("tar", &["-tf", &layer.display().to_string()])?;
        files.extend(listing.lines().map(str::to_owned));
        tar(&["-xf"], &layer, &rootfs)?;
    }
    Ok(files)
}

fn tar(flags: &[&str], archive: &Path, into: &Path) -> Result<()> {
    let mut tar = Command::new("tar");
    tar.args(flags).arg(archive).arg("-C").arg(into);
    cmd::run(tar)
}

/// The first `key = "value"` of a Cargo manifest (the package's or workspace package's own).
fn toml_string(manifest: &Path, key: &str) -> Result<String> {
    let text =
        fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    text.lines()
        .find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
        })
        .with_context(|| format!("{} has no {key}", manifest.display()))
}

fn git(args: &[&str]) -> Result<String> {
    let root = cmd::workspace().display().to_string();
    let mut all = vec!["-C", root.as_str()];
    all.extend(args);
    Ok(cmd::output("git", &all)?.trim().to_owned())
}

/// The commit, with `-dirty` when tracked files differ from it.
fn revision() -> Result<String> {
    let commit = git(&["rev-parse", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

/// The commit's time, seconds since the epoch, as the image's timestamp.
fn commit_time() -> Result<String> {
    git(&["log", "-1", "--format=%ct"])
}

/// The `origin` remote, without credentials.
fn origin_url() -> Option<String> {
    git(&["remote", "get-url", "origin"])
        .ok()
        .map(|url| without_credentials(&url))
}

/// `url` without a `user[:password]@` before its host.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{interpreter, without_credentials};

    #[test]
    fn credentials_never_reach_the_source_label() {
        assert_eq!(
            without_credentials("https://user:token@example.org/team/hugepage-agent.git"),
            "https://example.org/team/hugepage-agent.git"
        );
        assert_eq!(
            without_credentials("https://example.org/a@b"),
            "https://example.org/a@b"
        );
        assert_eq!(
            without_credentials("git@example.org:team/repo.git"),
            "git@example.org:team/repo.git"
        );
    }

    /// A minimal ELF64 header with one program header of `kind` pointing at `payload`.
    fn elf(kind: u32, payload: &[u8]) -> Vec<u8> {
        let mut file = vec![0u8; 0x40 + 0x38];
        file[..6].copy_from_slice(b"\x7fELF\x02\x01");
        file[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        file[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        file[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        file[0x40..0x44].copy_from_slice(&kind.to_le_bytes());
        let offset = file.len() as u64;
        file[0x48..0x50].copy_from_slice(&offset.to_le_bytes());
        file[0x60..0x68].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        file.extend_from_slice(payload);
        file
    }

    #[test]
    fn a_dynamic_executable_names_its_interpreter_and_a_static_one_none() {
        let dynamic = elf(3, b"/lib64/ld-linux-x86-64.so.2\0");
        assert_eq!(
            interpreter(&dynamic).unwrap().as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(interpreter(&elf(1, b"")).unwrap(), None);
        assert!(interpreter(b"#!/bin/sh\n").is_err());
        let truncated = &dynamic[..0x50];
        assert!(interpreter(truncated).is_err());
    }

    #[test]
    fn this_xtask_binary_is_dynamically_linked() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(interpreter(&me).unwrap().is_some());
    }
}
