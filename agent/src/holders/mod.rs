//! Who holds the hugepages that are not a running process's private mapping: the files of every
//! hugetlbfs mount, the SysV segments hugepages back, and the `memfd`s still open; which
//! processes map each one or hold it open; and those **held by nothing that runs**, which no
//! process maps, holds open or attaches. What the walk explains is accounted per page size
//! against what the pools show in use, and the rest is said to be unexplained, with the
//! segments that may hold it.
//!
//! One walk ([`walk`]) reads, through `--host-root`: the host's mounts (`/proc/1/mountinfo`), the
//! files of each hugetlbfs mount (`st_blocks`, which hugetlbfs counts per page a file holds; the
//! mount read where `--host-root` shows it, else through `/proc/1/root`),
//! every process's hugetlb mappings and descriptors ([`procs`]; the task iterators where
//! `/proc` refuses the agent, [`iterated`]), and `/proc/sysvipc/shm` ([`sysv`]). Pages are placed on their NUMA node where a process maps them (`numa_maps`); the
//! pages of a file no process maps are placed by a private read-only mapping of the agent's own
//! for the time of one query ([`nodes`]); a segment nothing attaches cannot be placed, and the
//! answer says so. The agent never deletes, detaches or writes anything it finds.

pub mod book;
pub mod iterated;
pub mod mounts;
pub mod nodes;
pub mod procs;
pub mod sysv;
pub mod view;

use std::{
    collections::{BTreeMap, HashMap},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};

use crate::{
    host::{HugepageTable, NumaNode},
    kubelet::cgroup_path::{Owner, classify},
    sysfs::{HostFs, SysfsError, beneath::Beneath, hugepages},
};
use mounts::{Dev, Mount};
use procs::{HugeVma, Process};
use sysv::Segment;

/// What holds the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// A file in a hugetlbfs mount (or one a process maps or holds open from a mount it alone
    /// sees).
    HugetlbfsFile,
    /// A SysV shared memory segment created with `SHM_HUGETLB`.
    SysvSegment,
    /// A `memfd_create(MFD_HUGETLB)` file.
    Memfd,
    /// What the pools show in use and nothing above explains.
    Unexplained,
}

/// How the answer knows the NUMA nodes of a holder's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodesFrom {
    /// Every page is mapped by a process, and `numa_maps` places it.
    Mappings,
    /// Some pages are mapped and placed; the others are not mapped by any process.
    SomeMappings,
    /// No process maps every page of it, and the agent asked the kernel where each page is
    /// through a private read-only mapping of its own ([`nodes`]).
    Queried,
    /// Neither: [`Holder::nodes_note`] says why.
    Unknown,
}

/// One process that maps a holder or holds it open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct User {
    pub pid: u32,
    pub command: String,
    /// It maps the holder (or attaches the segment).
    pub maps: bool,
    /// Its descriptors open on the holder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_fds: Vec<u32>,
    #[serde(flatten)]
    pub cgroup: InCgroup,
}

/// A process's cgroup (v2), when readable, and the pod and container it is, when a pod's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InCgroup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

impl InCgroup {
    /// The cgroup at `path` (none when unknown), with the pod and container its path names.
    pub fn at(path: Option<String>) -> InCgroup {
        let (pod_uid, container_id) = match path.as_deref().map(classify) {
            Some(Owner::Pod { uid, container, .. }) => (Some(uid.0), container.map(|c| c.id)),
            Some(Owner::System) | None => (None, None),
        };
        InCgroup {
            cgroup: path,
            pod_uid,
            container_id,
        }
    }
}

/// A pid a segment names, and whether a process of that pid runs now (pids are reused: a
/// running one may not be the same process).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPid {
    pub pid: u32,
    pub running: bool,
}

/// The kubelet's `emptyDir: {medium: HugePages}` volume a mount is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    pub pod_uid: String,
    pub volume: String,
}

/// How a segment is known to be hugepages'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SegmentKnownBy {
    /// A process attaches it, and `numa_maps` marks the mapping `huge`.
    Mapping,
    /// The probes saw hugetlb faults taken in it ([`book`]), while the agent ran.
    Faults,
    /// Its `rss` is above its size, which only hugetlb segments show ([`sysv`]).
    Rss,
    /// Nothing attaches it and its `rss` shows nothing, but the pages in use that nothing else
    /// explains add up to its `rss` (with the other segments so found), and no other set of
    /// such segments adds up to them.
    Accounting,
}

