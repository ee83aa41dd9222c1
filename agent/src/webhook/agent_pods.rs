//! Which pod is each node's agent, as the API server has it, for `--agent-identity per-pod`
//! ([`super::identity`]): the pods of `--agent-namespace` that `--agent-selector` selects (the
//! DaemonSet's), followed by list+watch ([`super::follow`]) in the webhook, or listed once by
//! `doctor` (both need `list` and `watch` on pods in that namespace, which the shipped roles do
//! not grant). Of each pod only its node, its creation time and its name are kept.
//!
//! A pod counts while it is bound to a node, not being deleted and not finished (phase
//! `Succeeded` or `Failed`). Where more than one counts on a node (a rollout's new pod beside an
//! old one whose deletion has not been seen yet), the most recently created is the node's
//! agent, the later name breaking a tie. The map is *synced* once the first list is in; before
//! that, and for a node with no pod, there is no name, so no agent of that node is trusted.

use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};
use kube::{
    Api, Client,
    api::ListParams,
    runtime::watcher::{self, Event},
};
use tokio::{sync::watch, task::JoinHandle};
use tracing::info;

use super::follow::follow;

/// How many pods one list call asks for (`doctor`).
const PAGE: u32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum AgentPodsError {
    #[error("listing the agents' pods in namespace {namespace} ({selector}): {detail}")]
    List {
        namespace: String,
        selector: String,
        detail: String,
    },
}

/// Where one pod runs, and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placed {
    node: String,
    created: Option<Time>,
}

/// Pod name → where it runs; node → the name of its agent's pod.
#[derive(Debug, Default)]
struct Map {
    pods: HashMap<String, Placed>,
    agents: HashMap<String, String>,
}

impl Map {
    /// The map of a whole list, in one pass over it.
    fn of(pods: HashMap<String, Placed>) -> Map {
        let mut newest: HashMap<&str, (&String, &Placed)> = HashMap::new();
        for (name, placed) in &pods {
            let seen = newest.entry(placed.node.as_str()).or_insert((name, placed));
            if later((name, placed), *seen) {
                *seen = (name, placed);
            }
        }
        let agents = newest
            .into_iter()
            .map(|(node, (name, _))| (node.to_owned(), name.clone()))
            .collect();
        Map { pods, agents }
    }

    /// Chooses again the agent's pod of `node` (one pass over the pods: a change of one pod,
    /// which a DaemonSet makes seldom).
    fn elect(&mut self, node: &str) {
        let newest = self
            .pods
            .iter()
            .filter(|(_, p)| p.node == node)
            .reduce(|a, b| if later(b, a) { b } else { a })
            .map(|(name, _)| name.clone());
        match newest {
            Some(name) => self.agents.insert(node.to_owned(), name),
            None => self.agents.remove(node),
        };
    }

    /// `name` now placed at `placed` (`None`: gone, or no longer counted).
    fn set(&mut self, name: String, placed: Option<Placed>) {
        let old = match placed {
            Some(placed) => {
                let node = placed.node.clone();
                let old = self.pods.insert(name, placed);
                self.elect(&node);
                old
            }
            None => self.pods.remove(&name),
        };
        if let Some(old) = old {
            self.elect(&old.node);
        }
    }
}

/// Whether pod `a` is the agent rather than pod `b` of the same node: created later, or at the
/// same time with the later name.
fn later((a, pa): (&String, &Placed), (b, pb): (&String, &Placed)) -> bool {
    pa.created.cmp(&pb.created).then_with(|| a.cmp(b)).is_gt()
}

/// The agents' pods, per node.
#[derive(Clone)]
pub struct AgentPods {
    map: Arc<RwLock<Map>>,
    synced: Arc<AtomicBool>,
    namespace: Arc<str>,
}

