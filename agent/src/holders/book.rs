//! The book the probes keep of hugetlbfs files and SysV segments between walks: who made a file
//! (`hugetlbfs_alloc_inode`), who faulted its pages first and last (the fault record names the
//! VMA's file, [`crate::probes::events::FaultFile`]), what `fallocate(2)` asked for, and when it
//! went (`hugetlbfs_evict_inode`, which drops it at once). The walk stays the reconcile: it names
//! the holders and their pages; the book adds what a walk cannot see after the fact (a process
//! that made a file and exited), knows a segment nothing attaches to be hugepages' from its
//! faults, and makes the latest walk stale when a file the book or the last walk knows is
//! fallocated, truncated or evicted ([`Book::generation`]).
//!
//! Files are keyed by their superblock's device and inode; a SysV segment by its IPC namespace
//! and shmid (which its file's inode number is). The fault ring and the hugetlbfs ring are read
//! apart, so events are weighed by their kernel timestamps: a file made after faults of the same
//! inode number started a new file, faults of an inode older than its eviction are not booked.
//! The book holds at most [`CAPACITY`] entries, dropping the one touched longest ago; a walk
//! that read every mount and process drops the entries of files it no longer finds, and one that
//! read the segment table those of the agent's IPC namespace's segments it no longer lists
//! ([`Reconcile`]).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use super::{Holder, InCgroup, Kind, mounts::Dev, namespace_inode, process_cgroup};
use crate::{
    probes::{
        events::{FaultEvent, FileChange, FileEvent},
        tasks::TaskIterators,
        watch::CgroupV2,
    },
    sysfs::HostFs,
};

/// The most entries the book keeps.
pub const CAPACITY: usize = 16_384;

/// `FALLOC_FL_PUNCH_HOLE`: a fallocate that frees pages rather than taking them.
const FALLOC_FL_PUNCH_HOLE: u32 = 0x02;
/// `S_IFMT` and `S_IFREG`: only regular files are booked as made.
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
/// How many evictions are remembered, so that a fault read after its inode's eviction (the two
/// rings are read apart) is not booked as a new file.
const EVICTIONS_KEPT: usize = 256;

/// What a book entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A file (in a mount, or a memfd) by its superblock's device and inode number.
    File { dev: Dev, ino: u64 },
    /// A SysV segment by its IPC namespace's inode number and its shmid.
    Segment { ipc_ns: u32, shmid: u64 },
}

/// A process the probes saw act on a holder, as it was then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub pid: u32,
    pub command: String,
    /// The cgroup v2 id the kernel gave with the event.
    pub cgroup_id: u64,
    /// That cgroup's path, when the agent could read it before the process left it.
    pub cgroup: Option<String>,
    /// CLOCK_MONOTONIC time of the event.
    pub at: Duration,
}

/// What the probes saw of one holder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    pub made: Option<Actor>,
    pub first_fault: Option<Actor>,
    pub last_fault: Option<Actor>,
    /// Hugetlb faults taken in its shared mappings.
    pub faults: u64,
    /// The page size its faults had.
    pub page_size: Option<u64>,
    /// Bytes successful `fallocate(2)` calls asked for (punched holes not counted).
    pub fallocated_bytes: u64,
    /// A segment's file's device (the kernel's own hugetlbfs mount), for its eviction.
    file_dev: Option<Dev>,
    /// CLOCK_MONOTONIC time of its latest event.
    touched: Duration,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Subject, Entry>,
    generation: u64,
    /// The files (device, inode) the last walk saw, whether they held pages or not.
    walked: HashSet<(Dev, u64)>,
    /// The latest evictions of inodes the book or a walk knew: device, inode, when.
    evicted: VecDeque<(Dev, u64, Duration)>,
    /// The hugetlbfs programs are attached ([`Book::watch_evictions`]).
    evictions_seen: bool,
    /// The task iterators the walk reads processes with, or why they are not loaded
    /// ([`Book::read_tasks`]); `None` without probes.
    tasks: Option<Result<Arc<TaskIterators>, String>>,
}

/// The book, shared by the run loop (which writes it) and the API (which reads it).
#[derive(Debug, Clone, Default)]
pub struct Book(Arc<Mutex<Inner>>);

