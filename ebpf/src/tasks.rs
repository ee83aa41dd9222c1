//! `iter/task_vma` and `iter/task_file`: the task iterators of the walk of the hugepages'
//! holders. The kernel calls the first for every VMA of every process (its mmap lock held) and
//! the second for every descriptor; each writes a [`Held`] record into the iterator's file for
//! a hugetlb VMA (`VM_HUGETLB`) and for a descriptor on a hugetlbfs file (its superblock's
//! `s_magic`), and nothing for the rest. The agent reads the file to its end at each walk.
//!
//! This is what `/proc/<pid>/maps` and `/proc/<pid>/fd/` tell, without their ptrace access
//! check: a program of this type loads with `CAP_BPF` and `CAP_PERFMON`. Every kernel read is a
//! probe read at an offset the agent took from BTF ([`crate::shared::offset`]); a read that
//! fails leaves its field 0, and a file whose chain cannot be read gives no record.

use aya_ebpf::{
    cty::c_void,
    helpers::{bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes, generated::bpf_seq_write},
};
use hugepage_agent_common::tasks::{Held, NAME_BYTES, flags, kind};

use crate::{
    page_fault_user::{SYSV_NAME, VM_MAYSHARE, file_page_size, follow, segment_namespace},
    shared::offset,
};

/// `HUGETLBFS_MAGIC` (`include/uapi/linux/magic.h`).
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// `struct bpf_iter__task_vma { meta; task; vma; }`, each member eight bytes.
const VMA_CTX_TASK: usize = 1;
const VMA_CTX_VMA: usize = 2;
/// `struct bpf_iter__task_file { meta; task; u32 fd __aligned(8); file; }`.
const FILE_CTX_TASK: usize = 1;
const FILE_CTX_FD: usize = 2;
const FILE_CTX_FILE: usize = 3;

/// Every hugetlb VMA of every process.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_vma")]
pub extern "C" fn holders_vma(ctx: *mut c_void) -> i32 {
    if offset!(tasks_known) == 0 {
        return 0;
    }
    let ctx = ctx.cast::<*const u8>();
    // SAFETY: the iterator's context, three pointers (the task and the VMA NULL at the end).
    let (task, vma) = unsafe {
        (
            core::ptr::read_volatile(ctx.add(VMA_CTX_TASK)),
            core::ptr::read_volatile(ctx.add(VMA_CTX_VMA)),
        )
    };
    if task.is_null() || vma.is_null() {
        return 0;
    }
    // SAFETY: probe reads tolerate any address.
    let read =
        |offset: u64| unsafe { bpf_probe_read_kernel(vma.add(offset as usize).cast::<u64>()) };
    let vm_flags = read(offset!(vma_vm_flags)).unwrap_or(0);
    if vm_flags & offset!(vm_hugetlb) == 0 {
        return 0;
    }
    let Ok(file) = follow(vma, offset!(vma_vm_file)) else {
        return 0;
    };
    let shared = if vm_flags & VM_MAYSHARE != 0 {
        flags::SHARED
    } else {
        0
    };
    if let Some(mut held) = describe(file, task) {
        held.kind = kind::MAPPING;
        held.flags |= shared;
        held.start = read(offset!(vma_vm_start)).unwrap_or(0);
        held.end = read(offset!(vma_vm_end)).unwrap_or(0);
        write(ctx, &held);
    }
    0
}

/// Every descriptor of every process open on a hugetlbfs file.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_file")]
pub extern "C" fn holders_files(ctx: *mut c_void) -> i32 {
    if offset!(tasks_known) == 0 {
        return 0;
    }
    let slots = ctx.cast::<*const u8>();
    // SAFETY: the iterator's context: pointers, the descriptor's number in the third slot.
    let (task, fd, file) = unsafe {
        (
            core::ptr::read_volatile(slots.add(FILE_CTX_TASK)),
            core::ptr::read_volatile(slots.add(FILE_CTX_FD).cast::<u32>()),
            core::ptr::read_volatile(slots.add(FILE_CTX_FILE)),
        )
    };
    if task.is_null() || file.is_null() || !on_hugetlbfs(file) {
        return 0;
    }
    if let Some(mut held) = describe(file, task) {
        held.kind = kind::DESCRIPTOR;
        held.fd = fd;
        write(slots, &held);
    }
    0
}