/// One holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub kind: Kind,
    pub page_size_bytes: u64,
    /// Bytes of hugepages it holds.
    pub held_bytes: u64,
    /// No process maps it, holds it open or attaches it.
    pub held_by_nothing_that_runs: bool,
    /// Bytes per NUMA node, as far as [`Holder::nodes_from`] says.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_node: BTreeMap<NumaNode, u64>,
    pub nodes_from: NodesFrom,
    /// Why the nodes are not known, or known only in part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_note: Option<String>,
    /// A file's path: in the host's mount namespace for the files of its mounts, else as the
    /// first process that maps or holds it sees it (`…/<name>` when only the task iterators
    /// told it). A memfd's `/memfd:<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The hugetlbfs mount it is in, as the host sees it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_point: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// Unlinked, and held by the processes that still map it or hold it open.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_volume: Option<PodVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shmid: Option<u64>,
    /// A segment of an IPC namespace other than the agent's (`ipc:[…]`, a pod's), seen through
    /// the processes that attach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// A segment's attach count (`nattch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creator: Option<NamedPid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attach: Option<NamedPid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_by: Option<SegmentKnownBy>,
    /// For `unexplained`: the segments not attached whose backing the kernel does not show,
    /// which may hold it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidate_shmids: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<User>,
    /// What the probes saw of it while the agent ran ([`book`]): who made it, who faulted its
    /// pages, what `fallocate(2)` gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<book::Seen>,
    /// A file's superblock device, for the book.
    #[serde(skip)]
    pub dev: Option<Dev>,
}

impl Holder {
    fn new(kind: Kind, page_size_bytes: u64, held_bytes: u64) -> Holder {
        Holder {
            kind,
            page_size_bytes,
            held_bytes,
            held_by_nothing_that_runs: false,
            per_node: BTreeMap::new(),
            nodes_from: NodesFrom::Unknown,
            nodes_note: None,
            path: None,
            mount_point: None,
            inode: None,
            deleted: false,
            pod_volume: None,
            shmid: None,
            ipc_namespace: None,
            key: None,
            size_bytes: None,
            attached: None,
            creator: None,
            last_attach: None,
            known_by: None,
            candidate_shmids: Vec::new(),
            users: Vec::new(),
            probes: None,
            dev: None,
        }
    }
}

/// The pages of one size in use, and what holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub page_size_bytes: u64,
    /// `(nr_hugepages - free_hugepages) × size`: pages taken from the pool.
    pub in_use_bytes: u64,
    /// Running processes' private mappings (the cgroups' consumers hold these).
    pub private_bytes: u64,
    /// `MAP_SHARED | MAP_ANONYMOUS` mappings of running processes, each counted once.
    pub shared_anonymous_bytes: u64,
    pub files_bytes: u64,
    pub segments_bytes: u64,
    pub memfds_bytes: u64,
    /// Of the files' and segments': held by nothing that runs.
    pub held_by_nothing_that_runs_bytes: u64,
    /// Per node where known; [`NodesFrom::Unknown`] pages under no node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub held_by_nothing_that_runs_per_node: BTreeMap<NumaNode, u64>,
    /// In use and explained by none of the above.
    pub unexplained_bytes: u64,
}

/// What the walk could not read, and what that leaves unseen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unread {
    pub what: String,
    pub error: String,
}

/// The answer of one walk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holders {
    /// Largest first.
    pub holders: Vec<Holder>,
    pub accounts: Vec<Account>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<Unread>,
}

/// `/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>` in a mount point: the kubelet's
/// `emptyDir` of medium `HugePages` (under any `--root-dir`).
pub fn pod_volume(mount_point: &str) -> Option<PodVolume> {
    let (_, rest) = mount_point.split_once("/pods/")?;
    let (uid, rest) = rest.split_once('/')?;
    let volume = rest.strip_prefix("volumes/kubernetes.io~empty-dir/")?;
    (!uid.is_empty() && !volume.is_empty() && !volume.contains('/')).then(|| PodVolume {
        pod_uid: uid.to_owned(),
        volume: volume.to_owned(),
    })
}

/// A file's identity: its superblock's device and its inode.
type FileKey = (Dev, u64);

/// A file met in a mount or through a process.
struct FileSeen {
    page_size: u64,
    /// Where the agent can open it: beneath its mount's root, for the files of the mounts.
    read_at: Option<(Arc<Beneath>, PathBuf)>,
    /// From `st_blocks` when it was `stat`ed; else `None`.
    held: Option<u64>,
    path: String,
    mount: Option<usize>,
    deleted: bool,
    memfd: bool,
}

/// Users and mapped pages of one file or segment, gathered from the processes.
#[derive(Default)]
struct Use {
    users: BTreeMap<u32, (bool, Vec<u32>)>,
    /// Per node, the most pages any one process maps there: a lower bound of the pages there.
    mapped: BTreeMap<NumaNode, u64>,
    /// Bytes the file holds, as the task iterators read it (`i_blocks`), when they read a
    /// process that maps it.
    held: Option<u64>,
}