/// A holder's book entry as the answer shows it (`probes` of a holder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Seen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_by: Option<Witness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_fault_by: Option<Witness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fault_by: Option<Witness>,
    pub faults: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fallocated_bytes: u64,
}

/// A process the probes saw act on a holder: what it was, and whether a process of that pid
/// runs now (pids are reused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Witness {
    pub pid: u32,
    pub command: String,
    pub running: bool,
    /// The cgroup v2 id the kernel gave (the inode number of its directory).
    pub cgroup_id: u64,
    /// Its path, when the agent read it before the process left it.
    #[serde(flatten)]
    pub cgroup: InCgroup,
    /// When, RFC 3339.
    pub at: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Book {
    /// Bumped whenever a file the book or the last walk knows is fallocated, truncated or
    /// evicted, and whenever a file is fallocated new pages: a walk made before is stale.
    pub fn generation(&self) -> u64 {
        self.0.lock().map_or(0, |b| b.generation)
    }

    /// A hugetlb fault with its VMA's file; `cgroup` (pid, cgroup id) is asked for only when the
    /// fault names a new actor (the first fault, or one of another process than the last). Only
    /// a shared mapping's fault is the file's: a private mapping's page is its process's own,
    /// even one read from the file (the agent's own read-only query of a file's nodes is such a
    /// mapping). A fault older than its inode's eviction is not booked.
    pub fn fault(&self, f: &FaultEvent, cgroup: impl FnOnce(u32, u64) -> Option<String>) {
        let Some(file) = f.file.filter(|file| file.shared) else {
            return;
        };
        let dev = Dev::from_kernel(file.dev);
        let subject = if file.sysv && file.ipc_ns != 0 {
            Subject::Segment {
                ipc_ns: file.ipc_ns,
                shmid: file.ino,
            }
        } else {
            Subject::File { dev, ino: file.ino }
        };
        let Ok(mut book) = self.0.lock() else {
            return;
        };
        if matches!(subject, Subject::File { .. }) && book.evicted_after(dev, file.ino, f.at) {
            return;
        }
        let entry = book.entry(subject, f.at);
        entry.faults += 1;
        entry.page_size = f.page_size.or(entry.page_size);
        if matches!(subject, Subject::Segment { .. }) {
            entry.file_dev = Some(dev);
        }
        let new_actor = entry.last_fault.as_ref().is_none_or(|a| a.pid != f.tgid);
        if new_actor {
            let actor = Actor {
                pid: f.tgid,
                command: f.comm.clone(),
                cgroup_id: f.cgroup_id,
                cgroup: cgroup(f.tgid, f.cgroup_id),
                at: f.at,
            };
            entry.first_fault.get_or_insert_with(|| actor.clone());
            entry.last_fault = Some(actor);
        } else if let Some(last) = &mut entry.last_fault {
            last.at = last.at.max(f.at);
        }
    }

    /// A hugetlbfs inode event: a regular file made is booked; one fallocated, truncated or
    /// evicted that the book or the last walk knows makes the latest walk stale; an evicted one
    /// leaves the book, with the segment whose file it was.
    pub fn file(&self, e: &FileEvent, cgroup: impl FnOnce(u32, u64) -> Option<String>) {
        let dev = Dev::from_kernel(e.dev);
        let subject = Subject::File { dev, ino: e.ino };
        let Ok(mut book) = self.0.lock() else {
            return;
        };
        let known = book.entries.contains_key(&subject) || book.walked.contains(&(dev, e.ino));
        match e.change {
            FileChange::Made { mode } => {
                if mode & S_IFMT != S_IFREG {
                    return;
                }
                let actor = Actor {
                    pid: e.tgid,
                    command: e.comm.clone(),
                    cgroup_id: e.cgroup_id,
                    cgroup: cgroup(e.tgid, e.cgroup_id),
                    at: e.at,
                };
                let entry = book.entry(subject, e.at);
                // What was booked of this inode number before it was made is another file's;
                // faults read first (the rings are read apart) are this one's.
                let before = |a: &Option<Actor>| a.as_ref().is_some_and(|a| a.at < e.at);
                if before(&entry.made) || before(&entry.first_fault) {
                    *entry = Entry {
                        touched: e.at,
                        ..Entry::default()
                    };
                }
                entry.made = Some(actor);
            }
            FileChange::Evicted => {
                // An entry touched after the eviction is of another inode of the same number,
                // whose events were read first.
                let removed = book
                    .entries
                    .get(&subject)
                    .is_some_and(|entry| entry.touched <= e.at)
                    && book.entries.remove(&subject).is_some();
                // A segment's file: every IPC namespace keeps its segments on the same kernel
                // mount, and shmids repeat across namespaces, so the eviction names the segment
                // only when one entry has that file. Else the walk reconciles.
                let segments: Vec<Subject> = book
                    .entries
                    .iter()
                    .filter(|(s, entry)| {
                        matches!(s, Subject::Segment { shmid, .. } if *shmid == e.ino)
                            && entry.file_dev == Some(dev)
                    })
                    .map(|(s, _)| *s)
                    .collect();
                if let [segment] = segments[..] {
                    book.entries.remove(&segment);
                }
                if known || removed || !segments.is_empty() {
                    if book.evicted.len() >= EVICTIONS_KEPT {
                        book.evicted.pop_front();
                    }
                    book.evicted.push_back((dev, e.ino, e.at));
                    book.generation += 1;
                }
            }
            FileChange::Fallocated { len, mode, ret, .. } => {
                if ret == 0 && mode & FALLOC_FL_PUNCH_HOLE == 0 {
                    // A memfd is never booked as made: its first fallocate books it.
                    let entry = book.entry(subject, e.at);
                    entry.fallocated_bytes += u64::try_from(len).unwrap_or(0);
                } else if !known {
                    return;
                }
                book.generation += 1;
            }
            FileChange::AttributesSet => {
                if known {
                    book.generation += 1;
                }
            }
        }
    }

    /// Whether the hugetlbfs programs are attached: destroyed segments are then seen evicted,
    /// and the walk leaves other namespaces' segments to their evictions.
    pub fn watch_evictions(&self, seen: bool) {
        if let Ok(mut book) = self.0.lock() {
            book.evictions_seen = seen;
        }
    }

    /// The task iterators the walk reads what processes map and hold with
    /// ([`crate::probes::tasks`]), or why the probes did not load them.
    pub fn read_tasks(&self, tasks: Option<Result<Arc<TaskIterators>, String>>) {
        if let Ok(mut book) = self.0.lock() {
            book.tasks = tasks;
        }
    }

    /// The task iterators, or why they are not loaded; `None` without probes.
    pub fn tasks(&self) -> Option<Result<Arc<TaskIterators>, String>> {
        self.0.lock().ok().and_then(|book| book.tasks.clone())
    }

    /// The page size of each segment of IPC namespace `ipc_ns` that faults were taken in.
    pub fn faulted_segments(&self, ipc_ns: u32) -> HashMap<u64, u64> {
        let Ok(book) = self.0.lock() else {
            return HashMap::new();
        };
        book.entries
            .iter()
            .filter_map(|(subject, entry)| match *subject {
                Subject::Segment { ipc_ns: ns, shmid } if ns == ipc_ns => {
                    Some((shmid, entry.page_size?))
                }
                _ => None,
            })
            .collect()
    }

    /// Gives each holder what the book saw of it (`probes`), keeps the files the walk saw, then
    /// drops what `reconcile` says the walk would have found and did not.
    pub fn annotate(
        &self,
        host: &HostFs,
        holders: &mut [Holder],
        own_ipc_ns: Option<u32>,
        reconcile: Reconcile,
    ) {
        let Ok(mut book) = self.0.lock() else {
            return;
        };
        let now = (SystemTime::now(), crate::numa::map::monotonic_now());
        let mut found: HashSet<Subject> = reconcile
            .files_seen
            .iter()
            .map(|&(dev, ino)| Subject::File { dev, ino })
            .collect();
        for h in holders.iter_mut() {
            let Some(subject) = subject_of(h, own_ipc_ns) else {
                continue;
            };
            found.insert(subject);
            if let Some(entry) = book.entries.get(&subject) {
                h.probes = Some(seen(host, entry, now));
            }
        }
        let evictions_seen = book.evictions_seen;
        book.entries.retain(|subject, entry| {
            let complete = match subject {
                Subject::Segment { ipc_ns, .. } if own_ipc_ns == Some(*ipc_ns) => {
                    reconcile.segments
                }
                // Another namespace's segments are seen only through the processes that attach
                // them; where evictions are seen, those end them instead.
                Subject::Segment { .. } => reconcile.files && !evictions_seen,
                Subject::File { .. } => reconcile.files,
            };
            !complete || found.contains(subject) || entry.touched >= reconcile.walk_began
        });
        // A walk that missed some mount or process keeps what the walks before it met too, up
        // to the book's capacity.
        if reconcile.files || book.walked.len() + reconcile.files_seen.len() > CAPACITY {
            book.walked = reconcile.files_seen;
        } else {
            book.walked.extend(reconcile.files_seen);
        }
    }
}

