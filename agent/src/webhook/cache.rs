//! The webhook's Node cache, for the `nodenames` form of `ExtenderArgs` (the scheduler's
//! `nodeCacheCapable: true`) and for bindings: a kube-rs reflector kept by list+watch of all
//! Nodes ([`super::follow`]: resumed from the last `resourceVersion`, listed again when that is
//! gone; errors retried with backoff, logged and counted while the cache keeps what it had).
//!
//! Only what [`super::node`] reads is kept of each Node, read as it arrives: where its agent
//! listens and its allocatable hugepages, a few hundred bytes a Node where the whole object would
//! be kilobytes (five thousand Nodes are a large part of the webhook's memory). A list replaces
//! the cache once it is complete, as kube-rs's reflector does. The cache is *synced* once the
//! first list is in; `/readyz` waits for it. A name that is not in the cache is answered as
//! unknown, never guessed.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::watcher::{self, Event},
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::info;

use super::{
    follow::follow,
    metrics::Metrics,
    node::{self, Candidate},
};
use crate::kube::pod::Hugepages;

/// What is kept of one Node (its name is the key).
#[derive(Debug, Clone)]
struct Kept {
    agent: Result<SocketAddr, String>,
    allocatable: Option<Hugepages>,
}

/// Node name → what is kept of it.
type Entries = HashMap<String, Kept>;

/// The Nodes the webhook knows, kept current by a watch.
#[derive(Clone)]
pub struct NodeCache {
    entries: Arc<RwLock<Entries>>,
    synced: Arc<AtomicBool>,
    /// Counts the changes of the Nodes' agent addresses (a Node added, gone, or its agent moved;
    /// not a Node's status written again, which the API server does all the time), so that the
    /// streams learn cheaply whether to follow the Nodes again.
    agents_moved: Arc<AtomicU64>,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("nodes", &self.read().len())
            .field("synced", &self.is_synced())
            .finish_non_exhaustive()
    }
}

impl NodeCache {
    /// Starts the list+watch of Nodes with `client`; it runs until `stop` turns true. Agents
    /// listen on `port` at each Node's first `InternalIP`.
    pub fn start(
        client: Client,
        port: u16,
        metrics: Arc<Metrics>,
        stop: watch::Receiver<bool>,
    ) -> (NodeCache, JoinHandle<()>) {
        let synced = Arc::new(AtomicBool::new(false));
        let cache = NodeCache {
            entries: Arc::default(),
            synced: synced.clone(),
            agents_moved: Arc::default(),
        };
        let (entries, agents_moved) = (cache.entries.clone(), cache.agents_moved.clone());
        let api: Api<Node> = Api::all(client);
        let task = tokio::spawn(async move {
            // The list being read, which replaces the entries once it is complete.
            let mut listing: Option<Entries> = None;
            let event = |event| {
                let nodes = apply(&entries, &mut listing, event, port);
                if nodes.agents_moved() {
                    agents_moved.fetch_add(1, Ordering::Relaxed);
                }
                seen(nodes, &synced, &metrics);
            };
            let config = watcher::Config::default();
            follow(api, config, "the Node watch", stop, event, || {
                metrics.node_watch_error();
            })
            .await;
        });
        (cache, task)
    }

    /// Whether the first list of Nodes is in.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The candidate `name` is, or why there is none.
    pub fn candidate(&self, name: &str) -> Result<Candidate, String> {
        match self.read().get(name) {
            Some(kept) => Ok(Candidate {
                name: name.to_owned(),
                agent: kept.agent.clone(),
                allocatable: kept.allocatable.clone(),
            }),
            None if self.is_synced() => Err(format!(
                "node {name} is not in the webhook's Node cache (the API server's list and watch of Nodes has not shown it)"
            )),
            None => Err(format!(
                "node {name}: the webhook's Node cache has not synced yet"
            )),
        }
    }

    /// How many Nodes the cache holds.
    pub fn count(&self) -> usize {
        self.read().len()
    }

    /// A number that changes whenever a Node's agent address does (a Node added or gone too).
    pub fn agents_moved(&self) -> u64 {
        self.agents_moved.load(Ordering::Relaxed)
    }

