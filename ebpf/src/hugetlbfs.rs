//! `raw_tracepoint/hugetlbfs_*` (kernels newer than 6.12): a hugetlbfs inode made
//! (`hugetlbfs_alloc_inode`), evicted with its pages (`hugetlbfs_evict_inode`), given pages
//! without any fault (`hugetlbfs_fallocate`), or truncated (`hugetlbfs_setattr`). Each writes one
//! record to `HUGETLBFS_EVENTS`; the agent keeps from them the book of files between its walks
//! (who made a file, what it fallocated, when it went). Every such inode is reported: they are
//! rare next to faults, and a file is made once.
//!
//! Prototypes (`include/trace/events/hugetlbfs.h`): `alloc_inode(struct inode *inode, struct
//! inode *dir, umode_t mode)`, `evict_inode(struct inode *inode)`, `fallocate(struct inode *inode,
//! int mode, loff_t offset, loff_t len, int ret)`, `setattr(struct inode *inode, struct dentry
//! *dentry, struct iattr *attr)`. The agent checks them in BTF before it attaches any.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{map, raw_tracepoint},
    maps::RingBuf,
    programs::RawTracePointContext,
};
use hugepage_agent_common::{
    counters::Counter,
    hugetlbfs::{EVENTS_BYTES, HugetlbfsEvent, kind},
};

use crate::{
    page_fault_user::follow,
    shared::{count, offset},
};

#[map(name = "HUGETLBFS_EVENTS")]
static HUGETLBFS_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

const ARG_INODE: usize = 0;
const ARG_ALLOC_DIR: usize = 1;
const ARG_ALLOC_MODE: usize = 2;
const ARG_FALLOCATE_MODE: usize = 1;
const ARG_FALLOCATE_OFFSET: usize = 2;
const ARG_FALLOCATE_LEN: usize = 3;
const ARG_FALLOCATE_RET: usize = 4;

#[raw_tracepoint(tracepoint = "hugetlbfs_alloc_inode")]
pub fn hugetlbfs_alloc_inode(ctx: RawTracePointContext) -> i32 {
    // No directory: an inode of the kernel's own mounts (`hugetlb_file_setup`: a SysV segment,
    // a memfd, an anonymous `MAP_HUGETLB` mapping), made afresh for every such mapping and, for a
    // segment, renumbered to its shmid after this. Only files of mounts are booked as made.
    let dir: *const u8 = ctx.arg(ARG_ALLOC_DIR);
    if dir.is_null() {
        return 0;
    }
    let mode: u64 = ctx.arg(ARG_ALLOC_MODE);
    write(
        kind::ALLOC_INODE,
        ctx.arg(ARG_INODE),
        [0, 0],
        mode as u32,
        0,
    );
    0
}

#[raw_tracepoint(tracepoint = "hugetlbfs_evict_inode")]
pub fn hugetlbfs_evict_inode(ctx: RawTracePointContext) -> i32 {
    write(kind::EVICT_INODE, ctx.arg(ARG_INODE), [0, 0], 0, 0);
    0
}

#[raw_tracepoint(tracepoint = "hugetlbfs_fallocate")]
pub fn hugetlbfs_fallocate(ctx: RawTracePointContext) -> i32 {
    let mode: u64 = ctx.arg(ARG_FALLOCATE_MODE);
    let offset: i64 = ctx.arg(ARG_FALLOCATE_OFFSET);
    let len: i64 = ctx.arg(ARG_FALLOCATE_LEN);
    let ret: u64 = ctx.arg(ARG_FALLOCATE_RET);
    write(
        kind::FALLOCATE,
        ctx.arg(ARG_INODE),
        [offset, len],
        mode as u32,
        ret as i32,
    );
    0
}

#[raw_tracepoint(tracepoint = "hugetlbfs_setattr")]
pub fn hugetlbfs_setattr(ctx: RawTracePointContext) -> i32 {
    write(kind::SETATTR, ctx.arg(ARG_INODE), [0, 0], 0, 0);
    0
}

/// Writes one record about `inode` (or counts it lost).
#[inline(always)]
fn write(kind: u32, inode: *const u8, [offset, len]: [i64; 2], mode: u32, ret: i32) {
    let Ok((dev, ino)) = identify(inode) else {
        return;
    };
    let Some(mut entry) = HUGETLBFS_EVENTS.reserve::<HugetlbfsEvent>(0) else {
        count(Counter::HugetlbfsEventsLost);
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    entry.write(HugetlbfsEvent {
        // SAFETY: helpers without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        // SAFETY: as above.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        ino,
        offset,
        len,
        dev,
        kind,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        mode,
        ret,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    });
    entry.submit(0);
    count(Counter::HugetlbfsEvents);
}

/// The inode's superblock device and number.
#[inline(always)]
fn identify(inode: *const u8) -> Result<(u32, u64), i32> {
    let sb = follow(inode, offset!(inode_i_sb))?;
    // SAFETY: probe reads tolerate any address.
    let ino =
        unsafe { bpf_probe_read_kernel(inode.add(offset!(inode_i_ino) as usize).cast::<u64>()) }?;
    // SAFETY: as above.
    let dev = unsafe {
        bpf_probe_read_kernel(sb.add(offset!(super_block_s_dev) as usize).cast::<u32>())
    }?;
    Ok((dev, ino))
}
