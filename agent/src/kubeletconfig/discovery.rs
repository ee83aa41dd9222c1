//! Finds and reads the node's kubelet settings through the `--host-root` seam. First the running
//! kubelet: the process named `kubelet` under `<host-root>/proc` (its `comm`, or, for a `comm`
//! such as `kubelet-1.35`, its argv\[0\]'s base name), the oldest if several; its command line names `--config` and `--config-dir`
//! (relative paths are taken from its working directory, `/proc/<pid>/cwd`; every path is a host
//! path, read under the host root) and sets flags of its own. Without a kubelet process,
//! `--kubelet-config` when given, else the first of the places installers write the file
//! ([`USUAL`]). Also the [`Stamp`] of all it looked at, so a restarted kubelet or a rewritten
//! file is noticed. Parsing and merging are [`super::file`] and [`super::cmdline`]'s.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{
    cmdline::{self, CmdlineError},
    file::{self, ConfigFile, FileError},
    settings::Layer,
};
use crate::sysfs::{HostFs, SysfsError};

/// A place an installer writes the kubelet's configuration: a file, a drop-in directory, or both.
#[derive(Debug, Clone, Copy)]
pub struct Usual {
    pub file: Option<&'static str>,
    pub dir: Option<&'static str>,
}

/// Where the common installers put the kubelet's configuration, in the order tried.
pub const USUAL: [Usual; 5] = [
    // kubeadm: `kubeadm init` and `kubeadm join` write it, and kubeadm's systemd drop-in for the
    // kubelet (10-kubeadm.conf) passes --config=/var/lib/kubelet/config.yaml.
    Usual {
        file: Some("/var/lib/kubelet/config.yaml"),
        dir: None,
    },
    // Amazon EKS AL2023 images: nodeadm writes config.json and its drop-ins into config.json.d
    // (40-nodeadm.conf; awslabs/amazon-eks-ami, nodeadm/test/e2e/cases/kubelet-config-dir).
    Usual {
        file: Some("/etc/kubernetes/kubelet/config.json"),
        dir: Some("/etc/kubernetes/kubelet/config.json.d"),
    },
    // Amazon EKS AL2 images: bootstrap.sh's kubelet-config.json (awslabs/amazon-eks-ami,
    // files/kubelet-config.json, installed under that name).
    Usual {
        file: Some("/etc/kubernetes/kubelet/kubelet-config.json"),
        dir: None,
    },
    // GKE node images: the kubelet runs with --config /home/kubernetes/kubelet-config.yaml.
    Usual {
        file: Some("/home/kubernetes/kubelet-config.yaml"),
        dir: None,
    },
    // k3s 1.32 and later (the kubelet runs inside the k3s process, so no `kubelet` process is
    // found): its defaults are 00-k3s-defaults.conf in this --config-dir (docs.k3s.io).
    Usual {
        file: None,
        dir: Some("/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"),
    },
];

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Read(#[from] SysfsError),
    #[error("{path}: expected {expected}")]
    Malformed {
        path: PathBuf,
        expected: &'static str,
    },
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error("{path} ({named_by}): no such file")]
    Missing { path: PathBuf, named_by: String },
}

/// A running kubelet: its process id and start time (clock ticks after boot), which tell a
/// restarted kubelet from the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletProcess {
    pub pid: u32,
    pub start_time: u64,
}

/// What `stat` tells of a file or directory's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

/// What the settings were read from: the kubelet process and every path looked at (present or
/// not). Equal stamps: nothing to read again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    pub kubelet: Option<KubeletProcess>,
    pub paths: Vec<(PathBuf, Option<FileStamp>)>,
}

/// The settings found, before the agent's flags: where from, and the layers in the kubelet's
/// order (files, then its command line).
#[derive(Debug, Clone)]
pub struct Found {
    /// Where they came from, in words.
    pub origin: String,
    pub layers: Vec<Layer>,
}

/// One reading: what was looked at, and what was found or why it failed.
#[derive(Debug)]
pub struct Reading {
    pub stamp: Stamp,
    pub outcome: Result<Found, DiscoveryError>,
}

