//! The static policy's topology hints, as the kubelet's Memory Manager computes them: every NUMA
//! mask (in the kubelet's order) whose nodes have enough allocatable *and* free memory of every
//! requested type is a hint for each type; a single node already grouped with others, or a node
//! already used alone or in another group, may not join a multi-node mask; a hint is preferred
//! when it has as few nodes as the smallest mask whose *allocatable* memory suffices — capacity,
//! not what is free. A container (or pod) the checkpoint already holds blocks for gets its blocks
//! back as preferred hints. Pods that are not Guaranteed get no hints at all.

use std::{collections::BTreeMap, fmt::Display};

use super::{
    requests::{self, QosClass, Requested},
    state::{Block, MachineState, MemoryManagerState, MemoryTable},
};
use crate::{
    kube::pod::{Container, Pod, RequestError},
    kubelet::features::FeatureGates,
    topologymanager::{
        NumaMask, TopologyHint,
        bitmask::{self, BitmaskError},
    },
};

/// Resource → hints; `None` is the kubelet's nil (no hints at all, "no preference").
pub type Hints = Option<BTreeMap<String, Vec<TopologyHint>>>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HintError {
    /// The kubelet logs these and returns no hints.
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("the pod has no container named {0:?}")]
    NoSuchContainer(String),
    #[error("machine state: {0}")]
    Machine(#[from] BitmaskError),
    #[error(
        "the Memory Manager's hints are every NUMA mask that fits, as the kubelet works them out (2^{nodes}-1 masks on {nodes} NUMA nodes): the agent works them out on at most {MAX_HINT_NODES} nodes ({} masks, tens of milliseconds), and this machine has {nodes}",
        (1u64 << MAX_HINT_NODES) - 1
    )]
    TooManyNodes { nodes: usize },
}

/// The most NUMA nodes hints are worked out on: every mask of them is visited (65,535 on 16
/// nodes, 42 to 101 ms an admission in release; 18 nodes took 0.78 s), so past it an admission
/// would hold its thread for seconds and more.
pub const MAX_HINT_NODES: usize = 16;

/// Topology Manager scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Container,
    Pod,
}

impl std::str::FromStr for Scope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "container" => Ok(Scope::Container),
            "pod" => Ok(Scope::Pod),
            other => Err(format!("{other:?} is not container or pod")),
        }
    }
}

/// Finds a container (app or init) by name.
pub fn find_container<'p>(pod: &'p Pod, name: &str) -> Result<&'p Container, HintError> {
    pod.spec
        .containers
        .iter()
        .chain(&pod.spec.init_containers)
        .find(|c| c.name == name)
        .ok_or_else(|| HintError::NoSuchContainer(name.to_string()))
}

/// What each container's hints read of the pod as a whole, worked out once per pod: whether it
/// is Guaranteed (its QoS class, computed over every container when the API server has not set
/// it), and the feature gates. Working the QoS class out again for each container read every
/// container each time: a pod's hints cost the square of its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodFacts {
    pub guaranteed: bool,
    pub gates: FeatureGates,
}

impl PodFacts {
    pub fn of(pod: &Pod, gates: FeatureGates) -> Result<PodFacts, RequestError> {
        Ok(PodFacts {
            guaranteed: requests::qos_class(pod, gates)? == QosClass::Guaranteed,
            gates,
        })
    }
}

/// Container scope: `GetTopologyHints`. `facts` are the pod's ([`PodFacts::of`]).
pub fn container_hints(
    state: &MemoryManagerState,
    pod: &Pod,
    facts: &PodFacts,
    container: &Container,
) -> Result<Hints, HintError> {
    if !facts.guaranteed {
        return Ok(None);
    }
    let field = format_args!("container {:?}", container.name);
    let requested = requests::exclusive_requests(pod, container, facts.gates, field)?;
    exclusive_hints(state, pod, facts, container, &requested)
}

/// [`container_hints`] for a container of a Guaranteed pod whose exclusive requests
/// ([`requests::exclusive_requests`]) are read already.
pub fn exclusive_hints(
    state: &MemoryManagerState,
    pod: &Pod,
    facts: &PodFacts,
    container: &Container,
    requested: &Requested,
) -> Result<Hints, HintError> {
    if requested.is_empty() || pod_level_unmanaged(pod, facts.gates) {
        return Ok(None);
    }
    if let Some(blocks) = state.container_blocks(&pod.metadata.uid, &container.name) {
        return Ok(regenerate(blocks, requested));
    }
    Ok(Some(calculate(&state.machine_state, requested)?))
}

