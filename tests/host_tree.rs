//! Fake host trees for agents run with `--host-root`: files written under a root, and the sysfs
//! and `/proc/meminfo` of NUMA nodes with a 2 MiB pool each, as the kernel lays them out.

use std::{fs, path::Path};

/// Writes `content` at the host path `path` under `root`, making the directories.
pub fn put(root: &Path, path: &str, content: impl AsRef<[u8]>) {
    let full = root.join(path.trim_start_matches('/'));
    let dir = full.parent().expect("a parent directory");
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    fs::write(&full, content).unwrap_or_else(|e| panic!("write {}: {e}", full.display()));
}

/// `/proc/pressure/{cpu,io,memory}` of a host under no pressure at all.
pub const QUIET_PRESSURE: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n";

/// Writes [`QUIET_PRESSURE`] as the PSI files of memory, io and cpu under `root`.
pub fn quiet_pressure(root: &Path) {
    for resource in ["memory", "io", "cpu"] {
        put(root, &format!("/proc/pressure/{resource}"), QUIET_PRESSURE);
    }
}

/// Two NUMA nodes (CPU n on node n, distances 10 and 20), each with `memory_kib` of memory and
/// a 2 MiB pool of `pages` pages, `free` of them free; the global pool is their sum, nothing
/// reserved or surplus, and `/proc/meminfo` says the whole.
pub fn two_numa_nodes(root: &Path, memory_kib: u64, pages: u64, free: u64) {
    numa_nodes(root, 2, memory_kib, pages, free);
}

/// `count` NUMA nodes as [`two_numa_nodes`] lays out two: the first two with a CPU each (CPU n on
/// node n), the others without (as CXL memory expanders and sub-NUMA clusters without cores
/// show them); distances 10 to itself and 20 to every other node.
pub fn numa_nodes(root: &Path, count: u32, memory_kib: u64, pages: u64, free: u64) {
    put(
        root,
        "/sys/devices/system/node/online",
        format!("0-{}\n", count - 1),
    );
    for node in 0..count {
        let n = format!("/sys/devices/system/node/node{node}");
        let cpus = if node < 2 {
            format!("{node}\n")
        } else {
            "\n".to_owned()
        };
        put(root, &format!("{n}/cpulist"), cpus);
        let distances: Vec<&str> = (0..count)
            .map(|to| if to == node { "10" } else { "20" })
            .collect();
        put(root, &format!("{n}/distance"), distances.join(" ") + "\n");
        put(
            root,
            &format!("{n}/meminfo"),
            format!("Node {node} MemTotal: {memory_kib:>14} kB\nNode {node} MemFree: 1 kB\n"),
        );
        for (file, v) in [
            ("nr_hugepages", pages),
            ("free_hugepages", free),
            ("surplus_hugepages", 0),
        ] {
            put(
                root,
                &format!("{n}/hugepages/hugepages-2048kB/{file}"),
                format!("{v}\n"),
            );
        }
    }
    let all = u64::from(count);
    for (file, v) in [
        ("nr_hugepages", all * pages),
        ("free_hugepages", all * free),
        ("resv_hugepages", 0),
        ("surplus_hugepages", 0),
    ] {
        put(
            root,
            &format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"),
            format!("{v}\n"),
        );
    }
    put(
        root,
        "/proc/meminfo",
        format!(
            "MemTotal: {:>14} kB\nHugePages_Total: {:>7}\nHugepagesize:       2048 kB\n",
            all * memory_kib,
            all * pages
        ),
    );
}
