//! The webhook's Node cache, for the `nodenames` form of `ExtenderArgs` (the scheduler's
//! `nodeCacheCapable: true`) and for bindings: a kube-rs reflector kept by list+watch of all
//! Nodes. The watcher resumes from the last `resourceVersion` it saw (bookmarks asked for), and
//! lists again when the API server says that version is gone: in the watch (an `ERROR` event
//! with `410`, kube-rs's own handling) or by answering the watch's start `410 Gone` (a new
//! watcher here: kube-rs would retry that watch from the same version for ever). Other errors
//! are retried with backoff, logged and counted, and the cache keeps what it had meanwhile.
//!
//! Only what [`super::node`] reads is kept of each Node: managed fields, images and conditions
//! are dropped as they arrive. The cache is *synced* once the first list is in; `/readyz` waits
//! for it. A name that is not in the cache is answered as unknown, never guessed.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, Event},
    },
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use super::{
    metrics::Metrics,
    node::{self, Candidate},
};

/// The Nodes the webhook knows, kept current by a watch.
#[derive(Clone)]
pub struct NodeCache {
    store: Store<Node>,
    synced: Arc<AtomicBool>,
    port: u16,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("nodes", &self.store.len())
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
        mut stop: watch::Receiver<bool>,
    ) -> (NodeCache, JoinHandle<()>) {
        let (store, writer) = reflector::store::<Node>();
        let synced = Arc::new(AtomicBool::new(false));
        let cache = NodeCache {
            store: store.clone(),
            synced: synced.clone(),
            port,
        };
        let api: Api<Node> = Api::all(client);
        let task = tokio::spawn(async move {
            let mut writer = writer;
            // Each turn is one watcher: it lists, then watches from the list's resourceVersion.
            // A new one is made only when the API server answers a watch's start with 410 Gone:
            // kube-rs would retry that watch from the same resourceVersion for ever.
            loop {
                let events = watcher::watcher(api.clone(), watcher::Config::default())
                    .default_backoff()
                    .modify(keep_what_is_read);
                let mut events = std::pin::pin!(events);
                let relist = loop {
                    let item = tokio::select! {
                        _ = stop.wait_for(|s| *s) => break false,
                        item = events.next() => item,
                    };
                    match item {
                        Some(Ok(event)) => {
                            writer.apply_watcher_event(&event);
                            seen(&event, &store, &synced, &metrics);
                        }
                        Some(Err(e)) => {
                            metrics.node_watch_error();
                            if gone(&e) {
                                warn!("the Node watch was answered 410 Gone: listing again: {e}");
                                break true;
                            }
                            warn!("the Node watch failed, retrying with backoff: {e}");
                        }
                        None => break false,
                    }
                };
                if !relist {
                    break;
                }
            }
        });
        (cache, task)
    }

    /// Whether the first list of Nodes is in.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The candidate `name` is, or why there is none.
    pub fn candidate(&self, name: &str) -> Result<Candidate, String> {
        match self.store.get(&ObjectRef::new(name)) {
            Some(node) => Ok(node::of_node(name.to_owned(), &node, self.port)),
            None if self.is_synced() => Err(format!(
                "node {name} is not in the webhook's Node cache (the API server's list and watch of Nodes has not shown it)"
            )),
            None => Err(format!(
                "node {name}: the webhook's Node cache has not synced yet"
            )),
        }
    }
}

impl NodeCache {
    /// Every node whose agent's address is known, with it.
    pub fn agents(&self) -> Vec<(String, std::net::SocketAddr)> {
        self.store
            .state()
            .iter()
            .filter_map(|node| {
                let name = node.metadata.name.clone()?;
                let agent = node::of_node(name.clone(), node, self.port).agent.ok()?;
                Some((name, agent))
            })
            .collect()
    }
}

/// Logs the end of a list and keeps the cache's size in the metrics.
fn seen(event: &Event<Node>, store: &Store<Node>, synced: &AtomicBool, metrics: &Metrics) {
    match event {
        Event::InitDone => {
            let nodes = store.len();
            metrics.node_list(nodes);
            if synced.swap(true, Ordering::Relaxed) {
                info!(nodes, "Node cache listed again");
            } else {
                info!(nodes, "Node cache synced");
            }
        }
        Event::Apply(_) | Event::Delete(_) => metrics.node_list(store.len()),
        Event::Init | Event::InitApply(_) => {}
    }
}

/// A watch whose start the API server answered `410 Gone`.
fn gone(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 410)
}

/// Drops what the webhook never reads, so a thousand Nodes stay small.
fn keep_what_is_read(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.conditions = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}
