//! The agent reads the host tree it is given (`--host-root`) and writes nothing into it.
//!
//! Issue #14: over a copied host, whose `proc/pressure/{memory,io}` are ordinary files, the agent
//! armed its PSI triggers by writing `some 600000 2000000` into them, then could not parse them
//! and reported every condition Unknown. Here the real binary runs over a built host tree (two
//! NUMA nodes, pools, pressure files, a cgroup v2 tree with a pod, a kubelet checkpoint and
//! configuration file), the API is used, the agent is stopped with SIGTERM, and every file of
//! the tree is compared byte for byte with what was there before (nothing added, nothing
//! removed). No host state is changed.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use hugepage_agent_tests::{
    Agent, agent_bin, http, kubelet_checkpoint, put, two_numa_nodes, wait_ready,
};

const UID: &str = "14140000-0000-4000-8000-000000000001";
const UID_: &str = "14140000_0000_4000_8000_000000000001";
const ID: &str = "1414000000000000000000000000000000000000000000000000000000000001";
const MI2: u64 = 2 << 20;
/// Memory pressure over the threshold of 30 on both averages: the condition must be True.
const MEMORY: &str = "some avg10=60.00 avg60=55.00 avg300=20.00 total=123456789\nfull avg10=10.00 avg60=8.00 avg300=2.00 total=23456789\n";
const QUIET: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n";

/// A kubelet Memory Manager checkpoint (checksum and all) for two nodes that believes every
/// 2 MiB page free.
fn checkpoint() -> Vec<u8> {
    let table = |total: u64, free: u64| serde_json::json!({"total": total, "systemReserved": 0, "allocatable": total, "reserved": total - free, "free": free});
    let node = |n: u64| {
        serde_json::json!({
            "numberOfAssignments": 0,
            "memoryMap": {"memory": table(16 << 30, 16 << 30), "hugepages-2Mi": table(4 << 30, 4 << 30)},
            "cells": [n]
        })
    };
    kubelet_checkpoint(serde_json::json!({"0": node(0), "1": node(1)}))
}

/// Two nodes of 2048 2 MiB pages, 1024 free each; pressure files with memory over 30 %; a cgroup
/// v2 tree whose kubepods slice has pressure files and a Burstable pod holding 6 pages on node 0;
/// the kubelet's checkpoint and configuration file.
fn build(root: &Path) {
    let w = |path: &str, content: &str| put(root, path, content);
    put(root, "/var/lib/kubelet/memory_manager_state", checkpoint());
    // The kubelet's settings, where kubeadm writes them: the static policy, so hints are given.
    w(
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryManagerPolicy: Static\ntopologyManagerPolicy: single-numa-node\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 1Gi\n",
    );
    two_numa_nodes(root, 16 << 20, 2048, 1024);
    w("/proc/pressure/memory", MEMORY);
    w("/proc/pressure/io", QUIET);
    w(
        "/proc/pressure/cpu",
        "some avg10=1.00 avg60=1.00 avg300=1.00 total=5000\n",
    );
    let cg = "/sys/fs/cgroup";
    w(
        &format!("{cg}/cgroup.controllers"),
        "cpu io memory hugetlb\n",
    );
    w(
        &format!("{cg}/cgroup.subtree_control"),
        "cpu io memory hugetlb\n",
    );
    let kubepods = format!("{cg}/kubepods.slice");
    for resource in ["memory", "io", "cpu"] {
        w(&format!("{kubepods}/{resource}.pressure"), QUIET);
    }
    let pod = format!("{kubepods}/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
    let bytes = 6 * MI2;
    for dir in [
        kubepods.clone(),
        format!("{kubepods}/kubepods-burstable.slice"),
        pod.clone(),
        format!("{pod}/cri-containerd-{ID}.scope"),
    ] {
        w(&format!("{dir}/hugetlb.2MB.current"), &format!("{bytes}\n"));
        w(
            &format!("{dir}/hugetlb.2MB.rsvd.current"),
            &format!("{bytes}\n"),
        );
        w(
            &format!("{dir}/hugetlb.2MB.numa_stat"),
            &format!("total={bytes} N0={bytes} N1=0\n"),
        );
        w(&format!("{dir}/hugetlb.2MB.max"), "max\n");
    }
}

/// What is at one path of the tree.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32 },
    File { mode: u32, bytes: Vec<u8> },
    Link(PathBuf),
}

/// Every path under `root` (relative) with what is there, symbolic links not followed.
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let meta =
                fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mode = meta.permissions().mode();
            let what = if meta.is_dir() {
                stack.push(path.clone());
                Entry::Dir { mode }
            } else if meta.is_symlink() {
                Entry::Link(fs::read_link(&path).expect("readlink"))
            } else {
                let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                Entry::File { mode, bytes }
            };
            let rel = path
                .strip_prefix(root)
                .expect("under the root")
                .to_path_buf();
            out.insert(rel, what);
        }
    }
    out
}

