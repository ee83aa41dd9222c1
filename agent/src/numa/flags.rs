//! The map's flag: how often sysfs and the cgroup tree are re-read in full
//! (`--reconcile-interval`), between the faults that prompt a read of their own.

use std::time::Duration;

use clap::Args;

use crate::flags::{FlagError, above_zero, duration};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Hugepage map")]
pub struct MapArgs {
    /// How often sysfs and the cgroup tree are re-read in full (e.g. 10s, 500ms, 1m).
    #[arg(long, env = "HUGEPAGE_AGENT_RECONCILE_INTERVAL", default_value = "10s")]
    pub reconcile_interval: String,
}

impl MapArgs {
    pub fn reconcile_interval(&self) -> Result<Duration, FlagError> {
        duration("--reconcile-interval", &self.reconcile_interval, above_zero)
    }
}
