//! `exceptions/page_fault_user`: report user faults that land in hugetlb VMAs.
//!
//! Cheap for ordinary faults: unless watch-all is set, a fault whose cgroup is not in
//! `WATCHED_CGROUPS` costs one array and one hash lookup and stops there. Only watched faults pay
//! for `bpf_find_vma`, which may give up with -EBUSY when the mmap lock is held; that is counted,
//! never guessed. The page size comes from the VMA's hugetlbfs superblock (`hstate.order`).
//!
//! The filter, the ring buffer, the page size and the record are shared with the fentry program
//! on `hugetlb_fault` ([`crate::hugetlb_fault`]), which PREEMPT_RT kernels need: there
//! `bpf_find_vma` always gives up in this tracepoint.

use aya_ebpf::{
    cty::{c_long, c_void},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_numa_node_id, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{bpf_find_vma, bpf_get_current_task_btf},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use hugepage_agent_common::{
    counters::Counter,
    page_fault_user::{
        CgroupVerdict, EVENTS_BYTES, FaultSettings, HugetlbFault, WATCHED_CGROUPS_MAX, file, phase,
        settings,
    },
};

use crate::shared::{count, offset};

const EBUSY: c_long = 16;

#[map(name = "HUGETLB_FAULTS")]
pub(crate) static HUGETLB_FAULTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

#[map(name = "WATCHED_CGROUPS")]
static WATCHED_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(WATCHED_CGROUPS_MAX, 0);

#[map(name = "FAULT_SETTINGS")]
static FAULT_SETTINGS: Array<FaultSettings> = Array::with_max_entries(1, 0);

#[map(name = "WATCH_VERDICT_CACHE")]
static WATCH_VERDICT_CACHE: PerCpuArray<CgroupVerdict> = PerCpuArray::with_max_entries(1, 0);

/// What the `bpf_find_vma` callback learned about the VMA.
#[repr(C)]
struct VmaInfo {
    hugetlb: u64,
    page_size: u64,
    file: VmaFile,
}

/// The file behind a hugetlb VMA, as the fault record carries it.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct VmaFile {
    pub ino: u64,
    pub dev: u32,
    /// Bits of `page_fault_user::file`.
    pub flags: u32,
    /// A SysV segment's IPC namespace (its inode number); else 0.
    pub ipc_ns: u32,
}

impl VmaFile {
    pub(crate) const UNKNOWN: VmaFile = VmaFile {
        ino: 0,
        dev: 0,
        flags: 0,
        ipc_ns: 0,
    };
}

/// `VM_MAYSHARE` (`include/linux/mm.h`), the same bit on every kernel: a `MAP_SHARED` mapping,
/// even a read-only one (which has no `VM_SHARED`). hugetlb puts such a mapping's pages in the
/// file's page cache (`hugetlb_no_page`), a private mapping's in the process alone.
pub(crate) const VM_MAYSHARE: u64 = 0x80;
/// The first bytes of a SysV segment's file name (`ipc/shm.c`: `SYSV%08x`).
pub(crate) const SYSV_NAME: u32 = u32::from_le_bytes(*b"SYSV");

/// `TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code)`.
const ARG_ADDRESS: usize = 0;
const ARG_ERROR_CODE: usize = 2;

#[raw_tracepoint(tracepoint = "page_fault_user")]
pub fn page_fault_user(ctx: RawTracePointContext) -> i32 {
    match try_page_fault_user(&ctx) {
        Ok(ret) | Err(ret) => ret,
    }
}

fn try_page_fault_user(ctx: &RawTracePointContext) -> Result<i32, i32> {
    let Some(cgroup_id) = inspected() else {
        return Ok(0);
    };
    let address: u64 = ctx.arg(ARG_ADDRESS);
    let mut vma = VmaInfo {
        hugetlb: 0,
        page_size: 0,
        file: VmaFile::UNKNOWN,
    };
    // SAFETY: the task pointer is trusted BTF; the callback only reads the VMA it is given.
    let ret = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf(),
            address,
            inspect_vma as *mut c_void,
            (&raw mut vma).cast(),
            0,
        )
    };
    if ret == -EBUSY {
        count(Counter::FindVmaBusy);
        return Ok(0);
    }
    if ret != 0 {
        count(Counter::FindVmaFailed);
        return Ok(0);
    }
    if vma.hugetlb == 0 {
        count(Counter::FaultsNotHugetlb);
        return Ok(0);
    }
    let error_code: u64 = ctx.arg(ARG_ERROR_CODE);
    report(
        cgroup_id,
        address,
        vma.page_size,
        vma.file,
        error_code,
        None,
    );
    Ok(0)
}

