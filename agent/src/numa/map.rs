//! The hugepage map: one writer publishes immutable snapshots, any number of readers load the
//! latest without waiting (an `ArcSwap` pointer swap).
//!
//! The writer re-reads sysfs in full on each reconcile, and only the page sizes a hugetlb fault
//! touched when the probes prompt it. Each snapshot carries a generation, the wall-clock time it
//! was read, where its freshness comes from, and, when a fault prompted it, the delay from that
//! fault to the snapshot (both clocks `CLOCK_MONOTONIC`, as `bpf_ktime_get_ns`).
//!
//! A pool whose files cannot be read (or whose directory has gone while its node is still there)
//! keeps its last good figures, marked [`Stale`]: since when, and the error naming the file. The
//! other pools are re-read as usual, and the mark goes with the first read that succeeds again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::Notify;

use crate::{
    host::{GlobalPool, HugepageTable, NodeInfo, NodePool, NumaNode, PageSize},
    sysfs::{HostFs, SysfsError, hugepages, topology},
};

/// What keeps the map fresh between reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Source {
    /// Hugetlb faults seen by the probes prompt re-reads of sysfs.
    #[serde(rename = "ebpf+sysfs")]
    EbpfSysfs,
    /// Only the periodic reconcile.
    #[serde(rename = "sysfs")]
    Sysfs,
}

impl std::fmt::Display for Source {
    /// The name the API uses.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::EbpfSysfs => "ebpf+sysfs",
            Source::Sysfs => "sysfs",
        })
    }
}

/// One page size on one node, as `GET /v1/hugepages` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SizeView {
    pub page_size_bytes: u64,
    pub total: u64,
    pub free: u64,
    pub surplus: u64,
    /// Present while these figures are the last good ones: the pool's files cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<Stale>,
}

/// Why a pool's figures are the last good ones, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stale {
    /// The first read that failed; the figures are from the read before it.
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub since: SystemTime,
    /// The latest error, naming the file.
    pub error: String,
}

/// One system-wide pool, as `GET /v1/hugepages` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GlobalView {
    #[serde(flatten)]
    pub pool: GlobalPool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale: Option<Stale>,
}

/// A pool: one node's (`node`), or the system-wide one (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PoolKey {
    pub node: Option<NumaNode>,
    pub size: PageSize,
}

impl PoolKey {
    /// The pool's directory (host path, before `--host-root`).
    pub fn dir(self) -> String {
        match self.node {
            Some(node) => hugepages::node_pool_dir(node, self.size),
            None => hugepages::global_pool_dir(self.size),
        }
    }
}

/// One NUMA node: its CPUs, distances and pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    #[serde(flatten)]
    pub info: NodeInfo,
    pub sizes: Vec<SizeView>,
}

/// The map at one moment.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub generation: u64,
    #[serde(serialize_with = "rfc3339")]
    pub updated_at: SystemTime,
    pub source: Source,
    pub nodes: Vec<NodeView>,
    pub global: Vec<GlobalView>,
    /// Delay from the hugetlb fault that prompted this snapshot to its publication.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "micros",
        rename = "faultToMapMicros"
    )]
    pub fault_to_map: Option<Duration>,
}

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_rfc3339_micros(*t).to_string())
}

fn from_rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_rfc3339_weak(&text).map_err(serde::de::Error::custom)
}

fn micros<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.map_or(0, |d| d.as_micros() as u64))
}

/// A handle readers clone and load from.
#[derive(Debug, Clone)]
pub struct MapReader {
    shared: Arc<ArcSwap<Snapshot>>,
    published: Arc<Notify>,
}

impl MapReader {
    pub fn load(&self) -> Arc<Snapshot> {
        self.shared.load_full()
    }

    /// Woken after each snapshot the writer publishes (one permit kept when nobody waits): for
    /// the one task that follows the map's changes (the watch's hub).
    pub fn published(&self) -> Arc<Notify> {
        Arc::clone(&self.published)
    }
}

/// The only writer of the map.
#[derive(Debug)]
pub struct MapWriter {
    host: HostFs,
    shared: Arc<ArcSwap<Snapshot>>,
    published: Arc<Notify>,
    topology: Vec<NodeInfo>,
    table: HugepageTable,
    generation: u64,
    source: Source,
    /// Pools whose last read failed (those with figures keep them).
    stale: BTreeMap<PoolKey, Stale>,
    /// The delay from its fault to the last change a fault prompted, while no other change
    /// came after it: a re-read that changes nothing keeps it.
    fault_to_map: Option<Duration>,
}

