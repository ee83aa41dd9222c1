//! The guest's kernels: Debian bookworm's 6.1 and 6.12, each in its generic and its PREEMPT_RT
//! build, the packages the metapackages `linux-image-amd64`, `linux-image-rt-amd64`,
//! `linux-image-6.12-amd64` and `linux-image-6.12-rt-amd64` name (bookworm and
//! bookworm-security), fetched with `apt-get download` and taken apart with `dpkg-deb -x` in a
//! scratch directory (never installed on the host). What the guest needs is kept in the
//! project's cache, `<cache>/vm-kernel/<package>_<version>/`: the bzImage (QEMU's `-kernel` boots
//! it directly), the configuration, and the modules the guest loads (virtio PCI and 9p, with what
//! they depend on; none where the build has them built in) with the order to `insmod` them in,
//! worked out from each module's own `depends=` since the package ships no `modules.dep`. A
//! complete directory (`ready` written last) is reused without asking the archive again; each
//! flavour remembers its current directory in `current-<flavour>`.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use crate::{cmd, setup};

/// The modules the guest needs: virtio over PCI, and 9p over virtio (the shared directory), each
/// with the configuration symbol that says whether the build has it built in.
const WANTED_MODULES: [(&str, &str); 3] = [
    ("virtio_pci", "CONFIG_VIRTIO_PCI"),
    ("9pnet_virtio", "CONFIG_NET_9P_VIRTIO"),
    ("9p", "CONFIG_9P_FS"),
];

/// A kernel the VM test boots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Flavour {
    /// Debian bookworm's 6.1 (`linux-image-amd64`).
    #[value(name = "6.1")]
    V6_1,
    /// Its PREEMPT_RT build (`linux-image-rt-amd64`).
    #[value(name = "6.1-rt")]
    V6_1Rt,
    /// 6.12 from bookworm-security (`linux-image-6.12-amd64`).
    #[value(name = "6.12")]
    V6_12,
    /// Its PREEMPT_RT build (`linux-image-6.12-rt-amd64`).
    #[value(name = "6.12-rt")]
    V6_12Rt,
}

impl Flavour {
    pub const ALL: [Flavour; 4] = [
        Flavour::V6_1,
        Flavour::V6_1Rt,
        Flavour::V6_12,
        Flavour::V6_12Rt,
    ];

    /// `6.12-rt`, as `--kernel` takes it.
    pub fn label(self) -> &'static str {
        match self {
            Flavour::V6_1 => "6.1",
            Flavour::V6_1Rt => "6.1-rt",
            Flavour::V6_12 => "6.12",
            Flavour::V6_12Rt => "6.12-rt",
        }
    }

    /// The metapackage whose dependency names the current kernel package.
    fn metapackage(self) -> &'static str {
        match self {
            Flavour::V6_1 => "linux-image-amd64",
            Flavour::V6_1Rt => "linux-image-rt-amd64",
            Flavour::V6_12 => "linux-image-6.12-amd64",
            Flavour::V6_12Rt => "linux-image-6.12-rt-amd64",
        }
    }

    /// What the guest's `uname -r` starts with.
    pub fn release_prefix(self) -> &'static str {
        match self {
            Flavour::V6_1 | Flavour::V6_1Rt => "6.1.",
            Flavour::V6_12 | Flavour::V6_12Rt => "6.12.",
        }
    }

    /// A PREEMPT_RT build.
    pub fn realtime(self) -> bool {
        matches!(self, Flavour::V6_1Rt | Flavour::V6_12Rt)
    }

    /// Whether `package` is this flavour's kernel image package.
    fn is_image(self, package: &str) -> bool {
        let versioned = package
            .strip_prefix("linux-image-")
            .is_some_and(|rest| rest.starts_with(self.release_prefix()));
        versioned
            && package.ends_with("-rt-amd64") == self.realtime()
            && package.ends_with("-amd64")
    }
}

/// A kernel ready to boot.
pub struct Kernel {
    pub flavour: Flavour,
    /// `linux-image-6.1.0-56-amd64 6.1.192-2`.
    pub package: String,
    pub bzimage: PathBuf,
    /// The modules, one `<name>.ko` each, in `dir`.
    pub modules_dir: PathBuf,
    /// Module names in the order `insmod` must load them.
    pub load_order: Vec<String>,
}

/// The cached kernel of `flavour`, fetched and prepared first when there is none.
pub fn ensure(flavour: Flavour) -> Result<Kernel> {
    let root = setup::cache_dir()?.join("vm-kernel");
    let current = root.join(format!("current-{}", flavour.label()));
    if let Some(kernel) = cached(flavour, &root, &current)? {
        return Ok(kernel);
    }
    let (package, version) = resolve(flavour)?;
    let dir = root.join(format!("{package}_{version}"));
    cmd::step(&format!(
        "fetching {package} {version} for the VM test (apt-get download, dpkg-deb -x; once)"
    ));
    prepare(&package, &dir)?;
    fs::write(
        &current,
        dir.file_name().unwrap_or_default().as_encoded_bytes(),
    )?;
    cached(flavour, &root, &current)?.context("the kernel just prepared is not complete")
}

