//! `cgroup/cgroup_release`: a cgroup was released (its last task left).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hugepage_agent_common::cgroup::kind;

use crate::cgroup_event::{Fields, emit};

#[tracepoint]
pub fn cgroup_release(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::RELEASE, Fields::cgroup()) {
        Ok(ret) | Err(ret) => ret,
    }
}
