//! What each process of the host holds in hugepages, from `/proc/<pid>`: its hugetlb mappings
//! (`maps` for the file behind each one, `numa_maps` for the `huge` mark, the page size and the
//! pages mapped per NUMA node, joined by their start address) and its open descriptors on
//! hugetlbfs files (`fd/*`, followed with `stat`, a device first seen asked with `statfs`).
//! `numa_maps` walks the page tables, so it is read only for processes whose `maps` shows a
//! mapping hugepages may back. A process whose `/proc` is refused is taken as the task iterators
//! tell it, where they are loaded ([`super::iterated`]).

use std::{
    collections::{BTreeMap, HashMap},
    io,
    os::unix::fs::MetadataExt,
};

use super::mounts::Dev;
use crate::{
    host::NumaNode,
    sysfs::{HostFs, SysfsError, meminfo},
};

/// `statfs`'s `f_type` of hugetlbfs.
pub const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// One hugetlb mapping of a process: its line of `maps`, and what `numa_maps` adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugeVma {
    pub map: MapsLine,
    pub page_size: u64,
    /// Pages mapped per node (`N<node>=`), in hugepages.
    pub pages: BTreeMap<NumaNode, u64>,
    /// Pages of the mapping that are anonymous (`anon=`): a private mapping's own copies.
    pub anon_pages: u64,
    /// Bytes the file holds, when the mapping was read by the task iterators (`i_blocks`);
    /// `None` from `/proc`.
    pub file_held: Option<u64>,
}

/// A descriptor open on a hugetlbfs file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HugeFd {
    pub fd: u32,
    pub dev: Dev,
    pub inode: u64,
    /// The link's target: the path in the process's mount namespace, or `/memfd:name
    /// (deleted)`.
    pub path: String,
    /// Bytes of hugepages the file holds (`st_blocks`, which hugetlbfs counts per page taken).
    pub held: u64,
    pub page_size: u64,
}

/// What one process holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// Its IPC namespace (`ipc:[…]`), read when it maps a SysV segment.
    pub ipc_ns: Option<String>,
    pub vmas: Vec<HugeVma>,
    pub fds: Vec<HugeFd>,
}

impl Process {
    /// Gives each mapping the bytes its file holds as the task iterators told them (`told`, the
    /// same process): `numa_maps` counts only the pages this process has mapped, and a forked
    /// child has none of a shared mapping's until it touches them.
    fn held_as_told(&mut self, told: &Process) {
        for vma in &mut self.vmas {
            vma.file_held = told
                .vmas
                .iter()
                .find(|t| t.map.start == vma.map.start && t.map.inode == vma.map.inode)
                .and_then(|t| t.file_held);
        }
    }
}

/// What the task iterators told of every process, by pid ([`super::iterated::gather`]): for
/// the processes whose `/proc` refuses the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Told {
    pub processes: HashMap<u32, Process>,
    /// The iterators wrote more than the agent reads: a process not in `processes` may hold
    /// hugepages all the same.
    pub truncated: bool,
}

impl Told {
    /// The process `pid` as the iterators told it, its private pages from its `status` (which
    /// anyone may read) where that tells them alone: a process whose hugetlb mappings are all
    /// private, anonymous and of one page size has exactly its `HugetlbPages` of them; `None` when the iterators saw nothing of it
    /// hugetlb. The flag says its private pages are not known.
    pub fn process(&self, host: &HostFs, pid: u32) -> Option<(Process, bool)> {
        let mut p = self.processes.get(&pid)?.clone();
        if p.vmas.iter().all(|v| v.map.shared) {
            return Some((p, false));
        }
        let size = p.vmas[0].page_size;
        let alone = p.vmas.iter().all(|v| {
            !v.map.shared && v.page_size == size && v.map.path.starts_with("/anon_hugepage")
        });
        let hugetlb_bytes = host
            .read_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| meminfo::kb_field(&s, "HugetlbPages"));
        match (alone, hugetlb_bytes) {
            (true, Some(bytes)) => {
                p.vmas[0].anon_pages = bytes / size.max(1);
                Some((p, false))
            }
            _ => Some((p, true)),
        }
    }
}

