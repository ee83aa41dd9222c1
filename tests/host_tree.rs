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

/// Two NUMA nodes (CPU n on node n, distances 10 and 20), each with `memory_kib` of memory and
/// a 2 MiB pool of `pages` pages, `free` of them free; the global pool is their sum, nothing
/// reserved or surplus, and `/proc/meminfo` says the whole.
pub fn two_numa_nodes(root: &Path, memory_kib: u64, pages: u64, free: u64) {
    put(root, "/sys/devices/system/node/online", "0-1\n");
    for node in 0..2 {
        let n = format!("/sys/devices/system/node/node{node}");
        put(root, &format!("{n}/cpulist"), format!("{node}\n"));
        let distance = if node == 0 { "10 20\n" } else { "20 10\n" };
        put(root, &format!("{n}/distance"), distance);
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
    for (file, v) in [
        ("nr_hugepages", 2 * pages),
        ("free_hugepages", 2 * free),
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
            2 * memory_kib,
            2 * pages
        ),
    );
}
