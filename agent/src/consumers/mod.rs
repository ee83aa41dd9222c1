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
    holders::Holders,
    host::{HugepageTable, NumaNode, PageSize},
    kubelet::{
        cgroup_path::{Owner, Qos, classify},
        pods::V1_HUGETLB,
    },
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

    /// Keeps the cgroups `exists` says are still there (a rescan finds those whose rmdir was
    /// lost).
    pub fn retain(&self, exists: impl Fn(u64) -> bool) {
        if let Ok(mut book) = self.0.lock() {
            book.retain(|&id, _| exists(id));
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

/// A cgroup the hugetlb controller reports on.
struct Charged {
    /// Path in its hierarchy.
    rel: String,
    /// Host path of its directory.
    dir: String,
    usage: Vec<SizeUsage>,
}

/// Walks the v2 hierarchy and a v1 hugetlb hierarchy (the controller is bound to one of them, so
/// nothing is counted twice) and reads every cgroup's hugetlb files.
fn charged(host: &HostFs, sizes: &[PageSize]) -> Result<Vec<Charged>, ConsumersError> {
    let mut roots = Vec::new();
    if let Some(v2) = CgroupV2::find(host) {
        roots.push((v2.mount, Hierarchy::V2));
    }
    if host.exists(format!("{V1_HUGETLB}/cgroup.procs")) {
        roots.push((V1_HUGETLB.to_owned(), Hierarchy::V1));
    }
    let mut rels = Vec::new();
    for (mount, hierarchy) in roots {
        cgroup_tree::walk(host, &mount, |rel| {
            // The root has no hugetlb files.
            if !rel.is_empty() {
                rels.push((format!("{mount}{rel}"), rel.to_owned(), hierarchy));
            }
        })?;
    }
    let mut out = Vec::with_capacity(rels.len());
    for (dir, rel, hierarchy) in rels {
        match hugetlb_cgroup::read(host, &dir, hierarchy, sizes) {
            Ok(usage) => out.push(Charged { rel, dir, usage }),
            // Removed since the walk saw it.
            Err(SysfsError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(out)
}

/// Lists the consumers of the sizes in `pools`, largest first.
pub fn list(
    host: &HostFs,
    pools: &HugepageTable,
    faults: &FaultBook,
) -> Result<Vec<Consumer>, ConsumersError> {
    let sizes: Vec<PageSize> = pools.global.iter().map(|g| g.size).collect();
    let mut out = Vec::new();
    let mut top_level = TopLevel::default();
    for c in charged(host, &sizes)? {
        let is_top = c.rel.matches('/').count() == 1;
        if is_top {
            top_level.add(&c.usage);
        }
        let (kind, pod_uid, qos, container_id) = match classify(&c.rel) {
            Owner::Pod {
                uid,
                qos,
                container: Some(container),
            } => (Kind::Container, Some(uid.0), Some(qos), Some(container.id)),
            Owner::Pod {
                uid,
                qos,
                container: None,
            } => (Kind::Pod, Some(uid.0), Some(qos), None),
            Owner::System if is_top && !c.rel.starts_with("/kubepods") => {
                (Kind::System, None, None, None)
            }
            Owner::System => continue,
        };
        let in_use_bytes: u64 = c.usage.iter().map(|u| u.in_use_bytes).sum();
        let seen = std::fs::metadata(host.path(&c.dir))
            .ok()
            .and_then(|m| faults.get(m.ino()));
        if in_use_bytes == 0 && seen.is_none() {
            continue;
        }
        out.push(Consumer {
            kind,
            pod_uid,
            qos,
            container_id,
            cgroup: c.rel,
            in_use_bytes,
            sizes: c.usage,
            faults: seen.map_or(0, |s| s.count),
            first_fault: seen.map(|s| s.first),
            last_fault: seen.map(|s| s.last),
        });
    }
    out.extend(top_level.outside_cgroups(pools));
    out.sort_by(|a, b| {
        b.in_use_bytes
            .cmp(&a.in_use_bytes)
            .then_with(|| a.cgroup.cmp(&b.cgroup))
    });
    Ok(out)
}

/// The answer of `GET /v1/consumers`: who is charged with the pages (the cgroups), and what
/// holds the pages that are not a running process's private mapping ([`crate::holders`]),
/// which is where the `system` entry's pages are named.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub consumers: Vec<Consumer>,
    #[serde(flatten)]
    pub held: Holders,
}

impl Answer {
    pub fn new(consumers: Vec<Consumer>, held: Holders) -> Answer {
        Answer { consumers, held }
    }
}

/// Bytes charged to top-level cgroups, per size, in all and per node.
#[derive(Default)]
struct TopLevel(BTreeMap<PageSize, (u64, BTreeMap<NumaNode, u64>)>);

impl TopLevel {
    fn add(&mut self, usage: &[SizeUsage]) {
        for u in usage {
            let (total, nodes) = self.0.entry(PageSize(u.page_size_bytes)).or_default();
            *total += u.in_use_bytes;
            for (&node, &bytes) in &u.per_node {
                *nodes.entry(node).or_default() += bytes;
            }
        }
    }

    /// What the pools show in use (`total - free` per node) beyond every top-level cgroup: one
    /// `system` entry for `/`, or none.
    fn outside_cgroups(&self, pools: &HugepageTable) -> Option<Consumer> {
        let mut sizes = Vec::new();
        for g in &pools.global {
            let (charged, charged_on) = self.0.get(&g.size).cloned().unwrap_or_default();
            let rest = (g.total.saturating_sub(g.free))
                .saturating_mul(g.size.0)
                .saturating_sub(charged);
            if rest == 0 {
                continue;
            }
            let per_node = pools
                .nodes
                .iter()
                .filter(|p| p.size == g.size)
                .filter_map(|p| {
                    let used = p.total.saturating_sub(p.free).saturating_mul(p.size.0);
                    let rest = used.saturating_sub(charged_on.get(&p.node).copied().unwrap_or(0));
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
        (!sizes.is_empty()).then(|| Consumer {
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
}

#[cfg(test)]
mod tests;
