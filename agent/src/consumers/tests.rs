use std::time::Duration;

use super::*;
use crate::{
    host::{GlobalPool, NodePool},
    sysfs::fake,
};

const UID: &str = "1d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";
const ID: &str = "8c5e1fbd03a4c1e2b3f4a5b6c7d8e9f00112233445566778899aabbccddeeff0";
const MI2: u64 = 2 << 20;

fn pools(total: u64, free: u64) -> HugepageTable {
    HugepageTable {
        nodes: vec![NodePool {
            node: NumaNode(0),
            size: PageSize(MI2),
            total,
            free,
            surplus: 0,
        }],
        global: vec![GlobalPool {
            size: PageSize(MI2),
            total,
            free,
            reserved: 0,
            surplus: 0,
        }],
    }
}

fn usage(dir: &str, bytes: u64) -> Vec<(String, String)> {
    vec![
        (format!("{dir}/hugetlb.2MB.current"), format!("{bytes}\n")),
        (
            format!("{dir}/hugetlb.2MB.rsvd.current"),
            format!("{bytes}\n"),
        ),
        (
            format!("{dir}/hugetlb.2MB.numa_stat"),
            format!("total={bytes} N0={bytes}\n"),
        ),
    ]
}

#[test]
fn pods_containers_system_services_and_the_rest_are_listed_by_usage() {
    let cg = "/sys/fs/cgroup";
    let pod = format!("{cg}/kubepods/burstable/pod{UID}");
    let mut files = vec![(format!("{cg}/cgroup.controllers"), "hugetlb\n".to_owned())];
    files.extend(usage(&format!("{cg}/kubepods"), 6 * MI2));
    files.extend(usage(&format!("{cg}/kubepods/burstable"), 6 * MI2));
    files.extend(usage(&pod, 6 * MI2));
    files.extend(usage(&format!("{pod}/{ID}"), 6 * MI2));
    files.extend(usage(&format!("{cg}/system.slice"), 2 * MI2));
    files.extend(usage(&format!("{cg}/user.slice"), 0));
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let (_d, host) = fake::tree(&refs);
    let book = FaultBook::default();
    let container_id = std::fs::metadata(host.path(format!("{pod}/{ID}")))
        .expect("stat")
        .ino();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    for i in 0..3 {
        book.record(container_id, t0 + Duration::from_secs(i));
    }
    // 16 pages in the pool, 4 free: 12 in use, 6 + 2 charged to cgroups, 4 to nobody.
    let list = list(&host, &pools(16, 4), &book).expect("lists");
    let summary: Vec<(Kind, &str, u64)> = list
        .iter()
        .map(|c| (c.kind, c.cgroup.as_str(), c.in_use_bytes / MI2))
        .collect();
    assert_eq!(
        summary,
        [
            (
                Kind::Pod,
                format!("/kubepods/burstable/pod{UID}").as_str(),
                6
            ),
            (
                Kind::Container,
                format!("/kubepods/burstable/pod{UID}/{ID}").as_str(),
                6
            ),
            (Kind::System, "/", 4),
            (Kind::System, "/system.slice", 2),
        ]
    );
    let c = &list[1];
    assert_eq!(
        (c.pod_uid.as_deref(), c.qos, c.container_id.as_deref()),
        (Some(UID), Some(Qos::Burstable), Some(ID))
    );
    assert_eq!(
        (c.faults, c.first_fault, c.last_fault),
        (3, Some(t0), Some(t0 + Duration::from_secs(2)))
    );
    assert_eq!(c.sizes[0].per_node.get(&NumaNode(0)), Some(&(6 * MI2)));
    assert_eq!(
        list[2].sizes[0].per_node.get(&NumaNode(0)),
        Some(&(4 * MI2))
    );
}

#[test]
fn a_forgotten_cgroup_has_no_faults() {
    let book = FaultBook::default();
    book.record(7, SystemTime::now());
    assert_eq!(book.get(7).map(|s| s.count), Some(1));
    book.forget(7);
    assert_eq!(book.get(7), None);
}

#[test]
fn the_fault_book_keeps_only_the_cgroups_a_rescan_still_finds() {
    let book = FaultBook::default();
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    for id in [1, 2, 3] {
        book.record(id, at);
    }
    book.retain(|id| id != 2);
    assert_eq!(book.get(1).map(|s| s.count), Some(1));
    assert_eq!(book.get(2), None, "removed while its rmdir was lost");
    assert_eq!(book.get(3).map(|s| s.count), Some(1));
}
