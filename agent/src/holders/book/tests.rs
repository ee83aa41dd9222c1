//! The book alone (events in, entries out) and with the walk over a fake host tree. The probes
//! writing it on the real kernel are in `tests/holders.rs`.

use std::{fs, os::unix::fs::MetadataExt, time::Duration};

use super::*;
use crate::{
    holders::{SegmentKnownBy, walk_with},
    host::{GlobalPool, HugepageTable, PageSize},
    probes::events::FaultFile,
    sysfs::fake,
};

const MIB2: u64 = 2 << 20;
const HOST_IPC: u32 = 4026531839;
const POD: &str = "/kubepods.slice/kubepods-pod0a1b2c3d_4e5f_6789_abcd_ef0123456789.slice/cri-containerd-4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e4f2e.scope";

/// `S_IFREG | 0644`.
const REGULAR: u32 = 0o100_644;

fn made(dev: u32, ino: u64, tgid: u32, at_s: u64) -> FileEvent {
    FileEvent {
        at: Duration::from_secs(at_s),
        change: FileChange::Made { mode: REGULAR },
        dev,
        ino,
        cgroup_id: 1,
        tgid,
        pid: tgid,
        comm: "testpmd".into(),
    }
}

fn fault(file: FaultFile, tgid: u32, at_s: u64) -> FaultEvent {
    FaultEvent {
        at: Duration::from_secs(at_s),
        done: Some(0),
        cgroup_id: 1,
        tgid,
        pid: tgid,
        comm: format!("p{tgid}"),
        address: 0x7f00_0000_0000,
        page_size: Some(MIB2),
        write: true,
        error_code: 2,
        cpu: 0,
        numa_node: 0,
        file: Some(file),
    }
}

fn file(dev: u32, ino: u64) -> FaultFile {
    FaultFile {
        dev,
        ino,
        shared: true,
        sysv: false,
        ipc_ns: HOST_IPC,
    }
}

fn segment(shmid: u64, ipc_ns: u32) -> FaultFile {
    FaultFile {
        dev: 15,
        ino: shmid,
        shared: true,
        sysv: true,
        ipc_ns,
    }
}

fn entry(book: &Book, subject: Subject) -> Option<Entry> {
    book.0.lock().expect("book").entries.get(&subject).cloned()
}

fn no_cgroup(_: u32, _: u64) -> Option<String> {
    None
}

#[test]
fn a_file_made_then_faulted_names_its_maker_and_its_first_and_last_faulting_processes() {
    let book = Book::default();
    let asked = std::cell::Cell::new(0);
    let pod_cgroup = |_: u32, _: u64| {
        asked.set(asked.get() + 1);
        Some(POD.to_owned())
    };
    book.file(&made(40, 7, 100, 1), pod_cgroup);
    book.fault(&fault(file(40, 7), 200, 2), pod_cgroup);
    book.fault(&fault(file(40, 7), 200, 3), pod_cgroup);
    book.fault(&fault(file(40, 7), 300, 4), pod_cgroup);
    assert_eq!(
        asked.get(),
        3,
        "the cgroup is read per new actor, not per fault"
    );
    let e = entry(
        &book,
        Subject::File {
            dev: Dev {
                major: 0,
                minor: 40,
            },
            ino: 7,
        },
    )
    .expect("entry");
    assert_eq!(
        e.made.as_ref().map(|a| (a.pid, a.command.as_str())),
        Some((100, "testpmd"))
    );
    assert_eq!(e.first_fault.as_ref().map(|a| a.pid), Some(200));
    assert_eq!(
        e.last_fault.as_ref().map(|a| (a.pid, a.at)),
        Some((300, Duration::from_secs(4)))
    );
    assert_eq!((e.faults, e.page_size), (3, Some(MIB2)));
}

#[test]
fn a_private_mapping_s_fault_is_its_process_s_page_not_the_file_s() {
    let book = Book::default();
    let private = FaultFile {
        shared: false,
        ..file(40, 7)
    };
    book.fault(&fault(private, 200, 1), no_cgroup);
    assert!(
        entry(
            &book,
            Subject::File {
                dev: Dev::from_kernel(40),
                ino: 7
            }
        )
        .is_none()
    );
    book.fault(&fault(file(40, 7), 200, 2), no_cgroup);
    let e = entry(
        &book,
        Subject::File {
            dev: Dev::from_kernel(40),
            ino: 7,
        },
    )
    .expect("entry");
    assert_eq!(e.faults, 1);
}