fn cached(flavour: Flavour, root: &Path, current: &Path) -> Result<Option<Kernel>> {
    let Ok(name) = fs::read_to_string(current) else {
        return Ok(None);
    };
    let dir = root.join(name.trim());
    let Ok(order) = fs::read_to_string(dir.join("ready")) else {
        return Ok(None);
    };
    let bzimage = dir.join("vmlinuz");
    if !bzimage.is_file() {
        return Ok(None);
    }
    Ok(Some(Kernel {
        flavour,
        package: name.trim().replace('_', " "),
        bzimage,
        modules_dir: dir.join("modules"),
        load_order: order
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect(),
    }))
}

/// The package and version the flavour's metapackage depends on (apt's lists updated once if
/// needed).
fn resolve(flavour: Flavour) -> Result<(String, String)> {
    let metapackage = flavour.metapackage();
    let find = || -> Option<(String, String)> {
        let show = cmd::output("apt-cache", &["show", "--no-all-versions", metapackage]).ok()?;
        let depends = show.lines().find_map(|l| l.strip_prefix("Depends: "))?;
        image_dependency(flavour, depends)
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    setup::apt_update()?;
    find().with_context(|| {
        format!(
            "apt-cache knows no {metapackage} depending on a {} kernel image",
            flavour.label()
        )
    })
}

/// The kernel image package and version in a metapackage's `Depends:` line.
fn image_dependency(flavour: Flavour, depends: &str) -> Option<(String, String)> {
    depends.split(',').map(str::trim).find_map(|dep| {
        let (name, rest) = dep.split_once(' ').unwrap_or((dep, ""));
        flavour.is_image(name).then(|| {
            let version = rest.trim_matches(|c| "()= ".contains(c));
            (name.to_owned(), version.to_owned())
        })
    })
}

fn prepare(package: &str, dir: &Path) -> Result<()> {
    let mut scratch = dir.as_os_str().to_owned();
    scratch.push(".scratch");
    let scratch = PathBuf::from(scratch);
    let _ = fs::remove_dir_all(&scratch);
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(&scratch)?;
    let mut download = setup::apt_get(&["download", package]);
    download.current_dir(&scratch);
    cmd::run(download)?;
    let deb = only_entry(&scratch, ".deb")?;
    let tree = scratch.join("tree");
    let mut extract = Command::new("dpkg-deb");
    extract.arg("-x").arg(&deb).arg(&tree);
    cmd::run(extract)?;
    let modules_root = only_entry(&tree.join("lib/modules"), "")?;
    let vmlinuz = first_with_prefix(&tree.join("boot"), "vmlinuz-")?;
    let config = first_with_prefix(&tree.join("boot"), "config-")?;
    let built_in = built_in(&fs::read_to_string(&config)?);
    let order = load_order(&modules_root, &built_in)?;
    let modules = dir.join("modules");
    fs::create_dir_all(&modules)?;
    fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
    fs::copy(&config, dir.join("config"))?;
    for (name, path) in &order {
        fs::write(modules.join(format!("{name}.ko")), module_bytes(path)?)
            .with_context(|| format!("writing module {name}"))?;
    }
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    fs::write(dir.join("ready"), names.join("\n"))?;
    fs::remove_dir_all(&scratch)?;
    Ok(())
}

/// The wanted modules the configuration builds into the kernel (`=y`): nothing to load.
fn built_in(config: &str) -> Vec<&'static str> {
    WANTED_MODULES
        .iter()
        .filter(|(_, symbol)| config.lines().any(|l| l.strip_prefix(symbol) == Some("=y")))
        .map(|(name, _)| *name)
        .collect()
}

/// The wanted modules that are modules and their dependencies, each after what it depends on,
/// with its file.
fn load_order(modules_root: &Path, built_in: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let list = fs::read_to_string(modules_root.join("modules.order"))
        .with_context(|| format!("reading {}/modules.order", modules_root.display()))?;
    let files: BTreeMap<String, PathBuf> = list
        .lines()
        .filter_map(|rel| {
            let name = Path::new(rel).file_name()?.to_str()?.strip_suffix(".ko")?;
            // modinfo's names use `_` where file names may have `-`.
            Some((name.replace('-', "_"), modules_root.join(rel)))
        })
        .collect();
    let mut order = Vec::new();
    for (wanted, _) in WANTED_MODULES {
        if !built_in.contains(&wanted) {
            visit(wanted, &files, &mut order, &mut Vec::new())?;
        }
    }
    Ok(order)
}

