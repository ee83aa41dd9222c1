//! The guest's sysfs read directly, apart from the agent's own readers, so that the checks
//! compare the agent with the kernel and not with itself: nodes, their CPUs and distances, and
//! every pool per node (`nr_hugepages`, `free_hugepages`, `surplus_hugepages`) and system-wide
//! (with `resv_hugepages`).

use std::{collections::BTreeMap, fs};

const NODES: &str = "/sys/devices/system/node";
const GLOBAL: &str = "/sys/kernel/mm/hugepages";

pub const SIZE_2M: u64 = 2 << 20;
pub const SIZE_1G: u64 = 1 << 30;

/// One pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    pub total: u64,
    pub free: u64,
    pub surplus: u64,
}

fn read(path: &str) -> Result<String, String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{path}: {e}"))
}

fn number(path: &str) -> Result<u64, String> {
    read(path)?.parse().map_err(|e| format!("{path}: {e}"))
}

/// The node numbers, ascending.
pub fn nodes() -> Result<Vec<u32>, String> {
    let mut nodes: Vec<u32> = fs::read_dir(NODES)
        .map_err(|e| format!("{NODES}: {e}"))?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("node")?
                .parse()
                .ok()
        })
        .collect();
    nodes.sort_unstable();
    Ok(nodes)
}

/// A `cpulist` such as `0-2,5` expanded.
pub fn cpus(node: u32) -> Result<Vec<u32>, String> {
    let list = read(&format!("{NODES}/node{node}/cpulist"))?;
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        let (from, to): (u32, u32) = (
            from.parse().map_err(|e| format!("cpulist {list}: {e}"))?,
            to.parse().map_err(|e| format!("cpulist {list}: {e}"))?,
        );
        cpus.extend(from..=to);
    }
    Ok(cpus)
}

pub fn distances(node: u32) -> Result<Vec<u32>, String> {
    read(&format!("{NODES}/node{node}/distance"))?
        .split_whitespace()
        .map(|d| d.parse().map_err(|e| format!("distance {d}: {e}")))
        .collect()
}

fn pool_in(dir: &str) -> Result<Pool, String> {
    Ok(Pool {
        total: number(&format!("{dir}/nr_hugepages"))?,
        free: number(&format!("{dir}/free_hugepages"))?,
        surplus: number(&format!("{dir}/surplus_hugepages"))?,
    })
}

/// Every node's pools: `(node, page size) -> pool`.
pub fn node_pools() -> Result<BTreeMap<(u32, u64), Pool>, String> {
    let mut pools = BTreeMap::new();
    for node in nodes()? {
        for size in [SIZE_2M, SIZE_1G] {
            let dir = format!("{NODES}/node{node}/hugepages/hugepages-{}kB", size / 1024);
            pools.insert((node, size), pool_in(&dir)?);
        }
    }
    Ok(pools)
}

/// One node's pool of one size.
pub fn node_pool(node: u32, size: u64) -> Result<Pool, String> {
    pool_in(&format!(
        "{NODES}/node{node}/hugepages/hugepages-{}kB",
        size / 1024
    ))
}

/// The system-wide pools: `page size -> (pool, resv_hugepages)`.
pub fn global_pools() -> Result<BTreeMap<u64, (Pool, u64)>, String> {
    let mut pools = BTreeMap::new();
    for size in [SIZE_2M, SIZE_1G] {
        let dir = format!("{GLOBAL}/hugepages-{}kB", size / 1024);
        let reserved = number(&format!("{dir}/resv_hugepages"))?;
        pools.insert(size, (pool_in(&dir)?, reserved));
    }
    Ok(pools)
}
