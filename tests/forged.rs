//! What a forged call can make the webhook and the agents hold, for real: two node agents
//! (`hugepage-agent run` over host trees, each on a loopback address of its own), the real
//! webhook, and the stand-in API server (`StandInApiServer`, standing in for kube-apiserver).
//! The calls are sent as anyone who reaches the webhook could send them; each attack is shown
//! with what the webhook answers and what the agents hold after it (`GET /v1/reservations`,
//! asked with the webhook's client certificate).
//!
//! * a binding the API server never shows bound holds its reservation only for
//!   `--reservation-confirm-within` (here 2 s), counted by reason; one the API shows bound stays;
//! * one pod bound to two nodes holds a reservation on the last one only;
//! * a binding of another UID, of a bound, terminating or absent pod reserves nothing;
//! * the `nodes` form of `ExtenderArgs` dials no address a caller wrote (a listener the test
//!   owns, on the agents' port, sees no connection);
//! * on the agent: a UID reserved under one name is not taken by an admission naming it under
//!   another, and `--namespace-reservation-limit` refuses past it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener},
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, agent_bin,
    apiserver::StandInApiServer,
    cluster::{
        self, Pki, args, binding_review, call, host_tree, metrics, node, pod_as, sample,
        start_agent, tree_agent_command, validate,
    },
    free_port,
    mtls::{self, Connection, Versions},
};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};

const POD_A: &str = "a0000000-0000-4000-8000-00000000000a";
const POD_B: &str = "b0000000-0000-4000-8000-00000000000b";
const POD_C: &str = "c0000000-0000-4000-8000-00000000000c";
const WINDOW: &str = "2s";

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// Two agents (`one` on `.first`, `two` on the next address) with 4 GiB of 2 MiB pages free per
/// NUMA node, the Nodes in the stand-in API server, and the webhook confirming within
/// [`WINDOW`].
struct Cluster {
    /// First: dropped before the stand-in API server, which waits for its connections to end.
    webhook: Agent,
    pki: Pki,
    api: StandInApiServer,
    port: u16,
    agents: Vec<(Agent, SocketAddr)>,
    _trees: Vec<tempfile::TempDir>,
}

fn cluster(first: u8, agent_flags: &[&str]) -> Cluster {
    let pki = Pki::new();
    let port = free_port();
    let api = StandInApiServer::start();
    let mut trees = Vec::new();
    let mut agents = Vec::new();
    for (i, name) in ["one", "two"].into_iter().enumerate() {
        let at = ip(first + i as u8);
        let tree = host_tree(2048);
        let mut cmd = tree_agent_command(&agent_bin(), &pki, tree.path(), &[]);
        cmd.args(agent_flags);
        agents.push((
            start_agent(cmd, at, port, |_| true),
            SocketAddr::new(IpAddr::V4(at), port),
        ));
        trees.push(tree);
        api.put_node(node(name, at, "8Gi"));
    }
    let webhook = cluster::webhook_with(
        &agent_bin(),
        &pki,
        &api,
        port,
        ["ignore", "2s"],
        &[],
        &["--reservation-confirm-within", WINDOW],
    );
    cluster::wait_ready(&pki, &webhook, Duration::from_secs(20));
    Cluster {
        pki,
        api,
        port,
        agents,
        webhook,
        _trees: trees,
    }
}

/// One request to the agent at `addr` with the webhook's client certificate: status and JSON.
fn agent_call(pki: &Pki, addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let config = mtls::client_config(&[&pki.agents], Some(&pki.client), Versions::Any);
    let name = ServerName::try_from(mtls::SERVER_NAME).expect("a DNS name");
    let mut connection = Connection::open_to(addr, config, name).expect("connect to the agent");
    let content = (!body.is_empty()).then_some("application/json");
    let answer = connection
        .request(method, path, content, body)
        .expect("an answer");
    let value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
    (answer.status, value)
}