fn visit(
    name: &str,
    files: &BTreeMap<String, PathBuf>,
    order: &mut Vec<(String, PathBuf)>,
    path: &mut Vec<String>,
) -> Result<()> {
    if order.iter().any(|(n, _)| n == name) {
        return Ok(());
    }
    if path.iter().any(|n| n == name) {
        bail!("module dependency cycle: {} -> {name}", path.join(" -> "));
    }
    let file = files
        .get(name)
        .with_context(|| format!("module {name} is not in the package's modules.order"))?;
    let bytes = module_bytes(file)?;
    path.push(name.to_owned());
    for dep in depends(&bytes) {
        visit(&dep, files, order, path)?;
    }
    path.pop();
    order.push((name.to_owned(), file.clone()));
    Ok(())
}

/// A module's ELF bytes: `path` as `modules.order` names it (`….ko`), or the same name with
/// `.xz` or `.zst` as the package ships it when the kernel compresses its modules (6.12's are
/// xz), uncompressed here so that busybox's `insmod` loads them and `depends=` can be read.
fn module_bytes(path: &Path) -> Result<Vec<u8>> {
    if path.is_file() {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    }
    for (suffix, tool) in [("xz", "xz"), ("zst", "zstd")] {
        let mut compressed = path.as_os_str().to_owned();
        compressed.push(format!(".{suffix}"));
        let compressed = PathBuf::from(compressed);
        if compressed.is_file() {
            let out = Command::new(tool)
                .arg("-dc")
                .arg(&compressed)
                .output()
                .with_context(|| {
                    format!(
                        "running {tool} (Debian package {})",
                        compressor_package(tool)
                    )
                })?;
            if !out.status.success() {
                bail!(
                    "{tool} -dc {}: {}",
                    compressed.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            return Ok(out.stdout);
        }
    }
    bail!(
        "module {} is not in the package, compressed (.xz, .zst) or not",
        path.display()
    )
}

/// The Debian package of a decompressor.
fn compressor_package(tool: &str) -> &'static str {
    if tool == "xz" { "xz-utils" } else { "zstd" }
}

/// The `depends=` entry of a module's `.modinfo` strings (NUL-separated `key=value`).
fn depends(module: &[u8]) -> Vec<String> {
    module
        .split(|&b| b == 0)
        .find_map(|s| s.strip_prefix(b"depends="))
        .map(|list| {
            String::from_utf8_lossy(list)
                .split(',')
                .filter(|d| !d.is_empty())
                .map(|d| d.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

fn only_entry(dir: &Path, suffix: &str) -> Result<PathBuf> {
    let entries: Vec<PathBuf> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    match entries.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "expected one {suffix} entry in {}, found {entries:?}",
            dir.display()
        ),
    }
}

fn first_with_prefix(dir: &Path, prefix: &str) -> Result<PathBuf> {
    fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .with_context(|| format!("no {prefix}* in {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::{Flavour, built_in, depends, image_dependency};

    #[test]
    fn each_flavour_takes_its_own_image_from_its_metapackage() {
        let generic = "linux-image-6.1.0-56-amd64 (= 6.1.192-2)";
        assert_eq!(
            image_dependency(Flavour::V6_1, generic),
            Some(("linux-image-6.1.0-56-amd64".into(), "6.1.192-2".into()))
        );
        assert_eq!(image_dependency(Flavour::V6_1Rt, generic), None);
        let rt = "linux-image-6.1.0-56-rt-amd64 (= 6.1.192-2)";
        assert_eq!(
            image_dependency(Flavour::V6_1Rt, rt).map(|(p, _)| p),
            Some("linux-image-6.1.0-56-rt-amd64".into())
        );
        let newer = "linux-image-6.12.117+deb12-rt-amd64 (= 6.12.117-1~deb12u1)";
        assert_eq!(
            image_dependency(Flavour::V6_12Rt, newer),
            Some((
                "linux-image-6.12.117+deb12-rt-amd64".into(),
                "6.12.117-1~deb12u1".into()
            ))
        );
        assert_eq!(image_dependency(Flavour::V6_12, newer), None);
        assert_eq!(image_dependency(Flavour::V6_1Rt, newer), None);
    }

    #[test]
    fn built_in_modules_are_not_loaded() {
        let config = "CONFIG_VIRTIO_PCI=y\nCONFIG_VIRTIO_PCI_LEGACY=m\nCONFIG_NET_9P_VIRTIO=m\n# CONFIG_9P_FS is not set\n";
        assert_eq!(built_in(config), ["virtio_pci"]);
    }

    #[test]
    fn depends_come_from_the_modinfo_strings() {
        let module = b"\x7fELF junk\0license=GPL\0depends=9pnet,fscache,netfs\0retpoline=Y\0";
        assert_eq!(depends(module), ["9pnet", "fscache", "netfs"]);
        assert!(depends(b"license=GPL\0depends=\0").is_empty());
        assert_eq!(depends(b"depends=virtio-ring\0"), ["virtio_ring"]);
    }
}