/// What one re-read found: the pools that changed, and those whose files turned unreadable or
/// readable again.
#[derive(Debug, Default)]
pub struct Reread {
    pub changes: Vec<Change>,
    /// Pools that could not be read this time but could the time before, with the error.
    pub unreadable: Vec<(PoolKey, SysfsError)>,
    /// Pools read again after failing, with what their mark said.
    pub recovered: Vec<(PoolKey, Stale)>,
    /// From the fault that prompted this read to its snapshot, when the read saw a change.
    pub fault_to_map: Option<Duration>,
}

/// A pool whose counts differ from the previous snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub before: Option<NodePool>,
    pub now: NodePool,
}

impl MapWriter {
    /// Reads everything and publishes generation 1.
    pub fn new(host: HostFs, source: Source) -> Result<(MapWriter, MapReader), SysfsError> {
        let topology = topology::read(&host)?;
        let table = hugepages::read_table(&host)?;
        let stale = BTreeMap::new();
        let first = build(1, source, &topology, &table, &stale, None);
        let shared = Arc::new(ArcSwap::from_pointee(first));
        let published = Arc::new(Notify::new());
        let writer = MapWriter {
            host,
            shared: shared.clone(),
            published: published.clone(),
            topology,
            table,
            generation: 1,
            source,
            stale,
            fault_to_map: None,
        };
        Ok((writer, MapReader { shared, published }))
    }

    /// The snapshot last published.
    pub fn current(&self) -> Arc<Snapshot> {
        self.shared.load_full()
    }

    pub fn set_source(&mut self, source: Source) {
        self.source = source;
        self.publish(self.fault_to_map);
    }

    /// Re-reads topology and every pool. A failed topology read changes nothing; a pool that
    /// cannot be read keeps its last figures, marked stale.
    pub fn reconcile(&mut self) -> Result<Reread, SysfsError> {
        self.topology = topology::read(&self.host)?;
        self.reread(None, None)
    }

    /// Re-reads the pools of `sizes` only (all sizes when `None`), prompted by a fault at
    /// `fault_at` (CLOCK_MONOTONIC).
    pub fn refresh(
        &mut self,
        sizes: Option<&BTreeSet<PageSize>>,
        fault_at: Option<Duration>,
    ) -> Result<Reread, SysfsError> {
        self.reread(sizes, fault_at)
    }

    fn reread(
        &mut self,
        sizes: Option<&BTreeSet<PageSize>>,
        fault_at: Option<Duration>,
    ) -> Result<Reread, SysfsError> {
        let nodes: Vec<NumaNode> = self.topology.iter().map(|n| n.node).collect();
        let sizes: BTreeSet<PageSize> = match sizes {
            Some(sizes) => sizes.clone(),
            None => hugepages::all_sizes(&self.host, &nodes)?
                .into_iter()
                .chain(self.table.global.iter().map(|g| g.size))
                .chain(self.table.nodes.iter().map(|p| p.size))
                .collect(),
        };
        let mut table = self.table.clone();
        table
            .nodes
            .retain(|p| !sizes.contains(&p.size) && nodes.contains(&p.node));
        table.global.retain(|g| !sizes.contains(&g.size));
        self.stale
            .retain(|k, _| k.node.is_none_or(|n| nodes.contains(&n)));
        let mut out = Reread::default();
        let now = SystemTime::now();
        for &size in &sizes {
            for &node in &nodes {
                let key = PoolKey {
                    node: Some(node),
                    size,
                };
                let before = self
                    .table
                    .nodes
                    .iter()
                    .find(|p| p.node == node && p.size == size);
                let read = hugepages::read_node_pool(&self.host, node, size);
                if let Some(pool) = settle(
                    &self.host,
                    &mut self.stale,
                    key,
                    read,
                    before,
                    now,
                    &mut out,
                ) {
                    table.nodes.push(pool);
                }
            }
            let key = PoolKey { node: None, size };
            let before = self.table.global.iter().find(|g| g.size == size);
            let read = hugepages::read_global_pool(&self.host, size);
            if let Some(pool) = settle(
                &self.host,
                &mut self.stale,
                key,
                read,
                before,
                now,
                &mut out,
            ) {
                table.global.push(pool);
            }
        }
        table.nodes.sort_by_key(|p| (p.node, p.size));
        table.global.sort_by_key(|g| g.size);
        (out.changes, out.fault_to_map) = self.replace(table, fault_at);
        Ok(out)
    }

