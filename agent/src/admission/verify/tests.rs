use std::fs;

use super::*;
use crate::sysfs::fake;

const MI2: PageSize = PageSize(2 << 20);
const GI1: PageSize = PageSize(1 << 30);

/// A host with `nodes` NUMA nodes; `free[(node, size)]` pages free; `resv[size]` reserved.
struct Tree {
    _dir: tempfile::TempDir,
    host: HostFs,
}

fn tree(free: &[(u32, PageSize, u64)], resv: &[(PageSize, u64)]) -> Tree {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |path: String, value: u64| fake::write(dir.path(), &path, &format!("{value}\n"));
    for &(node, size, pages) in free {
        write(
            format!(
                "/sys/devices/system/node/node{node}/hugepages/{}/free_hugepages",
                size.dir_name()
            ),
            pages,
        );
        write(
            format!(
                "/sys/devices/system/node/node{node}/hugepages/{}/nr_hugepages",
                size.dir_name()
            ),
            pages,
        );
    }
    for &(size, pages) in resv {
        write(
            format!(
                "/sys/kernel/mm/hugepages/{}/resv_hugepages",
                size.dir_name()
            ),
            pages,
        );
    }
    let host = HostFs::new(dir.path());
    Tree { _dir: dir, host }
}

fn settings(mode: Mode, on_sysfs_error: OnSysfsError) -> Settings {
    Settings {
        gate: Gate::On,
        mode,
        on_sysfs_error,
    }
}

fn nodes(ids: &[u32]) -> Vec<NumaNode> {
    ids.iter().map(|&n| NumaNode(n)).collect()
}

fn verify(t: &Tree, request: &[(PageSize, u64)], on: &[u32], mode: Mode) -> Verdict {
    let verifier = Verifier::new(t.host.clone()).expect("verifier");
    let request: Hugepages = request.iter().copied().collect();
    verifier
        .verify(&request, &nodes(on), settings(mode, OnSysfsError::Admit))
        .expect("valid request")
}

const GI: u64 = 1 << 30;
/// 2 MiB pages in `gib` GiB.
fn pages_2m(gib: u64) -> u64 {
    gib * 512
}

#[test]
fn kep_examples() {
    struct Case {
        name: &'static str,
        free: Vec<(u32, PageSize, u64)>,
        request: Vec<(PageSize, u64)>,
        on: Vec<u32>,
        message: Option<&'static str>,
    }
    let cases = [
        Case {
            name: "Story 1: a Burstable pod took the 1Gi pages the Memory Manager thinks are free",
            free: vec![(0, GI1, 0), (1, GI1, 0), (0, MI2, 512)],
            request: vec![(GI1, 2 * GI)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-1Gi on NUMA node(s) [0]: requested 2Gi, available 0",
            ),
        },
        Case {
            name: "Story 2: of 8GB of 2MB pages, Job C holds 4GB; Job B asks 6Gi",
            free: vec![(0, MI2, pages_2m(2)), (1, MI2, pages_2m(2))],
            request: vec![(MI2, 6 * GI)],
            on: vec![0, 1],
            message: Some(
                "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 6Gi, available 4Gi",
            ),
        },
        Case {
            name: "Story 2, once Job C has finished",
            free: vec![(0, MI2, pages_2m(4)), (1, MI2, pages_2m(4))],
            request: vec![(MI2, 6 * GI)],
            on: vec![0, 1],
            message: None,
        },
        Case {
            name: "error message format example",
            free: vec![(0, MI2, pages_2m(2)), (1, MI2, pages_2m(8))],
            request: vec![(MI2, 4 * GI)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 4Gi, available 2Gi",
            ),
        },
        Case {
            name: "single-numa-node: NUMA0 has 2GB free, 2GB asked, NUMA0 selected",
            free: vec![(0, MI2, pages_2m(2)), (1, MI2, pages_2m(3))],
            request: vec![(MI2, 2 * GI)],
            on: vec![0],
            message: None,
        },
        Case {
            name: "single-numa-node: 1GB on each node is not 2GB on one",
            free: vec![(0, MI2, pages_2m(1)), (1, MI2, pages_2m(1))],
            request: vec![(MI2, 2 * GI)],
            on: vec![1],
            message: Some(
                "insufficient hugepages-2Mi on NUMA node(s) [1]: requested 2Gi, available 1Gi",
            ),
        },
        Case {
            name: "the aggregate over both nodes is what makes it misleading",
            free: vec![(0, MI2, pages_2m(1)), (1, MI2, pages_2m(1))],
            request: vec![(MI2, 2 * GI)],
            on: vec![0, 1],
            message: None,
        },
        Case {
            name: "several sizes: the first short one is reported",
            free: vec![(0, MI2, pages_2m(1)), (0, GI1, 1)],
            request: vec![(MI2, 2 * GI), (GI1, 2 * GI)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 2Gi, available 1Gi",
            ),
        },
        Case {
            name: "a size the node does not have counts as none free there",
            free: vec![(0, MI2, 512), (1, GI1, 4)],
            request: vec![(GI1, GI)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-1Gi on NUMA node(s) [0]: requested 1Gi, available 0",
            ),
        },
        Case {
            name: "a size no node has",
            free: vec![(0, MI2, 512)],
            request: vec![(PageSize(16 << 30), 16 * GI)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-16Gi on NUMA node(s) [0]: requested 16Gi, available 0",
            ),
        },
        Case {
            name: "exactly enough is enough",
            free: vec![(0, MI2, 3)],
            request: vec![(MI2, 6 << 20)],
            on: vec![0],
            message: None,
        },
        Case {
            name: "quantities without a whole binary suffix print as bytes",
            free: vec![(0, MI2, 1)],
            request: vec![(MI2, 6 << 20)],
            on: vec![0],
            message: Some(
                "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 6Mi, available 2Mi",
            ),
        },
    ];
    for case in cases {
        let t = tree(&case.free, &[]);
        let verdict = verify(&t, &case.request, &case.on, Mode::Kep);
        assert_eq!(verdict.message.as_deref(), case.message, "{}", case.name);
        assert_eq!(verdict.allowed, case.message.is_none(), "{}", case.name);
        assert_eq!(
            verdict.reason,
            case.message.map(|_| REASON),
            "{}",
            case.name
        );
        assert_eq!(verdict.checks.len(), case.request.len(), "{}", case.name);
    }
}