impl Use {
    fn map(&mut self, pid: u32, vma: &HugeVma) {
        self.users.entry(pid).or_default().0 = true;
        self.held = self.held.max(vma.file_held);
        // A private mapping's pages may be its own copies: only a shared one places the file's.
        if !vma.map.shared {
            return;
        }
        for (&node, &pages) in &vma.pages {
            let bytes = pages.saturating_mul(vma.page_size);
            let most = self.mapped.entry(node).or_default();
            *most = (*most).max(bytes);
        }
    }
}

/// Walks the host once (see the module's note), with no probes' book: the CLI's walk.
pub fn walk(host: &HostFs, pools: &HugepageTable) -> Holders {
    walk_with(host, pools, &book::Book::default())
}

/// Walks the host once (see the module's note). `pools` gives the sizes and what is in use;
/// `book` what the probes saw between walks, which the walk reconciles.
/// What cannot be read is named in [`Holders::unread`], and the rest still answered.
pub fn walk_with(host: &HostFs, pools: &HugepageTable, book: &book::Book) -> Holders {
    let walk_began = crate::numa::map::monotonic_now();
    let mut unread = Vec::new();
    let mut known = procs::KnownDevs::new();
    let mounts = match host.read_string("/proc/1/mountinfo") {
        Ok(text) => {
            known.extend(mounts::others(&text).into_iter().map(|d| (d, None)));
            mounts::hugetlbfs(&text)
        }
        Err(e) => {
            unread.push(Unread {
                what: "the host's mounts: the files of its hugetlbfs mounts are not listed".into(),
                error: e.to_string(),
            });
            Vec::new()
        }
    };
    let mut files: BTreeMap<FileKey, FileSeen> = BTreeMap::new();
    let mut page_sizes: HashMap<Dev, u64> = HashMap::new();
    let mut bounds = Bounds::new();
    for (index, mount) in mounts.iter().enumerate() {
        if let Err(error) =
            mount_files(host, mount, index, &mut files, &mut page_sizes, &mut bounds)
        {
            unread.push(Unread {
                what: format!("the files of the hugetlbfs mount {}", mount.mount_point),
                error,
            });
        }
    }
    known.extend(page_sizes.iter().map(|(&d, &size)| (d, Some(size))));
    let skip = host
        .read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_string_lossy().parse().ok());
    let default_page = pools
        .global
        .iter()
        .map(|g| g.size.0)
        .min()
        .unwrap_or(2 << 20);
    // Whether every process that may map a holder was read: only then is a holder no process
    // uses said to be held by nothing that runs.
    let mut all_read = true;
    let mut told = Vec::new();
    let (tasks, tasks_missing) = match book.tasks() {
        Some(Ok(tasks)) => (Some(tasks), None),
        Some(Err(why)) => (None, Some(why)),
        None => (None, None),
    };
    let iterate = || {
        let read = tasks.as_ref()?.read();
        match read {
            Ok(records) => {
                if records.truncated {
                    told.push(Unread {
                        what: format!(
                            "what the task iterators told past {} mappings and descriptors: the \
                             processes whose /proc the agent may not read are not listed",
                            crate::probes::tasks::MAX_RECORDS
                        ),
                        error: "the walk's bound".into(),
                    });
                }
                Some(iterated::gather(
                    &records.held,
                    records.truncated,
                    &known,
                    default_page,
                ))
            }
            Err(e) => {
                told.push(Unread {
                    what: "the task iterators: the processes whose /proc the agent may not \
                           read are not listed"
                        .into(),
                    error: e.to_string(),
                });
                None
            }
        }
    };
    let walked = procs::walk(host, skip, &known, default_page, iterate);
    unread.append(&mut told);
    let (processes, unreadable) = match walked {
        Ok(walked) => walked,
        Err(e) => {
            all_read = false;
            unread.push(Unread {
                what: "the host's processes: what they map and hold open is not listed, and no \
                       holder is said to be held by nothing that runs"
                    .into(),
                error: e.to_string(),
            });
            Default::default()
        }
    };
    if unreadable.processes > 0 {
        let what = if unreadable.mapping_hugepages > 0 {
            all_read = false;
            format!(
                "the mappings and descriptors of {} processes, {} of them mapping hugepages \
                 (HugetlbPages in their status): what they hold is not listed and may be \
                 counted as unexplained, and no holder is said to be held by nothing that runs",
                unreadable.processes, unreadable.mapping_hugepages
            )
        } else {
            format!(
                "the mappings and descriptors of {} processes, none of them mapping hugepages \
                 (HugetlbPages 0 in their status): a file one of them holds open without \
                 mapping it is not seen",
                unreadable.processes
            )
        };
        let what = match &tasks_missing {
            Some(why) => {
                format!("{what}; the task iterators, which would read them, are not loaded: {why}")
            }
            None => what,
        };
        unread.push(Unread {
            what,
            error: unreadable.example.unwrap_or_default(),
        });
    }
    // What the task iterators told in place of /proc: said in the answer, after the book's
    // reconcile is decided (nothing was left unread for it).
    let mut told = Vec::new();
    if !unreadable.iterated.is_empty() {
        told.push(Unread {
            what: format!(
                "the pages per NUMA node of {} processes whose /proc the agent may not read: the \
                 task iterators named what they map and hold open, not the nodes of its pages",
                unreadable.iterated.len()
            ),
            error: "numa_maps takes a ptrace access check the agent does not pass (no \
                    CAP_SYS_PTRACE)"
                .into(),
        });
    }
    if unreadable.private_unknown > 0 {
        told.push(Unread {
            what: format!(
                "the private hugetlb pages of {} of them (private mappings of files, or of more \
                 than one page size): counted as unexplained",
                unreadable.private_unknown
            ),
            error: "a private mapping's own pages are told only by numa_maps".into(),
        });
    }
    let mut segments_read = false;
    let segments = match host.read_string("/proc/sysvipc/shm") {
        Ok(text) => match sysv::parse(&text) {
            Some(segments) => {
                segments_read = true;
                segments
            }
            None => {
                unread.push(Unread {
                    what: "the SysV segments (/proc/sysvipc/shm)".into(),
                    error: "its header lacks a column the walk reads".into(),
                });
                Vec::new()
            }
        },
        Err(e) => {
            unread.push(Unread {
                what: "the SysV segments (/proc/sysvipc/shm)".into(),
                error: e.to_string(),
            });
            Vec::new()
        }
    };
    let own_ipc = host
        .read_link("/proc/self/ns/ipc")
        .ok()
        .map(|l| l.to_string_lossy().into_owned());
    let own_ipc_ns = own_ipc.as_deref().and_then(namespace_inode);
    let mut found = Found {
        own_ipc,
        faulted_segments: own_ipc_ns
            .map(|ns| book.faulted_segments(ns))
            .unwrap_or_default(),
        ..Found::default()
    };
    found.gather(&processes, &mut files);
    let files_seen = files.keys().copied().collect();
    let mut holders = found.files(&mounts, files);
    let (segment_holders, mut candidates) = found.segments(host, &segments, pools);
    holders.extend(segment_holders);
    holders.extend(found.other_namespaces());
    if !all_read {
        for h in &mut holders {
            h.held_by_nothing_that_runs = false;
        }
    }
    // The accounts single a segment out only when every process was read and the pools did not
    // move while the walk ran.
    if all_read && in_use(&hugepages::read_table(host).unwrap_or_default()) == in_use(pools) {
        let inferred = by_accounting(&account(pools, &holders, &found), &candidates);
        for (s, size) in &inferred {
            let known = SegmentKnownBy::Accounting;
            holders.push(segment_holder(host, s, *size, known, Use::default()));
        }
        candidates.retain(|c| inferred.iter().all(|(s, _)| s.shmid != c.shmid));
    }
    let accounts = account(pools, &holders, &found);
    for a in &accounts {
        if a.unexplained_bytes > 0 {
            let mut h = Holder::new(Kind::Unexplained, a.page_size_bytes, a.unexplained_bytes);
            h.candidate_shmids = candidates.iter().map(|s| s.shmid).collect();
            holders.push(h);
        }
    }
    let mut commands = HashMap::new();
    for h in &mut holders {
        for u in &mut h.users {
            describe(host, u, &mut commands);
        }
        let told_by_iterators = h.users.iter().any(|u| unreadable.iterated.contains(&u.pid));
        if h.nodes_from == NodesFrom::Unknown && h.nodes_note.is_none() && told_by_iterators {
            h.nodes_note = Some(
                "its users were read by the task iterators, which do not place pages on nodes"
                    .into(),
            );
        }
    }
    holders.sort_by(|a, b| {
        b.held_bytes
            .cmp(&a.held_bytes)
            .then_with(|| a.kind.cmp(&b.kind))
            .then_with(|| a.path.cmp(&b.path))
            .then_with(|| a.shmid.cmp(&b.shmid))
    });
    let reconcile = book::Reconcile {
        walk_began,
        files: unread.is_empty(),
        segments: segments_read,
        files_seen,
    };
    book.annotate(host, &mut holders, own_ipc_ns, reconcile);
    unread.append(&mut told);
    Holders {
        holders,
        accounts,
        unread,
    }
}

