//! Which NUMA nodes each part of a pod's hugepage request is verified on (KEP-5759: verification
//! after NUMA selection, on the selected nodes only). Without `numaNodes` in the request the
//! kubelet's selection decides: the nodes each Guaranteed container (container scope) or the pod
//! (pod scope) is allocated on; hugepages of containers with no allocation (not Guaranteed), and
//! whatever the pod needs beyond its app containers (init containers, overhead, pod-level
//! resources), are verified on every node. Groups with the same nodes are checked together, and
//! their verdicts combined.

use std::collections::BTreeMap;

use super::verify::Verdict;
use crate::{
    host::NumaNode,
    kube::pod::{self, Hugepages, Pod, PodHugepages},
    memorymanager::{
        hints::{HintError, Scope},
        selection::{self, Selection, Topology},
        state::MemoryManagerState,
    },
};

/// Hugepages to verify per set of NUMA nodes, and the selection behind them.
#[derive(Debug, Clone)]
pub struct Plan {
    pub groups: BTreeMap<Vec<NumaNode>, Hugepages>,
    pub selection: Selection,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Hints(#[from] HintError),
}

/// Selects nodes for `pod` on `state` and groups its hugepages (`pages`, as
/// [`pod::pod_hugepages`] counts them for `pod`) by the nodes they come from.
pub fn plan(
    state: &MemoryManagerState,
    pod: &Pod,
    pages: &PodHugepages,
    topology: Topology<'_>,
    all_nodes: &[NumaNode],
) -> Result<Plan, PlanError> {
    let total = &pages.total;
    let selection = selection::select(state, pod, topology)?;
    let mut groups: BTreeMap<Vec<NumaNode>, Hugepages> = BTreeMap::new();
    if !selection.admit {
        return Ok(Plan { groups, selection });
    }
    let nodes_of = |allocated: Option<crate::topologymanager::NumaMask>| -> Vec<NumaNode> {
        allocated.map_or_else(
            || all_nodes.to_vec(),
            |mask| {
                mask.nodes()
                    .into_iter()
                    .map(|n| NumaNode(n as u32))
                    .collect()
            },
        )
    };
    let mut placed = Hugepages::new();
    if topology.scope == Scope::Pod {
        let nodes = nodes_of(selection.placements.first().and_then(|p| p.allocated));
        placed = total.clone();
        groups.insert(nodes, total.clone());
    } else {
        debug_assert_eq!(pod.spec.containers.len(), pages.containers.len());
        for (container, own) in pod.spec.containers.iter().zip(&pages.containers) {
            let allocated = selection
                .placements
                .iter()
                .find(|p| !p.init && p.container.as_deref() == Some(container.name.as_str()))
                .and_then(|p| p.allocated);
            let group = groups.entry(nodes_of(allocated)).or_default();
            pod::add(group, own);
            pod::add(&mut placed, own);
        }
    }
    let rest: Hugepages = total
        .iter()
        .filter_map(|(&size, &bytes)| {
            let left = bytes.saturating_sub(placed.get(&size).copied().unwrap_or(0));
            (left > 0).then_some((size, left))
        })
        .collect();
    if !rest.is_empty() {
        pod::add(groups.entry(all_nodes.to_vec()).or_default(), &rest);
    }
    groups.retain(|_, pages| !pages.is_empty());
    Ok(Plan { groups, selection })
}

/// One verdict from the verdicts of several groups: allowed only if all are, the first refusal's
/// reason and message, every check, and the union of the nodes.
pub fn combine(verdicts: Vec<Verdict>) -> Option<Verdict> {
    let mut iter = verdicts.into_iter();
    let mut combined = iter.next()?;
    for v in iter {
        if combined.allowed && !v.allowed {
            combined.allowed = false;
            combined.reason = v.reason;
            combined.message = v.message;
        }
        combined.numa_nodes.extend(v.numa_nodes);
        combined.checks.extend(v.checks);
    }
    combined.numa_nodes.sort();
    combined.numa_nodes.dedup();
    Some(combined)
}
