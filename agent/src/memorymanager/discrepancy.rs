//! KEP-5759's proposed discrepancy: per NUMA node and hugepage size, what the Memory Manager's
//! state believes is free against what the kernel has free (`free_hugepages` × size), in bytes.
//! Positive means the kubelet would admit against pages that are gone. The explanation names
//! the cgroups holding hugepages on that node that the Memory Manager does not track (pods absent
//! from its assignments, system cgroups, and pages outside any cgroup), and, as a cause of its
//! own, the files and segments that hold pages while nothing that runs maps, holds or attaches
//! them ([`crate::holders`]), which the kubelet never counts.

use std::collections::BTreeSet;

use serde::Serialize;

use super::state::MemoryManagerState;
use crate::{
    consumers::{Consumer, Kind},
    holders::{self, Holders, NodesFrom},
    host::NumaNode,
    numa::map::Snapshot,
    quantity::format_binary,
};

/// One node and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discrepancy {
    pub numa_node: u32,
    pub resource: String,
    pub page_size_bytes: u64,
    /// `free` of the Memory Manager's table.
    pub memory_manager_free_bytes: u64,
    /// `free_hugepages` × page size.
    pub os_free_bytes: u64,
    /// Memory Manager free minus OS free.
    pub discrepancy_bytes: i128,
    /// Who holds hugepages of this size on this node without the Memory Manager knowing.
    pub untracked: Vec<Holder>,
    /// Files and segments of this size that hold pages while nothing that runs maps, holds or
    /// attaches them, on this node or on a node the kernel does not show.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_by_nothing_that_runs: Vec<Orphan>,
    pub explanation: String,
}

/// A holder that nothing that runs uses ([`crate::holders::Holder`]), as a cause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    pub kind: holders::Kind,
    /// The file's path, or `shmid <id>`.
    pub name: String,
    /// Bytes on this node, or in all when the node is not known.
    pub bytes: u64,
    /// Whether the pages are known to be on this node; `false`: on a node the kernel does not
    /// show.
    pub node_known: bool,
}

/// A cgroup (or the rest outside any cgroup) holding hugepages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    pub bytes: u64,
}

/// Compares `state` with the kernel's pools in `snapshot`; `consumers` (from the cgroup
/// inventory) and `held` (the holders' walk), when given, explain the difference.
pub fn compute(
    state: &MemoryManagerState,
    snapshot: &Snapshot,
    consumers: Option<&[Consumer]>,
    held: Option<&Holders>,
) -> Vec<Discrepancy> {
    let tracked: BTreeSet<&str> = state
        .entries
        .keys()
        .chain(state.pod_entries.keys())
        .map(String::as_str)
        .collect();
    let mut out = Vec::new();
    for node in &snapshot.nodes {
        let NumaNode(id) = node.info.node;
        let Some(node_state) = state.machine_state.get(&(id as usize)) else {
            continue;
        };
        for size in &node.sizes {
            let resource = format!("hugepages-{}", format_binary(size.page_size_bytes));
            let Some(table) = node_state.memory_map.get(&resource) else {
                continue;
            };
            let os_free = size.free.saturating_mul(size.page_size_bytes);
            let untracked = consumers
                .map(|all| holders(all, &tracked, node.info.node, size.page_size_bytes))
                .unwrap_or_default();
            let discrepancy = i128::from(table.free) - i128::from(os_free);
            let orphans = held
                .map(|h| orphans(h, node.info.node, size.page_size_bytes))
                .unwrap_or_default();
            let mut explanation = explain(discrepancy, &untracked, consumers.is_some());
            explanation.push_str(&explain_orphans(&orphans));
            out.push(Discrepancy {
                numa_node: id,
                resource,
                page_size_bytes: size.page_size_bytes,
                memory_manager_free_bytes: table.free,
                os_free_bytes: os_free,
                discrepancy_bytes: discrepancy,
                untracked,
                held_by_nothing_that_runs: orphans,
                explanation,
            });
        }
    }
    out
}

