//! The webhook's table of the nodes' hugepages, kept by the agents' streams ([`super::stream`]):
//! per node, the last state its agent sent (`GET /v1/hugepages?watch=true`) and when it last
//! heard from it. The extender answers from the table for a node whose entry is *fresh* (its
//! stream heard within `--stream-fresh-within`, heartbeats included) and whose state it can
//! judge alone; for any other node it asks the agent, as without streams.
//!
//! A state is judged alone ([`judge`]) when the agent's map follows hugetlb faults (`source`
//! `ebpf+sysfs`: a map kept by the periodic reconcile only is as old as its interval), no pool the
//! pod needs is stale, and the NUMA nodes to verify on can be selected from the state: every node
//! when the kubelet's Memory Manager policy is `None` (`numaSelection` `nodeWide`), or, when it
//! is `Static`, the nodes the kubelet would pick, selected on the streamed
//! `kubeletSelection` (the Topology Manager's settings and the Memory Manager's machine state,
//! rebuilt once per state received, [`Streamed`]). The judgement is the agent's own code on the
//! streamed figures: the kubelet's selection and the grouping of the pod's hugepages by the nodes
//! they come from ([`plan::plan_with`], the pod's requests read once per call), KEP-5759's
//! comparison and message per group ([`verify::judge`], [`plan::verdict`]), the agent's
//! reservations where they meet the nodes ([`reservations::held_by`], the pod's own not
//! counted), and the refusal under memory contention pressure.
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

use super::pod::PodRequest;
use super::{
    agents::{CheckReply, Reply},
    decide::Judged,
    skew,
};
use crate::{
    admission::{
        plan::{self, Plan},
        reservations::{self, held_by},
        verify::{self, OnSysfsError, Settings, free_and_unreserved, refuse_under_pressure},
    },
    api::watch::{NumaSelection, WatchState},
    host::{NumaNode, PageSize},
    memorymanager::{selection::Basis, streamed::Selector},
    numa::map::Source,
};

/// One node's entry.
#[derive(Debug, Clone)]
struct Entry {
    /// Where its agent was dialled: a Node that moved is a new stream.
    addr: SocketAddr,
    state: Option<Arc<Streamed>>,
    /// The stream's epoch and generation of `state`, to resume from.
    epoch: Option<String>,
    generation: u64,
    /// The last event of any kind; `None` while no stream is open.
    heard: Option<Instant>,
    /// The agent's version its last event named (none from agents older than the field).
    version: Option<String>,
}

/// A state as the table keeps it.
#[derive(Debug)]
pub struct Streamed {
    /// The state, its `kubeletSelection` taken out into `selector`.
    pub state: WatchState,
    /// The kubelet's selection rebuilt from the state's `kubeletSelection`; `None` when it had
    /// none or it does not describe a machine.
    pub selector: Option<Selector>,
}

impl Streamed {
    pub fn new(mut state: WatchState) -> Streamed {
        let selector = state
            .kubelet_selection
            .take()
            .and_then(|s| Arc::unwrap_or_clone(s).selector().ok());
        Streamed { state, selector }
    }
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
    /// Whose agent's last event named a version outside the skew policy ([`skew::within`]), or
    /// none.
    pub outside_skew: usize,
}

