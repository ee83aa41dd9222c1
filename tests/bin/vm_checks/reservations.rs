//! What the agent holds for pods across nodes, and what the kubelet's bookkeeping misses, on the
//! four-node guest.
//!
//! Reservations: with the state built from sysfs and `prefer-closest-numa-nodes`, a Guaranteed
//! pod asking 72Mi of 2 MiB pages is selected on [2,3] (64 + 8 = 72Mi free: the reasoning is in
//! `selection.rs`) and, named by its UID, reserves them there: `GET /v1/reservations` shows the
//! reservation on [2,3]; a second pod asking one page on [2,3] is refused for the reserved pages,
//! while one on [0] is admitted.
//!
//! Discrepancy: a kubelet checkpoint believes node 3's 8Mi all free while a Burstable pod (a
//! `toucher` bound to node 3 in `kubepods/burstable/pod<uid>/<container>`) holds 3 pages there:
//! `GET /v1/discrepancy` shows 6Mi on node 3 only, naming the pod, and so does the gauge
//! `memory_manager_hugepages_discrepancy_bytes`.

use std::time::{Duration, Instant};

use hugepage_agent_tests::{HostLock, TestCgroup, Toucher, http, pod_cgroups};
use serde_json::{Value, json};

use crate::{CheckResult, Guest, admit, selection, sysfs};

const MI: u64 = 1 << 20;

pub fn across_nodes(guest: &Guest) -> CheckResult {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let agent = selection::start(
        guest,
        "sysfs-closest",
        &dir.path().join("no_memory_manager_state"),
        true,
    )?;
    let first = admit(agent.port, "reserve-a", 72, None)?;
    if first["allowed"] != true || first["numaNodes"] != json!([2, 3]) {
        return Err(format!(
            "72Mi with a UID: expected admitted on [2,3]: {first}"
        ));
    }
    let (status, body) = http(agent.port, "GET", "/v1/reservations", None, "");
    let list: Value = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}: {body}"))?;
    let all = list["reservations"].as_array().cloned().unwrap_or_default();
    let bytes = &all.first().unwrap_or(&Value::Null)["bytes"][sysfs::SIZE_2M.to_string()];
    if status != 200
        || all.len() != 1
        || all[0]["podUid"] != admit::pod_uid("reserve-a")
        || all[0]["numaNodes"] != json!([2, 3])
        || bytes.as_u64() != Some(72 * MI)
    {
        return Err(format!(
            "GET /v1/reservations: {status} {body}, expected 72Mi on [2,3]"
        ));
    }
    let message = "insufficient hugepages-2Mi on NUMA node(s) [2,3]: requested 2Mi, available 0";
    let second = admit(agent.port, "reserve-b", 2, Some(&[2, 3]))?;
    let reserved = second["checks"][0]["reservedByAgentBytes"].as_u64();
    if second["allowed"] != false || second["message"] != message || reserved != Some(72 * MI) {
        return Err(format!(
            "a second pod on [2,3]: expected \"{message}\" with 72Mi reserved: {second}"
        ));
    }
    let elsewhere = admit(agent.port, "reserve-c", 2, Some(&[0]))?;
    if elsewhere["allowed"] != true {
        return Err(format!("a pod on [0] is refused: {elsewhere}"));
    }
    Ok(format!(
        "72Mi admitted on [2,3] and reserved there (GET /v1/reservations: 1, 72Mi on [2,3]); a \
         second pod's 2Mi on [2,3] refused with \"{message}\" (reservedByAgentBytes 72Mi); 2Mi \
         on [0] admitted"
    ))
}

