use std::time::{Duration, SystemTime};

use super::*;
use crate::{
    admission::{
        reservations::Reservation,
        verify::{Gate, Mode},
    },
    api::watch::{NodeState, SizeState, SystemSize},
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
    }
}

fn need(pages: u64) -> Hugepages {
    Hugepages::from([(PageSize(MI2), pages * MI2)])
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
    judge(state, &need(pages), POD, SystemTime::now())
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
    assert_eq!(judged(&kubelet, 1), None, "the kubelet's hints select");
    let mut polled = state([10, 6]);
    polled.source = Source::Sysfs;
    assert_eq!(judged(&polled, 1), None, "a map as old as the reconcile");
    let mut stale = state([10, 6]);
    stale.nodes[1].sizes[0].stale = true;
    assert_eq!(judged(&stale, 1), None, "a pool the pod needs is stale");
    let other = Hugepages::from([(PageSize(1 << 30), 1 << 30)]);
    assert!(
        matches!(
            judge(&stale, &other, POD, SystemTime::now()),
            Some(Judged::Misfit(_))
        ),
        "a stale pool the pod does not need does not matter (no 1 GiB pages: misfit)"
    );
}

#[tokio::test]
async fn an_entry_is_fresh_within_the_bound_stale_after_it_or_once_cut_and_moved_is_new() {
    let table = Table::new(Duration::from_millis(50));
    let addr: SocketAddr = "127.0.0.2:9820".parse().expect("addr");
    assert!(table.fresh("n", addr).is_none());
    table.put("n", addr, "e1", 7, state([1, 1]));
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
    assert_eq!(table.standing(), Standing { fresh: 0, stale: 1 });
    table.heard("n", addr);
    assert!(table.fresh("n", addr).is_some(), "a heartbeat");
    table.cut("n");
    assert!(table.fresh("n", addr).is_none(), "cut");
    table.forget("n");
    assert_eq!(table.standing(), Standing::default());
}
