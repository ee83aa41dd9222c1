//! Builds the kernel programs (`ebpf/`) with the nightly toolchain and bpf-linker, for embedding.
//!
//! bpf-linker is taken from `PATH`, else from the project's cache, where `cargo xtask setup`
//! installs it (`<cache>/bin/bpf-linker`, the cache being `HUGEPAGE_AGENT_CACHE` or
//! `~/.cache/hugepage-agent`), so that a plain `cargo build` works after the set-up. Without one
//! that runs, the build stops with the command that installs it.
//!
//! `AYA_BUILD_SKIP=1` skips that build (for `cargo check`/clippy where the eBPF toolchain is
//! absent) and embeds an empty object instead; such a binary reports "no eBPF object" at start-up
//! and runs on sysfs alone (`--ebpf auto`) or refuses to start (`--ebpf on`).
//!
//! The nested build (`cargo +nightly build -Z build-std=core --target bpfel-unknown-none`, the
//! flags aya's loader needs: `bpf_target_arch`, debug info, BTF) runs quietly: cargo shows a
//! build script's lines only as warnings, and its progress is not one. What the compiler says
//! of the kernel programs (warnings, errors) is passed on; a failed build shows all it printed.
use std::{
    ffi::OsString,
    fs,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};

const OBJECT: &str = "hugepage-agent-probes";
const LINKER: &str = "bpf-linker";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=HUGEPAGE_AGENT_CACHE");
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        fs::write(out_dir.join(OBJECT), [])?;
        return Ok(());
    }
    if !runs(Path::new(LINKER)) {
        let cached = cache_bin()
            .filter(|bin| runs(&bin.join(LINKER)))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{LINKER} is not on PATH nor in the project's cache: run `cargo xtask setup` once \
                     (it builds {LINKER} against the nightly's LLVM), or build without the eBPF \
                     programs with AYA_BUILD_SKIP=1"
                )
            })?;
        let mut path = OsString::from(cached);
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        // SAFETY: the build script is single-threaded here; the nested cargo inherits PATH.
        unsafe { std::env::set_var("PATH", path) };
    }
    build_ebpf(&out_dir)
}

/// The kernel crate, built for the BPF target by the nightly, its program copied to `out_dir`.
fn build_ebpf(out_dir: &Path) -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf");
    println!("cargo:rerun-if-changed={root}");
    let endian = std::env::var("CARGO_CFG_TARGET_ENDIAN")?;
    let target = if endian == "big" {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    };
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let arch = if arch.starts_with("riscv64") {
        "riscv64".to_owned()
    } else {
        arch
    };
    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = Command::new("rustup");
    cmd.args([
        "run",
        "nightly",
        "cargo",
        "build",
        "--package",
        "hugepage-agent-ebpf",
    ])
    .args([
        "--bins",
        "--release",
        "--message-format=json",
        "-Z",
        "build-std=core",
    ])
    .args(["--target", target])
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(root)
    .env(
        "CARGO_ENCODED_RUSTFLAGS",
        format!("--cfg=bpf_target_arch=\"{arch}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf"),
    )
    // The outer build's compiler is not the nightly's.
    .env_remove("RUSTC")
    .env_remove("RUSTC_WORKSPACE_WRAPPER")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .context("starting the nightly's cargo (rustup run nightly cargo)")?;
    let mut stderr = child.stderr.take().context("the nested build's stderr")?;
    let progress = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .context("the nested build's stdout")?
        .read_to_string(&mut stdout)?;
    let status = child.wait()?;
    let progress = progress.join().unwrap_or_default();
    let mut object = None;
    for message in stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        match message["reason"].as_str() {
            Some("compiler-message") => {
                let rendered = message["message"]["rendered"].as_str().unwrap_or_default();
                for line in rendered.lines() {
                    println!("cargo:warning={line}");
                }
            }
            Some("compiler-artifact") if message["target"]["name"] == OBJECT => {
                object = message["executable"].as_str().map(PathBuf::from);
            }
            _ => {}
        }
    }
    if !status.success() {
        bail!("the eBPF programs did not build ({status}):\n{progress}");
    }
    let object =
        object.with_context(|| format!("the nested build named no {OBJECT}:\n{progress}"))?;
    fs::copy(&object, out_dir.join(OBJECT))
        .with_context(|| format!("copying {} into OUT_DIR", object.display()))?;
    Ok(())
}

/// `<cache>/bin`, where `cargo xtask setup` links the current bpf-linker.
fn cache_bin() -> Option<PathBuf> {
    let cache = match std::env::var_os("HUGEPAGE_AGENT_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/hugepage-agent"),
    };
    Some(cache.join("bin"))
}

/// Whether `bin --version` runs (found on PATH when `bin` is a bare name).
fn runs(bin: &Path) -> bool {
    Command::new(bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}
