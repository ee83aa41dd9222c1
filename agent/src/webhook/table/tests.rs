use std::time::{Duration, SystemTime};

use super::*;
use crate::{
    admission::{
        reservations::Reservation,
        verify::{Gate, Mode},
    },
    api::watch::{NodeState, SizeState, SystemSize},
    memorymanager::{
        hints::Scope,
        selection::TopologyConfig,
        streamed::KubeletSelection,
        testing::{GI, node, state as mm_state},
    },
    topologymanager::{NumaInfo, Policy, PolicyOptions},
    webhook::pod,
};

const MI2: u64 = 2 << 20;
const POD: &str = "pod-a";

/// Two NUMA nodes of 2 MiB pages with `free` free on each, faults followed, node-wide selection.
fn state(free: [u64; 2]) -> WatchState {
    WatchState {
        source: Source::EbpfSysfs,
        nodes: free
            .iter()
            .enumerate()
            .map(|(node, &free)| NodeState {
                node: node as u32,
                sizes: vec![SizeState {
                    page_size_bytes: MI2,
                    total: 512,
                    free,
                    reserved_by_agent: 0,
                    unreserved_bytes: free * MI2,
                    stale: false,
                }],
            })
            .collect(),
        system: vec![SystemSize {
            page_size_bytes: MI2,
            reserved: 0,
        }],
        reservations: Vec::new(),
        gate: Gate::On,
        mode: Mode::Kep,
        numa_selection: NumaSelection::NodeWide,
        pressure_refusal: None,
        selection_inputs: 0,
        kubelet_selection: None,
    }
}

/// The scheduler's pod `POD`, Guaranteed, one container asking for `resources` (requests and
/// limits).
fn request(resources: serde_json::Value) -> PodRequest {
    let pod = serde_json::json!({
        "metadata": {"uid": POD, "name": "p", "namespace": "telco"},
        "spec": {"containers": [
            {"name": "app", "resources": {"requests": resources, "limits": resources}}
        ]},
        "status": {"qosClass": "Guaranteed"}
    });
    let raw = serde_json::value::to_raw_value(&pod).expect("json");
    pod::read(Some(&raw)).expect("a pod")
}

/// A Guaranteed pod asking for `pages` 2 MiB pages.
fn need(pages: u64) -> PodRequest {
    let bytes = pages * MI2;
    request(serde_json::json!({"cpu": "1", "memory": "1Gi", "hugepages-2Mi": bytes.to_string()}))
}

fn reservation(pod: &str, nodes: &[u32], pages: u64, expires_in: Duration) -> Reservation {
    let now = SystemTime::now();
    Reservation {
        id: format!("r-{pod}"),
        pod_uid: pod.to_owned(),
        namespace: "telco".to_owned(),
        name: pod.to_owned(),
        numa_nodes: nodes.iter().map(|&n| NumaNode(n)).collect(),
        bytes: [(PageSize(MI2), pages * MI2)].into(),
        created_at: now,
        expires_at: now + expires_in,
    }
}

fn judged(state: &WatchState, pages: u64) -> Option<Judged> {
    judge(
        &Streamed::new(state.clone()),
        &need(pages),
        SystemTime::now(),
    )
}

#[test]
fn a_pod_that_fits_on_every_node_together_fits_and_one_that_does_not_gets_the_keps_message() {
    let s = state([10, 6]);
    let Some(Judged::Fits(reply)) = judged(&s, 16) else {
        panic!("16 of 16 free pages fit: {:?}", judged(&s, 16));
    };
    assert_eq!(reply.numa_nodes, vec![0, 1]);
    assert_eq!(reply.checks[0].available_bytes, 16 * MI2);
    assert_eq!(
        judged(&s, 17),
        Some(Judged::Misfit(
            "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 34Mi, available 32Mi"
                .to_owned()
        ))
    );
}