#[test]
fn strict_does_not_count_reserved_untouched_pages_and_kep_does() {
    // 16 pages free on the only node, 4 of them reserved by a mapping that has not faulted them.
    let t = tree(&[(0, MI2, 16)], &[(MI2, 4)]);
    let request = [(MI2, 16 * (2 << 20))];
    let kep = verify(&t, &request, &[0], Mode::Kep);
    assert!(kep.allowed);
    let strict = verify(&t, &request, &[0], Mode::Strict);
    assert_eq!(
        strict.message.as_deref(),
        Some("insufficient hugepages-2Mi on NUMA node(s) [0]: requested 32Mi, available 24Mi")
    );
    let check = &strict.checks[0];
    assert_eq!(
        (check.free_bytes, check.unreserved_bytes),
        (32 << 20, 24 << 20),
        "both numbers reported"
    );
    assert_eq!(kep.checks[0].unreserved_bytes, 24 << 20);
}

#[test]
fn strict_never_goes_below_zero() {
    let t = tree(&[(0, MI2, 2), (1, MI2, 10)], &[(MI2, 5)]);
    let verdict = verify(&t, &[(MI2, 2 << 20)], &[0], Mode::Strict);
    assert_eq!(verdict.checks[0].unreserved_bytes, 0);
    assert!(!verdict.allowed);
}

#[test]
fn unknown_or_missing_nodes_are_bad_input() {
    let t = tree(&[(0, MI2, 4), (1, MI2, 4)], &[]);
    let verifier = Verifier::new(t.host.clone()).expect("verifier");
    let request = Hugepages::from([(MI2, 2 << 20)]);
    let err = verifier
        .verify(
            &request,
            &nodes(&[0, 3]),
            settings(Mode::Kep, OnSysfsError::Admit),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "NUMA node 3 does not exist on this host (nodes: [0, 1])"
    );
    assert_eq!(
        verifier.verify(&request, &[], settings(Mode::Kep, OnSysfsError::Admit)),
        Err(VerifyError::NoNodes)
    );
}

