//! The map watch (`GET /v1/hugepages?watch=true`) on the real kernel, over a real socket: a real
//! agent with its probes loaded, a real hugepage pool, a toucher faulting real pages in a cgroup
//! of its own, and the stream read as any HTTP/1.1 client reads it (chunked transfer coding,
//! one JSON event a line). What a watcher must see: the state first, then a new state of its
//! node after the hugetlb faults (with how long after them), a reservation made by an admission
//! as it is made, heartbeats between; a resume that is up to date gets no snapshot; watchers
//! beyond `--max-watchers` are refused with 503 and `Retry-After`.

use std::time::{Duration, Instant};

use hugepage_agent_tests::{
    Agent, HugepagePool, TestCgroup, Toucher, agent_bin, host_lock, http, probed_agent,
    require_root, watcher::Watch,
};
use serde_json::{Value, json};

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const MI2: u64 = 2 << 20;

/// This host's agent with its probes ([`probed_agent`]), reservations held an hour, and
/// `extra`.
fn agent(extra: &[&str]) -> Agent {
    let mut flags = vec!["--reservation-ttl", "1h"];
    flags.extend_from_slice(extra);
    probed_agent(&agent_bin(), &flags)
}

/// The 2 MiB size on node 0 of a state event.
fn node0(event: &Value) -> &Value {
    event["object"]["nodes"][0]["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .find(|s| s["pageSizeBytes"] == MI2)
        .expect("the 2 MiB size")
}

#[test]
fn a_fault_and_a_reservation_reach_a_watcher_as_new_states_of_their_node() {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let cgroup = TestCgroup::create(&lock, "watch");
    let running = agent(&["--watch-heartbeat", "1s"]);
    let mut watch = Watch::open(running.port, "watch=true");
    assert_eq!(watch.status, 200);
    assert_eq!(watch.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(watch.header("transfer-encoding"), Some("chunked"));
    let first = watch.next(Duration::from_secs(5)).expect("a snapshot");
    assert_eq!(first["type"], "SNAPSHOT", "{first}");
    assert_eq!(first["object"]["source"], "ebpf+sysfs", "{first}");
    let free = node0(&first)["free"].as_u64().expect("free");
    assert!(free >= 8, "{first}");

    // Three pages faulted: the node's state follows, prompted by the faults alone.
    let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 3, 16);
    let touched = Instant::now();
    let shown = loop {
        let event = watch.next_state(Duration::from_secs(5));
        assert_eq!(event["type"], "MODIFIED", "{event}");
        if node0(&event)["free"] == free - 3 {
            break event;
        }
    };
    let after = touched.elapsed();
    assert_eq!(
        node0(&shown)["unreservedBytes"],
        (free - 3) * MI2,
        "{shown}"
    );
    eprintln!(
        "three faulted pages shown to the watcher {:.1} ms after the toucher returned",
        after.as_secs_f64() * 1000.0
    );

    // An admission reserves 4 MiB on node 0: the state says so as the admission is answered.
    let body = json!({
        "pod": {"namespace": "default", "name": "watched", "uid": "3a000000-0000-4000-8000-00000000003a", "qosClass": "Guaranteed"},
        "containers": [{"name": "main", "resources": {"hugepages-2Mi": "4Mi", "memory": "64Mi"}}],
        "numaNodes": [0]
    });
    let (status, answer) = http(
        running.port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        &body.to_string(),
    );
    assert_eq!(status, 200, "{answer}");
    let reserved = watch.next_state(Duration::from_secs(3));
    assert_eq!(node0(&reserved)["reservedByAgent"], 2 * MI2, "{reserved}");
    assert_eq!(
        node0(&reserved)["unreservedBytes"],
        (free - 3) * MI2 - 2 * MI2,
        "{reserved}"
    );
    assert!(reserved["generation"].as_u64() > shown["generation"].as_u64());

    // Nothing more: heartbeats, each with the generation of the state last sent.
    let beat = watch.next(Duration::from_secs(3)).expect("a heartbeat");
    assert_eq!(beat["type"], "BOOKMARK", "{beat}");
    assert_eq!(beat["generation"], reserved["generation"]);
    drop(toucher);
}

#[test]
fn watchers_are_bounded_and_one_that_resumes_up_to_date_gets_no_snapshot() {
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let running = agent(&["--max-watchers", "1", "--watch-heartbeat", "300ms"]);
    let mut only = Watch::open(running.port, "watch=true");
    let first = only.next(Duration::from_secs(5)).expect("a snapshot");
    assert_eq!(first["type"], "SNAPSHOT", "{first}");
    // The last state sent before the stream went quiet (a heartbeat): the agent's first reads
    // (its kubelet's settings among them) may follow the snapshot, and each is a new state.
    let mut last = first;
    let settled = Instant::now() + Duration::from_secs(5);
    loop {
        let event = only.next(Duration::from_secs(3)).expect("an event");
        if event["type"] == "BOOKMARK" {
            assert_eq!(event["generation"], last["generation"], "{event}");
            break;
        }
        assert!(Instant::now() < settled, "no heartbeat: {event}");
        last = event;
    }
    let refused = Watch::open(running.port, "watch=true");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    drop(only);
    // The slot is free once the agent saw the watcher go (its next write fails).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut resumed = loop {
        let query = format!(
            "watch=true&epoch={}&generation={}",
            last["epoch"].as_str().expect("an epoch"),
            last["generation"]
        );
        let watch = Watch::open(running.port, &query);
        if watch.status == 200 {
            break watch;
        }
        assert!(Instant::now() < deadline, "the slot was not freed");
        std::thread::sleep(Duration::from_millis(100));
    };
    let next = resumed.next(Duration::from_secs(3)).expect("an event");
    assert_eq!(next["type"], "BOOKMARK", "an up-to-date resume: {next}");
    let (status, problem) = http(
        running.port,
        "GET",
        "/v1/hugepages?watch=true&generation=last",
        None,
        "",
    );
    assert_eq!(status, 400, "{problem}");
    assert!(problem.contains("\"field\":\"generation\""), "{problem}");
}
