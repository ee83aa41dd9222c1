//! The kernel side of hugepage-agent: tracepoint, fentry and fexit programs built for
//! `bpfel-unknown-none`.
//!
//! One program per attach point: `page_fault_user` reports faults in hugetlb VMAs of watched
//! cgroups; `hugetlb_fault` (fentry) the same where that tracepoint cannot (PREEMPT_RT);
//! `hugetlb_fault_done` (fexit) each such fault done, wherever the kernel runs fexit programs;
//! `cgroup_mkdir`, `cgroup_rmdir`, `cgroup_attach_task` and `cgroup_release` report the cgroup
//! lifecycle for the pod inventory; the `hugetlbfs_*` programs (kernels newer than 6.12) report
//! hugetlbfs inodes made, evicted, fallocated and truncated, for the book of the pages' holders;
//! `holders_vma` and `holders_files` (task iterators) tell every process's hugetlb mappings and
//! hugetlbfs descriptors to the walk of the holders. Records go to ring buffers (the iterators'
//! to their files); every program counts what it
//! saw, skipped and lost in a per-CPU counter map. Layout that differs between kernels comes from
//! [`shared::offsets`], filled in by the agent from BTF. On the host this crate only type-checks.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod cgroup_attach_task;
mod cgroup_event;
mod cgroup_mkdir;
mod cgroup_release;
mod cgroup_rmdir;
mod hugetlb_fault;
mod hugetlbfs;
mod page_fault_user;
mod shared;
mod tasks;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program from which a panic could be reached.
    unsafe { core::hint::unreachable_unchecked() }
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

/// `bpf_find_vma` and `bpf_get_current_task_btf` are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
