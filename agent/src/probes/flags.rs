//! The probes' flags: whether the eBPF programs load (`--ebpf`) and which processes' faults the
//! fault probe inspects (`--fault-scope`).

use clap::{Args, ValueEnum};

use super::live::FaultScope;

/// Whether the eBPF probes are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EbpfMode {
    /// Load them; run on sysfs alone when the kernel refuses (said once in the log).
    Auto,
    /// Load them; a refusal stops the agent.
    On,
    /// Do not load them: sysfs alone.
    Off,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "eBPF probes")]
pub struct ProbeArgs {
    /// Load the eBPF probes: auto (fall back to sysfs when refused), on (refusal is fatal), off.
    #[arg(long, env = "HUGEPAGE_AGENT_EBPF", value_enum, default_value_t = EbpfMode::Auto)]
    pub ebpf: EbpfMode,
    /// Which processes' faults the probe inspects: those of cgroups that can use hugepages, or all.
    #[arg(long, env = "HUGEPAGE_AGENT_FAULT_SCOPE", value_enum, default_value_t = FaultScope::HugetlbCgroups)]
    pub fault_scope: FaultScope,
}
