//! `hugepage-agent webhook` as a kube-scheduler extender, for real: node agents are real
//! `hugepage-agent run` processes, each on a loopback address of its own (`127.0.0.2`,
//! `127.0.0.3`, … as the Nodes' `InternalIP`s), all on one port (`--agent-port`), each with its
//! own `--host-root` tree and TLS requiring client certificates; the webhook is a real process
//! serving HTTPS and calling them over mTLS with certificates made here. Nothing else stands in.
//!
//! The `ExtenderArgs` documents are written as kube-scheduler sends them with
//! `nodeCacheCapable: false`: its `HTTPExtender.send` (`pkg/scheduler/extender.go`) marshals
//! `extenderv1.ExtenderArgs{Pod, Nodes: &v1.NodeList{Items}}` with `encoding/json`, so the keys
//! are the JSON tags of `k8s.io/kube-scheduler/extender/v1` (`pod`, `nodes`; `nodenames` left
//! out) and of `k8s.io/api/core/v1` (a `NodeList` is `{"metadata":{},"items":[…]}`, a Node's
//! `status.addresses` and `status.allocatable`, a pending pod's `status.qosClass`).
//!
//! The transport is checked as the peers see it: the webhook's connections to an agent in the
//! kernel's `/proc/net/tcp`, its client files rotated under it, HTTP/2 by a hyper client that
//! negotiated `h2` (`https.rs`), and its spans and the agent's in the real OTLP receiver.
//!
//! Every process and file belongs to one test and goes when it ends, however it ends (the
//! processes are killed on drop, the trees are temporary directories). The certificates, the
//! agents, the webhook and the Node and pod JSON come from `cluster.rs`, which the extender
//! benchmark shares.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use base64::Engine;
use hugepage_agent_tests::{
    Agent, HugepagePool, HugetlbController, TestCgroup, Toucher, agent_bin,
    apiserver::StandInApiServer,
    cluster::{
        self, Pki, WEBHOOK_NAME, agent_command, args, binding_review, call, connection, get,
        host_tree, host_tree_of, metrics, node, pod, pod_as, sample, start_agent,
        tree_agent_command, validate,
    },
    free_port, fresh_state_dir, host_lock,
    https::Https,
    mtls::{self, Ca, Versions},
    peers::OtlpReceiver,
    pod_cgroups, require_root,
};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use rustls_pki_types::{PrivateKeyDer, pem::PemObject};
use serde_json::{Value, json};

/// A node agent on `ip`:`port` over `tree` (see [`cluster::tree_agent_command`]).
fn agent(pki: &Pki, tree: &Path, ip: Ipv4Addr, port: u16) -> Agent {
    agent_with(pki, tree, ip, port, &[])
}

/// [`agent`] with the `OTEL_*` variables of `env` (none other set).
fn agent_with(pki: &Pki, tree: &Path, ip: Ipv4Addr, port: u16, env: &[(&str, &str)]) -> Agent {
    let cmd = tree_agent_command(&agent_bin(), pki, tree, env);
    start_agent(cmd, ip, port, |_| true)
}

/// The webhook calling agents on `port` under `policy` and `timeout` (see [`cluster::webhook`]).
fn webhook(pki: &Pki, api: &StandInApiServer, port: u16, policy: &str, timeout: &str) -> Agent {
    cluster::webhook(&agent_bin(), pki, api, port, policy, timeout, &[])
}

/// Waits until the webhook's Node cache has synced.
fn wait_ready(pki: &Pki, webhook: &Agent) {
    cluster::wait_ready(pki, webhook, Duration::from_secs(20));
}

/// `hugepage_agent_webhook_admissions_total{verdict}` in `text` is each `(verdict, count)`.
fn expect_admissions(text: &str, expected: &[(&str, f64)]) {
    for (verdict, n) in expected {
        let series = format!("hugepage_agent_webhook_admissions_total{{verdict=\"{verdict}\"}}");
        assert_eq!(sample(text, &series), Some(*n), "{series} in\n{text}");
    }
}

