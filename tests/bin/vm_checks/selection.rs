//! NUMA selection without `numaNodes` on the four-node guest: `POST /v1/admit` of a Guaranteed
//! pod under `single-numa-node`, `restricted` and `best-effort`, each with and without
//! `prefer-closest-numa-nodes`, on two Memory Manager states: a kubelet checkpoint written here
//! (one Guaranteed pod already pinned to node 2) and the state the agent builds from sysfs. Each
//! answer must name the nodes the kubelet's rules pick — worked out by hand below from the
//! machine's pools and distances, never read from the agent — and verify those nodes alone (the
//! verdict's `numaNodes` and every check's); a refusal by the Topology Manager verifies nothing.
//!
//! The kubelet's rules used (`memorymanager/policy_static.go`, `topologymanager/policy*.go`):
//! * Hints: every mask of nodes, singles first, whose *allocatable* covers every requested type
//!   lowers `minAffinitySize`; it is a hint when its *free* covers the request too, except that a
//!   node already pinned alone (`numberOfAssignments > 0`, `cells` of one) joins no multi-node
//!   mask. A hint is preferred when it has `minAffinitySize` nodes.
//! * Merge (one provider, the same masks for `memory` and `hugepages-2Mi`): a preferred hint
//!   beats a non-preferred one; between preferred ones the narrower wins, and at equal width the
//!   lower mask — or, with `prefer-closest-numa-nodes`, the lower average distance (the mean of
//!   `d[i][j]` over all ordered pairs of the mask, self pairs included). `single-numa-node` keeps
//!   only preferred single-node hints (none: the all-nodes mask, not preferred) and ignores the
//!   option. `restricted` and `single-numa-node` refuse a non-preferred result
//!   (`TopologyAffinityError`); `best-effort` admits it.
//!
//! The machine (`xtask/src/vm/machine.rs`): 2 MiB pools of 32, 16, 64 and 8 MiB on nodes 0 to 3
//! (all free when this runs); distances `[10,12,20,30] [12,10,25,20] [20,25,10,12] [28,20,12,10]`,
//! so the pairs' averages are {0,1} 11, {2,3} 11, {0,2} 15, {1,3} 15, {1,2} 17.5, {0,3} 19.5.
//! Every request also asks 64Mi of memory, which every node has plenty of in both states.

use std::path::Path;

use hugepage_agent_tests::http;
use serde_json::{Value, json};

use crate::{CheckResult, Guest, OwnAgent, sysfs};

const MI: u64 = 1 << 20;
/// The 2 MiB pools the machine boots with, in MiB per node.
const POOL_MI: [u64; 4] = [32, 16, 64, 8];
/// What the checkpoint's Guaranteed pod holds on node 2, in MiB of 2 MiB pages.
const PINNED_MI: u64 = 48;

/// What the kubelet does with a request: the nodes it allocates, or its refusal's reason.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Nodes(&'static [u32]),
    /// The reason and, for `Allocate`'s refusals, the kubelet's message.
    Refused(&'static str, &'static str),
}
use Expect::{Nodes, Refused};

const TOPOLOGY: &str = "TopologyAffinityError";
const ALLOCATE: &str = "UnexpectedAdmissionError";
/// The Memory Manager's `Allocate` when no mask of nodes fits (`getDefaultHint`).
const NO_DEFAULT: &str = "Allocate failed due to [memorymanager] failed to get the default NUMA \
                          affinity, no NUMA nodes with enough memory is available, which is \
                          unexpected";
/// `Allocate` when the mask would put a node pinned alone into a multi-node allocation.
const VIOLATES: &str = "Allocate failed due to [memorymanager] preferred hint violates NUMA node \
                        allocation, which is unexpected";
const BY_TOPOLOGY: Expect = Refused(TOPOLOGY, "");

/// One request: 2 MiB pages in MiB, and per policy (single-numa-node, restricted, best-effort)
/// what is expected without and with `prefer-closest-numa-nodes`.
struct Case {
    mi: u64,
    expect: [(Expect, Expect); 3],
}