/// The pod UIDs the agent at `addr` holds reservations for.
fn reserved(pki: &Pki, addr: SocketAddr) -> Vec<String> {
    let (status, listed) = agent_call(pki, addr, "GET", "/v1/reservations", "");
    assert_eq!(status, 200, "{listed}");
    listed["reservations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["podUid"].as_str().map(str::to_owned))
        .collect()
}

/// Waits up to `within` for the agent at `addr` to hold reservations for `uids` exactly.
fn until_reserved(pki: &Pki, addr: SocketAddr, uids: &[&str], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let now = reserved(pki, addr);
        if now == uids || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn unconfirmed(text: &str, reason: &str) -> Option<f64> {
    let series =
        format!("hugepage_agent_webhook_unconfirmed_reservations_total{{reason=\"{reason}\"}}");
    sample(text, &series)
}

/// `pod` bound to `node` in the API, as the API server writes it after the binding.
fn bound(mut pod: Value, node: &str) -> Value {
    pod["spec"]["nodeName"] = json!(node);
    pod
}

#[test]
fn a_binding_the_api_never_shows_holds_nothing_past_the_window_and_a_real_one_stays() {
    let c = cluster(61, &[]);
    let (one, _) = (c.agents[0].1, c.agents[1].1);
    let forged = pod_as("forged", POD_A, Some("2Gi"));
    let real = pod_as("real", POD_B, Some("2Gi"));
    c.api.put_pod(forged.clone());
    c.api.put_pod(real.clone());
    for pod in [&forged, &real] {
        let response = validate(&c.pki, &c.webhook, &binding_review(pod, "one", false));
        assert_eq!(response["allowed"], true, "{response}");
    }
    // The API server writes the real binding; the forged one it never saw.
    c.api.put_pod(bound(real, "one"));
    let mut both = reserved(&c.pki, one);
    both.sort();
    assert_eq!(both, [POD_A, POD_B], "both reserved at first");
    let left = until_reserved(&c.pki, one, &[POD_B], Duration::from_secs(8));
    assert_eq!(
        left,
        [POD_B],
        "the forged reservation is released, the bound one stays"
    );
    let text = metrics(&c.pki, &c.webhook);
    assert_eq!(unconfirmed(&text, "not_bound"), Some(1.0), "{text}");
    assert_eq!(unconfirmed(&text, "moved"), Some(0.0), "{text}");
    // The real one is still held after its window, confirmed.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(reserved(&c.pki, one), [POD_B]);
}

#[test]
fn one_pod_bound_to_two_nodes_holds_the_last_one_only() {
    let c = cluster(63, &[]);
    let (one, two) = (c.agents[0].1, c.agents[1].1);
    let pod = pod_as("twice", POD_A, Some("2Gi"));
    c.api.put_pod(pod.clone());
    for node in ["one", "two"] {
        let response = validate(&c.pki, &c.webhook, &binding_review(&pod, node, false));
        assert_eq!(response["allowed"], true, "{response}");
    }
    assert_eq!(
        reserved(&c.pki, one),
        Vec::<String>::new(),
        "released at once"
    );
    assert_eq!(reserved(&c.pki, two), [POD_A]);
    let text = metrics(&c.pki, &c.webhook);
    assert_eq!(unconfirmed(&text, "moved"), Some(1.0), "{text}");
    // The API server shows it bound to one: the reservation on two goes with the window.
    c.api.put_pod(bound(pod, "one"));
    let left = until_reserved(&c.pki, two, &[], Duration::from_secs(8));
    assert!(left.is_empty(), "{left:?}");
    let text = metrics(&c.pki, &c.webhook);
    assert_eq!(unconfirmed(&text, "bound_elsewhere"), Some(1.0), "{text}");
}

#[test]
fn a_binding_of_another_uid_or_of_a_bound_terminating_or_absent_pod_reserves_nothing() {
    let c = cluster(65, &[]);
    let one = c.agents[0].1;
    let pending = pod_as("pending", POD_A, Some("2Gi"));
    c.api.put_pod(pending.clone());
    let mut other_uid = binding_review(&pending, "one", false);
    other_uid["request"]["object"]["metadata"]["uid"] = json!(POD_C);
    let response = validate(&c.pki, &c.webhook, &other_uid);
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 409, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "metadata.uid {POD_C} is not the pod's UID in the API ({POD_A})"
        )),
        "{message}"
    );

    let on_two = pod_as("on-two", POD_B, Some("2Gi"));
    c.api.put_pod(bound(on_two.clone(), "two"));
    let response = validate(&c.pki, &c.webhook, &binding_review(&on_two, "one", false));
    assert_eq!(response["status"]["code"], 409, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("already bound to node two"), "{message}");

    let mut leaving = pod_as("leaving", POD_C, Some("2Gi"));
    leaving["metadata"]["deletionTimestamp"] = json!("2026-11-28T15:00:00Z");
    c.api.put_pod(leaving.clone());
    let response = validate(&c.pki, &c.webhook, &binding_review(&leaving, "one", false));
    assert_eq!(response["status"]["code"], 409, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("being deleted"), "{message}");

    let absent = pod_as(
        "absent",
        "d0000000-0000-4000-8000-00000000000d",
        Some("2Gi"),
    );
    let response = validate(&c.pki, &c.webhook, &binding_review(&absent, "one", false));
    assert_eq!(response["status"]["code"], 404, "{response}");

    assert_eq!(reserved(&c.pki, one), Vec::<String>::new());
    // The same pod, its own UID: admitted and reserved.
    let response = validate(&c.pki, &c.webhook, &binding_review(&pending, "one", false));
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(reserved(&c.pki, one), [POD_A]);
}

