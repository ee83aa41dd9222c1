//! The walk over fake host trees: which holder each thing found becomes, who uses it, and the
//! accounts. (The real kernel's files, segments and memfds are in `tests/holders.rs`.)

use std::{fs, os::unix::fs::MetadataExt};

use super::*;
use crate::{
    host::{GlobalPool, PageSize},
    sysfs::fake,
};

const MIB2: u64 = 2 << 20;

fn pools(total: u64, free: u64) -> HugepageTable {
    HugepageTable {
        nodes: Vec::new(),
        global: vec![GlobalPool {
            size: PageSize(MIB2),
            total,
            free,
            reserved: 0,
            surplus: 0,
        }],
    }
}

const SHM_HEADER: &str = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n";

/// A host with one hugetlbfs mount at `mount_point` holding `rtemap_0`, `empty` and `sub/f`
/// (their blocks are the fake file system's: 8 KiB and 4 KiB stand for the pages they hold), a
/// second one at `/elsewhere` that is not where it says, and `/proc/sysvipc/shm` as given. The
/// mount's device is the temporary directory's, as a real mount's is its own.
fn host(shm: &str, mount_point: &str) -> (tempfile::TempDir, HostFs, u64) {
    let (dir, host) = fake::tree(&[
        ("/proc/sysvipc/shm", shm),
        (&format!("{mount_point}/rtemap_0"), &"x".repeat(8192)),
        (&format!("{mount_point}/empty"), ""),
        (&format!("{mount_point}/sub/f"), &"x".repeat(4096)),
        ("/elsewhere/f", "x"),
    ]);
    let dev = Dev::from_st_dev(fs::metadata(dir.path()).expect("the directory").dev());
    fake::write(
        dir.path(),
        "/proc/1/mountinfo",
        &format!(
            "36 22 {dev} / {mount_point} rw - hugetlbfs hugetlbfs rw,pagesize=2M\n\
             38 22 0:99 / /elsewhere rw - hugetlbfs nodev rw,pagesize=2M\n"
        ),
    );
    let ino = fs::metadata(dir.path().join(format!("{}/rtemap_0", &mount_point[1..])))
        .expect("the file")
        .ino();
    (dir, host, ino)
}

const HUGEPAGES: &str = "/dev/hugepages";

fn by_path<'a>(held: &'a Holders, path: &str) -> &'a Holder {
    held.holders
        .iter()
        .find(|h| h.path.as_deref() == Some(path))
        .unwrap_or_else(|| panic!("{path} in {held:#?}"))
}

#[test]
fn a_file_nothing_maps_is_held_by_nothing_that_runs_and_empty_files_are_no_holders() {
    let (_dir, host, _) = host(SHM_HEADER, HUGEPAGES);
    let held = walk(&host, &pools(8, 0));
    let file = by_path(&held, "/dev/hugepages/rtemap_0");
    assert_eq!(file.kind, Kind::HugetlbfsFile);
    assert_eq!(file.held_bytes, 8192, "st_blocks × 512");
    assert!(file.held_by_nothing_that_runs);
    assert_eq!(file.nodes_from, NodesFrom::Unknown);
    assert_eq!(file.mount_point.as_deref(), Some("/dev/hugepages"));
    assert_eq!(file.page_size_bytes, MIB2);
    assert!(file.pod_volume.is_none());
    assert!(
        held.holders
            .iter()
            .all(|h| h.path.as_deref() != Some("/dev/hugepages/empty"))
    );
    let below = by_path(&held, "/dev/hugepages/sub/f");
    assert_eq!(below.held_bytes, 4096, "directories are walked");
    assert_eq!(held.unread.len(), 1, "{:?}", held.unread);
    assert!(
        held.unread[0].what.contains("/elsewhere"),
        "{:?}",
        held.unread
    );
    assert!(
        held.unread[0]
            .error
            .contains("expected the hugetlbfs mount"),
        "{:?}",
        held.unread
    );
    let account = &held.accounts[0];
    assert_eq!(account.in_use_bytes, 8 * MIB2);
    assert_eq!(account.files_bytes, 8192 + 4096);
    assert_eq!(account.held_by_nothing_that_runs_bytes, 8192 + 4096);
    assert_eq!(account.unexplained_bytes, 8 * MIB2 - 8192 - 4096);
    let unexplained = held
        .holders
        .iter()
        .find(|h| h.kind == Kind::Unexplained)
        .expect("an unexplained holder");
    assert_eq!(unexplained.held_bytes, account.unexplained_bytes);
}

