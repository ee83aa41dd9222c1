//! Resolves [`KernelOffsets`] from the running kernel's BTF.
//!
//! Required: `vm_area_struct.vm_flags`, the context layouts of the cgroup tracepoints
//! (`trace_event_raw_cgroup`, `trace_event_raw_cgroup_migrate`), and the prototype of the
//! `page_fault_user` raw tracepoint (`btf_trace_page_fault_user`), whose argument positions the
//! fault program relies on. Optional: the `vm_file -> f_inode -> i_sb -> s_fs_info -> hstate -> order` chain that gives a
//! hugetlb VMA's page size; without it faults are reported with page size 0 (unknown). Optional
//! too: the VMA file's identity (`i_ino`, `s_dev`, the dentry's name) and the task's IPC
//! namespace of a SysV segment's file (`private_data->ns->ns.inum`), without which faults carry
//! no file (or a segment's file no namespace).

use hugepage_agent_common::offsets::KernelOffsets;

use super::btf::{Btf, BtfError, Shape};

/// `VM_HUGETLB` is bit 22 of `vm_flags` on every kernel since 2.6; newer kernels also name the bit
/// in an enum, which wins when present.
const VM_HUGETLB_BIT_FALLBACK: i64 = 22;

/// The raw tracepoint the fault program reads its arguments from, and the prototype it expects:
/// `(void *ctx, unsigned long address, struct pt_regs *regs, unsigned long error_code)`.
const PAGE_FAULT_TRACEPOINT: &str = "btf_trace_page_fault_user";
const PAGE_FAULT_ARGS: [Shape; 4] = [
    Shape::Pointer,
    Shape::Integer { bytes: 8 },
    Shape::Pointer,
    Shape::Integer { bytes: 8 },
];

/// The hugetlbfs raw tracepoints (kernels newer than 6.12) and the prototypes their programs
/// read arguments by (after the context pointer): `(inode, dir, int mode)`, `(inode)`,
/// `(inode, mode, offset, len, ret)`, `(inode, dentry, attr)`.
pub const HUGETLBFS_TRACEPOINTS: [(&str, &[Shape]); 4] = [
    (
        "hugetlbfs_alloc_inode",
        &[
            Shape::Pointer,
            Shape::Pointer,
            Shape::Pointer,
            Shape::Integer { bytes: 4 },
        ],
    ),
    ("hugetlbfs_evict_inode", &[Shape::Pointer, Shape::Pointer]),
    (
        "hugetlbfs_fallocate",
        &[
            Shape::Pointer,
            Shape::Pointer,
            Shape::Integer { bytes: 4 },
            Shape::Integer { bytes: 8 },
            Shape::Integer { bytes: 8 },
            Shape::Integer { bytes: 4 },
        ],
    ),
    (
        "hugetlbfs_setattr",
        &[
            Shape::Pointer,
            Shape::Pointer,
            Shape::Pointer,
            Shape::Pointer,
        ],
    ),
];

/// The offsets, and why the page size, a fault's file, its IPC namespace or the hugetlbfs
/// programs are unavailable when they are.
#[derive(Debug)]
pub struct Resolved {
    pub offsets: KernelOffsets,
    pub page_size_unavailable: Option<BtfError>,
    pub file_unavailable: Option<BtfError>,
    pub ipc_ns_unavailable: Option<BtfError>,
    /// The hugetlbfs programs need the file chain and the tracepoints' prototypes.
    pub hugetlbfs_unavailable: Option<BtfError>,
    /// The task iterators need the file chain, the fields of [`tasks_chain`] and the kernel's
    /// iterator targets (`task_vma`, 5.12 and newer; `task_file`, 5.8) with the contexts their
    /// programs read.
    pub tasks_unavailable: Option<BtfError>,
}

/// The task iterators' contexts (`kernel/bpf/task_iter.c`), which a kernel describes in its BTF
/// when it has the iterator, and where their programs read each member: (context, member,
/// offset). The programs read the task, the VMA, the descriptor and the file there.
pub const TASK_ITERATOR_CONTEXTS: [(&str, &str, u64); 5] = [
    ("bpf_iter__task_vma", "task", 8),
    ("bpf_iter__task_vma", "vma", 16),
    ("bpf_iter__task_file", "task", 8),
    ("bpf_iter__task_file", "fd", 16),
    ("bpf_iter__task_file", "file", 24),
];