/// Pod-level resources the kubelet's Memory Manager does not handle (both gates are needed).
fn pod_level_unmanaged(pod: &Pod, gates: FeatureGates) -> bool {
    requests::pod_level_set(pod)
        && !(gates.pod_level_resources && gates.pod_level_resource_managers)
}

/// Pod scope: `GetPodTopologyHints`.
pub fn pod_hints(
    state: &MemoryManagerState,
    pod: &Pod,
    gates: FeatureGates,
) -> Result<Hints, HintError> {
    if requests::qos_class(pod, gates)? != QosClass::Guaranteed {
        return Ok(None);
    }
    let requested = requests::pod_requests(pod, gates)?;
    if pod_level_unmanaged(pod, gates) {
        return Ok(None);
    }
    let managed = gates.pod_level_resource_managers && requests::pod_level_set(pod);
    if managed && !shared_pool_fits(pod, &requested, gates)? {
        // No placement: the Topology Manager refuses the pod.
        return Ok(Some(
            requested.keys().map(|r| (r.clone(), Vec::new())).collect(),
        ));
    }
    if requested.is_empty() {
        return Ok(None);
    }
    let uid = &pod.metadata.uid;
    if managed && let Some(blocks) = state.pod_blocks(uid) {
        return Ok(regenerate(blocks, &requested));
    }
    let containers = pod.spec.init_containers.iter().chain(&pod.spec.containers);
    for c in containers {
        if let Some(blocks) = state.container_blocks(uid, &c.name) {
            let field = format_args!("container {:?}", c.name);
            let own = requests::exclusive_requests(pod, c, gates, field)?;
            return Ok(regenerate(blocks, &own));
        }
    }
    Ok(Some(calculate(&state.machine_state, &requested)?))
}

/// `validatePodScopeResources`: containers without exclusive memory share what the exclusive
/// ones leave of the pod's budget, and there must be some left for them.
fn shared_pool_fits(pod: &Pod, budget: &Requested, gates: FeatureGates) -> Result<bool, HintError> {
    let mut exclusive = Requested::new();
    let mut shared = false;
    let exhausted = |sum: &Requested| {
        budget
            .iter()
            .any(|(r, &total)| sum.get(r).copied().unwrap_or(0) >= total)
    };
    for (i, c) in pod.spec.init_containers.iter().enumerate() {
        let field = format_args!("spec.initContainers[{i}]");
        let own = requests::exclusive_requests(pod, c, gates, field)?;
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        match (sidecar, own.is_empty()) {
            (false, true) if exhausted(&exclusive) => return Ok(false),
            (true, true) => shared = true,
            (true, false) => add(
                &mut exclusive,
                own,
                format_args!("{field}.resources.requests"),
            )?,
            (false, _) => {}
        }
    }
    for (i, c) in pod.spec.containers.iter().enumerate() {
        let field = format_args!("spec.containers[{i}]");
        let own = requests::exclusive_requests(pod, c, gates, field)?;
        if own.is_empty() {
            shared = true;
        } else {
            add(
                &mut exclusive,
                own,
                format_args!("{field}.resources.requests"),
            )?;
        }
    }
    Ok(!(shared && exhausted(&exclusive)))
}

/// Adds `more` to `into`; a total beyond 64 bits of bytes names the resource and `field`.
fn add(into: &mut Requested, more: Requested, field: impl Display) -> Result<(), RequestError> {
    more.into_iter()
        .try_for_each(|(r, bytes)| requests::add(into, r, bytes, &field))
}

/// Hints from blocks already assigned: one preferred hint per block, or none at all when the
/// blocks do not match the request (type for type, size for size).
pub fn regenerate(blocks: &[Block], requested: &Requested) -> Hints {
    if blocks.len() != requested.len() {
        return None;
    }
    let mut hints: BTreeMap<String, Vec<TopologyHint>> = requested
        .keys()
        .map(|name| (name.clone(), Vec::new()))
        .collect();
    for block in blocks {
        if requested.get(&block.resource) != Some(&block.size) {
            return None;
        }
        let affinity = NumaMask::from_nodes(&block.numa_affinity).ok()?;
        hints
            .entry(block.resource.clone())
            .or_default()
            .push(TopologyHint {
                affinity: Some(affinity),
                preferred: true,
            });
    }
    Some(hints)
}