fn names(result: &Value) -> Vec<&str> {
    result["nodes"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect()
}

/// Five nodes: `roomy` (4 GiB free per NUMA node), `exact` (2 GiB free each), `taken` (1 GiB
/// free each: a Burstable consumer holds the rest), `small` (1 GiB allocatable: never asked),
/// `down` (no agent).
struct Cluster {
    pki: Pki,
    /// The stand-in API server, holding the five Nodes.
    api: StandInApiServer,
    port: u16,
    _trees: Vec<tempfile::TempDir>,
    _agents: Vec<Agent>,
    nodes: Vec<Value>,
}

fn cluster() -> Cluster {
    let pki = Pki::new();
    let port = free_port();
    let ip = |last| Ipv4Addr::new(127, 0, 0, last);
    let mut trees = Vec::new();
    let mut agents = Vec::new();
    for (last, free) in [(2, 2048), (3, 1024), (4, 512)] {
        let tree = host_tree(free);
        agents.push(agent(&pki, tree.path(), ip(last), port));
        trees.push(tree);
    }
    let nodes = vec![
        node("roomy", ip(2), "8Gi"),
        node("exact", ip(3), "8Gi"),
        node("taken", ip(4), "8Gi"),
        node("small", ip(5), "1Gi"),
        node("down", ip(6), "8Gi"),
    ];
    let api = StandInApiServer::start();
    for n in &nodes {
        api.put_node(n.clone());
    }
    Cluster {
        pki,
        api,
        port,
        _trees: trees,
        _agents: agents,
        nodes,
    }
}

#[test]
fn filter_keeps_the_nodes_whose_agents_admit_and_fails_the_others_with_the_agents_message() {
    let c = cluster();
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    wait_ready(&c.pki, &webhook);
    let (status, result) = call(
        &c.pki,
        &webhook,
        "/scheduler/filter",
        &args(pod(Some("2Gi")), &c.nodes),
    );
    assert_eq!(status, 200, "{result}");
    assert_eq!(names(&result), ["roomy", "exact", "down"], "{result}");
    assert_eq!(result["nodes"]["metadata"], json!({}), "the list as sent");
    assert_eq!(
        result["nodes"]["items"][0], c.nodes[0],
        "the Node objects as sent"
    );
    assert_eq!(
        result["failedNodes"],
        json!({"taken": "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 2Gi, available 1Gi"}),
        "{result}"
    );
    assert_eq!(
        result["failedAndUnresolvableNodes"],
        json!({"small": "the node's allocatable hugepages-2Mi is 1Gi, less than the pod's 2Gi: preemption cannot help"}),
        "{result}"
    );
    assert!(result.get("error").is_none(), "{result}");
    assert!(
        result.get("nodenames").is_none(),
        "answered in its own form"
    );
    let text = metrics(&c.pki, &webhook);
    for (series, value) in [
        (
            r#"hugepage_agent_webhook_calls_total{endpoint="filter",result="answered"}"#,
            1.0,
        ),
        (r#"hugepage_agent_webhook_nodes_total{judged="fit"}"#, 2.0),
        (
            r#"hugepage_agent_webhook_nodes_total{judged="misfit"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_nodes_total{judged="unresolvable"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_nodes_total{judged="no_answer"}"#,
            1.0,
        ),
        ("hugepage_agent_webhook_fail_open_total", 1.0),
        ("hugepage_agent_webhook_fail_closed_total", 0.0),
        ("hugepage_agent_webhook_agent_call_seconds_count", 4.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
}

#[test]
fn prioritize_puts_the_roomiest_single_numa_fit_first() {
    let c = cluster();
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    wait_ready(&c.pki, &webhook);
    let (status, list) = call(
        &c.pki,
        &webhook,
        "/scheduler/prioritize",
        &args(pod(Some("2Gi")), &c.nodes),
    );
    assert_eq!(status, 200, "{list}");
    // roomy: one NUMA node, 2 of 4 GiB spare: 6 + floor(4 × 0.5) = 8; exact: no spare, 6.
    assert_eq!(
        list,
        json!([
            {"host": "roomy", "score": 8},
            {"host": "exact", "score": 6},
            {"host": "taken", "score": 0},
            {"host": "small", "score": 0},
            {"host": "down", "score": 0}
        ])
    );
}

/// A listener thread of the test's own, stopped and joined when dropped (whatever way the test
/// ends), so that nothing it bound outlives the test.
struct Stand {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Connections accepted.
    accepted: Arc<AtomicUsize>,
}

impl Stand {
    /// Accepts on `ip`:`port`, handing each connection to `serve` (which may keep it).
    fn start(ip: Ipv4Addr, port: u16, mut serve: impl FnMut(TcpStream) + Send + 'static) -> Stand {
        let listener = TcpListener::bind((ip, port)).expect("bind a stand-in listener");
        let addr = listener.local_addr().expect("its address");
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (stopping, count) = (stop.clone(), accepted.clone());
        let thread = std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                count.fetch_add(1, Ordering::SeqCst);
                serve(tcp);
            }
        });
        Stand {
            addr,
            stop,
            thread: Some(thread),
            accepted,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Stand {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept so that the thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// On `ip`:`port`, something that accepts and never answers (it keeps every connection open).
fn silent_listener(ip: Ipv4Addr, port: u16) -> Stand {
    let mut held = Vec::new();
    Stand::start(ip, port, move |tcp| held.push(tcp))
}

/// On `ip`:`port`, something that completes the TLS handshake with the agents' certificate and
/// answers every request with 200 and a body that is not a verdict.
fn garbage_agent(pki: &Pki, ip: Ipv4Addr, port: u16) -> Stand {
    let key = PrivateKeyDer::from_pem_slice(pki.agent.key.as_bytes()).expect("the key PEM");
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_no_client_auth()
            .with_single_cert(vec![pki.agent.der()], key)
            .expect("a server config");
    let config = Arc::new(config);
    Stand::start(ip, port, move |tcp| {
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("a read timeout");
        answer_garbage(config.clone(), tcp);
    })
}

/// Reads one request (headers and `content-length` bytes) and answers it with garbage.
fn answer_garbage(config: Arc<ServerConfig>, tcp: TcpStream) {
    let Ok(connection) = ServerConnection::new(config) else {
        return;
    };
    let mut stream = StreamOwned::new(connection, tcp);
    let mut read = Vec::new();
    let mut chunk = [0u8; 4096];
    let complete = |read: &[u8]| {
        let end = read.windows(4).position(|w| w == b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        (read.len() >= end + 4 + length).then_some(())
    };
    while complete(&read).is_none() {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => read.extend_from_slice(&chunk[..n]),
        }
    }
    let body = "<html>not a verdict</html>";
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}

#[test]
fn under_failure_policy_fail_a_silent_absent_or_garbled_agent_fails_its_node_within_the_deadline() {
    let pki = Pki::new();
    let port = free_port();
    let tree = host_tree(2048);
    let _agent = agent(&pki, tree.path(), Ipv4Addr::new(127, 0, 0, 12), port);
    let silent = silent_listener(Ipv4Addr::new(127, 0, 0, 13), port);
    let _garbage = garbage_agent(&pki, Ipv4Addr::new(127, 0, 0, 15), port);
    let nodes = [
        node("up", Ipv4Addr::new(127, 0, 0, 12), "8Gi"),
        node("silent", Ipv4Addr::new(127, 0, 0, 13), "8Gi"),
        node("down", Ipv4Addr::new(127, 0, 0, 14), "8Gi"),
        node("garbage", Ipv4Addr::new(127, 0, 0, 15), "8Gi"),
    ];
    let api = StandInApiServer::start();
    for n in &nodes {
        api.put_node(n.clone());
    }
    let webhook = webhook(&pki, &api, port, "fail", "500ms");
    wait_ready(&pki, &webhook);
    let started = Instant::now();
    let (status, result) = call(
        &pki,
        &webhook,
        "/scheduler/filter",
        &args(pod(Some("2Gi")), &nodes),
    );
    let took = started.elapsed();
    assert_eq!(status, 200, "{result}");
    assert_eq!(names(&result), ["up"], "{result}");
    assert!(
        took < Duration::from_secs(2),
        "one deadline for the call: {took:?}"
    );
    assert!(silent.accepted() >= 1, "the silent agent was called");
    let failed = &result["failedNodes"];
    assert!(
        failed["silent"].as_str().is_some_and(|m| m.starts_with(
            "hugepage verification unavailable (--failure-policy fail): agent at 127.0.0.13:"
        ) && m.ends_with("no answer within 500ms")),
        "{result}"
    );
    assert!(
        failed["down"]
            .as_str()
            .is_some_and(|m| m.contains("127.0.0.14") && m.contains("cannot connect")),
        "{result}"
    );
    assert!(
        failed["garbage"]
            .as_str()
            .is_some_and(|m| m.contains("127.0.0.15") && m.contains("the answer is not a verdict")),
        "{result}"
    );
    let text = metrics(&pki, &webhook);
    assert_eq!(
        sample(&text, "hugepage_agent_webhook_fail_closed_total"),
        Some(3.0),
        "{text}"
    );
}

#[test]
fn a_pod_without_hugepages_is_answered_with_every_node_and_no_agent_is_called() {
    let pki = Pki::new();
    let port = free_port();
    let watched = silent_listener(Ipv4Addr::new(127, 0, 0, 22), port);
    let nodes = [
        node("a", Ipv4Addr::new(127, 0, 0, 22), "8Gi"),
        node("b", Ipv4Addr::new(127, 0, 0, 22), "0"),
    ];
    let api = StandInApiServer::start();
    let webhook = webhook(&pki, &api, port, "fail", "2s");
    let (status, result) = call(
        &pki,
        &webhook,
        "/scheduler/filter",
        &args(pod(None), &nodes),
    );
    assert_eq!(status, 200, "{result}");
    assert_eq!(names(&result), ["a", "b"], "{result}");
    assert!(result.get("failedNodes").is_none(), "{result}");
    let by_name = json!({"pod": pod(None), "nodenames": ["a", "b"]});
    let (status, result) = call(&pki, &webhook, "/scheduler/filter", &by_name);
    assert_eq!((status, &result), (200, &json!({"nodenames": ["a", "b"]})));
    let (status, list) = call(
        &pki,
        &webhook,
        "/scheduler/prioritize",
        &args(pod(None), &nodes),
    );
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list,
        json!([{"host": "a", "score": 0}, {"host": "b", "score": 0}])
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(watched.accepted(), 0, "no agent was called");
}

#[test]
fn the_nodenames_form_is_answered_from_the_node_cache_in_its_own_form_and_bad_bodies_are_400() {
    let c = cluster();
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    wait_ready(&c.pki, &webhook);
    wait_ready(&c.pki, &webhook);
    let by_name = json!({
        "pod": pod(Some("2Gi")),
        "nodenames": ["roomy", "exact", "taken", "small", "down", "ghost"]
    });
    let (status, result) = call(&c.pki, &webhook, "/scheduler/filter", &by_name);
    assert_eq!(status, 200, "{result}");
    assert_eq!(
        result["nodenames"],
        json!(["roomy", "exact", "down"]),
        "{result}"
    );
    assert!(
        result.get("nodes").is_none(),
        "answered in its own form: {result}"
    );
    assert_eq!(
        result["failedNodes"],
        json!({
            "taken": "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 2Gi, available 1Gi",
            "ghost": "node ghost is not in the webhook's Node cache (the API server's list and watch of Nodes has not shown it)"
        }),
        "{result}"
    );
    assert_eq!(
        result["failedAndUnresolvableNodes"],
        json!({"small": "the node's allocatable hugepages-2Mi is 1Gi, less than the pod's 2Gi: preemption cannot help"}),
        "{result}"
    );
    let (status, list) = call(&c.pki, &webhook, "/scheduler/prioritize", &by_name);
    assert_eq!(status, 200, "{list}");
    assert_eq!(
        list,
        json!([
            {"host": "roomy", "score": 8},
            {"host": "exact", "score": 6},
            {"host": "taken", "score": 0},
            {"host": "small", "score": 0},
            {"host": "down", "score": 0},
            {"host": "ghost", "score": 0}
        ])
    );
    let text = metrics(&c.pki, &webhook);
    assert_eq!(
        sample(&text, "hugepage_agent_webhook_cached_nodes"),
        Some(5.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"hugepage_agent_webhook_nodes_total{judged="unknown"}"#
        ),
        Some(2.0),
        "{text}"
    );
    let (status, result) = call(
        &c.pki,
        &webhook,
        "/scheduler/filter",
        &json!(["not", "args"]),
    );
    assert_eq!(status, 400);
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the body is not ExtenderArgs JSON")),
        "{result}"
    );
}

/// The filter's answer for `names` with a pod of 2 GiB of 2 MiB pages.
fn filter_names(c: &Cluster, webhook: &Agent, names: &[&str]) -> Value {
    let by_name = json!({"pod": pod(Some("2Gi")), "nodenames": names});
    let (status, result) = call(&c.pki, webhook, "/scheduler/filter", &by_name);
    assert_eq!(status, 200, "{result}");
    result
}

/// Polls the filter for `names` until `holds` of its answer, up to 15 s.
fn until_filter(
    c: &Cluster,
    webhook: &Agent,
    names: &[&str],
    what: &str,
    holds: impl Fn(&Value) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let result = filter_names(c, webhook, names);
        if holds(&result) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never; last answer {result}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The lists of Nodes the stand-in has answered.
fn node_lists(api: &StandInApiServer) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/nodes") && !r.contains("watch=true"))
        .count()
}

#[test]
fn the_node_cache_follows_the_watch_through_its_ends_410s_and_address_changes_without_a_restart() {
    let c = cluster();
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    wait_ready(&c.pki, &webhook);
    wait_ready(&c.pki, &webhook);
    assert_eq!(node_lists(&c.api), 1, "{:?}", c.api.requests());
    let ip = |last| Ipv4Addr::new(127, 0, 0, last);
    let fits = |r: &Value| r["nodenames"] == json!(["late"]);
    let refused = |r: &Value| {
        r["failedNodes"]["late"]
            .as_str()
            .is_some_and(|m| m.starts_with("insufficient hugepages-2Mi"))
    };
    let unknown = |r: &Value| {
        r["failedNodes"]["late"]
            .as_str()
            .is_some_and(|m| m.contains("not in the webhook's Node cache"))
    };
    assert!(unknown(&filter_names(&c, &webhook, &["late"])));

    // A Node added while the webhook runs, then its address changed: the watch brings both.
    c.api.put_node(node("late", ip(2), "8Gi"));
    until_filter(
        &c,
        &webhook,
        &["late"],
        "the added Node on roomy's agent",
        fits,
    );
    c.api.put_node(node("late", ip(4), "8Gi"));
    until_filter(
        &c,
        &webhook,
        &["late"],
        "the Node moved to taken's agent",
        refused,
    );

    // The watch ended by the server: resumed from the last resourceVersion, no new list.
    c.api.end_watches();
    c.api.put_node(node("late", ip(2), "8Gi"));
    until_filter(
        &c,
        &webhook,
        &["late"],
        "a change after the watch ended",
        fits,
    );
    assert_eq!(
        node_lists(&c.api),
        1,
        "resumed, not listed again: {:?}",
        c.api.requests()
    );
    assert!(
        c.api
            .requests()
            .iter()
            .filter(|r| r.contains("watch=true"))
            .nth(1)
            .is_some_and(|r| r.contains("resourceVersion=") && !r.contains("resourceVersion=0&")),
        "the second watch resumes from a resourceVersion: {:?}",
        c.api.requests()
    );

    // History compacted: the resumed watch is told 410 Expired and the cache lists again.
    c.api.compact();
    c.api.end_watches();
    c.api.put_node(node("late", ip(4), "8Gi"));
    until_filter(
        &c,
        &webhook,
        &["late"],
        "a change after 410 Expired",
        refused,
    );
    assert_eq!(
        node_lists(&c.api),
        2,
        "listed again after 410: {:?}",
        c.api.requests()
    );

    // Watches answered 410 Gone outright (until a list): listed again; a deletion is then seen.
    c.api.gone_until_listed();
    c.api.end_watches();
    c.api.delete_node("late");
    until_filter(&c, &webhook, &["late"], "the deleted Node", unknown);
    assert_eq!(
        node_lists(&c.api),
        3,
        "listed again after 410 Gone: {:?}",
        c.api.requests()
    );

    let text = metrics(&c.pki, &webhook);
    assert_eq!(
        sample(&text, "hugepage_agent_webhook_cached_nodes"),
        Some(5.0),
        "{text}"
    );
    assert!(
        sample(&text, "hugepage_agent_webhook_node_watch_errors_total").is_some_and(|n| n >= 2.0),
        "{text}"
    );
}

#[test]
fn readyz_waits_for_the_node_cache_and_until_then_names_are_failed_as_not_synced() {
    let c = cluster();
    c.api.hold_lists(true);
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    let (status, body) = get(&c.pki, &webhook, "/readyz");
    assert_eq!(
        (status, &body),
        (
            503,
            &json!({"status": "not ready", "why": "the Node cache has not synced yet"})
        )
    );
    assert_eq!(get(&c.pki, &webhook, "/healthz").0, 200, "alive meanwhile");
    let result = filter_names(&c, &webhook, &["roomy"]);
    assert_eq!(
        result["failedNodes"]["roomy"],
        json!("node roomy: the webhook's Node cache has not synced yet"),
        "{result}"
    );
    c.api.hold_lists(false);
    wait_ready(&c.pki, &webhook);
    assert_eq!(
        filter_names(&c, &webhook, &["roomy"])["nodenames"],
        json!(["roomy"])
    );
}

/// KEP-5759's Story 2 across three nodes, end to end: the extender, then the binding.
///
/// * `busy` (a tree: two NUMA nodes of 64 MiB, a Burstable consumer holding half of each) is
///   filtered out with the KEP's message for NUMA nodes `[0,1]`;
/// * `wide` (a tree: two NUMA nodes of 64 MiB, all free) fits only across both NUMA nodes;
/// * `real` is this host: 128 MiB of 2 MiB pages on its one NUMA node, of which a Burstable
///   consumer (a child process in a pod cgroup) really holds 16 MiB.
///
/// The single-NUMA fit (`real`) is prioritized first; job B's binding there reserves on its
/// agent; job C's binding to the same node is denied with the exact message; dry runs never
/// reserve; once B's container has faulted its pages and exited, C's binding is admitted.
#[test]
fn story_2_across_three_nodes_filter_prioritize_bind_deny_and_admit_after_release() {
    const B: &str = "b1000000-0000-4000-8000-00000000000b";
    const C: &str = "c1000000-0000-4000-8000-00000000000c";
    const CONSUMER: &str = "d1000000-0000-4000-8000-00000000000d";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
    require_root();
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 64);
    let _controller = HugetlbController::enable(&lock);
    let pki = Pki::new();
    let port = free_port();
    let ip = |last| Ipv4Addr::new(127, 0, 0, last);

    let busy = host_tree_of(32, 16);
    let wide = host_tree_of(32, 32);
    let mut agents = Vec::new();
    for (tree, last) in [(&busy, 31), (&wide, 32)] {
        let mut cmd = agent_command(&agent_bin(), &pki, "best-effort", &[]);
        cmd.arg("--host-root")
            .arg(tree.path())
            .args(["--ebpf", "off"]);
        agents.push(start_agent(cmd, ip(last), port, |_| true));
    }
    let root = TestCgroup::create(&lock, "webhook-story2");
    let (_consumer_cgroup, consumer_dir) = pod_cgroups(
        &root,
        &["kubepods", "burstable", &format!("pod{CONSUMER}"), ID],
    );
    let _consumer = Toucher::run(TOUCHER, Some(&consumer_dir), 8, 0);
    let state = fresh_state_dir(0);
    let mut cmd = agent_command(&agent_bin(), &pki, "best-effort", &[]);
    cmd.args([
        "--ebpf",
        "on",
        "--reconcile-interval",
        "1h",
        "--reservation-ttl",
        "1h",
    ])
    .arg("--state-dir")
    .arg(state.path());
    let mut real = start_agent(cmd, ip(33), port, |l| l["source"] == "ebpf+sysfs");
    let free = hugepage_agent_tests::read_u64(
        "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages",
    );
    assert_eq!(free, 56, "64 pages, 8 held by the consumer");

    let api = StandInApiServer::start();
    for n in [
        node("busy", ip(31), "128Mi"),
        node("wide", ip(32), "128Mi"),
        node("real", ip(33), "128Mi"),
    ] {
        api.put_node(n);
    }
    let job_b = pod_as("job-b", B, Some("96Mi"));
    let job_c = pod_as("job-c", C, Some("96Mi"));
    api.put_pod(job_b.clone());
    api.put_pod(job_c.clone());
    let webhook = webhook(&pki, &api, port, "ignore", "2s");
    wait_ready(&pki, &webhook);

    // The scheduler's extender calls for job B.
    let by_name = json!({"pod": job_b, "nodenames": ["busy", "wide", "real"]});
    let (status, result) = call(&pki, &webhook, "/scheduler/filter", &by_name);
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["nodenames"], json!(["wide", "real"]), "{result}");
    assert_eq!(
        result["failedNodes"],
        json!({"busy": "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 96Mi, available 64Mi"}),
        "{result}"
    );
    let (status, list) = call(&pki, &webhook, "/scheduler/prioritize", &by_name);
    assert_eq!(status, 200, "{list}");
    // real: one NUMA node, 16 of 112 MiB spare: 6 + floor(4 × 0.14) = 6; wide: both NUMA
    // nodes, 32 of 128 MiB spare: 1 + 1 = 2.
    assert_eq!(
        list,
        json!([
            {"host": "busy", "score": 0},
            {"host": "wide", "score": 2},
            {"host": "real", "score": 6}
        ])
    );

    // Dry runs of both bindings are admitted and reserve nothing.
    for job in [&job_b, &job_c] {
        let response = validate(&pki, &webhook, &binding_review(job, "real", true));
        assert_eq!(response["allowed"], true, "{response}");
    }
    // B's binding reserves on real's agent; C's is then denied with the KEP's message.
    let response = validate(&pki, &webhook, &binding_review(&job_b, "real", false));
    assert_eq!(
        response,
        json!({"uid": "review-job-b-real-false", "allowed": true})
    );
    // The API server writes the binding (the webhook confirms B's reservation by it).
    let mut bound_b = job_b.clone();
    bound_b["spec"]["nodeName"] = json!("real");
    api.put_pod(bound_b);
    let reserved = std::fs::read_to_string(state.path().join("reservations.json"))
        .expect("the agent's reservations file");
    assert!(
        reserved.contains(B),
        "B's pages are reserved by its UID: {reserved}"
    );
    assert!(
        !reserved.contains(C),
        "the dry runs reserved nothing: {reserved}"
    );
    let denial = json!({
        "uid": "review-job-c-real-false",
        "allowed": false,
        "status": {
            "code": 403,
            "reason": "FailedHugepagesVerification",
            "message": "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 96Mi, available 16Mi"
        }
    });
    let response = validate(&pki, &webhook, &binding_review(&job_c, "real", false));
    assert_eq!(response, denial);

    // B's container faults its pages: the kernel shows them taken, the reservation ends; C is
    // still denied. B exits: its pages are free again and C's binding is admitted.
    let b_root = TestCgroup::create(&lock, "webhook-story2-b");
    let (_b_cgroup, container_b) = pod_cgroups(&b_root, &["kubepods", &format!("pod{B}"), ID]);
    let b_process = Toucher::run(TOUCHER, Some(&container_b), 48, 0);
    real.wait_for("reservation released", Duration::from_secs(5), |l| {
        l["pod_uid"] == B && l["reason"] == "Faulted"
    });
    let response = validate(&pki, &webhook, &binding_review(&job_c, "real", false));
    assert_eq!(response, denial);
    drop(b_process);
    let response = validate(&pki, &webhook, &binding_review(&job_c, "real", false));
    assert_eq!(response["allowed"], true, "{response}");

    let text = metrics(&pki, &webhook);
    expect_admissions(
        &text,
        &[("allowed", 4.0), ("denied", 2.0), ("fail_open", 0.0)],
    );
    drop(agents);
}

/// Everything the admission webhook is sent but should not judge is allowed at once; a pod
/// created on a node is judged; an agent that cannot be asked follows the failure policy with
/// a warning or a denial saying why; an unreadable review is a 400.
#[test]
fn admission_passes_what_is_not_its_business_and_follows_the_failure_policy_when_unverified() {
    let c = cluster();
    let open = webhook(&c.pki, &c.api, c.port, "ignore", "500ms");
    let closed = webhook(&c.pki, &c.api, c.port, "fail", "500ms");
    wait_ready(&c.pki, &open);
    wait_ready(&c.pki, &closed);
    let plain = pod_as("plain", "e1000000-0000-4000-8000-00000000000e", None);
    c.api.put_pod(plain.clone());
    let response = validate(&c.pki, &open, &binding_review(&plain, "taken", false));
    assert_eq!(response["allowed"], true, "no hugepages: {response}");

    // A pod created with spec.nodeName: judged on that node without a binding.
    let mut placed = pod_as(
        "placed",
        "f1000000-0000-4000-8000-00000000000f",
        Some("2Gi"),
    );
    placed["spec"]["nodeName"] = json!("taken");
    let review = |object: &Value, operation: &str| {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("review-{operation}"),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "telco",
                "operation": operation,
                "userInfo": {"username": "system:node:taken"},
                "object": object,
                "dryRun": false
            }
        })
    };
    let response = validate(&c.pki, &open, &review(&placed, "CREATE"));
    assert_eq!(
        response["status"]["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [0]: requested 2Gi, available 1Gi",
        "{response}"
    );
    let response = validate(&c.pki, &open, &review(&placed, "UPDATE"));
    assert_eq!(
        response["allowed"], true,
        "an update is not judged: {response}"
    );

    // The node `down` has no agent; the pod `missing` is not in the API.
    let job = pod_as("job", "a2000000-0000-4000-8000-00000000000a", Some("2Gi"));
    c.api.put_pod(job.clone());
    let response = validate(&c.pki, &open, &binding_review(&job, "down", false));
    assert_eq!(response["allowed"], true, "{response}");
    let warning = response["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.starts_with("hugepages not verified on node down (admitted under --failure-policy ignore): agent at 127.0.0.6:")
            && warning.contains("cannot connect"),
        "{response}"
    );
    let response = validate(&c.pki, &closed, &binding_review(&job, "down", false));
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 500, "{response}");
    assert!(
        response["status"]["message"].as_str().is_some_and(|m| m.starts_with(
            "hugepage verification unavailable on node down (--failure-policy fail): agent at 127.0.0.6:"
        )),
        "{response}"
    );
    let missing = pod_as(
        "missing",
        "a3000000-0000-4000-8000-00000000000a",
        Some("2Gi"),
    );
    // A pod the API does not have is denied whatever the policy: nothing to reserve for.
    let response = validate(&c.pki, &open, &binding_review(&missing, "roomy", false));
    assert_eq!(response["status"]["code"], 404, "{response}");
    assert!(
        response["status"]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("pod telco/missing does not exist in the API")),
        "{response}"
    );
    let response = validate(&c.pki, &open, &binding_review(&job, "ghost", false));
    assert!(
        response["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("node ghost is not in the webhook's Node cache")),
        "{response}"
    );

    let (status, answer) = call(
        &c.pki,
        &open,
        "/admission/validate",
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    );
    assert_eq!(
        (status, answer),
        (400, json!({"error": "the AdmissionReview has no request"}))
    );
    let text = metrics(&c.pki, &open);
    expect_admissions(
        &text,
        &[("not_checked", 2.0), ("denied", 1.0), ("fail_open", 2.0)],
    );
}

