//! KEP-5759's stories on real NUMA nodes, from the shell (`check`) and over HTTP
//! (`POST /v1/admit`). Story 1: a consumer outside Kubernetes holds node 2's 1 GiB page; a
//! Guaranteed pod asking 1Gi is refused on node 2 with the KEP's message and admitted on node 3.
//! Story 2: a pod spanning nodes `[0,1]` is verified on the sum of both nodes' free pages, one
//! page more than they have refused with the exact message, exactly what they have admitted.

use std::time::Duration;

use hugepage_agent_tests::{Agent, HostLock, TestCgroup, Toucher};
use serde_json::{Value, json};

use crate::{CheckResult, Guest, admit, sysfs};

pub fn story1(guest: &Guest, lock: &HostLock, agent: &mut Agent) -> CheckResult {
    let cgroup = TestCgroup::create(lock, "story1");
    let toucher = Toucher::run_with(
        &guest.toucher(),
        Some(&cgroup.dir),
        1,
        0,
        &[
            "--cpu",
            "2",
            "--node",
            "2",
            "--huge-size",
            &sysfs::SIZE_1G.to_string(),
        ],
    );
    let (free2, free3) = (
        sysfs::node_pool(2, sysfs::SIZE_1G)?.free,
        sysfs::node_pool(3, sysfs::SIZE_1G)?.free,
    );
    if (free2, free3) != (0, 1) {
        return Err(format!(
            "1 GiB pages free on nodes 2 and 3: {free2} {free3}, expected 0 1"
        ));
    }
    let fault = agent.wait_for("hugetlb fault", Duration::from_secs(10), |l| {
        l["tgid"] == toucher.pid
    });
    if (fault["page_size"].as_u64(), fault["numa_node"].as_u64()) != (Some(sysfs::SIZE_1G), Some(2))
    {
        return Err(format!(
            "fault event {fault}: expected a 1 GiB page on node 2"
        ));
    }
    let message = "insufficient hugepages-1Gi on NUMA node(s) [2]: requested 1Gi, available 0";
    let request = ["hugepages-1Gi=1Gi", "memory=64Mi"];
    expect_check(guest, &request, "2", Some(message))?;
    expect_check(guest, &request, "3", None)?;
    let resources = json!({"hugepages-1Gi": "1Gi", "memory": "64Mi"});
    expect_admit(agent.port, "story1-on-2", &resources, &[2], Some(message))?;
    expect_admit(agent.port, "story1-on-3", &resources, &[3], None)?;
    drop(toucher);
    Ok(format!(
        "consumer holds node 2's 1 GiB page (fault event: 1 GiB, node 2); check and /v1/admit \
         refuse [2] with \"{message}\", admit [3]"
    ))
}

pub fn story2(guest: &Guest, port: u16) -> CheckResult {
    let free =
        sysfs::node_pool(0, sysfs::SIZE_2M)?.free + sysfs::node_pool(1, sysfs::SIZE_2M)?.free;
    let (have, over) = (format!("{}Mi", free * 2), format!("{}Mi", (free + 1) * 2));
    let message = format!(
        "insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested {over}, available {have}"
    );
    let too_much = format!("hugepages-2Mi={over}");
    let exact = format!("hugepages-2Mi={have}");
    expect_check(guest, &[&too_much], "0,1", Some(&message))?;
    expect_check(guest, &[&exact], "0,1", None)?;
    expect_admit(
        port,
        "story2-over",
        &json!({"hugepages-2Mi": over}),
        &[0, 1],
        Some(&message),
    )?;
    expect_admit(
        port,
        "story2-exact",
        &json!({"hugepages-2Mi": have}),
        &[0, 1],
        None,
    )?;
    Ok(format!(
        "nodes [0,1] have {have} free together: {over} refused with \"{message}\", {have} admitted \
         (check and /v1/admit)"
    ))
}

/// `hugepage-agent check` on `numa`: refused with `message` (exit 1), or admitted (exit 0).
fn expect_check(
    guest: &Guest,
    requests: &[&str],
    numa: &str,
    message: Option<&str>,
) -> CheckResult {
    let mut cmd = guest.agent();
    cmd.arg("check");
    for r in requests {
        cmd.args(["--request", r]);
    }
    let out = cmd
        .args(["--numa", numa])
        .output()
        .map_err(|e| format!("running check: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ok = match message {
        Some(m) => out.status.code() == Some(1) && stderr.contains(m),
        None => out.status.code() == Some(0),
    };
    if !ok {
        return Err(format!(
            "check {requests:?} --numa {numa}: {} {stderr}, expected {}",
            out.status,
            message.unwrap_or("admitted")
        ));
    }
    Ok(String::new())
}

/// `POST /v1/admit` of a Guaranteed pod on `numa`: refused with `message`, or admitted.
fn expect_admit(
    port: u16,
    name: &str,
    resources: &Value,
    numa: &[u32],
    message: Option<&str>,
) -> CheckResult {
    let body = json!({
        "pod": {"namespace": "vm-test", "name": name, "uid": admit::pod_uid(name), "qosClass": "Guaranteed"},
        "containers": [{"name": "c", "resources": resources}],
        "numaNodes": numa,
    });
    let answer = admit::post(port, &format!("{name} on {numa:?}"), &body)?;
    let ok = match message {
        Some(m) => answer["allowed"] == false && answer["message"] == m,
        None => answer["allowed"] == true,
    };
    if !ok {
        return Err(format!(
            "POST /v1/admit {name} on {numa:?}: {answer}, expected {}",
            message.unwrap_or("allowed")
        ));
    }
    Ok(String::new())
}