#[test]
fn a_process_that_maps_a_file_is_its_user_with_its_pod_and_places_its_pages() {
    let (dir, host, ino) = host(SHM_HEADER, HUGEPAGES);
    let dev = Dev::from_st_dev(fs::metadata(dir.path()).expect("the directory").dev());
    let pod = "/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e.scope";
    fake::write(
        dir.path(),
        "/proc/4242/maps",
        &format!(
            "7f0000000000-7f0000400000 rw-s 00000000 {:02x}:{:02x} {ino} /dev/hugepages/rtemap_0\n\
             7f0000c00000-7f0001000000 rw-p 00000000 00:0f 1025 /anon_hugepage (deleted)\n",
            dev.major, dev.minor
        ),
    );
    fake::write(
        dir.path(),
        "/proc/4242/numa_maps",
        "7f0000000000 default file=/dev/hugepages/rtemap_0 huge dirty=2 N1=2 kernelpagesize_kB=2048\n\
         7f0000c00000 default file=/anon_hugepage\\040(deleted) huge anon=3 dirty=3 N0=3 kernelpagesize_kB=2048\n",
    );
    fake::write(dir.path(), "/proc/4242/comm", "dpdk-app\n");
    fake::write(dir.path(), "/proc/4242/cgroup", &format!("0::{pod}\n"));
    fs::create_dir_all(dir.path().join("proc/4242/fd")).expect("fd dir");
    let held = walk(&host, &pools(8, 0));
    let file = by_path(&held, "/dev/hugepages/rtemap_0");
    assert!(!file.held_by_nothing_that_runs);
    assert_eq!(file.users.len(), 1);
    let user = &file.users[0];
    assert_eq!(
        (user.pid, user.command.as_str(), user.maps),
        (4242, "dpdk-app", true)
    );
    assert_eq!(
        user.cgroup.pod_uid.as_deref(),
        Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    );
    assert_eq!(
        user.cgroup.container_id.as_deref(),
        Some("4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e")
    );
    assert_eq!(user.cgroup.cgroup.as_deref(), Some(pod));
    assert_eq!(file.per_node, BTreeMap::from([(NumaNode(1), 2 * MIB2)]));
    assert_eq!(
        file.nodes_from,
        NodesFrom::Mappings,
        "4 MiB mapped covers the fake file's 8 KiB"
    );
    assert_eq!(held.accounts[0].private_bytes, 3 * MIB2);
}

#[test]
fn segments_are_hugepages_when_attached_as_huge_or_when_rss_says_and_else_candidates() {
    let shm = format!(
        "{SHM_HEADER}\
         0 3 1600 6291456 4242 4243 0 0 0 0 0 1 1 1 3221225472 0\n\
         4660 4 600 4194304 4250 4250 1 1000 1000 1000 1000 1 0 1 2097152 0\n\
         0 5 600 4194304 4251 4251 0 0 0 0 0 1 0 1 4194304 0\n\
         0 6 600 4194304 4251 4251 0 0 0 0 0 1 0 1 0 0\n"
    );
    let (dir, host, _) = host(&shm, HUGEPAGES);
    fake::write(
        dir.path(),
        "/proc/4250/maps",
        "7f0000800000-7f0000c00000 rw-s 00000000 00:10 4 /SYSV00001234 (deleted)\n",
    );
    fake::write(
        dir.path(),
        "/proc/4250/numa_maps",
        "7f0000800000 default file=/SYSV00001234\\040(deleted) huge dirty=1 N0=1 kernelpagesize_kB=2048\n",
    );
    fs::create_dir_all(dir.path().join("proc/4250/fd")).expect("fd dir");
    let held = walk(&host, &pools(16, 0));
    let segment = |id: u64| held.holders.iter().find(|h| h.shmid == Some(id));
    let orphan = segment(3).expect("segment 3, by its rss");
    assert_eq!(orphan.known_by, Some(SegmentKnownBy::Rss));
    assert_eq!(orphan.held_bytes, 6 << 20, "3 GiB of rss / 512");
    assert!(orphan.held_by_nothing_that_runs);
    assert_eq!(
        orphan.creator,
        Some(NamedPid {
            pid: 4242,
            running: false
        })
    );
    let attached = segment(4).expect("segment 4, by its mapping");
    assert_eq!(attached.known_by, Some(SegmentKnownBy::Mapping));
    assert_eq!(attached.key.as_deref(), Some("0x00001234"));
    assert_eq!(attached.held_bytes, 2 << 20);
    assert!(!attached.held_by_nothing_that_runs);
    assert_eq!(attached.users[0].pid, 4250);
    assert_eq!(
        attached.last_attach,
        Some(NamedPid {
            pid: 4250,
            running: true
        })
    );
    assert!(segment(5).is_none(), "nothing says hugepages back it");
    assert!(segment(6).is_none());
    let unexplained = held
        .holders
        .iter()
        .find(|h| h.kind == Kind::Unexplained)
        .expect("unexplained");
    assert_eq!(
        unexplained.candidate_shmids,
        [5],
        "not attached, resident, backing unknown"
    );
    assert_eq!(held.accounts[0].segments_bytes, 8 << 20);
}

