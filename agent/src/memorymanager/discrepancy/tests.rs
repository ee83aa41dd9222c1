use std::{collections::BTreeMap, time::SystemTime};

use super::*;
use crate::{
    consumers::{Consumer, Kind},
    host::NodeInfo,
    kubelet::cgroup_path::Qos,
    memorymanager::testing::{GI, node, state},
    numa::map::{NodeView, SizeView},
    sysfs::hugetlb_cgroup::SizeUsage,
};

const MI2: u64 = 2 << 20;

fn snapshot(free_pages: u64) -> Snapshot {
    Snapshot {
        generation: 1,
        updated_at: SystemTime::now(),
        source: crate::numa::map::Source::Sysfs,
        nodes: vec![NodeView {
            info: NodeInfo {
                node: NumaNode(0),
                cpus: vec![0],
                distances: vec![10],
            },
            sizes: vec![SizeView {
                page_size_bytes: MI2,
                total: 8192,
                free: free_pages,
                surplus: 0,
                stale: None,
            }],
        }],
        global: Vec::new(),
        fault_to_map: None,
    }
}

fn holder(kind: Kind, uid: Option<&str>, cgroup: &str, bytes: u64) -> Consumer {
    Consumer {
        kind,
        pod_uid: uid.map(str::to_string),
        qos: uid.map(|_| Qos::Burstable),
        container_id: None,
        cgroup: cgroup.into(),
        in_use_bytes: bytes,
        sizes: vec![SizeUsage {
            page_size_bytes: MI2,
            in_use_bytes: bytes,
            reserved_bytes: None,
            per_node: BTreeMap::from([(NumaNode(0), bytes)]),
        }],
        faults: 0,
        first_fault: None,
        last_fault: None,
    }
}

/// kubernetes/kubernetes#134395: the checkpoint says 15.2 GB free, the kernel 3.2 GB.
#[test]
fn the_issue_134395_node_shows_twelve_gigabytes_the_kubelet_cannot_see() {
    let checkpoint_free = 15_200_000_000 / MI2 * MI2;
    let os_free_pages = 3_200_000_000 / MI2;
    let state = state(vec![(
        0,
        node(&[("hugepages-2Mi", 16 * GI, checkpoint_free)], &[0], 1),
    )]);
    let burstable = holder(
        Kind::Pod,
        Some("burstable-uid"),
        "/kubepods/burstable/podx",
        8 * GI,
    );
    let container = holder(
        Kind::Container,
        Some("burstable-uid"),
        "/kubepods/burstable/podx/c",
        8 * GI,
    );
    let system = holder(Kind::System, None, "/system.slice", 4 * GI);
    // A top-level cgroup above the pod counts the pod's pages too: only its own share is named.
    let above = holder(Kind::System, None, "/kubepods", 8 * GI);
    let consumers = [burstable, container, system, above];
    let found = compute(&state, &snapshot(os_free_pages), Some(&consumers), None);
    assert_eq!(found.len(), 1);
    let d = &found[0];
    assert_eq!(d.resource, "hugepages-2Mi");
    assert_eq!(d.memory_manager_free_bytes, checkpoint_free);
    assert_eq!(d.os_free_bytes, os_free_pages * MI2);
    assert_eq!(
        d.discrepancy_bytes,
        i128::from(checkpoint_free) - i128::from(os_free_pages * MI2)
    );
    assert!(
        d.discrepancy_bytes > 11_900_000_000,
        "{}",
        d.discrepancy_bytes
    );
    // The pod is named once (not again through its container), largest first.
    let held: Vec<(&str, u64)> = d
        .untracked
        .iter()
        .map(|h| (h.cgroup.as_str(), h.bytes))
        .collect();
    assert_eq!(
        held,
        vec![
            ("/kubepods/burstable/podx", 8 * GI),
            ("/system.slice", 4 * GI)
        ]
    );
    assert!(
        d.explanation.contains("pod burstable-uid (Burstable) 8Gi"),
        "{}",
        d.explanation
    );
    assert!(
        d.explanation.contains("/system.slice 4Gi"),
        "{}",
        d.explanation
    );
}

#[test]
fn tracked_pods_are_not_blamed_and_agreement_says_so() {
    let mut state = state(vec![(
        0,
        node(&[("hugepages-2Mi", 16 * GI, 16 * GI)], &[0], 1),
    )]);
    state
        .entries
        .insert("guaranteed-uid".into(), BTreeMap::new());
    let tracked = holder(Kind::Pod, Some("guaranteed-uid"), "/kubepods/podg", 2 * GI);
    let found = compute(&state, &snapshot(7168), Some(&[tracked]), None);
    assert_eq!(found[0].discrepancy_bytes, i128::from(2 * GI));
    assert!(found[0].untracked.is_empty());
    let agree = compute(&state, &snapshot(8192), None, None);
    assert_eq!(agree[0].discrepancy_bytes, 0);
    assert_eq!(
        agree[0].explanation,
        "the Memory Manager and the kernel agree"
    );
}
