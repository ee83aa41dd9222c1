use std::collections::BTreeMap;

use super::*;
use crate::memorymanager::testing::{GI, guaranteed, node, state};

fn two_nodes(free_huge: [u64; 2]) -> MemoryManagerState {
    state(vec![
        (
            0,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 2 * GI, free_huge[0]),
                ],
                &[0],
                0,
            ),
        ),
        (
            1,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 2 * GI, free_huge[1]),
                ],
                &[1],
                0,
            ),
        ),
    ])
}

fn select_with(state: &MemoryManagerState, pod: &Pod, policy: Policy, scope: Scope) -> Selection {
    let options = PolicyOptions::default();
    let info = NumaInfo::new(vec![0, 1], BTreeMap::new(), &options).unwrap();
    let topology = Topology {
        info: &info,
        policy,
        options: &options,
        scope,
        gates: FeatureGates::default(),
    };
    select(state, pod, topology).unwrap()
}

fn allocated(selection: &Selection) -> Vec<Option<Vec<usize>>> {
    selection
        .placements
        .iter()
        .map(|p| p.allocated.map(NumaMask::nodes))
        .collect()
}

#[test]
fn containers_take_the_free_node_in_turn() {
    let state = two_nodes([2 * GI, 2 * GI]);
    let pod = guaranteed(&[("a", "1Gi", "2Gi"), ("b", "1Gi", "2Gi")]);
    let selection = select_with(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0]), Some(vec![1])]);
}

#[test]
fn single_numa_node_refuses_what_fits_only_across_nodes() {
    let state = two_nodes([GI, GI]);
    let pod = guaranteed(&[("a", "1Gi", "2Gi")]);
    let selection = select_with(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(!selection.admit);
    assert_eq!(selection.reason, Some(REASON_TOPOLOGY));
    assert_eq!(
        selection.message.as_deref(),
        Some("Resources cannot be allocated with Topology locality")
    );
    // best-effort takes both nodes instead.
    let selection = select_with(&state, &pod, Policy::BestEffort, Scope::Container);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0, 1])]);
}

#[test]
fn nothing_fitting_anywhere_fails_in_allocate_like_the_kubelet() {
    let state = two_nodes([0, 0]);
    let pod = guaranteed(&[("a", "1Gi", "1Gi")]);
    // No hints is "no preference" to the Topology Manager; Allocate then finds nothing.
    // single-numa-node merges to no nodes at all: the default affinity is looked for.
    let selection = select_with(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(!selection.admit);
    assert_eq!(selection.reason, Some(REASON_ALLOCATE));
    assert_eq!(
        selection.message.as_deref(),
        Some(
            "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
        )
    );
    // best-effort merges to every node, which lacks the memory: the hint cannot be extended.
    let selection = select_with(&state, &pod, Policy::BestEffort, Scope::Container);
    assert_eq!(selection.reason, Some(REASON_ALLOCATE));
    assert!(
        selection
            .message
            .as_deref()
            .unwrap()
            .contains("failed to find NUMA nodes to extend the current topology hint"),
        "{selection:?}"
    );
}

#[test]
fn pod_scope_places_the_sum_and_burstable_pods_get_no_hints() {
    let state = two_nodes([2 * GI, 2 * GI]);
    let pod = guaranteed(&[("a", "1Gi", "1Gi"), ("b", "1Gi", "1Gi")]);
    let selection = select_with(&state, &pod, Policy::SingleNumaNode, Scope::Pod);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0])]);
    let mut burstable = pod.clone();
    burstable.status.qos_class = Some("Burstable".into());
    let selection = select_with(&state, &burstable, Policy::SingleNumaNode, Scope::Pod);
    assert!(selection.admit);
    assert_eq!(selection.placements[0].hints, None);
    assert_eq!(selection.placements[0].merged.hint.affinity, None);
    assert_eq!(allocated(&selection), vec![None]);
}
