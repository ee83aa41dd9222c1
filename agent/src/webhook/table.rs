//! The webhook's table of the nodes' hugepages, kept by the agents' streams ([`super::stream`]):
//! per node, the last state its agent sent (`GET /v1/hugepages?watch=true`) and when it last
//! heard from it. The extender answers from the table for a node whose entry is *fresh* (its
//! stream heard within `--stream-fresh-within`, heartbeats included) and whose state it can
//! judge alone; for any other node it asks the agent, as without streams.
//!
//! A state is judged alone ([`judge`]) when the agent's map follows hugetlb faults (`source`
//! `ebpf+sysfs`: a map kept by the periodic reconcile only is as old as its interval), the
//! kubelet's Memory Manager policy is `None` (`numaSelection` `nodeWide`: the pod's hugepages
//! are verified on every NUMA node, whatever the pod), and no pool the pod needs is stale. The
//! judgement is the agent's own code on the streamed figures: KEP-5759's comparison and message
//! ([`verify::judge`]), the agent's reservations where they meet the nodes
//! ([`reservations::held_by`], the pod's own not counted), and the refusal under memory
//! contention pressure. Where the kubelet pins memory (`Static`), the selection needs the
//! kubelet's hints on the Memory Manager's state, which the stream does not carry yet: such a
//! node is asked.
//!
//! The table never decides a binding: the admission webhook asks the chosen node's agent, which
//! verifies on fresh sysfs reads and reserves.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use tokio::time::Instant;

use super::{
    agents::{CheckReply, Reply},
    decide::Judged,
};
use crate::{
    admission::{
        reservations::{self, held_by},
        verify::{self, OnSysfsError, Settings, free_and_unreserved, refuse_under_pressure},
    },
    api::watch::{NumaSelection, WatchState},
    host::{NumaNode, PageSize},
    kube::pod::Hugepages,
    numa::map::Source,
};

/// One node's entry.
#[derive(Debug, Clone)]
struct Entry {
    /// Where its agent was dialled: a Node that moved is a new stream.
    addr: SocketAddr,
    state: Option<Arc<WatchState>>,
    /// The stream's epoch and generation of `state`, to resume from.
    epoch: Option<String>,
    generation: u64,
    /// The last event of any kind; `None` while no stream is open.
    heard: Option<Instant>,
}

/// Where a stream resumes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resume {
    pub epoch: Option<String>,
    pub generation: u64,
}

/// How the table's nodes stand, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Standing {
    /// Heard within the bound.
    pub fresh: usize,
    /// Streamed once, not heard within the bound (or cut).
    pub stale: usize,
}

/// The nodes' states, by node name.
#[derive(Debug)]
pub struct Table {
    entries: RwLock<HashMap<String, Entry>>,
    fresh_within: Duration,
}

impl Table {
    pub fn new(fresh_within: Duration) -> Table {
        Table {
            entries: RwLock::default(),
            fresh_within,
        }
    }

    /// The bound of freshness (`--stream-fresh-within`).
    pub fn fresh_within(&self) -> Duration {
        self.fresh_within
    }

    /// Where `node`'s stream to `addr` resumes from (nothing when it moved or never streamed).
    pub fn resume(&self, node: &str, addr: SocketAddr) -> Resume {
        self.read()
            .get(node)
            .filter(|e| e.addr == addr)
            .map(|e| Resume {
                epoch: e.epoch.clone(),
                generation: e.generation,
            })
            .unwrap_or_default()
    }

    /// A state from `node`'s agent at `addr`, under `epoch` and `generation`.
    pub fn put(
        &self,
        node: &str,
        addr: SocketAddr,
        epoch: &str,
        generation: u64,
        state: WatchState,
    ) {
        let entry = Entry {
            addr,
            state: Some(Arc::new(state)),
            epoch: Some(epoch.to_owned()),
            generation,
            heard: Some(Instant::now()),
        };
        self.write().insert(node.to_owned(), entry);
    }

