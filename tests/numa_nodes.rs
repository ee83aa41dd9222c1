//! Bug (#40): the agent exited on machines with more than eight NUMA nodes. Real agent processes
//! (`run --ebpf off`) over host trees of 9, 16 and 64 NUMA nodes, all but two of them CPU-less
//! as CXL memory expanders show them, asked over their real sockets, and `merge` as a shell
//! runs it:
//!
//! * the kubelet's defaults (Topology Manager policy `none`, Memory Manager `None`): the agent
//!   runs and verifies on every node; with the Memory Manager pinning (`Static`) it selects
//!   NUMA nodes as the kubelet would on 9 and 16 nodes, and on 64, where the Memory Manager's
//!   hints are 2^64-1 masks, says it does not work them out (503) and verifies given nodes;
//! * `single-numa-node` without `max-allowable-numa-nodes`, which the kubelet refuses to start
//!   with: the agent runs, says so (log, `GET /v1/kubelet`, a metric, `/readyz`), refuses the
//!   admissions that need the kubelet's selection saying why (503), and verifies the ones that
//!   name their NUMA nodes, with the map and the metrics as ever;
//! * with `max-allowable-numa-nodes` above the count: it selects one node, as the kubelet would.
//!
//! The kubelet is the one peer not run: its settings come from the agent's override flags,
//! which lay over its defaults exactly as its own files would (`kubeletconfig`).

use std::{path::Path, process::Command, time::Duration};

use hugepage_agent_tests::{Agent, agent_bin, http, numa_nodes, output, quiet_pressure};
use serde_json::{Value, json};

/// 2 MiB pages in each node's pool, all free.
const PAGES: u64 = 64;

/// A host tree of `count` NUMA nodes with [`PAGES`] free 2 MiB pages each and quiet pressure.
fn tree(count: u32) -> tempfile::TempDir {
    let tree = tempfile::tempdir().expect("a host tree");
    numa_nodes(tree.path(), count, 16 << 20, PAGES, PAGES);
    quiet_pressure(tree.path());
    tree
}

/// `run` over `root` with `flags`; waits until it runs.
fn agent(root: &Path, flags: &[&str]) -> Agent {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(root)
        .args(["--ebpf", "off"])
        .args(flags);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    agent
}

/// A dry run of one 2 MiB page for a Guaranteed pod, on `nodes` when given.
fn admit(agent: &Agent, nodes: Option<&[u32]>) -> (u16, Value) {
    let mut body = json!({
        "pod": {"namespace": "telco", "name": "dpdk", "qosClass": "Guaranteed"},
        "containers": [{"name": "app", "resources": {"hugepages-2Mi": "2Mi", "memory": "1Gi", "cpu": "1"}}]
    });
    if let Some(nodes) = nodes {
        body["numaNodes"] = json!(nodes);
    }
    let (status, answer) = http(
        agent.port,
        "POST",
        "/v1/admit?dryRun=true",
        Some("application/json"),
        &body.to_string(),
    );
    let answer = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    (status, answer)
}

