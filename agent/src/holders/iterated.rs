//! The processes as the task iterators tell them ([`crate::probes::tasks`]): each one's hugetlb
//! mappings and its descriptors on hugetlbfs files, in the walk's own terms ([`Process`]), for
//! the processes whose `/proc/<pid>` the agent may not read (`maps`, `numa_maps` and `fd/` take a
//! ptrace access check: another user's process, or one with capabilities the agent lacks).
//!
//! The iterators read the kernel's own structures: the file, its device and inode, the bytes it
//! holds (`i_blocks`), the mapping's addresses and whether it is shared. Not what `numa_maps`
//! adds by walking the page tables: the pages a mapping has on each NUMA node, and the pages of
//! a private mapping that are its own. So a process read this way places no page on a node,
//! and its private pages are known only where its `status` (readable by anyone) tells them: a
//! process whose hugetlb mappings are all private and anonymous, of one page size, has exactly
//! its `HugetlbPages` of them.
//!
//! A file is named by what its dentry holds: `/memfd:<name>`, `/SYSV<key>`, `/anon_hugepage`
//! (each ` (deleted)`, as `/proc` shows the kernel's own files) for the files of the kernel's own
//! mounts, and `…/<name>` for a file of a mount, whose path the walk of the mounts gives when it
//! walks that mount.

use std::collections::{BTreeMap, HashMap};

use hugepage_agent_common::tasks::{Held, flags, kind};

use super::{
    mounts::Dev,
    procs::{HugeFd, HugeVma, KnownDevs, MapsLine, Process, Told},
};

/// Gathers `held` by process ([`Told`]). `known` tells the devices of the host's hugetlbfs
/// mounts (a file of one is a mount's file, whatever its name); `default_page_size` is a
/// record's page size when the kernel's BTF did not give one; `truncated` that the iterators
/// wrote more than was read.
pub fn gather(held: &[Held], truncated: bool, known: &KnownDevs, default_page_size: u64) -> Told {
    let mut processes: HashMap<u32, Process> = HashMap::new();
    for h in held {
        let dev = Dev::from_kernel(h.dev);
        let path = path(h, known.get(&dev).is_some_and(Option::is_some));
        let page_size = if h.page_size == 0 {
            default_page_size
        } else {
            h.page_size
        };
        let p = processes.entry(h.tgid).or_insert_with(|| Process {
            pid: h.tgid,
            ..Process::default()
        });
        match h.kind {
            kind::MAPPING => {
                let map = MapsLine {
                    start: h.start,
                    end: h.end,
                    shared: h.flags & flags::SHARED != 0,
                    dev,
                    inode: h.ino,
                    path,
                };
                // Threads of one process share its mappings: each is told once.
                if p.vmas.iter().any(|v| v.map == map) {
                    continue;
                }
                if h.flags & flags::SYSV != 0 {
                    p.ipc_ns
                        .get_or_insert_with(|| format!("ipc:[{}]", h.ipc_ns));
                }
                p.vmas.push(HugeVma {
                    map,
                    page_size,
                    pages: BTreeMap::new(),
                    anon_pages: 0,
                    file_held: Some(h.held_bytes),
                });
            }
            kind::DESCRIPTOR => {
                if p.fds.iter().any(|f| f.fd == h.fd) {
                    continue;
                }
                p.fds.push(HugeFd {
                    fd: h.fd,
                    dev,
                    inode: h.ino,
                    path,
                    held: h.held_bytes,
                    page_size,
                });
            }
            _ => {}
        }
    }
    Told {
        processes,
        truncated,
    }
}

/// The path a record's file is shown by (see the module's note): `in_mount` when its device is
/// one of the host's hugetlbfs mounts.
fn path(h: &Held, in_mount: bool) -> String {
    let end = h.name.iter().position(|&b| b == 0).unwrap_or(h.name.len());
    let name = String::from_utf8_lossy(&h.name[..end]);
    let kernels = h.flags & flags::SYSV != 0
        || name.starts_with("memfd:")
        || name.starts_with("anon_hugepage");
    if kernels && !in_mount {
        format!("/{name} (deleted)")
    } else if h.flags & flags::UNLINKED != 0 {
        format!("…/{name} (deleted)")
    } else {
        format!("…/{name}")
    }
}

#[cfg(test)]
mod tests;
