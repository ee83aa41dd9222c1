//! The eBPF probes on the real kernel: real programs, real hugepages, real cgroups.
//!
//! Each test takes the host lock, so tests that change the host never overlap, and restores what
//! it changed (hugepage pool, cgroups, controllers) through guards, also when it fails.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use hugepage_agent::{
    probes::{
        Counters, EventStreams, FaultPath, Probes,
        events::{CgroupChange, FaultEvent, ProbeEvent},
        flags::FaultAttach,
        retries::{DEFAULT_WINDOW, RetryFilter},
        stream,
    },
    sysfs::HostFs,
};
use hugepage_agent_common::counters::Counter;
use hugepage_agent_tests::{
    HugepagePool, HugetlbController, TestCgroup, Toucher, host_lock, pin_this_thread, v2,
};
use tokio::sync::mpsc::Receiver;

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");

fn load() -> (Probes, EventStreams) {
    match Probes::load(&HostFs::new("/"), FaultAttach::Auto) {
        Ok(loaded) => loaded,
        Err(err) => panic!("loading the probes on this kernel: {}", err.explain()),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Events received until `deadline` from now.
async fn collect(rx: &mut Receiver<ProbeEvent>, within: Duration) -> Vec<ProbeEvent> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline.into(), rx.recv()).await {
        events.push(event);
    }
    events
}

fn faults_of(events: &[ProbeEvent], tgid: u32) -> Vec<FaultEvent> {
    let mut retries = RetryFilter::new(DEFAULT_WINDOW);
    events
        .iter()
        .filter_map(|e| match e {
            ProbeEvent::Fault(f) if f.tgid == tgid && retries.admit(f) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

fn delta(before: &Counters, after: &Counters, counter: Counter) -> u64 {
    after.get(counter) - before.get(counter)
}

#[test]
fn each_touched_huge_page_in_a_watched_cgroup_is_one_event_with_pid_cgroup_and_size() {
    const K: usize = 8;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 16);
    let cgroup = TestCgroup::create(&lock, "faults");
    runtime().block_on(async {
        let (mut probes, streams) = load();
        let scan = v2().scan(&HostFs::new("/")).expect("scan cgroups");
        assert!(scan.watched.contains(&cgroup.id), "a cgroup without hugetlb limits can use hugepages");
        probes.sync_watched(&scan.watched).expect("watch");
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let before = probes.counters().expect("counters");
        let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), K, 64);
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        let faults = faults_of(&events, toucher.pid);
        assert_eq!(faults.len(), K, "one event per touched huge page: {faults:#?}");
        let pages: BTreeSet<u64> = faults.iter().map(FaultEvent::page_address).collect();
        assert_eq!(pages.len(), K, "K distinct huge pages");
        for f in &faults {
            assert_eq!((f.pid, f.cgroup_id, f.page_size), (toucher.pid, cgroup.id, Some(2 << 20)), "{f:?}");
            assert_eq!(f.comm, "toucher");
            assert!(f.write);
        }
        let after = probes.counters().expect("counters");
        assert!(delta(&before, &after, Counter::HugetlbFaults) >= K as u64);
        assert_eq!(delta(&before, &after, Counter::HugetlbFaultsLost), 0);
        let attached = events.iter().any(|e| matches!(e, ProbeEvent::Cgroup(c)
            if c.cgroup_id == cgroup.id && c.change == CgroupChange::AttachTask { pid: toucher.pid }));
        assert!(attached, "the toucher's move into the cgroup is an attach_task event");
    });
}

/// `--fault-attach fentry`: where the kernel runs fentry programs (the VM test's kernels, whose
/// PREEMPT_RT builds need it), the same events as the tracepoint for the same touched pages;
/// where it refuses them, the refusal names the program. This host's kernel refuses fentry
/// (EPERM from BPF_PROG_LOAD whatever the capabilities): the test then says so and checks the
/// refusal; `cargo xtask vm-test` runs the fentry path on 6.1-rt and 6.12-rt.
#[test]
fn the_fentry_fault_program_sees_the_same_faults_or_its_refusal_names_it() {
    same_faults_or_refusal(FaultAttach::Fentry, FaultPath::Fentry, "hugetlb_fault");
}

/// `--fault-attach fexit`: the same faults, each seen done (`vm_fault` 0: its page mapped), or
/// the refusal naming the program where the kernel refuses fexit (this host; `cargo xtask
/// vm-test` runs the fexit path on every kernel it boots).
#[test]
fn the_fexit_fault_program_sees_each_fault_done_or_its_refusal_names_it() {
    same_faults_or_refusal(FaultAttach::Fexit, FaultPath::Fexit, "hugetlb_fault_done");
}