    /// A heartbeat (or a resume that found the state current) from `node`'s agent at `addr`.
    pub fn heard(&self, node: &str, addr: SocketAddr) {
        if let Some(entry) = self.write().get_mut(node).filter(|e| e.addr == addr) {
            entry.heard = Some(Instant::now());
        }
    }

    /// `node`'s stream ended: its state is stale from now on.
    pub fn cut(&self, node: &str) {
        if let Some(entry) = self.write().get_mut(node) {
            entry.heard = None;
        }
    }

    /// `node` is gone from the Node cache.
    pub fn forget(&self, node: &str) {
        self.write().remove(node);
    }

    /// `node`'s state, if its stream to `addr` was heard within the bound.
    pub fn fresh(&self, node: &str, addr: SocketAddr) -> Option<Arc<WatchState>> {
        let entries = self.read();
        let entry = entries.get(node).filter(|e| e.addr == addr)?;
        let heard = entry.heard?;
        (heard.elapsed() <= self.fresh_within)
            .then(|| entry.state.clone())
            .flatten()
    }

    /// How many nodes are fresh and how many stale now.
    pub fn standing(&self) -> Standing {
        let mut standing = Standing::default();
        for entry in self.read().values() {
            match entry.heard {
                Some(heard) if heard.elapsed() <= self.fresh_within => standing.fresh += 1,
                _ => standing.stale += 1,
            }
        }
        standing
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// The agent's answer to a dry run of a pod that needs `need` (its UID `pod_uid`), judged on
/// `state` as the agent would judge it; `None` when the state alone cannot say (see the
/// module's documentation): then the agent is asked.
pub fn judge(
    state: &WatchState,
    need: &Hugepages,
    pod_uid: &str,
    now: SystemTime,
) -> Option<Judged> {
    if state.source != Source::EbpfSysfs || state.numa_selection != NumaSelection::NodeWide {
        return None;
    }
    let stale = state
        .nodes
        .iter()
        .flat_map(|n| &n.sizes)
        .any(|s| s.stale && need.contains_key(&PageSize(s.page_size_bytes)));
    if stale || state.nodes.is_empty() {
        return None;
    }
    let nodes: Vec<NumaNode> = state.nodes.iter().map(|n| NumaNode(n.node)).collect();
    let settings = Settings {
        gate: state.gate,
        mode: state.mode,
        on_sysfs_error: OnSysfsError::Admit,
    };
    let mut verdict = verify::judge(need, nodes, settings, |size, nodes| {
        Ok::<_, Infallible>(free_and_unreserved(
            size,
            free_pages(state, size, nodes),
            reserved_pages(state, size),
        ))
    });
    reservations::subtract(&mut verdict, |size, nodes| {
        let in_force = state.reservations.iter().filter(|r| r.expires_at > now);
        held_by(in_force, size, nodes, pod_uid)
    });
    refuse_under_pressure(&mut verdict, state.pressure_refusal.as_deref());
    let reply = Reply {
        allowed: verdict.allowed,
        reason: verdict.reason.map(str::to_owned),
        message: verdict.message,
        numa_nodes: verdict.numa_nodes.iter().map(|n| n.0).collect(),
        checks: verdict
            .checks
            .iter()
            .map(|c| CheckReply {
                resource: c.resource.clone(),
                requested_bytes: c.requested_bytes,
                available_bytes: c.available_bytes,
            })
            .collect(),
    };
    Some(super::decide::judge(super::ask::Heard::Answer(reply)))
}

/// Free pages of `size` over `nodes` of `state` (a node without the size has none).
fn free_pages(state: &WatchState, size: PageSize, nodes: &[NumaNode]) -> u64 {
    state
        .nodes
        .iter()
        .filter(|n| nodes.contains(&NumaNode(n.node)))
        .flat_map(|n| &n.sizes)
        .filter(|s| s.page_size_bytes == size.0)
        .map(|s| s.free)
        .sum()
}

/// The system-wide pages of `size` reserved by mappings and not faulted yet.
fn reserved_pages(state: &WatchState, size: PageSize) -> u64 {
    state
        .system
        .iter()
        .find(|s| s.page_size_bytes == size.0)
        .map_or(0, |s| s.reserved)
}

#[cfg(test)]
mod tests;
