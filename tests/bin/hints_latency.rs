//! `cargo xtask bench hints`: what the kubelet's hint generation and Topology Manager merge cost
//! for 8 NUMA nodes and 3 memory types (memory, hugepages-2Mi, hugepages-1Gi): 255 masks per
//! type, and 255³ permutations for the kubelet's own merge to walk.
//!
//! Two machine states: one where a single node can serve the pod (every mask fits; the singles
//! are preferred), and one where no node alone has enough free although one has enough capacity
//! (every hint is non-preferred: the merge's non-preferred path). Each is measured for hint
//! generation alone, the merge alone (best-effort with prefer-closest-numa-nodes, restricted and
//! single-numa-node), and the whole selection as admission runs it. Target: p99 under 100 µs.
//!
//! `hints-latency [--iterations N]` (default 20,000).

use std::{collections::BTreeMap, hint::black_box, time::Instant};

use hugepage_agent::{
    kube::pod::Pod,
    kubelet::features::FeatureGates,
    memorymanager::{
        hints::{self, Scope},
        selection::{self, Topology},
        state::{MemoryManagerState, MemoryTable, NumaNodeState},
    },
    topologymanager::{NumaInfo, Policy, PolicyOptions, ProviderHints, merge},
};
use hugepage_agent_tests::{BenchFlags, Percentiles};

const NODES: usize = 8;
const GI: u64 = 1 << 30;

fn main() {
    let flags = BenchFlags::parse("hints-latency [--iterations N]", &["--iterations"]);
    let iterations = flags.number("--iterations", 20_000) as usize;
    let pod = pod();
    println!("8 NUMA nodes x 3 memory types, {iterations} calls each, after warm-up");
    for (label, free) in [
        ("one node can serve it (255 hints per type)", 64 * GI),
        (
            "no node alone has enough free (all hints non-preferred)",
            3 * GI,
        ),
    ] {
        let state = state(free);
        let container = &pod.spec.containers[0];
        let gates = FeatureGates::default();
        let facts = hints::PodFacts::of(&pod, gates).unwrap_or_else(|e| panic!("the pod: {e}"));
        let generated = hints::container_hints(&state, &pod, &facts, container)
            .unwrap_or_else(|e| panic!("hints: {e}"));
        let count = generated
            .as_ref()
            .and_then(|h| h.get("memory"))
            .map_or(0, Vec::len);
        println!("{label}: {count} hints per type");
        report("  hint generation", iterations, || {
            hints::container_hints(&state, &pod, &facts, container).map(|h| h.is_some())
        });
        let provider: ProviderHints = generated.as_ref().map(|h| {
            h.iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect()
        });
        let providers = [provider];
        for (policy, closest) in [
            (Policy::BestEffort, true),
            (Policy::Restricted, false),
            (Policy::SingleNumaNode, false),
        ] {
            let options = PolicyOptions {
                prefer_closest_numa_nodes: closest,
                ..PolicyOptions::default()
            };
            let info = numa_info();
            let merged = merge::merge(policy, &options, &info, &providers);
            let name = format!(
                "  merge, {policy}{}",
                if closest { " + prefer-closest" } else { "" }
            );
            println!(
                "{name}: {:?} preferred={} admit={}",
                merged.hint.affinity, merged.hint.preferred, merged.admit
            );
            report(&name, iterations, || {
                Ok::<_, String>(merge::merge(policy, &options, &info, &providers).admit)
            });
        }
        let options = PolicyOptions::default();
        let info = numa_info();
        let topology = Topology {
            info: &info,
            policy: Policy::BestEffort,
            options: &options,
            scope: Scope::Container,
            gates,
        };
        report(
            "  whole selection (hints, merge, allocate), best-effort",
            iterations,
            || selection::select(&state, &pod, topology).map(|s| s.admit),
        );
    }
    println!("target: p99 under 100 us");
}

fn report<T, E: std::fmt::Display>(
    label: &str,
    iterations: usize,
    mut call: impl FnMut() -> Result<T, E>,
) {
    for _ in 0..iterations / 10 {
        black_box(call().unwrap_or_else(|e| panic!("{label}: {e}")));
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        let out = call();
        samples.push(start.elapsed());
        black_box(out.unwrap_or_else(|e| panic!("{label}: {e}")));
    }
    println!("{label:<58} {}", Percentiles::of(&mut samples));
}

/// Distances of a two-socket, four-die-per-socket machine.
fn numa_info() -> NumaInfo {
    let distances = (0..NODES)
        .map(|a| {
            let row = (0..NODES)
                .map(|b| match (a == b, a / 4 == b / 4) {
                    (true, _) => 10,
                    (false, true) => 12,
                    (false, false) => 32,
                })
                .collect();
            (a, row)
        })
        .collect();
    NumaInfo::new((0..NODES).collect(), distances).unwrap_or_else(|e| panic!("numa info: {e}"))
}

/// Every node with 64Gi of memory, 16Gi of 2Mi pages and 16Gi of 1Gi pages allocatable, of
/// which `free` of each is free.
fn state(free: u64) -> MemoryManagerState {
    let table = |allocatable: u64| MemoryTable {
        total_mem_size: allocatable,
        system_reserved: 0,
        allocatable,
        reserved: allocatable - free.min(allocatable),
        free: free.min(allocatable),
    };
    let machine_state = (0..NODES)
        .map(|n| {
            let memory_map = BTreeMap::from([
                ("memory".to_string(), table(64 * GI)),
                ("hugepages-2Mi".to_string(), table(16 * GI)),
                ("hugepages-1Gi".to_string(), table(16 * GI)),
            ]);
            let node = NumaNodeState {
                number_of_assignments: 0,
                memory_map,
                cells: vec![n],
            };
            (n, node)
        })
        .collect();
    MemoryManagerState {
        policy_name: "Static".into(),
        machine_state,
        ..MemoryManagerState::default()
    }
}

/// A Guaranteed pod asking 4Gi of each memory type.
fn pod() -> Pod {
    let list = serde_json::json!({"cpu": "2", "memory": "4Gi", "hugepages-2Mi": "4Gi", "hugepages-1Gi": "4Gi"});
    serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "bench", "name": "bench"},
        "spec": {"containers": [{"name": "app", "resources": {"requests": list, "limits": list}}]}
    }))
    .unwrap_or_else(|e| panic!("pod: {e}"))
}