/// What a walk of `/proc` could not read, and what the task iterators told instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unreadable {
    /// Processes whose `/proc` was refused and that the task iterators told instead: their
    /// pages are on no node ([`super::iterated`]).
    pub iterated: Vec<u32>,
    /// Of those, the ones whose private pages are not known.
    pub private_unknown: u64,
    /// Processes whose mappings `/proc` gave and whose descriptors it refused (their links
    /// take the ptrace access check when `maps` may not), told by the task iterators instead.
    pub descriptors_iterated: u64,
    /// Processes whose `maps` or `fd/` was refused (a ptrace access check: the agent needs
    /// `CAP_SYS_PTRACE` for processes whose capabilities are not a subset of its own) and that
    /// no task iterator told.
    pub processes: u64,
    /// Of those, the ones whose `status` shows hugepages mapped (`HugetlbPages`), or could not
    /// be read either: they may map any holder.
    pub mapping_hugepages: u64,
    /// The first refusal, to name in the answer.
    pub example: Option<String>,
}

/// What is known of the devices before the walk: `mountinfo`'s, hugetlbfs with its page size
/// (`Some`) or another file system (`None`).
pub type KnownDevs = HashMap<Dev, Option<u64>>;

/// Every process of the host (its `/proc`, all but `skip`) that maps hugepages or holds a
/// hugetlbfs file open. Devices not in `known` are asked with `statfs` (through a descriptor)
/// or decided by `numa_maps`; `default_page_size` is a hugetlb mapping's page size when
/// `numa_maps` prints none (no page of it mapped) and its device does not say. `iterate` runs
/// the task iterators, where they are loaded, once the processes are listed (so every process
/// listed was there when they ran): a process whose `/proc` is refused is then as they tell it,
/// and one they did not see holds nothing hugetlb.
pub fn walk(
    host: &HostFs,
    skip: Option<u32>,
    known: &KnownDevs,
    default_page_size: u64,
    iterate: impl FnOnce() -> Option<Told>,
) -> Result<(Vec<Process>, Unreadable), SysfsError> {
    let mut devs = DevKinds(known.clone());
    let mut out = Vec::new();
    let mut unreadable = Unreadable::default();
    let pids: Vec<u32> = host
        .list("/proc")?
        .iter()
        .filter_map(|name| name.parse().ok())
        .filter(|&pid| Some(pid) != skip)
        .collect();
    let iterated = iterate();
    let told = iterated.as_ref().filter(|i| !i.truncated);
    for pid in pids {
        match process(host, pid, &mut devs, default_page_size) {
            Ok((mut p, None)) => {
                if let Some(t) = told.and_then(|i| i.processes.get(&pid)) {
                    p.held_as_told(t);
                }
                if !p.vmas.is_empty() || !p.fds.is_empty() {
                    out.push(p);
                }
            }
            // Its mappings were read, its descriptors refused: those as the iterators tell them.
            Ok((mut p, Some(refused))) => match told {
                Some(told) => {
                    let t = told.processes.get(&pid);
                    p.fds = t.map(|t| t.fds.clone()).unwrap_or_default();
                    if let Some(t) = t {
                        p.held_as_told(t);
                    }
                    unreadable.descriptors_iterated += 1;
                    if !p.vmas.is_empty() || !p.fds.is_empty() {
                        out.push(p);
                    }
                }
                None => unreadable.refused(host, pid, &refused),
            },
            Err(e) if gone(&e) => {}
            Err(_) if told.is_some() => {
                if let Some((p, private_unknown)) = told.and_then(|i| i.process(host, pid)) {
                    unreadable.iterated.push(pid);
                    unreadable.private_unknown += u64::from(private_unknown);
                    out.push(p);
                }
            }
            Err(e) => unreadable.refused(host, pid, &e),
        }
    }
    Ok((out, unreadable))
}