    /// Every node whose agent's address is known, with it.
    pub fn agents(&self) -> Vec<(String, SocketAddr)> {
        self.read()
            .iter()
            .filter_map(|(name, kept)| Some((name.clone(), *kept.agent.as_ref().ok()?)))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Entries> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// What changes with one watcher event: a Node kept or dropped, or a list begun, read or
/// complete (it then replaces the entries). The number of Nodes when it changed.
fn apply(
    entries: &RwLock<Entries>,
    listing: &mut Option<Entries>,
    event: Event<Node>,
    port: u16,
) -> Seen {
    let write = || entries.write().unwrap_or_else(|p| p.into_inner());
    match event {
        Event::Init => {
            *listing = Some(Entries::new());
            Seen::Nothing
        }
        Event::InitApply(node) => {
            if let (Some(list), Some((name, kept))) = (listing.as_mut(), keep(&node, port)) {
                list.insert(name, kept);
            }
            Seen::Nothing
        }
        Event::InitDone => {
            let list = listing.take().unwrap_or_default();
            let nodes = list.len();
            *write() = list;
            Seen::Listed(nodes)
        }
        Event::Apply(node) => {
            let mut entries = write();
            let moved = match keep(&node, port) {
                Some((name, kept)) => {
                    let agent = kept.agent.clone();
                    entries
                        .insert(name, kept)
                        .is_none_or(|old| old.agent != agent)
                }
                None => false,
            };
            Seen::Changed(entries.len(), moved)
        }
        Event::Delete(node) => {
            let mut entries = write();
            let moved = node
                .metadata
                .name
                .as_ref()
                .is_some_and(|name| entries.remove(name).is_some());
            Seen::Changed(entries.len(), moved)
        }
    }
}

/// What is kept of `node`, under its name; nothing for a Node without one.
fn keep(node: &Node, port: u16) -> Option<(String, Kept)> {
    let name = node.metadata.name.clone()?;
    let Candidate {
        name,
        agent,
        allocatable,
    } = node::of_node(name, node, port);
    Some((name, Kept { agent, allocatable }))
}

/// What one event did to the cache, for the log and the metrics.
enum Seen {
    Nothing,
    /// A list complete, of this many Nodes.
    Listed(usize),
    /// A Node kept or dropped; this many now, and whether an agent's address changed with it.
    Changed(usize, bool),
}

impl Seen {
    /// Whether the Nodes' agent addresses may have changed (a whole list is taken as a change).
    fn agents_moved(&self) -> bool {
        matches!(self, Seen::Listed(_) | Seen::Changed(_, true))
    }
}

/// Logs the end of a list and keeps the cache's size in the metrics.
fn seen(seen: Seen, synced: &AtomicBool, metrics: &Metrics) {
    match seen {
        Seen::Listed(nodes) => {
            metrics.node_list(nodes);
            if synced.swap(true, Ordering::Relaxed) {
                info!(nodes, "Node cache listed again");
            } else {
                info!(nodes, "Node cache synced");
            }
        }
        Seen::Changed(nodes, _) => metrics.node_list(nodes),
        Seen::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::PageSize;

    fn node(name: &str, ip: &str, hugepages: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {
                "addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}],
                "allocatable": {"cpu": "4", "memory": "16Gi", "hugepages-2Mi": hugepages},
                "nodeInfo": {"kubeletVersion": "v1.35.0", "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}
            }
        }))
        .expect("a Node")
    }

    #[test]
    fn a_list_replaces_the_nodes_once_complete_and_changes_apply_as_they_come() {
        let cache = NodeCache {
            entries: Arc::default(),
            synced: Arc::default(),
            agents_moved: Arc::default(),
        };
        let mut listing = None;
        let mut event = |e| apply(&cache.entries, &mut listing, e, 9820);
        event(Event::Apply(node("old", "10.0.0.9", "2Mi")));
        event(Event::Init);
        event(Event::InitApply(node("a", "10.0.0.1", "4Mi")));
        assert!(
            cache.candidate("a").is_err(),
            "not before the list is complete"
        );
        assert!(cache.candidate("old").is_ok());
        assert!(matches!(event(Event::InitDone), Seen::Listed(1)));
        assert!(cache.candidate("old").is_err(), "gone from the new list");
        let a = cache.candidate("a").expect("listed");
        assert_eq!(a.agent, Ok("10.0.0.1:9820".parse().expect("addr")));
        assert_eq!(
            a.allocatable,
            Some(Hugepages::from([(PageSize(2 << 20), 4 << 20)]))
        );
        assert!(matches!(
            event(Event::Apply(node("b", "10.0.0.2", "2Mi"))),
            Seen::Changed(2, true)
        ));
        // Written again with its agent where it was (a status update): no move.
        assert!(matches!(
            event(Event::Apply(node("b", "10.0.0.2", "4Mi"))),
            Seen::Changed(2, false)
        ));
        assert!(matches!(
            event(Event::Apply(node("b", "10.0.0.3", "4Mi"))),
            Seen::Changed(2, true)
        ));
        assert!(matches!(
            event(Event::Delete(node("a", "10.0.0.1", "4Mi"))),
            Seen::Changed(1, true)
        ));
        assert_eq!(
            cache.agents(),
            vec![("b".to_owned(), "10.0.0.3:9820".parse().expect("addr"))]
        );
    }
}
