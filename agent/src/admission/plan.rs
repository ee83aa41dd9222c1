//! Which NUMA nodes each part of a pod's hugepage request is verified on (KEP-5759: verification
//! after NUMA selection, on the selected nodes only). Without `numaNodes` in the request the
//! kubelet's selection decides: the nodes each Guaranteed container (container scope) or the pod
//! (pod scope) is allocated on; hugepages of containers with no allocation (not Guaranteed), and
//! whatever the pod needs beyond its app containers (init containers, overhead, pod-level
//! resources), are verified on every node. Groups with the same nodes are checked together, and
//! their verdicts combined.

use std::collections::BTreeMap;

use super::verify::{Mode, Verdict};
use crate::{
    host::NumaNode,
    kube::pod::{self, Hugepages, Pod, PodHugepages, RequestError},
    memorymanager::{
        hints::{HintError, Scope},
        requests::ContainerRequests,
        selection::{self, Basis, Selection, Topology},
        state::MemoryManagerState,
    },
};

/// Hugepages to verify per set of NUMA nodes, and the selection behind them.
#[derive(Debug, Clone)]
pub struct Plan {
    pub groups: BTreeMap<Vec<NumaNode>, Hugepages>,
    pub selection: Selection,
}

impl Plan {
    /// Nothing selected: `pages` verified on `nodes`, the request's or, for
    /// [`Basis::NodeWide`], every node of the machine.
    pub fn unselected(nodes: &[NumaNode], pages: &Hugepages, basis: Basis) -> Plan {
        Plan {
            groups: BTreeMap::from([(nodes.to_vec(), pages.clone())]),
            selection: Selection::unselected(basis),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Hints(#[from] HintError),
    /// A group's sum beyond 64 bits of bytes (none when `pages` are the pod's checked sums).
    #[error(transparent)]
    Request(#[from] RequestError),
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
    let read = ContainerRequests::default();
    plan_with(state, pod, &read, pages, topology, all_nodes)
}

/// [`plan`] with the containers' requests of `pod` read already ([`ContainerRequests::of`] of
/// this very pod): a pod planned on many states reads them once. ([`plan`] reads each where the
/// selection needs it.)
pub fn plan_with(
    state: &MemoryManagerState,
    pod: &Pod,
    read: &ContainerRequests,
    pages: &PodHugepages,
    topology: Topology<'_>,
    all_nodes: &[NumaNode],
) -> Result<Plan, PlanError> {
    let total = &pages.total;
    let selection = selection::select_with(state, pod, read, topology)?;
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
        // An admitted selection places every init container, then every app container, in the
        // pod's order: the app containers' placements are taken in turn, none looked up.
        let apps = selection
            .placements
            .iter()
            .inspect(|_| counted())
            .filter(|p| !p.init);
        debug_assert_eq!(pod.spec.containers.len(), pages.containers.len());
        let each = pod.spec.containers.iter().zip(&pages.containers).zip(apps);
        for (i, ((container, own), placement)) in each.enumerate() {
            debug_assert_eq!(
                placement.container.as_deref(),
                Some(container.name.as_str())
            );
            let field = format_args!("spec.containers[{i}].resources");
            let group = groups.entry(nodes_of(placement.allocated)).or_default();
            pod::add(group, own, field)?;
            pod::add(&mut placed, own, field)?;
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
        pod::add(groups.entry(all_nodes.to_vec()).or_default(), &rest, "spec")?;
    }
    groups.retain(|_, pages| !pages.is_empty());
    Ok(Plan { groups, selection })
}

#[cfg(test)]
thread_local! {
    /// How many placements this thread looked at to find each container's: the tests count
    /// work with it.
    static PLACEMENTS_EXAMINED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one placement looked at (tests only).
fn counted() {
    #[cfg(test)]
    PLACEMENTS_EXAMINED.with(|n| n.set(n.get() + 1));
}

/// The verdict on `plan`: each group verified on its nodes by `verify`, the verdicts combined
/// ([`combine`]), and a selection the kubelet would refuse refusing with its reason and message
/// whatever the groups say. The agent verifies on fresh sysfs reads; the webhook on the state an
/// agent streamed: one decision for both.
pub fn verdict<E>(
    plan: &Plan,
    mode: Mode,
    mut verify: impl FnMut(&Hugepages, &[NumaNode]) -> Result<Verdict, E>,
) -> Result<Verdict, E> {
    let mut verdicts = Vec::with_capacity(plan.groups.len());
    for (nodes, pages) in &plan.groups {
        verdicts.push(verify(pages, nodes)?);
    }
    let mut verdict = combine(verdicts).unwrap_or_else(|| Verdict {
        allowed: true,
        reason: None,
        message: None,
        numa_nodes: Vec::new(),
        mode,
        checks: Vec::new(),
        reservation: None,
    });
    if !plan.selection.admit {
        verdict.allowed = false;
        verdict.reason = plan.selection.reason;
        verdict.message = plan.selection.message.clone();
    }
    Ok(verdict)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        host::PageSize,
        kubelet::features::FeatureGates,
        memorymanager::testing::{GI, node, pod, state},
        topologymanager::{NumaInfo, Policy, PolicyOptions},
    };

    /// Bug (#23): each container's placement was found by scanning every placement before it,
    /// so planning a pod cost the square of its size.
    #[test]
    fn each_container_finds_its_placement_without_scanning_the_others() {
        let state = state(vec![
            (
                0,
                node(
                    &[("memory", 64 * GI, 64 * GI), ("hugepages-2Mi", GI, GI)],
                    &[0],
                    0,
                ),
            ),
            (
                1,
                node(
                    &[("memory", 64 * GI, 64 * GI), ("hugepages-2Mi", GI, GI)],
                    &[1],
                    0,
                ),
            ),
        ]);
        let options = PolicyOptions::default();
        let info = NumaInfo::new(vec![0, 1], BTreeMap::new()).expect("numa info");
        let topology = Topology {
            info: &info,
            policy: Policy::SingleNumaNode,
            options: &options,
            scope: Scope::Container,
            gates: FeatureGates::default(),
        };
        let all = [NumaNode(0), NumaNode(1)];
        for n in [1usize, 10, 100] {
            let list = serde_json::json!({"cpu": "1", "memory": "16Mi", "hugepages-2Mi": "2Mi"});
            let containers: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"name": format!("c-{i}"), "resources": {"requests": list, "limits": list}}))
                .collect();
            let pod = pod(serde_json::json!({
                "metadata": {"uid": "wide", "name": "wide"},
                "spec": {"containers": containers},
                "status": {"qosClass": "Guaranteed"}
            }));
            let pages = pod::pod_hugepages(&pod.spec).expect("valid");
            PLACEMENTS_EXAMINED.with(|c| c.set(0));
            let plan = plan(&state, &pod, &pages, topology, &all).expect("a plan");
            assert!(plan.selection.admit);
            let bytes = u64::try_from(n).expect("small") * (2 << 20);
            assert_eq!(
                plan.groups
                    .values()
                    .map(|g| g[&PageSize(2 << 20)])
                    .sum::<u64>(),
                bytes
            );
            assert!(
                PLACEMENTS_EXAMINED.with(std::cell::Cell::get) <= n,
                "{n} containers: {} placements looked at",
                PLACEMENTS_EXAMINED.with(std::cell::Cell::get)
            );
        }
    }
}
