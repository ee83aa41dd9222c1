//! Ring-buffer records decoded into typed events.
//!
//! A record whose size does not match its type, or whose fields are out of range, is an error
//! rather than a guess: it means the agent and the kernel object disagree about the layout.

use std::time::Duration;

use hugepage_agent_common::{
    cgroup::{CgroupEvent, FLAG_TRUNCATED, PATH_LEN, kind},
    hugetlbfs::{HugetlbfsEvent, kind as file_kind},
    page_fault_user::{HugetlbFault, file, phase},
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("{record} record of {found} bytes, expected {expected}")]
    Size {
        record: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("cgroup record of unknown kind {0}")]
    Kind(u32),
    #[error("cgroup record with path length {0}, more than {PATH_LEN}")]
    PathLen(u32),
    #[error("hugetlb fault record of unknown phase {0}")]
    Phase(u32),
    #[error("hugetlbfs record of unknown kind {0}")]
    FileKind(u32),
}

/// A fault in a hugetlb VMA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultEvent {
    /// CLOCK_MONOTONIC time of the fault: as it started, or when it was done.
    pub at: Duration,
    /// Seen done (fexit), with the kernel's `vm_fault_t` (0: the page is mapped); `None` when
    /// seen as it started, its page maybe not taken yet.
    pub done: Option<u32>,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub pid: u32,
    pub comm: String,
    pub address: u64,
    /// Huge page size of the VMA; `None` when the kernel's BTF could not tell.
    pub page_size: Option<u64>,
    pub write: bool,
    pub error_code: u64,
    pub cpu: u32,
    pub numa_node: u32,
    /// The VMA's file, when the kernel's BTF let the program read it.
    pub file: Option<FaultFile>,
}

/// The file behind a faulting hugetlb VMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultFile {
    /// The device of its superblock, as the kernel keeps it (`major << 20 | minor`).
    pub dev: u32,
    pub ino: u64,
    /// The VMA is shared: the page is the file's, not a private copy.
    pub shared: bool,
    /// A SysV segment's file: `ino` is its shmid in IPC namespace `ipc_ns`.
    pub sysv: bool,
    /// The faulting task's IPC namespace (its inode number); 0 when unknown.
    pub ipc_ns: u32,
}

impl FaultFile {
    /// `major:minor:inode`, for the log.
    pub fn describe(&self) -> String {
        let (major, minor) = split_dev(self.dev);
        format!("{major}:{minor}:{}", self.ino)
    }
}

/// A `dev_t` as the kernel keeps it inside (`major << 20 | minor`), split.
pub fn split_dev(dev: u32) -> (u32, u32) {
    (dev >> 20, dev & 0xf_ffff)
}

/// `VM_FAULT_RETRY` (`include/linux/mm_types.h`): the handler gave up the mmap lock and the
/// fault will be taken again, its page maybe not taken yet.
const VM_FAULT_RETRY: u32 = 0x400;

impl FaultEvent {
    /// Seen done and not to be taken again: its page is taken from the pool, or the fault failed.
    /// Either way nothing later is worth waiting for.
    pub fn settled(&self) -> bool {
        self.done
            .is_some_and(|vm_fault| vm_fault & VM_FAULT_RETRY == 0)
    }

    /// The first byte of the huge page the fault hit (2 MiB assumed when the size is unknown).
    pub fn page_address(&self) -> u64 {
        let size = self.page_size.unwrap_or(2 << 20);
        self.address & !(size - 1)
    }
}

/// What happened to a cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupChange {
    Mkdir,
    Rmdir,
    AttachTask { pid: u32 },
    Release,
}

/// A cgroup lifecycle event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEventInfo {
    pub at: Duration,
    pub change: CgroupChange,
    pub cgroup_id: u64,
    /// Hierarchy id; 0 is cgroup v2.
    pub hierarchy: i32,
    pub level: i32,
    /// Path relative to the hierarchy's mount point.
    pub path: String,
    pub truncated: bool,
}

impl CgroupEventInfo {
    /// Whether the event is about the cgroup v2 hierarchy (the one fault cgroup ids refer to).
    pub fn is_v2(&self) -> bool {
        self.hierarchy == 0
    }
}

/// What happened to a hugetlbfs inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    /// Made in a mount (`hugetlbfs_alloc_inode`), with its `mode` (`S_IFREG | 0644` …).
    Made { mode: u32 },
    /// Evicted, its pages given back (`hugetlbfs_evict_inode`).
    Evicted,
    /// `fallocate(2)` over `offset..offset+len` with `mode`, answered `ret` (0 or `-errno`).
    Fallocated {
        offset: i64,
        len: i64,
        mode: u32,
        ret: i32,
    },
    /// Attributes set (`hugetlbfs_setattr`): a truncation among them.
    AttributesSet,
}

