//! Reads the hugepage pools: per NUMA node from
//! `/sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB/{nr,free,surplus}_hugepages`, and
//! globally from `/sys/kernel/mm/hugepages/hugepages-<kB>kB/` (which alone has `resv_hugepages`).
//!
//! A size directory present on some nodes only is read where it exists; a machine without
//! `/sys/devices/system/node` has no per-node rows. A file that is missing inside a size directory
//! that exists, or that does not hold a number, is an error naming it.

use super::{HostFs, SysfsError};
use crate::host::{GlobalPool, HugepageTable, NodePool, NumaNode, PageSize};

const NODES: &str = "/sys/devices/system/node";
const GLOBAL: &str = "/sys/kernel/mm/hugepages";

/// Online NUMA nodes, from the `node<N>` directories.
pub fn numa_nodes(host: &HostFs) -> Result<Vec<NumaNode>, SysfsError> {
    if !host.exists(NODES) {
        return Ok(Vec::new());
    }
    let mut nodes: Vec<NumaNode> = host
        .list(NODES)?
        .iter()
        .filter_map(|name| name.strip_prefix("node")?.parse().ok().map(NumaNode))
        .collect();
    nodes.sort();
    Ok(nodes)
}

/// Page sizes that have a `hugepages-<kB>kB` directory under `dir`.
fn page_sizes(host: &HostFs, dir: &str) -> Result<Vec<PageSize>, SysfsError> {
    if !host.exists(dir) {
        return Ok(Vec::new());
    }
    let mut sizes = Vec::new();
    for name in host.list(dir)? {
        if !name.starts_with("hugepages-") {
            continue;
        }
        let size = PageSize::from_dir_name(&name).ok_or_else(|| SysfsError::Malformed {
            path: host.path(format!("{dir}/{name}")),
            expected: "a directory named hugepages-<kB>kB",
            found: name.clone(),
        })?;
        sizes.push(size);
    }
    sizes.sort();
    Ok(sizes)
}

/// Every page size present on any node or system-wide.
pub fn all_sizes(host: &HostFs, nodes: &[NumaNode]) -> Result<Vec<PageSize>, SysfsError> {
    let mut sizes = page_sizes(host, GLOBAL)?;
    for node in nodes {
        sizes.extend(page_sizes(
            host,
            &format!("{NODES}/node{}/hugepages", node.0),
        )?);
    }
    sizes.sort();
    sizes.dedup();
    Ok(sizes)
}

/// The pools of one size: on each node that has it, and system-wide.
pub fn read_size(
    host: &HostFs,
    nodes: &[NumaNode],
    size: PageSize,
) -> Result<(Vec<NodePool>, Option<GlobalPool>), SysfsError> {
    let mut pools = Vec::new();
    for &node in nodes {
        pools.extend(read_node_pool(host, node, size)?);
    }
    Ok((pools, read_global_pool(host, size)?))
}

/// The pool of `size` on `node`; `None` when the node has no directory for that size.
pub fn read_node_pool(
    host: &HostFs,
    node: NumaNode,
    size: PageSize,
) -> Result<Option<NodePool>, SysfsError> {
    let d = node_pool_dir(node, size);
    if !host.exists(&d) {
        return Ok(None);
    }
    Ok(Some(NodePool {
        node,
        size,
        total: host.read_u64(format!("{d}/nr_hugepages"))?,
        free: host.read_u64(format!("{d}/free_hugepages"))?,
        surplus: host.read_u64(format!("{d}/surplus_hugepages"))?,
    }))
}

/// The system-wide pool of `size`; `None` when there is no directory for that size.
pub fn read_global_pool(host: &HostFs, size: PageSize) -> Result<Option<GlobalPool>, SysfsError> {
    let d = global_pool_dir(size);
    if !host.exists(&d) {
        return Ok(None);
    }
    Ok(Some(GlobalPool {
        size,
        total: host.read_u64(format!("{d}/nr_hugepages"))?,
        free: host.read_u64(format!("{d}/free_hugepages"))?,
        reserved: host.read_u64(format!("{d}/resv_hugepages"))?,
        surplus: host.read_u64(format!("{d}/surplus_hugepages"))?,
    }))
}

/// The directory of the pool of `size` on `node` (host path, before `--host-root`).
pub fn node_pool_dir(node: NumaNode, size: PageSize) -> String {
    format!("{NODES}/node{}/hugepages/{}", node.0, size.dir_name())
}

/// The directory of the system-wide pool of `size`.
pub fn global_pool_dir(size: PageSize) -> String {
    format!("{GLOBAL}/{}", size.dir_name())
}

/// Reads every pool of every node and size, and the global pools.
pub fn read_table(host: &HostFs) -> Result<HugepageTable, SysfsError> {
    let nodes = numa_nodes(host)?;
    let mut table = HugepageTable::default();
    for size in all_sizes(host, &nodes)? {
        let (pools, global) = read_size(host, &nodes, size)?;
        table.nodes.extend(pools);
        table.global.extend(global);
    }
    table.nodes.sort_by_key(|p| (p.node, p.size));
    Ok(table)
}

#[cfg(test)]
mod tests;
