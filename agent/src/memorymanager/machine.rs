//! The Memory Manager's machine state when there is no kubelet checkpoint, built as the kubelet
//! builds its initial state: per NUMA node, each hugepage size's pool (`nr_hugepages` × size) and
//! the node's `MemTotal` minus the hugepage pools for `memory`; the kubelet's reserved memory
//! (`reservedMemory`, `--reserved-memory`; read by [`crate::kubeletconfig`]) is each table's systemReserved; allocatable and free are the total minus it.

use std::collections::BTreeMap;

use super::state::{MachineState, MemoryTable, NumaNodeState};
use crate::{
    host::NumaNode,
    numa::map::Snapshot,
    quantity,
    sysfs::{HostFs, SysfsError, meminfo},
};

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(
        "the kubelet's reserved memory names {resource} on NUMA node {node}, which the machine does not have"
    )]
    NoSuchResource { node: usize, resource: String },
    #[error(
        "the kubelet's reserved memory reserves {reserved} of {resource} on NUMA node {node}, more than its {total}"
    )]
    TooMuch {
        node: usize,
        resource: String,
        reserved: String,
        total: String,
    },
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
}

/// NUMA node → resource → bytes reserved for the system.
pub type ReservedMemory = BTreeMap<usize, BTreeMap<String, u64>>;

/// What the machine has per node: `MemTotal` and each hugepage size's pool, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMemory {
    pub mem_total: u64,
    pub hugepages: BTreeMap<String, u64>,
}

/// Reads every node's memory: `MemTotal` fresh, pools from the map snapshot.
pub fn read_nodes(
    host: &HostFs,
    snapshot: &Snapshot,
) -> Result<BTreeMap<usize, NodeMemory>, SysfsError> {
    let mut nodes = BTreeMap::new();
    for view in &snapshot.nodes {
        let node = view.info.node;
        let hugepages = view
            .sizes
            .iter()
            .map(|s| {
                (
                    format!("hugepages-{}", quantity::format_binary(s.page_size_bytes)),
                    s.total.saturating_mul(s.page_size_bytes),
                )
            })
            .collect();
        nodes.insert(
            node.0 as usize,
            NodeMemory {
                mem_total: meminfo::node_mem_total(host, NumaNode(node.0))?,
                hugepages,
            },
        );
    }
    Ok(nodes)
}

/// The kubelet's initial machine state for these nodes and reservations.
pub fn initial_state(
    nodes: &BTreeMap<usize, NodeMemory>,
    reserved: &ReservedMemory,
) -> Result<MachineState, MachineError> {
    for (&node, resources) in reserved {
        for resource in resources.keys() {
            let known = nodes
                .get(&node)
                .is_some_and(|n| resource == "memory" || n.hugepages.contains_key(resource));
            if !known {
                return Err(MachineError::NoSuchResource {
                    node,
                    resource: resource.clone(),
                });
            }
        }
    }
    let mut machine = MachineState::new();
    for (&node, memory) in nodes {
        let reserved_for = |resource: &str| {
            reserved
                .get(&node)
                .and_then(|r| r.get(resource))
                .copied()
                .unwrap_or(0)
        };
        let table = |resource: &str, total: u64, usable: u64| {
            let system_reserved = reserved_for(resource);
            let allocatable =
                usable
                    .checked_sub(system_reserved)
                    .ok_or_else(|| MachineError::TooMuch {
                        node,
                        resource: resource.to_string(),
                        reserved: quantity::format_binary(system_reserved),
                        total: quantity::format_binary(usable),
                    })?;
            Ok::<_, MachineError>(MemoryTable {
                total_mem_size: total,
                system_reserved,
                allocatable,
                reserved: 0,
                free: allocatable,
            })
        };
        let mut memory_map = BTreeMap::new();
        for (resource, &bytes) in &memory.hugepages {
            memory_map.insert(resource.clone(), table(resource, bytes, bytes)?);
        }
        let pools: u64 = memory.hugepages.values().sum();
        let regular = memory.mem_total.saturating_sub(pools);
        memory_map.insert(
            "memory".to_string(),
            table("memory", memory.mem_total, regular)?,
        );
        machine.insert(
            node,
            NumaNodeState {
                number_of_assignments: 0,
                memory_map,
                cells: vec![node],
            },
        );
    }
    Ok(machine)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn reservations(entries: &[(usize, &str, u64)]) -> ReservedMemory {
        let mut reserved = ReservedMemory::new();
        for &(node, resource, bytes) in entries {
            reserved
                .entry(node)
                .or_default()
                .insert(resource.to_owned(), bytes);
        }
        reserved
    }

    #[test]
    fn memory_excludes_hugepage_pools_and_reservations_come_off_allocatable() {
        let nodes = BTreeMap::from([(
            0,
            NodeMemory {
                mem_total: 16 * GI,
                hugepages: BTreeMap::from([("hugepages-1Gi".to_string(), 4 * GI)]),
            },
        )]);
        let reserved = reservations(&[(0, "memory", GI), (0, "hugepages-1Gi", GI)]);
        let machine = initial_state(&nodes, &reserved).unwrap();
        let memory = machine[&0].memory_map["memory"];
        assert_eq!(
            (
                memory.total_mem_size,
                memory.system_reserved,
                memory.allocatable,
                memory.free
            ),
            (16 * GI, GI, 11 * GI, 11 * GI)
        );
        let huge = machine[&0].memory_map["hugepages-1Gi"];
        assert_eq!((huge.total_mem_size, huge.allocatable), (4 * GI, 3 * GI));
        assert_eq!(machine[&0].cells, vec![0]);
        let too_much = reservations(&[(0, "hugepages-1Gi", 5 * GI)]);
        assert!(matches!(
            initial_state(&nodes, &too_much),
            Err(MachineError::TooMuch { .. })
        ));
        let elsewhere = reservations(&[(3, "memory", GI)]);
        assert!(matches!(
            initial_state(&nodes, &elsewhere),
            Err(MachineError::NoSuchResource { node: 3, .. })
        ));
    }
}