/// A pod `CREATE` as kube-apiserver sends it to a mutating webhook: the pod defaulted, no UID yet.
fn creation_review(pod: &Value) -> Value {
    let mut pod = pod.clone();
    if let Some(meta) = pod["metadata"].as_object_mut() {
        meta.remove("uid");
    }
    cluster::creation_review(&pod, "c0000000-0000-4000-8000-00000000000c", false)
}

/// The mutating webhook (component scheduler-by-default-webhook) over real HTTPS: a pod with
/// hugepages and the default scheduler gets the JSON patch naming the second scheduler, as
/// base64 in the review; one naming a scheduler, one without hugepages and one created on a node
/// are allowed unchanged; an unreadable review is a 400; every call is counted.
#[test]
fn a_pod_with_hugepages_and_no_scheduler_is_given_the_second_one_and_others_are_untouched() {
    let c = cluster();
    let hook = webhook(&c.pki, &c.api, c.port, "ignore", "500ms");
    wait_ready(&c.pki, &hook);
    let mutate = |pod: &Value| {
        let (status, answer) = call(&c.pki, &hook, "/admission/mutate", &creation_review(pod));
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
        assert_eq!(
            answer["response"]["uid"],
            "c0000000-0000-4000-8000-00000000000c"
        );
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        answer["response"].clone()
    };
    let huge = pod(Some("1Gi"));
    let response = mutate(&huge);
    assert_eq!(response["patchType"], "JSONPatch", "{response}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch: Value = serde_json::from_slice(&patch).expect("a JSON patch");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/schedulerName", "value": "hugepage-agent"}])
    );
    let mut named = huge.clone();
    named["spec"]["schedulerName"] = json!("volcano");
    let mut placed = huge.clone();
    placed["spec"]["nodeName"] = json!("roomy");
    for untouched in [named, placed, pod(None)] {
        let response = mutate(&untouched);
        assert!(
            response["patch"].is_null() && response["patchType"].is_null(),
            "{untouched}: {response}"
        );
    }
    let (status, answer) = call(
        &c.pki,
        &hook,
        "/admission/mutate",
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    );
    assert_eq!(
        (status, answer),
        (400, json!({"error": "the AdmissionReview has no request"}))
    );
    let text = metrics(&c.pki, &hook);
    for (result, n) in [("assigned", 1.0), ("untouched", 3.0), ("unreadable", 0.0)] {
        let series =
            format!("hugepage_agent_webhook_scheduler_assignments_total{{result=\"{result}\"}}");
        assert_eq!(sample(&text, &series), Some(n), "{series} in\n{text}");
    }
    for (result, n) in [("answered", 4.0), ("error", 1.0)] {
        let series = format!(
            "hugepage_agent_webhook_calls_total{{endpoint=\"mutate\",result=\"{result}\"}}"
        );
        assert_eq!(sample(&text, &series), Some(n), "{series} in\n{text}");
    }
}

