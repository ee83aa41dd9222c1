//! Who holds the hugepages (`GET /v1/consumers`): every pod, container and other cgroup that the
//! hugetlb controller charges with hugepages, read fresh, with the hugetlb faults the probes saw
//! in it.
//!
//! The cgroup tree (v2, and a v1 hugetlb hierarchy when one is mounted) is walked; each cgroup
//! is classified by its path ([`crate::kubelet::cgroup_path`]). Pod cgroups and container
//! cgroups are listed with their own (hierarchical) usage, so a pod's figure includes its
//! containers'. Other top-level cgroups that hold pages are listed as `system`, and what the
//! kernel's pools show in use beyond every top-level cgroup (tasks in the root cgroup, or no
//! hugetlb controller) is one `system` entry for `/`. Sorted by pages in use, largest first, a
//! pod before its containers.

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::MetadataExt,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use serde::{Serialize, Serializer};

use crate::{
    kubelet::{
        cgroup_path::{Owner, Qos, classify},
        pods::V1_HUGETLB,
    },
    numa::{HugepageTable, NumaNode, PageSize},
    probes::watch::CgroupV2,
    sysfs::{
        HostFs, SysfsError, cgroup_tree,
        hugetlb_cgroup::{self, Hierarchy, SizeUsage},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum ConsumersError {
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
}

/// Hugetlb faults seen in one cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultStats {
    pub count: u64,
    pub first: SystemTime,
    pub last: SystemTime,
}

/// Faults per cgroup id, kept by the run loop and read by the API.
#[derive(Debug, Clone, Default)]
pub struct FaultBook(Arc<Mutex<HashMap<u64, FaultStats>>>);

impl FaultBook {
    pub fn record(&self, cgroup_id: u64, at: SystemTime) {
        if let Ok(mut book) = self.0.lock() {
            book.entry(cgroup_id)
                .and_modify(|s| {
                    s.count += 1;
                    s.last = at;
                })
                .or_insert(FaultStats {
                    count: 1,
                    first: at,
                    last: at,
                });
        }
    }

    /// A removed cgroup's faults are dropped with it.
    pub fn forget(&self, cgroup_id: u64) {
        if let Ok(mut book) = self.0.lock() {
            book.remove(&cgroup_id);
        }
    }

    pub fn get(&self, cgroup_id: u64) -> Option<FaultStats> {
        self.0.lock().ok()?.get(&cgroup_id).copied()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Pod,
    Container,
    System,
}

/// One consumer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos: Option<Qos>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The cgroup (path in its hierarchy).
    pub cgroup: String,
    /// Bytes of hugepages in use, all sizes.
    pub in_use_bytes: u64,
    pub sizes: Vec<SizeUsage>,
    pub faults: u64,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339")]
    pub first_fault: Option<SystemTime>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "rfc3339")]
    pub last_fault: Option<SystemTime>,
}

fn rfc3339<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string()),
        None => s.serialize_none(),
    }
}

