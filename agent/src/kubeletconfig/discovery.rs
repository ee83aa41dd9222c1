//! Finds and reads the node's kubelet settings through the `--host-root` seam. First the running
//! kubelet: a process named `kubelet` under `<host-root>/proc` (its `comm`, or, for a `comm`
//! such as `kubelet-1.35`, its argv\[0\]'s base name) that is the host's ([`Candidate`]: not in
//! a pod's or a container's cgroup, not in a PID namespace of its own, its `/` the same mount
//! as pid 1's), and only when exactly one is: a pod can name a process `kubelet`, and its
//! flags would then turn verification off or send the agent to read files it chose. With two
//! or more host candidates the agent takes none ([`Decision::Ambiguous`]) and says so, until the
//! operator names the file (`--kubelet-config`). Its command line names `--config` and `--config-dir`
//! (relative paths are taken from its working directory, `/proc/<pid>/cwd`; every path is a host
//! path, read under the host root) and sets flags of its own. Without a kubelet process,
//! `--kubelet-config` when given, else the first of the places installers write the file
//! ([`USUAL`]). Also the [`Stamp`] of all it looked at, so a restarted kubelet or a rewritten
//! file is noticed. Parsing and merging are [`super::file`] and [`super::cmdline`]'s.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use serde::Serialize;

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
    #[error(
        "{} processes that look like the host's kubelet run (pids {}): the agent follows none of them; name the kubelet's configuration file with --kubelet-config",
        pids.len(),
        pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous { pids: Vec<u32> },
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

/// What the settings were read from: the kubelet process, every process the last scan of
/// `/proc` took for the host's kubelet (a second one makes the choice ambiguous), and every path
/// looked at (present or not). Equal stamps: nothing to read again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    pub kubelet: Option<KubeletProcess>,
    pub hosts: Vec<KubeletProcess>,
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

/// One reading: what was looked at, the processes named `kubelet` and what became of each, and
/// what was found or why it failed.
#[derive(Debug)]
pub struct Reading {
    pub stamp: Stamp,
    pub candidates: Vec<Candidate>,
    pub outcome: Result<Found, DiscoveryError>,
}

