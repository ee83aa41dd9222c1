//! The map watch (`GET /v1/hugepages?watch=true`) on the real kernel, over a real socket: a real
//! agent with its probes loaded, a real hugepage pool, a toucher faulting real pages in a cgroup
//! of its own, and the stream read as any HTTP/1.1 client reads it (chunked transfer coding,
//! one JSON event a line). What a watcher must see: the state first, then a new state of its
//! node after the hugetlb faults (with how long after them), a reservation made by an admission
//! as it is made, heartbeats between; a resume that is up to date gets no snapshot; watchers
//! beyond `--max-watchers` are refused with 503 and `Retry-After`.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::Command,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, HugepagePool, TestCgroup, Toucher, agent_bin, host_lock, http, require_root,
};
use serde_json::{Value, json};

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const MI2: u64 = 2 << 20;

/// The agent on this host with its probes (faults prompt the map), no reconcile while a test
/// runs (a change must come from the faults), and `extra`.
fn agent(extra: &[&str]) -> Agent {
    let mut cmd = Command::new(agent_bin());
    cmd.args([
        "run",
        "--ebpf",
        "on",
        "--reconcile-interval",
        "1h",
        "--reservation-ttl",
        "1h",
    ]);
    cmd.args(extra);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(30), |_| true);
    agent
}

/// A watch's response read off the socket: its status, then its events.
struct Watch {
    status: u16,
    headers: Vec<String>,
    reader: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl Watch {
    fn open(port: u16, query: &str) -> Watch {
        let mut tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            tcp,
            "GET /v1/hugepages?{query} HTTP/1.1\r\nHost: agent\r\nAccept: application/json\r\n\r\n"
        )
        .expect("send the request");
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        let mut reader = BufReader::new(tcp);
        let mut line = String::new();
        reader.read_line(&mut line).expect("the status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).expect("a header");
            if header.trim().is_empty() {
                break;
            }
            headers.push(header.trim().to_ascii_lowercase());
        }
        Watch {
            status,
            headers,
            reader,
            pending: Vec::new(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find_map(|h| h.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }

    /// The next event, within `within`; `None` when the stream ended.
    fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                return Some(serde_json::from_slice(&line).expect("a JSON event"));
            }
            assert!(Instant::now() < deadline, "no event within {within:?}");
            // One chunk: its size in hex, the data, CRLF; a size of 0 ends the body.
            let mut size = String::new();
            self.reader.read_line(&mut size).expect("a chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
            if size == 0 {
                return None;
            }
            let mut data = vec![0; size + 2];
            self.reader.read_exact(&mut data).expect("a chunk");
            self.pending.extend_from_slice(&data[..size]);
        }
    }

    /// The next event that is not a heartbeat.
    fn next_state(&mut self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = self.next(left).expect("the stream goes on");
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }
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
    assert_eq!(first["type"], "SNAPSHOT");
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
            first["epoch"].as_str().expect("an epoch"),
            first["generation"]
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
