//! The `hugetlbfs/*` programs (kernels newer than 6.12): one record type for an inode made,
//! evicted, fallocated or its attributes set (truncated).

/// Ring buffer of [`HugetlbfsEvent`] records.
pub const EVENTS_MAP: &str = "HUGETLBFS_EVENTS";
/// Size of the ring buffer in bytes.
pub const EVENTS_BYTES: u32 = 128 * 1024;

/// Which tracepoint produced a [`HugetlbfsEvent`] (the `kind` field).
pub mod kind {
    /// `hugetlbfs_alloc_inode`: a file or directory made in a mount (not the inodes of the
    /// kernel's own mounts, which have no directory).
    pub const ALLOC_INODE: u32 = 1;
    /// `hugetlbfs_evict_inode`: the inode goes, and its pages back to the pool.
    pub const EVICT_INODE: u32 = 2;
    /// `hugetlbfs_fallocate`: pages taken (or punched out) without any fault.
    pub const FALLOCATE: u32 = 3;
    /// `hugetlbfs_setattr`: attributes set, a truncation among them.
    pub const SETATTR: u32 = 4;
}

/// Something happened to a hugetlbfs inode.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugetlbfsEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the task that made it happen.
    pub cgroup_id: u64,
    /// The inode's number.
    pub ino: u64,
    /// [`kind::FALLOCATE`]: the range's start and length in bytes; else 0.
    pub offset: i64,
    pub len: i64,
    /// The device of the inode's superblock (`major << 20 | minor`).
    pub dev: u32,
    /// One of [`kind`].
    pub kind: u32,
    pub tgid: u32,
    pub pid: u32,
    /// [`kind::FALLOCATE`]: its `mode` (`FALLOC_FL_*`); [`kind::ALLOC_INODE`]: the inode's mode
    /// (`S_IFREG | 0644` …); else 0.
    pub mode: u32,
    /// [`kind::FALLOCATE`]: its result (0 or `-errno`); else 0.
    pub ret: i32,
    /// Task name, NUL-padded.
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for HugetlbfsEvent {}