/// A hugetlbfs inode event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEvent {
    pub at: Duration,
    pub change: FileChange,
    /// The device of the inode's superblock (`major << 20 | minor`).
    pub dev: u32,
    pub ino: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub pid: u32,
    pub comm: String,
}

/// Any event from the probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEvent {
    Fault(FaultEvent),
    Cgroup(CgroupEventInfo),
    File(FileEvent),
}

fn read_record<T: Copy>(bytes: &[u8], record: &'static str) -> Result<T, DecodeError> {
    let expected = size_of::<T>();
    if bytes.len() != expected {
        return Err(DecodeError::Size {
            record,
            found: bytes.len(),
            expected,
        });
    }
    // SAFETY: the length matches and `T` is a plain `#[repr(C)]` struct valid for any bytes.
    Ok(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Decodes one record of the `HUGETLB_FAULTS` ring buffer.
pub fn decode_fault(bytes: &[u8]) -> Result<FaultEvent, DecodeError> {
    let raw: HugetlbFault = read_record(bytes, "hugetlb fault")?;
    let done = match raw.phase {
        phase::STARTED => None,
        phase::DONE => Some(raw.vm_fault),
        other => return Err(DecodeError::Phase(other)),
    };
    Ok(FaultEvent {
        at: Duration::from_nanos(raw.timestamp_ns),
        done,
        cgroup_id: raw.cgroup_id,
        tgid: raw.tgid,
        pid: raw.pid,
        comm: c_string(&raw.comm),
        address: raw.address,
        page_size: Some(raw.page_size).filter(|&s| s.is_power_of_two()),
        write: raw.error_code & 2 != 0,
        error_code: raw.error_code,
        cpu: raw.cpu,
        numa_node: raw.numa_node,
        file: (raw.file_flags & file::KNOWN != 0).then_some(FaultFile {
            dev: raw.file_dev,
            ino: raw.file_ino,
            shared: raw.file_flags & file::SHARED != 0,
            sysv: raw.file_flags & file::SYSV != 0,
            ipc_ns: raw.ipc_ns,
        }),
    })
}

/// Decodes one record of the `HUGETLBFS_EVENTS` ring buffer.
pub fn decode_hugetlbfs(bytes: &[u8]) -> Result<FileEvent, DecodeError> {
    let raw: HugetlbfsEvent = read_record(bytes, "hugetlbfs")?;
    let change = match raw.kind {
        file_kind::ALLOC_INODE => FileChange::Made { mode: raw.mode },
        file_kind::EVICT_INODE => FileChange::Evicted,
        file_kind::FALLOCATE => FileChange::Fallocated {
            offset: raw.offset,
            len: raw.len,
            mode: raw.mode,
            ret: raw.ret,
        },
        file_kind::SETATTR => FileChange::AttributesSet,
        other => return Err(DecodeError::FileKind(other)),
    };
    Ok(FileEvent {
        at: Duration::from_nanos(raw.timestamp_ns),
        change,
        dev: raw.dev,
        ino: raw.ino,
        cgroup_id: raw.cgroup_id,
        tgid: raw.tgid,
        pid: raw.pid,
        comm: c_string(&raw.comm),
    })
}

/// Decodes one record of the `CGROUP_EVENTS` ring buffer.
pub fn decode_cgroup(bytes: &[u8]) -> Result<CgroupEventInfo, DecodeError> {
    let raw: CgroupEvent = read_record(bytes, "cgroup")?;
    let change = match raw.kind {
        kind::MKDIR => CgroupChange::Mkdir,
        kind::RMDIR => CgroupChange::Rmdir,
        kind::ATTACH_TASK => CgroupChange::AttachTask { pid: raw.pid },
        kind::RELEASE => CgroupChange::Release,
        other => return Err(DecodeError::Kind(other)),
    };
    let len = raw.path_len as usize;
    if len > PATH_LEN {
        return Err(DecodeError::PathLen(raw.path_len));
    }
    Ok(CgroupEventInfo {
        at: Duration::from_nanos(raw.timestamp_ns),
        change,
        cgroup_id: raw.cgroup_id,
        hierarchy: raw.hierarchy,
        level: raw.level,
        path: c_string(&raw.path[..len]),
        truncated: raw.flags & FLAG_TRUNCATED != 0,
    })
}

#[cfg(test)]
mod tests;
