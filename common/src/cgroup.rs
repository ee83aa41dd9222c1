//! The four `cgroup/*` programs: one record type for mkdir, rmdir, attach_task and release.

/// Ring buffer of [`CgroupEvent`] records.
pub const EVENTS_MAP: &str = "CGROUP_EVENTS";
/// Size of the ring buffer in bytes.
pub const EVENTS_BYTES: u32 = 512 * 1024;
/// Bytes of path carried per event; longer paths are cut and flagged [`FLAG_TRUNCATED`].
pub const PATH_LEN: usize = 512;
/// `flags` bit: the path did not fit in [`PATH_LEN`] bytes.
pub const FLAG_TRUNCATED: u32 = 1;

/// Which tracepoint produced a [`CgroupEvent`] (the `kind` field).
pub mod kind {
    pub const MKDIR: u32 = 1;
    pub const RMDIR: u32 = 2;
    pub const ATTACH_TASK: u32 = 3;
    pub const RELEASE: u32 = 4;
}

/// A cgroup was created, removed, released, or a task moved into it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    /// The cgroup's id (the inode number of its directory) in its hierarchy.
    pub cgroup_id: u64,
    /// One of [`kind`].
    pub kind: u32,
    /// Hierarchy id (`root` in the tracepoint; 0 is the cgroup v2 hierarchy).
    pub hierarchy: i32,
    /// Depth below the hierarchy's root (the root is level 0).
    pub level: i32,
    /// The task moved, for [`kind::ATTACH_TASK`]; 0 otherwise.
    pub pid: u32,
    /// Bytes of `path` before its NUL.
    pub path_len: u32,
    /// Bits such as [`FLAG_TRUNCATED`].
    pub flags: u32,
    /// Path relative to the hierarchy's mount point, NUL-terminated.
    pub path: [u8; PATH_LEN],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for CgroupEvent {}