#[test]
fn only_events_on_files_the_book_or_the_last_walk_knows_make_the_latest_walk_stale() {
    let book = Book::default();
    let g0 = book.generation();
    book.fault(&fault(file(40, 7), 200, 1), no_cgroup);
    assert_eq!(book.generation(), g0, "a fault changes no file's existence");
    book.file(&made(40, 8, 100, 2), no_cgroup);
    assert_eq!(book.generation(), g0, "an empty file made holds nothing");
    let evicted = |ino, at_s| FileEvent {
        change: FileChange::Evicted,
        ..made(40, ino, 100, at_s)
    };
    book.file(&evicted(99, 3), no_cgroup);
    assert_eq!(
        book.generation(),
        g0,
        "an inode neither booked nor walked (an anonymous MAP_HUGETLB mapping's)"
    );
    book.file(&evicted(7, 4), no_cgroup);
    assert_eq!(book.generation(), g0 + 1);
    let subject = |ino| Subject::File {
        dev: Dev::from_kernel(40),
        ino,
    };
    assert!(entry(&book, subject(7)).is_none(), "evicted");
    assert!(entry(&book, subject(8)).is_some());
    book.fault(&fault(file(40, 7), 200, 3), no_cgroup);
    assert!(
        entry(&book, subject(7)).is_none(),
        "a fault taken before the eviction and read after it books nothing"
    );
    let directory = FileEvent {
        change: FileChange::Made { mode: 0o040_755 },
        ..made(40, 9, 100, 5)
    };
    book.file(&directory, no_cgroup);
    assert!(
        entry(&book, subject(9)).is_none(),
        "directories hold no pages"
    );
}

#[test]
fn a_file_made_read_after_its_first_faults_keeps_them_and_an_inode_number_used_again_starts_afresh()
{
    let book = Book::default();
    let subject = Subject::File {
        dev: Dev::from_kernel(40),
        ino: 7,
    };
    book.fault(&fault(file(40, 7), 200, 5), no_cgroup);
    book.file(&made(40, 7, 100, 4), no_cgroup);
    let e = entry(&book, subject).expect("entry");
    assert_eq!((e.faults, e.made.map(|a| a.pid)), (1, Some(100)));
    book.file(&made(40, 7, 101, 9), no_cgroup);
    let e = entry(&book, subject).expect("entry");
    assert_eq!(
        (e.faults, e.made.map(|a| a.pid)),
        (0, Some(101)),
        "another file of the same number"
    );
}

#[test]
fn a_segment_s_file_evicted_takes_the_segment_out_when_no_other_namespace_shares_its_shmid() {
    let book = Book::default();
    book.fault(&fault(segment(3, HOST_IPC), 200, 1), no_cgroup);
    let evicted = |shmid, at_s| FileEvent {
        change: FileChange::Evicted,
        ..made(15, shmid, 200, at_s)
    };
    let g0 = book.generation();
    book.file(&evicted(3, 2), no_cgroup);
    assert!(book.faulted_segments(HOST_IPC).is_empty());
    assert_eq!(book.generation(), g0 + 1);

    const POD_IPC: u32 = 4026532999;
    book.fault(&fault(segment(0, HOST_IPC), 200, 3), no_cgroup);
    book.fault(&fault(segment(0, POD_IPC), 201, 3), no_cgroup);
    book.file(&evicted(0, 4), no_cgroup);
    assert_eq!(
        (
            book.faulted_segments(HOST_IPC).len(),
            book.faulted_segments(POD_IPC).len()
        ),
        (1, 1),
        "shmid 0 in two namespaces on the one kernel mount: which one went is the walk's to say"
    );
    assert_eq!(
        book.generation(),
        g0 + 2,
        "the latest walk is stale all the same"
    );
}