const POLICIES: [&str; 3] = ["single-numa-node", "restricted", "best-effort"];

/// The state built from sysfs: allocatable = free = the pools, nothing pinned.
///
/// * 24Mi: singles whose pool covers it: {0} (32), {2} (64); `minAffinitySize` 1, so {0} and {2}
///   are the preferred hints. Narrowest at equal width: the lower mask {0}; closest: both average
///   10, the lower mask {0}. Every policy: [0].
/// * 40Mi: only {2} (64) alone; preferred {2}, the pairs that fit are wider and not preferred.
///   Every policy: [2].
/// * 72Mi: no single node; the pairs that cover it are {0,2} (96), {1,2} (80), {2,3} (72):
///   `minAffinitySize` 2, all three preferred. `single-numa-node`: no single-node hint, refused.
///   `restricted`/`best-effort`: lowest mask {0,2}; with closest, averages 15, 17.5 and 11: {2,3}
///   (verified on exactly 64 + 8 = 72Mi free).
const FROM_SYSFS: [Case; 3] = [
    Case {
        mi: 24,
        expect: [(Nodes(&[0]), Nodes(&[0])); 3],
    },
    Case {
        mi: 40,
        expect: [(Nodes(&[2]), Nodes(&[2])); 3],
    },
    Case {
        mi: 72,
        expect: [
            (BY_TOPOLOGY, BY_TOPOLOGY),
            (Nodes(&[0, 2]), Nodes(&[2, 3])),
            (Nodes(&[0, 2]), Nodes(&[2, 3])),
        ],
    },
];

/// The checkpoint: the same pools as allocatable, but a Guaranteed pod pinned to node 2 alone
/// holds 48 of its 64Mi (free 16Mi; `numberOfAssignments` 2, `cells` [2]).
///
/// * 24Mi: {0} (free 32) is a preferred hint; {2} is allocatable enough (so `minAffinitySize` 1)
///   but has 16Mi free, no hint. Pairs without node 2 are not preferred. Every policy: [0].
/// * 40Mi: `minAffinitySize` 1 ({2}'s 64 allocatable), but {2} has 16 free and may join no
///   pair. Hints: {0,1} (48), {0,3} (40), {0,1,3} (56), none preferred. `single-numa-node` and
///   `restricted` refuse; `best-effort` takes the best non-preferred merge: the widest provider's
///   narrowest hint has 2 nodes, so among 2-node results {0,1} beats {0,3} (lower mask; closer
///   too, 11 against 19.5) — [0,1], verified on 48Mi free.
/// * 72Mi: no mask without node 2 covers it ({0,1,3} is 56), and node 2 joins none: no hints at
///   all. The Memory Manager then returns an empty map, which `filterProvidersHints` reads as
///   "no preference" (one preferred any-node hint), not as "fits nowhere", so every policy admits
///   the merge and `Allocate` decides. `single-numa-node` turns the all-nodes mask into none:
///   `getDefaultHint` finds no mask, "failed to get the default NUMA affinity". `restricted` and
///   `best-effort` keep [0,1,2,3], whose free memory covers the request (32 + 16 + 16 + 8 = 72),
///   but it puts node 2, pinned alone, into a multi-node allocation:
///   `isAffinityViolatingNUMAAllocations`, "preferred hint violates NUMA node allocation". All
///   `UnexpectedAdmissionError`, nothing verified. (This case first found the agent admitting
///   [0,1,2,3] there: it lacked that last rule.)
const FROM_CHECKPOINT: [Case; 3] = [
    Case {
        mi: 24,
        expect: [(Nodes(&[0]), Nodes(&[0])); 3],
    },
    Case {
        mi: 40,
        expect: [
            (BY_TOPOLOGY, BY_TOPOLOGY),
            (BY_TOPOLOGY, BY_TOPOLOGY),
            (Nodes(&[0, 1]), Nodes(&[0, 1])),
        ],
    },
    Case {
        mi: 72,
        expect: [
            (Refused(ALLOCATE, NO_DEFAULT), Refused(ALLOCATE, NO_DEFAULT)),
            (Refused(ALLOCATE, VIOLATES), Refused(ALLOCATE, VIOLATES)),
            (Refused(ALLOCATE, VIOLATES), Refused(ALLOCATE, VIOLATES)),
        ],
    },
];

