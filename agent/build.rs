//! Builds the kernel programs (`ebpf/`) with the nightly toolchain and bpf-linker, for embedding.
//!
//! `AYA_BUILD_SKIP=1` skips that build (for `cargo check`/clippy where the eBPF toolchain is
//! absent) and embeds an empty object instead; such a binary reports "no eBPF object" at start-up
//! and runs on sysfs alone (`--ebpf auto`) or refuses to start (`--ebpf on`).
use std::{fs, path::PathBuf};

const OBJECT: &str = "hugepage-agent-probes";

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let skip =
        std::env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        fs::write(out_dir.join(OBJECT), [])?;
        return Ok(());
    }
    let package = aya_build::Package {
        name: "hugepage-agent-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}