/// Bytes in use per page size (`nr_hugepages - free_hugepages`, times the size).
fn in_use(pools: &HugepageTable) -> BTreeMap<u64, u64> {
    pools
        .global
        .iter()
        .map(|g| {
            (
                g.size.0,
                g.total.saturating_sub(g.free).saturating_mul(g.size.0),
            )
        })
        .collect()
}

/// The most entries one walk lists in all the mounts together, and the longest it lists them:
/// a tenant's hugetlbfs volume may hold any number of empty files and directories, and the walk
/// must end. Past either, the rest is named in `unread`.
pub const MAX_ENTRIES: usize = 100_000;
pub const MAX_LISTING: std::time::Duration = std::time::Duration::from_secs(10);

/// What is left of the listing's bounds as the mounts are walked.
struct Bounds {
    entries: usize,
    until: std::time::Instant,
}

impl Bounds {
    fn new() -> Bounds {
        Bounds {
            entries: MAX_ENTRIES,
            until: std::time::Instant::now() + MAX_LISTING,
        }
    }

    /// Takes `n` entries, or says which bound is spent.
    fn take(&mut self, n: usize) -> Result<(), String> {
        if std::time::Instant::now() > self.until {
            return Err(format!(
                "the listing stopped after {MAX_LISTING:?} (the walk's bound)"
            ));
        }
        self.entries = self.entries.checked_sub(n).ok_or_else(|| {
            format!("the listing stopped at {MAX_ENTRIES} entries (the walk's bound)")
        })?;
        Ok(())
    }
}

