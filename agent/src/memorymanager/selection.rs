//! NUMA selection for admission, the kubelet's way: the Memory Manager's hints for each container
//! (container scope: init containers, then app containers) or for the whole pod (pod scope),
//! merged under the Topology Manager policy, then the static policy's `Allocate`: a merged hint
//! without nodes takes the best default hint, a hint whose nodes lack free memory is extended to
//! the best hint containing it, a mask that would put a node pinned alone (or in another group)
//! into a multi-node allocation is refused, and failing any rejects the pod as the kubelet does. In
//! container scope each app container's nodes are then taken from the state (free becomes
//! reserved node by node, the nodes become one group) before the next container's hints; init
//! containers run before the app containers and are not charged, as the kubelet reuses their
//! memory.
//! The Memory Manager is the only hint provider the agent knows: CPU and device hints are not
//! seen, so a pod the kubelet rejects for CPU alignment alone is not rejected here.

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use serde::Serialize;

use super::{
    hints::{self, HintError, Hints, PodFacts, Scope},
    requests::{self, ContainerRequests, Requested},
    state::{Block, MachineState, MemoryManagerState, MemoryTable},
};
use crate::{
    kube::pod::Pod,
    kubelet::features::FeatureGates,
    topologymanager::{Merged, NumaInfo, NumaMask, Policy, PolicyOptions, TopologyHint, merge},
};

/// The decision for one container (container scope) or the pod (pod scope).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The container, or `None` in pod scope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Whether it is an init container.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub init: bool,
    pub hints: Hints,
    pub merged: Merged,
    /// The nodes its memory and hugepages come from (Guaranteed containers that request them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated: Option<NumaMask>,
}

/// How the NUMA nodes to verify on were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// The Memory Manager's static policy: its hints, the Topology Manager's merge, `Allocate`.
    StaticPolicy,
    /// Memory Manager policy `None`: the kubelet pins no memory to NUMA nodes, so KEP-5759's
    /// per-node check does not apply; the pod is verified on every node.
    NodeWide,
    /// The request named the nodes.
    Request,
}

/// What a node-wide selection says in the answer.
pub const NODE_WIDE_NOTE: &str = "the kubelet's Memory Manager policy is None: it pins no memory to NUMA nodes and KEP-5759's per-node check does not apply; verified on every NUMA node, as for a pod that is not Guaranteed";

/// Every placement, up to and including the first that is refused.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Selection {
    pub basis: Basis,
    /// Why the basis is not the static policy's, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    pub admit: bool,
    /// The kubelet's reason for a refusal: `TopologyAffinityError` or `UnexpectedAdmissionError`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub placements: Vec<Placement>,
}

/// The kubelet's reason when the Topology Manager's policy refuses the merged hint.
pub const REASON_TOPOLOGY: &str = "TopologyAffinityError";
/// The kubelet's reason when the Memory Manager's `Allocate` fails.
pub const REASON_ALLOCATE: &str = "UnexpectedAdmissionError";

impl Selection {
    fn admitted(placements: Vec<Placement>) -> Self {
        Selection {
            basis: Basis::StaticPolicy,
            note: None,
            admit: true,
            reason: None,
            message: None,
            placements,
        }
    }

    /// Nothing selected: the nodes are the request's, or every node (`basis`).
    pub fn unselected(basis: Basis) -> Self {
        Selection {
            basis,
            note: (basis == Basis::NodeWide).then_some(NODE_WIDE_NOTE),
            admit: true,
            reason: None,
            message: None,
            placements: Vec::new(),
        }
    }

    fn refused(placements: Vec<Placement>, reason: &'static str, message: String) -> Self {
        Selection {
            basis: Basis::StaticPolicy,
            note: None,
            admit: false,
            reason: Some(reason),
            message: Some(message),
            placements,
        }
    }
}

/// How the kubelet picks NUMA nodes on this node: the machine, the policy and the options in
/// effect, the scope and the gates ([`TopologyConfig::topology`] borrows them).
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    pub info: Arc<NumaInfo>,
    pub policy: Policy,
    pub options: PolicyOptions,
    pub scope: Scope,
    pub gates: FeatureGates,
}

impl TopologyConfig {
    /// What the selection reads.
    pub fn topology(&self) -> Topology<'_> {
        Topology {
            info: &self.info,
            policy: self.policy,
            options: &self.options,
            scope: self.scope,
            gates: self.gates,
        }
    }
}

/// What the selection needs besides the pod.
#[derive(Debug, Clone, Copy)]
pub struct Topology<'a> {
    pub info: &'a NumaInfo,
    pub policy: Policy,
    pub options: &'a PolicyOptions,
    pub scope: Scope,
    pub gates: FeatureGates,
}

/// Selects NUMA nodes for `pod` on `state`.
pub fn select(
    state: &MemoryManagerState,
    pod: &Pod,
    topology: Topology<'_>,
) -> Result<Selection, HintError> {
    select_with(state, pod, &ContainerRequests::default(), topology)
}