#[test]
fn other_pods_reservations_are_subtracted_once_and_the_pods_own_and_expired_ones_not() {
    let mut s = state([10, 6]);
    // One reservation of 4 pages that may draw from both nodes counts 4, not 8.
    s.reservations = vec![
        reservation("pod-b", &[0, 1], 4, Duration::from_secs(60)),
        reservation(POD, &[0], 5, Duration::from_secs(60)),
        reservation("pod-c", &[1], 3, Duration::ZERO),
    ];
    assert!(matches!(judged(&s, 12), Some(Judged::Fits(_))));
    let Some(Judged::Misfit(message)) = judged(&s, 13) else {
        panic!("13 of 12 unreserved pages");
    };
    assert!(
        message.ends_with("requested 26Mi, available 24Mi"),
        "{message}"
    );
}

#[test]
fn strict_mode_subtracts_the_system_wide_reservation_and_the_gate_off_admits_unread() {
    let mut s = state([10, 6]);
    s.mode = Mode::Strict;
    s.system[0].reserved = 3;
    assert!(matches!(judged(&s, 13), Some(Judged::Fits(_))));
    assert!(matches!(judged(&s, 14), Some(Judged::Misfit(_))));
    s.gate = Gate::Off;
    assert!(matches!(judged(&s, 1000), Some(Judged::Fits(_))));
}

#[test]
fn pressure_refuses_with_the_agents_message() {
    let mut s = state([10, 6]);
    s.pressure_refusal = Some("node under memory contention pressure".to_owned());
    assert_eq!(
        judged(&s, 1),
        Some(Judged::Misfit(
            "node under memory contention pressure".to_owned()
        ))
    );
}

#[test]
fn what_the_state_alone_cannot_decide_is_left_to_the_agent() {
    let mut kubelet = state([10, 6]);
    kubelet.numa_selection = NumaSelection::Kubelet;
    assert_eq!(
        judged(&kubelet, 1),
        None,
        "the kubelet's hints select, and its inputs were not streamed"
    );
    let mut polled = state([10, 6]);
    polled.source = Source::Sysfs;
    assert_eq!(judged(&polled, 1), None, "a map as old as the reconcile");
    let mut stale = state([10, 6]);
    stale.nodes[1].sizes[0].stale = true;
    assert_eq!(judged(&stale, 1), None, "a pool the pod needs is stale");
    let other = request(serde_json::json!({"cpu": "1", "memory": "1Gi", "hugepages-1Gi": "1Gi"}));
    assert!(
        matches!(
            judge(&Streamed::new(stale), &other, SystemTime::now()),
            Some(Judged::Misfit(_))
        ),
        "a stale pool the pod does not need does not matter (no 1 GiB pages: misfit)"
    );
}

/// `state` under the Memory Manager's `Static` policy with `single-numa-node`, container scope,
/// and a Memory Manager that believes `mm_free` 2 MiB pages free on each node.
fn pinned(mut state: WatchState, mm_free: [u64; 2]) -> WatchState {
    let distances = [(0, vec![10, 21]), (1, vec![21, 10])].into();
    let config = TopologyConfig {
        info: Arc::new(NumaInfo::new(vec![0, 1], distances).expect("a machine")),
        policy: Policy::SingleNumaNode,
        options: PolicyOptions::default(),
        scope: Scope::Container,
        gates: Default::default(),
    };
    let mm = mm_state(
        mm_free
            .iter()
            .enumerate()
            .map(|(n, &free)| {
                let resources = [
                    ("memory", 64 * GI, 64 * GI),
                    ("hugepages-2Mi", GI, free * MI2),
                ];
                (n, node(&resources, &[n], 0))
            })
            .collect(),
    );
    state.numa_selection = NumaSelection::Kubelet;
    state.kubelet_selection = Some(Arc::new(KubeletSelection::of(&config, &mm)));
    state
}

