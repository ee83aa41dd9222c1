//! A cluster on this host for the webhook's tests and its benchmark: the certificates of one run
//! (the agents' CA with their server certificate and the webhook's client certificate, the
//! webhook's CA with its serving certificate), a node's host tree, real `hugepage-agent run`
//! processes as the nodes' agents (TLS requiring client certificates, `--ebpf off`), the real
//! `hugepage-agent webhook` calling them, kept-alive HTTPS connections to it, and the `Node`
//! and pod JSON the API server holds. The API server itself is the stand-in of
//! [`crate::apiserver`].
//!
//! Every process and file belongs to its owner's lifetime: processes are killed on drop, the
//! certificates and trees are temporary directories.

use std::{
    ffi::OsString,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use rustls_pki_types::ServerName;
use serde_json::{Value, json};

use crate::{
    Agent,
    apiserver::StandInApiServer,
    mtls::{self, Ca, Connection, Versions},
    quiet_pressure, two_numa_nodes,
};

/// The name the webhook's serving certificate carries (its Service's DNS name).
pub const WEBHOOK_NAME: &str = "hugepage-agent-webhook.hugepage-agent.svc";
/// The UID of [`pod`]'s pod.
pub const POD_UID: &str = "5d0c8ba2-3b1f-4f7a-9f35-6c1d2e3f4a5b";

/// Certificates of one run, as files in [`Pki::dir`]: `agents-ca.crt`, `agent.{crt,key}`,
/// `client.{crt,key}` (the webhook's, towards the agents) and `webhook.{crt,key}`.
pub struct Pki {
    pub dir: tempfile::TempDir,
    /// The CA of the webhook's serving certificate, which its clients trust.
    pub webhook: Ca,
    /// The agents' CA: their serving certificates and their clients' (the webhook's).
    pub agents: Ca,
    /// The agents' server certificate, for a stand-in agent that answers garbage.
    pub agent: mtls::Pair,
    /// The webhook's client certificate, as first written.
    pub client: mtls::Pair,
}

impl Pki {
    pub fn new() -> Pki {
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
            agents,
            agent,
            client,
        }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The flags of a serving certificate: `--tls-cert-file <stem>.crt --tls-private-key-file
    /// <stem>.key`.
    fn serving(&self, stem: &str) -> [OsString; 4] {
        [
            "--tls-cert-file".into(),
            self.path(&format!("{stem}.crt")).into(),
            "--tls-private-key-file".into(),
            self.path(&format!("{stem}.key")).into(),
        ]
    }
}

impl Default for Pki {
    fn default() -> Pki {
        Pki::new()
    }
}

/// A host tree of two NUMA nodes with 2048 2 MiB pages each (4 GiB), `free` of them free.
pub fn host_tree(free: u64) -> tempfile::TempDir {
    host_tree_of(2048, free)
}

/// A host tree of two NUMA nodes with `pages` 2 MiB pages each, `free` of them free, and quiet
/// pressure files.
pub fn host_tree_of(pages: u64, free: u64) -> tempfile::TempDir {
    let tree = tempfile::tempdir().expect("a host tree");
    let root = tree.path();
    two_numa_nodes(root, 16 << 20, pages, free);
    quiet_pressure(root);
    tree
}

/// `bin run` for a node's agent over `tree` with `--ebpf off`: [`agent_command`] with the
/// kubelet settings of a node that pins hugepages (single-numa-node, Memory Manager Static).
pub fn tree_agent_command(bin: &Path, pki: &Pki, tree: &Path, env: &[(&str, &str)]) -> Command {
    tree_agent_command_as(bin, pki, tree, env, "agent")
}

/// [`tree_agent_command`] serving the certificate `<stem>.{crt,key}` of [`Pki::dir`].
pub fn tree_agent_command_as(
    bin: &Path,
    pki: &Pki,
    tree: &Path,
    env: &[(&str, &str)],
    stem: &str,
) -> Command {
    let mut cmd = agent_command_as(bin, pki, "single-numa-node", env, stem);
    cmd.arg("--host-root").arg(tree).args(["--ebpf", "off"]);
    cmd
}

/// `bin run` with TLS requiring client certificates of `pki`, Memory Manager Static, the
/// Topology Manager's `topology` policy and the `OTEL_*` variables of `env` (none other set).
pub fn agent_command(bin: &Path, pki: &Pki, topology: &str, env: &[(&str, &str)]) -> Command {
    agent_command_as(bin, pki, topology, env, "agent")
}

/// [`agent_command`] serving `<stem>.{crt,key}`.
fn agent_command_as(
    bin: &Path,
    pki: &Pki,
    topology: &str,
    env: &[(&str, &str)],
    stem: &str,
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .args(["--topology-policy", topology])
        .args(["--memory-manager-policy", "Static"])
        .args(pki.serving(stem))
        .arg("--client-ca-file")
        .arg(pki.path("agents-ca.crt"));
    otel(&mut cmd, env);
    cmd
}

/// `bin run` on this host with its probes, TLS requiring client certificates of `pki`, the
/// kubelet's Memory Manager policy `None` (a pod's pages are verified on every NUMA node, so its
/// streamed state alone decides), no reconcile while it runs, and `extra`.
pub fn host_agent_command(bin: &Path, pki: &Pki, extra: &[&str]) -> Command {
    pinned_host_agent_command(bin, pki, ["None", "none"], extra)
}

/// [`host_agent_command`] with the kubelet's Memory Manager and Topology Manager policies
/// `policies`.
pub fn pinned_host_agent_command(
    bin: &Path,
    pki: &Pki,
    [memory_manager, topology]: [&str; 2],
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("run")
        .args(["--ebpf", "on", "--reconcile-interval", "1h"])
        .args(["--memory-manager-policy", memory_manager])
        .args(["--topology-policy", topology])
        .args(pki.serving("agent"))
        .arg("--client-ca-file")
        .arg(pki.path("agents-ca.crt"))
        .args(extra);
    otel(&mut cmd, &[]);
    cmd
}

/// An agent's flags to serve `streams` watches at once beside the calls of a benchmark: its
/// `--api-threads`, and `--max-watchers` and `--max-connections` above `streams`.
pub fn watched_by(streams: usize, api_threads: &str) -> Vec<String> {
    [
        "--api-threads".to_owned(),
        api_threads.to_owned(),
        "--max-watchers".to_owned(),
        (streams + 64).to_string(),
        "--max-connections".to_owned(),
        (streams + 1024).to_string(),
    ]
    .into()
}

/// Starts `cmd` on `ip`:`port` and waits for its "agent running" line that `running` accepts.
pub fn start_agent(
    cmd: Command,
    ip: Ipv4Addr,
    port: u16,
    running: impl Fn(&Value) -> bool,
) -> Agent {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut agent = Agent::start_at(cmd, uid, SocketAddr::new(IpAddr::V4(ip), port));
    agent.wait_for("agent running", Duration::from_secs(20), running);
    agent
}

/// Sets `env` on `cmd`, and no other `OTEL_*` variable of the tests' environment.
fn otel(cmd: &mut Command, env: &[(&str, &str)]) {
    for (var, _) in std::env::vars_os().filter(|(v, _)| v.to_string_lossy().starts_with("OTEL_")) {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
}

/// The webhook `bin`, on a free loopback port, calling agents on `agent_port` under `policy`
/// and `timeout`, its Node cache kept from `api`, with the `OTEL_*` variables of `env` (none
/// other set); returned once it serves (its Node cache may not have synced yet: see
/// [`wait_ready`]).
pub fn webhook(
    bin: &Path,
    pki: &Pki,
    api: &StandInApiServer,
    agent_port: u16,
    policy: &str,
    timeout: &str,
    env: &[(&str, &str)],
) -> Agent {
    webhook_with(bin, pki, api, agent_port, [policy, timeout], env, &[])
}

/// [`webhook`] under `[policy, timeout]` with the flags `extra` too.
pub fn webhook_with(
    bin: &Path,
    pki: &Pki,
    api: &StandInApiServer,
    agent_port: u16,
    policy_timeout: [&str; 2],
    env: &[(&str, &str)],
    extra: &[&str],
) -> Agent {
    let agents_ca = pki.path("agents-ca.crt");
    let mut cmd = webhook_command(bin, pki, api, agent_port, &agents_ca, policy_timeout, extra);
    otel(&mut cmd, env);
    started_webhook(cmd)
}

/// [`webhook_with`] with no `OTEL_*` variable, verifying the agents' certificates by the CA in
/// `agent_ca`.
pub fn webhook_trusting(
    bin: &Path,
    pki: &Pki,
    api: &StandInApiServer,
    agent_port: u16,
    agent_ca: &Path,
    policy_timeout: [&str; 2],
    extra: &[&str],
) -> Agent {
    let mut cmd = webhook_command(bin, pki, api, agent_port, agent_ca, policy_timeout, extra);
    otel(&mut cmd, &[]);
    started_webhook(cmd)
}

/// `bin webhook` with the flags of [`webhook_trusting`].
fn webhook_command(
    bin: &Path,
    pki: &Pki,
    api: &StandInApiServer,
    agent_port: u16,
    agent_ca: &Path,
    [policy, timeout]: [&str; 2],
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("webhook")
        .arg("--kubeconfig")
        .arg(api.kubeconfig(pki.dir.path()))
        .args(pki.serving("webhook"))
        .args(["--agent-port", &agent_port.to_string()])
        .arg("--agent-ca-file")
        .arg(agent_ca)
        .arg("--agent-client-cert-file")
        .arg(pki.path("client.crt"))
        .arg("--agent-client-key-file")
        .arg(pki.path("client.key"))
        .args(["--failure-policy", policy, "--agent-timeout", timeout])
        .args(extra);
    cmd
}

/// The webhook `cmd` starts, once it serves.
fn started_webhook(cmd: Command) -> Agent {
    let mut webhook = Agent::start(cmd);
    webhook.wait_for("webhook running", Duration::from_secs(20), |_| true);
    webhook
}

/// A kept-alive HTTPS connection to the webhook on 127.0.0.1:`port`, which is verified by its
/// CA and name.
pub fn connection(pki: &Pki, port: u16) -> Connection {
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    let name = ServerName::try_from(WEBHOOK_NAME).expect("a DNS name");
    Connection::open_as(port, config, name).expect("connect to the webhook")
}

/// `GET path` on the webhook over HTTPS: the status and the body as JSON (`null` if it is not).
pub fn get(pki: &Pki, webhook: &Agent, path: &str) -> (u16, Value) {
    let (status, body) = get_text(pki, webhook, path);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `GET path` on the webhook over HTTPS: the status and the body.
pub fn get_text(pki: &Pki, webhook: &Agent, path: &str) -> (u16, String) {
    let answer = connection(pki, webhook.port)
        .request("GET", path, None, "")
        .expect("an answer");
    (answer.status, answer.body)
}

/// Waits until the webhook's `/readyz` answers 200 (its Node cache synced), up to `within`.
pub fn wait_ready(pki: &Pki, webhook: &Agent, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    while get(pki, webhook, "/readyz").0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the webhook never became ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A pending pod as the API server stores it: `hugepages` of 2 MiB pages (none when `None`),
/// Guaranteed.
pub fn pod(hugepages: Option<&str>) -> Value {
    pod_as("dpdk-0", POD_UID, hugepages)
}

/// [`pod`] with its own name and UID.
pub fn pod_as(name: &str, uid: &str, hugepages: Option<&str>) -> Value {
    let mut resources = json!({"cpu": "1", "memory": "1Gi"});
    if let Some(h) = hugepages {
        resources["hugepages-2Mi"] = json!(h);
    }
    json!({
        "metadata": {
            "name": name,
            "namespace": "telco",
            "uid": uid,
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
pub fn node(name: &str, ip: Ipv4Addr, hugepages: &str) -> Value {
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

/// `ExtenderArgs` of the `nodes` form (`nodeCacheCapable: false`).
pub fn args(pod: Value, nodes: &[Value]) -> Value {
    json!({"pod": pod, "nodes": {"metadata": {}, "items": nodes}})
}

/// An `AdmissionReview` of `pod`'s creation in `telco`, as kube-apiserver sends it to an admission
/// webhook (`admission.k8s.io/v1`: the request's kinds and resources, the creating user, the
/// options), its request `uid`, a dry run or not.
pub fn creation_review(pod: &Value, uid: &str, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "telco",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// `POST path` with `body` to the webhook over HTTPS, verifying it by its CA and name.
pub fn call(pki: &Pki, webhook: &Agent, path: &str, body: &Value) -> (u16, Value) {
    let answer = connection(pki, webhook.port)
        .request("POST", path, Some("application/json"), &body.to_string())
        .expect("an answer");
    let value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {:?}", answer.body));
    (answer.status, value)
}

/// The webhook's `GET /metrics`, over HTTPS.
pub fn metrics(pki: &Pki, webhook: &Agent) -> String {
    let answer = connection(pki, webhook.port)
        .request("GET", "/metrics", None, "")
        .expect("an answer");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// The value of `series` (name and labels as written) in an exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// An `AdmissionReview` as kube-apiserver sends it for the binding kube-scheduler creates
/// (`DefaultBinder`: a `v1.Binding` named and namespaced as the pod, with its UID, targeting the
/// Node): `pods/binding` CREATE, `admission.k8s.io/v1` (`types.go` of `k8s.io/api/admission/v1`).
pub fn binding_review(pod: &Value, node: &str, dry_run: bool) -> Value {
    let meta = &pod["metadata"];
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("review-{}-{node}-{dry_run}", meta["name"].as_str().unwrap_or("")),
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "requestKind": {"group": "", "version": "v1", "kind": "Binding"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "binding",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
            "object": {
                "kind": "Binding",
                "apiVersion": "v1",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"], "creationTimestamp": null},
                "target": {"kind": "Node", "name": node}
            },
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// `POST /admission/validate` with `review`: the answer's `response`, after checking that it is
/// an `AdmissionReview` answering this request's `uid`.
pub fn validate(pki: &Pki, webhook: &Agent, review: &Value) -> Value {
    let (status, answer) = call(pki, webhook, "/admission/validate?timeout=5s", review);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
    assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
    assert_eq!(
        answer["response"]["uid"], review["request"]["uid"],
        "{answer}"
    );
    answer["response"].clone()
}
