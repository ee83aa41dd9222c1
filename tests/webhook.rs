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
//! processes are killed on drop, the trees are temporary directories).

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, agent_bin, free_port,
    https::Https,
    mtls::{self, Ca, Connection, Versions},
    peers::OtlpReceiver,
    put, two_numa_nodes,
};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use rustls_pki_types::{PrivateKeyDer, ServerName, pem::PemObject};
use serde_json::{Value, json};

/// The name the webhook's serving certificate carries (its Service's DNS name).
const WEBHOOK_NAME: &str = "hugepage-agent-webhook.hugepage-agent.svc";
const POD_UID: &str = "5d0c8ba2-3b1f-4f7a-9f35-6c1d2e3f4a5b";

/// Certificates of one test, as files: the agents' CA with the agents' server certificate and
/// the webhook's client certificate, and the webhook's CA with its serving certificate.
struct Pki {
    dir: tempfile::TempDir,
    webhook: Ca,
    /// The agents' server certificate, for a stand-in agent that answers garbage.
    agent: mtls::Pair,
    /// The webhook's client certificate, as first written.
    client: mtls::Pair,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("a certificate directory");
        let agents = Ca::new("hugepage-agent CA");
        let webhook = Ca::new("webhook CA");
        std::fs::write(dir.path().join("agents-ca.crt"), &agents.pem).expect("write the CA");
        let agent = agents.server("agent");
        agent.write(dir.path(), "agent");
        let client = agents.client("hugepage-agent-webhook");
        client.write(dir.path(), "client");
        webhook
            .server_named("webhook", WEBHOOK_NAME)
            .write(dir.path(), "webhook");
        Pki {
            dir,
            webhook,
            agent,
            client,
        }
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join(file)
    }
}

/// A host tree of two NUMA nodes with 2048 2 MiB pages each (4 GiB), `free` of them free.
fn host_tree(free: u64) -> tempfile::TempDir {
    let tree = tempfile::tempdir().expect("a host tree");
    let root = tree.path();
    two_numa_nodes(root, 16 << 20, 2048, free);
    let quiet = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n";
    for resource in ["memory", "io", "cpu"] {
        put(root, &format!("/proc/pressure/{resource}"), quiet);
    }
    tree
}

/// A node agent on `ip`:`port` over `tree`, TLS with client certificates of `pki`, the kubelet
/// settings of a node that pins hugepages (single-numa-node, Memory Manager Static).
fn agent(pki: &Pki, tree: &Path, ip: Ipv4Addr, port: u16) -> Agent {
    agent_with(pki, tree, ip, port, &[])
}

/// [`agent`] with the `OTEL_*` variables of `env` (none other set).
fn agent_with(pki: &Pki, tree: &Path, ip: Ipv4Addr, port: u16, env: &[(&str, &str)]) -> Agent {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree)
        .args(["--ebpf", "off"])
        .args(["--topology-policy", "single-numa-node"])
        .args(["--memory-manager-policy", "Static"])
        .arg("--tls-cert-file")
        .arg(pki.path("agent.crt"))
        .arg("--tls-private-key-file")
        .arg(pki.path("agent.key"))
        .arg("--client-ca-file")
        .arg(pki.path("agents-ca.crt"));
    otel(&mut cmd, env);
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut agent = Agent::start_at(cmd, uid, SocketAddr::new(IpAddr::V4(ip), port));
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    agent
}

