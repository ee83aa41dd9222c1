//! The hugepage map: one writer publishes immutable snapshots, any number of readers load the
//! latest without waiting (an `ArcSwap` pointer swap).
//!
//! The writer re-reads sysfs in full on each reconcile, and only the page sizes a hugetlb fault
//! touched when the probes prompt it. Each snapshot carries a generation, the wall-clock time it
//! was read, where its freshness comes from, and, when a fault prompted it, the delay from that
//! fault to the snapshot (both clocks `CLOCK_MONOTONIC`, as `bpf_ktime_get_ns`).

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize, Serializer};

use crate::{
    host::{GlobalPool, HugepageTable, NodeInfo, NodePool, NumaNode, PageSize},
    sysfs::{HostFs, SysfsError, hugepages, topology},
};

/// What keeps the map fresh between reconciles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    pub global: Vec<GlobalPool>,
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

fn micros<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.map_or(0, |d| d.as_micros() as u64))
}

/// A handle readers clone and load from.
#[derive(Debug, Clone)]
pub struct MapReader(Arc<ArcSwap<Snapshot>>);

impl MapReader {
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.load_full()
    }
}

/// The only writer of the map.
#[derive(Debug)]
pub struct MapWriter {
    host: HostFs,
    shared: Arc<ArcSwap<Snapshot>>,
    topology: Vec<NodeInfo>,
    table: HugepageTable,
    generation: u64,
    source: Source,
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
        let first = build(1, source, &topology, &table, None);
        let shared = Arc::new(ArcSwap::from_pointee(first));
        let writer = MapWriter {
            host,
            shared: shared.clone(),
            topology,
            table,
            generation: 1,
            source,
        };
        Ok((writer, MapReader(shared)))
    }

    /// The snapshot last published.
    pub fn current(&self) -> Arc<Snapshot> {
        self.shared.load_full()
    }

    pub fn set_source(&mut self, source: Source) {
        self.source = source;
        self.publish(None);
    }

    /// Re-reads topology and every pool; returns the pools that changed.
    pub fn reconcile(&mut self) -> Result<Vec<Change>, SysfsError> {
        let topology = topology::read(&self.host)?;
        let table = hugepages::read_table(&self.host)?;
        self.topology = topology;
        Ok(self.replace(table, None))
    }

    /// Re-reads the pools of `sizes` only (all sizes when `None`), prompted by a fault at
    /// `fault_at` (CLOCK_MONOTONIC); returns the pools that changed.
    pub fn refresh(
        &mut self,
        sizes: Option<&BTreeSet<PageSize>>,
        fault_at: Option<Duration>,
    ) -> Result<Vec<Change>, SysfsError> {
        let Some(sizes) = sizes else {
            let table = hugepages::read_table(&self.host)?;
            return Ok(self.replace(table, fault_at));
        };
        let nodes: Vec<NumaNode> = self.topology.iter().map(|n| n.node).collect();
        let mut table = self.table.clone();
        for &size in sizes {
            let (pools, global) = hugepages::read_size(&self.host, &nodes, size)?;
            table.nodes.retain(|p| p.size != size);
            table.nodes.extend(pools);
            table.global.retain(|g| g.size != size);
            table.global.extend(global);
        }
        table.nodes.sort_by_key(|p| (p.node, p.size));
        table.global.sort_by_key(|g| g.size);
        Ok(self.replace(table, fault_at))
    }

    fn replace(&mut self, table: HugepageTable, fault_at: Option<Duration>) -> Vec<Change> {
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
        // The delay is the fault's only if this read saw what it did.
        self.publish(fault_at.filter(|_| !changes.is_empty()));
        changes
    }

    fn publish(&mut self, fault_at: Option<Duration>) {
        self.generation += 1;
        let delay = fault_at.map(|at| monotonic_now().saturating_sub(at));
        let snapshot = build(
            self.generation,
            self.source,
            &self.topology,
            &self.table,
            delay,
        );
        self.shared.store(Arc::new(snapshot));
    }
}

fn build(
    generation: u64,
    source: Source,
    topology: &[NodeInfo],
    table: &HugepageTable,
    fault_to_map: Option<Duration>,
) -> Snapshot {
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
                })
                .collect(),
        })
        .collect();
    Snapshot {
        generation,
        updated_at: SystemTime::now(),
        source,
        nodes,
        global: table.global.clone(),
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
