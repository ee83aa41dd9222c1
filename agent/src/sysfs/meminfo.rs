//! Per-NUMA-node memory size: `MemTotal` of `/sys/devices/system/node/node<N>/meminfo` (what
//! cadvisor gives the kubelet as the node's memory), or of `/proc/meminfo` on a machine without
//! NUMA directories. Hugepage pools are part of it.

use super::{HostFs, SysfsError};
use crate::host::NumaNode;

/// `MemTotal` of a node, in bytes.
pub fn node_mem_total(host: &HostFs, node: NumaNode) -> Result<u64, SysfsError> {
    let path = format!("/sys/devices/system/node/node{}/meminfo", node.0);
    let path = if host.exists(&path) {
        path
    } else {
        "/proc/meminfo".to_string()
    };
    let text = host.read_string(&path)?;
    parse_mem_total(&text).ok_or_else(|| SysfsError::Malformed {
        path: host.path(&path),
        expected: "a MemTotal line in kB",
        found: text.lines().take(2).collect::<Vec<_>>().join("\n"),
    })
}

/// The `MemTotal` line of a meminfo file, `Node 0 MemTotal: 16384 kB` or `MemTotal: 16384 kB`.
pub fn parse_mem_total(text: &str) -> Option<u64> {
    kb_field(text, "MemTotal")
}

/// The first `<field>: N kB` line of a text in meminfo's form (meminfo, a process's `status`),
/// in bytes; a prefix before the name (`Node 0 `) is allowed.
pub fn kb_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once(field)?;
        let kb: u64 = rest
            .strip_prefix(':')?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        kb.checked_mul(1024)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_node_and_machine_meminfo() {
        assert_eq!(
            parse_mem_total("Node 1 MemTotal:       16308388 kB\nNode 1 MemFree: 1 kB\n"),
            Some(16_308_388 * 1024)
        );
        assert_eq!(parse_mem_total("MemTotal:  2048 kB\n"), Some(2048 * 1024));
        assert_eq!(parse_mem_total("Node 0 MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn reads_this_hosts_node_0() {
        let host = HostFs::new("/");
        let bytes = node_mem_total(&host, NumaNode(0)).expect("node 0 meminfo");
        assert!(bytes > 64 << 20, "{bytes}");
    }
}