/// Sets `env` on `cmd`, and no other `OTEL_*` variable of the tests' environment.
fn otel(cmd: &mut Command, env: &[(&str, &str)]) {
    for (var, _) in std::env::vars_os().filter(|(v, _)| v.to_string_lossy().starts_with("OTEL_")) {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
}

/// The webhook, on a free loopback port, calling agents on `agent_port`.
fn webhook(pki: &Pki, agent_port: u16, policy: &str, timeout: &str) -> Agent {
    webhook_with(pki, agent_port, policy, timeout, &[])
}

/// [`webhook`] with the `OTEL_*` variables of `env` (none other set).
fn webhook_with(
    pki: &Pki,
    agent_port: u16,
    policy: &str,
    timeout: &str,
    env: &[(&str, &str)],
) -> Agent {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("webhook")
        .arg("--tls-cert-file")
        .arg(pki.path("webhook.crt"))
        .arg("--tls-private-key-file")
        .arg(pki.path("webhook.key"))
        .args(["--agent-port", &agent_port.to_string()])
        .arg("--agent-ca-file")
        .arg(pki.path("agents-ca.crt"))
        .arg("--agent-client-cert-file")
        .arg(pki.path("client.crt"))
        .arg("--agent-client-key-file")
        .arg(pki.path("client.key"))
        .args(["--failure-policy", policy, "--agent-timeout", timeout]);
    otel(&mut cmd, env);
    let mut webhook = Agent::start(cmd);
    webhook.wait_for("webhook running", Duration::from_secs(20), |_| true);
    webhook
}

/// `POST path` with `body` to the webhook over HTTPS, verifying it by its CA and name.
fn call(pki: &Pki, webhook: &Agent, path: &str, body: &Value) -> (u16, Value) {
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    let name = ServerName::try_from(WEBHOOK_NAME).expect("a DNS name");
    let mut connection = Connection::open_as(webhook.port, config, name).expect("connect");
    let answer = connection
        .request("POST", path, Some("application/json"), &body.to_string())
        .expect("an answer");
    let value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {:?}", answer.body));
    (answer.status, value)
}

/// The webhook's `GET /metrics`, over HTTPS.
fn metrics(pki: &Pki, webhook: &Agent) -> String {
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    let name = ServerName::try_from(WEBHOOK_NAME).expect("a DNS name");
    let mut connection = Connection::open_as(webhook.port, config, name).expect("connect");
    let answer = connection
        .request("GET", "/metrics", None, "")
        .expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// The value of `series` (name and labels as written) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A pending pod as the API server stores it: `hugepages` of 2 MiB pages (none when `None`),
/// Guaranteed.
fn pod(hugepages: Option<&str>) -> Value {
    let mut resources = json!({"cpu": "1", "memory": "1Gi"});
    if let Some(h) = hugepages {
        resources["hugepages-2Mi"] = json!(h);
    }
    json!({
        "metadata": {
            "name": "dpdk-0",
            "namespace": "telco",
            "uid": POD_UID,
            "resourceVersion": "4711",
            "creationTimestamp": "2026-11-24T20:00:00Z",
            "labels": {"app": "dpdk"}
        },
        "spec": {
            "containers": [{
                "name": "forwarder",
                "image": "registry.example/dpdk:1.0",
                "resources": {"limits": resources, "requests": resources},
                "terminationMessagePath": "/dev/termination-log",
                "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "priority": 0
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"}
    })
}

/// A Node whose first `InternalIP` is `ip`, with `hugepages` of 2 MiB pages allocatable.
fn node(name: &str, ip: Ipv4Addr, hugepages: &str) -> Value {
    json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {
            "capacity": {"cpu": "2", "memory": "16Gi", "hugepages-2Mi": "8Gi", "hugepages-1Gi": "0", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "15Gi", "hugepages-2Mi": hugepages, "hugepages-1Gi": "0", "pods": "110"},
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": ip.to_string()}
            ]
        }
    })
}

/// `ExtenderArgs` of the `nodes` form.
fn args(pod: Value, nodes: &[Value]) -> Value {
    json!({"pod": pod, "nodes": {"metadata": {}, "items": nodes}})
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
    Cluster {
        pki,
        port,
        _trees: trees,
        _agents: agents,
        nodes,
    }
}

#[test]
fn filter_keeps_the_nodes_whose_agents_admit_and_fails_the_others_with_the_agents_message() {
    let c = cluster();
    let webhook = webhook(&c.pki, c.port, "ignore", "2s");
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
    let webhook = webhook(&c.pki, c.port, "ignore", "2s");
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
    let webhook = webhook(&pki, port, "fail", "500ms");
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
    let webhook = webhook(&pki, port, "fail", "2s");
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
fn the_nodenames_form_with_hugepages_is_refused_as_not_served_yet_and_bad_bodies_are_400() {
    let pki = Pki::new();
    let webhook = webhook(&pki, free_port(), "ignore", "2s");
    let by_name = json!({"pod": pod(Some("2Gi")), "nodenames": ["a"]});
    let (status, result) = call(&pki, &webhook, "/scheduler/filter", &by_name);
    assert_eq!(status, 200);
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.contains("nodeCacheCapable: true") && e.contains("not served yet")),
        "{result}"
    );
    let (status, result) = call(&pki, &webhook, "/scheduler/filter", &json!(["not", "args"]));
    assert_eq!(status, 400);
    assert!(
        result["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("the body is not ExtenderArgs JSON")),
        "{result}"
    );
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
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 31);
    let addr = SocketAddr::new(IpAddr::V4(ip), port);
    let first = agent(&pki, tree.path(), ip, port);
    let webhook = webhook(&pki, port, "fail", "2s");
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
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 41);
    let _agent = agent(&pki, tree.path(), ip, port);
    let mut webhook = webhook(&pki, port, "fail", "2s");
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
    let webhook = webhook(&c.pki, c.port, "ignore", "2s");
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
    let port = free_port();
    let tree = host_tree(2048);
    let ip = Ipv4Addr::new(127, 0, 0, 51);
    let _agent = agent_with(&pki, tree.path(), ip, port, &exporting);
    let named = [
        exporting[0],
        exporting[1],
        ("OTEL_SERVICE_NAME", "hugepage-agent-webhook"),
    ];
    let traced = webhook_with(&pki, port, "fail", "2s", &named);
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
    let untraced = webhook(&pki, port, "fail", "2s");
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