/// The regular files under a mount, with what each holds: listed beneath the mount's root, no
/// link followed and no other mount entered ([`crate::sysfs::beneath`]), within `bounds`.
fn mount_files(
    host: &HostFs,
    mount: &Mount,
    index: usize,
    files: &mut BTreeMap<FileKey, FileSeen>,
    page_sizes: &mut HashMap<Dev, u64>,
    bounds: &mut Bounds,
) -> Result<(), String> {
    let (root, st_dev) = mount_root(host, mount).map_err(|e| e.to_string())?;
    let page_size = match mount.page_size {
        Some(size) => size,
        None => host.statfs(&root).map_err(|e| e.to_string())?.1,
    };
    page_sizes.insert(mount.dev, page_size);
    let tree = Arc::new(host.beneath(&root, st_dev).map_err(|e| e.to_string())?);
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let entries = tree.entries(&rel).map_err(|e| e.to_string())?;
        bounds.take(entries.len())?;
        for (name, st) in entries {
            let rel = rel.join(name);
            if st.is_dir {
                dirs.push(rel);
            } else if st.is_file {
                files.insert(
                    (mount.dev, st.ino),
                    FileSeen {
                        page_size,
                        path: format!("{}/{}", mount.mount_point, rel.display()),
                        read_at: Some((tree.clone(), rel)),
                        held: Some(st.blocks.saturating_mul(512)),
                        mount: Some(index),
                        deleted: false,
                        memfd: false,
                    },
                );
            }
        }
    }
    Ok(())
}

