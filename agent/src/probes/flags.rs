//! The probes' flags: whether the eBPF programs load (`--ebpf`), which processes' faults the
//! fault probe inspects (`--fault-scope`), and where it attaches (`--fault-attach`).

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

/// Where the fault probe attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FaultAttach {
    /// fexit where the kernel runs fexit programs; where it refuses them, the tracepoint (fentry
    /// on PREEMPT_RT kernels, where the tracepoint's VMA lookup always gives up).
    Auto,
    /// The raw tracepoint `exceptions/page_fault_user`, looking the VMA up (`bpf_find_vma`).
    Tracepoint,
    /// fentry on the kernel's `hugetlb_fault`, which is handed the VMA (Linux 5.5 and later, with
    /// BTF trampolines).
    Fentry,
    /// fexit on the kernel's `hugetlb_fault`: each fault seen done, its page already taken from
    /// the pool, so one read of the pools follows it (Linux 5.5 and later, with BTF trampolines).
    Fexit,
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
    /// Where the fault probe attaches: auto (fexit where the kernel allows it, else the
    /// tracepoint, or fentry on PREEMPT_RT kernels), tracepoint, fentry, fexit.
    #[arg(long, env = "HUGEPAGE_AGENT_FAULT_ATTACH", value_enum, default_value_t = FaultAttach::Auto)]
    pub fault_attach: FaultAttach,
}
