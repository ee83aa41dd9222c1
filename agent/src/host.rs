//! The host's vocabulary: NUMA node numbers, hugepage sizes, the pools the kernel reports, and a
//! node's CPUs and distances. Plain values at the bottom of the agent: the readers (`sysfs`)
//! produce them, the map, the Memory Manager, the Topology Manager's merge and the API consume
//! them, and none of those is imported here. Typed keys (`NumaNode`, `PageSize`) instead of
//! strings keep node numbers and sizes from being mixed up.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::quantity;

/// A NUMA node number (`node<N>` in sysfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NumaNode(pub u32);

/// A hugepage size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PageSize(pub u64);

impl PageSize {
    /// Parses a sysfs directory name `hugepages-<kB>kB`.
    pub fn from_dir_name(name: &str) -> Option<PageSize> {
        let kb: u64 = name
            .strip_prefix("hugepages-")?
            .strip_suffix("kB")?
            .parse()
            .ok()?;
        kb.checked_mul(1024).filter(|&b| b > 0).map(PageSize)
    }

    /// The sysfs directory name, `hugepages-2048kB`.
    pub fn dir_name(self) -> String {
        format!("hugepages-{}kB", self.0 / 1024)
    }

    /// The Kubernetes resource name, `hugepages-2Mi`.
    pub fn resource_name(self) -> String {
        format!("hugepages-{self}")
    }
}

impl fmt::Display for PageSize {
    /// As Kubernetes prints the size in a resource name: `2Mi`, `1Gi`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&quantity::format_binary(self.0))
    }
}

/// One node's pool of one size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    pub node: NumaNode,
    #[serde(rename = "pageSizeBytes")]
    pub size: PageSize,
    pub total: u64,
    pub free: u64,
    pub surplus: u64,
}

/// The system-wide pool of one size; only here does the kernel report reservations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalPool {
    #[serde(rename = "pageSizeBytes")]
    pub size: PageSize,
    pub total: u64,
    pub free: u64,
    /// `resv_hugepages`: promised to mappings but not yet faulted (still counted in `free`).
    pub reserved: u64,
    pub surplus: u64,
}

/// Every pool of the host at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HugepageTable {
    pub nodes: Vec<NodePool>,
    pub global: Vec<GlobalPool>,
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub node: NumaNode,
    pub cpus: Vec<u32>,
    /// Distance to each node, in the order of the node list (10 is local).
    pub distances: Vec<u32>,
}
