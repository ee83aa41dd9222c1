//! The machine itself and how the agent describes it: the guest is the machine the host defined
//! (its kernel, PREEMPT_RT or not, four nodes, their CPUs, the asymmetric distances, the
//! boot-time pools);
//! `status --json` equals sysfs for every node and size; `GET /v1/hugepages` shows each node's
//! CPUs and distances as sysfs has them, from probes that loaded (`source: ebpf+sysfs`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{CheckResult, Guest, sysfs};

pub fn machine(guest: &Guest) -> CheckResult {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(|e| format!("osrelease: {e}"))?;
    let release = release.trim();
    let kernel = &guest.machine["kernel"];
    let prefix = kernel["release_prefix"]
        .as_str()
        .ok_or("machine.json names no kernel")?;
    if !release.starts_with(prefix) {
        return Err(format!("kernel {release}, expected {prefix}*"));
    }
    // PREEMPT_RT kernels say so in /sys/kernel/realtime (1); others have no such file.
    let realtime = std::fs::read_to_string("/sys/kernel/realtime").is_ok_and(|r| r.trim() == "1");
    if Some(realtime) != kernel["realtime"].as_bool() {
        return Err(format!(
            "kernel {release}: PREEMPT_RT {realtime}, expected {}",
            kernel["realtime"]
        ));
    }
    let expected = guest.machine["nodes"]
        .as_array()
        .ok_or("machine.json has no nodes")?;
    let nodes = sysfs::nodes()?;
    if nodes.len() != expected.len() {
        return Err(format!("nodes {nodes:?}, expected {}", expected.len()));
    }
    for (node, want) in nodes.iter().zip(expected) {
        let cpus = sysfs::cpus(*node)?;
        let distances = sysfs::distances(*node)?;
        if serde_json::json!(cpus) != want["cpus"]
            || serde_json::json!(distances) != want["distances"]
        {
            return Err(format!(
                "node{node}: cpus {cpus:?} distances {distances:?}, expected {} {}",
                want["cpus"], want["distances"]
            ));
        }
        for size in [sysfs::SIZE_2M, sysfs::SIZE_1G] {
            let total = sysfs::node_pool(*node, size)?.total;
            if Some(total) != want["pools"][size.to_string()].as_u64() {
                return Err(format!(
                    "node{node} has {total} pages of {size} bytes, the kernel command line asked {}",
                    want["pools"][size.to_string()]
                ));
            }
        }
    }
    let rows: Vec<String> = nodes
        .iter()
        .map(|n| sysfs::distances(*n).map(|d| format!("{d:?}")))
        .collect::<Result<_, _>>()?;
    Ok(format!(
        "kernel {release}{}, nodes {nodes:?} with one CPU each, distances {}, boot pools as asked",
        if realtime { " (PREEMPT_RT)" } else { "" },
        rows.join(" ")
    ))
}

pub fn status_json(guest: &Guest) -> CheckResult {
    let out = guest
        .agent()
        .args(["status", "--json"])
        .output()
        .map_err(|e| format!("running status: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "status --json: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let status: Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("JSON: {e}"))?;
    let kernel = sysfs::node_pools()?;
    let mut shown = BTreeMap::new();
    for pool in status["nodes"].as_array().ok_or("no nodes in status")? {
        let key = (
            pool["node"].as_u64().unwrap_or(u64::MAX) as u32,
            pool["pageSizeBytes"].as_u64().unwrap_or(0),
        );
        shown.insert(
            key,
            sysfs::Pool {
                total: pool["total"].as_u64().unwrap_or(u64::MAX),
                free: pool["free"].as_u64().unwrap_or(u64::MAX),
                surplus: pool["surplus"].as_u64().unwrap_or(u64::MAX),
            },
        );
    }
    if shown != kernel {
        return Err(format!("status shows {shown:?}, sysfs has {kernel:?}"));
    }
    let global = sysfs::global_pools()?;
    for pool in status["global"].as_array().ok_or("no global in status")? {
        let size = pool["pageSizeBytes"].as_u64().unwrap_or(0);
        let (want, reserved) = global.get(&size).ok_or(format!("unknown size {size}"))?;
        let got = (
            pool["total"].as_u64(),
            pool["free"].as_u64(),
            pool["surplus"].as_u64(),
            pool["reserved"].as_u64(),
        );
        if got
            != (
                Some(want.total),
                Some(want.free),
                Some(want.surplus),
                Some(*reserved),
            )
        {
            return Err(format!(
                "global {size}: status {pool}, sysfs {want:?} resv {reserved}"
            ));
        }
    }
    let frees: Vec<String> = kernel
        .iter()
        .map(|((node, size), p)| format!("{node}/{}M:{}", size >> 20, p.free))
        .collect();
    Ok(format!(
        "{} node pools and {} global pools equal sysfs (free {})",
        kernel.len(),
        global.len(),
        frees.join(" ")
    ))
}

pub fn api_hugepages(port: u16) -> CheckResult {
    let (status, body) = hugepage_agent_tests::http(port, "GET", "/v1/hugepages", None, "");
    if status != 200 {
        return Err(format!("GET /v1/hugepages: {status} {body}"));
    }
    let map: Value = serde_json::from_str(&body).map_err(|e| format!("JSON: {e}"))?;
    if map["source"] != "ebpf+sysfs" {
        return Err(format!(
            "source {}, expected ebpf+sysfs (probes loaded)",
            map["source"]
        ));
    }
    let nodes = map["nodes"].as_array().ok_or("no nodes")?;
    let ids: Vec<u64> = nodes.iter().filter_map(|n| n["node"].as_u64()).collect();
    if ids != [0, 1, 2, 3] {
        return Err(format!("nodes {ids:?}"));
    }
    for node in nodes {
        let id = node["node"].as_u64().unwrap_or(0) as u32;
        let cpus = serde_json::json!(sysfs::cpus(id)?);
        let distances = serde_json::json!(sysfs::distances(id)?);
        if node["cpus"] != cpus || node["distances"] != distances {
            return Err(format!(
                "node {id}: API cpus {} distances {}, sysfs {cpus} {distances}",
                node["cpus"], node["distances"]
            ));
        }
    }
    Ok(format!(
        "source ebpf+sysfs, 4 nodes with sysfs's CPUs and distances (node 3: {})",
        nodes[3]["distances"]
    ))
}