/// The paths whose entries differ, were added or were removed, each with both sides.
fn differences(before: &BTreeMap<PathBuf, Entry>, after: &BTreeMap<PathBuf, Entry>) -> Vec<String> {
    let show = |e: Option<&Entry>| match e {
        None => "absent".to_owned(),
        Some(Entry::File { mode, bytes }) => {
            format!("file {mode:o} {:?}", String::from_utf8_lossy(bytes))
        }
        Some(other) => format!("{other:?}"),
    };
    before
        .keys()
        .chain(after.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| {
            format!(
                "{}: before {}, after {}",
                p.display(),
                show(before.get(p)),
                show(after.get(p))
            )
        })
        .collect()
}

fn get(port: u16, path: &str) -> serde_json::Value {
    let (status, body) = http(port, "GET", path, None, "");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

fn post(port: u16, path: &str, body: &serde_json::Value) -> serde_json::Value {
    let (status, answer) = http(
        port,
        "POST",
        path,
        Some("application/json"),
        &body.to_string(),
    );
    assert_eq!(status, 200, "POST {path}: {answer}");
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("POST {path}: {e}: {answer}"))
}

#[test]
fn a_run_over_a_copied_host_tree_writes_nothing_into_it_and_reads_its_pressure() {
    let tree = tempfile::tempdir().expect("a temporary host tree");
    let root = tree.path();
    build(root);
    let before = snapshot(root);
    assert!(before.len() > 60, "the tree was built: {}", before.len());

    // The agent's own state lives outside the host tree.
    let state = tempfile::tempdir().expect("a state directory");
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(root)
        .arg("--state-dir")
        .arg(state.path())
        .args([
            "--ebpf",
            "off",
            "--psi-memory-threshold",
            "30",
            "--psi-interval",
            "300ms",
            "--reconcile-interval",
            "300ms",
        ]);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    let port = agent.port;
    wait_ready(port, Duration::from_secs(10)).expect("the agent is ready");
    // Some ticks of the PSI interval and of the reconcile go by: each reads the tree again.
    std::thread::sleep(Duration::from_secs(1));

    let view = get(port, "/v1/conditions");
    let status = |kind: &str| {
        view["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == kind).cloned())
            .unwrap_or_else(|| panic!("{kind} is not listed: {view:#}"))
    };
    let memory = status("SystemMemoryContentionPressure");
    assert_eq!(memory["status"], "True", "{view:#}");
    assert_eq!(memory["reason"], "HighMemoryContentionPressure", "{memory}");
    for kind in [
        "SystemDiskContentionPressure",
        "KubepodsMemoryContentionPressure",
        "KubepodsDiskContentionPressure",
    ] {
        assert_eq!(status(kind)["status"], "False", "{kind}: {view:#}");
    }
    let triggers = view["triggers"].as_array().expect("triggers");
    assert_eq!(triggers.len(), 4, "memory and io of both scopes: {view:#}");
    for t in triggers {
        assert_eq!(t["armed"], false, "{t}");
        assert!(
            t["why"]
                .as_str()
                .is_some_and(|w| w.contains("not a kernel pressure file: it is on")),
            "{t}"
        );
    }

    let request = serde_json::json!({
        "pod": {"namespace": "net", "name": "dpdk", "uid": "14140000-0000-4000-8000-000000000002", "qosClass": "Guaranteed"},
        "containers": [{"name": "fwd", "resources": {"memory": "1Gi", "hugepages-2Mi": "1Gi"}}]
    });
    let answer = post(port, "/v1/admit", &request);
    assert_eq!(answer["allowed"], true, "{answer:#}");
    let hints = post(port, "/v1/hints", &request);
    assert!(hints["hints"]["hugepages-2Mi"].is_array(), "{hints:#}");
    let kubelet = get(port, "/v1/kubelet");
    assert_eq!(
        kubelet["settings"]["memoryManagerPolicy"]["source"], "file /var/lib/kubelet/config.yaml",
        "{kubelet:#}"
    );
    let pools = get(port, "/v1/hugepages");
    assert_eq!(pools["nodes"][1]["sizes"][0]["free"], 1024, "{pools:#}");
    let consumers = get(port, "/v1/consumers");
    assert!(
        consumers.to_string().contains(UID),
        "the pod is listed: {consumers:#}"
    );
    let discrepancy = get(port, "/v1/discrepancy");
    assert_eq!(discrepancy["source"], "checkpoint", "{discrepancy:#}");
    let (status, metrics) = http(port, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|l| l
            == r#"hugepage_agent_node_condition{condition="SystemMemoryContentionPressure",status="True"} 1"#),
        "{metrics}"
    );
    let (exit, log) = agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
    let unavailable: Vec<&str> = log
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| m.starts_with("PSI trigger unavailable"))
        .collect();
    assert_eq!(
        unavailable.len(),
        4,
        "logged once per file: {unavailable:#?}"
    );

    let after = snapshot(root);
    let changed = differences(&before, &after);
    assert!(
        changed.is_empty(),
        "the agent changed the host tree:\n{}",
        changed.join("\n")
    );
}