impl Unreadable {
    /// Counts `pid`, whose `/proc` refused `error`.
    fn refused(&mut self, host: &HostFs, pid: u32, error: &SysfsError) {
        self.processes += 1;
        if maps_hugepages(host, pid) != Some(false) {
            self.mapping_hugepages += 1;
        }
        self.example.get_or_insert_with(|| error.to_string());
    }
}

/// Whether `status` shows hugepages mapped by the process (`HugetlbPages`, readable without
/// the ptrace check `maps` needs); `None` when it cannot be read.
fn maps_hugepages(host: &HostFs, pid: u32) -> Option<bool> {
    let status = host.read_string(format!("/proc/{pid}/status")).ok()?;
    Some(meminfo::kb_field(&status, "HugetlbPages")? > 0)
}

/// The process ended while it was read.
fn gone(e: &SysfsError) -> bool {
    matches!(e, SysfsError::Read { source, .. }
        if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH))
}

/// Devices seen so far: hugetlbfs with its page size, or not.
struct DevKinds(KnownDevs);

impl DevKinds {
    /// The page size of a hugetlbfs device, asked of the file at `path` when not yet known; a
    /// failed `statfs` decides nothing and is asked again next time.
    fn page_size(&mut self, host: &HostFs, dev: Dev, path: &str) -> Option<u64> {
        if let Some(known) = self.0.get(&dev) {
            return *known;
        }
        let (kind, block) = host.statfs(path).ok()?;
        let size = (kind == HUGETLBFS_MAGIC).then_some(block);
        self.0.insert(dev, size);
        size
    }

    /// Whether a mapping on `dev` may be hugetlb: a hugetlbfs device, or an anonymous device
    /// (major 0) not known to be another file system, which `numa_maps` then decides.
    fn may_be_hugetlb(&self, dev: Dev) -> bool {
        match self.0.get(&dev) {
            Some(known) => known.is_some(),
            None => dev.major == 0,
        }
    }
}

/// What `/proc/<pid>` tells of one process, and the refusal of its descriptors' links when the
/// kernel gave its mappings but not those (what it holds open is then not in it).
fn process(
    host: &HostFs,
    pid: u32,
    devs: &mut DevKinds,
    default_page_size: u64,
) -> Result<(Process, Option<SysfsError>), SysfsError> {
    // Descriptors first: a file on a mount only this process sees tells its device.
    let mut fds = Vec::new();
    let mut refused = None;
    for name in host.list(format!("/proc/{pid}/fd"))? {
        let Ok(fd) = name.parse::<u32>() else {
            continue;
        };
        let link = format!("/proc/{pid}/fd/{fd}");
        let target = match host.read_link(&link) {
            Ok(target) => target,
            Err(e) if denied(&e) => {
                refused.get_or_insert(e);
                break;
            }
            // Closed since it was listed.
            Err(_) => continue,
        };
        let target = target.to_string_lossy().into_owned();
        // Sockets, pipes and anonymous inodes (`socket:[…]`) are no file's.
        if !target.starts_with('/') {
            continue;
        }
        let Ok(Some(meta)) = host.stat(&link) else {
            continue;
        };
        if !meta.is_file() {
            continue;
        }
        let dev = Dev::from_st_dev(meta.dev());
        if let Some(page_size) = devs.page_size(host, dev, &link) {
            fds.push(HugeFd {
                fd,
                dev,
                inode: meta.ino(),
                path: target,
                held: meta.blocks().saturating_mul(512),
                page_size,
            });
        }
    }
    let maps = host.read_string(format!("/proc/{pid}/maps"))?;
    let candidates = maps_candidates(&maps, |dev| devs.may_be_hugetlb(dev));
    let vmas = if candidates.is_empty() {
        Vec::new()
    } else {
        let numa = host.read_string(format!("/proc/{pid}/numa_maps"))?;
        join(candidates, &numa, |dev| {
            devs.0
                .get(&dev)
                .copied()
                .flatten()
                .unwrap_or(default_page_size)
        })
    };
    let ipc_ns = vmas
        .iter()
        .any(|v| v.map.path.starts_with("/SYSV"))
        .then(|| host.read_link(format!("/proc/{pid}/ns/ipc")).ok())
        .flatten()
        .map(|l| l.to_string_lossy().into_owned());
    let p = Process {
        pid,
        ipc_ns,
        vmas,
        fds,
    };
    Ok((p, refused))
}