/// What a walk saw whole: entries touched before it began (CLOCK_MONOTONIC) of a kind it saw
/// whole, whose holder it did not find, are gone.
#[derive(Debug, Clone)]
pub struct Reconcile {
    pub walk_began: Duration,
    /// Every mount, process and descriptor was read: every file that holds pages was found.
    pub files: bool,
    /// The agent's IPC namespace's segment table was read: its every segment was found.
    pub segments: bool,
    /// Every file the walk met (device, inode), holding pages or not.
    pub files_seen: HashSet<(Dev, u64)>,
}

impl Inner {
    /// Whether the inode `dev`, `ino` was evicted after `at`: a fault of it read late.
    fn evicted_after(&self, dev: Dev, ino: u64, at: Duration) -> bool {
        self.evicted
            .iter()
            .any(|&(d, i, evicted)| d == dev && i == ino && evicted > at)
    }

    /// The entry of `subject`, made when new (dropping the entry touched longest ago when the
    /// book is full), touched at `at`.
    fn entry(&mut self, subject: Subject, at: Duration) -> &mut Entry {
        if !self.entries.contains_key(&subject)
            && self.entries.len() >= CAPACITY
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.touched)
                .map(|(s, _)| *s)
        {
            self.entries.remove(&oldest);
        }
        let entry = self.entries.entry(subject).or_default();
        entry.touched = entry.touched.max(at);
        entry
    }
}

