//! The map's flags: how often sysfs and the cgroup tree are re-read in full
//! (`--reconcile-interval`), between the faults that prompt a read of their own; and the
//! real-time priority of the map's thread, if any (`--map-thread-priority`).

use std::time::Duration;

use clap::Args;

use crate::flags::{FlagError, above_zero, duration};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Hugepage map")]
pub struct MapArgs {
    /// How often sysfs and the cgroup tree are re-read in full (e.g. 10s, 500ms, 1m).
    #[arg(long, env = "HUGEPAGE_AGENT_RECONCILE_INTERVAL", default_value = "10s")]
    pub reconcile_interval: String,
    /// Run the map's thread (the probes' events, the re-reads of sysfs they prompt) under
    /// SCHED_FIFO at this real-time priority, 1 to 99 (needs CAP_SYS_NICE); it drops to the
    /// default policy for each full reconcile. A fault then reaches the map without waiting for
    /// the scheduler to wake an idle CPU. Off by default.
    #[arg(long, env = "HUGEPAGE_AGENT_MAP_THREAD_PRIORITY", value_parser = clap::value_parser!(u8).range(1..=99))]
    pub map_thread_priority: Option<u8>,
}

impl MapArgs {
    pub fn reconcile_interval(&self) -> Result<Duration, FlagError> {
        duration("--reconcile-interval", &self.reconcile_interval, above_zero)
    }
}