pub fn without_numa_nodes(guest: &Guest) -> CheckResult {
    for (node, pool) in POOL_MI.iter().enumerate() {
        let now = sysfs::node_pool(node as u32, sysfs::SIZE_2M)?;
        if (now.total, now.free) != (pool * MI / sysfs::SIZE_2M, pool * MI / sysfs::SIZE_2M) {
            return Err(format!(
                "node {node}'s 2 MiB pool is {now:?}, the expectations need {pool}Mi all free"
            ));
        }
    }
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let state = dir.path().join("memory_manager_state");
    std::fs::write(&state, checkpoint(PINNED_MI))
        .map_err(|e| format!("writing the checkpoint: {e}"))?;
    let absent = dir.path().join("no_memory_manager_state");
    let mut seen = Vec::new();
    for (file, source, cases) in [
        (&absent, "sysfs", &FROM_SYSFS),
        (&state, "checkpoint", &FROM_CHECKPOINT),
    ] {
        for closest in [false, true] {
            let label = format!("{source}{}", if closest { "-closest" } else { "" });
            let agent = start(guest, &label, file, closest)?;
            wait_source(agent.port, source)?;
            for case in cases {
                for (policy, expect) in POLICIES.iter().zip(&case.expect) {
                    let expect = if closest { expect.1 } else { expect.0 };
                    let got = admit(agent.port, case.mi, policy)?;
                    verify(&got, expect).map_err(|why| {
                        format!(
                            "{source}, {}Mi, {policy}, closest {closest}: {why}",
                            case.mi
                        )
                    })?;
                }
            }
            drop(agent);
        }
        let shown: Vec<String> = cases
            .iter()
            .map(|c| {
                let each: Vec<String> = c.expect.iter().map(|e| short(e.0, e.1)).collect();
                format!("{}Mi {}", c.mi, each.join("/"))
            })
            .collect();
        seen.push(format!("{source}: {}", shown.join(", ")));
    }
    Ok(format!(
        "single-numa-node/restricted/best-effort (closest where it differs): {}; each verified \
         on those nodes alone, refusals verify nothing",
        seen.join("; ")
    ))
}

fn short(plain: Expect, closest: Expect) -> String {
    let one = |e: Expect| match e {
        Nodes(n) => format!("{n:?}").replace(' ', ""),
        Refused(TOPOLOGY, _) => "topology-refused".to_owned(),
        Refused(_, NO_DEFAULT) => "allocate-refused(no default affinity)".to_owned(),
        Refused(_, _) => "allocate-refused(pinned node across nodes)".to_owned(),
    };
    if one(plain) == one(closest) {
        one(plain)
    } else {
        format!("{}(closest {})", one(plain), one(closest))
    }
}

/// An agent whose Memory Manager is the static policy, on the checkpoint `state` (or sysfs when
/// it is absent), with or without `prefer-closest-numa-nodes`; its log is kept as `label`'s if
/// the check fails.
pub fn start<'g>(
    guest: &'g Guest,
    label: &str,
    state: &Path,
    closest: bool,
) -> Result<OwnAgent<'g>, String> {
    let mut cmd = guest.agent();
    cmd.args(["run", "--ebpf", "off", "--memory-manager-policy", "Static"])
        .args([
            "--topology-policy-options",
            &format!("prefer-closest-numa-nodes={closest}"),
        ])
        .arg("--kubelet-state")
        .arg(state);
    guest.start_own(label, cmd, std::time::Duration::from_secs(60))
}