#[test]
fn what_cannot_be_read_is_said_and_the_rest_still_answered() {
    let (dir, host, _) = host(SHM_HEADER, HUGEPAGES);
    fs::remove_file(dir.path().join("proc/1/mountinfo")).expect("rm");
    fs::remove_file(dir.path().join("proc/sysvipc/shm")).expect("rm");
    let held = walk(&host, &pools(1, 0));
    let what: Vec<_> = held.unread.iter().map(|u| u.what.as_str()).collect();
    assert_eq!(what.len(), 2, "{what:?}");
    assert!(what[0].contains("mounts"), "{what:?}");
    assert!(what[1].contains("sysvipc"), "{what:?}");
    assert_eq!(held.accounts[0].unexplained_bytes, MIB2);
}

#[test]
fn the_files_of_a_pod_s_empty_dir_name_the_pod_and_its_volume() {
    let mount = "/var/lib/kubelet/pods/p-1/volumes/kubernetes.io~empty-dir/hp";
    let (_dir, host, _) = host(SHM_HEADER, mount);
    let held = walk(&host, &pools(8, 0));
    let file = by_path(&held, &format!("{mount}/sub/f"));
    assert_eq!(
        file.pod_volume,
        Some(PodVolume {
            pod_uid: "p-1".into(),
            volume: "hp".into()
        })
    );
    assert!(file.held_by_nothing_that_runs);
}

#[test]
fn pod_volumes_are_recognised_by_the_kubelet_s_path_under_any_root() {
    assert_eq!(
        pod_volume("/data/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/huge"),
        Some(PodVolume {
            pod_uid: "uid-1".into(),
            volume: "huge".into()
        })
    );
    assert_eq!(pod_volume("/dev/hugepages"), None);
    assert_eq!(
        pod_volume("/var/lib/kubelet/pods/u/volumes/kubernetes.io~secret/s"),
        None
    );
    assert_eq!(
        pod_volume("/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/a/b"),
        None
    );
}

fn segment(shmid: u64, size: u64, rss: u64) -> Segment {
    Segment {
        key: 0,
        shmid,
        size,
        cpid: 1,
        lpid: 1,
        nattch: 0,
        uid: 0,
        rss,
        ctime: 0,
    }
}

fn unexplained(size: u64, bytes: u64) -> Account {
    Account {
        page_size_bytes: size,
        unexplained_bytes: bytes,
        ..Account::default()
    }
}

#[test]
fn the_accounts_name_the_one_set_of_segments_that_adds_up_to_what_is_unexplained() {
    let hugetlb = segment(7, 6 << 20, 6 << 20);
    let ordinary = segment(8, 1 << 20, 1 << 20);
    let other = segment(9, 4 << 20, 4 << 20);
    let found = by_accounting(
        &[unexplained(MIB2, 10 << 20)],
        &[&hugetlb, &ordinary, &other],
    );
    let ids: Vec<_> = found.iter().map(|(s, size)| (s.shmid, *size)).collect();
    assert_eq!(
        ids,
        [(7, MIB2), (9, MIB2)],
        "6 + 4 MiB, the 1 MiB one fits no 2 MiB page"
    );
    assert!(
        by_accounting(&[unexplained(MIB2, 2 << 20)], &[&hugetlb, &ordinary]).is_empty(),
        "no set adds up"
    );
    let twin = segment(10, 6 << 20, 6 << 20);
    assert!(
        by_accounting(&[unexplained(MIB2, 6 << 20)], &[&hugetlb, &twin]).is_empty(),
        "two sets add up: neither is named"
    );
    assert!(
        by_accounting(&[unexplained(1 << 30, 6 << 20)], &[&hugetlb]).is_empty(),
        "6 MiB is no whole number of 1 GiB pages"
    );
}

