//! The guest's kernel: Debian bookworm's `linux-image-6.1.0-<abi>-amd64`, the one the
//! `linux-image-amd64` metapackage names, fetched with `apt-get download` and taken apart with
//! `dpkg-deb -x` in a scratch directory (never installed on the host). What the guest needs is
//! kept in the project's cache, `<cache>/vm-kernel/<package>_<version>/`: the bzImage (QEMU's
//! `-kernel` boots it directly), the configuration, and the modules the guest loads (virtio PCI
//! and 9p, with what they depend on) with the order to `insmod` them in, worked out from each
//! module's own `depends=` since the package ships no `modules.dep`. A complete directory
//! (`ready` written last) is reused without asking the archive again.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cmd, setup};

/// The modules the guest needs: virtio over PCI, and 9p over virtio (the shared directory).
const WANTED_MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];
/// The metapackage whose dependency names the current 6.1 kernel package.
const METAPACKAGE: &str = "linux-image-amd64";
const PACKAGE_PREFIX: &str = "linux-image-6.1.0-";

/// A kernel ready to boot.
pub struct Kernel {
    /// `linux-image-6.1.0-56-amd64 6.1.192-2`.
    pub package: String,
    pub bzimage: PathBuf,
    /// The modules, one `<name>.ko` each, in `dir`.
    pub modules_dir: PathBuf,
    /// Module names in the order `insmod` must load them.
    pub load_order: Vec<String>,
}

/// The cached kernel, fetched and prepared first when there is none.
pub fn ensure() -> Result<Kernel> {
    let root = setup::cache_dir()?.join("vm-kernel");
    if let Some(kernel) = cached(&root)? {
        return Ok(kernel);
    }
    let (package, version) = resolve()?;
    let dir = root.join(format!("{package}_{version}"));
    cmd::step(&format!(
        "fetching {package} {version} for the VM test (apt-get download, dpkg-deb -x; once)"
    ));
    prepare(&package, &dir)?;
    fs::write(
        root.join("current"),
        dir.file_name().unwrap_or_default().as_encoded_bytes(),
    )?;
    cached(&root)?.context("the kernel just prepared is not complete")
}

fn cached(root: &Path) -> Result<Option<Kernel>> {
    let Ok(name) = fs::read_to_string(root.join("current")) else {
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
        package: name.trim().replace('_', " "),
        bzimage,
        modules_dir: dir.join("modules"),
        load_order: order.lines().map(str::to_owned).collect(),
    }))
}

/// The package and version the metapackage depends on (apt's lists updated once if needed).
fn resolve() -> Result<(String, String)> {
    let find = || -> Option<(String, String)> {
        let show = cmd::output("apt-cache", &["show", "--no-all-versions", METAPACKAGE]).ok()?;
        let depends = show.lines().find_map(|l| l.strip_prefix("Depends: "))?;
        let dep = depends
            .split(',')
            .map(str::trim)
            .find(|d| d.starts_with(PACKAGE_PREFIX))?;
        let (name, rest) = dep.split_once(' ').unwrap_or((dep, ""));
        let version = rest.trim_matches(|c| "()= ".contains(c));
        Some((name.to_owned(), version.to_owned()))
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    setup::apt_update()?;
    find().with_context(|| {
        format!("apt-cache knows no {METAPACKAGE} depending on a {PACKAGE_PREFIX}* package")
    })
}

fn prepare(package: &str, dir: &Path) -> Result<()> {
    let scratch = dir.with_extension("scratch");
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
    let order = load_order(&modules_root)?;
    let modules = dir.join("modules");
    fs::create_dir_all(&modules)?;
    fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
    fs::copy(&config, dir.join("config"))?;
    for (name, path) in &order {
        fs::copy(path, modules.join(format!("{name}.ko")))
            .with_context(|| format!("copying {}", path.display()))?;
    }
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    fs::write(dir.join("ready"), names.join("\n"))?;
    fs::remove_dir_all(&scratch)?;
    Ok(())
}

/// The wanted modules and their dependencies, each after what it depends on, with its file.
fn load_order(modules_root: &Path) -> Result<Vec<(String, PathBuf)>> {
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
    for wanted in WANTED_MODULES {
        visit(wanted, &files, &mut order, &mut Vec::new())?;
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
    let bytes = fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    path.push(name.to_owned());
    for dep in depends(&bytes) {
        visit(&dep, files, order, path)?;
    }
    path.pop();
    order.push((name.to_owned(), file.clone()));
    Ok(())
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
    use super::depends;

    #[test]
    fn depends_come_from_the_modinfo_strings() {
        let module = b"\x7fELF junk\0license=GPL\0depends=9pnet,fscache,netfs\0retpoline=Y\0";
        assert_eq!(depends(module), ["9pnet", "fscache", "netfs"]);
        assert!(depends(b"license=GPL\0depends=\0").is_empty());
        assert_eq!(depends(b"depends=virtio-ring\0"), ["virtio_ring"]);
    }
}
