//! `cgroup/cgroup_rmdir`: a cgroup was removed.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use hugepage_agent_common::cgroup::kind;

use crate::cgroup_event::{Fields, emit};

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    match emit(&ctx, kind::RMDIR, Fields::cgroup()) {
        Ok(ret) | Err(ret) => ret,
    }
}