/// The fault program loaded where `attach` says sees one event per huge page a toucher in a
/// watched cgroup touches; or the kernel refuses `program`, and the error says so.
fn same_faults_or_refusal(attach: FaultAttach, path: FaultPath, program: &str) {
    const K: usize = 4;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let cgroup = TestCgroup::create(&lock, program);
    let (mut probes, streams) = match Probes::load(&HostFs::new("/"), attach) {
        Ok(loaded) => loaded,
        Err(err) => {
            let why = err.explain();
            assert!(
                why.contains(&format!("eBPF program {program} refused by the kernel")),
                "{why}"
            );
            eprintln!("this kernel refuses {program}, so only the refusal is checked: {why}");
            return;
        }
    };
    assert_eq!(probes.fault_path, path);
    runtime().block_on(async {
        let scan = v2().scan(&HostFs::new("/")).expect("scan cgroups");
        probes.sync_watched(&scan.watched).expect("watch");
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), K, 64);
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        let faults = faults_of(&events, toucher.pid);
        assert_eq!(
            faults.len(),
            K,
            "one event per touched huge page: {faults:#?}"
        );
        for f in &faults {
            assert_eq!(
                (f.pid, f.cgroup_id, f.page_size),
                (toucher.pid, cgroup.id, Some(2 << 20)),
                "{f:?}"
            );
            assert!(f.write);
            let done = path == FaultPath::Fexit;
            assert_eq!(f.done, done.then_some(0), "{f:?}");
            assert_eq!(f.settled(), done, "{f:?}");
        }
    });
}

/// `--fault-attach auto`: fexit where the kernel runs it; where it refuses it (this host), the
/// tracepoint, and the refusal is kept for the log.
#[test]
fn auto_takes_fexit_where_the_kernel_allows_it_and_else_the_tracepoint_saying_why() {
    let lock = host_lock();
    let realtime = std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|r| r.trim() == "1");
    let (probes, _streams) = Probes::load(&HostFs::new("/"), FaultAttach::Auto).expect("probes");
    match probes.fault_path {
        FaultPath::Fexit => assert_eq!(probes.fault_fallback, None),
        fallback => {
            let expected = if realtime {
                FaultPath::Fentry
            } else {
                FaultPath::Tracepoint
            };
            assert_eq!(fallback, expected);
            let why = probes.fault_fallback.clone().unwrap_or_default();
            assert!(
                why.contains("eBPF program hugetlb_fault_done refused by the kernel"),
                "{why}"
            );
            eprintln!("this kernel refuses fexit: the fault probe is {fallback:?} ({why})");
        }
    }
    drop(lock);
}

#[test]
fn ordinary_faults_are_inspected_but_produce_no_events() {
    const SMALL: usize = 4096;
    let lock = host_lock();
    let cgroup = TestCgroup::create(&lock, "small");
    runtime().block_on(async {
        let (mut probes, streams) = load();
        probes.watch(cgroup.id).expect("watch");
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let before = probes.counters().expect("counters");
        let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 0, SMALL);
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        assert!(
            faults_of(&events, toucher.pid).is_empty(),
            "4 KiB faults are not hugetlb faults"
        );
        let after = probes.counters().expect("counters");
        assert!(
            delta(&before, &after, Counter::FaultsNotHugetlb) >= SMALL as u64,
            "{before:?} -> {after:?}"
        );
    });
}

#[test]
fn a_cgroup_whose_hugetlb_limit_is_zero_is_filtered_before_find_vma() {
    const SMALL: usize = 2048;
    let lock = host_lock();
    let _controller = HugetlbController::enable(&lock);
    let zero = TestCgroup::create(&lock, "zero");
    zero.set("hugetlb.2MB.max", "0");
    zero.set("hugetlb.1GB.max", "0");
    let limited = TestCgroup::create(&lock, "limited");
    limited.set("hugetlb.2MB.max", &(4u64 << 20).to_string());
    runtime().block_on(async {
        let (mut probes, _streams) = load();
        let scan = v2().scan(&HostFs::new("/")).expect("scan cgroups");
        assert!(
            !scan.watched.contains(&zero.id),
            "limit 0 for every size: cannot use hugepages"
        );
        assert!(
            scan.watched.contains(&limited.id),
            "a 2 MiB limit above zero: can"
        );
        probes.sync_watched(&scan.watched).expect("watch");
        let before = probes.counters().expect("counters");
        drop(Toucher::run(TOUCHER, Some(&zero.dir), 0, SMALL));
        let after = probes.counters().expect("counters");
        assert!(
            delta(&before, &after, Counter::FaultsFiltered) >= SMALL as u64,
            "{before:?} -> {after:?}"
        );
    });
}

