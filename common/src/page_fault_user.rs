//! The `exceptions/page_fault_user` program: its hugetlb-fault record and its filter maps.

/// Ring buffer of [`HugetlbFault`] records.
pub const EVENTS_MAP: &str = "HUGETLB_FAULTS";
/// Hash map `cgroup v2 id -> WATCHED`: the cgroups whose faults are inspected.
pub const WATCHED_CGROUPS_MAP: &str = "WATCHED_CGROUPS";
/// Array of one `u32` of [`settings`] flags.
pub const SETTINGS_MAP: &str = "FAULT_SETTINGS";
/// Capacity of [`WATCHED_CGROUPS_MAP`].
pub const WATCHED_CGROUPS_MAX: u32 = 16_384;
/// Value stored for a watched cgroup.
pub const WATCHED: u8 = 1;
/// Size of the ring buffer in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Bits of the single [`SETTINGS_MAP`] value.
pub mod settings {
    /// Inspect the faults of every process, not only those of watched cgroups.
    pub const WATCH_ALL: u32 = 1;
}

/// One fault in a hugetlb VMA, as the kernel program saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugetlbFault {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the faulting task (the inode number of its cgroup directory).
    pub cgroup_id: u64,
    /// Faulting user address.
    pub address: u64,
    /// Huge page size of the VMA in bytes; 0 when the kernel's BTF did not describe it.
    pub page_size: u64,
    /// x86 page-fault error code (bit 1: write).
    pub error_code: u64,
    pub tgid: u32,
    pub pid: u32,
    pub cpu: u32,
    /// NUMA node of `cpu`.
    pub numa_node: u32,
    /// Task name, NUL-padded.
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for HugetlbFault {}
