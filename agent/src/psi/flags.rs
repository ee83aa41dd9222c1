//! PSI's flags: the thresholds that set the contention-pressure conditions (KEP-5394), how often
//! pressure is read without a trigger, and whether hugepage pods are refused under pressure.

use std::time::Duration;

use clap::Args;

use super::monitor::PsiConfig;
use crate::flags::{FlagError, duration, percentage};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Pressure (PSI)")]
pub struct PsiArgs {
    /// PSI memory threshold in percent: `some` avg60 (and avg10) at or above it sets the
    /// *MemoryContentionPressure conditions.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_PSI_MEMORY_THRESHOLD",
        default_value_t = 10.0
    )]
    pub psi_memory_threshold: f64,
    /// PSI io threshold in percent, for the *DiskContentionPressure conditions.
    #[arg(long, env = "HUGEPAGE_AGENT_PSI_IO_THRESHOLD", default_value_t = 25.0)]
    pub psi_io_threshold: f64,
    /// How often pressure is read when no PSI trigger fires (e.g. 5s).
    #[arg(long, env = "HUGEPAGE_AGENT_PSI_INTERVAL", default_value = "5s")]
    pub psi_interval: String,
    /// Refuse admission of hugepage pods while a *MemoryContentionPressure condition is True.
    #[arg(long, env = "HUGEPAGE_AGENT_REJECT_UNDER_PRESSURE")]
    pub reject_under_pressure: bool,
}

impl PsiArgs {
    pub fn config(&self) -> Result<PsiConfig, FlagError> {
        Ok(PsiConfig {
            memory_threshold: percentage("--psi-memory-threshold", self.psi_memory_threshold)?,
            io_threshold: percentage("--psi-io-threshold", self.psi_io_threshold)?,
            interval: duration("--psi-interval", &self.psi_interval, |d| {
                (d < Duration::from_millis(100)).then(|| "must be at least 100ms".to_owned())
            })?,
        })
    }
}
