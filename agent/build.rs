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
use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

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
    let package = aya_build::Package {
        name: "hugepage-agent-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
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
