use super::*;
use crate::memorymanager::testing::{GI, guaranteed, node, state};

fn hint(nodes: &[usize], preferred: bool) -> TopologyHint {
    TopologyHint {
        affinity: Some(NumaMask::from_nodes(nodes).unwrap()),
        preferred,
    }
}

fn both(hints: Vec<TopologyHint>) -> Hints {
    Some(BTreeMap::from([
        ("hugepages-1Gi".to_string(), hints.clone()),
        ("memory".to_string(), hints),
    ]))
}

fn ask(state: &MemoryManagerState, memory: &str, huge: &str) -> Hints {
    let pod = guaranteed(&[("c", memory, huge)]);
    let facts = PodFacts::of(&pod, FeatureGates::default()).unwrap();
    container_hints(state, &pod, &facts, &pod.spec.containers[0]).unwrap()
}

#[test]
fn preferred_is_by_capacity_not_by_what_is_free() {
    // Node 0 could hold 2Gi of 1Gi pages but has 1Gi free: only the pair fits, and it is not
    // preferred, since one node has the capacity.
    let state = state(vec![
        (
            0,
            node(
                &[("memory", 8 * GI, 8 * GI), ("hugepages-1Gi", 2 * GI, GI)],
                &[0],
                0,
            ),
        ),
        (
            1,
            node(
                &[("memory", 8 * GI, 8 * GI), ("hugepages-1Gi", 2 * GI, GI)],
                &[1],
                0,
            ),
        ),
    ]);
    assert_eq!(ask(&state, "1Gi", "2Gi"), both(vec![hint(&[0, 1], false)]));
    assert_eq!(
        ask(&state, "1Gi", "1Gi"),
        both(vec![
            hint(&[0], true),
            hint(&[1], true),
            hint(&[0, 1], false)
        ])
    );
    // Nothing fits: an empty map, not null.
    assert_eq!(ask(&state, "1Gi", "3Gi"), Some(BTreeMap::new()));
}

#[test]
fn groups_may_not_be_split_or_joined() {
    // Nodes 0 and 1 already serve one container together; node 2 serves one alone.
    let state = state(vec![
        (
            0,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 4 * GI, 4 * GI),
                ],
                &[0, 1],
                2,
            ),
        ),
        (
            1,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 4 * GI, 4 * GI),
                ],
                &[0, 1],
                2,
            ),
        ),
        (
            2,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 4 * GI, 4 * GI),
                ],
                &[2],
                2,
            ),
        ),
    ]);
    // Singles 0 and 1 are grouped; pairs with 2 include a node used alone; {0,1} is the group.
    assert_eq!(
        ask(&state, "1Gi", "1Gi"),
        both(vec![hint(&[2], true), hint(&[0, 1], false)])
    );
}

#[test]
fn assigned_blocks_come_back_as_preferred_hints_or_none_at_all() {
    let mut state = state(vec![
        (
            0,
            node(
                &[("memory", 8 * GI, 7 * GI), ("hugepages-1Gi", 2 * GI, GI)],
                &[0],
                2,
            ),
        ),
        (
            1,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 2 * GI, 2 * GI),
                ],
                &[1],
                0,
            ),
        ),
    ]);
    let blocks = vec![
        Block {
            numa_affinity: vec![0],
            resource: "memory".into(),
            size: GI,
        },
        Block {
            numa_affinity: vec![0],
            resource: "hugepages-1Gi".into(),
            size: GI,
        },
    ];
    state
        .entries
        .insert("pod-1".into(), BTreeMap::from([("c".to_string(), blocks)]));
    assert_eq!(ask(&state, "1Gi", "1Gi"), both(vec![hint(&[0], true)]));
    // A request that no longer matches what was assigned: the kubelet gives no hints.
    assert_eq!(ask(&state, "2Gi", "1Gi"), None);
}

#[test]
fn pods_that_are_not_guaranteed_get_no_hints() {
    let state = state(vec![(0, node(&[("memory", 8 * GI, 8 * GI)], &[0], 0))]);
    let mut pod = guaranteed(&[("c", "1Gi", "1Gi")]);
    pod.spec.containers[0].resources.limits.remove("cpu");
    assert_eq!(
        PodFacts::of(&pod, FeatureGates::default())
            .map_err(HintError::from)
            .and_then(|facts| container_hints(&state, &pod, &facts, &pod.spec.containers[0])),
        Ok(None)
    );
    assert_eq!(pod_hints(&state, &pod, FeatureGates::default()), Ok(None));
}

/// One case of the kubelet's hint-generation tests, as data (`testdata/kubelet_cases.json`,
/// transcribed from `pkg/kubelet/cm/memorymanager/policy_static_test.go` and
/// `memory_manager_test.go`; each names its source): a state in the checkpoint's JSON shape
/// (for the manager-level case, the state the policy sees after the manager dropped stale
/// assignments), a `v1.Pod`, the feature gates, and the kubelet's answer.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct KubeletCase {
    name: String,
    state: serde_json::Value,
    pod: serde_json::Value,
    container: Option<String>,
    scope: String,
    #[serde(default)]
    feature_gates: BTreeMap<String, bool>,
    /// The pod lifecycle operation the kubelet hints for (absent: an admission, "Add").
    #[serde(default)]
    operation: Option<String>,
    expected: Hints,
}