#[test]
fn a_serving_certificate_rotated_mid_run_reaches_new_connections_without_a_restart() {
    let c = cluster();
    let mut webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    let port = webhook.port;
    let open = |pki: &Pki| connection(pki, port);
    let before = open(&c.pki).server_certificate();
    // cert-manager renews the Secret: a new key and certificate, each file replaced whole.
    let renewed = c.pki.webhook.server_named("webhook renewed", WEBHOOK_NAME);
    for (file, pem) in [
        ("webhook.key", &renewed.key),
        ("webhook.crt", &renewed.cert),
    ] {
        let staged = c.pki.path(&format!("{file}.new"));
        std::fs::write(&staged, pem).expect("stage the renewed file");
        std::fs::rename(&staged, c.pki.path(file)).expect("replace the file");
    }
    webhook.wait_for(
        "TLS files reloaded: new connections get the new material",
        Duration::from_secs(10),
        |_| true,
    );
    let mut after = open(&c.pki);
    assert_eq!(after.server_certificate(), Some(renewed.der()));
    assert_ne!(before, after.server_certificate());
    let answer = after
        .request("GET", "/readyz", None, "")
        .expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
}

#[test]
fn a_binding_whose_agent_is_silent_past_the_deadline_follows_the_policy_within_it() {
    let c = cluster();
    let silent = silent_listener(Ipv4Addr::new(127, 0, 0, 41), c.port);
    c.api
        .put_node(node("mute", Ipv4Addr::new(127, 0, 0, 41), "8Gi"));
    let job = pod_as(
        "mute-job",
        "a4000000-0000-4000-8000-00000000000a",
        Some("2Gi"),
    );
    c.api.put_pod(job.clone());
    for (policy, allowed) in [("fail", false), ("ignore", true)] {
        let webhook = webhook(&c.pki, &c.api, c.port, policy, "300ms");
        wait_ready(&c.pki, &webhook);
        let started = Instant::now();
        let response = validate(&c.pki, &webhook, &binding_review(&job, "mute", false));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{policy}: {took:?}");
        assert_eq!(response["allowed"], allowed, "{policy}: {response}");
        let expected = format!("agent at 127.0.0.41:{}: no answer within 300ms", c.port);
        let why = if allowed {
            response["warnings"][0].as_str()
        } else {
            response["status"]["message"].as_str()
        };
        assert!(
            why.is_some_and(|w| w.ends_with(&expected)),
            "{policy}: {response}"
        );
        let text = metrics(&c.pki, &webhook);
        let verdict = if allowed { "fail_open" } else { "fail_closed" };
        expect_admissions(&text, &[(verdict, 1.0)]);
    }
    assert!(silent.accepted() >= 2, "the silent agent was called");
}