#[test]
fn a_memfd_s_fallocate_books_it_though_nothing_booked_it_as_made() {
    let book = Book::default();
    let fallocated = FileEvent {
        change: FileChange::Fallocated {
            offset: 0,
            len: 2 << 20,
            mode: 0,
            ret: 0,
        },
        ..made(15, 77, 300, 1)
    };
    let g0 = book.generation();
    book.file(&fallocated, no_cgroup);
    let subject = Subject::File {
        dev: Dev::from_kernel(15),
        ino: 77,
    };
    assert_eq!(
        entry(&book, subject).map(|e| e.fallocated_bytes),
        Some(2 << 20)
    );
    assert_eq!(book.generation(), g0 + 1);
}

#[test]
fn an_eviction_read_after_a_new_file_of_the_same_number_leaves_the_new_file() {
    let book = Book::default();
    book.file(&made(40, 7, 100, 5), no_cgroup);
    let evicted = FileEvent {
        change: FileChange::Evicted,
        ..made(40, 7, 100, 4)
    };
    book.file(&evicted, no_cgroup);
    let subject = Subject::File {
        dev: Dev::from_kernel(40),
        ino: 7,
    };
    assert_eq!(
        entry(&book, subject).and_then(|e| e.made).map(|a| a.pid),
        Some(100)
    );
}

#[test]
fn fallocate_counts_what_it_took_not_holes_punched_or_calls_refused() {
    let book = Book::default();
    let fallocated = |mode, ret| FileEvent {
        change: FileChange::Fallocated {
            offset: 0,
            len: 4 << 20,
            mode,
            ret,
        },
        ..made(40, 9, 100, 1)
    };
    book.file(&fallocated(FALLOC_FL_PUNCH_HOLE | 1, 0), no_cgroup);
    let subject = Subject::File {
        dev: Dev::from_kernel(40),
        ino: 9,
    };
    assert!(
        entry(&book, subject).is_none(),
        "a hole punched in a file the book does not know books nothing"
    );
    book.file(&fallocated(0, 0), no_cgroup);
    book.file(&fallocated(FALLOC_FL_PUNCH_HOLE | 1, 0), no_cgroup);
    book.file(&fallocated(0, -28), no_cgroup);
    let e = entry(
        &book,
        Subject::File {
            dev: Dev::from_kernel(40),
            ino: 9,
        },
    )
    .expect("entry");
    assert_eq!(e.fallocated_bytes, 4 << 20);
}

#[test]
fn a_segment_s_faults_are_booked_by_its_ipc_namespace_and_shmid() {
    let book = Book::default();
    book.fault(&fault(segment(3, HOST_IPC), 200, 1), no_cgroup);
    book.fault(&fault(segment(3, 4026532999), 201, 1), no_cgroup);
    book.fault(&fault(segment(5, 4026532999), 201, 1), no_cgroup);
    assert_eq!(book.faulted_segments(HOST_IPC), HashMap::from([(3, MIB2)]));
    assert_eq!(book.faulted_segments(4026532999).len(), 2);
    let unknown_ns = FaultFile {
        ipc_ns: 0,
        ..segment(6, 0)
    };
    book.fault(&fault(unknown_ns, 202, 1), no_cgroup);
    assert!(
        entry(
            &book,
            Subject::File {
                dev: Dev::from_kernel(15),
                ino: 6
            }
        )
        .is_some(),
        "without its namespace a segment's file is booked as a file, never as a shmid"
    );
}

#[test]
fn a_full_book_drops_the_entry_touched_longest_ago() {
    let book = Book::default();
    for ino in 0..CAPACITY as u64 {
        book.file(&made(40, ino, 1, ino + 10), no_cgroup);
    }
    book.fault(&fault(file(40, 0), 2, 1_000_000), no_cgroup);
    book.file(&made(40, 1_000_000, 1, 1_000_001), no_cgroup);
    let b = book.0.lock().expect("book");
    assert_eq!(b.entries.len(), CAPACITY);
    let subject = |ino| Subject::File {
        dev: Dev::from_kernel(40),
        ino,
    };
    assert!(
        b.entries.contains_key(&subject(0)),
        "touched again by its fault"
    );
    assert!(
        !b.entries.contains_key(&subject(1)),
        "the oldest untouched one went"
    );
}