pub fn discrepancy(guest: &Guest, lock: &HostLock) -> CheckResult {
    const UID: &str = "18000000-0000-4000-8000-000000000003";
    const HELD: u64 = 3;
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let state = dir.path().join("memory_manager_state");
    std::fs::write(&state, selection::checkpoint(0))
        .map_err(|e| format!("writing the checkpoint: {e}"))?;
    let mut cmd = guest.agent();
    cmd.args(["run", "--ebpf", "off", "--memory-manager-policy", "Static"])
        .args(["--reconcile-interval", "1s", "--kubelet-state"])
        .arg(&state);
    let agent = guest.start_own("checkpoint", cmd, Duration::from_secs(60))?;
    let root = TestCgroup::create(lock, "discrepancy");
    let container = "1800000000000000000000000000000000000000000000000000000000000003";
    let (nested, cgroup) = pod_cgroups(
        &root,
        &["kubepods", "burstable", &format!("pod{UID}"), container],
    );
    let toucher = Toucher::run_with(
        &guest.toucher(),
        Some(&cgroup),
        HELD as usize,
        0,
        &["--cpu", "3", "--node", "3"],
    );
    let free3 = sysfs::node_pool(3, sysfs::SIZE_2M)?.free;
    if free3 != 4 - HELD {
        return Err(format!(
            "node 3 has {free3} free 2 MiB pages, expected {}",
            4 - HELD
        ));
    }
    let held = HELD * sysfs::SIZE_2M;
    let deadline = Instant::now() + Duration::from_secs(15);
    let nodes = loop {
        let (_, body) = http(agent.port, "GET", "/v1/discrepancy", None, "");
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let nodes: Vec<Value> = answer["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["resource"] == "hugepages-2Mi")
            .cloned()
            .collect();
        let on3 = nodes.iter().find(|n| n["numaNode"] == 3);
        if answer["source"] == "checkpoint"
            && on3.is_some_and(|n| n["discrepancyBytes"].as_u64() == Some(held))
        {
            break nodes;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "/v1/discrepancy never showed 6Mi on node 3: {body}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for node in &nodes {
        let on3 = node["numaNode"] == 3;
        let want = if on3 { held } else { 0 };
        if node["discrepancyBytes"].as_u64() != Some(want) {
            return Err(format!("expected discrepancy {want} here: {node}"));
        }
        if on3
            && (node["memoryManagerFreeBytes"].as_u64() != Some(8 * MI)
                || node["osFreeBytes"].as_u64() != Some(8 * MI - held)
                || node["untracked"][0]["podUid"] != UID
                || node["untracked"][0]["qos"] != "Burstable"
                || node["untracked"][0]["bytes"].as_u64() != Some(held))
        {
            return Err(format!(
                "node 3: expected 8Mi believed free, 2Mi free, pod {UID} (Burstable) holding 6Mi: {node}"
            ));
        }
    }
    let gauge = format!(
        "memory_manager_hugepages_discrepancy_bytes{{hugepage_size=\"2Mi\",numa_node=\"3\"}} {held}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, metrics) = http(agent.port, "GET", "/metrics", None, "");
        if metrics.lines().any(|l| l == gauge) {
            break;
        }
        if Instant::now() > deadline {
            let shown: Vec<&str> = metrics
                .lines()
                .filter(|l| l.starts_with("memory_manager_hugepages_discrepancy"))
                .collect();
            return Err(format!("no {gauge:?} in /metrics: {shown:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(toucher);
    drop(nested);
    Ok(format!(
        "the checkpoint believes node 3's 8Mi free, a Burstable pod holds 6Mi there (sysfs free \
         {free3} pages): /v1/discrepancy 6Mi on node 3 naming pod {UID} (Burstable), 0 on nodes \
         0-2; gauge {gauge}"
    ))
}

/// `POST /v1/admit` of Guaranteed pod `name` (with its UID, so an admission reserves) asking `mi`
/// MiB of 2 MiB pages and 64Mi of memory, under `restricted`, on `numa` or selected.
fn admit(port: u16, name: &str, mi: u64, numa: Option<&[u32]>) -> Result<Value, String> {
    let mut body = json!({
        "pod": {"namespace": "vm-test", "name": name, "uid": admit::pod_uid(name), "qosClass": "Guaranteed"},
        "containers": [{"name": "c", "resources": {"memory": "64Mi", "hugepages-2Mi": format!("{mi}Mi")}}],
        "topologyPolicy": "restricted",
    });
    if let Some(nodes) = numa {
        body["numaNodes"] = json!(nodes);
    }
    admit::post(port, name, &body)
}