impl std::fmt::Debug for AgentPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentPods")
            .field("namespace", &self.namespace)
            .field("nodes", &self.read().agents.len())
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl AgentPods {
    fn new(namespace: &str) -> AgentPods {
        AgentPods {
            map: Arc::default(),
            synced: Arc::default(),
            namespace: Arc::from(namespace),
        }
    }

    /// Starts the list+watch of the pods `selector` selects in `namespace`; it runs until `stop`
    /// turns true. `failed` is called on each error of the watch.
    pub fn start(
        client: Client,
        namespace: &str,
        selector: &str,
        stop: watch::Receiver<bool>,
        failed: impl FnMut() + Send + 'static,
    ) -> (AgentPods, JoinHandle<()>) {
        let pods = AgentPods::new(namespace);
        let (map, synced) = (pods.map.clone(), pods.synced.clone());
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().labels(selector);
        let task = tokio::spawn(async move {
            let mut listing: Option<HashMap<String, Placed>> = None;
            let event = |event| apply(&map, &synced, &mut listing, event);
            follow(
                api,
                config,
                "the watch of the agents' pods",
                stop,
                event,
                failed,
            )
            .await;
        });
        (pods, task)
    }

    /// The pods `selector` selects in `namespace`, listed once, each page within `within`.
    pub async fn listed(
        client: Client,
        namespace: &str,
        selector: &str,
        within: Duration,
    ) -> Result<AgentPods, AgentPodsError> {
        let api: Api<Pod> = Api::namespaced(client, namespace);
        let mut placed = HashMap::new();
        let mut params = ListParams::default().labels(selector).limit(PAGE);
        let failed = |detail: String| AgentPodsError::List {
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            detail,
        };
        loop {
            let page = tokio::time::timeout(within, api.list(&params))
                .await
                .map_err(|_| failed(format!("no answer within {within:?}")))?
                .map_err(|e| failed(e.to_string()))?;
            placed.extend(page.items.iter().filter_map(counted));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let pods = AgentPods::new(namespace);
        *pods.write() = Map::of(placed);
        pods.synced.store(true, Ordering::Relaxed);
        Ok(pods)
    }

    /// A synced map of `(pod, node)`, all created at once.
    #[cfg(test)]
    pub fn placed(namespace: &str, pods: &[(&str, &str)]) -> AgentPods {
        let map = AgentPods::new(namespace);
        map.replace(pods);
        map.synced.store(true, Ordering::Relaxed);
        map
    }

    /// The map replaced by `pods`, as a new list would.
    #[cfg(test)]
    pub fn replace(&self, pods: &[(&str, &str)]) {
        let placed = pods.iter().map(|(pod, node)| {
            let at = Placed {
                node: (*node).to_owned(),
                created: None,
            };
            ((*pod).to_owned(), at)
        });
        *self.write() = Map::of(placed.collect());
    }

    /// Whether the first list is in.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The namespace the pods are in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name of the agent's pod on `node`, or why there is none.
    pub fn on(&self, node: &str) -> Result<String, String> {
        if let Some(name) = self.read().agents.get(node) {
            return Ok(name.clone());
        }
        Err(if self.is_synced() {
            format!(
                "no agent pod in namespace {} is on node {node} as the API server has it",
                self.namespace
            )
        } else {
            format!(
                "the agents' pods in namespace {} have not been listed yet",
                self.namespace
            )
        })
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Map> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Map> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// One watcher event applied: a pod placed or gone, or a list begun, read or complete (which
/// then replaces the map).
fn apply(
    map: &RwLock<Map>,
    synced: &AtomicBool,
    listing: &mut Option<HashMap<String, Placed>>,
    event: Event<Pod>,
) {
    let write = || map.write().unwrap_or_else(|p| p.into_inner());
    match event {
        Event::Init => *listing = Some(HashMap::new()),
        Event::InitApply(pod) => {
            if let (Some(list), Some((name, placed))) = (listing.as_mut(), counted(&pod)) {
                list.insert(name, placed);
            }
        }
        Event::InitDone => {
            let fresh = Map::of(listing.take().unwrap_or_default());
            let nodes = fresh.agents.len();
            *write() = fresh;
            if !synced.swap(true, Ordering::Relaxed) {
                info!(nodes, "the agents' pods listed");
            }
        }
        Event::Apply(pod) => {
            if let Some(name) = pod.metadata.name.clone() {
                let placed = counted(&pod).map(|(_, placed)| placed);
                write().set(name, placed);
            }
        }
        Event::Delete(pod) => {
            if let Some(name) = pod.metadata.name.clone() {
                write().set(name, None);
            }
        }
    }
}

/// `pod`'s name and place, if it counts as an agent (bound, not being deleted, not finished).
fn counted(pod: &Pod) -> Option<(String, Placed)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let placed = Placed {
        node,
        created: pod.metadata.creation_timestamp.clone(),
    };
    Some((pod.metadata.name.clone()?, placed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, created: &str, extra: serde_json::Value) -> Pod {
        let mut pod = serde_json::json!({
            "metadata": {"name": name, "namespace": "hugepage-agent", "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
            "status": {"phase": "Running"},
        });
        json_patch(&mut pod, extra);
        serde_json::from_value(pod).expect("a Pod")
    }

    fn json_patch(into: &mut serde_json::Value, from: serde_json::Value) {
        if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
            for (key, value) in from {
                match into.get_mut(&key) {
                    Some(existing) if value.is_object() => json_patch(existing, value),
                    _ => {
                        into.insert(key, value);
                    }
                }
            }
        }
    }

    const T1: &str = "2026-11-29T06:00:00Z";
    const T2: &str = "2026-11-29T07:00:00Z";

    #[test]
    fn each_node_has_its_newest_counted_pod_and_none_before_the_list() {
        let pods = AgentPods::new("hugepage-agent");
        let mut listing = None;
        let mut event = |e| apply(&pods.map, &pods.synced, &mut listing, e);
        let none = serde_json::json!({});
        event(Event::Init);
        event(Event::InitApply(pod("agent-a", "node-a", T1, none.clone())));
        assert!(
            pods.on("node-a")
                .expect_err("not before the list is complete")
                .contains("not been listed yet")
        );
        event(Event::InitApply(pod("agent-b", "node-b", T1, none.clone())));
        event(Event::InitApply(pod(
            "agent-done",
            "node-c",
            T2,
            serde_json::json!({"status": {"phase": "Failed"}}),
        )));
        event(Event::InitDone);
        assert_eq!(pods.on("node-a"), Ok("agent-a".to_owned()));
        assert_eq!(pods.on("node-b"), Ok("agent-b".to_owned()));
        let err = pods.on("node-c").expect_err("a failed pod is no agent");
        assert!(err.contains("no agent pod in namespace hugepage-agent is on node node-c"));

        // A rollout: the new pod on node-a, then the old one deleted.
        event(Event::Apply(pod("agent-a2", "node-a", T2, none.clone())));
        assert_eq!(pods.on("node-a"), Ok("agent-a2".to_owned()));
        event(Event::Delete(pod("agent-a", "node-a", T1, none.clone())));
        assert_eq!(pods.on("node-a"), Ok("agent-a2".to_owned()));
        // Its deletion begun: it no longer counts, and the node has no agent.
        event(Event::Apply(pod(
            "agent-a2",
            "node-a",
            T2,
            serde_json::json!({"metadata": {"deletionTimestamp": T2}}),
        )));
        assert!(pods.on("node-a").is_err());
        // A pod moved to another node (never by a DaemonSet, but the map follows it).
        event(Event::Apply(pod("agent-b", "node-d", T1, none.clone())));
        assert!(pods.on("node-b").is_err());
        assert_eq!(pods.on("node-d"), Ok("agent-b".to_owned()));
        // A list replaces everything.
        event(Event::Init);
        event(Event::InitApply(pod("agent-x", "node-x", T1, none)));
        event(Event::InitDone);
        assert!(pods.on("node-d").is_err());
        assert_eq!(pods.on("node-x"), Ok("agent-x".to_owned()));
    }

    #[test]
    fn a_tie_in_creation_goes_to_the_later_name_and_unbound_pods_do_not_count() {
        let none = serde_json::json!({});
        let mut placed = HashMap::new();
        for p in [
            pod("agent-1", "n", T1, none.clone()),
            pod("agent-2", "n", T1, none.clone()),
        ] {
            placed.extend(counted(&p));
        }
        let unbound: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent-3", "creationTimestamp": T2},
            "spec": {"containers": [{"name": "agent"}]},
        }))
        .expect("a Pod");
        assert!(counted(&unbound).is_none());
        assert_eq!(Map::of(placed).agents.get("n"), Some(&"agent-2".to_owned()));
    }
}