#[test]
fn watch_all_mode_inspects_faults_of_unwatched_cgroups() {
    const K: usize = 2;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let _controller = HugetlbController::enable(&lock);
    let zero = TestCgroup::create(&lock, "all");
    zero.set("hugetlb.2MB.max", "0");
    zero.set("hugetlb.1GB.max", "0");
    runtime().block_on(async {
        let (mut probes, streams) = load();
        probes.set_watch_all(true).expect("watch all");
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let before = probes.counters().expect("counters");
        // The zero limit refuses hugetlb pages at mmap time; 4 KiB faults must still be inspected.
        let toucher = Toucher::run(TOUCHER, Some(&zero.dir), 0, 512);
        let events = collect(&mut rx, Duration::from_millis(300)).await;
        assert!(faults_of(&events, toucher.pid).is_empty());
        let after = probes.counters().expect("counters");
        assert!(
            delta(&before, &after, Counter::FaultsNotHugetlb) >= 512,
            "{before:?} -> {after:?}"
        );
        drop(toucher);
        let outside = Toucher::run(TOUCHER, None, K, 0);
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        assert_eq!(faults_of(&events, outside.pid).len(), K);
    });
}

#[test]
fn creating_and_removing_a_cgroup_produces_mkdir_and_rmdir_events_with_its_path() {
    let lock = host_lock();
    runtime().block_on(async {
        let (_probes, streams) = load();
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let cgroup = TestCgroup::create(&lock, "lifecycle");
        let (id, rel) = (cgroup.id, cgroup.rel.clone());
        drop(cgroup);
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        let mine: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ProbeEvent::Cgroup(c) if c.cgroup_id == id => Some(c),
                _ => None,
            })
            .collect();
        let changes: Vec<_> = mine.iter().map(|c| c.change).collect();
        assert!(
            changes.starts_with(&[CgroupChange::Mkdir, CgroupChange::Rmdir]),
            "{mine:#?}"
        );
        for c in &mine {
            assert_eq!(c.path, rel);
            assert!(c.is_v2() && c.level == 1 && !c.truncated, "{c:?}");
        }
    });
}

#[test]
fn a_cgroup_watched_while_its_faults_are_being_filtered_is_seen_at_once() {
    // Pins the per-CPU verdict cache: a process keeps faulting on CPU 1, so "not watched" stays
    // cached there; the watch-map change must still take effect for its very next fault.
    const K: usize = 3;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let cgroup = TestCgroup::create(&lock, "verdict");
    pin_this_thread(0);
    runtime().block_on(async {
        let (mut probes, streams) = load();
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let before = probes.counters().expect("counters");
        let toucher = Toucher::spin_then_touch(TOUCHER, &cgroup.dir, 1, K, || {
            let spun = probes.counters().expect("counters");
            assert!(
                delta(&before, &spun, Counter::FaultsFiltered) >= 4096,
                "unwatched: filtered"
            );
            probes.watch(cgroup.id).expect("watch");
        });
        let events = collect(&mut rx, Duration::from_secs(1)).await;
        assert_eq!(
            faults_of(&events, toucher.pid).len(),
            K,
            "watched now: every huge page seen"
        );
        drop(toucher);

        let toucher = Toucher::spin_then_touch(TOUCHER, &cgroup.dir, 1, K, || {
            probes.unwatch(cgroup.id).expect("unwatch");
        });
        let events = collect(&mut rx, Duration::from_millis(500)).await;
        assert!(
            faults_of(&events, toucher.pid).is_empty(),
            "unwatched again: filtered"
        );
    });
}

#[test]
fn a_paused_fault_program_reports_and_counts_nothing() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let cgroup = TestCgroup::create(&lock, "paused");
    runtime().block_on(async {
        let (mut probes, streams) = load();
        probes.watch(cgroup.id).expect("watch");
        probes.set_paused(true).expect("pause");
        let mut rx = stream::spawn(streams, 4096).expect("readers");
        let before = probes.counters().expect("counters");
        let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 2, 64);
        let events = collect(&mut rx, Duration::from_millis(500)).await;
        let after = probes.counters().expect("counters");
        assert!(faults_of(&events, toucher.pid).is_empty());
        assert_eq!(
            before.faults_seen(),
            after.faults_seen(),
            "{before:?} -> {after:?}"
        );
    });
}

