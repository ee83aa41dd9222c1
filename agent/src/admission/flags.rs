//! Admission's flags: how verification reads the kernel (`--verification`,
//! `--verification-mode`, `--on-sysfs-error`) and how long reservations last where they are kept
//! (`--reservation-ttl`, `--state-dir`) and what one namespace may hold
//! (`--namespace-reservation-limit`).

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{
    reservations::NamespaceLimit,
    verify::{Gate, Mode, OnSysfsError, Settings},
};
use crate::flags::{FlagError, above_zero, bytes, duration};

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
    /// The most of one page size a namespace's reservations may hold at once on this node:
    /// bytes (4Gi) or a percentage of the node's pool of that size (50%). The default, 100%,
    /// never refuses a pod the node could serve: one pod can reserve no more than the pool. A
    /// lower value bounds what one namespace's pods, admitted together, hold before they start.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_NAMESPACE_RESERVATION_LIMIT",
        default_value = "100%",
        value_name = "BYTES|PERCENT"
    )]
    pub namespace_reservation_limit: String,
}

impl ReservationArgs {
    pub fn ttl(&self) -> Result<Duration, FlagError> {
        duration("--reservation-ttl", &self.reservation_ttl, above_zero)
    }

    /// `--namespace-reservation-limit`, read.
    pub fn namespace_limit(&self) -> Result<NamespaceLimit, FlagError> {
        namespace_limit(&self.namespace_reservation_limit)
    }
}

/// `1`% to `100`%, or bytes above 0.
pub fn namespace_limit(text: &str) -> Result<NamespaceLimit, FlagError> {
    const FLAG: &str = "--namespace-reservation-limit";
    match text.strip_suffix('%') {
        Some(p) => match p.parse::<u64>() {
            Ok(p @ 1..=100) => Ok(NamespaceLimit::Percent(p)),
            _ => Err(FlagError::Bytes {
                flag: FLAG,
                value: text.to_owned(),
                reason: "a percentage must be a whole number from 1 to 100".to_owned(),
            }),
        },
        None => Ok(NamespaceLimit::Bytes(bytes(FLAG, text, u64::MAX)? as u64)),
    }
}

#[cfg(test)]
mod tests;