/// A process named `kubelet`, and why it is not taken for the host's kubelet when it is not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub pid: u32,
    #[serde(skip)]
    pub start_time: u64,
    /// Why it is not the host's kubelet; none: it looks like the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Candidate {
    fn process(&self) -> KubeletProcess {
        KubeletProcess {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

/// Which kubelet the agent follows, from the candidates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Exactly one candidate is the host's.
    Kubelet(KubeletProcess),
    /// None is (or there is no process named `kubelet`).
    NoKubelet,
    /// Several are: the agent follows none of them.
    Ambiguous(Vec<u32>),
}

/// The kubelet among `candidates`: the one that is the host's, when exactly one is.
pub fn decide(candidates: &[Candidate]) -> Decision {
    let hosts: Vec<&Candidate> = candidates.iter().filter(|c| c.refused.is_none()).collect();
    match hosts.as_slice() {
        [] => Decision::NoKubelet,
        [one] => Decision::Kubelet(one.process()),
        many => Decision::Ambiguous(many.iter().map(|c| c.pid).collect()),
    }
}

/// Reads the settings (`explicit`: `--kubelet-config`). With several host candidates, the file
/// `explicit` names is read when given; otherwise the reading fails saying why.
pub fn read(host: &HostFs, explicit: Option<&Path>) -> Reading {
    let mut looked = Vec::new();
    let (candidates, decision) = match candidates(host) {
        Ok(candidates) => {
            let decision = decide(&candidates);
            (candidates, Ok(decision))
        }
        Err(e) => (Vec::new(), Err(e)),
    };
    let refused = candidates.iter().filter(|c| c.refused.is_some()).count();
    let (kubelet, outcome) = match decision {
        Ok(Decision::Kubelet(process)) => (Some(process), from_kubelet(host, process, &mut looked)),
        Ok(Decision::NoKubelet) => (
            None,
            from_files(host, explicit, "no kubelet process", &mut looked),
        ),
        Ok(Decision::Ambiguous(pids)) if explicit.is_some() => {
            let why = format!(
                "{} processes look like the host's kubelet (pids {}), so none is followed",
                pids.len(),
                pids.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            (None, from_files(host, explicit, &why, &mut looked))
        }
        Ok(Decision::Ambiguous(pids)) => (None, Err(DiscoveryError::Ambiguous { pids })),
        Err(e) => (None, Err(e)),
    };
    let outcome = outcome.map(|mut found| {
        if refused > 0 {
            found.origin.push_str(&format!(
                " ({refused} other process(es) named kubelet are not the host's: GET /v1/kubelet says why)"
            ));
        }
        found
    });
    looked.sort();
    looked.dedup();
    Reading {
        stamp: Stamp {
            kubelet,
            hosts: hosts_of(&candidates),
            paths: stamp_paths(host, looked),
        },
        candidates,
        outcome,
    }
}

/// The current stamp of what `previous` looked at, and whether a kubelet runs now. The kubelet
/// found before is checked by its own `stat` alone (same pid, same start time); `/proc` is
/// scanned again when there was none, when it is gone, or when `scan` asks (the caller's
/// period: a second process that looks like the host's kubelet is noticed then).
pub fn restamp(host: &HostFs, previous: &Stamp, scan: bool) -> Stamp {
    let still = previous.kubelet.filter(|k| {
        let stat = host.read_string_opt(format!("/proc/{}/stat", k.pid));
        matches!(stat, Ok(Some(stat)) if start_time(&stat) == Some(k.start_time))
    });
    let (kubelet, hosts) = match still {
        Some(k) if !scan => (Some(k), previous.hosts.clone()),
        _ => match candidates(host) {
            Ok(found) => {
                let kubelet = match decide(&found) {
                    Decision::Kubelet(process) => Some(process),
                    Decision::NoKubelet | Decision::Ambiguous(_) => None,
                };
                (kubelet, hosts_of(&found))
            }
            Err(_) => (None, Vec::new()),
        },
    };
    Stamp {
        kubelet,
        hosts,
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

/// The candidates taken for the host's kubelet, in pid order.
fn hosts_of(candidates: &[Candidate]) -> Vec<KubeletProcess> {
    let mut hosts: Vec<KubeletProcess> = candidates
        .iter()
        .filter(|c| c.refused.is_none())
        .map(Candidate::process)
        .collect();
    hosts.sort_by_key(|k| k.pid);
    hosts
}

/// The host's kubelet, when exactly one process named `kubelet` is the host's.
pub fn find_kubelet(host: &HostFs) -> Result<Option<KubeletProcess>, DiscoveryError> {
    Ok(match decide(&candidates(host)?) {
        Decision::Kubelet(process) => Some(process),
        Decision::NoKubelet | Decision::Ambiguous(_) => None,
    })
}

/// Every process named `kubelet`, oldest first, each judged by [`not_the_hosts`]. A process that
/// ends while it is looked at is skipped; no `/proc` under the host root is no process, and
/// `/proc` unreadable an error.
pub fn candidates(host: &HostFs) -> Result<Vec<Candidate>, DiscoveryError> {
    let mut found = Vec::new();
    // A host tree without /proc (no mount of it) has no process to find.
    if !host.exists("/proc") {
        return Ok(found);
    }
    let hosts_root = host
        .read_string_opt("/proc/1/mountinfo")
        .ok()
        .flatten()
        .and_then(|text| root_mount(&text));
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
        let refused = not_the_hosts(host, &proc, hosts_root.as_ref());
        found.push(Candidate {
            pid,
            start_time,
            refused,
        });
    }
    found.sort_by_key(|c| (c.start_time, c.pid));
    Ok(found)
}

/// Why the process at `proc` is not the host's kubelet, or none when it looks like the host's:
/// its cgroups, its PID namespace and its root mount, each read from files any process may read
/// (the agent holds no `CAP_SYS_PTRACE`, so `/proc/<pid>/ns` and `root` are closed to it).
/// `hosts_root` is pid 1's root mount; unknown, no process can be shown to share it.
fn not_the_hosts(host: &HostFs, proc: &Path, hosts_root: Option<&RootMount>) -> Option<String> {
    let read = |name: &str| host.read_string_opt(proc.join(name)).ok().flatten();
    let Some(cgroups) = read("cgroup") else {
        return Some("its cgroups cannot be read".to_owned());
    };
    if let Some(why) = cgroup_not_the_hosts(&cgroups) {
        return Some(why);
    }
    let Some(status) = read("status") else {
        return Some("its status cannot be read".to_owned());
    };
    if let Some(why) = pid_namespace_not_the_hosts(&status) {
        return Some(why);
    }
    let Some(hosts_root) = hosts_root else {
        return Some(
            "pid 1's mounts cannot be read, so no process can be shown to share the host's root"
                .to_owned(),
        );
    };
    match read("mountinfo").as_deref().and_then(root_mount) {
        None => Some("its mounts cannot be read".to_owned()),
        Some(root) if &root != hosts_root => Some(format!(
            "its root or mount namespace is not the host's: its / is mount {} of device {} at {}, pid 1's is mount {} of {} at {}",
            root.id, root.device, root.root, hosts_root.id, hosts_root.device, hosts_root.root
        )),
        Some(_) => None,
    }
}

/// Why cgroup membership `text` (`/proc/<pid>/cgroup`) is a pod's or a container's, if it is:
/// a path with a `kubepods` component (either cgroup driver), or one a container runtime
/// makes (`docker-<id>.scope`, `cri-containerd-…`, `crio-…`, `libpod-…`, or a bare 64-digit
/// container id under the cgroupfs driver).
pub fn cgroup_not_the_hosts(text: &str) -> Option<String> {
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/') {
            if part.starts_with("kubepods") {
                return Some(format!("its cgroup {path} is a pod's"));
            }
            let scope = part.strip_suffix(".scope").unwrap_or(part);
            let runtime = [
                "docker-",
                "cri-containerd-",
                "crio-",
                "libpod-",
                "containerd-",
            ]
            .iter()
            .any(|prefix| scope.starts_with(prefix));
            let bare_id = part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit());
            if runtime || bare_id {
                return Some(format!("its cgroup {path} is a container's"));
            }
        }
    }
    None
}

