use std::{fs, time::Duration};

use super::*;
use crate::{
    admission::verify::{Check, Mode, Verdict},
    host::NumaNode,
    kubelet::cgroup_path::classify,
    sysfs::fake,
};

const UID: &str = "1d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";
const MI2: u64 = 2 << 20;

/// A cgroup v2 host with pod `UID`'s cgroup charged with `charged` bytes of 2 MiB pages, a store
/// holding a 4 MiB reservation for it until `t0 + 30 s`, and a releaser that knows the pod.
fn setup(charged: u64) -> (tempfile::TempDir, tempfile::TempDir, Releaser, String) {
    let rel = format!("/kubepods/pod{UID}");
    let dir = format!("/sys/fs/cgroup/unified{rel}");
    let (host_dir, host) = fake::tree(&[
        ("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n"),
        (
            &format!("{dir}/hugetlb.2MB.current"),
            &format!("{charged}\n"),
        ),
        (
            &format!("{dir}/hugetlb.2MB.rsvd.current"),
            &format!("{charged}\n"),
        ),
        (
            &format!("{dir}/hugetlb.2MB.numa_stat"),
            &format!("total={charged} N0={charged}\n"),
        ),
    ]);
    let state = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(state.path(), Duration::from_secs(30)).expect("store");
    let check = Check {
        resource: "hugepages-2Mi".to_owned(),
        page_size: PageSize(MI2),
        numa_nodes: vec![NumaNode(0)],
        requested_bytes: 2 * MI2,
        available_bytes: 8 * MI2,
        free_bytes: 8 * MI2,
        unreserved_bytes: 8 * MI2,
        reserved_by_agent_bytes: 0,
        ok: true,
        unverified: None,
    };
    let verdict = Verdict {
        allowed: true,
        reason: None,
        message: None,
        numa_nodes: vec![NumaNode(0)],
        mode: Mode::Kep,
        checks: vec![check],
        reservation: None,
    };
    let (_, _, snapshot) = store.reserve(&verdict, UID, "batch", "job", t0());
    snapshot.write().expect("saved");
    let pods = PodCgroups::scan(&host).expect("scan");
    let releaser = Releaser::new(host, pods, Arc::new(Mutex::new(store)));
    (host_dir, state, releaser, rel)
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn reasons(ended: &Ended) -> Vec<Released> {
    ended.iter().map(|(_, why)| *why).collect()
}

fn saved(state: &tempfile::TempDir) -> String {
    fs::read_to_string(state.path().join("reservations.json")).expect("the file")
}

#[test]
fn a_pod_charged_with_its_reserved_bytes_ends_its_reservation_and_the_file_follows() {
    let (_h, state, releaser, _) = setup(2 * MI2);
    assert!(saved(&state).contains(UID));
    assert_eq!(
        reasons(&releaser.release_faulted(t0())),
        [Released::Faulted]
    );
    assert!(!saved(&state).contains(UID), "{}", saved(&state));
}

#[test]
fn a_pod_charged_with_less_keeps_it_until_it_expires() {
    let (_h, _state, releaser, _) = setup(MI2);
    assert!(releaser.release_faulted(t0()).is_empty());
    let later = t0() + Duration::from_secs(31);
    assert_eq!(
        reasons(&releaser.release_faulted(later)),
        [Released::Expired]
    );
}

#[test]
fn a_pod_whose_cgroup_goes_ends_its_reservation_by_event_or_by_rescan() {
    let (_h, _state, mut releaser, rel) = setup(0);
    let owner = classify(&rel);
    assert_eq!(reasons(&releaser.on_rmdir(&owner)), [Released::PodRemoved]);

    let (_h, _state, mut releaser, _) = setup(0);
    let (_empty_dir, empty) =
        fake::tree(&[("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n")]);
    let none = PodCgroups::scan(&empty).expect("scan");
    assert_eq!(
        reasons(&releaser.replace_pods(none)),
        [Released::PodRemoved]
    );
}
