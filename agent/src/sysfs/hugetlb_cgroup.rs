//! Hugepages a cgroup holds, from the hugetlb controller, per page size:
//!
//! * cgroup v2: `hugetlb.<size>.current` (faulted), `hugetlb.<size>.rsvd.current` (reserved,
//!   faulted or not), `hugetlb.<size>.numa_stat` (`total=<bytes> N0=<bytes> N1=…`);
//! * cgroup v1: `hugetlb.<size>.usage_in_bytes`, `hugetlb.<size>.rsvd.usage_in_bytes`,
//!   `hugetlb.<size>.numa_stat` (the same first line, then `hierarchical_total=…`).
//!
//! `<size>` is the kernel's short form: `2MB`, `1GB`, `64KB`. A size whose files are missing is
//! not in use there (older kernels lack `rsvd` and `numa_stat`: those read as absent, not zero).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{HostFs, SysfsError};
use crate::host::{NumaNode, PageSize};

/// The controller's name for a page size: `2MB`, `1GB`, `64KB`.
pub fn size_name(size: PageSize) -> String {
    const KB: u64 = 1024;
    let (value, unit) = match size.0 {
        b if b >= KB * KB * KB && b % (KB * KB * KB) == 0 => (b / (KB * KB * KB), "GB"),
        b if b >= KB * KB && b % (KB * KB) == 0 => (b / (KB * KB), "MB"),
        b => (b / KB, "KB"),
    };
    format!("{value}{unit}")
}

/// Which hierarchy a cgroup directory is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    V1,
    V2,
}

/// One page size in one cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeUsage {
    pub page_size_bytes: u64,
    /// Faulted hugepages charged to the cgroup, in bytes.
    pub in_use_bytes: u64,
    /// Reserved (by mappings, faulted or not), in bytes, where the kernel reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// In-use bytes per NUMA node, where the kernel reports it.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub per_node: BTreeMap<NumaNode, u64>,
}

/// Reads every size of `sizes` in the cgroup directory `dir` (a host path); sizes with no
/// usage file are left out.
pub fn read(
    host: &HostFs,
    dir: &str,
    hierarchy: Hierarchy,
    sizes: &[PageSize],
) -> Result<Vec<SizeUsage>, SysfsError> {
    let mut out = Vec::new();
    for &size in sizes {
        let name = size_name(size);
        let (current, rsvd) = match hierarchy {
            Hierarchy::V2 => ("current", "rsvd.current"),
            Hierarchy::V1 => ("usage_in_bytes", "rsvd.usage_in_bytes"),
        };
        let Some(in_use_bytes) = host.read_u64_opt(format!("{dir}/hugetlb.{name}.{current}"))?
        else {
            continue;
        };
        let reserved_bytes = host.read_u64_opt(format!("{dir}/hugetlb.{name}.{rsvd}"))?;
        let numa_file = format!("{dir}/hugetlb.{name}.numa_stat");
        let per_node = match host.read_string_opt(&numa_file)? {
            Some(text) => parse_numa_stat(&text).ok_or_else(|| SysfsError::Malformed {
                path: host.path(&numa_file),
                expected: "total=<bytes> N<node>=<bytes> …",
                found: text.clone(),
            })?,
            None => BTreeMap::new(),
        };
        out.push(SizeUsage {
            page_size_bytes: size.0,
            in_use_bytes,
            reserved_bytes,
            per_node,
        });
    }
    Ok(out)
}

/// The first line of `numa_stat`: `total=4194304 N0=4194304 N1=0`, as bytes per node.
pub fn parse_numa_stat(text: &str) -> Option<BTreeMap<NumaNode, u64>> {
    let first = text.lines().next()?;
    let mut fields = first.split_whitespace();
    fields.next()?.strip_prefix("total=")?.parse::<u64>().ok()?;
    fields
        .map(|f| {
            let (node, bytes) = f.strip_prefix('N')?.split_once('=')?;
            Some((NumaNode(node.parse().ok()?), bytes.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    #[test]
    fn size_names_are_the_kernels() {
        assert_eq!(size_name(PageSize(2 << 20)), "2MB");
        assert_eq!(size_name(PageSize(1 << 30)), "1GB");
        assert_eq!(size_name(PageSize(64 << 10)), "64KB");
        assert_eq!(size_name(PageSize(32 << 20)), "32MB");
        assert_eq!(size_name(PageSize(16 << 30)), "16GB");
    }

    #[test]
    fn numa_stat_of_both_hierarchies() {
        let v2 = parse_numa_stat("total=12582912 N0=8388608 N1=4194304\n").expect("valid");
        assert_eq!(
            v2,
            BTreeMap::from([(NumaNode(0), 8 << 20), (NumaNode(1), 4 << 20)])
        );
        let v1 =
            parse_numa_stat("total=2097152 N0=2097152\nhierarchical_total=2097152 N0=2097152\n")
                .expect("valid");
        assert_eq!(v1.get(&NumaNode(0)), Some(&(2 << 20)));
        assert_eq!(parse_numa_stat("N0=1"), None);
        assert_eq!(parse_numa_stat("total=1 Nx=1"), None);
    }

    #[test]
    fn v2_and_v1_files_and_missing_optional_ones() {
        let (_d, host) = tree(&[
            ("/cg/hugetlb.2MB.current", "4194304\n"),
            ("/cg/hugetlb.2MB.rsvd.current", "8388608\n"),
            ("/cg/hugetlb.2MB.numa_stat", "total=4194304 N0=4194304\n"),
            ("/cg/hugetlb.1GB.current", "0\n"),
            ("/v1/hugetlb.2MB.usage_in_bytes", "2097152\n"),
        ]);
        let sizes = [PageSize(2 << 20), PageSize(1 << 30)];
        let v2 = read(&host, "/cg", Hierarchy::V2, &sizes).expect("reads");
        assert_eq!(
            v2[0],
            SizeUsage {
                page_size_bytes: 2 << 20,
                in_use_bytes: 4 << 20,
                reserved_bytes: Some(8 << 20),
                per_node: BTreeMap::from([(NumaNode(0), 4 << 20)]),
            }
        );
        assert_eq!((v2[1].in_use_bytes, v2[1].reserved_bytes), (0, None));
        let v1 = read(&host, "/v1", Hierarchy::V1, &sizes).expect("reads");
        assert_eq!(v1.len(), 1, "no 1GB file there: {v1:?}");
        assert_eq!(v1[0].in_use_bytes, 2 << 20);
    }

    #[test]
    fn malformed_files_are_named() {
        let (_d, host) = tree(&[
            ("/cg/hugetlb.2MB.current", "0\n"),
            ("/cg/hugetlb.2MB.numa_stat", "garbage\n"),
        ]);
        let err = read(&host, "/cg", Hierarchy::V2, &[PageSize(2 << 20)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hugetlb.2MB.numa_stat: expected total="),
            "{err}"
        );
    }
}