fn get(agent: &Agent, path: &str) -> Value {
    let (status, body) = http(agent.port, "GET", path, None, "");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

fn refused_metric(agent: &Agent) -> f64 {
    let (_, text) = http(agent.port, "GET", "/metrics", None, "");
    text.lines()
        .find_map(|l| l.strip_prefix("hugepage_agent_kubelet_settings_refused "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no hugepage_agent_kubelet_settings_refused in\n{text}"))
}

/// The Memory Manager policy that pins memory to NUMA nodes, which selection needs.
const STATIC: [&str; 2] = ["--memory-manager-policy", "Static"];

#[test]
fn under_the_kubelets_default_policy_any_number_of_nodes_runs_and_verifies() {
    for count in [9, 16, 64] {
        let tree = tree(count);
        let agent = agent(tree.path(), &[]);
        let ready = get(&agent, "/readyz");
        assert_eq!(ready["kubelet"], Value::Null, "{count}: {ready}");
        assert_eq!(get(&agent, "/v1/kubelet")["refusal"], Value::Null);
        assert_eq!(refused_metric(&agent), 0.0);
        // The Memory Manager's None pins nothing: every node is verified.
        let (status, verdict) = admit(&agent, None);
        assert_eq!(status, 200, "{count}: {verdict}");
        assert_eq!(verdict["allowed"], true, "{count}: {verdict}");
        assert_eq!(
            verdict["numaNodes"].as_array().map(Vec::len),
            Some(count as usize)
        );
        let hugepages = get(&agent, "/v1/hugepages");
        let nodes = hugepages["nodes"].as_array().map_or(0, Vec::len);
        assert_eq!(nodes, count as usize, "{hugepages}");
        let last = count - 1;
        let (status, verdict) = admit(&agent, Some(&[last]));
        assert_eq!(
            (status, &verdict["allowed"]),
            (200, &json!(true)),
            "{verdict}"
        );
    }
}

#[test]
fn under_none_with_the_memory_manager_pinning_nodes_are_selected_up_to_the_hints_bound() {
    for count in [9, 16] {
        let tree = tree(count);
        let agent = agent(tree.path(), &STATIC);
        let (status, verdict) = admit(&agent, None);
        assert_eq!(status, 200, "{count}: {verdict}");
        assert_eq!(verdict["allowed"], true, "{count}: {verdict}");
        assert_eq!(verdict["numaNodes"], json!([0]), "{count}: {verdict}");
    }
    let tree = tree(64);
    let agent = agent(tree.path(), &STATIC);
    assert_eq!(get(&agent, "/readyz")["kubelet"], Value::Null);
    let (status, problem) = admit(&agent, None);
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "no-kubelet-selection");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("at most 16 nodes") && detail.contains("this machine has 64"),
        "{detail}"
    );
    let (status, verdict) = admit(&agent, Some(&[63]));
    assert_eq!(
        (status, &verdict["allowed"]),
        (200, &json!(true)),
        "{verdict}"
    );
}

#[test]
fn a_policy_the_kubelet_refuses_on_nine_nodes_is_reported_and_the_agent_serves_on() {
    let tree = tree(9);
    let flags = ["--topology-policy", "single-numa-node"];
    let mut agent = agent(tree.path(), &[&STATIC[..], &flags].concat());
    let warned = agent.wait_for(
        "the kubelet would not start with these settings on this machine: the Topology Manager: policy single-numa-node on 9 NUMA nodes: the kubelet's Topology Manager does not start on machines with more than 8 (its option max-allowable-numa-nodes raises that); the agent goes on (the map, verification on given NUMA nodes, consumers, PSI and telemetry), and admissions that need the kubelet's NUMA selection are refused saying so",
        Duration::from_secs(5),
        |line| line["level"] == "WARN",
    );
    assert!(warned["origin"].is_string(), "{warned}");
    let refusal = get(&agent, "/v1/kubelet")["refusal"].clone();
    let refusal = refusal.as_str().expect("a refusal").to_owned();
    assert!(refusal.contains("9 NUMA nodes"), "{refusal}");
    assert_eq!(get(&agent, "/readyz")["kubelet"], json!(refusal));
    assert_eq!(refused_metric(&agent), 1.0);

    let (status, problem) = admit(&agent, None);
    assert_eq!(status, 503, "{problem}");
    assert_eq!(problem["type"], "no-kubelet-selection");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&refusal) && detail.contains("give numaNodes"),
        "{detail}"
    );
    let (status, verdict) = admit(&agent, Some(&[7]));
    assert_eq!(status, 200, "{verdict}");
    assert_eq!(verdict["allowed"], true, "{verdict}");
    let too_much = json!({"containers": [{"name": "a", "resources": {"hugepages-2Mi": format!("{}Mi", 2 * PAGES + 2)}}], "numaNodes": [7]});
    let (status, verdict) = http(
        agent.port,
        "POST",
        "/v1/admit?dryRun=true",
        Some("application/json"),
        &too_much.to_string(),
    );
    assert_eq!(status, 200, "{verdict}");
    let verdict: Value = serde_json::from_str(&verdict).expect("a verdict");
    assert_eq!(verdict["allowed"], false, "{verdict}");
    assert_eq!(
        verdict["message"],
        "insufficient hugepages-2Mi on NUMA node(s) [7]: requested 130Mi, available 128Mi"
    );
    assert_eq!(
        get(&agent, "/v1/hugepages")["nodes"]
            .as_array()
            .map_or(0, Vec::len),
        9
    );
    let (status, _) = http(agent.port, "GET", "/v1/consumers", None, "");
    assert_eq!(status, 200);
    let (status, _) = http(agent.port, "GET", "/v1/conditions", None, "");
    assert_eq!(status, 200);
    let (exit, log) = agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:?}");
}