/// Looks every field up in `btf`. `base_page_size` is the system page size in bytes.
pub fn resolve(btf: &Btf, base_page_size: u64) -> Result<Resolved, BtfError> {
    check_page_fault_args(btf)?;
    let hugetlb_bit = btf
        .enumerator("VMA_HUGETLB_BIT")
        .unwrap_or(VM_HUGETLB_BIT_FALLBACK);
    let mut offsets = KernelOffsets {
        vma_vm_flags: btf.member_offset("vm_area_struct", "vm_flags")?,
        vm_hugetlb: 1u64 << hugetlb_bit,
        base_page_shift: u64::from(base_page_size.trailing_zeros()),
        cgroup_root: btf.member_offset("trace_event_raw_cgroup", "root")?,
        cgroup_level: btf.member_offset("trace_event_raw_cgroup", "level")?,
        cgroup_id: btf.member_offset("trace_event_raw_cgroup", "id")?,
        cgroup_path: btf.member_offset("trace_event_raw_cgroup", "__data_loc_path")?,
        migrate_dst_root: btf.member_offset("trace_event_raw_cgroup_migrate", "dst_root")?,
        migrate_dst_level: btf.member_offset("trace_event_raw_cgroup_migrate", "dst_level")?,
        migrate_dst_id: btf.member_offset("trace_event_raw_cgroup_migrate", "dst_id")?,
        migrate_pid: btf.member_offset("trace_event_raw_cgroup_migrate", "pid")?,
        migrate_dst_path: btf
            .member_offset("trace_event_raw_cgroup_migrate", "__data_loc_dst_path")?,
        ..KernelOffsets::ZERO
    };
    let page_size_unavailable = match page_size_chain(btf) {
        Ok([vm_file, f_inode, i_sb, s_fs_info, hstate, order]) => {
            offsets.vma_vm_file = vm_file;
            offsets.file_f_inode = f_inode;
            offsets.inode_i_sb = i_sb;
            offsets.super_block_s_fs_info = s_fs_info;
            offsets.hugetlbfs_sb_info_hstate = hstate;
            offsets.hstate_order = order;
            offsets.page_size_known = 1;
            None
        }
        Err(err) => Some(err),
    };
    let file_unavailable = match file_chain(btf) {
        Ok([vm_file, f_inode, i_sb, i_ino, s_dev, dentry, name]) => {
            offsets.vma_vm_file = vm_file;
            offsets.file_f_inode = f_inode;
            offsets.inode_i_sb = i_sb;
            offsets.inode_i_ino = i_ino;
            offsets.super_block_s_dev = s_dev;
            offsets.file_dentry = dentry;
            offsets.dentry_name = name;
            offsets.file_known = 1;
            None
        }
        Err(err) => Some(err),
    };
    let ipc_ns_unavailable = match ipc_ns_chain(btf) {
        Ok([private_data, ns, inum]) => {
            offsets.file_private_data = private_data;
            offsets.shm_file_data_ns = ns;
            offsets.ipc_ns_inum = inum;
            offsets.ipc_ns_known = 1;
            None
        }
        Err(err) => Some(err),
    };
    let hugetlbfs_unavailable = file_unavailable
        .clone()
        .or_else(|| check_hugetlbfs_args(btf).err());
    let tasks = file_unavailable
        .clone()
        .map_or_else(|| tasks_chain(btf), Err);
    let tasks_unavailable = match tasks {
        Ok([vm_start, vm_end, tgid, i_blocks, i_nlink, s_magic]) => {
            offsets.vma_vm_start = vm_start;
            offsets.vma_vm_end = vm_end;
            offsets.task_tgid = tgid;
            offsets.inode_i_blocks = i_blocks;
            offsets.inode_i_nlink = i_nlink;
            offsets.super_block_s_magic = s_magic;
            offsets.tasks_known = 1;
            None
        }
        Err(err) => Some(err),
    };
    Ok(Resolved {
        offsets,
        page_size_unavailable,
        file_unavailable,
        ipc_ns_unavailable,
        hugetlbfs_unavailable,
        tasks_unavailable,
    })
}