/// Hints from the machine state (see the module documentation). A resource the machine state
/// has no table for counts as none available.
pub fn calculate(
    machine: &MachineState,
    requested: &Requested,
) -> Result<BTreeMap<String, Vec<TopologyHint>>, HintError> {
    let nodes: Vec<usize> = machine.keys().copied().collect();
    if nodes.len() > MAX_HINT_NODES {
        return Err(HintError::TooManyNodes { nodes: nodes.len() });
    }
    if let Some(&id) = machine.keys().find(|&&id| id > bitmask::MAX_NODE) {
        return Err(BitmaskError::OutOfRange(id).into());
    }
    // Per node id: (allocatable, free) per requested resource (`amounts`, a row of `width` per
    // node id), and its grouping.
    let ids = machine.keys().next_back().map_or(0, |&id| id + 1);
    let width = requested.len();
    let mut amounts = vec![(0u64, 0u64); ids * width];
    let mut facts: Vec<Option<NodeFacts>> = vec![None; ids];
    for (&id, state) in machine {
        let Some(slot) = facts.get_mut(id) else {
            return Err(BitmaskError::OutOfRange(id).into());
        };
        let row = &mut amounts[id * width..(id + 1) * width];
        for (amount, resource) in row.iter_mut().zip(requested.keys()) {
            let t: MemoryTable = state.memory_map.get(resource).copied().unwrap_or_default();
            *amount = (t.allocatable, t.free);
        }
        *slot = Some(NodeFacts {
            cells: state.cells.len(),
            group: NumaMask::from_nodes(&state.cells).ok(),
            assigned: state.number_of_assignments > 0,
        });
    }
    let mut min_affinity = nodes.len() as u32;
    let mut fitting = Vec::new();
    let mut sums = vec![(0u64, 0u64); width];
    bitmask::iterate_masks(&nodes, |mask| {
        sums.iter_mut().for_each(|s| *s = (0, 0));
        let members = || mask.iter();
        for n in members().filter(|&n| facts[n].is_some()) {
            let row = &amounts[n * width..(n + 1) * width];
            for (sum, &(allocatable, free)) in sums.iter_mut().zip(row) {
                sum.0 = sum.0.saturating_add(allocatable);
                sum.1 = sum.1.saturating_add(free);
            }
        }
        if sums
            .iter()
            .zip(requested.values())
            .any(|(s, &want)| s.0 < want)
        {
            return;
        }
        min_affinity = min_affinity.min(mask.count());
        let fact = |n: usize| facts[n].as_ref();
        if mask.count() == 1 {
            if members().any(|n| fact(n).is_some_and(|f| f.cells > 1)) {
                return;
            }
        } else {
            let blocked = members().any(|n| {
                fact(n).is_some_and(|f| {
                    f.assigned
                        && (f.cells == 1
                            || f.group != Some(mask)
                            || f.cells != mask.count() as usize)
                })
            });
            if blocked {
                return;
            }
        }
        if sums
            .iter()
            .zip(requested.values())
            .all(|(s, &want)| s.1 >= want)
        {
            fitting.push(mask);
        }
    })?;
    if fitting.is_empty() {
        // The kubelet adds a resource's entry with its first hint: no hint, no entry.
        return Ok(BTreeMap::new());
    }
    let hints: Vec<TopologyHint> = fitting
        .iter()
        .map(|&mask| TopologyHint {
            affinity: Some(mask),
            preferred: mask.count() == min_affinity,
        })
        .collect();
    // Every resource gets the same list: the last one takes it, the others a copy.
    let mut names = requested.keys();
    let last = names.next_back();
    let mut all: BTreeMap<String, Vec<TopologyHint>> =
        names.map(|name| (name.clone(), hints.clone())).collect();
    all.extend(last.map(|name| (name.clone(), hints)));
    Ok(all)
}

/// What the hint rules need of one node besides its amounts.
#[derive(Debug, Clone, Copy)]
struct NodeFacts {
    /// Nodes in its group (`cells`), the group itself, and whether anything is assigned on it.
    cells: usize,
    group: Option<NumaMask>,
    assigned: bool,
}

#[cfg(test)]
mod tests;
