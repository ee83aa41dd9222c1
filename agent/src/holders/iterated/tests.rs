use hugepage_agent_common::tasks::{Held, NAME_BYTES, flags, kind};

use super::*;
use crate::sysfs::fake;

const MIB2: u64 = 2 << 20;
/// The host's hugetlbfs mount, as the kernel writes its device (`0:45`).
const MOUNT_DEV: u32 = 45;
/// A device of the kernel's own hugetlbfs mount (memfds, segments, anonymous mappings).
const KERNEL_DEV: u32 = 16;

fn held(kind: u32, tgid: u32, dev: u32, ino: u64, name: &str, flags: u32) -> Held {
    let mut bytes = [0; NAME_BYTES];
    bytes[..name.len()].copy_from_slice(name.as_bytes());
    Held {
        kind,
        tgid,
        fd: 0,
        dev,
        flags,
        ipc_ns: 0,
        ino,
        start: 0x7f00_0000_0000 + ino * 0x20_0000,
        end: 0x7f00_0020_0000 + ino * 0x20_0000,
        page_size: MIB2,
        held_bytes: 2 * MIB2,
        name: bytes,
    }
}

fn known() -> KnownDevs {
    KnownDevs::from([(Dev::from_kernel(MOUNT_DEV), Some(MIB2))])
}

#[test]
fn records_become_each_process_s_mappings_and_descriptors_named_as_proc_names_them() {
    let mut segment = held(
        kind::MAPPING,
        7,
        KERNEL_DEV,
        3,
        "SYSV00001234",
        flags::SHARED | flags::SYSV,
    );
    segment.ipc_ns = 4_026_531_839;
    let mut fd = held(kind::DESCRIPTOR, 7, KERNEL_DEV, 9, "memfd:pool", 0);
    fd.fd = 5;
    let records = [
        held(kind::MAPPING, 7, MOUNT_DEV, 1, "rtemap_0", flags::SHARED),
        // The same mapping told again for a thread of the process.
        held(kind::MAPPING, 7, MOUNT_DEV, 1, "rtemap_0", flags::SHARED),
        segment,
        held(kind::MAPPING, 7, KERNEL_DEV, 4, "anon_hugepage", 0),
        fd,
        fd,
        held(
            kind::MAPPING,
            8,
            MOUNT_DEV,
            2,
            "gone",
            flags::SHARED | flags::UNLINKED,
        ),
        // A tenant's file named as the kernel names its own, in a mount of the host.
        held(kind::MAPPING, 8, MOUNT_DEV, 6, "memfd:fake", flags::SHARED),
        held(99, 8, MOUNT_DEV, 7, "no kind", 0),
    ];
    let it = gather(&records, false, &known(), MIB2);
    let p = &it.processes[&7];
    let paths: Vec<&str> = p.vmas.iter().map(|v| v.map.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "…/rtemap_0",
            "/SYSV00001234 (deleted)",
            "/anon_hugepage (deleted)"
        ],
        "one mapping per address range, threads told once"
    );
    assert_eq!(
        p.vmas[0].map.dev,
        Dev {
            major: 0,
            minor: 45
        }
    );
    assert!(p.vmas[0].map.shared && !p.vmas[2].map.shared);
    assert_eq!(p.vmas[0].file_held, Some(2 * MIB2));
    assert!(p.vmas[0].pages.is_empty(), "no page is placed on a node");
    assert_eq!(p.vmas[1].map.inode, 3, "a segment's inode is its shmid");
    assert_eq!(p.ipc_ns.as_deref(), Some("ipc:[4026531839]"));
    assert_eq!(p.fds.len(), 1);
    assert_eq!(
        (p.fds[0].fd, p.fds[0].path.as_str()),
        (5, "/memfd:pool (deleted)")
    );
    let q = &it.processes[&8];
    let paths: Vec<&str> = q.vmas.iter().map(|v| v.map.path.as_str()).collect();
    assert_eq!(paths, ["…/gone (deleted)", "…/memfd:fake"]);
}

#[test]
fn private_pages_come_from_status_only_where_it_tells_them_alone() {
    let (_dir, host) = fake::tree(&[
        (
            "/proc/7/status",
            "Name:\tjava\nHugetlbPages:\t    6144 kB\n",
        ),
        ("/proc/8/status", "Name:\tdb\nHugetlbPages:\t    8192 kB\n"),
    ]);
    let records = [
        held(kind::MAPPING, 7, KERNEL_DEV, 1, "anon_hugepage", 0),
        held(kind::MAPPING, 7, KERNEL_DEV, 2, "anon_hugepage", 0),
        held(kind::MAPPING, 8, KERNEL_DEV, 3, "anon_hugepage", 0),
        held(kind::MAPPING, 8, MOUNT_DEV, 4, "rtemap_0", 0),
        held(kind::MAPPING, 9, MOUNT_DEV, 5, "rtemap_1", flags::SHARED),
    ];
    let it = gather(&records, false, &known(), MIB2);
    let (java, unknown) = it.process(&host, 7).expect("pid 7");
    assert!(!unknown);
    let anon: u64 = java.vmas.iter().map(|v| v.anon_pages).sum();
    assert_eq!(anon, 3, "6144 kB of 2 MiB pages");
    let (_, unknown) = it.process(&host, 8).expect("pid 8");
    assert!(
        unknown,
        "a private mapping of a file: its own pages are not told"
    );
    let (_, unknown) = it.process(&host, 9).expect("pid 9");
    assert!(!unknown, "shared mappings alone have no private pages");
    assert!(it.process(&host, 10).is_none());
}