/// Every hugetlbfs tracepoint with the prototype its program expects.
fn check_hugetlbfs_args(btf: &Btf) -> Result<(), BtfError> {
    for (tracepoint, expected) in HUGETLBFS_TRACEPOINTS {
        let name = format!("btf_trace_{tracepoint}");
        let found = btf.function_params(&name)?;
        if found != expected {
            return Err(BtfError::Prototype {
                name,
                found,
                expected: expected.to_vec(),
            });
        }
    }
    Ok(())
}

/// The fault program takes the address and error code from raw tracepoint arguments 0 and 2
/// (after the context pointer the kernel passes first); a kernel whose prototype differs is refused
/// rather than misread.
fn check_page_fault_args(btf: &Btf) -> Result<(), BtfError> {
    let found = btf.function_params(PAGE_FAULT_TRACEPOINT)?;
    if found != PAGE_FAULT_ARGS {
        return Err(BtfError::Prototype {
            name: PAGE_FAULT_TRACEPOINT.to_owned(),
            found,
            expected: PAGE_FAULT_ARGS.to_vec(),
        });
    }
    Ok(())
}

fn page_size_chain(btf: &Btf) -> Result<[u64; 6], BtfError> {
    Ok([
        btf.member_offset("vm_area_struct", "vm_file")?,
        btf.member_offset("file", "f_inode")?,
        btf.member_offset("inode", "i_sb")?,
        btf.member_offset("super_block", "s_fs_info")?,
        btf.member_offset("hugetlbfs_sb_info", "hstate")?,
        btf.member_offset("hstate", "order")?,
    ])
}

/// `vm_file`, `f_inode`, `i_sb`, `i_ino`, `s_dev`, `f_path.dentry` and `d_name.name`: a VMA's
/// file as the fault record names it, and the inode's identity the hugetlbfs programs read.
fn file_chain(btf: &Btf) -> Result<[u64; 7], BtfError> {
    Ok([
        btf.member_offset("vm_area_struct", "vm_file")?,
        btf.member_offset("file", "f_inode")?,
        btf.member_offset("inode", "i_sb")?,
        btf.member_offset("inode", "i_ino")?,
        btf.member_offset("super_block", "s_dev")?,
        btf.member_offset("file", "f_path")? + btf.member_offset("path", "dentry")?,
        btf.member_offset("dentry", "d_name")? + btf.member_offset("qstr", "name")?,
    ])
}

/// `vm_start`, `vm_end`, `task_struct.tgid`, `i_blocks`, `i_nlink` and `s_magic`: what the task
/// iterators read beyond the file chain, once the kernel has both iterators with the contexts
/// their programs expect.
fn tasks_chain(btf: &Btf) -> Result<[u64; 6], BtfError> {
    for (context, member, expected) in TASK_ITERATOR_CONTEXTS {
        let found = btf.member_offset(context, member)?;
        if found != expected {
            return Err(BtfError::Layout {
                ty: context.to_owned(),
                member: member.to_owned(),
                found,
                expected,
            });
        }
    }
    Ok([
        btf.member_offset("vm_area_struct", "vm_start")?,
        btf.member_offset("vm_area_struct", "vm_end")?,
        btf.member_offset("task_struct", "tgid")?,
        btf.member_offset("inode", "i_blocks")?,
        btf.member_offset("inode", "i_nlink")?,
        btf.member_offset("super_block", "s_magic")?,
    ])
}