/// Where the agent reads a mount of the host: its mount point under `--host-root` when that is
/// the mount (the agent shares the host's mount namespace, or the DaemonSet mounts it there),
/// else through the host's first process (`/proc/1/root`, which takes `CAP_SYS_PTRACE`). The
/// directory's device tells that it is the mount and not a directory below it.
fn mount_root(host: &HostFs, mount: &Mount) -> Result<(String, u64), SysfsError> {
    let through_init = format!("/proc/1/root{}", mount.mount_point);
    let mut last = None;
    for root in [mount.mount_point.clone(), through_init] {
        match host.stat(&root) {
            Ok(Some(meta)) if Dev::from_st_dev(meta.dev()) == mount.dev => {
                return Ok((root, meta.dev()));
            }
            Ok(found) => {
                last = Some(SysfsError::Malformed {
                    path: host.path(&root),
                    expected: "the hugetlbfs mount",
                    found: found.map_or("nothing".into(), |m| {
                        format!("device {}", Dev::from_st_dev(m.dev()))
                    }),
                });
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| SysfsError::Malformed {
        path: host.path(&mount.mount_point),
        expected: "the hugetlbfs mount",
        found: "nothing".into(),
    }))
}

/// What the processes hold, gathered by holder.
#[derive(Default)]
struct Found {
    /// The agent's IPC namespace: the one whose segments `/proc/sysvipc/shm` lists.
    own_ipc: Option<String>,
    /// The segments of the agent's IPC namespace the probes saw faults in: their page size.
    faulted_segments: HashMap<u64, u64>,
    files: HashMap<FileKey, Use>,
    /// The segments of the agent's IPC namespace processes attach: page size and users.
    segments: HashMap<u64, (u64, Use)>,
    /// Segments of other IPC namespaces (a pod's), by namespace and shmid: their key, page
    /// size and users.
    foreign: BTreeMap<(String, u64), (String, u64, Use)>,
    /// Per size: bytes of private mappings, in all and per node.
    private: BTreeMap<u64, u64>,
    /// Per size and shared anonymous mapping: the most bytes one process maps.
    shared_anonymous: BTreeMap<u64, HashMap<FileKey, u64>>,
}

impl Found {
    fn gather(&mut self, processes: &[Process], files: &mut BTreeMap<FileKey, FileSeen>) {
        for p in processes {
            for vma in &p.vmas {
                self.vma(p.pid, p.ipc_ns.as_deref(), vma, files);
            }
            for fd in &p.fds {
                let seen = files.entry((fd.dev, fd.inode)).or_insert_with(|| FileSeen {
                    page_size: fd.page_size,
                    read_at: None,
                    held: None,
                    path: fd.path.trim_end_matches(" (deleted)").to_owned(),
                    mount: None,
                    deleted: fd.path.ends_with(" (deleted)") && !fd.path.starts_with("/memfd:"),
                    memfd: fd.path.starts_with("/memfd:"),
                });
                seen.held = Some(fd.held);
                let user = self.files.entry((fd.dev, fd.inode)).or_default();
                user.users.entry(p.pid).or_default().1.push(fd.fd);
            }
        }
    }

    fn vma(
        &mut self,
        pid: u32,
        ipc_ns: Option<&str>,
        vma: &HugeVma,
        files: &mut BTreeMap<FileKey, FileSeen>,
    ) {
        let private = vma.anon_pages.saturating_mul(vma.page_size);
        *self.private.entry(vma.page_size).or_default() += private;
        if vma.map.path.starts_with("/anon_hugepage") {
            if vma.map.shared {
                let mapped = vma
                    .file_held
                    .unwrap_or(vma.pages.values().sum::<u64>() * vma.page_size);
                let most = self
                    .shared_anonymous
                    .entry(vma.page_size)
                    .or_default()
                    .entry((vma.map.dev, vma.map.inode))
                    .or_default();
                *most = (*most).max(mapped);
            }
            return;
        }
        if vma.map.path.starts_with("/SYSV") {
            let (size, user) = match ipc_ns {
                Some(ns) if self.own_ipc.as_deref().is_some_and(|own| own != ns) => {
                    let key = vma.map.path.trim_start_matches("/SYSV");
                    let key = key.split(' ').next().unwrap_or("").to_owned();
                    let (_, size, user) = self
                        .foreign
                        .entry((ns.to_owned(), vma.map.inode))
                        .or_insert_with(|| (key, 0, Use::default()));
                    (size, user)
                }
                _ => {
                    let (size, user) = self.segments.entry(vma.map.inode).or_default();
                    (size, user)
                }
            };
            *size = vma.page_size;
            user.map(pid, vma);
            return;
        }
        files
            .entry((vma.map.dev, vma.map.inode))
            .or_insert_with(|| FileSeen {
                page_size: vma.page_size,
                read_at: None,
                held: None,
                path: vma.map.path.trim_end_matches(" (deleted)").to_owned(),
                mount: None,
                deleted: vma.map.path.ends_with(" (deleted)")
                    && !vma.map.path.starts_with("/memfd:"),
                memfd: vma.map.path.starts_with("/memfd:"),
            });
        self.files
            .entry((vma.map.dev, vma.map.inode))
            .or_default()
            .map(pid, vma);
    }

    /// A holder for each file that holds pages or that a process uses.
    fn files(&mut self, mounts: &[Mount], files: BTreeMap<FileKey, FileSeen>) -> Vec<Holder> {
        let mut out = Vec::new();
        for (key, seen) in files {
            let used = self.files.remove(&key).unwrap_or_default();
            let mapped: u64 = used.mapped.values().sum();
            let held = seen.held.or(used.held).unwrap_or(mapped);
            if held == 0 && used.users.is_empty() {
                continue;
            }
            let kind = if seen.memfd {
                Kind::Memfd
            } else {
                Kind::HugetlbfsFile
            };
            let mut h = Holder::new(kind, seen.page_size, held);
            h.inode = Some(key.1);
            h.dev = Some(key.0);
            h.path = Some(seen.path);
            h.deleted = seen.deleted;
            if let Some(m) = seen.mount.and_then(|i| mounts.get(i)) {
                h.mount_point = Some(m.mount_point.clone());
                h.pod_volume = pod_volume(&m.mount_point);
            }
            place(&mut h, used);
            if h.nodes_from != NodesFrom::Mappings
                && let Some((tree, rel)) = &seen.read_at
            {
                query_nodes(&mut h, tree, rel, key.1);
            }
            out.push(h);
        }
        out
    }

    /// A holder for each segment hugepages are known to back, and the resident segments
    /// nothing attaches whose backing the kernel does not show.
    fn segments<'s>(
        &mut self,
        host: &HostFs,
        segments: &'s [Segment],
        pools: &HugepageTable,
    ) -> (Vec<Holder>, Vec<&'s Segment>) {
        let sizes: Vec<u64> = pools.global.iter().map(|g| g.size.0).collect();
        let mut out = Vec::new();
        let mut candidates = Vec::new();
        for s in segments {
            let mapped = self.segments.remove(&s.shmid);
            let faulted = self.faulted_segments.get(&s.shmid).copied();
            let (page_size, known_by, used) = match (mapped, faulted) {
                (Some((size, used)), _) => (size, SegmentKnownBy::Mapping, used),
                (None, Some(size)) => (size, SegmentKnownBy::Faults, Use::default()),
                (None, None) => match rss_page_size(s, &sizes) {
                    Some(size) => (size, SegmentKnownBy::Rss, Use::default()),
                    None => {
                        if s.rss > 0 && s.nattch == 0 {
                            candidates.push(s);
                        }
                        continue;
                    }
                },
            };
            out.push(segment_holder(host, s, page_size, known_by, used));
        }
        (out, candidates)
    }
}