/// The book's key for a holder: a file's device and inode, a segment's IPC namespace (the
/// agent's, or the one its users' link names) and shmid.
fn subject_of(h: &Holder, own_ipc_ns: Option<u32>) -> Option<Subject> {
    match h.kind {
        Kind::HugetlbfsFile | Kind::Memfd => Some(Subject::File {
            dev: h.dev?,
            ino: h.inode?,
        }),
        Kind::SysvSegment => Some(Subject::Segment {
            ipc_ns: match &h.ipc_namespace {
                Some(link) => namespace_inode(link)?,
                None => own_ipc_ns?,
            },
            shmid: h.shmid?,
        }),
        Kind::Unexplained => None,
    }
}

fn seen(host: &HostFs, entry: &Entry, now: (SystemTime, Duration)) -> Seen {
    let witness = |a: &Option<Actor>| a.as_ref().map(|a| witness(host, a, now));
    Seen {
        made_by: witness(&entry.made),
        first_fault_by: witness(&entry.first_fault),
        last_fault_by: witness(&entry.last_fault),
        faults: entry.faults,
        fallocated_bytes: entry.fallocated_bytes,
    }
}

fn witness(host: &HostFs, a: &Actor, (wall, monotonic): (SystemTime, Duration)) -> Witness {
    let at = wall
        .checked_sub(monotonic.saturating_sub(a.at))
        .unwrap_or(wall);
    Witness {
        pid: a.pid,
        command: a.command.clone(),
        running: host.exists(format!("/proc/{}", a.pid)),
        cgroup_id: a.cgroup_id,
        cgroup: InCgroup::at(a.cgroup.clone()),
        at: humantime::format_rfc3339_millis(at).to_string(),
    }
}

/// A process's cgroup (v2) path for the book's actors, read through `--host-root` and taken only
/// when it is still the cgroup of id `cgroup_id` the kernel gave with the event (`v2` checks):
/// a process that left it, or a pid used again, gives none.
pub fn cgroup_now<'a>(
    host: &'a HostFs,
    v2: Option<&'a CgroupV2>,
) -> impl Fn(u32, u64) -> Option<String> + 'a {
    move |pid, cgroup_id| {
        let path = process_cgroup(host, pid)?;
        v2?.is_current(host, &path, cgroup_id).then_some(path)
    }
}

#[cfg(test)]
mod tests;