#[test]
fn every_kubelet_hint_generation_case() {
    let cases: Vec<KubeletCase> =
        serde_json::from_str(include_str!("testdata/kubelet_cases.json")).unwrap();
    assert_eq!(cases.len(), 24);
    let mut checked = 0;
    for case in cases {
        // The agent hints for admissions only. The kubelet's answer for a resize or an unknown
        // operation is "no hints" whatever the pod; those cases test its lifecycle plumbing.
        if case.operation.as_deref().is_some_and(|op| op != "Add") {
            assert_eq!(case.expected, None, "{}", case.name);
            continue;
        }
        let bytes = case.state.to_string();
        let state = crate::memorymanager::checkpoint::parse(
            std::path::Path::new(&case.name),
            bytes.as_bytes(),
            crate::memorymanager::checkpoint::Verification::UnlessAbsent,
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let pod: Pod = serde_json::from_value(case.pod).unwrap();
        let gate = |name: &str| case.feature_gates.get(name).copied().unwrap_or(false);
        let gates = FeatureGates {
            pod_level_resources: gate("PodLevelResources"),
            pod_level_resource_managers: gate("PodLevelResourceManagers"),
        };
        let got = match (case.scope.as_str(), case.container) {
            ("container", Some(name)) => {
                let container = find_container(&pod, &name).unwrap();
                PodFacts::of(&pod, gates)
                    .map_err(HintError::from)
                    .and_then(|facts| container_hints(&state, &pod, &facts, container))
            }
            _ => pod_hints(&state, &pod, gates),
        };
        assert_eq!(got, Ok(case.expected), "{}", case.name);
        checked += 1;
    }
    assert_eq!(checked, 20);
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodRequestsCase {
    name: String,
    containers: serde_json::Value,
    init_containers: serde_json::Value,
    expected: BTreeMap<String, u64>,
}

#[test]
fn every_kubelet_pod_requests_case() {
    let cases: Vec<PodRequestsCase> =
        serde_json::from_str(include_str!("testdata/kubelet_pod_requests.json")).unwrap();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": case.containers, "initContainers": case.init_containers}
        }))
        .unwrap();
        let got = requests::pod_requests(&pod, FeatureGates::default()).unwrap();
        assert_eq!(got, case.expected, "{}", case.name);
    }
}

#[test]
fn pod_level_resources_count_only_behind_the_kubelets_gates() {
    let state = state(vec![
        (
            0,
            node(
                &[
                    ("memory", 8 * GI, 8 * GI),
                    ("hugepages-1Gi", 2 * GI, 2 * GI),
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
                    ("hugepages-1Gi", 2 * GI, 2 * GI),
                ],
                &[1],
                0,
            ),
        ),
    ]);
    let list = serde_json::json!({"cpu": "2", "memory": "2Gi", "hugepages-1Gi": "2Gi"});
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "p"},
        "spec": {"resources": {"requests": list, "limits": list},
                 "containers": [{"name": "a"}, {"name": "b"}]}
    }))
    .unwrap();
    // Without the gates the containers ask nothing: BestEffort, no hints.
    assert_eq!(pod_hints(&state, &pod, FeatureGates::default()), Ok(None));
    // PodLevelResources alone makes the pod Guaranteed, but the Memory Manager leaves pods with
    // pod-level resources alone unless PodLevelResourceManagers is on too.
    let qos_only = FeatureGates {
        pod_level_resources: true,
        pod_level_resource_managers: false,
    };
    assert_eq!(pod_hints(&state, &pod, qos_only), Ok(None));
    // Both gates: the pod-level requests are placed.
    let gates = FeatureGates {
        pod_level_resources: true,
        pod_level_resource_managers: true,
    };
    assert_eq!(
        pod_hints(&state, &pod, gates),
        Ok(both(vec![
            hint(&[0], true),
            hint(&[1], true),
            hint(&[0, 1], false)
        ]))
    );
}

/// Bug (#23): the exclusive requests of a pod with pod-level resources were summed with `+`,
/// which wraps in a release build (a panic in a debug one). A total beyond 64 bits of bytes is
/// the kubelet's unreadable request, naming the resource.
#[test]
fn exclusive_requests_that_overflow_64_bits_name_the_resource() {
    let state = state(vec![(0, node(&[("memory", 8 * GI, 8 * GI)], &[0], 0))]);
    let pod_level = serde_json::json!({"cpu": "8", "memory": "8Gi"});
    let own = serde_json::json!({"cpu": "1", "memory": "8000Pi"});
    let c = |name: &str| serde_json::json!({"name": name, "resources": {"requests": own, "limits": own}});
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "p"},
        "spec": {"resources": {"requests": pod_level, "limits": pod_level},
                 "containers": [c("a"), c("b"), c("c")]}
    }))
    .unwrap();
    let gates = FeatureGates {
        pod_level_resources: true,
        pod_level_resource_managers: true,
    };
    match pod_hints(&state, &pod, gates) {
        Err(HintError::Request(e)) => {
            assert_eq!(e.field, "spec.containers[2].resources.requests");
            assert_eq!(
                e.detail,
                "the pod's total of memory overflows 64 bits of bytes"
            );
        }
        other => panic!("expected an error naming memory, got {other:?}"),
    }
}
