//! Walking a cgroup hierarchy: every cgroup directory below a mount point, as paths relative to
//! it (`/kubepods/burstable/pod…`), the root itself first as `""`. A directory removed while the
//! walk runs is skipped; any other failure to list a directory is an error naming it, so that a
//! failed walk is never taken for an empty hierarchy.

use std::io::ErrorKind;

use super::{HostFs, SysfsError};

/// Calls `visit` with each cgroup's path relative to `mount` (a host path).
pub fn walk(host: &HostFs, mount: &str, mut visit: impl FnMut(&str)) -> Result<(), SysfsError> {
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = format!("{mount}{rel}");
        let entries = match host.list(&dir) {
            Ok(entries) => entries,
            Err(SysfsError::Read { source, .. })
                if source.kind() == ErrorKind::NotFound && !rel.is_empty() =>
            {
                continue;
            }
            Err(err) => return Err(err),
        };
        for name in entries {
            if host.path(format!("{dir}/{name}")).is_dir() {
                stack.push(format!("{rel}/{name}"));
            }
        }
        visit(&rel);
    }
    Ok(())
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
        walk(&host, "/cg", |rel| seen.push(rel.to_owned())).expect("walks");
        seen.sort();
        assert_eq!(seen, ["", "/a", "/a/b", "/c"]);
    }

    #[test]
    fn a_missing_root_is_an_error_not_an_empty_hierarchy() {
        let (_d, host) = tree(&[]);
        let err = walk(&host, "/missing", |_| {}).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
