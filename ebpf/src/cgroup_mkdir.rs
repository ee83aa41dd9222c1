//! `cgroup/cgroup_mkdir`: a cgroup was created.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hugepage_agent_common::cgroup::kind;

use crate::cgroup_event::{Fields, emit};

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::MKDIR, Fields::cgroup()) {
        Ok(ret) | Err(ret) => ret,
    }
}