/// [`select`] with the containers' requests of `pod` read already (`read`, made by
/// [`ContainerRequests::of`] of this very pod); a container `read` lacks (all, when it is empty)
/// has its requests read where they are needed, as [`select`] does.
pub fn select_with(
    state: &MemoryManagerState,
    pod: &Pod,
    read: &ContainerRequests,
    topology: Topology<'_>,
) -> Result<Selection, HintError> {
    let merge_one = |hints: &Hints| {
        let lists = hint_lists(hints);
        merge::merge_lists(topology.policy, topology.options, topology.info, &lists)
    };
    // Worked out once for the pod, not for each container (see [`hints::PodFacts`]).
    let facts = PodFacts::of(pod, topology.gates)?;
    let guaranteed = facts.guaranteed;
    // Copied only when a container is charged: most admissions never change it.
    let mut working = Cow::Borrowed(state);
    let mut placements = Vec::new();
    let pod_scope = topology.scope == Scope::Pod;
    let whole = std::iter::once(None).filter(|_| pod_scope);
    let init = pod.spec.init_containers.iter().map(|c| Some((c, true)));
    let apps = pod.spec.containers.iter().map(|c| Some((c, false)));
    let units: Vec<_> = if pod_scope {
        whole.collect()
    } else {
        init.chain(apps).collect()
    };
    let last = units.len().saturating_sub(1);
    for (i, unit) in units.into_iter().enumerate() {
        let assigned = match unit {
            None => assigned_nodes(state.pod_blocks(&pod.metadata.uid)).or_else(|| {
                let all = pod.spec.init_containers.iter().chain(&pod.spec.containers);
                all.filter_map(|c| state.container_blocks(&pod.metadata.uid, &c.name))
                    .find_map(|b| assigned_nodes(Some(b)))
            }),
            Some((c, _)) => assigned_nodes(state.container_blocks(&pod.metadata.uid, &c.name)),
        };
        // A Guaranteed container's requests, read once for its hints and for its charge: whether
        // they are its own (not the pod's shared pool), and what they are when either needs them.
        let own = match unit {
            Some((c, _)) if guaranteed => {
                let field = format_args!("container {:?}", c.name);
                let exclusive = requests::has_exclusive(pod, c, topology.gates, field)?;
                let needed = exclusive || assigned.is_none();
                let own = needed.then(|| match read.get(i) {
                    Some(Ok(requested)) => Ok(Cow::Borrowed(requested)),
                    Some(Err(e)) => Err(e.clone()),
                    None => requests::container_requests(c, field).map(Cow::Owned),
                });
                own.transpose()?.map(|r| (exclusive, r))
            }
            _ => None,
        };
        let hints = match (unit, &own) {
            (None, _) => hints::pod_hints(&working, pod, topology.gates)?,
            (Some((c, _)), Some((true, requested))) => {
                hints::exclusive_hints(&working, pod, &facts, c, requested)?
            }
            (Some(_), _) => None,
        };
        let merged = merge_one(&hints);
        let mut placement = Placement {
            container: unit.map(|(c, _)| c.name.clone()),
            init: unit.is_some_and(|(_, init)| init),
            hints,
            merged,
            allocated: None,
        };
        if !merged.admit {
            placements.push(placement);
            return Ok(Selection::refused(
                placements,
                REASON_TOPOLOGY,
                "Resources cannot be allocated with Topology locality".into(),
            ));
        }
        // Only a Guaranteed pod not allocated before is charged: no one else's requests are read.
        let requested = match unit {
            _ if assigned.is_some() || !guaranteed => Cow::Owned(Requested::new()),
            None => Cow::Owned(requests::pod_requests(pod, topology.gates)?),
            Some(_) => own.map_or(Cow::Owned(Requested::new()), |(_, r)| r),
        };
        if let Some(nodes) = assigned {
            // Allocated before (a kubelet restart): the kubelet keeps what it assigned.
            placement.allocated = Some(nodes);
        } else if !requested.is_empty() {
            let computed = placement.hints.as_ref();
            match allocation(&working.machine_state, computed, merged.hint, &requested)? {
                Ok(nodes) => {
                    // The state charged is read by the units after this one only.
                    if !placement.init && i < last {
                        allocate(
                            &mut working.to_mut().machine_state,
                            &nodes.nodes(),
                            &requested,
                        );
                    }
                    placement.allocated = Some(nodes);
                }
                Err(why) => {
                    placements.push(placement);
                    return Ok(Selection::refused(
                        placements,
                        REASON_ALLOCATE,
                        format!(
                            "Allocate failed due to [memorymanager] {why}, which is unexpected"
                        ),
                    ));
                }
            }
        }
        placements.push(placement);
    }
    Ok(Selection::admitted(placements))
}

