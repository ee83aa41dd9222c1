//! A consumer bound to node 2: `toucher` in a cgroup of its own, on node 2's CPU, its 2 MiB
//! pages bound to node 2 with `mbind`. Only node 2's `free_hugepages` falls, by exactly what it
//! touched; the agent's map shows it soon after, in a snapshot a fault prompted (eBPF, not the
//! periodic reconcile); the probe reports the faults with the 2 MiB page size read through the
//! offsets of this kernel's BTF, the faulting CPU and its node; `/v1/consumers` names the cgroup
//! with its pages on node 2 (`hugetlb.2MB.numa_stat`).

use std::time::{Duration, Instant};

use hugepage_agent_tests::{Agent, HostLock, TestCgroup, Toucher, http};
use serde_json::Value;

use crate::{CheckResult, Guest, sysfs};

const PAGES: u64 = 4;
const NODE: u32 = 2;

pub fn mbind_node2(guest: &Guest, lock: &HostLock, agent: &mut Agent) -> CheckResult {
    let cgroup = TestCgroup::create(lock, "mbind");
    let before = sysfs::node_pools()?;
    let toucher = Toucher::run_with(
        &guest.toucher(),
        Some(&cgroup.dir),
        PAGES as usize,
        0,
        &["--cpu", &NODE.to_string(), "--node", &NODE.to_string()],
    );
    let touched = Instant::now();
    let after = sysfs::node_pools()?;
    for (key, pool) in &after {
        let was = before[key].free;
        let want = if *key == (NODE, sysfs::SIZE_2M) {
            was - PAGES
        } else {
            was
        };
        if pool.free != want {
            return Err(format!(
                "node {} size {}: free {} -> {}, expected {want}",
                key.0, key.1, was, pool.free
            ));
        }
    }
    let want_free = after[&(NODE, sysfs::SIZE_2M)].free;
    let (seen_after, fault_to_map) = map_shows(agent.port, want_free, touched)?;
    let fault = agent.wait_for("hugetlb fault", Duration::from_secs(10), |l| {
        l["tgid"] == toucher.pid
    });
    let expected = (
        fault["page_size"].as_u64(),
        fault["numa_node"].as_u64(),
        fault["cpu"].as_u64(),
        fault["cgroup_id"].as_u64(),
    );
    if expected != (Some(sysfs::SIZE_2M), Some(2), Some(2), Some(cgroup.id)) {
        return Err(format!(
            "fault event {fault}: expected 2 MiB pages, node 2, cpu 2, cgroup {}",
            cgroup.id
        ));
    }
    let on_node = consumer_on_node(agent.port, &cgroup.rel)?;
    if on_node != PAGES * sysfs::SIZE_2M {
        return Err(format!(
            "/v1/consumers shows {on_node} bytes on node 2 for {}, expected {}",
            cgroup.rel,
            PAGES * sysfs::SIZE_2M
        ));
    }
    drop(toucher);
    Ok(format!(
        "node 2 free {} -> {want_free}, other pools unchanged; map showed it {} ms after the \
         toucher returned (faultToMapMicros {fault_to_map}); fault event 2 MiB on cpu 2 node 2; \
         /v1/consumers: {} holds {on_node} bytes on node 2",
        before[&(NODE, sysfs::SIZE_2M)].free,
        seen_after.as_millis(),
        cgroup.rel
    ))
}

/// Polls `/v1/hugepages` until node 2's 2 MiB free count is `free`; how long after `since`, and
/// that snapshot's `faultToMapMicros` (present only when a fault prompted it).
fn map_shows(port: u16, free: u64, since: Instant) -> Result<(Duration, u64), String> {
    let mut last = Value::Null;
    while since.elapsed() < Duration::from_secs(10) {
        let (_, body) = http(port, "GET", "/v1/hugepages", None, "");
        last = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}"))?;
        let shown = last["nodes"][NODE as usize]["sizes"]
            .as_array()
            .and_then(|sizes| sizes.iter().find(|s| s["pageSizeBytes"] == sysfs::SIZE_2M))
            .and_then(|s| s["free"].as_u64());
        if shown == Some(free) {
            let micros = last["faultToMapMicros"].as_u64().unwrap_or(0);
            if micros == 0 {
                return Err(format!(
                    "the map shows node 2's free pages but no fault prompted it: {last}"
                ));
            }
            return Ok((since.elapsed(), micros));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Err(format!(
        "the map never showed {free} free on node 2 within 10 s: {last}"
    ))
}

/// Bytes `/v1/consumers` shows on node 2 (2 MiB pages) for the cgroup `rel`.
fn consumer_on_node(port: u16, rel: &str) -> Result<u64, String> {
    let (status, body) = http(port, "GET", "/v1/consumers", None, "");
    if status != 200 {
        return Err(format!("GET /v1/consumers: {status} {body}"));
    }
    let list: Value = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}"))?;
    let consumer = list["consumers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["cgroup"] == rel))
        .ok_or_else(|| format!("{rel} is not in /v1/consumers: {body}"))?;
    Ok(consumer["sizes"]
        .as_array()
        .and_then(|sizes| sizes.iter().find(|s| s["pageSizeBytes"] == sysfs::SIZE_2M))
        .and_then(|s| s["perNode"][NODE.to_string()].as_u64())
        .unwrap_or(0))
}