#[test]
fn with_max_allowable_numa_nodes_above_the_count_the_kubelets_selection_is_made() {
    for count in [9, 16] {
        let tree = tree(count);
        let option = format!("max-allowable-numa-nodes={count}");
        let flags = ["--topology-policy", "single-numa-node"];
        let agent = agent(
            tree.path(),
            &[&STATIC[..], &flags, &["--topology-policy-options", &option]].concat(),
        );
        assert_eq!(get(&agent, "/readyz")["kubelet"], Value::Null);
        let (status, verdict) = admit(&agent, None);
        assert_eq!(status, 200, "{count}: {verdict}");
        assert_eq!(verdict["allowed"], true, "{verdict}");
        assert_eq!(
            verdict["numaNodes"],
            json!([0]),
            "single-numa-node picks one node: {verdict}"
        );
    }
}

#[test]
fn merge_takes_nine_nodes_under_none_and_refuses_them_under_the_others_as_the_kubelet_does() {
    let dir = tempfile::tempdir().expect("a directory");
    let run = |policy: &str, options: Value| {
        let file = dir.path().join(format!("{policy}.json"));
        let input = json!({
            "policy": policy,
            "policyOptions": options,
            "numaNodes": (0..9).collect::<Vec<u32>>(),
            "providers": [{"memory": [{"numaNodes": [3], "preferred": true}]}]
        });
        std::fs::write(&file, input.to_string()).expect("the merge file");
        let mut cmd = Command::new(agent_bin());
        cmd.arg("merge").arg("--input").arg(&file);
        output(cmd)
    };
    let (status, out, err) = run("none", json!({}));
    assert!(status.success(), "{err}");
    let merged: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(merged["admit"], true, "{merged}");
    let (status, _, err) = run("single-numa-node", json!({}));
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("policy single-numa-node on 9 NUMA nodes"),
        "{err}"
    );
    let (status, out, err) = run("single-numa-node", json!({"max-allowable-numa-nodes": "9"}));
    assert!(status.success(), "{err}");
    let merged: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(merged["numaNodes"], json!([3]), "{merged}");
}

/// The kubelet's own file reserves more memory on a node than it has: the kubelet would not
/// start with it, and the agent did not either (the Memory Manager's state could not be built).
/// It runs, says why, and verifies requests that name their nodes.
#[test]
fn reserved_memory_beyond_a_node_in_the_kubelets_file_is_reported_and_the_agent_serves_on() {
    let tree = tree(2);
    hugepage_agent_tests::put(
        tree.path(),
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 1Ti\n",
    );
    let agent = agent(tree.path(), &[]);
    let ready = get(&agent, "/readyz");
    let why = ready["kubelet"].as_str().unwrap_or_default().to_owned();
    assert!(
        why.starts_with("the Memory Manager's state: the kubelet's reserved memory reserves 1Ti of memory on NUMA node 0"),
        "{ready}"
    );
    assert_eq!(refused_metric(&agent), 1.0);
    let (status, problem) = admit(&agent, None);
    assert_eq!(status, 503, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with(&why)),
        "{problem}"
    );
    let (status, verdict) = admit(&agent, Some(&[1]));
    assert_eq!(
        (status, &verdict["allowed"]),
        (200, &json!(true)),
        "{verdict}"
    );
}
