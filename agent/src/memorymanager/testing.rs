//! Builders for Memory Manager states and pods in unit tests.

use std::collections::BTreeMap;

use super::state::{MachineState, MemoryManagerState, MemoryTable, NumaNodeState};
use crate::kube::pod::Pod;

pub const GI: u64 = 1 << 30;

/// A node: resource → (allocatable, free), with its cells and assignments.
pub fn node(resources: &[(&str, u64, u64)], cells: &[usize], assignments: i64) -> NumaNodeState {
    NumaNodeState {
        number_of_assignments: assignments,
        memory_map: resources
            .iter()
            .map(|&(name, allocatable, free)| {
                (
                    name.to_string(),
                    MemoryTable {
                        total_mem_size: allocatable,
                        system_reserved: 0,
                        allocatable,
                        reserved: allocatable - free,
                        free,
                    },
                )
            })
            .collect(),
        cells: cells.to_vec(),
    }
}

pub fn state(nodes: Vec<(usize, NumaNodeState)>) -> MemoryManagerState {
    MemoryManagerState {
        policy_name: "Static".into(),
        machine_state: nodes.into_iter().collect::<MachineState>(),
        entries: BTreeMap::new(),
        pod_entries: BTreeMap::new(),
    }
}

/// A pod from JSON.
pub fn pod(json: serde_json::Value) -> Pod {
    serde_json::from_value(json).expect("a test pod")
}

/// A Guaranteed pod whose containers request `(name, memory, hugepages-1Gi)` with one CPU each.
pub fn guaranteed(containers: &[(&str, &str, &str)]) -> Pod {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|(name, memory, huge)| {
            let list = serde_json::json!({"cpu": "1", "memory": memory, "hugepages-1Gi": huge});
            serde_json::json!({"name": name, "resources": {"requests": list, "limits": list}})
        })
        .collect();
    pod(serde_json::json!({
        "metadata": {"uid": "pod-1", "name": "p", "namespace": "ns"},
        "spec": {"containers": containers}
    }))
}