#[test]
fn under_the_static_policy_the_nodes_the_kubelet_would_pick_are_verified_from_the_stream() {
    // The Memory Manager believes 10 pages free on node 0 and 6 on node 1; the kernel has 10 and 6.
    let s = pinned(state([10, 6]), [10, 6]);
    let Some(Judged::Fits(reply)) = judged(&s, 8) else {
        panic!("8 pages fit on node 0 alone: {:?}", judged(&s, 8));
    };
    assert_eq!(reply.numa_nodes, vec![0], "single-numa-node picks node 0");
    assert_eq!(
        reply.checks[0].available_bytes,
        10 * MI2,
        "node 0's pages only"
    );
    // 12 pages fit on no single node: the kubelet refuses before any hugepage is counted.
    assert_eq!(
        judged(&s, 12),
        Some(Judged::Misfit(
            "Resources cannot be allocated with Topology locality".to_owned()
        ))
    );
    // KEP-5759's case: the Memory Manager still believes node 0 has 10 pages; another process
    // took 6 of them, which the stream shows.
    let taken = pinned(state([4, 6]), [10, 6]);
    assert_eq!(
        judged(&taken, 8),
        Some(Judged::Misfit(
            "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 16Mi, available 8Mi"
                .to_owned()
        ))
    );
}

#[test]
fn a_streamed_selection_that_describes_no_machine_is_left_to_the_agent() {
    let mut s = pinned(state([10, 6]), [10, 6]);
    if let Some(selection) = s.kubelet_selection.as_mut() {
        Arc::make_mut(selection).numa_distances.clear();
    }
    assert_eq!(judged(&s, 1), None);
}

#[tokio::test]
async fn an_entry_is_fresh_within_the_bound_stale_after_it_or_once_cut_and_moved_is_new() {
    let table = Table::new(Duration::from_millis(50));
    let addr: SocketAddr = "127.0.0.2:9820".parse().expect("addr");
    assert!(table.fresh("n", addr).is_none());
    table.put("n", addr, ("e1", 7), Some(skew::OURS), state([1, 1]));
    assert!(table.fresh("n", addr).is_some());
    assert_eq!(
        table.resume("n", addr),
        Resume {
            epoch: Some("e1".to_owned()),
            generation: 7
        }
    );
    let moved: SocketAddr = "127.0.0.3:9820".parse().expect("addr");
    assert!(table.fresh("n", moved).is_none(), "another address");
    assert_eq!(table.resume("n", moved), Resume::default());
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(table.fresh("n", addr).is_none(), "not heard within 50 ms");
    assert_eq!(
        table.standing(),
        Standing {
            fresh: 0,
            stale: 1,
            outside_skew: 0
        }
    );
    table.heard("n", addr, Some(skew::OURS));
    assert!(table.fresh("n", addr).is_some(), "a heartbeat");
    table.cut("n");
    assert!(table.fresh("n", addr).is_none(), "cut");
    table.forget("n");
    assert_eq!(table.standing(), Standing::default());
}

#[test]
fn agents_of_another_minor_version_or_of_none_are_counted_and_named_until_they_change() {
    let table = Table::new(Duration::from_secs(60));
    let addr = |i: u8| -> SocketAddr { SocketAddr::from(([127, 0, 0, i], 9820)) };
    table.put("a", addr(1), ("e", 1), Some(skew::OURS), state([1, 1]));
    table.put("c", addr(3), ("e", 1), Some("99.0.0"), state([1, 1]));
    table.put("b", addr(2), ("e", 1), None, state([1, 1]));
    table.put(
        "d",
        addr(4),
        ("e", 1),
        Some(&"9".repeat(4 << 10)),
        state([1, 1]),
    );
    assert_eq!(table.standing().outside_skew, 3);
    assert_eq!(
        table.skewed(10),
        (
            3,
            vec![
                Skewed {
                    node: "b".into(),
                    version: None
                },
                Skewed {
                    node: "c".into(),
                    version: Some("99.0.0".into())
                },
                Skewed {
                    node: "d".into(),
                    version: Some(skew::UNREADABLE.into())
                },
            ]
        )
    );
    assert_eq!(table.skewed(1).1.len(), 1, "at most the number asked");
    assert_eq!(table.skewed(1).0, 3, "counted in full");
    table.forget("d");
    // The agent on c is upgraded: its next heartbeat names the webhook's version.
    table.heard("c", addr(3), Some(skew::OURS));
    assert_eq!(table.standing().outside_skew, 1);
    table.forget("b");
    assert_eq!(table.standing().outside_skew, 0);
    assert_eq!(table.skewed(10), (0, vec![]));
}