/// The local ports of the established connections to `agent` (the webhook's: nothing else here
/// dials it), from `/proc/net/tcp`.
fn connections_to(agent: SocketAddr) -> Vec<u16> {
    let IpAddr::V4(ip) = agent.ip() else {
        panic!("an IPv4 agent: {agent}");
    };
    // The kernel prints an IPv4 address as its 32 bits in memory order, in hex.
    let remote = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(ip.octets()),
        agent.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, rem, state) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
            (*rem == remote && *state == "01")
                .then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())?
        })
        .collect()
}

/// A filter call for the one node `name` at `ip`: the nodes kept, and the `failedNodes`.
fn filter_one(pki: &Pki, webhook: &Agent, name: &str, ip: Ipv4Addr) -> (Vec<String>, Value) {
    let (status, result) = call(
        pki,
        webhook,
        "/scheduler/filter",
        &args(pod(Some("2Gi")), &[node(name, ip, "8Gi")]),
    );
    assert_eq!(status, 200, "{result}");
    let kept = names(&result).into_iter().map(str::to_owned).collect();
    (kept, result["failedNodes"].clone())
}

#[test]
fn calls_to_an_agent_reuse_one_connection_and_one_the_agent_closed_is_replaced() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 31);
    let addr = SocketAddr::new(IpAddr::V4(ip), port);
    let first = agent(&pki, tree.path(), ip, port);
    api.put_node(node("n", ip, "8Gi"));
    let webhook = webhook(&pki, &api, port, "fail", "2s");
    wait_ready(&pki, &webhook);
    let mut used = Vec::new();
    for _ in 0..3 {
        assert_eq!(filter_one(&pki, &webhook, "n", ip).0, ["n"]);
        let open = connections_to(addr);
        assert_eq!(open.len(), 1, "one connection kept alive: {open:?}");
        used.extend(open);
    }
    used.dedup();
    assert_eq!(used.len(), 1, "every call on the same connection: {used:?}");

    // The agent restarts: its connection is gone, and the next call dials anew.
    drop(first);
    let _second = agent(&pki, tree.path(), ip, port);
    let (kept, failed) = filter_one(&pki, &webhook, "n", ip);
    assert_eq!(kept, ["n"], "no call on the closed connection: {failed}");
    let open = connections_to(addr);
    assert_eq!(open.len(), 1, "{open:?}");
    assert_ne!(open, used, "a new connection");
}