/// Reads the settings (`explicit`: `--kubelet-config`).
pub fn read(host: &HostFs, explicit: Option<&Path>) -> Reading {
    let mut looked = Vec::new();
    let (kubelet, outcome) = match find_kubelet(host) {
        Ok(Some(process)) => (Some(process), from_kubelet(host, process, &mut looked)),
        Ok(None) => (None, from_files(host, explicit, &mut looked)),
        Err(e) => (None, Err(e)),
    };
    looked.sort();
    looked.dedup();
    Reading {
        stamp: Stamp {
            kubelet,
            paths: stamp_paths(host, looked),
        },
        outcome,
    }
}

/// The current stamp of what `previous` looked at, and whether a kubelet runs now. The kubelet
/// found before is checked by its own `stat` alone (same pid, same start time); `/proc` is
/// scanned again only when there was none or it is gone.
pub fn restamp(host: &HostFs, previous: &Stamp) -> Stamp {
    let still = previous.kubelet.filter(|k| {
        let stat = host.read_string_opt(format!("/proc/{}/stat", k.pid));
        matches!(stat, Ok(Some(stat)) if start_time(&stat) == Some(k.start_time))
    });
    Stamp {
        kubelet: still.or_else(|| find_kubelet(host).ok().flatten()),
        paths: stamp_paths(
            host,
            previous.paths.iter().map(|(p, _)| p.clone()).collect(),
        ),
    }
}

fn stamp_paths(host: &HostFs, paths: Vec<PathBuf>) -> Vec<(PathBuf, Option<FileStamp>)> {
    paths
        .into_iter()
        .map(|path| {
            let stamp = host.metadata(&path).ok().flatten().map(|m| FileStamp {
                ino: m.ino(),
                len: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            });
            (path, stamp)
        })
        .collect()
}

/// The oldest process named `kubelet`, if any. A process that ends while it is looked at is
/// skipped; no `/proc` under the host root is no process, and `/proc` unreadable an error.
pub fn find_kubelet(host: &HostFs) -> Result<Option<KubeletProcess>, DiscoveryError> {
    let mut found: Option<KubeletProcess> = None;
    // A host tree without /proc (no mount of it) has no process to find.
    if !host.exists("/proc") {
        return Ok(None);
    }
    for name in host.list("/proc")? {
        let Ok(pid) = name.parse::<u32>() else {
            continue;
        };
        let proc = PathBuf::from(format!("/proc/{pid}"));
        // The command line only of processes whose name starts so (`kubelet-1.35` run as
        // `kubelet`): reading every process's would double the cost of a scan.
        let named = match host.read_string_opt(proc.join("comm")) {
            Ok(Some(comm)) => {
                let comm = comm.trim_end();
                comm == "kubelet" || comm.starts_with("kubelet") && argv0_is_kubelet(host, &proc)
            }
            _ => continue,
        };
        if !named {
            continue;
        }
        let Ok(Some(stat)) = host.read_string_opt(proc.join("stat")) else {
            continue;
        };
        let start_time = start_time(&stat).ok_or_else(|| DiscoveryError::Malformed {
            path: host.path(proc.join("stat")),
            expected: "a process's stat line (start time in field 22)",
        })?;
        let process = KubeletProcess { pid, start_time };
        if found.is_none_or(|f| (start_time, pid) < (f.start_time, f.pid)) {
            found = Some(process);
        }
    }
    Ok(found)
}

fn argv0_is_kubelet(host: &HostFs, proc: &Path) -> bool {
    let Ok(bytes) = host.read_bytes(proc.join("cmdline")) else {
        return false;
    };
    let argv0 = bytes.split(|b| *b == 0).next().unwrap_or_default();
    Path::new(&*String::from_utf8_lossy(argv0))
        .file_name()
        .is_some_and(|n| n == "kubelet")
}

/// Field 22 of `/proc/<pid>/stat` (after the command name in parentheses, which may hold spaces).
fn start_time(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(')')?;
    after.split_whitespace().nth(19)?.parse().ok()
}

