//! `fentry/hugetlb_fault` and `fexit/hugetlb_fault`: the same hugetlb fault records as
//! `exceptions/page_fault_user`, taken at the entry of the kernel's hugetlb fault handler, which is
//! handed the VMA, or as it returns.
//!
//! The fexit program's record is the fault done: the handler has taken its page from the pool
//! (`free_hugepages` is already lower) or failed, and says which (`vm_fault_t`, 0 when the page
//! is mapped). The agent reads the pools once on it, with no need to try again later; it attaches
//! it wherever the kernel runs fexit programs, and the tracepoint program elsewhere.
//!
//! The agent attaches it instead of the tracepoint program where that one cannot work: on
//! PREEMPT_RT kernels `bpf_find_vma` always gives up in the page-fault tracepoint (interrupts are
//! off there, and RT may not trylock the mmap lock then; `kernel/bpf/mmap_unlock_work.h`), so no
//! hugetlb fault would be seen. Here no lookup is needed, and only faults in hugetlb VMAs reach
//! the program, so an ordinary fault costs nothing. Faults the kernel takes on a task's behalf
//! (`get_user_pages`, `MAP_POPULATE`) are reported too, with the current task's cgroup. The fault
//! flags stand in for the x86 error code: `FAULT_FLAG_WRITE` becomes its write bit, the address is
//! the one the handler was given.
//!
//! `vm_fault_t hugetlb_fault(struct mm_struct *mm, struct vm_area_struct *vma,
//! unsigned long address, unsigned int flags)`, as in Linux 6.1 to 6.12 (`mm/hugetlb.c`).

use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};

use crate::{
    page_fault_user::{VmaFile, hugetlb_page_size, inspected, report, vma_file},
    shared::offset,
};

const ARG_VMA: usize = 1;
const ARG_ADDRESS: usize = 2;
const ARG_FLAGS: usize = 3;
/// An fexit program's context holds the return value after the arguments.
const ARG_RETURN: usize = 4;
/// `FAULT_FLAG_WRITE` (`include/linux/mm_types.h`).
const FAULT_FLAG_WRITE: u64 = 1;
/// `VM_FAULT_RETRY | VM_FAULT_COMPLETED` (`include/linux/mm_types.h`): the handler returned
/// without the mmap lock.
const VM_FAULT_LOCK_DROPPED: u64 = 0x400 | 0x4000;
/// The x86 page-fault error code's write bit (`X86_PF_WRITE`).
const X86_PF_WRITE: u64 = 2;

#[fentry(function = "hugetlb_fault")]
pub fn hugetlb_fault(ctx: FEntryContext) -> u32 {
    let Some(cgroup_id) = inspected() else {
        return 0;
    };
    let vma: *const u8 = ctx.arg(ARG_VMA);
    let address: u64 = ctx.arg(ARG_ADDRESS);
    let flags: u64 = ctx.arg(ARG_FLAGS);
    report(
        cgroup_id,
        address,
        hugetlb_page_size(vma),
        file_of(vma),
        error_code(flags),
        None,
    );
    0
}

#[fexit(function = "hugetlb_fault")]
pub fn hugetlb_fault_done(ctx: FExitContext) -> u32 {
    let Some(cgroup_id) = inspected() else {
        return 0;
    };
    let vma: *const u8 = ctx.arg(ARG_VMA);
    let address: u64 = ctx.arg(ARG_ADDRESS);
    let flags: u64 = ctx.arg(ARG_FLAGS);
    let vm_fault: u64 = ctx.arg(ARG_RETURN);
    // A handler that gave the mmap lock up may have seen the VMA freed and reused since: its
    // file is not read then (the retried fault reports it).
    let file = if vm_fault & VM_FAULT_LOCK_DROPPED == 0 {
        file_of(vma)
    } else {
        VmaFile::UNKNOWN
    };
    report(
        cgroup_id,
        address,
        hugetlb_page_size(vma),
        file,
        error_code(flags),
        Some(vm_fault as u32),
    );
    0
}

/// The VMA's file ([`vma_file`]), with its `vm_flags` read here.
#[inline(always)]
fn file_of(vma: *const u8) -> VmaFile {
    // SAFETY: `vma` is the handler's BTF pointer to the VMA; probe reads tolerate any address.
    let vm_flags = unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(
            vma.add(offset!(vma_vm_flags) as usize).cast::<u64>(),
        )
    }
    .unwrap_or(0);
    vma_file(vma, vm_flags)
}

/// The x86 page-fault error code the fault flags stand for: its write bit.
#[inline(always)]
fn error_code(flags: u64) -> u64 {
    if flags & FAULT_FLAG_WRITE != 0 {
        X86_PF_WRITE
    } else {
        0
    }
}