fn pools(total: u64) -> HugepageTable {
    HugepageTable {
        nodes: Vec::new(),
        global: vec![GlobalPool {
            size: PageSize(MIB2),
            total,
            free: 0,
            reserved: 0,
            surplus: 0,
        }],
    }
}

/// A host with one hugetlbfs mount at `/dev/hugepages` holding `rtemap_0`, the SysV segments
/// given, and the agent in the host's IPC namespace; the mount's device and the file's inode.
fn host(shm_rows: &str) -> (tempfile::TempDir, HostFs, Dev, u64) {
    let header = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n";
    let (dir, host) = fake::tree(&[
        ("/proc/sysvipc/shm", &format!("{header}{shm_rows}")),
        ("/dev/hugepages/rtemap_0", &"x".repeat(8192)),
        ("/proc/555/comm", "bash\n"),
    ]);
    let dev = Dev::from_st_dev(fs::metadata(dir.path()).expect("dir").dev());
    fake::write(
        dir.path(),
        "/proc/1/mountinfo",
        &format!("36 22 {dev} / /dev/hugepages rw - hugetlbfs hugetlbfs rw,pagesize=2M\n"),
    );
    fs::create_dir_all(dir.path().join("proc/self/ns")).expect("mkdir");
    std::os::unix::fs::symlink(
        format!("ipc:[{HOST_IPC}]"),
        dir.path().join("proc/self/ns/ipc"),
    )
    .expect("ln");
    let ino = fs::metadata(dir.path().join("dev/hugepages/rtemap_0"))
        .expect("file")
        .ino();
    (dir, host, dev, ino)
}

fn kernel_dev(dev: Dev) -> u32 {
    (dev.major << 20) | dev.minor
}

