//! The guest machine, defined once: four NUMA nodes with one CPU and its own memory each, an
//! asymmetric distance table (node 3 to node 0 is not node 0 to node 3), 2 MiB pools of a
//! different size on every node and one 1 GiB page on nodes 2 and 3, set on the kernel command
//! line. QEMU's arguments and the kernel parameters come from here, and so does `machine.json`,
//! which the checks in the guest compare the guest's kernel and sysfs with.

use serde_json::{Value, json};

/// Memory per node in MiB. Nodes 2 and 3 are large enough that a 1 GiB-aligned range stays free
/// for the boot-time 1 GiB page after the kernel's own allocations (its page structures are put
/// at the top of each node, the initrd at the top of the memory below 4 GiB).
pub const NODE_MIB: [u64; 4] = [512, 512, 2560, 2048];
/// `DISTANCES[from][to]`, as `node<from>/distance` lists them; 10 is local.
pub const DISTANCES: [[u32; 4]; 4] = [
    [10, 12, 20, 30],
    [12, 10, 25, 20],
    [20, 25, 10, 12],
    [28, 20, 12, 10],
];
/// 2 MiB pages reserved at boot on each node.
pub const POOL_2M: [u64; 4] = [16, 8, 32, 4];
/// 1 GiB pages reserved at boot on each node.
pub const POOL_1G: [u64; 4] = [0, 0, 1, 1];

/// The kernel command line.
pub fn kernel_parameters() -> String {
    let per_node = |pool: &[u64; 4]| {
        pool.iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(node, n)| format!("{node}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "console=ttyS0 quiet panic=-1 psi=1 default_hugepagesz=2M \
         hugepagesz=2M hugepages={} hugepagesz=1G hugepages={}",
        per_node(&POOL_2M),
        per_node(&POOL_1G)
    )
}

/// QEMU's memory, CPU and NUMA arguments.
pub fn qemu_arguments() -> Vec<String> {
    let mut args = vec![
        "-m".to_owned(),
        format!("{}M", NODE_MIB.iter().sum::<u64>()),
        "-smp".to_owned(),
        NODE_MIB.len().to_string(),
    ];
    for (node, mib) in NODE_MIB.iter().enumerate() {
        args.push("-object".to_owned());
        args.push(format!("memory-backend-ram,id=mem{node},size={mib}M"));
        args.push("-numa".to_owned());
        args.push(format!("node,nodeid={node},cpus={node},memdev=mem{node}"));
    }
    for (from, row) in DISTANCES.iter().enumerate() {
        for (to, distance) in row.iter().enumerate() {
            if from != to {
                args.push("-numa".to_owned());
                args.push(format!("dist,src={from},dst={to},val={distance}"));
            }
        }
    }
    args
}

/// What the checks expect the guest to be: its kernel (what `uname -r` starts with, and whether
/// it is a PREEMPT_RT build), and per node its CPUs, distances and boot-time pools.
pub fn description(release_prefix: &str, realtime: bool) -> Value {
    let nodes: Vec<Value> = (0..NODE_MIB.len())
        .map(|node| {
            json!({
                "node": node,
                "cpus": [node],
                "distances": DISTANCES[node],
                "pools": {"2097152": POOL_2M[node], "1073741824": POOL_1G[node]},
            })
        })
        .collect();
    json!({
        "kernel": {"release_prefix": release_prefix, "realtime": realtime},
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distance_table_is_valid_and_asymmetric() {
        for (from, row) in DISTANCES.iter().enumerate() {
            for (to, d) in row.iter().enumerate() {
                assert_eq!(from == to, *d == 10, "{from}->{to}: {d}");
            }
        }
        assert_ne!(DISTANCES[0][3], DISTANCES[3][0]);
    }

    #[test]
    fn pools_go_on_the_kernel_command_line_per_node() {
        let params = kernel_parameters();
        assert!(params.contains("hugepagesz=2M hugepages=0:16,1:8,2:32,3:4"));
        assert!(params.contains("hugepagesz=1G hugepages=2:1,3:1"));
        let args = qemu_arguments();
        assert!(args.contains(&"dist,src=3,dst=0,val=28".to_owned()));
        assert!(args.contains(&"node,nodeid=2,cpus=2,memdev=mem2".to_owned()));
    }
}