impl Found {
    /// A holder for each segment of another IPC namespace a process attaches: what its mappings
    /// show (the namespace's segment table is not the agent's to read).
    fn other_namespaces(&mut self) -> Vec<Holder> {
        std::mem::take(&mut self.foreign)
            .into_iter()
            .map(|((ns, shmid), (key, page_size, used))| {
                let mapped: u64 = used.mapped.values().sum();
                let held = used.held.unwrap_or(mapped);
                let mut h = Holder::new(Kind::SysvSegment, page_size, held);
                h.shmid = Some(shmid);
                h.key = Some(format!("0x{key}"));
                h.ipc_namespace = Some(ns);
                h.known_by = Some(SegmentKnownBy::Mapping);
                place(&mut h, used);
                h.nodes_note = Some(
                    "a segment of another IPC namespace: its pages are those its users map".into(),
                );
                h
            })
            .collect()
    }
}

/// A segment's holder.
fn segment_holder(
    host: &HostFs,
    s: &Segment,
    page_size: u64,
    known_by: SegmentKnownBy,
    used: Use,
) -> Holder {
    let mut h = Holder::new(Kind::SysvSegment, page_size, segment_held(s, page_size));
    h.shmid = Some(s.shmid);
    h.key = Some(format!("0x{:08x}", s.key));
    h.size_bytes = Some(s.size);
    h.attached = Some(s.nattch);
    h.known_by = Some(known_by);
    let named = |pid: u32| {
        (pid != 0).then(|| NamedPid {
            pid,
            running: host.exists(format!("/proc/{pid}")),
        })
    };
    h.creator = named(s.cpid);
    h.last_attach = named(s.lpid);
    place(&mut h, used);
    if h.nodes_from != NodesFrom::Mappings {
        h.nodes_note =
            Some("a segment's pages are placed only through a process that attaches it".into());
    }
    h.held_by_nothing_that_runs = s.nattch == 0 && h.users.is_empty() && h.held_bytes > 0;
    h
}

/// The most candidates [`by_accounting`] weighs at once (2^20 sums).
const MOST_CANDIDATES: usize = 20;

/// The candidates the accounts explain alone: for each size with bytes unexplained, the one
/// set of candidates whose `rss` (each a whole number of pages of that size, within its
/// segment's size) adds up to exactly those bytes. Two sets that do, or none, leave them all
/// candidates. Each segment goes to one size at most.
fn by_accounting<'s>(accounts: &[Account], candidates: &[&'s Segment]) -> Vec<(&'s Segment, u64)> {
    let mut left: Vec<&Segment> = candidates.to_vec();
    let mut out = Vec::new();
    for a in accounts.iter().filter(|a| a.unexplained_bytes > 0) {
        let size = a.page_size_bytes;
        let fits: Vec<&Segment> = left
            .iter()
            .copied()
            .filter(|s| s.holds_pages(s.rss, size))
            .collect();
        if fits.is_empty() || fits.len() > MOST_CANDIDATES {
            continue;
        }
        let mut found = None;
        let mut matches = 0;
        for mask in 1u32..(1 << fits.len()) {
            let sum = (0..fits.len())
                .filter(|i| mask & (1 << i) != 0)
                .try_fold(0u64, |sum, i| sum.checked_add(fits[i].rss));
            if sum == Some(a.unexplained_bytes) {
                matches += 1;
                found = Some(mask);
                if matches > 1 {
                    break;
                }
            }
        }
        if let (1, Some(mask)) = (matches, found) {
            for (i, s) in fits.iter().enumerate() {
                if mask & (1 << i) != 0 {
                    out.push((*s, size));
                    left.retain(|l| l.shmid != s.shmid);
                }
            }
        }
    }
    out
}

