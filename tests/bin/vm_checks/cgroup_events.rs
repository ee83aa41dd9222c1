//! The probes' cgroup events on 6.1 (`cgroup/cgroup_mkdir`, `cgroup_attach_task`,
//! `cgroup_rmdir`, `cgroup_release`, their fields at the offsets of this kernel's tracepoint
//! formats): a kubepods-shaped tree is made under a test cgroup of the v2 hierarchy
//! (`kubepods/burstable/pod<uid>/<container id>`, the hugetlb controller enabled down to the
//! container as the kubelet has it), a `toucher` joins the container's cgroup and faults one
//! 2 MiB page, and the tree is removed. The shared agent (`--ebpf on`) must log a `cgroup event`
//! for each: every mkdir with the directory's inode as its id, its path, its level and, for the
//! pod and the container, the pod UID, the QoS class and the container id its path encodes; the
//! toucher's attach with its pid; every rmdir and release. The toucher's fault is reported with
//! the new cgroup's id (a mkdir puts a cgroup into the watched set). The counters
//! `hugepage_agent_cgroup_events_total` rise by at least as much.

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{Agent, HostLock, TestCgroup, Toucher, http, pod_cgroups};
use serde_json::Value;

use crate::{CheckResult, Guest};

const UID: &str = "18000000-0000-4000-8000-000000000004";
const CONTAINER: &str = "1800000000000000000000000000000000000000000000000000000000000004";
const WITHIN: Duration = Duration::from_secs(10);
const CHANGES: [&str; 4] = ["mkdir", "attach_task", "rmdir", "release"];

/// One directory of the tree: its id, its path as events report it, its level.
struct Dir {
    id: u64,
    rel: String,
    level: u64,
}

pub fn kubepods_shaped(guest: &Guest, lock: &HostLock, agent: &mut Agent) -> CheckResult {
    let before = counters(agent.port)?;
    let started = Instant::now();
    let root = TestCgroup::create(lock, "events");
    let parts = ["kubepods", "burstable", &format!("pod{UID}"), CONTAINER];
    let (nested, leaf) = pod_cgroups(&root, &parts);
    let root_level = root.rel.matches('/').count() as u64;
    let mut dirs = vec![Dir {
        id: root.id,
        rel: root.rel.clone(),
        level: root_level,
    }];
    let mut rel = root.rel.clone();
    for (i, (part, dir)) in parts.iter().zip(&nested.0).enumerate() {
        rel = format!("{rel}/{part}");
        let id = std::fs::metadata(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .ino();
        dirs.push(Dir {
            id,
            rel: rel.clone(),
            level: root_level + 1 + i as u64,
        });
    }
    for (i, dir) in dirs.iter().enumerate() {
        let line = wait_event(agent, "mkdir", dir.id)?;
        let owner = match i {
            3 => (Some(UID), Some("Burstable"), None),
            4 => (Some(UID), Some("Burstable"), Some(CONTAINER)),
            _ => (None, None, None),
        };
        let shown = (
            line["path"].as_str(),
            line["cgroup_level"].as_u64(),
            line["hierarchy"].as_i64(),
            line["pod_uid"].as_str(),
            line["qos"].as_str(),
            line["container_id"].as_str(),
        );
        if shown
            != (
                Some(dir.rel.as_str()),
                Some(dir.level),
                Some(0),
                owner.0,
                owner.1,
                owner.2,
            )
        {
            return Err(format!(
                "mkdir of {} (id {}, level {}): the agent logged {line}, expected owner {owner:?}",
                dir.rel, dir.id, dir.level
            ));
        }
    }
    let mkdirs_seen = started.elapsed();
    let leaf_id = dirs.last().map_or(0, |d| d.id);
    let toucher = Toucher::run_with(&guest.toucher(), Some(&leaf), 1, 0, &["--cpu", "1"]);
    let attach = wait_event(agent, "attach_task", leaf_id)?;
    if attach["pid"].as_u64() != Some(u64::from(toucher.pid)) {
        return Err(format!(
            "attach to the container's cgroup: logged {attach}, expected pid {}",
            toucher.pid
        ));
    }
    let fault = agent
        .log
        .wait_for("hugetlb fault", WITHIN, |l| l["tgid"] == toucher.pid);
    if fault["cgroup_id"].as_u64() != Some(leaf_id) {
        return Err(format!(
            "the toucher's fault {fault}: expected the container's cgroup {leaf_id}"
        ));
    }
    drop(toucher);
    let removing = Instant::now();
    drop(nested);
    drop(root);
    for dir in &dirs {
        wait_event(agent, "rmdir", dir.id)?;
    }
    let rmdirs_seen = removing.elapsed();
    for dir in &dirs {
        wait_event(agent, "release", dir.id)?;
    }
    let released = removing.elapsed();
    let after = counters(agent.port)?;
    let ours = BTreeMap::from([
        ("mkdir", 5),
        ("attach_task", 1),
        ("rmdir", 5),
        ("release", 5),
    ]);
    let mut rises = Vec::new();
    for change in CHANGES {
        let rise = after
            .get(change)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(change).copied().unwrap_or(0));
        if rise < ours[change] {
            return Err(format!(
                "hugepage_agent_cgroup_events_total{{event=\"{change}\"}} rose by {rise}, less \
                 than the {} events this check made: {before:?} -> {after:?}",
                ours[change]
            ));
        }
        rises.push(format!("{change} +{rise}"));
    }
    Ok(format!(
        "5 mkdirs of {}/kubepods/burstable/pod<uid>/<container> logged within {} ms with their \
         inode ids, paths and levels {}-{} (pod: uid and Burstable; container: its id too); the \
         toucher's attach_task with its pid, its 2 MiB fault with the container's cgroup id; \
         5 rmdirs within {} ms of the removal, 5 releases within {} ms; \
         hugepage_agent_cgroup_events_total {}",
        dirs.first().map_or("", |d| d.rel.as_str()),
        mkdirs_seen.as_millis(),
        root_level,
        root_level + 4,
        rmdirs_seen.as_millis(),
        released.as_millis(),
        rises.join(", ")
    ))
}

/// The `cgroup event` line of `change` for cgroup `id`.
fn wait_event(agent: &mut Agent, change: &str, id: u64) -> Result<Value, String> {
    let line = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        agent.log.wait_for("cgroup event", WITHIN, |l| {
            l["change"] == change && l["cgroup_id"].as_u64() == Some(id)
        })
    }));
    line.map_err(|_| {
        format!(
            "no cgroup event {change} for cgroup {id} within {} s",
            WITHIN.as_secs()
        )
    })
}

/// `hugepage_agent_cgroup_events_total` per event, from `/metrics`.
fn counters(port: u16) -> Result<BTreeMap<String, u64>, String> {
    let (status, text) = http(port, "GET", "/metrics", None, "");
    if status != 200 {
        return Err(format!("GET /metrics: {status}"));
    }
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("hugepage_agent_cgroup_events_total{event=\"") else {
            continue;
        };
        let Some((event, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let value: f64 = value
            .trim()
            .parse()
            .map_err(|e| format!("/metrics: {line:?}: {e}"))?;
        counts.insert(event.to_owned(), value as u64);
    }
    if CHANGES.iter().any(|c| !counts.contains_key(*c)) {
        return Err(format!(
            "/metrics has hugepage_agent_cgroup_events_total for {:?} only",
            counts.keys().collect::<Vec<_>>()
        ));
    }
    Ok(counts)
}
