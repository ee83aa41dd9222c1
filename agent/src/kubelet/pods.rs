//! Pod cgroups by pod UID, on the cgroup v2 hierarchy and on a cgroup v1 hugetlb hierarchy: found
//! by a walk at start-up and on each reconcile, kept current between walks by the probes' v2
//! mkdir and rmdir events. Reservations use it to read a pod's hugetlb usage and to notice that a
//! pod is gone.
//!
//! The v2 walk can be shared: [`PodCgroups::on_mkdir`] is the visitor the watch-set scan calls, so
//! a reconcile walks the v2 tree once.

use std::collections::HashMap;

use super::cgroup_path::{Owner, classify};
use crate::{
    probes::watch::CgroupV2,
    sysfs::{HostFs, SysfsError, cgroup_tree, hugetlb_cgroup::Hierarchy},
};

/// Mount point of a cgroup v1 hugetlb hierarchy.
pub const V1_HUGETLB: &str = "/sys/fs/cgroup/hugetlb";

/// Pod UID → the pod-level cgroup (host path) and its hierarchy. A pod seen on both keeps v2.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCgroups {
    v2_mount: Option<String>,
    dirs: HashMap<String, (String, Hierarchy)>,
}

/// The UID of a pod-level cgroup.
fn pod_uid(owner: &Owner) -> Option<&str> {
    match owner {
        Owner::Pod {
            uid,
            container: None,
            ..
        } => Some(&uid.0),
        _ => None,
    }
}

impl PodCgroups {
    /// The pods of the v1 hugetlb hierarchy (when mounted); v2 pods are added by a walk that
    /// calls [`PodCgroups::on_mkdir`], or by [`PodCgroups::scan`].
    pub fn v1(host: &HostFs) -> Result<PodCgroups, SysfsError> {
        let mut pods = PodCgroups {
            v2_mount: CgroupV2::find(host).map(|v2| v2.mount),
            dirs: HashMap::new(),
        };
        if host.exists(format!("{V1_HUGETLB}/cgroup.procs")) {
            cgroup_tree::walk(host, V1_HUGETLB, |rel| {
                if let Some(uid) = pod_uid(&classify(rel)) {
                    pods.dirs.insert(
                        uid.to_owned(),
                        (format!("{V1_HUGETLB}{rel}"), Hierarchy::V1),
                    );
                }
            })?;
        }
        Ok(pods)
    }

    /// [`PodCgroups::scan`] as the agent starts: on an error, warned about, none (reservations
    /// then end by expiry until the next reconcile finds the pods).
    pub fn at_start(host: &HostFs) -> PodCgroups {
        PodCgroups::scan(host).unwrap_or_else(|err| {
            tracing::warn!(
                "finding pod cgroups: {err}; reservations end by expiry until the next reconcile"
            );
            PodCgroups::default()
        })
    }

    /// Walks both hierarchies.
    pub fn scan(host: &HostFs) -> Result<PodCgroups, SysfsError> {
        let mut pods = PodCgroups::v1(host)?;
        if let Some(mount) = pods.v2_mount.clone() {
            cgroup_tree::walk(host, &mount, |rel| pods.on_mkdir(rel, &classify(rel)))?;
        }
        Ok(pods)
    }

    /// A v2 cgroup `owner` appeared at `rel` (relative to the mount).
    pub fn on_mkdir(&mut self, rel: &str, owner: &Owner) {
        if let (Some(uid), Some(mount)) = (pod_uid(owner), &self.v2_mount) {
            self.dirs
                .insert(uid.to_owned(), (format!("{mount}{rel}"), Hierarchy::V2));
        }
    }

    /// A v2 cgroup of `owner` was removed; returns the UID if it was a pod's.
    pub fn on_rmdir(&mut self, owner: &Owner) -> Option<String> {
        let uid = pod_uid(owner)?;
        self.dirs.remove(uid).map(|_| uid.to_owned())
    }

    /// The pod-level cgroup of `uid` (a host path) and its hierarchy.
    pub fn dir(&self, uid: &str) -> Option<(&str, Hierarchy)> {
        self.dirs.get(uid).map(|(d, h)| (d.as_str(), *h))
    }

    /// UIDs known here and not in `newer`: pods whose cgroups went away between two walks.
    pub fn gone_in(&self, newer: &PodCgroups) -> Vec<String> {
        self.dirs
            .keys()
            .filter(|uid| !newer.dirs.contains_key(*uid))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    const UID: &str = "1d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";
    const OTHER: &str = "2d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";

    #[test]
    fn pods_are_found_on_both_hierarchies_and_follow_events() {
        let pod = format!(
            "/sys/fs/cgroup/unified/kubepods.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        let v1_pod = format!("{V1_HUGETLB}/kubepods/besteffort/pod{OTHER}");
        let (_d, host) = tree(&[
            ("/sys/fs/cgroup/unified/cgroup.controllers", "\n"),
            (&format!("{pod}/cgroup.procs"), ""),
            ("/sys/fs/cgroup/unified/system.slice/cgroup.procs", ""),
            (&format!("{V1_HUGETLB}/cgroup.procs"), ""),
            (&format!("{v1_pod}/cgroup.procs"), ""),
        ]);
        let mut pods = PodCgroups::scan(&host).expect("walks");
        assert_eq!(pods.dir(UID), Some((pod.as_str(), Hierarchy::V2)));
        assert_eq!(pods.dir(OTHER), Some((v1_pod.as_str(), Hierarchy::V1)));
        let before = pods.clone();
        let rel = pod.trim_start_matches("/sys/fs/cgroup/unified");
        assert_eq!(pods.on_rmdir(&classify("/system.slice")), None);
        assert_eq!(pods.on_rmdir(&classify(rel)), Some(UID.to_owned()));
        assert_eq!(pods.dir(UID), None);
        assert_eq!(before.gone_in(&pods), [UID.to_owned()]);
        pods.on_mkdir(rel, &classify(rel));
        assert_eq!(pods.dir(UID), Some((pod.as_str(), Hierarchy::V2)));
    }
}