/// Waits until `/v1/hints` says the Memory Manager's state comes from `source`.
fn wait_source(port: u16, source: &str) -> Result<(), String> {
    let body = json!({"pod": {"qosClass": "Guaranteed"}, "containers": [{"name": "c", "resources": {"memory": "64Mi", "hugepages-2Mi": "2Mi"}}]});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, text) = http(
            port,
            "POST",
            "/v1/hints",
            Some("application/json"),
            &body.to_string(),
        );
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if answer["source"] == source {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("/v1/hints never said source {source}: {text}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `POST /v1/admit` of a Guaranteed pod asking `mi` MiB of 2 MiB pages and 64Mi of memory, no
/// nodes named and no UID (nothing reserved).
pub fn admit(port: u16, mi: u64, policy: &str) -> Result<Value, String> {
    let body = json!({
        "pod": {"namespace": "vm-test", "name": "selection", "qosClass": "Guaranteed"},
        "containers": [{"name": "c", "resources": {"memory": "64Mi", "hugepages-2Mi": format!("{mi}Mi")}}],
        "topologyPolicy": policy,
    });
    crate::admit::post(port, &format!("{mi}Mi under {policy}"), &body)
}

/// The verdict selected and verified exactly `expect`'s nodes, or was refused for its reason
/// with nothing verified.
fn verify(got: &Value, expect: Expect) -> Result<(), String> {
    let checks = got["checks"].as_array().cloned().unwrap_or_default();
    match expect {
        Nodes(nodes) => {
            let nodes = json!(nodes);
            let allocated = &got["selection"]["placements"][0]["allocated"];
            let verified_there = !checks.is_empty()
                && checks
                    .iter()
                    .all(|c| c["numaNodes"] == nodes && c["ok"] == true);
            if got["allowed"] != true
                || got["numaNodes"] != nodes
                || *allocated != nodes
                || !verified_there
            {
                return Err(format!("expected admitted and verified on {nodes}: {got}"));
            }
        }
        Refused(reason, message) => {
            let message_ok = message.is_empty() || got["message"] == message;
            if got["allowed"] != false
                || got["reason"] != reason
                || !message_ok
                || !checks.is_empty()
            {
                return Err(format!(
                    "expected refused ({reason} {message}) with nothing verified: {got}"
                ));
            }
        }
    }
    Ok(())
}

/// A kubelet checkpoint, checksum and all: every node's 2 MiB pool allocatable and free, except
/// that a Guaranteed pod pinned to node 2 alone holds `pinned_mi` MiB of it and 1Gi of memory
/// there (none when 0; [`FROM_CHECKPOINT`] is 48).
pub fn checkpoint(pinned_mi: u64) -> Vec<u8> {
    use hugepage_agent::memorymanager::checkpoint::{Verification, parse, to_kubelet_json};
    let table = |total: u64, free: u64| json!({"total": total, "systemReserved": 0, "allocatable": total, "reserved": total - free, "free": free});
    let gi = 1u64 << 30;
    let node = |n: usize| {
        let pinned = n == 2 && pinned_mi > 0;
        let huge = POOL_MI[n] * MI;
        json!({
            "numberOfAssignments": if pinned { 2 } else { 0 },
            "memoryMap": {
                "memory": table(4 * gi, if pinned { 3 * gi } else { 4 * gi }),
                "hugepages-2Mi": table(huge, if pinned { huge - pinned_mi * MI } else { huge }),
            },
            "cells": [n],
        })
    };
    let uid = "18000000-0000-4000-8000-000000000002";
    let entries = if pinned_mi > 0 {
        json!({uid: {"pinned": [
            {"numaAffinity": [2], "type": "memory", "size": gi},
            {"numaAffinity": [2], "type": "hugepages-2Mi", "size": pinned_mi * MI},
        ]}})
    } else {
        json!({})
    };
    let state = json!({
        "policyName": "Static",
        "machineState": {"0": node(0), "1": node(1), "2": node(2), "3": node(3)},
        "entries": entries,
    });
    parse(
        Path::new("vm-test checkpoint"),
        state.to_string().as_bytes(),
        Verification::UnlessAbsent,
    )
    .map(|s| to_kubelet_json(&s))
    .unwrap_or_else(|e| panic!("the test's own checkpoint is invalid: {e}"))
}