/// The kernel refused the read (a permission check), as opposed to the file having gone.
fn denied(e: &SysfsError) -> bool {
    matches!(e, SysfsError::Read { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM)))
}

/// A mapping of `maps` that hugepages may back: an anonymous hugetlb mapping, a SysV segment, a
/// memfd, or a file on a device `hugetlbfs` says is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsLine {
    pub start: u64,
    pub end: u64,
    /// `MAP_SHARED` (`s` in `maps`): its pages are the file's, not the process's.
    pub shared: bool,
    pub dev: Dev,
    pub inode: u64,
    /// As `maps` shows it: `/anon_hugepage (deleted)`, `/SYSV00001234 (deleted)`,
    /// `/memfd:name (deleted)`, or the file's path in the process's mount namespace.
    pub path: String,
}

/// The lines of a `maps` text hugepages may back.
pub fn maps_candidates(maps: &str, hugetlbfs: impl Fn(Dev) -> bool) -> Vec<MapsLine> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, ' ');
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?;
            let _offset = fields.next()?;
            let (major, minor) = fields.next()?.split_once(':')?;
            let dev = Dev {
                major: u32::from_str_radix(major, 16).ok()?,
                minor: u32::from_str_radix(minor, 16).ok()?,
            };
            let inode: u64 = fields.next()?.parse().ok()?;
            let path = fields.next().unwrap_or("").trim_start().to_owned();
            let special = ["/anon_hugepage", "/SYSV", "/memfd:"]
                .iter()
                .any(|p| path.starts_with(p));
            if inode == 0 || !(special || hugetlbfs(dev)) {
                return None;
            }
            Some(MapsLine {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                shared: perms.as_bytes().get(3) == Some(&b's'),
                dev,
                inode,
                path,
            })
        })
        .collect()
}

