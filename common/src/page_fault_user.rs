//! The `exceptions/page_fault_user` program: its hugetlb-fault record and its filter maps.

/// Ring buffer of [`HugetlbFault`] records.
pub const EVENTS_MAP: &str = "HUGETLB_FAULTS";
/// Hash map `cgroup v2 id -> WATCHED`: the cgroups whose faults are inspected.
pub const WATCHED_CGROUPS_MAP: &str = "WATCHED_CGROUPS";
/// Array of one [`FaultSettings`].
pub const SETTINGS_MAP: &str = "FAULT_SETTINGS";
/// Per-CPU array of one [`CgroupVerdict`]: the last cgroup seen on this CPU and whether it is
/// watched, so that consecutive faults of one cgroup skip the hash lookup.
pub const VERDICT_CACHE_MAP: &str = "WATCH_VERDICT_CACHE";
/// Capacity of [`WATCHED_CGROUPS_MAP`].
pub const WATCHED_CGROUPS_MAX: u32 = 16_384;
/// Value stored for a watched cgroup.
pub const WATCHED: u8 = 1;
/// Size of the ring buffer in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Bits of [`FaultSettings::flags`].
pub mod settings {
    /// Inspect the faults of every process, not only those of watched cgroups.
    pub const WATCH_ALL: u32 = 1;
    /// Return at once, counting nothing: what remains is the kernel's cost of running any program
    /// on this tracepoint (the benchmark's floor).
    pub const PAUSE: u32 = 2;
}

/// The one value of [`SETTINGS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultSettings {
    /// Bits of [`settings`].
    pub flags: u32,
    /// Bumped by the agent after every change of [`WATCHED_CGROUPS_MAP`]; a cached verdict of an
    /// older generation is not trusted.
    pub generation: u32,
}

/// The one per-CPU value of [`VERDICT_CACHE_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupVerdict {
    pub cgroup_id: u64,
    pub generation: u32,
    /// 1 when the cgroup was in [`WATCHED_CGROUPS_MAP`].
    pub watched: u32,
    /// Faults this CPU skipped because their cgroup is not watched. Kept here, in the slot the
    /// filter reads anyway, so that a filtered fault costs no second map lookup.
    pub filtered: u64,
}

/// Values of [`HugetlbFault::phase`]: where in the fault the program ran.
pub mod phase {
    /// As the fault starts (the tracepoint, fentry): the page may not be taken from the pool yet.
    pub const STARTED: u32 = 0;
    /// As the kernel's hugetlb fault handler returns (fexit): the page is taken, unless
    /// [`super::HugetlbFault::vm_fault`] says the fault failed.
    pub const DONE: u32 = 1;
}

/// Bits of [`HugetlbFault::file_flags`].
pub mod file {
    /// The VMA's file was read: [`super::HugetlbFault::file_dev`] and `file_ino` name it.
    pub const KNOWN: u32 = 1;
    /// The VMA is shared (`VM_MAYSHARE`, `MAP_SHARED`): the page is the file's, in its page
    /// cache.
    pub const SHARED: u32 = 2;
    /// The file is a SysV segment's attached file (its name starts `SYSV`, and its
    /// `shm_file_data` names the segment's namespace): `file_ino` is the shmid, in the IPC
    /// namespace [`super::HugetlbFault::ipc_ns`].
    pub const SYSV: u32 = 4;
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
    /// A value of [`phase`].
    pub phase: u32,
    /// At [`phase::DONE`], the handler's `vm_fault_t` (0: the page is mapped); else 0.
    pub vm_fault: u32,
    /// The inode number of the VMA's file (a hugetlbfs file, a memfd, or a SysV segment's).
    pub file_ino: u64,
    /// The device of the file's superblock, as the kernel keeps it (`major << 20 | minor`).
    pub file_dev: u32,
    /// Bits of [`file`].
    pub file_flags: u32,
    /// With [`file::SYSV`], the inode number of the segment's IPC namespace; else 0.
    pub ipc_ns: u32,
    pub _pad: u32,
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for HugetlbFault {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for FaultSettings {}
#[cfg(feature = "user")]
unsafe impl aya::Pod for CgroupVerdict {}