fn from_kubelet(
    host: &HostFs,
    process: KubeletProcess,
    looked: &mut Vec<PathBuf>,
) -> Result<Found, DiscoveryError> {
    let pid = process.pid;
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let bytes = host.read_bytes(proc.join("cmdline"))?;
    let args: Vec<String> = bytes
        .split(|b| *b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let line = cmdline::parse(pid, &args)?;
    let resolve = |given: &str| -> Result<PathBuf, DiscoveryError> {
        let given = Path::new(given);
        if given.is_absolute() {
            Ok(given.to_owned())
        } else {
            Ok(host.read_link(proc.join("cwd"))?.join(given))
        }
    };
    let base = match &line.config {
        Some(given) => {
            let path = resolve(given)?;
            let named_by = format!("--config of the kubelet, pid {pid}");
            Some(read_file(host, &path, &named_by, looked)?)
        }
        None => None,
    };
    let drop_ins = match &line.config_dir {
        Some(given) => {
            let dir = resolve(given)?;
            let named_by = format!("--config-dir of the kubelet, pid {pid}");
            read_dir(host, &dir, &named_by, true, looked)?
        }
        None => Vec::new(),
    };
    let files = file::merge(base.as_ref(), &drop_ins)?;
    let mut origin = format!("the kubelet, pid {pid}");
    if let Some(base) = &base {
        origin.push_str(&format!(", {}", base.path.display()));
    }
    if let Some(dir) = &line.config_dir {
        origin.push_str(&format!(", drop-ins {dir}"));
    }
    Ok(Found {
        origin,
        layers: vec![files, line.layer],
    })
}

fn from_files(
    host: &HostFs,
    explicit: Option<&Path>,
    looked: &mut Vec<PathBuf>,
) -> Result<Found, DiscoveryError> {
    if let Some(path) = explicit {
        let base = read_file(host, path, "--kubelet-config", looked)?;
        return Ok(Found {
            origin: format!("no kubelet process; --kubelet-config {}", path.display()),
            layers: vec![file::merge(Some(&base), &[])?],
        });
    }
    for usual in USUAL {
        let file = usual.file.map(PathBuf::from);
        let dir = usual.dir.map(PathBuf::from);
        let present = |p: &Option<PathBuf>| {
            p.as_ref()
                .is_some_and(|p| host.metadata(p).ok().flatten().is_some())
        };
        looked.extend(file.iter().chain(&dir).cloned());
        if !present(&file) && !present(&dir) {
            continue;
        }
        let named_by = "a usual place of the kubelet's configuration";
        let base = match &file {
            Some(path) if present(&file) => Some(read_file(host, path, named_by, looked)?),
            _ => None,
        };
        let drop_ins = match &dir {
            Some(dir) => read_dir(host, dir, named_by, false, looked)?,
            None => Vec::new(),
        };
        let shown: Vec<String> = file
            .iter()
            .filter(|_| base.is_some())
            .chain(dir.iter().filter(|_| !drop_ins.is_empty()))
            .map(|p| p.display().to_string())
            .collect();
        return Ok(Found {
            origin: format!("no kubelet process; {}", shown.join(", ")),
            layers: vec![file::merge(base.as_ref(), &drop_ins)?],
        });
    }
    Ok(Found {
        origin: "no kubelet process and no configuration file: the kubelet's defaults".into(),
        layers: Vec::new(),
    })
}

fn read_file(
    host: &HostFs,
    path: &Path,
    named_by: &str,
    looked: &mut Vec<PathBuf>,
) -> Result<ConfigFile, DiscoveryError> {
    looked.push(path.to_owned());
    let text = host
        .read_string_opt(path)?
        .ok_or_else(|| DiscoveryError::Missing {
            path: path.to_owned(),
            named_by: named_by.to_owned(),
        })?;
    Ok(file::parse(path, &text)?)
}

/// The drop-ins of `dir` in the kubelet's order: a walk of the tree in lexical order, every
/// file named `*.conf`. A missing directory is an error when `required` (the kubelet refuses
/// to start), else no drop-ins.
fn read_dir(
    host: &HostFs,
    dir: &Path,
    named_by: &str,
    required: bool,
    looked: &mut Vec<PathBuf>,
) -> Result<Vec<ConfigFile>, DiscoveryError> {
    looked.push(dir.to_owned());
    let meta = host.metadata(dir)?;
    let Some(meta) = meta else {
        return if required {
            Err(DiscoveryError::Missing {
                path: dir.to_owned(),
                named_by: named_by.to_owned(),
            })
        } else {
            Ok(Vec::new())
        };
    };
    let mut files = Vec::new();
    if !meta.is_dir() {
        return Ok(files);
    }
    for name in host.list(dir)? {
        let path = dir.join(&name);
        let is_dir = host.metadata(&path)?.is_some_and(|m| m.is_dir());
        if is_dir {
            files.extend(read_dir(host, &path, named_by, false, looked)?);
        } else if name.ends_with(".conf") {
            files.push(read_file(host, &path, named_by, looked)?);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests;