/// #45: the task iterators' records of this process against its own `/proc`: every hugetlb
/// mapping `maps` shows (a shared file of a mount, a segment, a private anonymous mapping), with
/// its addresses, device, inode and sharing, the bytes each file holds (`st_blocks`), and every
/// descriptor on a hugetlbfs file (a memfd), with its number; a segment's record carries the
/// IPC namespace `/proc/self/ns/ipc` names; nothing of another file system.
#[test]
fn the_task_iterators_tell_this_process_s_hugetlb_mappings_and_descriptors_as_proc_does() {
    use std::os::{
        fd::{AsRawFd, FromRawFd},
        unix::fs::MetadataExt,
    };

    use hugepage_agent::holders::{mounts::Dev, procs::maps_candidates};
    use hugepage_agent_common::tasks::{flags, kind};
    use hugepage_agent_tests::hugetlbfs::{Mapping, Mounted, Segment, open};

    const MI2: u64 = 2 << 20;
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let mount = Mounted::new(&lock, "pagesize=2M", None);
    let file = open(&mount.path("mapped"));
    let shared = Mapping::shared(&file, 2, MI2, 1, None);
    let private = Mapping::private_anonymous(1, MI2);
    let segment = Segment::touched(2, 1, None);
    // SAFETY: a NUL-terminated name; checked.
    let memfd = unsafe {
        let fd = libc::memfd_create(c"iterated".as_ptr(), libc::MFD_HUGETLB | libc::MFD_CLOEXEC);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        std::os::fd::OwnedFd::from_raw_fd(fd)
    };
    hugepage_agent_tests::hugetlbfs::fault_file(&memfd, 1, MI2, None);

    let (probes, _streams) = load();
    let tasks = probes
        .tasks
        .clone()
        .unwrap_or_else(|why| panic!("the task iterators on this kernel: {why}"));
    let records = tasks.read().expect("the iterators read");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    drop((shared, private));
    assert!(!records.truncated);
    let me = std::process::id();
    let mine: Vec<_> = records.held.iter().filter(|h| h.tgid == me).collect();

    let mount_dev = Dev::from_st_dev(std::fs::metadata(&mount.dir).expect("the mount").dev());
    let from_proc = maps_candidates(&maps, |d| d == mount_dev);
    let mut told: Vec<(u64, u64, Dev, u64, bool)> = mine
        .iter()
        .filter(|h| h.kind == kind::MAPPING)
        .map(|h| {
            (
                h.start,
                h.end,
                Dev::from_kernel(h.dev),
                h.ino,
                h.flags & flags::SHARED != 0,
            )
        })
        .collect();
    told.sort();
    told.dedup();
    let mut shown: Vec<(u64, u64, Dev, u64, bool)> = from_proc
        .iter()
        .map(|m| (m.start, m.end, m.dev, m.inode, m.shared))
        .collect();
    shown.sort();
    assert_eq!(
        told, shown,
        "the iterator's mappings are maps' hugetlb lines: {maps}"
    );
    assert_eq!(told.len(), 3, "the file, the segment, the private mapping");

    let file_ino = std::fs::metadata(mount.path("mapped"))
        .expect("the file")
        .ino();
    let f = mine
        .iter()
        .find(|h| h.kind == kind::MAPPING && h.ino == file_ino)
        .expect("the file's mapping");
    assert_eq!(
        (f.page_size, f.held_bytes),
        (MI2, MI2),
        "one page written of two"
    );
    assert_eq!(&f.name[..7], b"mapped\0");
    let s = mine
        .iter()
        .find(|h| h.kind == kind::MAPPING && h.flags & flags::SYSV != 0)
        .expect("the segment's mapping");
    assert_eq!(s.ino, u64::try_from(segment.id).expect("a shmid"));
    let ns = std::fs::read_link("/proc/self/ns/ipc").expect("ns/ipc");
    assert_eq!(ns.to_string_lossy(), format!("ipc:[{}]", s.ipc_ns));

    let fds: Vec<_> = mine.iter().filter(|h| h.kind == kind::DESCRIPTOR).collect();
    let m = fds
        .iter()
        .find(|h| i32::try_from(h.fd).ok() == Some(memfd.as_raw_fd()))
        .unwrap_or_else(|| panic!("the memfd among {fds:?}"));
    assert_eq!((m.page_size, m.held_bytes), (MI2, MI2));
    assert!(m.name.starts_with(b"memfd:iterated"));
    assert!(
        fds.iter()
            .any(|h| i32::try_from(h.fd).ok() == Some(file.as_raw_fd())),
        "the mount's file held open"
    );
    assert_eq!(
        fds.len(),
        2,
        "no descriptor of another file system: {fds:?}"
    );
}