/// The candidates `numa_maps` marks `huge`, with its page size and pages per node. The kernel
/// prints no `kernelpagesize_kB` for a mapping with no page mapped yet: `page_size` gives its
/// device's.
pub fn join(
    candidates: Vec<MapsLine>,
    numa_maps: &str,
    page_size: impl Fn(Dev) -> u64,
) -> Vec<HugeVma> {
    let huge: HashMap<u64, (u64, BTreeMap<NumaNode, u64>, u64)> = numa_maps
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let start = u64::from_str_radix(words.next()?, 16).ok()?;
            let mut is_huge = false;
            let mut page_kb = 0;
            let mut pages = BTreeMap::new();
            let mut anon = 0;
            for word in words {
                if word == "huge" {
                    is_huge = true;
                } else if let Some(kb) = word.strip_prefix("kernelpagesize_kB=") {
                    page_kb = kb.parse().ok()?;
                } else if let Some(n) = word.strip_prefix("anon=") {
                    anon = n.parse().ok()?;
                } else if let Some((node, n)) =
                    word.strip_prefix('N').and_then(|w| w.split_once('='))
                    && let Ok(node) = node.parse()
                {
                    pages.insert(NumaNode(node), n.parse().ok()?);
                }
            }
            is_huge.then_some((start, (page_kb * 1024, pages, anon)))
        })
        .collect();
    candidates
        .into_iter()
        .filter_map(|c| {
            let (kernel_page, pages, anon_pages) = huge.get(&c.start)?.clone();
            let page_size = if kernel_page == 0 {
                page_size(c.dev)
            } else {
                kernel_page
            };
            Some(HugeVma {
                map: c,
                page_size,
                pages,
                anon_pages,
                file_held: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0021000 r--p 00000000 08:01 1311 /usr/bin/dpdk-app
7f0000000000-7f0000800000 rw-s 00000000 00:2d 7 /dev/hugepages/rtemap_0
7f0000800000-7f0000c00000 rw-s 00000000 00:10 3 /SYSV00001234 (deleted)
7f0000c00000-7f0001000000 rw-p 00000000 00:0f 1025 /anon_hugepage (deleted)
7f0001000000-7f0001200000 rw-s 00000000 00:01 2050 /memfd:pool (deleted)
7f0001200000-7f0001400000 rw-s 00000000 00:01 2051 /memfd:shm (deleted)
7f0002000000-7f0002021000 rw-p 00000000 00:00 0 
";

    const NUMA_MAPS: &str = "\
55d0c0000000 default file=/usr/bin/dpdk-app mapped=20 N0=20 kernelpagesize_kB=4
7f0000000000 default file=/dev/hugepages/rtemap_0 huge dirty=4 N0=3 N1=1 kernelpagesize_kB=2048
7f0000800000 default file=/SYSV00001234\\040(deleted) huge dirty=2 N1=2 kernelpagesize_kB=2048
7f0000c00000 default file=/anon_hugepage\\040(deleted) huge anon=2 dirty=2 N0=2 kernelpagesize_kB=2048
7f0001000000 default file=/memfd:pool\\040(deleted) huge dirty=1 N0=1 kernelpagesize_kB=1048576
7f0001200000 default file=/memfd:shm\\040(deleted) dirty=1 N0=1 kernelpagesize_kB=4
7f0002000000 default anon=1 dirty=1 N0=1 kernelpagesize_kB=4
";

    #[test]
    fn maps_and_numa_maps_join_on_the_start_of_each_hugetlb_mapping() {
        let hugetlbfs = |d: Dev| {
            d == Dev {
                major: 0,
                minor: 0x2d,
            }
        };
        let candidates = maps_candidates(MAPS, hugetlbfs);
        assert_eq!(
            candidates.len(),
            5,
            "the binary and the heap are no candidates"
        );
        let vmas = join(candidates, NUMA_MAPS, |_| 2 << 20);
        let paths: Vec<_> = vmas.iter().map(|v| v.map.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/dev/hugepages/rtemap_0",
                "/SYSV00001234 (deleted)",
                "/anon_hugepage (deleted)",
                "/memfd:pool (deleted)"
            ],
            "the memfd of ordinary pages is not huge"
        );
        let file = &vmas[0];
        assert!(file.map.shared);
        assert_eq!(
            file.map.dev,
            Dev {
                major: 0,
                minor: 45
            }
        );
        assert_eq!(file.map.inode, 7);
        assert_eq!(file.page_size, 2 << 20);
        assert_eq!(
            file.pages,
            BTreeMap::from([(NumaNode(0), 3), (NumaNode(1), 1)])
        );
        assert_eq!(vmas[1].map.inode, 3, "a segment's inode is its shmid");
        assert!(!vmas[2].map.shared);
        assert_eq!(vmas[2].anon_pages, 2);
        assert_eq!(vmas[3].page_size, 1 << 30);
    }

    #[test]
    fn lines_that_are_not_maps_are_passed_over() {
        assert!(maps_candidates("garbage\n7f-80 rw-s 0 zz:01 3 /SYSV1\n", |_| true).is_empty());
        let one = maps_candidates("7f-80 rw-s 0 00:01 3 /SYSV1\n", |_| false);
        assert!(
            join(
                one.clone(),
                "7f default huge N0=x kernelpagesize_kB=2048\n",
                |_| 1
            )
            .is_empty()
        );
        let untouched = join(one, "7f default file=/SYSV1 huge\n", |_| 2 << 20);
        assert_eq!(
            (untouched.len(), untouched[0].page_size),
            (1, 2 << 20),
            "a hugetlb mapping with no page mapped yet has no kernelpagesize_kB: its device's size"
        );
    }
}