/// `private_data`, `shm_file_data.ns` and `ns.inum`: the IPC namespace a SysV segment's shmid
/// belongs to, as the segment's attached file holds it (`ipc/shm.c`).
fn ipc_ns_chain(btf: &Btf) -> Result<[u64; 3], BtfError> {
    Ok([
        btf.member_offset("file", "private_data")?,
        btf.member_offset("shm_file_data", "ns")?,
        btf.member_offset("ipc_namespace", "ns")? + btf.member_offset("ns_common", "inum")?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::HostFs;

    #[test]
    fn resolves_every_offset_on_this_kernel() {
        let bytes = HostFs::new("/")
            .read_bytes("/sys/kernel/btf/vmlinux")
            .expect("this kernel has BTF");
        let btf = Btf::parse(&bytes).expect("parse vmlinux BTF");
        let resolved = resolve(&btf, 4096).expect("resolve");
        assert!(
            resolved.page_size_unavailable.is_none(),
            "{:?}",
            resolved.page_size_unavailable
        );
        let o = resolved.offsets;
        // Tracepoint contexts start with the 8-byte `struct trace_entry`.
        assert_eq!((o.cgroup_root, o.cgroup_level, o.cgroup_id), (8, 12, 16));
        assert_eq!(o.migrate_dst_root, 8);
        assert_eq!(o.vm_hugetlb, 0x0040_0000);
        assert_eq!(o.base_page_shift, 12);
        assert!(o.vma_vm_flags > 0 && o.vma_vm_flags.is_multiple_of(8));
        assert_ne!(o.vma_vm_flags, o.vma_vm_file);
        assert_eq!(resolved.file_unavailable, None);
        assert_eq!(
            resolved.hugetlbfs_unavailable, None,
            "this kernel (6.18) has the hugetlbfs tracepoints"
        );
        assert_eq!(resolved.ipc_ns_unavailable, None);
        assert_eq!(resolved.tasks_unavailable, None);
        assert_eq!((o.file_known, o.ipc_ns_known, o.tasks_known), (1, 1, 1));
        assert_eq!(o.vma_vm_end, o.vma_vm_start + 8);
        assert!(o.task_tgid > 0 && o.inode_i_blocks > o.inode_i_ino);
        assert!(o.inode_i_ino.is_multiple_of(8) && o.inode_i_ino > o.inode_i_sb);
        assert!(o.super_block_s_dev.is_multiple_of(4));
    }

    #[test]
    fn a_kernel_without_the_hugetlbfs_layout_still_resolves_without_page_sizes() {
        let bytes = HostFs::new("/")
            .read_bytes("/sys/kernel/btf/vmlinux")
            .expect("this kernel has BTF");
        let mut btf = Btf::parse(&bytes).expect("parse");
        btf.forget_struct("hugetlbfs_sb_info");
        let resolved = resolve(&btf, 4096).expect("resolve");
        assert_eq!(resolved.offsets.page_size_known, 0);
        assert_eq!(
            resolved.page_size_unavailable,
            Some(BtfError::NoSuchStruct("hugetlbfs_sb_info".into()))
        );
    }

    #[test]
    fn a_kernel_without_hugetlbfs_tracepoints_has_no_hugetlbfs_programs_but_faults_still_carry_files()
     {
        let bytes = HostFs::new("/")
            .read_bytes("/sys/kernel/btf/vmlinux")
            .expect("this kernel has BTF");
        let mut btf = Btf::parse(&bytes).expect("parse");
        btf.forget_typedef("btf_trace_hugetlbfs_fallocate");
        let resolved = resolve(&btf, 4096).expect("resolve");
        assert_eq!(
            resolved.hugetlbfs_unavailable,
            Some(BtfError::NoSuchFunctionType(
                "btf_trace_hugetlbfs_fallocate".into()
            ))
        );
        assert_eq!(resolved.offsets.file_known, 1);
    }

    #[test]
    fn a_kernel_without_the_dentry_layout_carries_no_files_and_attaches_no_hugetlbfs_programs() {
        let bytes = HostFs::new("/")
            .read_bytes("/sys/kernel/btf/vmlinux")
            .expect("this kernel has BTF");
        let mut btf = Btf::parse(&bytes).expect("parse");
        btf.forget_struct("qstr");
        let resolved = resolve(&btf, 4096).expect("resolve");
        assert_eq!(resolved.offsets.file_known, 0);
        let missing = Some(BtfError::NoSuchStruct("qstr".into()));
        assert_eq!(resolved.file_unavailable, missing);
        assert_eq!(resolved.hugetlbfs_unavailable, missing);
        assert_eq!(
            resolved.offsets.page_size_known, 1,
            "page sizes need no dentry"
        );
    }
}