/// Writes one hugetlb fault of the current task to the ring buffer (or counts it lost): as it
/// starts, or `done` with the handler's `vm_fault_t`.
#[inline(always)]
pub(crate) fn report(
    cgroup_id: u64,
    address: u64,
    page_size: u64,
    file: VmaFile,
    error_code: u64,
    done: Option<u32>,
) {
    let Some(mut entry) = HUGETLB_FAULTS.reserve::<HugetlbFault>(0) else {
        count(Counter::HugetlbFaultsLost);
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    entry.write(HugetlbFault {
        // SAFETY: helpers without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id,
        address,
        page_size,
        error_code,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        // SAFETY: helpers without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        // SAFETY: helper without preconditions.
        numa_node: unsafe { bpf_get_numa_node_id() } as u32,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        phase: if done.is_some() {
            phase::DONE
        } else {
            phase::STARTED
        },
        vm_fault: done.unwrap_or(0),
        file_ino: file.ino,
        file_dev: file.dev,
        file_flags: file.flags,
        ipc_ns: file.ipc_ns,
        _pad: 0,
    });
    entry.submit(0);
    count(Counter::HugetlbFaults);
}

/// The current task's cgroup when its faults are inspected: not paused, and watched.
#[inline(always)]
pub(crate) fn inspected() -> Option<u64> {
    let &settings = FAULT_SETTINGS.get(0)?;
    if settings.flags & settings::PAUSE != 0 {
        return None;
    }
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    watched(settings, cgroup_id).then_some(cgroup_id)
}

/// Whether the faults of `cgroup_id` are inspected; a fault that is not is counted as filtered.
/// The per-CPU verdict cache answers without a hash lookup while the cgroup and the watch map's
/// generation stay the same.
#[inline(always)]
fn watched(settings: FaultSettings, cgroup_id: u64) -> bool {
    if settings.flags & settings::WATCH_ALL != 0 {
        return true;
    }
    let Some(cache) = WATCH_VERDICT_CACHE.get_ptr_mut(0) else {
        let watched = lookup(cgroup_id);
        if !watched {
            count(Counter::FaultsFiltered);
        }
        return watched;
    };
    // SAFETY: this CPU's slot; the program runs with migration disabled and does not nest.
    let cache = unsafe { &mut *cache };
    if cache.cgroup_id != cgroup_id || cache.generation != settings.generation {
        cache.cgroup_id = cgroup_id;
        cache.generation = settings.generation;
        cache.watched = u32::from(lookup(cgroup_id));
    }
    if cache.watched == 0 {
        cache.filtered += 1;
        return false;
    }
    true
}

#[inline(always)]
fn lookup(cgroup_id: u64) -> bool {
    // SAFETY: the value is a plain u8 that is only read.
    unsafe { WATCHED_CGROUPS.get(cgroup_id) }.is_some()
}

/// `bpf_find_vma` callback: is the VMA hugetlb, and of which page size?
extern "C" fn inspect_vma(_task: *mut c_void, vma: *mut c_void, data: *mut c_void) -> c_long {
    let info = data.cast::<VmaInfo>();
    let vma = vma.cast::<u8>();
    // SAFETY: `vma` is a BTF pointer to the VMA; the offset of `vm_flags` comes from BTF and is a
    // verifier-known constant.
    let flags =
        unsafe { core::ptr::read_volatile(vma.add(offset!(vma_vm_flags) as usize).cast::<u64>()) };
    if flags & offset!(vm_hugetlb) == 0 {
        return 0;
    }
    // SAFETY: `data` points at the caller's `VmaInfo` on its stack.
    unsafe {
        (*info).hugetlb = 1;
        (*info).page_size = hugetlb_page_size(vma);
        (*info).file = vma_file(vma, flags);
    }
    0
}

/// The VMA's file: `vm_file->f_inode`'s `i_ino` and `i_sb->s_dev`, whether the VMA is shared
/// (`VM_MAYSHARE` in `vm_flags`, which the caller read), and for a SysV segment's attached file
/// (its dentry's name starts `SYSV` and its `private_data` is the `shm_file_data` that names
/// the segment's IPC namespace) that namespace. Unknown (no flags) when the kernel's BTF did
/// not describe the chain or a read failed.
#[inline(always)]
pub(crate) fn vma_file(vma: *const u8, vm_flags: u64) -> VmaFile {
    if offset!(file_known) == 0 {
        return VmaFile::UNKNOWN;
    }
    let read = || -> Result<VmaFile, i32> {
        let vm_file = follow(vma, offset!(vma_vm_file))?;
        let inode = follow(vm_file, offset!(file_f_inode))?;
        let sb = follow(inode, offset!(inode_i_sb))?;
        // SAFETY: probe reads tolerate any address.
        let ino = unsafe {
            bpf_probe_read_kernel(inode.add(offset!(inode_i_ino) as usize).cast::<u64>())
        }?;
        // SAFETY: as above.
        let dev = unsafe {
            bpf_probe_read_kernel(sb.add(offset!(super_block_s_dev) as usize).cast::<u32>())
        }?;
        let mut flags = file::KNOWN;
        if vm_flags & VM_MAYSHARE != 0 {
            flags |= file::SHARED;
        }
        let name = follow(follow(vm_file, offset!(file_dentry))?, offset!(dentry_name))?;
        let mut ipc_ns = 0;
        // SAFETY: as above.
        if unsafe { bpf_probe_read_kernel(name.cast::<u32>()) } == Ok(SYSV_NAME)
            && let Some(ns) = segment_namespace(vm_file)
        {
            flags |= file::SYSV;
            ipc_ns = ns;
        }
        Ok(VmaFile {
            ino,
            dev,
            flags,
            ipc_ns,
        })
    };
    read().unwrap_or(VmaFile::UNKNOWN)
}

/// The inode number of the IPC namespace of the segment whose attached file `vm_file` is
/// (`((struct shm_file_data *)vm_file->private_data)->ns->ns.inum`), when known.
#[inline(always)]
pub(crate) fn segment_namespace(vm_file: *const u8) -> Option<u32> {
    if offset!(ipc_ns_known) == 0 {
        return None;
    }
    let read = || -> Result<u32, i32> {
        let sfd = follow(vm_file, offset!(file_private_data))?;
        let ns = follow(sfd, offset!(shm_file_data_ns))?;
        // SAFETY: probe reads tolerate any address.
        unsafe { bpf_probe_read_kernel(ns.add(offset!(ipc_ns_inum) as usize).cast::<u32>()) }
    };
    read().ok().filter(|&inum| inum != 0)
}

/// `PAGE_SIZE << vma->vm_file->f_inode->i_sb->s_fs_info->hstate->order`, or 0 when unknown.
#[inline(always)]
pub(crate) fn hugetlb_page_size(vma: *const u8) -> u64 {
    if offset!(page_size_known) == 0 {
        return 0;
    }
    match follow(vma, offset!(vma_vm_file)) {
        Ok(file) => file_page_size(file),
        Err(_) => 0,
    }
}

/// The page size of a hugetlbfs file (`PAGE_SIZE << f_inode->i_sb->s_fs_info->hstate->order`),
/// or 0 when unknown. Only for a file known to be hugetlbfs's: another file system's `s_fs_info`
/// is something else.
#[inline(always)]
pub(crate) fn file_page_size(file: *const u8) -> u64 {
    if offset!(page_size_known) == 0 {
        return 0;
    }
    let order = (|| -> Result<u32, i32> {
        let inode = follow(file, offset!(file_f_inode))?;
        let sb = follow(inode, offset!(inode_i_sb))?;
        let sbinfo = follow(sb, offset!(super_block_s_fs_info))?;
        let hstate = follow(sbinfo, offset!(hugetlbfs_sb_info_hstate))?;
        // SAFETY: probe reads tolerate any address.
        unsafe { bpf_probe_read_kernel(hstate.add(offset!(hstate_order) as usize).cast::<u32>()) }
    })();
    match order {
        Ok(order) if order < 32 => 1u64 << (offset!(base_page_shift) + u64::from(order)),
        _ => 0,
    }
}

/// Reads the pointer stored at `base + offset`.
#[inline(always)]
pub(crate) fn follow(base: *const u8, offset: u64) -> Result<*const u8, i32> {
    // SAFETY: probe reads tolerate any address; a null result ends the chain.
    let next = unsafe { bpf_probe_read_kernel(base.add(offset as usize).cast::<*const u8>()) }?;
    if next.is_null() { Err(0) } else { Ok(next) }
}
