//! The guest's initramfs, an uncompressed cpio archive (`newc`, the format the kernel unpacks)
//! written here without any tool: busybox (static, Debian's `busybox-static`), the init script
//! (`tests/vm/init`), the kernel modules with their load order, and the shared libraries the
//! binaries passed in over 9p need (found with `ldd`, put where `ldd` found them, so that those
//! binaries run in the guest as built, the dynamic loader included).

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};

use super::kernel::Kernel;
use crate::cmd;

/// Debian's static busybox.
const BUSYBOX: &str = "/bin/busybox";

/// Writes the archive to `out`; `binaries` are the programs whose libraries the guest needs.
pub fn build(out: &Path, init: &Path, kernel: &Kernel, binaries: &[PathBuf]) -> Result<()> {
    let mut cpio = Cpio::default();
    for dir in [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib/modules",
        "mnt",
        "proc",
        "root",
        "run",
        "sys",
        "tmp",
    ] {
        cpio.dir(dir);
    }
    cpio.file("init", 0o755, &read(init)?);
    cpio.file("bin/busybox", 0o755, &read(Path::new(BUSYBOX))?);
    for name in &kernel.load_order {
        let file = kernel.modules_dir.join(format!("{name}.ko"));
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, &read(&file)?);
    }
    cpio.file(
        "etc/modules-order",
        0o644,
        format!("{}\n", kernel.load_order.join("\n")).as_bytes(),
    );
    for lib in libraries(binaries)? {
        let rel = lib.strip_prefix("/").unwrap_or(&lib);
        let mut parents: Vec<&Path> = rel.ancestors().skip(1).collect();
        parents.reverse();
        for parent in parents {
            let parent = parent.to_string_lossy();
            if !parent.is_empty() && !cpio.has(&parent) {
                cpio.dir(&parent);
            }
        }
        cpio.file(&rel.to_string_lossy(), 0o755, &read(&lib)?);
    }
    fs::write(out, cpio.finish()).with_context(|| format!("writing {}", out.display()))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Every shared library `ldd` lists for `binaries`, the dynamic loader included.
fn libraries(binaries: &[PathBuf]) -> Result<BTreeSet<PathBuf>> {
    let mut libs = BTreeSet::new();
    for binary in binaries {
        let listing = cmd::output("ldd", &[&binary.display().to_string()])?;
        for line in listing.lines() {
            if line.contains("not found") {
                bail!("{}: {}", binary.display(), line.trim());
            }
            // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux… (0x…)`;
            // the vDSO has no file.
            let path = line
                .split_once("=>")
                .map_or(line, |(_, right)| right)
                .split_whitespace()
                .next()
                .unwrap_or_default();
            if path.starts_with('/') {
                libs.insert(PathBuf::from(path));
            }
        }
    }
    Ok(libs)
}

/// A `newc` cpio archive being written.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    names: BTreeSet<String>,
}

impl Cpio {
    fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | mode, data);
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.names.insert(name.to_owned());
        let ino = self.names.len() as u32;
        let nlink = if mode & 0o040_000 != 0 { 2 } else { 1 };
        let fields = [
            ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::Cpio;

    #[test]
    fn entries_are_newc_headers_padded_to_four_bytes() {
        let mut cpio = Cpio::default();
        cpio.file("init", 0o755, b"#!x\n");
        let bytes = cpio.finish();
        let header = std::str::from_utf8(&bytes[..110]).expect("ASCII header");
        assert!(header.starts_with("070701"));
        // mode, file size and name size (with its NUL) as 8 hex digits each.
        assert_eq!(&header[14..22], "000081ed");
        assert_eq!(&header[54..62], "00000004");
        assert_eq!(&header[94..102], "00000005");
        // 110 header bytes + "init\0" = 115, padded to 116; then the data.
        assert_eq!(&bytes[110..115], b"init\0");
        assert_eq!(&bytes[116..120], b"#!x\n");
        assert!(bytes[120..].starts_with(b"070701"));
        assert_eq!(bytes.len() % 4, 0);
    }
}