/// A node whose agent is outside the version-skew policy, and the version it named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skewed {
    pub node: String,
    pub version: Option<String>,
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

    /// A state from `node`'s agent at `addr`, under `epoch` and `generation`, from an agent
    /// of `version` (kept as [`skew::kept`] reads it).
    pub fn put(
        &self,
        node: &str,
        addr: SocketAddr,
        (epoch, generation): (&str, u64),
        version: Option<&str>,
        state: WatchState,
    ) {
        let entry = Entry {
            addr,
            state: Some(Arc::new(Streamed::new(state))),
            epoch: Some(epoch.to_owned()),
            generation,
            heard: Some(Instant::now()),
            version: version.map(|v| skew::kept(v).to_owned()),
        };
        self.write().insert(node.to_owned(), entry);
    }

    /// A heartbeat (or a resume that found the state current) from `node`'s agent at `addr`,
    /// of `version` (kept as [`skew::kept`] reads it).
    pub fn heard(&self, node: &str, addr: SocketAddr, version: Option<&str>) {
        let version = version.map(skew::kept);
        if let Some(entry) = self.write().get_mut(node).filter(|e| e.addr == addr) {
            entry.heard = Some(Instant::now());
            if entry.version.as_deref() != version {
                entry.version = version.map(str::to_owned);
            }
        }
    }

    /// The nodes whose agents are outside the version-skew policy: how many, and `most` of
    /// them by name.
    pub fn skewed(&self, most: usize) -> (usize, Vec<Skewed>) {
        let mut skewed: Vec<Skewed> = self
            .read()
            .iter()
            .filter(|(_, e)| !skew::within(skew::OURS, e.version.as_deref()))
            .map(|(node, e)| Skewed {
                node: node.clone(),
                version: e.version.clone(),
            })
            .collect();
        let count = skewed.len();
        skewed.sort_by(|a, b| a.node.cmp(&b.node));
        skewed.truncate(most);
        (count, skewed)
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
    pub fn fresh(&self, node: &str, addr: SocketAddr) -> Option<Arc<Streamed>> {
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
            if !skew::within(skew::OURS, entry.version.as_deref()) {
                standing.outside_skew += 1;
            }
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

/// The agent's answer to a dry run of `pod`, judged on `streamed` as the agent would judge it;
/// `None` when the state alone cannot say (see the module's documentation): then the agent is
/// asked.
pub fn judge(streamed: &Streamed, pod: &PodRequest, now: SystemTime) -> Option<Judged> {
    let state = &streamed.state;
    if state.source != Source::EbpfSysfs {
        return None;
    }
    let stale = state
        .nodes
        .iter()
        .flat_map(|n| &n.sizes)
        .any(|s| s.stale && pod.need().contains_key(&PageSize(s.page_size_bytes)));
    if stale || state.nodes.is_empty() {
        return None;
    }
    let all: Vec<NumaNode> = state.nodes.iter().map(|n| NumaNode(n.node)).collect();
    let plan = match state.numa_selection {
        NumaSelection::NodeWide => Plan::unselected(&all, pod.need(), Basis::NodeWide),
        NumaSelection::Kubelet => {
            let Selector { config, state } = streamed.selector.as_ref()?;
            let topology = config.topology();
            plan::plan_with(state, &pod.pod, &pod.requests, &pod.pages, topology, &all).ok()?
        }
    };
    let settings = Settings {
        gate: state.gate,
        mode: state.mode,
        on_sysfs_error: OnSysfsError::Admit,
    };
    let verdict = plan::verdict(&plan, state.mode, |pages, nodes| {
        Ok::<_, Infallible>(verify::judge(
            pages,
            nodes.to_vec(),
            settings,
            |size, nodes| {
                Ok::<_, Infallible>(free_and_unreserved(
                    size,
                    free_pages(state, size, nodes),
                    reserved_pages(state, size),
                ))
            },
        ))
    });
    let Ok(mut verdict) = verdict;
    reservations::subtract(&mut verdict, |size, nodes| {
        let in_force = state.reservations.iter().filter(|r| r.expires_at > now);
        held_by(in_force, size, nodes, &pod.uid)
    });
    refuse_under_pressure(&mut verdict, state.pressure_refusal.as_deref());
    let reply = Reply {
        allowed: verdict.allowed,
        reason: verdict.reason.map(str::to_owned),
        message: verdict.message,
        numa_nodes: verdict.numa_nodes.iter().map(|n| n.0).collect(),
        checks: verdict
            .checks
            .into_iter()
            .map(|c| CheckReply {
                resource: c.resource,
                requested_bytes: c.requested_bytes,
                available_bytes: c.available_bytes,
            })
            .collect(),
        reservation: None,
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