/// Writes `pair` as the webhook's client certificate and key, each file replaced at once (a new
/// inode, as a Secret volume's update makes).
fn rotate_client(pki: &Pki, cert: &str, key: &str) {
    for (file, pem) in [("client.crt", cert), ("client.key", key)] {
        let path = pki.path(file);
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, pem).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    }
}

const CLIENT_RELOADED: &str =
    "agent client TLS files reloaded: new connections to the agents get the new material";
const CLIENT_REJECTED: &str =
    "agent client TLS files changed but cannot be used; the previous material is still used";

#[test]
fn rotated_agent_client_files_are_used_without_a_restart_and_bad_ones_keep_the_previous() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 41);
    let _agent = agent(&pki, tree.path(), ip, port);
    api.put_node(node("n", ip, "8Gi"));
    let mut webhook = webhook(&pki, &api, port, "fail", "2s");
    wait_ready(&pki, &webhook);
    assert_eq!(filter_one(&pki, &webhook, "n", ip).0, ["n"]);

    // A broken certificate: refused, logged once with the file named, the previous kept.
    let good_key = std::fs::read_to_string(pki.path("client.key")).expect("the key");
    rotate_client(&pki, "-----BEGIN CERTIFICATE-----\ntruncated\n", &good_key);
    let warning = webhook.wait_for(CLIENT_REJECTED, Duration::from_secs(10), |_| true);
    let why = warning["error"].as_str().unwrap_or_default();
    assert!(
        why.starts_with(&format!(
            "--agent-client-cert-file {}: ",
            pki.path("client.crt").display()
        )),
        "{warning}"
    );
    assert_eq!(filter_one(&pki, &webhook, "n", ip).0, ["n"]);

    // A certificate of a CA the agents do not trust: used for the calls after the reload,
    // which the agent refuses.
    let stranger = Ca::new("not the agents' CA").client("hugepage-agent-webhook");
    rotate_client(&pki, &stranger.cert, &stranger.key);
    webhook.wait_for(CLIENT_RELOADED, Duration::from_secs(10), |_| true);
    let (kept, failed) = filter_one(&pki, &webhook, "n", ip);
    assert!(kept.is_empty(), "{failed}");
    assert!(
        failed["n"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("agent at {ip}:{port}: "))),
        "{failed}"
    );

    // Back to a certificate of the agents' CA: calls pass again, still without a restart.
    rotate_client(&pki, &pki.client.cert, &pki.client.key);
    let mut reloads = || webhook.lines_with(CLIENT_RELOADED).len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads() < 2 {
        assert!(Instant::now() < deadline, "no second reload");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(filter_one(&pki, &webhook, "n", ip).0, ["n"]);
    let text = metrics(&pki, &webhook);
    for (result, want) in [("reloaded", 2.0), ("rejected", 1.0)] {
        let series = format!(
            r#"hugepage_agent_webhook_tls_reloads_total{{files="agent_client",result="{result}"}}"#
        );
        assert_eq!(sample(&text, &series), Some(want), "{series} in\n{text}");
    }
}

/// A client config trusting the webhook's CA and offering `alpn`.
fn offering(pki: &Pki, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let mut config = (*mtls::client_config(&[&pki.webhook], None, Versions::Any)).clone();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A connection to the webhook offering `alpn`.
fn connect(pki: &Pki, webhook: &Agent, alpn: &[&[u8]]) -> Https {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, webhook.port));
    Https::connect(addr, offering(pki, alpn), WEBHOOK_NAME)
}