#[test]
fn the_nodes_form_dials_no_address_the_caller_wrote() {
    let c = cluster(67, &[]);
    // The caller's address, on the agents' port: a listener this test owns.
    let trap = TcpListener::bind((ip(69), c.port)).expect("the test's listener");
    trap.set_nonblocking(true).expect("nonblocking");
    let mut moved = node("one", ip(69), "8Gi");
    moved["metadata"]["uid"] = json!("forged");
    let stranger = node("stranger", ip(69), "8Gi");
    let items = vec![moved.clone(), stranger, moved.clone(), moved];
    let (status, result) = call(
        &c.pki,
        &c.webhook,
        "/scheduler/filter",
        &args(pod_as("p", POD_A, Some("2Gi")), &items),
    );
    assert_eq!(status, 200, "{result}");
    let kept: Vec<&str> = result["nodes"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        kept,
        ["one", "one", "one"],
        "one judged by its real agent: {result}"
    );
    let why = result["failedNodes"]["stranger"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("not in the webhook's Node cache"), "{result}");
    std::thread::sleep(Duration::from_millis(500));
    let accepted = std::iter::from_fn(|| trap.accept().ok()).count();
    assert_eq!(accepted, 0, "no connection to the caller's address");
    // More distinct names than the cache holds: the call is failed.
    let many: Vec<Value> = (0..3)
        .map(|i| node(&format!("n{i}"), ip(69), "8Gi"))
        .collect();
    let (status, result) = call(
        &c.pki,
        &c.webhook,
        "/scheduler/filter",
        &args(pod_as("p", POD_A, Some("2Gi")), &many),
    );
    assert_eq!(status, 200, "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("more distinct nodes than the 2"), "{result}");
}

/// `pod_as(name, uid)` in `namespace`, as the body of `POST /v1/admit`.
fn admission(namespace: &str, name: &str, uid: &str, hugepages: &str) -> String {
    let mut pod = pod_as(name, uid, Some(hugepages));
    pod["metadata"]["namespace"] = json!(namespace);
    pod.to_string()
}

#[test]
fn an_agent_keeps_a_uid_to_its_name_and_bounds_a_namespace() {
    let c = cluster(71, &["--namespace-reservation-limit", "3Gi"]);
    let one = c.agents[0].1;
    let admit = |body: String| agent_call(&c.pki, one, "POST", "/v1/admit", &body);
    let (status, verdict) = admit(admission("telco", "dpdk-0", POD_A, "2Gi"));
    assert_eq!(
        (status, &verdict["allowed"]),
        (200, &json!(true)),
        "{verdict}"
    );
    let before = agent_call(&c.pki, one, "GET", "/v1/reservations", "").1;
    // The same UID under another name: refused, nothing changed.
    let (status, problem) = admit(admission("other", "dpdk-0", POD_A, "2Mi"));
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["type"], "reservation-conflict", "{problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("telco/dpdk-0") && detail.contains("other/dpdk-0"),
        "{detail}"
    );
    assert_eq!(
        agent_call(&c.pki, one, "GET", "/v1/reservations", "").1,
        before
    );
    // 2Gi held in telco, 2Gi more is past 3Gi; another namespace is not.
    let (status, verdict) = admit(admission("telco", "dpdk-1", POD_B, "2Gi"));
    assert_eq!(status, 200, "{verdict}");
    assert_eq!(verdict["allowed"], false, "{verdict}");
    assert_eq!(verdict["reason"], "NamespaceReservationLimit", "{verdict}");
    let (_, verdict) = admit(admission("telco", "dpdk-1", POD_B, "1Gi"));
    assert_eq!(verdict["allowed"], true, "{verdict}");
    let (_, verdict) = admit(admission("other", "dpdk-2", POD_C, "1Gi"));
    assert_eq!(verdict["allowed"], true, "{verdict}");
    let mut held = reserved(&c.pki, one);
    held.sort();
    assert_eq!(held, [POD_A, POD_B, POD_C]);
}
