//! Kernel-version-dependent layout that the agent reads from BTF and hands to the programs.
//!
//! The programs read [`KernelOffsets`] from a `.rodata` global that the loader overrides before
//! the object is loaded; the kernel freezes that map, so the verifier sees each field as a
//! constant and accepts `vma + offset` loads. All values are byte offsets unless named otherwise.

/// Symbol name of the global in the kernel object.
pub const GLOBAL: &str = "KERNEL_OFFSETS";

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `vm_area_struct.vm_flags`.
    pub vma_vm_flags: u64,
    /// The `VM_HUGETLB` bit of `vm_flags`.
    pub vm_hugetlb: u64,
    /// `vm_area_struct.vm_file`.
    pub vma_vm_file: u64,
    /// `file.f_inode`.
    pub file_f_inode: u64,
    /// `inode.i_sb`.
    pub inode_i_sb: u64,
    /// `super_block.s_fs_info`.
    pub super_block_s_fs_info: u64,
    /// `hugetlbfs_sb_info.hstate`.
    pub hugetlbfs_sb_info_hstate: u64,
    /// `hstate.order`.
    pub hstate_order: u64,
    /// 1 when the page-size chain above is known; 0 makes the program report page size 0.
    pub page_size_known: u64,
    /// log2 of the base page size (12 on x86-64).
    pub base_page_shift: u64,
    /// `inode.i_ino`.
    pub inode_i_ino: u64,
    /// `super_block.s_dev`.
    pub super_block_s_dev: u64,
    /// `file.f_path` plus `path.dentry`: where a file's dentry pointer sits.
    pub file_dentry: u64,
    /// `dentry.d_name` plus `qstr.name`: where a dentry's name pointer sits.
    pub dentry_name: u64,
    /// 1 when the file chain above (with `vma_vm_file`, `file_f_inode`, `inode_i_sb`) is known;
    /// 0 makes the programs report no file.
    pub file_known: u64,
    /// `file.private_data`: a SysV segment's attached file's `struct shm_file_data`.
    pub file_private_data: u64,
    /// `shm_file_data.ns`: the segment's IPC namespace.
    pub shm_file_data_ns: u64,
    /// `ipc_namespace.ns` plus `ns_common.inum`: the namespace's inode number.
    pub ipc_ns_inum: u64,
    /// 1 when the IPC namespace chain above is known.
    pub ipc_ns_known: u64,
    /// `vm_area_struct.vm_start` and `vm_end`.
    pub vma_vm_start: u64,
    pub vma_vm_end: u64,
    /// `task_struct.tgid`.
    pub task_tgid: u64,
    /// `inode.i_blocks`.
    pub inode_i_blocks: u64,
    /// `inode.i_nlink`.
    pub inode_i_nlink: u64,
    /// `super_block.s_magic`.
    pub super_block_s_magic: u64,
    /// 1 when the task iterators' fields above (with the file chain) are known.
    pub tasks_known: u64,
    /// `trace_event_raw_cgroup.root`.
    pub cgroup_root: u64,
    /// `trace_event_raw_cgroup.level`.
    pub cgroup_level: u64,
    /// `trace_event_raw_cgroup.id`.
    pub cgroup_id: u64,
    /// `trace_event_raw_cgroup.__data_loc_path`.
    pub cgroup_path: u64,
    /// `trace_event_raw_cgroup_migrate.dst_root`.
    pub migrate_dst_root: u64,
    /// `trace_event_raw_cgroup_migrate.dst_level`.
    pub migrate_dst_level: u64,
    /// `trace_event_raw_cgroup_migrate.dst_id`.
    pub migrate_dst_id: u64,
    /// `trace_event_raw_cgroup_migrate.pid`.
    pub migrate_pid: u64,
    /// `trace_event_raw_cgroup_migrate.__data_loc_dst_path`.
    pub migrate_dst_path: u64,
}

impl KernelOffsets {
    /// All zero: the value compiled into the object before the loader overrides it.
    pub const ZERO: KernelOffsets = KernelOffsets {
        vma_vm_flags: 0,
        vm_hugetlb: 0,
        vma_vm_file: 0,
        file_f_inode: 0,
        inode_i_sb: 0,
        super_block_s_fs_info: 0,
        hugetlbfs_sb_info_hstate: 0,
        hstate_order: 0,
        page_size_known: 0,
        base_page_shift: 0,
        inode_i_ino: 0,
        super_block_s_dev: 0,
        file_dentry: 0,
        dentry_name: 0,
        file_known: 0,
        file_private_data: 0,
        shm_file_data_ns: 0,
        ipc_ns_inum: 0,
        ipc_ns_known: 0,
        vma_vm_start: 0,
        vma_vm_end: 0,
        task_tgid: 0,
        inode_i_blocks: 0,
        inode_i_nlink: 0,
        super_block_s_magic: 0,
        tasks_known: 0,
        cgroup_root: 0,
        cgroup_level: 0,
        cgroup_id: 0,
        cgroup_path: 0,
        migrate_dst_root: 0,
        migrate_dst_level: 0,
        migrate_dst_id: 0,
        migrate_pid: 0,
        migrate_dst_path: 0,
    };
}

#[cfg(feature = "user")]
unsafe impl aya::Pod for KernelOffsets {}
