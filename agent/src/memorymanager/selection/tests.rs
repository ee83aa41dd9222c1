use std::collections::BTreeMap;

use super::*;
use crate::{
    memorymanager::testing::{GI, guaranteed, node, state},
    topologymanager::{
        ProviderHints,
        merge::reference::{self, Rule},
    },
};

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

/// `f` of the Topology Manager's settings on two NUMA nodes under `policy` and `scope`.
fn with_topology<R>(policy: Policy, scope: Scope, f: impl FnOnce(Topology<'_>) -> R) -> R {
    let options = PolicyOptions::default();
    let info = NumaInfo::new(vec![0, 1], BTreeMap::new()).unwrap();
    f(Topology {
        info: &info,
        policy,
        options: &options,
        scope,
        gates: FeatureGates::default(),
    })
}

/// The selection of `pod` on `state` under `policy` and `scope`, the same whether the
/// containers' requests are read where needed or once beforehand (as the webhook reads them).
fn selected(state: &MemoryManagerState, pod: &Pod, policy: Policy, scope: Scope) -> Selection {
    with_topology(policy, scope, |topology| {
        let selection = select(state, pod, topology).unwrap();
        let read = ContainerRequests::of(pod);
        let read_once = select_with(state, pod, &read, topology).unwrap();
        assert_eq!(
            serde_json::to_value(&read_once).unwrap(),
            serde_json::to_value(&selection).unwrap()
        );
        selection
    })
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
    let selection = selected(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0]), Some(vec![1])]);
}

#[test]
fn single_numa_node_refuses_what_fits_only_across_nodes() {
    let state = two_nodes([GI, GI]);
    let pod = guaranteed(&[("a", "1Gi", "2Gi")]);
    let selection = selected(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(!selection.admit);
    assert_eq!(selection.reason, Some(REASON_TOPOLOGY));
    assert_eq!(
        selection.message.as_deref(),
        Some("Resources cannot be allocated with Topology locality")
    );
    // best-effort takes both nodes instead.
    let selection = selected(&state, &pod, Policy::BestEffort, Scope::Container);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0, 1])]);
}