/// Whether the file's superblock is hugetlbfs's.
#[inline(always)]
fn on_hugetlbfs(file: *const u8) -> bool {
    let magic = (|| -> Result<u64, i32> {
        let inode = follow(file, offset!(file_f_inode))?;
        let sb = follow(inode, offset!(inode_i_sb))?;
        // SAFETY: probe reads tolerate any address.
        unsafe {
            bpf_probe_read_kernel(sb.add(offset!(super_block_s_magic) as usize).cast::<u64>())
        }
    })();
    magic == Ok(HUGETLBFS_MAGIC)
}

/// The record of a hugetlbfs `file` of `task`, its kind and place left to the caller.
#[inline(always)]
fn describe(file: *const u8, task: *const u8) -> Option<Held> {
    let inode = follow(file, offset!(file_f_inode)).ok()?;
    let sb = follow(inode, offset!(inode_i_sb)).ok()?;
    // SAFETY: probe reads tolerate any address.
    let at = |base: *const u8, offset: u64| unsafe { base.add(offset as usize) };
    // SAFETY: as above, for each read below.
    let tgid = unsafe { bpf_probe_read_kernel(at(task, offset!(task_tgid)).cast::<u32>()) }.ok()?;
    // SAFETY: as above.
    let ino =
        unsafe { bpf_probe_read_kernel(at(inode, offset!(inode_i_ino)).cast::<u64>()) }.ok()?;
    // SAFETY: as above.
    let dev =
        unsafe { bpf_probe_read_kernel(at(sb, offset!(super_block_s_dev)).cast::<u32>()) }.ok()?;
    // SAFETY: as above.
    let blocks = unsafe { bpf_probe_read_kernel(at(inode, offset!(inode_i_blocks)).cast::<u64>()) }
        .unwrap_or(0);
    // SAFETY: as above.
    let nlink = unsafe { bpf_probe_read_kernel(at(inode, offset!(inode_i_nlink)).cast::<u32>()) }
        .unwrap_or(1);
    let mut held = Held {
        kind: 0,
        tgid,
        fd: 0,
        dev,
        flags: if nlink == 0 { flags::UNLINKED } else { 0 },
        ipc_ns: 0,
        ino,
        start: 0,
        end: 0,
        page_size: file_page_size(file),
        held_bytes: blocks.saturating_mul(512),
        name: [0; NAME_BYTES],
    };
    if let Ok(name) = follow(
        follow(file, offset!(file_dentry)).ok()?,
        offset!(dentry_name),
    ) {
        // SAFETY: as above; a name longer than the buffer is cut.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut held.name) };
        if held.name[..4] == SYSV_NAME.to_le_bytes()
            && let Some(ns) = segment_namespace(file)
        {
            held.flags |= flags::SYSV;
            held.ipc_ns = ns;
        }
    }
    Some(held)
}

/// Writes `held` into the iterator's file (`ctx->meta->seq`).
#[inline(always)]
fn write(ctx: *const *const u8, held: &Held) {
    // SAFETY: the context's first member is the iterator's meta, whose first is its seq_file.
    let seq =
        unsafe { core::ptr::read_volatile(core::ptr::read_volatile(ctx).cast::<*mut c_void>()) };
    // SAFETY: `held` is a whole record on this program's stack. A full buffer makes the kernel
    // call again for the same object, so nothing is lost.
    unsafe {
        bpf_seq_write(
            seq.cast(),
            (held as *const Held).cast::<c_void>(),
            core::mem::size_of::<Held>() as u32,
        )
    };
}
