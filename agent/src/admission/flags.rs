//! Admission's flags: how verification reads the kernel (`--verification`,
//! `--verification-mode`, `--on-sysfs-error`) and how long reservations last where they are kept
//! (`--reservation-ttl`, `--state-dir`).

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::verify::{Gate, Mode, OnSysfsError, Settings};
use crate::flags::{FlagError, above_zero, duration};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Verification")]
pub struct VerificationArgs {
    /// Override of the MemoryManagerHugepagesVerification gate: off admits every request without
    /// reading sysfs (default: the kubelet's gate when it sets it, else on).
    #[arg(long, env = "HUGEPAGE_AGENT_VERIFICATION", value_enum)]
    pub verification: Option<Gate>,
    /// kep: available = free_hugepages; strict: minus pages reserved by mappings but not faulted.
    #[arg(long, env = "HUGEPAGE_AGENT_VERIFICATION_MODE", value_enum, default_value_t = Mode::Kep)]
    pub verification_mode: Mode,
    /// When a sysfs file cannot be read during verification: admit (the KEP's choice) or reject.
    #[arg(long, env = "HUGEPAGE_AGENT_ON_SYSFS_ERROR", value_enum, default_value_t = OnSysfsError::Admit)]
    pub on_sysfs_error: OnSysfsError,
}

impl VerificationArgs {
    /// The settings, the gate on unless `--verification` says off (the kubelet's own gate is
    /// laid over them where the node's kubelet sets it).
    pub fn settings(&self) -> Settings {
        Settings {
            gate: self.verification.unwrap_or(Gate::On),
            mode: self.verification_mode,
            on_sysfs_error: self.on_sysfs_error,
        }
    }
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Reservations")]
pub struct ReservationArgs {
    /// How long an admitted pod's hugepages stay reserved if its cgroup never faults them (e.g. 30s).
    #[arg(long, env = "HUGEPAGE_AGENT_RESERVATION_TTL", default_value = "30s")]
    pub reservation_ttl: String,
    /// Where state that must survive a restart (reservations) is kept.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_STATE_DIR",
        default_value = "/var/lib/hugepage-agent"
    )]
    pub state_dir: PathBuf,
}

impl ReservationArgs {
    pub fn ttl(&self) -> Result<Duration, FlagError> {
        duration("--reservation-ttl", &self.reservation_ttl, above_zero)
    }
}