#[test]
fn the_walk_names_who_made_and_faulted_a_file_nothing_runs_with_and_whether_they_run() {
    let (_dir, host, dev, ino) = host("");
    let book = Book::default();
    book.file(&made(kernel_dev(dev), ino, 555, 1), |_, _| {
        Some(POD.to_owned())
    });
    book.fault(&fault(file(kernel_dev(dev), ino), 556, 2), no_cgroup);
    let held = walk_with(&host, &pools(8), &book);
    let f = held
        .holders
        .iter()
        .find(|h| h.path.as_deref() == Some("/dev/hugepages/rtemap_0"))
        .expect("the file");
    assert!(f.held_by_nothing_that_runs);
    let seen = f.probes.as_ref().expect("the book's entry");
    let maker = seen.made_by.as_ref().expect("its maker");
    assert_eq!((maker.pid, maker.command.as_str()), (555, "testpmd"));
    assert!(maker.running, "/proc/555 is there");
    assert_eq!(
        maker.cgroup.pod_uid.as_deref(),
        Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    );
    assert!(maker.cgroup.container_id.is_some());
    let faulter = seen.last_fault_by.as_ref().expect("its faulting process");
    assert_eq!((faulter.pid, faulter.running), (556, false));
    assert_eq!(seen.faults, 1);
    let json = serde_json::to_value(f).expect("JSON");
    assert_eq!(json["probes"]["madeBy"]["command"], "testpmd");
    assert!(
        json["probes"]["madeBy"]["at"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z'))
    );
    assert!(json.get("dev").is_none(), "the device stays inside");
}

#[test]
fn a_segment_nothing_attaches_is_known_to_be_hugepages_by_its_faults() {
    // Segment 5: rss 4 MiB, as 6.1 and 6.12 show a hugetlb segment (no sign of hugepages).
    let (_dir, host, _, _) = host("0 5 600 4194304 4251 4251 0 0 0 0 0 1 0 1 4194304 0\n");
    let book = Book::default();
    let without = walk_with(&host, &pools(8), &book);
    assert!(
        without.holders.iter().all(|h| h.shmid != Some(5)),
        "a candidate only"
    );
    book.fault(&fault(segment(5, HOST_IPC), 4251, 1), |_, _| {
        Some(POD.to_owned())
    });
    book.fault(&fault(segment(5, 4026532999), 9, 1), no_cgroup);
    let held = walk_with(&host, &pools(8), &book);
    let s = held
        .holders
        .iter()
        .find(|h| h.shmid == Some(5))
        .expect("segment 5");
    assert_eq!(s.known_by, Some(SegmentKnownBy::Faults));
    assert_eq!((s.page_size_bytes, s.held_bytes), (MIB2, 4 << 20));
    assert!(s.held_by_nothing_that_runs);
    let faulter = s
        .probes
        .as_ref()
        .and_then(|p| p.first_fault_by.as_ref())
        .expect("faulter");
    assert_eq!(
        faulter.pid, 4251,
        "the host namespace's shmid 5, not the pod's"
    );
    assert_eq!(
        faulter.cgroup.pod_uid.as_deref(),
        Some("0a1b2c3d-4e5f-6789-abcd-ef0123456789")
    );
}

#[test]
fn a_walk_that_read_everything_drops_what_it_no_longer_finds_unless_booked_since_it_began() {
    let (_dir, host, dev, ino) = host("");
    let book = Book::default();
    let now = crate::numa::map::monotonic_now();
    book.file(&made(kernel_dev(dev), ino, 555, 1), no_cgroup);
    book.file(&made(kernel_dev(dev), ino + 1000, 555, 1), no_cgroup);
    book.file(
        &made(kernel_dev(dev), ino + 2000, 555, now.as_secs() + 3600),
        no_cgroup,
    );
    let held = walk_with(&host, &pools(8), &book);
    assert!(held.unread.is_empty(), "{:?}", held.unread);
    let subject = |ino| Subject::File { dev, ino };
    assert!(entry(&book, subject(ino)).is_some(), "found by the walk");
    assert!(
        entry(&book, subject(ino + 1000)).is_none(),
        "gone before the walk"
    );
    assert!(
        entry(&book, subject(ino + 2000)).is_some(),
        "booked after the walk began"
    );
}

#[test]
fn a_segment_removed_or_out_of_sight_leaves_the_book_at_the_next_complete_walk() {
    let (_dir, host, _, _) = host("0 5 600 4194304 4251 4251 0 0 0 0 0 1 0 1 4194304 0\n");
    let book = Book::default();
    for shmid in [5, 6] {
        book.fault(&fault(segment(shmid, HOST_IPC), 4251, 1), no_cgroup);
    }
    book.fault(&fault(segment(6, 4026532999), 9, 1), no_cgroup);
    walk_with(&host, &pools(8), &book);
    let seg = |ipc_ns, shmid| entry(&book, Subject::Segment { ipc_ns, shmid });
    assert!(seg(HOST_IPC, 5).is_some(), "listed");
    assert!(seg(HOST_IPC, 6).is_none(), "removed: not in the table");
    assert!(
        seg(4026532999, 6).is_none(),
        "another namespace's segment no process attaches: the walk read every process and found \
         none, so nothing shows it (its namespace may be gone, and its inode number used again)"
    );
}

#[test]
fn an_empty_file_the_walk_meets_keeps_its_maker_until_it_holds_pages() {
    let (dir, host, dev, _) = host("");
    fs::write(dir.path().join("dev/hugepages/empty"), "").expect("empty file");
    let ino = fs::metadata(dir.path().join("dev/hugepages/empty"))
        .expect("file")
        .ino();
    let book = Book::default();
    book.file(&made(kernel_dev(dev), ino, 555, 1), no_cgroup);
    let held = walk_with(&host, &pools(8), &book);
    assert!(
        held.holders.iter().all(|h| h.inode != Some(ino)),
        "no pages, no holder"
    );
    assert!(
        entry(&book, Subject::File { dev, ino }).is_some(),
        "met by the walk: kept"
    );
}

#[test]
fn where_evictions_are_seen_a_walk_leaves_other_namespaces_segments_to_them() {
    let (_dir, host, _, _) = host("");
    let book = Book::default();
    book.watch_evictions(true);
    book.fault(&fault(segment(6, 4026532999), 9, 1), no_cgroup);
    walk_with(&host, &pools(8), &book);
    let subject = Subject::Segment {
        ipc_ns: 4026532999,
        shmid: 6,
    };
    assert!(
        entry(&book, subject).is_some(),
        "not attached during this walk, but not evicted"
    );
}
