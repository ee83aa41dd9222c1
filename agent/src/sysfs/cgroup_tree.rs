//! Walking a cgroup hierarchy: every cgroup directory below a mount point, as paths relative to
//! it (`/kubepods/burstable/pod…`), the root itself first as `""`. A directory removed while the
//! walk runs is skipped, not an error.

use super::HostFs;

/// Calls `visit` with each cgroup's path relative to `mount` (a host path).
pub fn walk(host: &HostFs, mount: &str, mut visit: impl FnMut(&str)) {
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = format!("{mount}{rel}");
        let Ok(entries) = host.list(&dir) else {
            continue;
        };
        for name in entries {
            if host.path(format!("{dir}/{name}")).is_dir() {
                stack.push(format!("{rel}/{name}"));
            }
        }
        visit(&rel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    #[test]
    fn every_directory_once_files_ignored() {
        let (_d, host) = tree(&[
            ("/cg/cgroup.procs", ""),
            ("/cg/a/cgroup.procs", ""),
            ("/cg/a/b/cgroup.procs", ""),
            ("/cg/c/cgroup.procs", ""),
        ]);
        let mut seen = Vec::new();
        walk(&host, "/cg", |rel| seen.push(rel.to_owned()));
        seen.sort();
        assert_eq!(seen, ["", "/a", "/a/b", "/c"]);
        let mut none = Vec::new();
        walk(&host, "/missing", |rel| none.push(rel.to_owned()));
        assert!(none.is_empty());
    }
}