/// The Memory Manager's hints as the merge's lists, as [`merge::provider_lists`] makes them of
/// it as the only provider: no hints at all is "no preference" ([`merge::ANY_NODE`]), a resource
/// without a hint "fits nowhere" ([`merge::NOWHERE`]).
fn hint_lists(hints: &Hints) -> Vec<&[TopologyHint]> {
    match hints {
        Some(resources) if !resources.is_empty() => resources
            .values()
            .map(|h| {
                if h.is_empty() {
                    merge::NOWHERE
                } else {
                    h.as_slice()
                }
            })
            .collect(),
        _ => vec![merge::ANY_NODE],
    }
}

/// The nodes of blocks already assigned.
fn assigned_nodes(blocks: Option<&[Block]>) -> Option<NumaMask> {
    let nodes: Vec<usize> = blocks?
        .iter()
        .flat_map(|b| b.numa_affinity.iter().copied())
        .collect();
    NumaMask::from_nodes(&nodes).ok().filter(|m| m.count() > 0)
}

/// The static policy's choice of nodes for a merged hint, or why there is none. `computed` are
/// the hints just calculated on this same state, when they were.
fn allocation(
    machine: &MachineState,
    computed: Option<&BTreeMap<String, Vec<TopologyHint>>>,
    merged: TopologyHint,
    requested: &Requested,
) -> Result<Result<NumaMask, &'static str>, HintError> {
    let all = match computed {
        Some(hints) => Cow::Borrowed(hints),
        None => Cow::Owned(hints::calculate(machine, requested)?),
    };
    // Every memory type has the same masks; the kubelet looks at regular memory.
    let list = all.get("memory").or_else(|| all.values().next());
    let best = match merged.affinity {
        Some(mask) => TopologyHint {
            affinity: Some(mask),
            preferred: merged.preferred,
        },
        None => {
            let Some(default) = list.and_then(|l| best_hint(l.iter())) else {
                return Ok(Err(
                    "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available",
                ));
            };
            if !default.preferred && merged.preferred {
                return Ok(Err("failed to find the default preferred hint"));
            }
            default
        }
    };
    let Some(mask) = best.affinity else {
        return Ok(Err("failed to find the default preferred hint"));
    };
    let satisfied = requested.iter().all(|(resource, &bytes)| {
        mask.iter()
            .filter_map(|n| machine.get(&n)?.memory_map.get(resource))
            .map(|t| t.free)
            .fold(0u64, u64::saturating_add)
            >= bytes
    });
    let mask = if satisfied {
        mask
    } else {
        let containing = list
            .into_iter()
            .flatten()
            .filter(|h| h.affinity.is_some_and(|m| m.and(mask) == mask));
        let Some(extended) = best_hint(containing) else {
            return Ok(Err(
                "failed to find NUMA nodes to extend the current topology hint",
            ));
        };
        if !extended.preferred && best.preferred {
            return Ok(Err("failed to find the extended preferred hint"));
        }
        let Some(mask) = extended.affinity else {
            return Ok(Err(
                "failed to find NUMA nodes to extend the current topology hint",
            ));
        };
        mask
    };
    if violates_numa_allocations(machine, mask) {
        return Ok(Err("preferred hint violates NUMA node allocation"));
    }
    Ok(Ok(mask))
}

/// `isAffinityViolatingNUMAAllocations`: a node already pinned alone joins no multi-node mask,
/// and a node of a group joins no other mask than that group. The merge can reach such a mask
/// where the hints could not: a Memory Manager with no hint at all has "no preference", which
/// merges to every node.
fn violates_numa_allocations(machine: &MachineState, mask: NumaMask) -> bool {
    if mask.count() == 1 {
        return false;
    }
    let nodes = mask.nodes();
    nodes.iter().filter_map(|n| machine.get(n)).any(|state| {
        if state.number_of_assignments == 0 {
            return false;
        }
        let mut group = state.cells.clone();
        group.sort_unstable();
        group.len() == 1 || group != nodes
    })
}

/// The first preferred hint with the fewest nodes, else the first with the fewest nodes.
fn best_hint<'h>(hints: impl Iterator<Item = &'h TopologyHint>) -> Option<TopologyHint> {
    let count = |h: &TopologyHint| h.affinity.map_or(0, NumaMask::count);
    hints
        .copied()
        .reduce(|best, hint| match (best.preferred, hint.preferred) {
            (true, false) => best,
            (false, true) => hint,
            _ if count(&hint) < count(&best) => hint,
            _ => best,
        })
}

/// Takes `requested` from the free memory of `nodes`, in node order, and makes them one group.
fn allocate(machine: &mut MachineState, nodes: &[usize], requested: &Requested) {
    for (resource, &bytes) in requested {
        let mut left = bytes;
        for node in nodes {
            let Some(state) = machine.get_mut(node) else {
                continue;
            };
            state.number_of_assignments += 1;
            if state.cells != nodes {
                state.cells = nodes.to_vec();
            }
            if !state.memory_map.contains_key(resource) {
                state
                    .memory_map
                    .insert(resource.clone(), MemoryTable::default());
            }
            let Some(table) = state.memory_map.get_mut(resource) else {
                continue;
            };
            let take = table.free.min(left);
            table.free -= take;
            table.reserved += take;
            left -= take;
        }
    }
}

#[cfg(test)]
mod tests;
