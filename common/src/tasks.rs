//! The task iterators (`iter/task_vma`, `iter/task_file`): one record per hugetlb mapping and per
//! descriptor open on a hugetlbfs file, of every process of the host, written into the
//! iterator's file for the agent's walk of the hugepages' holders. They read what `/proc/<pid>`
//! would tell (`maps`, `fd/`) without its ptrace access check: loading them takes `CAP_BPF` and
//! `CAP_PERFMON` alone.

/// Bytes of a file's name a record carries (its dentry's name, NUL-padded, cut if longer).
pub const NAME_BYTES: usize = 48;

/// What a [`Held`] record is (its `kind`).
pub mod kind {
    /// A hugetlb mapping (`VM_HUGETLB`) of the process: `start` and `end` are its addresses.
    pub const MAPPING: u32 = 1;
    /// A descriptor the process holds open on a hugetlbfs file: `fd` is its number.
    pub const DESCRIPTOR: u32 = 2;
}

/// Bits of [`Held::flags`].
pub mod flags {
    /// The mapping is shared (`VM_MAYSHARE`): its pages are the file's.
    pub const SHARED: u32 = 1;
    /// The file is a SysV segment's (its name starts `SYSV` and its `shm_file_data` names the
    /// segment's IPC namespace, in [`super::Held::ipc_ns`]): `ino` is the shmid.
    pub const SYSV: u32 = 2;
    /// The file has no link left (`i_nlink` 0): unlinked, or one of the kernel's own (a memfd,
    /// a segment, an anonymous mapping's), which `/proc` shows as `(deleted)`.
    pub const UNLINKED: u32 = 4;
}

/// One mapping or descriptor, as a task iterator saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// One of [`kind`].
    pub kind: u32,
    /// The process (thread group) id.
    pub tgid: u32,
    /// [`kind::DESCRIPTOR`]: the descriptor's number; else 0.
    pub fd: u32,
    /// The device of the file's superblock (`major << 20 | minor`).
    pub dev: u32,
    /// Bits of [`flags`].
    pub flags: u32,
    /// [`flags::SYSV`]: the segment's IPC namespace (its inode number); else 0.
    pub ipc_ns: u32,
    /// The file's inode number (a segment's: its shmid).
    pub ino: u64,
    /// [`kind::MAPPING`]: its start and end addresses; else 0.
    pub start: u64,
    pub end: u64,
    /// The page size of the file's hugetlbfs superblock; 0 when unknown.
    pub page_size: u64,
    /// Bytes of hugepages the file holds (`i_blocks` × 512, which hugetlbfs counts per page in
    /// the file's page cache; a private mapping's own pages are not the file's).
    pub held_bytes: u64,
    /// The file's name (its dentry's), NUL-padded.
    pub name: [u8; NAME_BYTES],
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for Held {}