/// Why `status` (`/proc/<pid>/status`) shows a PID namespace below the host's, if it does:
/// `NSpid` lists the pid in the namespace `/proc` was mounted from and in each one below.
pub fn pid_namespace_not_the_hosts(status: &str) -> Option<String> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<&str> = line.split_whitespace().collect();
    (pids.len() > 1).then(|| {
        format!(
            "it runs in a PID namespace of its own (NSpid {})",
            pids.join(" ")
        )
    })
}

/// A process's root: the last mount of its `/` in its `mountinfo` (the one on top).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootMount {
    id: String,
    device: String,
    root: String,
}

/// The root mount in `mountinfo` text, if there is one.
pub fn root_mount(mountinfo: &str) -> Option<RootMount> {
    mountinfo.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let id = fields.next()?;
        let (_parent, device, root, point) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        (point == "/").then(|| RootMount {
            id: id.to_owned(),
            device: device.to_owned(),
            root: root.to_owned(),
        })
    })
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

/// The settings from files, `why` no kubelet process is read (the origin's first words).
fn from_files(
    host: &HostFs,
    explicit: Option<&Path>,
    why: &str,
    looked: &mut Vec<PathBuf>,
) -> Result<Found, DiscoveryError> {
    if let Some(path) = explicit {
        let base = read_file(host, path, "--kubelet-config", looked)?;
        return Ok(Found {
            origin: format!("{why}; --kubelet-config {}", path.display()),
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
            origin: format!("{why}; {}", shown.join(", ")),
            layers: vec![file::merge(base.as_ref(), &drop_ins)?],
        });
    }
    Ok(Found {
        origin: format!("{why} and no configuration file: the kubelet's defaults"),
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
