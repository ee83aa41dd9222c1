//! The Memory Manager's machine state when there is no kubelet checkpoint, built as the kubelet
//! builds its initial state: per NUMA node, each hugepage size's pool (`nr_hugepages` × size) and
//! the node's `MemTotal` minus the hugepage pools for `memory`; `--reserved-memory` (the kubelet's
//! flag, same syntax) is each table's systemReserved; allocatable and free are the total minus it.

use std::collections::BTreeMap;

use super::state::{MachineState, MemoryTable, NumaNodeState};
use crate::{
    host::NumaNode,
    kube::pod,
    numa::map::Snapshot,
    quantity,
    sysfs::{HostFs, SysfsError, meminfo},
};

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(
        "--reserved-memory {0:?}: expected <numa node>:<type>=<quantity>[,<type>=<quantity>…], e.g. 0:memory=1Gi,hugepages-1Gi=2Gi"
    )]
    Syntax(String),
    #[error("--reserved-memory {given:?}: {detail}")]
    Value { given: String, detail: String },
    #[error(
        "--reserved-memory reserves {resource} on NUMA node {node}, which the machine does not have"
    )]
    NoSuchResource { node: usize, resource: String },
    #[error(
        "--reserved-memory reserves {reserved} of {resource} on NUMA node {node}, more than its {total}"
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

/// Parses `--reserved-memory` values (each may hold several nodes separated by `;`).
pub fn parse_reserved_memory(values: &[String]) -> Result<ReservedMemory, MachineError> {
    let mut reserved = ReservedMemory::new();
    for value in values {
        for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let syntax = || MachineError::Syntax(entry.to_string());
            let (node, limits) = entry.split_once(':').ok_or_else(syntax)?;
            let node: usize = node.trim().parse().map_err(|_| syntax())?;
            for limit in limits.split(',') {
                let (name, amount) = limit.split_once('=').ok_or_else(syntax)?;
                let name = name.trim();
                let resource = if name == "memory" {
                    name.to_string()
                } else {
                    match pod::page_size(name, "--reserved-memory") {
                        Ok(Some(size)) => format!("hugepages-{}", quantity::format_binary(size.0)),
                        _ => {
                            return Err(MachineError::Value {
                                given: entry.to_string(),
                                detail: format!(
                                    "unknown memory type {name:?}: memory or hugepages-<size>"
                                ),
                            });
                        }
                    }
                };
                let bytes =
                    quantity::parse_bytes(amount.trim()).map_err(|e| MachineError::Value {
                        given: entry.to_string(),
                        detail: e.to_string(),
                    })?;
                *reserved
                    .entry(node)
                    .or_default()
                    .entry(resource)
                    .or_default() += bytes;
            }
        }
    }
    Ok(reserved)
}

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

    #[test]
    fn parses_the_kubelets_reserved_memory_syntax() {
        let reserved = parse_reserved_memory(&[
            "0:memory=1Gi,hugepages-1Gi=2Gi".into(),
            "1:memory=2Gi;2:hugepages-2048Ki=4Mi".into(),
        ])
        .unwrap();
        assert_eq!(reserved[&0]["memory"], GI);
        assert_eq!(reserved[&0]["hugepages-1Gi"], 2 * GI);
        assert_eq!(reserved[&1]["memory"], 2 * GI);
        assert_eq!(reserved[&2]["hugepages-2Mi"], 4 << 20);
        for bad in [
            "memory=1Gi",
            "x:memory=1Gi",
            "0:memory",
            "0:cpu=1",
            "0:memory=lots",
        ] {
            assert!(parse_reserved_memory(&[bad.into()]).is_err(), "{bad}");
        }
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
        let reserved = parse_reserved_memory(&["0:memory=1Gi,hugepages-1Gi=1Gi".into()]).unwrap();
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
        let too_much = parse_reserved_memory(&["0:hugepages-1Gi=5Gi".into()]).unwrap();
        assert!(matches!(
            initial_state(&nodes, &too_much),
            Err(MachineError::TooMuch { .. })
        ));
        let elsewhere = parse_reserved_memory(&["3:memory=1Gi".into()]).unwrap();
        assert!(matches!(
            initial_state(&nodes, &elsewhere),
            Err(MachineError::NoSuchResource { node: 3, .. })
        ));
    }
}