/// The page size a segment's `rss` shows it has, when it shows one: the size whose pages make
/// `rss` a whole number of them, no more than the segment's size allows ([`sysv`]).
fn rss_page_size(s: &Segment, sizes: &[u64]) -> Option<u64> {
    if !s.rss_shows_hugetlb() {
        return None;
    }
    sizes.iter().copied().find(|&size| {
        let held = s.rss / (size / 4096).max(1);
        held > 0 && s.holds_pages(held, size)
    })
}

/// The bytes a hugetlb segment holds, from its `rss` ([`sysv`]).
fn segment_held(s: &Segment, page_size: u64) -> u64 {
    if s.rss_shows_hugetlb() {
        s.rss / (page_size / 4096).max(1)
    } else {
        s.rss
    }
}

/// The holder's users and NUMA placement from what the processes map.
fn place(h: &mut Holder, used: Use) {
    let mapped: u64 = used.mapped.values().sum();
    h.per_node = used.mapped.into_iter().filter(|(_, b)| *b > 0).collect();
    h.nodes_from = if mapped == 0 {
        NodesFrom::Unknown
    } else if mapped >= h.held_bytes {
        NodesFrom::Mappings
    } else {
        NodesFrom::SomeMappings
    };
    h.users = used
        .users
        .into_iter()
        .map(|(pid, (maps, open_fds))| User {
            pid,
            command: String::new(),
            maps,
            open_fds,
            cgroup: InCgroup::default(),
        })
        .collect();
    h.held_by_nothing_that_runs = h.users.is_empty() && h.held_bytes > 0;
}

/// Places a file's pages by asking the kernel through a mapping of the agent's own
/// ([`nodes`]); on failure the nodes stay as the mappings left them, and the note says why.
fn query_nodes(h: &mut Holder, tree: &Beneath, rel: &Path, inode: u64) {
    let asked = tree
        .open_file(rel, inode)
        .map_err(|e| e.to_string())
        .and_then(|fd| {
            nodes::of_descriptor(&fd, inode, h.page_size_bytes).map_err(|e| e.to_string())
        });
    match asked {
        Ok(per_node) => {
            h.per_node = per_node;
            h.nodes_from = NodesFrom::Queried;
        }
        Err(e) => h.nodes_note = Some(format!("not asked of the kernel: {e}")),
    }
}

/// A user's command, cgroup and pod, read once per pid.
fn describe(host: &HostFs, u: &mut User, seen: &mut HashMap<u32, (String, Option<String>)>) {
    let (command, cgroup) = seen
        .entry(u.pid)
        .or_insert_with(|| {
            let command = host
                .read_string(format!("/proc/{}/comm", u.pid))
                .map(|c| c.trim_end().to_owned())
                .unwrap_or_default();
            (command, process_cgroup(host, u.pid))
        })
        .clone();
    u.command = command;
    u.cgroup = InCgroup::at(cgroup);
}

/// A process's cgroup v2 path (`0::` in `/proc/<pid>/cgroup`), when readable.
fn process_cgroup(host: &HostFs, pid: u32) -> Option<String> {
    let text = host.read_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
}

/// The inode number in a namespace link (`ipc:[4026531839]`).
fn namespace_inode(link: &str) -> Option<u32> {
    link.split_once(":[")?.1.strip_suffix(']')?.parse().ok()
}

/// Per page size of the pools: what is in use, and what the holders and the processes explain.
fn account(pools: &HugepageTable, holders: &[Holder], found: &Found) -> Vec<Account> {
    in_use(pools)
        .into_iter()
        .map(|(size, in_use)| {
            let mut a = Account {
                page_size_bytes: size,
                in_use_bytes: in_use,
                private_bytes: found.private.get(&size).copied().unwrap_or(0),
                shared_anonymous_bytes: found
                    .shared_anonymous
                    .get(&size)
                    .map_or(0, |m| m.values().sum()),
                ..Account::default()
            };
            for h in holders.iter().filter(|h| h.page_size_bytes == size) {
                match h.kind {
                    Kind::HugetlbfsFile => a.files_bytes += h.held_bytes,
                    Kind::SysvSegment => a.segments_bytes += h.held_bytes,
                    Kind::Memfd => a.memfds_bytes += h.held_bytes,
                    Kind::Unexplained => {}
                }
                if h.held_by_nothing_that_runs {
                    a.held_by_nothing_that_runs_bytes += h.held_bytes;
                    for (&node, &bytes) in &h.per_node {
                        *a.held_by_nothing_that_runs_per_node
                            .entry(node)
                            .or_default() += bytes;
                    }
                }
            }
            let explained = a.private_bytes
                + a.shared_anonymous_bytes
                + a.files_bytes
                + a.segments_bytes
                + a.memfds_bytes;
            a.unexplained_bytes = a.in_use_bytes.saturating_sub(explained);
            a
        })
        .collect()
}

#[cfg(test)]
mod tests;