#[test]
fn over_http2_the_webhook_answers_as_over_http_1_1_and_accepts_the_apiservers_timeout_query() {
    let c = cluster();
    let webhook = webhook(&c.pki, &c.api, c.port, "ignore", "2s");
    wait_ready(&c.pki, &webhook);
    let mut h2 = connect(&c.pki, &webhook, &[b"h2", b"http/1.1"]);
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]), "HTTP/2 chosen");
    let mut h1 = connect(&c.pki, &webhook, &[b"http/1.1"]);
    assert_eq!(h1.alpn.as_deref(), Some(&b"http/1.1"[..]));
    let body = args(pod(Some("2Gi")), &c.nodes).to_string();
    for path in [
        "/scheduler/filter?timeout=10s",
        "/scheduler/prioritize?timeout=10s",
    ] {
        let (status, over_h2) = h2.request("POST", path, &[], &body);
        assert_eq!(status, 200, "{path} over HTTP/2: {over_h2}");
        let (status, over_h1) = h1.request("POST", path, &[], &body);
        assert_eq!(status, 200, "{path} over HTTP/1.1: {over_h1}");
        let (over_h2, over_h1): (Value, Value) = (
            serde_json::from_str(&over_h2).expect("JSON"),
            serde_json::from_str(&over_h1).expect("JSON"),
        );
        assert_eq!(over_h2, over_h1, "{path}");
    }
    let (_, filtered) = h2.request("POST", "/scheduler/filter?timeout=10s", &[], &body);
    let filtered: Value = serde_json::from_str(&filtered).expect("JSON");
    assert_eq!(names(&filtered), ["roomy", "exact", "down"], "{filtered}");
    for client in [&mut h2, &mut h1] {
        let (status, health) = client.request("GET", "/healthz", &[], "");
        assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    }
}

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[test]
fn one_trace_spans_the_caller_the_webhook_and_the_agent_and_is_forwarded_without_export() {
    let mut receiver = OtlpReceiver::start();
    let endpoint = format!("http://127.0.0.1:{}", receiver.http);
    let exporting = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50"),
    ];
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 51);
    let _agent = agent_with(&pki, tree.path(), ip, port, &exporting);
    let named = [
        exporting[0],
        exporting[1],
        ("OTEL_SERVICE_NAME", "hugepage-agent-webhook"),
    ];
    api.put_node(node("n", ip, "8Gi"));
    let traced = cluster::webhook(&agent_bin(), &pki, &api, port, "fail", "2s", &named);
    wait_ready(&pki, &traced);
    let body = args(pod(Some("2Gi")), &[node("n", ip, "8Gi")]).to_string();
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let mut client = connect(&pki, &traced, &[b"h2", b"http/1.1"]);
    let (status, answer) = client.request(
        "POST",
        "/scheduler/filter?timeout=5s",
        &[("traceparent", &traceparent)],
        &body,
    );
    assert_eq!(status, 200, "{answer}");

    let wait = Duration::from_secs(20);
    let in_trace =
        |name: &'static str| move |s: &Value| s["name"] == name && s["trace_id"] == TRACE_ID;
    let filter = receiver.wait_span(wait, in_trace("extender filter"));
    assert_eq!(filter["parent_span_id"], CALLER_SPAN, "{filter:#}");
    assert_eq!(filter["kind"], 2, "SPAN_KIND_SERVER: {filter:#}");
    assert_eq!(
        filter["resource"]["service.name"], "hugepage-agent-webhook",
        "{filter:#}"
    );
    let call = receiver.wait_span(wait, in_trace("agent call"));
    assert_eq!(call["parent_span_id"], filter["span_id"], "{call:#}");
    assert_eq!(call["kind"], 3, "SPAN_KIND_CLIENT: {call:#}");
    let a = &call["attributes"];
    assert_eq!(a["server.address"], ip.to_string(), "{call:#}");
    assert_eq!(a["hugepage.dry_run"], true, "{call:#}");
    assert_eq!(a["admission.allowed"], true, "{call:#}");
    let admission = receiver.wait_span(wait, in_trace("admission"));
    assert_eq!(
        admission["parent_span_id"], call["span_id"],
        "{admission:#}"
    );
    assert_eq!(
        admission["resource"]["service.name"], "hugepage-agent",
        "{admission:#}"
    );

    // A webhook that exports nothing still forwards the caller's context: the agent's span is
    // the caller's child.
    let untraced = webhook(&pki, &api, port, "fail", "2s");
    // The `nodes` form's names are found in the Node cache: once it has synced.
    wait_ready(&pki, &untraced);
    let (other_trace, other_caller) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let traceparent = format!("00-{other_trace}-{other_caller}-01");
    let mut client = connect(&pki, &untraced, &[b"http/1.1"]);
    let (status, answer) = client.request(
        "POST",
        "/scheduler/filter",
        &[("traceparent", &traceparent)],
        &body,
    );
    assert_eq!(status, 200, "{answer}");
    let admission = receiver.wait_span(wait, |s| {
        s["name"] == "admission" && s["trace_id"] == other_trace
    });
    assert_eq!(admission["parent_span_id"], other_caller, "{admission:#}");
    receiver.collect(Duration::from_millis(500));
    let exported: Vec<&Value> = receiver
        .seen
        .iter()
        .filter(|s| {
            s["trace_id"] == other_trace && s["resource"]["service.name"] != "hugepage-agent"
        })
        .collect();
    assert!(
        exported.is_empty(),
        "the webhook exported nothing: {exported:#?}"
    );
}

/// A pod of the agents' DaemonSet named `name` on `node`, in `namespace`, with `labels`,
/// created at 06:00 and `minutes` after.
fn agent_pod(namespace: &str, name: &str, node: &str, labels: Value, minutes: u32) -> Value {
    json!({
        "metadata": {
            "name": name, "namespace": namespace, "uid": format!("uid-{name}"),
            "creationTimestamp": format!("2026-11-29T06:{minutes:02}:00Z"), "labels": labels,
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "hugepage-agent:0.1.0"}]},
        "status": {"phase": "Running"}
    })
}