/// Walks the hierarchies and lists the consumers of the sizes in `pools`.
pub fn list(
    host: &HostFs,
    pools: &HugepageTable,
    faults: &FaultBook,
) -> Result<Vec<Consumer>, ConsumersError> {
    let sizes: Vec<PageSize> = pools.global.iter().map(|g| g.size).collect();
    let mut roots = Vec::new();
    if let Some(v2) = CgroupV2::find(host) {
        roots.push((v2.mount, Hierarchy::V2));
    }
    if host.exists(format!("{V1_HUGETLB}/cgroup.procs")) {
        roots.push((V1_HUGETLB.to_owned(), Hierarchy::V1));
    }
    let mut out = Vec::new();
    // Bytes per (size, node) charged to top-level cgroups, to find what no cgroup holds.
    let mut top_level: BTreeMap<(PageSize, NumaNode), u64> = BTreeMap::new();
    let mut top_level_total: BTreeMap<PageSize, u64> = BTreeMap::new();
    let mut failed = None;
    for (mount, hierarchy) in &roots {
        cgroup_tree::walk(host, mount, |rel| {
            if rel.is_empty() || failed.is_some() {
                return; // the root has no hugetlb files
            }
            let rel = rel.to_owned();
            let dir = format!("{mount}{rel}");
            let usage = match hugetlb_cgroup::read(host, &dir, *hierarchy, &sizes) {
                Ok(usage) => usage,
                Err(SysfsError::Read { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return; // removed while we walked
                }
                Err(err) => {
                    failed = Some(err.into());
                    return;
                }
            };
            let in_use: u64 = usage.iter().map(|u| u.in_use_bytes).sum();
            let owner = classify(&rel);
            let is_top = rel.matches('/').count() == 1;
            if is_top && (*hierarchy == Hierarchy::V2 || roots.len() == 1) {
                for u in &usage {
                    *top_level_total
                        .entry(PageSize(u.page_size_bytes))
                        .or_default() += u.in_use_bytes;
                    for (&node, &bytes) in &u.per_node {
                        *top_level
                            .entry((PageSize(u.page_size_bytes), node))
                            .or_default() += bytes;
                    }
                }
            }
            let id = std::fs::metadata(host.path(&dir)).map(|m| m.ino()).ok();
            let seen = id.and_then(|id| faults.get(id));
            let entry = |kind, pod_uid, qos, container_id| Consumer {
                kind,
                pod_uid,
                qos,
                container_id,
                cgroup: rel.clone(),
                in_use_bytes: in_use,
                sizes: usage.clone(),
                faults: seen.map_or(0, |s| s.count),
                first_fault: seen.map(|s| s.first),
                last_fault: seen.map(|s| s.last),
            };
            match owner {
                Owner::Pod {
                    uid,
                    qos,
                    container,
                } => {
                    let (kind, container_id) = match container {
                        Some(c) => (Kind::Container, Some(c.id)),
                        None => (Kind::Pod, None),
                    };
                    if in_use > 0 || seen.is_some() {
                        out.push(entry(kind, Some(uid.0), Some(qos), container_id));
                    }
                }
                Owner::System if is_top && !rel.starts_with("/kubepods") => {
                    if in_use > 0 || seen.is_some() {
                        out.push(entry(Kind::System, None, None, None));
                    }
                }
                Owner::System => {}
            }
        });
    }
    if let Some(err) = failed {
        return Err(err);
    }
    if let Some(rest) = outside_cgroups(pools, &top_level, &top_level_total) {
        out.push(rest);
    }
    out.sort_by(|a, b| {
        b.in_use_bytes
            .cmp(&a.in_use_bytes)
            .then_with(|| a.cgroup.cmp(&b.cgroup))
    });
    Ok(out)
}

/// What the pools show in use (`total - free` per node) beyond every top-level cgroup.
fn outside_cgroups(
    pools: &HugepageTable,
    top_level: &BTreeMap<(PageSize, NumaNode), u64>,
    top_level_total: &BTreeMap<PageSize, u64>,
) -> Option<Consumer> {
    let mut sizes = Vec::new();
    for g in &pools.global {
        let in_use = (g.total.saturating_sub(g.free)).saturating_mul(g.size.0);
        let charged = top_level_total.get(&g.size).copied().unwrap_or(0);
        let rest = in_use.saturating_sub(charged);
        if rest == 0 {
            continue;
        }
        let per_node = pools
            .nodes
            .iter()
            .filter(|p| p.size == g.size)
            .filter_map(|p| {
                let used = p.total.saturating_sub(p.free).saturating_mul(p.size.0);
                let charged = top_level.get(&(p.size, p.node)).copied().unwrap_or(0);
                let rest = used.saturating_sub(charged);
                (rest > 0).then_some((p.node, rest))
            })
            .collect();
        sizes.push(SizeUsage {
            page_size_bytes: g.size.0,
            in_use_bytes: rest,
            reserved_bytes: None,
            per_node,
        });
    }
    if sizes.is_empty() {
        return None;
    }
    Some(Consumer {
        kind: Kind::System,
        pod_uid: None,
        qos: None,
        container_id: None,
        cgroup: "/".to_owned(),
        in_use_bytes: sizes.iter().map(|s| s.in_use_bytes).sum(),
        sizes,
        faults: 0,
        first_fault: None,
        last_fault: None,
    })
}

#[cfg(test)]
mod tests;
