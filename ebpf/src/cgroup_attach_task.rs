//! `cgroup/cgroup_attach_task`: a task moved into a cgroup.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hugepage_agent_common::cgroup::kind;

use crate::cgroup_event::{Fields, emit};

#[tracepoint]
pub fn cgroup_attach_task(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::ATTACH_TASK, Fields::cgroup_migrate()) {
        Ok(ret) | Err(ret) => ret,
    }
}
