//! Pod cgroups by pod UID, on the cgroup v2 hierarchy: found by a walk at start-up and on each
//! reconcile, kept current by the probes' mkdir and rmdir events. Reservations use it to read a
//! pod's hugetlb usage and to notice that a pod is gone.

use std::collections::HashMap;

use super::cgroup_path::{Owner, classify};
use crate::{
    probes::watch::CgroupV2,
    sysfs::{HostFs, cgroup_tree},
};

/// Pod UID → host path of the pod-level cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCgroups {
    mount: String,
    dirs: HashMap<String, String>,
}

fn pod_uid(rel: &str) -> Option<String> {
    match classify(rel) {
        Owner::Pod {
            uid,
            container: None,
            ..
        } => Some(uid.0),
        _ => None,
    }
}

impl PodCgroups {
    pub fn scan(host: &HostFs, v2: &CgroupV2) -> PodCgroups {
        let mut pods = PodCgroups {
            mount: v2.mount.clone(),
            dirs: HashMap::new(),
        };
        cgroup_tree::walk(host, &v2.mount, |rel| pods.on_mkdir(rel));
        pods
    }

    /// A cgroup appeared at `rel` (relative to the v2 mount).
    pub fn on_mkdir(&mut self, rel: &str) {
        if let Some(uid) = pod_uid(rel) {
            self.dirs.insert(uid, format!("{}{rel}", self.mount));
        }
    }

    /// A cgroup at `rel` was removed; returns the UID if it was a pod's.
    pub fn on_rmdir(&mut self, rel: &str) -> Option<String> {
        let uid = pod_uid(rel)?;
        self.dirs.remove(&uid).map(|_| uid)
    }

    /// The pod-level cgroup of `uid`, a host path.
    pub fn dir(&self, uid: &str) -> Option<&str> {
        self.dirs.get(uid).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    const UID: &str = "1d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";

    #[test]
    fn pods_are_found_by_the_walk_and_follow_events() {
        let pod = format!(
            "/sys/fs/cgroup/kubepods.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        let (_d, host) = tree(&[
            ("/sys/fs/cgroup/cgroup.controllers", "hugetlb\n"),
            (&format!("{pod}/cgroup.procs"), ""),
            ("/sys/fs/cgroup/system.slice/cgroup.procs", ""),
        ]);
        let v2 = CgroupV2::find(&host).expect("v2");
        let mut pods = PodCgroups::scan(&host, &v2);
        assert_eq!(pods.dir(UID), Some(pod.as_str()));
        let rel = pod.trim_start_matches("/sys/fs/cgroup");
        assert_eq!(pods.on_rmdir("/system.slice"), None);
        assert_eq!(pods.on_rmdir(rel), Some(UID.to_owned()));
        assert_eq!(pods.dir(UID), None);
        pods.on_mkdir(rel);
        assert_eq!(pods.dir(UID), Some(pod.as_str()));
    }
}