#[test]
fn per_pod_identity_trusts_on_each_node_only_the_certificate_of_the_agent_pod_the_api_has_there() {
    let pki = Pki::new();
    let port = free_port();
    let ip = |last| Ipv4Addr::new(127, 0, 0, last);
    // Two agents, each with a certificate for its own pod's name and the shared name too (which
    // must not be enough).
    let pod_name = |pod: &str| format!("{pod}.hugepage-agent.pod.hugepage-agent.internal");
    let mut agents = Vec::new();
    let mut trees = Vec::new();
    for (last, pod) in [(2, "agent-a"), (3, "agent-b")] {
        let cert = pki
            .agents
            .server_names(pod, &[&pod_name(pod), "node.hugepage-agent.internal"]);
        cert.write(pki.dir.path(), pod);
        let tree = host_tree(2048);
        let cmd = cluster::tree_agent_command_as(&agent_bin(), &pki, tree.path(), &[], pod);
        agents.push(start_agent(cmd, ip(last), port, |_| true));
        trees.push(tree);
    }
    let api = StandInApiServer::start();
    // node-c is at agent-a's address: a key taken from node A answering for node C.
    for (name, last) in [("node-a", 2), ("node-b", 3), ("node-c", 2), ("node-d", 3)] {
        api.put_node(node(name, ip(last), "8Gi"));
    }
    let labels =
        json!({"app.kubernetes.io/name": "hugepage-agent", "app.kubernetes.io/component": "agent"});
    let ns = "hugepage-agent";
    for (pod, node) in [
        ("agent-a", "node-a"),
        ("agent-old", "node-b"),
        ("agent-c", "node-c"),
    ] {
        api.put_pod(agent_pod(ns, pod, node, labels.clone(), 0));
    }
    // Neither is an agent: another namespace's pod, and one without the DaemonSet's labels.
    api.put_pod(agent_pod("tenant", "agent-b", "node-d", labels.clone(), 0));
    api.put_pod(agent_pod(ns, "agent-b", "node-d", json!({"app": "x"}), 0));
    let c = Cluster {
        pki,
        api,
        port,
        _trees: trees,
        _agents: agents,
        nodes: Vec::new(),
    };
    let webhook = cluster::webhook_with(
        &agent_bin(),
        &c.pki,
        &c.api,
        port,
        ["fail", "2s"],
        &[],
        &["--agent-identity", "per-pod"],
    );
    wait_ready(&c.pki, &webhook);
    assert!(
        c.api.requests().iter().any(|r| r
            .starts_with("GET /api/v1/namespaces/hugepage-agent/pods?")
            && r.contains("labelSelector=")),
        "the agents' pods listed by namespace and selector: {:?}",
        c.api.requests()
    );
    let all = ["node-a", "node-b", "node-c", "node-d"];
    let result = filter_names(&c, &webhook, &all);
    assert_eq!(result["nodenames"], json!(["node-a"]), "{result}");
    let failed = &result["failedNodes"];
    for (node, expected) in [
        (
            "node-b",
            "agent-old.hugepage-agent.pod.hugepage-agent.internal",
        ),
        (
            "node-c",
            "agent-c.hugepage-agent.pod.hugepage-agent.internal",
        ),
    ] {
        let text = failed[node].as_str().unwrap_or_default();
        assert!(
            text.contains("not valid for name") && text.contains(expected),
            "{node}: {result}"
        );
    }
    let text = failed["node-d"].as_str().unwrap_or_default();
    assert!(
        text.contains("no agent pod in namespace hugepage-agent is on node node-d"),
        "{result}"
    );
    // A rollout: agent-b, newer (and sorting before agent-old), on node-b beside agent-old,
    // not yet deleted: the newer is the node's agent, followed by the watch, no restart.
    let labels_z = labels.clone();
    c.api.put_pod(agent_pod(ns, "agent-b", "node-b", labels, 5));
    until_filter(&c, &webhook, &all, "node-b's agent trusted", |r| {
        r["nodenames"] == json!(["node-a", "node-b"])
    });
    c.api.delete_pod(ns, "agent-old");
    let result = filter_names(&c, &webhook, &all);
    assert!(result["failedNodes"]["node-c"].is_string(), "{result}");
    assert!(result["failedNodes"]["node-d"].is_string(), "{result}");
    // The agent of node-b is deleted: node-b has no agent to trust again.
    c.api.delete_pod(ns, "agent-b");
    until_filter(&c, &webhook, &all, "node-b's agent gone", |r| {
        r["nodenames"] == json!(["node-a"])
    });
    // The API names a newer pod node-a's agent while agent-a still serves there: node-a's
    // calls now ask for agent-z, which agent-a's certificate does not name.
    c.api
        .put_pod(agent_pod(ns, "agent-z", "node-a", labels_z, 9));
    until_filter(&c, &webhook, &all, "node-a's old agent distrusted", |r| {
        r["nodenames"].as_array().is_some_and(Vec::is_empty)
            && r["failedNodes"]["node-a"]
                .as_str()
                .is_some_and(|t| t.contains("agent-z.hugepage-agent.pod.hugepage-agent.internal"))
    });
}

#[test]
fn kubelet_identity_trusts_on_each_node_only_that_nodes_kubelet_serving_certificate() {
    let pki = Pki::new();
    let port = free_port();
    let ip = |last| Ipv4Addr::new(127, 0, 0, last);
    // The cluster's CA signs the kubelets' serving certificates; each agent serves its
    // kubelet's as the kubelet keeps it: certificate and key in one file, reached through a
    // symbolic link (kubelet-server-current.pem), given as both --tls-cert-file and
    // --tls-private-key-file.
    let cluster_ca = Ca::new("kubernetes");
    let cluster_ca_file = pki.path("cluster-ca.crt");
    std::fs::write(&cluster_ca_file, &cluster_ca.pem).expect("write the cluster CA");
    let mut agents = Vec::new();
    let mut trees = Vec::new();
    for (last, node) in [(2, "node-a"), (3, "node-b")] {
        let pair = cluster_ca.kubelet_serving(node);
        let stem = format!("{node}-kubelet");
        let current = pki.path(&format!("kubelet-server-{node}.pem"));
        std::fs::write(&current, format!("{}{}", pair.cert, pair.key)).expect("write");
        for ext in ["crt", "key"] {
            std::os::unix::fs::symlink(&current, pki.path(&format!("{stem}.{ext}"))).expect("link");
        }
        let tree = host_tree(2048);
        let cmd = cluster::tree_agent_command_as(&agent_bin(), &pki, tree.path(), &[], &stem);
        agents.push(start_agent(cmd, ip(last), port, |_| true));
        trees.push(tree);
    }
    // At .4, an agent serving the installation's shared certificate (the agents' CA's).
    let tree = host_tree(2048);
    agents.push(agent(&pki, tree.path(), ip(4), port));
    trees.push(tree);
    let api = StandInApiServer::start();
    // node-c is at node-a's agent: a key taken from node A answering for node C.
    for (name, last) in [("node-a", 2), ("node-b", 3), ("node-c", 2), ("node-d", 4)] {
        api.put_node(node(name, ip(last), "8Gi"));
    }
    let c = Cluster {
        pki,
        api,
        port,
        _trees: trees,
        _agents: agents,
        nodes: Vec::new(),
    };
    let webhook = cluster::webhook_trusting(
        &agent_bin(),
        &c.pki,
        &c.api,
        port,
        &cluster_ca_file,
        ["fail", "2s"],
        &["--agent-identity", "kubelet"],
    );
    wait_ready(&c.pki, &webhook);
    let result = filter_names(&c, &webhook, &["node-a", "node-b", "node-c", "node-d"]);
    assert_eq!(result["nodenames"], json!(["node-a", "node-b"]), "{result}");
    let failed = &result["failedNodes"];
    let text = failed["node-c"].as_str().unwrap_or_default();
    assert!(
        text.contains("only valid for the subject O=system:nodes, CN=system:node:node-a")
            && text.contains("is CN=system:node:node-c"),
        "{result}"
    );
    let text = failed["node-d"].as_str().unwrap_or_default();
    assert!(text.contains("UnknownIssuer"), "{result}");
    // The same cluster under --agent-identity shared: the kubelets' certificates carry no name
    // of ours, and only the shared certificate's agent is trusted (by the agents' CA).
    let shared =
        cluster::webhook_with(&agent_bin(), &c.pki, &c.api, port, ["fail", "2s"], &[], &[]);
    wait_ready(&c.pki, &shared);
    let result = filter_names(&c, &shared, &["node-a", "node-b", "node-d"]);
    assert_eq!(result["nodenames"], json!(["node-d"]), "{result}");
}