#[test]
fn no_holder_is_said_held_by_nothing_that_runs_while_a_process_mapping_hugepages_is_unread() {
    let (dir, host, _) = host(SHM_HEADER, HUGEPAGES);
    // A `maps` that cannot be read (a directory), of a process whose status shows hugepages.
    fs::create_dir_all(dir.path().join("proc/77/maps")).expect("mkdir");
    fs::create_dir_all(dir.path().join("proc/77/fd")).expect("mkdir");
    fake::write(
        dir.path(),
        "/proc/77/status",
        "Name:\tdpdk\nHugetlbPages:\t    4096 kB\n",
    );
    let held = walk(&host, &pools(8, 0));
    let file = by_path(&held, "/dev/hugepages/rtemap_0");
    assert!(!file.held_by_nothing_that_runs, "process 77 may map it");
    assert_eq!(held.accounts[0].held_by_nothing_that_runs_bytes, 0);
    assert!(
        held.unread
            .iter()
            .any(|u| u.what.contains("1 of them mapping hugepages")),
        "{:?}",
        held.unread
    );
    // The same process mapping no hugepages leaves the claim standing.
    fake::write(
        dir.path(),
        "/proc/77/status",
        "Name:\tsleep\nHugetlbPages:\t       0 kB\n",
    );
    let held = walk(&host, &pools(8, 0));
    assert!(by_path(&held, "/dev/hugepages/rtemap_0").held_by_nothing_that_runs);
}

#[test]
fn a_segment_of_another_ipc_namespace_is_its_own_holder_not_the_host_s_of_the_same_shmid() {
    let shm = format!("{SHM_HEADER}0 4 600 4194304 10 10 0 0 0 0 0 1 1 1 4194304 0\n");
    let (dir, host, _) = host(&shm, HUGEPAGES);
    let root = dir.path();
    fs::create_dir_all(root.join("proc/self/ns")).expect("mkdir");
    std::os::unix::fs::symlink("ipc:[4026531839]", root.join("proc/self/ns/ipc")).expect("ln");
    fake::write(
        root,
        "/proc/4250/maps",
        "7f0000800000-7f0000c00000 rw-s 00000000 00:10 4 /SYSV00001234 (deleted)\n",
    );
    fake::write(
        root,
        "/proc/4250/numa_maps",
        "7f0000800000 default file=/SYSV00001234\\040(deleted) huge dirty=1 N1=1 kernelpagesize_kB=2048\n",
    );
    fs::create_dir_all(root.join("proc/4250/fd")).expect("fd dir");
    fs::create_dir_all(root.join("proc/4250/ns")).expect("ns dir");
    std::os::unix::fs::symlink("ipc:[4026532999]", root.join("proc/4250/ns/ipc")).expect("ln");
    let book = book::Book::default();
    let faulted = crate::probes::events::FaultEvent {
        at: std::time::Duration::from_secs(1),
        done: Some(0),
        cgroup_id: 1,
        tgid: 4250,
        pid: 4250,
        comm: "pod-app".into(),
        address: 0x7f00_0080_0000,
        page_size: Some(MIB2),
        write: true,
        error_code: 2,
        cpu: 0,
        numa_node: 0,
        file: Some(crate::probes::events::FaultFile {
            dev: 15,
            ino: 4,
            shared: true,
            sysv: true,
            ipc_ns: 4026532999,
        }),
    };
    book.fault(&faulted, |_, _| None);
    let held = walk_with(&host, &pools(8, 0), &book);
    let segments: Vec<&Holder> = held
        .holders
        .iter()
        .filter(|h| h.kind == Kind::SysvSegment)
        .collect();
    assert_eq!(segments.len(), 1, "{segments:#?}");
    let pods = segments[0];
    assert_eq!(pods.ipc_namespace.as_deref(), Some("ipc:[4026532999]"));
    assert_eq!(pods.shmid, Some(4));
    assert_eq!(pods.key.as_deref(), Some("0x00001234"));
    assert_eq!(pods.held_bytes, MIB2);
    assert_eq!(pods.users[0].pid, 4250);
    assert_eq!(
        pods.probes
            .as_ref()
            .and_then(|p| p.first_fault_by.as_ref())
            .map(|w| w.command.as_str()),
        Some("pod-app"),
        "the book's entry of the pod's namespace and shmid"
    );
    assert!(
        held.holders
            .iter()
            .any(|h| h.kind == Kind::Unexplained && h.candidate_shmids == [4]),
        "the host's own shmid 4, attached by nothing, stays a candidate: {:#?}",
        held.holders
    );
}