#[test]
fn nothing_fitting_anywhere_fails_in_allocate_like_the_kubelet() {
    let state = two_nodes([0, 0]);
    let pod = guaranteed(&[("a", "1Gi", "1Gi")]);
    // No hints is "no preference" to the Topology Manager; Allocate then finds nothing.
    // single-numa-node merges to no nodes at all: the default affinity is looked for.
    let selection = selected(&state, &pod, Policy::SingleNumaNode, Scope::Container);
    assert!(!selection.admit);
    assert_eq!(selection.reason, Some(REASON_ALLOCATE));
    assert_eq!(
        selection.message.as_deref(),
        Some(
            "Allocate failed due to [memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available, which is unexpected"
        )
    );
    // best-effort merges to every node, which lacks the memory: the hint cannot be extended.
    let selection = selected(&state, &pod, Policy::BestEffort, Scope::Container);
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

/// Found on the four-node VM: with node 0 pinned alone and no mask fitting, the merge under
/// restricted or best-effort is "no preference" over every node, whose free memory covers the
/// request; the kubelet's `Allocate` refuses it (`isAffinityViolatingNUMAAllocations`), the
/// agent admitted it across the pinned node.
#[test]
fn a_node_pinned_alone_is_not_allocated_across_nodes_through_no_preference() {
    let huge = |free| ("hugepages-1Gi", 2 * GI, free);
    let pinned = state(vec![
        (0, node(&[("memory", 8 * GI, 7 * GI), huge(GI)], &[0], 2)),
        (1, node(&[("memory", 8 * GI, 8 * GI), huge(GI)], &[1], 0)),
    ]);
    let pod = guaranteed(&[("a", "1Gi", "2Gi")]);
    for policy in [Policy::Restricted, Policy::BestEffort] {
        let selection = selected(&pinned, &pod, policy, Scope::Container);
        assert!(!selection.admit, "{policy:?}: {selection:?}");
        assert_eq!(selection.reason, Some(REASON_ALLOCATE));
        assert_eq!(
            selection.message.as_deref(),
            Some(
                "Allocate failed due to [memorymanager] preferred hint violates NUMA node allocation, which is unexpected"
            )
        );
    }
    // The same nodes unpinned are one allocation across both.
    let free = state(vec![
        (0, node(&[("memory", 8 * GI, 8 * GI), huge(GI)], &[0], 0)),
        (1, node(&[("memory", 8 * GI, 8 * GI), huge(GI)], &[1], 0)),
    ]);
    let selection = selected(&free, &pod, Policy::BestEffort, Scope::Container);
    assert_eq!(allocated(&selection), vec![Some(vec![0, 1])]);
}

#[test]
fn pod_scope_places_the_sum_and_burstable_pods_get_no_hints() {
    let state = two_nodes([2 * GI, 2 * GI]);
    let pod = guaranteed(&[("a", "1Gi", "1Gi"), ("b", "1Gi", "1Gi")]);
    let selection = selected(&state, &pod, Policy::SingleNumaNode, Scope::Pod);
    assert!(selection.admit);
    assert_eq!(allocated(&selection), vec![Some(vec![0])]);
    let mut burstable = pod.clone();
    burstable.status.qos_class = Some("Burstable".into());
    let selection = selected(&state, &burstable, Policy::SingleNumaNode, Scope::Pod);
    assert!(selection.admit);
    assert_eq!(selection.placements[0].hints, None);
    assert_eq!(selection.placements[0].merged.hint.affinity, None);
    assert_eq!(allocated(&selection), vec![None]);
}

/// Three nodes 10, 20 and 30 apart.
fn three_nodes_info() -> (NumaInfo, reference::NumaInfo) {
    let nodes = vec![0, 1, 2];
    let distances = BTreeMap::from([
        (0, vec![10, 20, 30]),
        (1, vec![20, 10, 20]),
        (2, vec![30, 20, 10]),
    ]);
    let info = NumaInfo::new(nodes.clone(), distances.clone()).unwrap();
    (info, reference::NumaInfo { nodes, distances })
}

/// The selection's first placement under every merging policy, with and without
/// prefer-closest-numa-nodes, beside the kubelet's merge (transcribed) of the same hints.
fn placements_beside_the_kubelet(
    state: &MemoryManagerState,
    pod: &Pod,
    decisions: &reference::Decisions,
) -> Vec<(Policy, bool, Selection, Merged)> {
    let mut all = Vec::new();
    for policy in [
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ] {
        for closest in [false, true] {
            let options = PolicyOptions {
                prefer_closest_numa_nodes: closest,
                ..PolicyOptions::default()
            };
            let (info, kubelet_info) = three_nodes_info();
            let topology = Topology {
                info: &info,
                policy,
                options: &options,
                scope: Scope::Container,
                gates: FeatureGates::default(),
            };
            let selection = select(state, pod, topology).unwrap();
            let provider: ProviderHints = selection.placements[0].hints.as_ref().map(|h| {
                h.iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect()
            });
            let kubelet = reference::merge(policy, closest, &kubelet_info, &[provider], decisions);
            all.push((policy, closest, selection, kubelet));
        }
    }
    all
}

/// Memory Manager hints alone never leave a non-preferred best narrower than the widest need
/// (`BestNonPreferredAffinityCount`): every memory type gets the same list in mask order, so the
/// first permutation is the narrowest hint of every list, exactly as wide as that need, and from
/// there only a mask as wide replaces it (case 2 of `compare`). Here no node alone has the free
/// hugepages, so every hint is a non-preferred pair or the triple, and pairs of different hints
/// merge to single nodes, narrower than the need: the kubelet still keeps the first pair.
#[test]
fn memory_manager_hints_alone_keep_the_first_hint_as_wide_as_the_widest_need() {
    let nodes = (0..3)
        .map(|n| {
            let tables = [("memory", 8 * GI, 8 * GI), ("hugepages-1Gi", 2 * GI, GI)];
            (n, node(&tables, &[n], 0))
        })
        .collect();
    let state = state(nodes);
    let pod = guaranteed(&[("a", "1Gi", "2Gi")]);
    let decisions = reference::Decisions::default();
    for (policy, closest, selection, kubelet) in
        placements_beside_the_kubelet(&state, &pod, &decisions)
    {
        let placement = &selection.placements[0];
        let list = placement
            .hints
            .as_ref()
            .and_then(|h| h.get("hugepages-1Gi"));
        let masks: Vec<_> = list.into_iter().flatten().map(|h| h.affinity).collect();
        let pair = |a, b| NumaMask::from_nodes(&[a, b]).ok();
        assert_eq!(masks[..3], [pair(0, 1), pair(0, 2), pair(1, 2)]);
        assert_eq!(placement.merged, kubelet, "{policy}, closest {closest}");
        if policy == Policy::BestEffort {
            assert_eq!(placement.merged.hint.affinity, pair(0, 1));
            assert!(!placement.merged.hint.preferred);
            assert_eq!(allocated(&selection), vec![Some(vec![0, 1])]);
        } else {
            assert_eq!(selection.reason, Some(REASON_TOPOLOGY), "{policy}");
        }
    }
    assert!(decisions.get(Rule::Case2) > 0);
    let narrower = [
        Rule::Case3a,
        Rule::Case3b,
        Rule::Case3ca,
        Rule::Case3cb,
        Rule::Case3cc,
    ];
    for rule in narrower {
        assert_eq!(decisions.get(rule), 0, "{rule:?}");
    }
}

/// The one way admission reaches that branch: a checkpoint with two blocks of one memory type
/// for a container (the kubelet writes one per type, but reads back whatever is there). Its
/// blocks come back as hints — memory on {0} and on {0, 1}, 1Gi hugepages on {0, 1, 2}, 2Mi
/// hugepages on none — so every merged hint is non-preferred, the widest need is 3 and the first
/// merged hint, {0}, is narrower: the kubelet moves to {0, 1} (case 3ca). The container keeps its
/// blocks; the merged hint is what the placement reports.
#[test]
fn two_blocks_of_one_type_in_the_checkpoint_merge_as_the_kubelet_does() {
    let mut state = two_nodes([2 * GI, 2 * GI]);
    let third = node(
        &[
            ("memory", 8 * GI, 8 * GI),
            ("hugepages-1Gi", 2 * GI, 2 * GI),
        ],
        &[2],
        0,
    );
    state.machine_state.insert(2, third);
    let block = |nodes: &[usize], resource: &str, size| Block {
        numa_affinity: nodes.to_vec(),
        resource: resource.into(),
        size,
    };
    let blocks = vec![
        block(&[0], "memory", GI),
        block(&[0, 1], "memory", GI),
        block(&[0, 1, 2], "hugepages-1Gi", 2 * GI),
    ];
    state
        .entries
        .insert("pod-1".into(), BTreeMap::from([("a".to_string(), blocks)]));
    let list = serde_json::json!({
        "cpu": "1", "memory": "1Gi", "hugepages-1Gi": "2Gi", "hugepages-2Mi": "2Mi"
    });
    let pod = crate::memorymanager::testing::pod(serde_json::json!({
        "metadata": {"uid": "pod-1", "name": "p", "namespace": "ns"},
        "spec": {"containers": [
            {"name": "a", "resources": {"requests": list, "limits": list}}
        ]}
    }));
    let decisions = reference::Decisions::default();
    for (policy, closest, selection, kubelet) in
        placements_beside_the_kubelet(&state, &pod, &decisions)
    {
        let merged = selection.placements[0].merged;
        assert_eq!(merged, kubelet, "{policy}, closest {closest}");
        if policy == Policy::BestEffort {
            let expected = NumaMask::from_nodes(&[0, 1]).ok();
            assert_eq!(
                (merged.hint.affinity, merged.hint.preferred),
                (expected, false)
            );
            assert!(selection.admit);
            assert_eq!(allocated(&selection), vec![Some(vec![0, 1, 2])]);
        }
    }
    assert!(decisions.get(Rule::Case3ca) > 0);
}

/// A Guaranteed pod of `n` containers asking 1 CPU and 16Mi of memory each, QoS class not given.
fn wide(n: usize) -> Pod {
    let list = serde_json::json!({"cpu": "1", "memory": "16Mi"});
    let containers: Vec<serde_json::Value> = (0..n)
        .map(|i| serde_json::json!({"name": format!("c-{i}"), "resources": {"requests": list, "limits": list}}))
        .collect();
    crate::memorymanager::testing::pod(serde_json::json!({
        "metadata": {"uid": "wide", "name": "wide", "namespace": "ns"},
        "spec": {"containers": containers}
    }))
}

/// Bug (#23): every container's hints computed the pod's QoS class again, reading every
/// container each time, so a pod's selection cost the square of its size.
#[test]
fn the_qos_class_is_computed_once_per_pod_not_once_per_container() {
    let state = two_nodes([2 * GI, 2 * GI]);
    for n in [1, 10, 100] {
        let pod = wide(n);
        requests::QOS_COMPUTED.with(|c| c.set(0));
        let selection = with_topology(Policy::SingleNumaNode, Scope::Container, |topology| {
            select(&state, &pod, topology).unwrap()
        });
        assert!(selection.admit, "{n} containers: {:?}", selection.message);
        assert_eq!(allocated(&selection).len(), n);
        assert_eq!(
            requests::QOS_COMPUTED.with(std::cell::Cell::get),
            1,
            "{n} containers"
        );
    }
}

/// The Memory Manager's hints reach the merge as the lists the merge makes of them as its only
/// provider: no hints at all, none for any resource, a resource without a hint, hints.
#[test]
fn the_hints_as_lists_are_the_merges_own_lists_of_one_provider() {
    let on = |nodes: &[usize], preferred| TopologyHint {
        affinity: Some(NumaMask::from_nodes(nodes).unwrap()),
        preferred,
    };
    let some: BTreeMap<String, Vec<TopologyHint>> = BTreeMap::from([
        ("hugepages-2Mi".to_owned(), vec![]),
        (
            "memory".to_owned(),
            vec![on(&[0], true), on(&[0, 1], false)],
        ),
    ]);
    for hints in [None, Some(BTreeMap::new()), Some(some)] {
        let provider: crate::topologymanager::ProviderHints = hints
            .clone()
            .map(|h| h.into_iter().map(|(k, v)| (k, Some(v))).collect());
        let expected = merge::provider_lists(&[provider]);
        let lists: Vec<Vec<TopologyHint>> =
            hint_lists(&hints).into_iter().map(<[_]>::to_vec).collect();
        assert_eq!(lists, expected, "{hints:?}");
    }
}
