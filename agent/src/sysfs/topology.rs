//! NUMA topology: online nodes (`/sys/devices/system/node/online`), each node's CPUs
//! (`node<N>/cpulist`, empty for CPU-less memory nodes) and distances (`node<N>/distance`).
//! A machine without `/sys/devices/system/node` is one node 0 with every online CPU.

use super::{HostFs, SysfsError};
use crate::host::{NodeInfo, NumaNode};

const NODES: &str = "/sys/devices/system/node";

/// The most ids a list may hold: far above the kernel's limits (8,192 CPUs, 1,024 nodes), and
/// a bound on what a list read costs (`0-4294967295` would be 16 GiB).
pub const MAX_LIST: usize = 1 << 16;

/// Parses a kernel CPU or node list such as `0-3,8,10-11` (empty means none); a list of more
/// than [`MAX_LIST`] ids is refused.
pub fn parse_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || (b - a) as usize >= MAX_LIST - out.len() {
                    return None;
                }
                out.extend(a..=b);
            }
            None if out.len() == MAX_LIST => return None,
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

fn list(host: &HostFs, abs: &str, expected: &'static str) -> Result<Vec<u32>, SysfsError> {
    let text = host.read_string(abs)?;
    parse_list(&text).ok_or_else(|| SysfsError::Malformed {
        path: host.path(abs),
        expected,
        found: text,
    })
}

/// Every online node with its CPUs and distances.
pub fn read(host: &HostFs) -> Result<Vec<NodeInfo>, SysfsError> {
    if !host.exists(NODES) {
        let cpus = list(
            host,
            "/sys/devices/system/cpu/online",
            "a CPU list such as 0-3",
        )?;
        return Ok(vec![NodeInfo {
            node: NumaNode(0),
            cpus,
            distances: vec![10],
        }]);
    }
    let online = list(host, &format!("{NODES}/online"), "a node list such as 0-1")?;
    let mut nodes = Vec::with_capacity(online.len());
    for n in online {
        let dir = format!("{NODES}/node{n}");
        let cpus = list(host, &format!("{dir}/cpulist"), "a CPU list such as 0-3")?;
        let path = format!("{dir}/distance");
        let text = host.read_string(&path)?;
        let distances = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<u32>, _>>()
            .map_err(|_| SysfsError::Malformed {
                path: host.path(&path),
                expected: "distances separated by spaces",
                found: text.clone(),
            })?;
        nodes.push(NodeInfo {
            node: NumaNode(n),
            cpus,
            distances,
        });
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    #[test]
    fn lists_parse_ranges_and_singles() {
        assert_eq!(
            parse_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_list("\n"), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("a"), None);
        // Found by the fuzz target `sysfs_values`: a range was expanded whatever its size
        // (`0-23333311` took seconds, `0-4294967295` 16 GiB).
        assert_eq!(parse_list("0-23333311"), None);
        assert_eq!(parse_list("0-4294967295"), None);
        let most = format!("0-{}", MAX_LIST - 1);
        assert_eq!(parse_list(&most).map(|l| l.len()), Some(MAX_LIST));
        assert_eq!(parse_list(&format!("{most},0")), None);
        assert_eq!(parse_list(&format!("{most},0-0")), None);
    }

    #[test]
    fn nodes_with_cpus_cpu_less_nodes_and_distances() {
        let (_d, host) = tree(&[
            ("/sys/devices/system/node/online", "0-1\n"),
            ("/sys/devices/system/node/node0/cpulist", "0-3\n"),
            ("/sys/devices/system/node/node0/distance", "10 21\n"),
            ("/sys/devices/system/node/node1/cpulist", "\n"),
            ("/sys/devices/system/node/node1/distance", "21 10\n"),
        ]);
        let nodes = read(&host).expect("read");
        assert_eq!(
            nodes[0],
            NodeInfo {
                node: NumaNode(0),
                cpus: vec![0, 1, 2, 3],
                distances: vec![10, 21]
            }
        );
        assert_eq!(nodes[1].cpus, Vec::<u32>::new());
    }

    #[test]
    fn without_node_directories_the_machine_is_node_0() {
        let (_d, host) = tree(&[("/sys/devices/system/cpu/online", "0-1\n")]);
        assert_eq!(
            read(&host).expect("read"),
            vec![NodeInfo {
                node: NumaNode(0),
                cpus: vec![0, 1],
                distances: vec![10]
            }]
        );
    }

    #[test]
    fn malformed_files_are_named() {
        let (_d, host) = tree(&[
            ("/sys/devices/system/node/online", "0\n"),
            ("/sys/devices/system/node/node0/cpulist", "0\n"),
            ("/sys/devices/system/node/node0/distance", "ten\n"),
        ]);
        let err = read(&host).unwrap_err().to_string();
        assert!(
            err.contains("node0/distance: expected distances separated by spaces"),
            "{err}"
        );
    }

    #[test]
    fn reads_this_host() {
        let nodes = read(&HostFs::new("/")).expect("this host");
        assert!(
            !nodes.is_empty() && nodes[0].distances.first() == Some(&10),
            "{nodes:?}"
        );
    }
}