    /// Publishes `table`; what changed, and the delay from `fault_at` when something did.
    fn replace(
        &mut self,
        table: HugepageTable,
        fault_at: Option<Duration>,
    ) -> (Vec<Change>, Option<Duration>) {
        let changes: Vec<Change> = table
            .nodes
            .iter()
            .filter_map(|now| {
                let before = self
                    .table
                    .nodes
                    .iter()
                    .find(|p| p.node == now.node && p.size == now.size);
                (before != Some(now)).then(|| Change {
                    before: before.cloned(),
                    now: now.clone(),
                })
            })
            .collect();
        self.table = table;
        // The delay is the fault's only if this read saw what it did; the snapshot of a read
        // that saw nothing new (a later fault of pages an earlier read saw taken) keeps the
        // last change's.
        let measured = fault_at
            .filter(|_| !changes.is_empty())
            .map(|at| monotonic_now().saturating_sub(at));
        let shown = if changes.is_empty() {
            self.fault_to_map
        } else {
            measured
        };
        self.publish(shown);
        (changes, measured)
    }

    fn publish(&mut self, delay: Option<Duration>) {
        self.generation += 1;
        self.fault_to_map = delay;
        let snapshot = build(
            self.generation,
            self.source,
            &self.topology,
            &self.table,
            &self.stale,
            delay,
        );
        self.shared.store(Arc::new(snapshot));
        self.published.notify_one();
    }
}

/// What the map holds for `key` after `read`: the figures read, or the last ones (marked
/// stale) when the read failed or the directory went. Records the transitions in `out`.
fn settle<P: Clone>(
    host: &HostFs,
    stale: &mut BTreeMap<PoolKey, Stale>,
    key: PoolKey,
    read: Result<Option<P>, SysfsError>,
    before: Option<&P>,
    now: SystemTime,
    out: &mut Reread,
) -> Option<P> {
    let err = match read {
        Ok(Some(pool)) => {
            if let Some(mark) = stale.remove(&key) {
                out.recovered.push((key, mark));
            }
            return Some(pool);
        }
        Ok(None) if before.is_none() => {
            stale.remove(&key);
            return None;
        }
        Ok(None) => SysfsError::Read {
            path: host.path(key.dir()),
            source: std::io::ErrorKind::NotFound.into(),
        },
        Err(err) => err,
    };
    let error = err.to_string();
    match stale.get_mut(&key) {
        Some(mark) => mark.error = error,
        None => {
            stale.insert(key, Stale { since: now, error });
            out.unreadable.push((key, err));
        }
    }
    before.cloned()
}

fn build(
    generation: u64,
    source: Source,
    topology: &[NodeInfo],
    table: &HugepageTable,
    stale: &BTreeMap<PoolKey, Stale>,
    fault_to_map: Option<Duration>,
) -> Snapshot {
    let mark = |node, size| stale.get(&PoolKey { node, size }).cloned();
    let nodes = topology
        .iter()
        .map(|info| NodeView {
            info: info.clone(),
            sizes: table
                .nodes
                .iter()
                .filter(|p| p.node == info.node)
                .map(|p| SizeView {
                    page_size_bytes: p.size.0,
                    total: p.total,
                    free: p.free,
                    surplus: p.surplus,
                    stale: mark(Some(p.node), p.size),
                })
                .collect(),
        })
        .collect();
    Snapshot {
        generation,
        updated_at: SystemTime::now(),
        source,
        nodes,
        global: table
            .global
            .iter()
            .map(|g| GlobalView {
                pool: g.clone(),
                stale: mark(None, g.size),
            })
            .collect(),
        fault_to_map,
    }
}

/// The per-node rows of `nodes` (the inverse of how a snapshot groups them).
pub fn node_pools(nodes: &[NodeView]) -> Vec<NodePool> {
    nodes
        .iter()
        .flat_map(|n| {
            n.sizes.iter().map(|s| NodePool {
                node: n.info.node,
                size: PageSize(s.page_size_bytes),
                total: s.total,
                free: s.free,
                surplus: s.surplus,
            })
        })
        .collect()
}

/// CLOCK_MONOTONIC now, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests;
