//! The ring buffer and record writer shared by the four `cgroup/*` programs.
//!
//! `cgroup_mkdir`, `cgroup_rmdir` and `cgroup_release` share the tracepoint class `cgroup`
//! (`root, level, id, path`); `cgroup_attach_task` is class `cgroup_migrate`
//! (`dst_root, dst_level, dst_id, pid, dst_path`). Each program passes the offsets of its class.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::map,
    maps::RingBuf,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use hugepage_agent_common::{
    cgroup::{CgroupEvent, EVENTS_BYTES, FLAG_TRUNCATED, PATH_LEN},
    counters::Counter,
};

use crate::shared::{count, offset};

#[map(name = "CGROUP_EVENTS")]
static CGROUP_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Where the fields of one tracepoint class sit in its context (from BTF).
pub struct Fields {
    pub root: u64,
    pub level: u64,
    pub id: u64,
    /// `__data_loc` word of the path: low 16 bits offset, high 16 bits length with NUL.
    pub path: u64,
    /// `pid` field, for `cgroup_migrate` only.
    pub pid: Option<u64>,
}

impl Fields {
    /// Class `cgroup`: `cgroup_mkdir`, `cgroup_rmdir`, `cgroup_release`.
    #[inline(always)]
    pub fn cgroup() -> Fields {
        Fields {
            root: offset!(cgroup_root),
            level: offset!(cgroup_level),
            id: offset!(cgroup_id),
            path: offset!(cgroup_path),
            pid: None,
        }
    }

    /// Class `cgroup_migrate`: `cgroup_attach_task`.
    #[inline(always)]
    pub fn cgroup_migrate() -> Fields {
        Fields {
            root: offset!(migrate_dst_root),
            level: offset!(migrate_dst_level),
            id: offset!(migrate_dst_id),
            path: offset!(migrate_dst_path),
            pid: Some(offset!(migrate_pid)),
        }
    }
}

/// Reads one record of `kind` from `ctx` and sends it.
#[inline(always)]
pub fn emit(ctx: &TracePointContext, kind: u32, fields: Fields) -> Result<u32, u32> {
    let Some(mut entry) = CGROUP_EVENTS.reserve::<CgroupEvent>(0) else {
        count(Counter::CgroupEventsLost);
        return Ok(0);
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` is a reserved, exclusively owned ring-buffer slot; every field is written
    // before submit. Context reads use offsets from the tracepoint's BTF layout.
    let filled = unsafe { fill(ctx, kind, &fields, event) };
    match filled {
        Ok(truncated) => {
            if truncated {
                // SAFETY: written just above.
                let id = unsafe { (*event).cgroup_id };
                warn!(
                    ctx,
                    "cgroup {} path longer than {} bytes; truncated", id, PATH_LEN
                );
            }
            entry.submit(0);
            count(Counter::CgroupEvents);
        }
        Err(_) => entry.discard(0),
    }
    Ok(0)
}

/// Fills `event`; returns whether the path was cut.
unsafe fn fill(
    ctx: &TracePointContext,
    kind: u32,
    fields: &Fields,
    event: *mut CgroupEvent,
) -> Result<bool, i32> {
    unsafe {
        (*event).timestamp_ns = bpf_ktime_get_ns();
        (*event).kind = kind;
        (*event).hierarchy = ctx.read_at::<i32>(fields.root as usize)?;
        (*event).level = ctx.read_at::<i32>(fields.level as usize)?;
        (*event).cgroup_id = ctx.read_at::<u64>(fields.id as usize)?;
        (*event).pid = match fields.pid {
            Some(off) => ctx.read_at::<i32>(off as usize)? as u32,
            None => 0,
        };
        let loc = ctx.read_at::<u32>(fields.path as usize)?;
        let start = (loc & 0xffff) as usize;
        let len_with_nul = (loc >> 16) as usize;
        let src = ctx.as_ptr().cast::<u8>().add(start);
        let copied = bpf_probe_read_kernel_str_bytes(src, &mut (*event).path)?.len();
        (*event).path_len = copied as u32;
        let truncated = len_with_nul > PATH_LEN;
        (*event).flags = if truncated { FLAG_TRUNCATED } else { 0 };
        Ok(truncated)
    }
}
