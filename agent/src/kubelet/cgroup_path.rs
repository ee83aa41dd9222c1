//! Who a cgroup belongs to, from its path alone (no API server): the kubelet names pod and
//! container cgroups after the pod UID, the QoS class and the container id, differently under
//! its two cgroup drivers:
//!
//! * cgroupfs: `/kubepods[/burstable|/besteffort]/pod<uid>/<container id>` (CRI-O adds a `crio-`
//!   prefix to the container directory);
//! * systemd: `/kubepods.slice[/kubepods-burstable.slice]/kubepods[-burstable]-pod<uid with _>.slice/
//!   <runtime>-<id>.scope`, the runtime being `cri-containerd`, `crio` or `docker`.
//!
//! Guaranteed pods sit directly under kubepods. A `--cgroup-root` prefix (`/kubelet/kubepods/…`)
//! is allowed. Anything else, and the kubepods and QoS cgroups themselves, is not a pod's.

use std::fmt;

use serde::Serialize;

/// A pod's QoS class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        })
    }
}

/// A pod UID, as Kubernetes prints it (dashes, lower case).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct PodUid(pub String);

/// A container cgroup: the runtime (when its name says) and the container id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    pub id: String,
}

/// What a cgroup path says about its owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A pod's cgroup (`container` is `None` for the pod level itself, or a runtime helper such
    /// as CRI-O's conmon).
    Pod {
        uid: PodUid,
        qos: Qos,
        container: Option<ContainerRef>,
    },
    /// Anything that is not a pod's: system services, the kubepods and QoS cgroups themselves.
    System,
}

/// Classifies a cgroup path (relative to its hierarchy's mount, starting with `/`).
pub fn classify(path: &str) -> Owner {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let Some(start) = parts
        .iter()
        .position(|p| *p == "kubepods" || *p == "kubepods.slice")
    else {
        return Owner::System;
    };
    let rest = &parts[start + 1..];
    if parts[start] == "kubepods.slice" {
        systemd(rest)
    } else {
        cgroupfs(rest)
    }
}

fn qos_dir(name: &str) -> Option<Qos> {
    match name {
        "burstable" => Some(Qos::Burstable),
        "besteffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

/// `[burstable|besteffort/]pod<uid>[/<container>]`
fn cgroupfs(rest: &[&str]) -> Owner {
    let (qos, rest) = match rest.first().and_then(|p| qos_dir(p)) {
        Some(qos) => (qos, &rest[1..]),
        None => (Qos::Guaranteed, rest),
    };
    let Some(uid) = rest
        .first()
        .and_then(|p| p.strip_prefix("pod"))
        .filter(|u| valid_uid(u))
    else {
        return Owner::System;
    };
    let container = match rest.get(1) {
        None => None,
        Some(name) => match name.strip_prefix("crio-") {
            Some(id) if valid_id(id) => Some(ContainerRef {
                runtime: Some("crio".to_owned()),
                id: id.to_owned(),
            }),
            _ if valid_id(name) => Some(ContainerRef {
                runtime: None,
                id: (*name).to_owned(),
            }),
            _ => None,
        },
    };
    Owner::Pod {
        uid: PodUid(uid.to_ascii_lowercase()),
        qos,
        container,
    }
}

/// `[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid_>.slice[/<runtime>-<id>.scope]`
fn systemd(rest: &[&str]) -> Owner {
    let (qos, rest) = match rest.first().and_then(|p| {
        p.strip_prefix("kubepods-")
            .and_then(|q| q.strip_suffix(".slice"))
            .and_then(qos_dir)
    }) {
        Some(qos) => (qos, &rest[1..]),
        None => (Qos::Guaranteed, rest),
    };
    let prefix = match qos {
        Qos::Guaranteed => "kubepods-pod".to_owned(),
        other => format!("kubepods-{}-pod", other.to_string().to_ascii_lowercase()),
    };
    let Some(uid) = rest
        .first()
        .and_then(|p| p.strip_prefix(prefix.as_str()))
        .and_then(|p| p.strip_suffix(".slice"))
        .map(|u| u.replace('_', "-"))
        .filter(|u| valid_uid(u))
    else {
        return Owner::System;
    };
    let container = rest.get(1).and_then(|scope| {
        let name = scope.strip_suffix(".scope")?;
        ["cri-containerd", "crio", "docker"]
            .iter()
            .find_map(|runtime| {
                let id = name.strip_prefix(runtime)?.strip_prefix('-')?;
                valid_id(id).then(|| ContainerRef {
                    runtime: Some((*runtime).to_owned()),
                    id: id.to_owned(),
                })
            })
    });
    Owner::Pod {
        uid: PodUid(uid.to_ascii_lowercase()),
        qos,
        container,
    }
}

/// A UID: hex digits in 8-4-4-4-12 groups.
fn valid_uid(uid: &str) -> bool {
    let groups: Vec<&str> = uid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A container id: 64 hex digits (containerd, CRI-O and Docker all use them).
fn valid_id(id: &str) -> bool {
    id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests;
