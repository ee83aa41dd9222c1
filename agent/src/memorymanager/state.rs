//! The kubelet Memory Manager's state, in the kubelet's own JSON shape: per NUMA node and
//! resource (`memory`, `hugepages-<size>`) a memory table (total, systemReserved, allocatable,
//! reserved, free), the node's group of cells for multi-NUMA assignments, and the blocks assigned
//! to each container. The checkpoint file, the `hints --state` input and the state built from sysfs
//! all end up as a [`MemoryManagerState`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One resource on one NUMA node, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryTable {
    #[serde(rename = "total")]
    pub total_mem_size: u64,
    pub system_reserved: u64,
    pub allocatable: u64,
    pub reserved: u64,
    pub free: u64,
}

/// One NUMA node: its memory tables and the nodes it is grouped with (itself alone unless a
/// multi-NUMA assignment joined it to others).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeState {
    /// Assignments made from this node (a container with memory and hugepages counts two).
    pub number_of_assignments: i64,
    /// Resource name → table. `null` in JSON reads as empty, as Go's decoder leaves a nil map.
    #[serde(default, deserialize_with = "null_as_default")]
    pub memory_map: BTreeMap<String, MemoryTable>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub cells: Vec<usize>,
}

/// NUMA node id → state.
pub type MachineState = BTreeMap<usize, NumaNodeState>;

/// An amount of one resource assigned on a set of NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    #[serde(default, deserialize_with = "null_as_default")]
    pub numa_affinity: Vec<usize>,
    #[serde(rename = "type")]
    pub resource: String,
    pub size: u64,
}

/// Pod UID → container name → blocks.
pub type ContainerAssignments = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

/// A pod's own assignment (pod-level resource managers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodEntry {
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub memory_blocks: Vec<Block>,
}

/// Pod UID → its entry.
pub type PodAssignments = BTreeMap<String, PodEntry>;

/// Everything the Memory Manager knows: the machine state and the assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryManagerState {
    pub policy_name: String,
    pub machine_state: MachineState,
    pub entries: ContainerAssignments,
    pub pod_entries: PodAssignments,
}

impl MemoryManagerState {
    /// The blocks the checkpoint holds for a container, if it was already assigned.
    pub fn container_blocks(&self, pod_uid: &str, container: &str) -> Option<&[Block]> {
        self.entries
            .get(pod_uid)
            .and_then(|containers| containers.get(container))
            .map(Vec::as_slice)
    }

    /// The blocks the checkpoint holds for a pod (pod-level resources), if it was assigned.
    pub fn pod_blocks(&self, pod_uid: &str) -> Option<&[Block]> {
        self.pod_entries
            .get(pod_uid)
            .map(|entry| entry.memory_blocks.as_slice())
    }
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}