fn holders(
    consumers: &[Consumer],
    tracked: &BTreeSet<&str>,
    node: NumaNode,
    page_size: u64,
) -> Vec<Holder> {
    let bytes_of = |c: &Consumer| -> u64 {
        c.sizes
            .iter()
            .filter(|s| s.page_size_bytes == page_size)
            .filter_map(|s| s.per_node.get(&node))
            .sum()
    };
    let pods: Vec<&Consumer> = consumers.iter().filter(|c| c.kind == Kind::Pod).collect();
    let mut out: Vec<Holder> = consumers
        .iter()
        // Pods stand for their containers; system entries are top-level cgroups and the rest.
        .filter(|c| matches!(c.kind, Kind::Pod | Kind::System))
        .filter(|c| {
            c.pod_uid
                .as_deref()
                .is_none_or(|uid| !tracked.contains(uid))
        })
        .filter_map(|c| {
            let mut bytes = bytes_of(c);
            if c.kind == Kind::System {
                // A system cgroup's figure includes any pod cgroups below it: those are named.
                let below = format!("{}/", c.cgroup);
                let nested: u64 = pods
                    .iter()
                    .filter(|p| p.cgroup.starts_with(&below))
                    .map(|p| bytes_of(p))
                    .sum();
                bytes = bytes.saturating_sub(nested);
            }
            (bytes > 0).then(|| Holder {
                cgroup: c.cgroup.clone(),
                pod_uid: c.pod_uid.clone(),
                qos: c.qos.map(|q| q.to_string()),
                bytes,
            })
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.cgroup.cmp(&b.cgroup)));
    out
}

/// The holders of `page_size` held by nothing that runs that are, or may be, on `node`.
fn orphans(held: &Holders, node: NumaNode, page_size: u64) -> Vec<Orphan> {
    held.holders
        .iter()
        .filter(|h| h.held_by_nothing_that_runs && h.page_size_bytes == page_size)
        .filter_map(|h| {
            let node_known = matches!(h.nodes_from, NodesFrom::Mappings | NodesFrom::Queried);
            let bytes = if node_known {
                h.per_node.get(&node).copied().unwrap_or(0)
            } else {
                h.held_bytes
            };
            let name = match (&h.path, h.shmid) {
                (Some(path), _) => path.clone(),
                (None, Some(id)) => format!("shmid {id}"),
                (None, None) => return None,
            };
            (bytes > 0).then_some(Orphan {
                kind: h.kind,
                name,
                bytes,
                node_known,
            })
        })
        .collect()
}

fn explain_orphans(orphans: &[Orphan]) -> String {
    if orphans.is_empty() {
        return String::new();
    }
    let each: Vec<String> = orphans
        .iter()
        .map(|o| {
            let kind = match o.kind {
                holders::Kind::SysvSegment => "SysV segment",
                holders::Kind::Memfd => "memfd",
                _ => "hugetlbfs file",
            };
            let node = if o.node_known {
                ""
            } else {
                " (its node not known)"
            };
            format!("{kind} {} {}{node}", o.name, format_binary(o.bytes))
        })
        .collect();
    format!(
        "; held by nothing that runs, which the kubelet never counts: {}",
        each.join(", ")
    )
}

fn explain(discrepancy: i128, untracked: &[Holder], inventory: bool) -> String {
    let amount =
        |bytes: i128| format_binary(u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX));
    if discrepancy <= 0 {
        return if discrepancy == 0 {
            "the Memory Manager and the kernel agree".into()
        } else {
            format!(
                "the kernel has {} more free than the Memory Manager believes (pages it assigned are not in use yet, or the pool grew)",
                amount(discrepancy)
            )
        };
    }
    let mut text = format!(
        "the Memory Manager believes {} more is free than the kernel has: admission by its bookkeeping alone would fail at start-up",
        amount(discrepancy)
    );
    if !inventory {
        text.push_str("; the cgroup inventory could not be read to say who holds them");
    } else if untracked.is_empty() {
        text.push_str("; no untracked cgroup holds pages on this node (pages mapped but not yet faulted, or tracked pods using more than assigned)");
    } else {
        let who: Vec<String> = untracked
            .iter()
            .map(|h| match (&h.pod_uid, &h.qos) {
                (Some(uid), Some(qos)) => format!("pod {uid} ({qos}) {}", format_binary(h.bytes)),
                (Some(uid), None) => format!("pod {uid} {}", format_binary(h.bytes)),
                _ => format!("{} {}", h.cgroup, format_binary(h.bytes)),
            })
            .collect();
        text.push_str("; held by what it does not track: ");
        text.push_str(&who.join(", "));
    }
    text
}

#[cfg(test)]
mod tests;
