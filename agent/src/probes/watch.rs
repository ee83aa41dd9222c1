//! Which cgroups the fault program inspects: those that can use hugepages.
//!
//! `bpf_get_current_cgroup_id()` names the task's cgroup v2 cgroup, so the set is computed on the
//! v2 hierarchy (`/sys/fs/cgroup` or, on hybrid hosts, `/sys/fs/cgroup/unified`). A cgroup can use
//! hugepages unless, for every page size, its own or an ancestor's `hugetlb.<size>.max` is 0 —
//! Kubernetes gives pods that requested no hugepages a limit of 0, and those cost nothing. A
//! cgroup with no hugetlb limit at all (consumers outside Kubernetes) is watched.

use std::{collections::BTreeSet, os::unix::fs::MetadataExt};

use crate::sysfs::{HostFs, SysfsError};

/// Where the v2 hierarchy may be mounted, in the order tried.
const V2_MOUNTS: [&str; 2] = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"];

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error("{path}: expected a number of bytes or \"max\", found {found:?}")]
    Limit { path: String, found: String },
    #[error("stat {path}: {source}")]
    Stat {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The cgroup v2 hierarchy of the host.
#[derive(Debug, Clone)]
pub struct CgroupV2 {
    /// Host path of the mount point, e.g. `/sys/fs/cgroup/unified`.
    pub mount: String,
}

/// Result of a full scan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchScan {
    /// Ids of the cgroups that can use hugepages.
    pub watched: BTreeSet<u64>,
    /// Cgroups visited.
    pub cgroups: usize,
}

impl CgroupV2 {
    /// Finds the v2 hierarchy; `None` when the host has none (cgroup v1 only).
    pub fn find(host: &HostFs) -> Option<CgroupV2> {
        V2_MOUNTS
            .iter()
            .find(|m| host.exists(format!("{m}/cgroup.controllers")))
            .map(|m| CgroupV2 {
                mount: (*m).to_owned(),
            })
    }

    fn dir(&self, rel: &str) -> String {
        let rel = rel.trim_matches('/');
        if rel.is_empty() {
            self.mount.clone()
        } else {
            format!("{}/{rel}", self.mount)
        }
    }

    /// The cgroup id (directory inode) of `rel`, a path relative to the mount.
    pub fn id(&self, host: &HostFs, rel: &str) -> Result<u64, WatchError> {
        let path = host.path(self.dir(rel));
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|source| WatchError::Stat {
                path: path.display().to_string(),
                source,
            })
    }

    /// Whether `rel` is still the cgroup `id`: a mkdir read from the ring buffer after its
    /// cgroup went (its rmdir lost, or not read yet) is not.
    pub fn is_current(&self, host: &HostFs, rel: &str, id: u64) -> bool {
        self.id(host, rel).is_ok_and(|now| now == id)
    }

    /// This cgroup's own limits, `(size name, bytes)`; `u64::MAX` for "max".
    fn limits(&self, host: &HostFs, rel: &str) -> Result<Vec<(String, u64)>, WatchError> {
        let dir = self.dir(rel);
        let mut limits = Vec::new();
        for name in host.list(&dir)? {
            // `hugetlb.<size>.max` limits faults; `hugetlb.<size>.rsvd.max` limits reservations.
            let Some(size) = name
                .strip_prefix("hugetlb.")
                .and_then(|s| s.strip_suffix(".max"))
                .filter(|size| !size.contains('.'))
            else {
                continue;
            };
            let path = format!("{dir}/{name}");
            let text = host.read_string(&path)?;
            let value = match text.trim() {
                "max" => u64::MAX,
                v => v.parse().map_err(|_| WatchError::Limit {
                    path: host.path(&path).display().to_string(),
                    found: text.clone(),
                })?,
            };
            limits.push((size.to_owned(), value));
        }
        Ok(limits)
    }

    /// Whether a task in `rel` could fault hugepages, given the limits of all its ancestors.
    pub fn can_use_hugepages(&self, host: &HostFs, rel: &str) -> Result<bool, WatchError> {
        let mut effective = Effective::default();
        let mut prefix = String::new();
        effective.apply(self.limits(host, "")?);
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(part);
            effective.apply(self.limits(host, &prefix)?);
        }
        Ok(effective.allows_any())
    }

    /// Walks the whole hierarchy and returns the cgroups that can use hugepages.
    pub fn scan(&self, host: &HostFs) -> Result<WatchScan, WatchError> {
        self.scan_visiting(host, |_| {})
    }

    /// [`CgroupV2::scan`], calling `visit` with every cgroup's path on the way, so that other
    /// inventories share the one walk.
    pub fn scan_visiting(
        &self,
        host: &HostFs,
        mut visit: impl FnMut(&str),
    ) -> Result<WatchScan, WatchError> {
        let mut scan = WatchScan::default();
        let mut stack = vec![(String::new(), Effective::default())];
        while let Some((rel, parent)) = stack.pop() {
            let mut effective = parent;
            match self.limits(host, &rel) {
                Ok(limits) => effective.apply(limits),
                // Removed while we walked: nothing to watch there.
                Err(WatchError::Sysfs(SysfsError::Read { source, .. })) if gone(&source) => {
                    continue;
                }
                Err(err) => return Err(err),
            }
            scan.cgroups += 1;
            visit(&rel);
            if effective.allows_any() {
                match self.id(host, &rel) {
                    Ok(id) => {
                        scan.watched.insert(id);
                    }
                    Err(WatchError::Stat { source, .. }) if gone(&source) => continue,
                    Err(err) => return Err(err),
                }
            }
            for child in self.children(host, &rel)? {
                stack.push((format!("{rel}/{child}"), effective.clone()));
            }
        }
        Ok(scan)
    }

    fn children(&self, host: &HostFs, rel: &str) -> Result<Vec<String>, WatchError> {
        let dir = self.dir(rel);
        let names = match host.list(&dir) {
            Ok(names) => names,
            Err(SysfsError::Read { source, .. }) if gone(&source) => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        Ok(names
            .into_iter()
            .filter(|n| host.path(format!("{dir}/{n}")).is_dir())
            .collect())
    }
}

/// Whether `err` says the cgroup was removed while it was read: its directory is gone
/// (`ENOENT`), or a file of it was opened before the removal and read after (`ENODEV`, what
/// kernfs answers for a removed cgroup's files).
fn gone(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ENODEV)
}

/// Effective per-size limits along a path: the minimum of every level that sets one.
#[derive(Debug, Clone, Default)]
struct Effective {
    limits: Vec<(String, u64)>,
}

impl Effective {
    fn apply(&mut self, own: Vec<(String, u64)>) {
        for (size, value) in own {
            match self.limits.iter_mut().find(|(s, _)| *s == size) {
                Some((_, current)) => *current = (*current).min(value),
                None => self.limits.push((size, value)),
            }
        }
    }

    /// No limit at all, or some size with room above zero.
    fn allows_any(&self) -> bool {
        self.limits.is_empty() || self.limits.iter().any(|(_, v)| *v > 0)
    }
}

#[cfg(test)]
mod tests;