#[test]
fn an_unreadable_file_admits_or_rejects_as_configured_and_is_counted() {
    let t = tree(&[(0, MI2, 4)], &[]);
    let file = t
        .host
        .path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages");
    fs::write(&file, "garbage\n").expect("write");
    let verifier = Verifier::new(t.host.clone()).expect("verifier");
    let request = Hugepages::from([(MI2, 2 << 20)]);
    let admitted = verifier
        .verify(
            &request,
            &nodes(&[0]),
            settings(Mode::Kep, OnSysfsError::Admit),
        )
        .expect("verify");
    assert!(admitted.allowed);
    assert!(
        admitted.checks[0]
            .unverified
            .as_deref()
            .is_some_and(|e| e.contains("free_hugepages")),
        "{admitted:?}"
    );
    let rejected = verifier
        .verify(
            &request,
            &nodes(&[0]),
            settings(Mode::Kep, OnSysfsError::Reject),
        )
        .expect("verify");
    assert!(!rejected.allowed);
    assert_eq!(rejected.reason, Some(REASON_UNREADABLE));
    assert!(
        rejected
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("cannot verify hugepages-2Mi on NUMA node(s) [0]: "))
    );
    assert_eq!(verifier.sysfs_errors(), 2);
}

#[test]
fn each_read_is_fresh_even_through_a_kept_descriptor() {
    let t = tree(&[(0, MI2, 4)], &[]);
    let verifier = Verifier::new(t.host.clone()).expect("verifier");
    let request = Hugepages::from([(MI2, 8 << 20)]);
    assert!(
        verifier
            .verify(
                &request,
                &nodes(&[0]),
                settings(Mode::Kep, OnSysfsError::Admit)
            )
            .expect("verify")
            .allowed
    );
    let file = t
        .host
        .path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages");
    fs::write(&file, "1\n").expect("write");
    let verdict = verifier
        .verify(
            &request,
            &nodes(&[0]),
            settings(Mode::Kep, OnSysfsError::Admit),
        )
        .expect("verify");
    assert_eq!(verdict.checks[0].free_bytes, 2 << 20);
}

#[test]
fn a_machine_without_numa_directories_is_node_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("sys/kernel/mm/hugepages/hugepages-2048kB");
    fs::create_dir_all(&d).expect("mkdir");
    fs::write(d.join("free_hugepages"), "3\n").expect("write");
    fs::write(d.join("resv_hugepages"), "0\n").expect("write");
    let verifier = Verifier::new(HostFs::new(dir.path())).expect("verifier");
    assert_eq!(verifier.nodes(), nodes(&[0]));
    let verdict = verifier
        .verify(
            &Hugepages::from([(MI2, 8 << 20)]),
            &nodes(&[0]),
            settings(Mode::Kep, OnSysfsError::Admit),
        )
        .expect("verify");
    assert_eq!(
        verdict.message.as_deref(),
        Some("insufficient hugepages-2Mi on NUMA node(s) [0]: requested 8Mi, available 6Mi")
    );
}

#[test]
fn with_the_gate_off_nothing_is_read_and_the_answer_says_so() {
    let t = tree(&[(0, MI2, 0)], &[]);
    let verifier = Verifier::new(t.host.clone()).expect("verifier");
    let request = Hugepages::from([(MI2, 4 * GI)]);
    let off = Settings {
        gate: Gate::Off,
        ..settings(Mode::Kep, OnSysfsError::Reject)
    };
    let verdict = verifier
        .verify(&request, &nodes(&[0]), off)
        .expect("valid request");
    assert!(verdict.allowed && verdict.checks.is_empty(), "{verdict:?}");
    assert_eq!(verdict.message.as_deref(), Some(GATE_OFF));
    assert_eq!(
        verifier.verify(&request, &nodes(&[5]), off).map(|_| ()),
        Err(VerifyError::UnknownNode {
            node: 5,
            known: vec![0]
        }),
        "the nodes are still validated"
    );
}

#[test]
fn counters_parse_as_sysfs_prints_them_and_nothing_else() {
    assert_eq!(parse_counter(b"1024\n"), Some(1024));
    assert_eq!(parse_counter(b"0"), Some(0));
    assert_eq!(parse_counter(b"18446744073709551615\n"), Some(u64::MAX));
    for bad in [
        &b""[..],
        b"\n",
        b"-1\n",
        b"12a\n",
        b"1 2\n",
        b"18446744073709551616",
    ] {
        assert_eq!(
            parse_counter(bad),
            None,
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}
