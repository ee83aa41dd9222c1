//! `run`'s flags, each group from the subsystem it sets, and its validated configuration.

use std::path::PathBuf;

use clap::Args;

use super::{ConfigError, at_least};
use crate::{
    admission::{
        flags::{ReservationArgs, VerificationArgs},
        verify::Settings,
    },
    api::{
        admit::BODY_LIMIT,
        flags::{ApiArgs, WatchArgs, exposure},
        server::{Limits, flags::LimitArgs},
        watch::WatchLimits,
    },
    kubeletconfig::flags::{KubeletArgs, KubeletFlags},
    logging::LogArgs,
    numa::{flags::MapArgs, map::Source},
    probes::{
        flags::{EbpfMode, FaultAttach, ProbeArgs},
        live::FaultScope,
    },
    psi::{flags::PsiArgs, monitor::PsiConfig},
    sysfs::{HostFs, flags::HostArgs},
    tls::{TlsFiles, flags::ServingTlsArgs},
};

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub tls: ServingTlsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub watch: WatchArgs,
    #[command(flatten)]
    pub probes: ProbeArgs,
    #[command(flatten)]
    pub map: MapArgs,
    #[command(flatten)]
    pub verification: VerificationArgs,
    #[command(flatten)]
    pub reservations: ReservationArgs,
    #[command(flatten)]
    pub psi: PsiArgs,
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

/// `run`'s configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    pub host: HostFs,
    pub listen: std::net::SocketAddr,
    pub api_threads: usize,
    /// The most containers a pod in a request may have (`--max-containers`).
    pub max_containers: usize,
    pub ebpf: EbpfMode,
    pub fault_scope: FaultScope,
    pub fault_attach: FaultAttach,
    pub reconcile_interval: std::time::Duration,
    /// The map thread's SCHED_FIFO priority (`--map-thread-priority`), if any.
    pub map_thread_priority: Option<u8>,
    pub verification: Settings,
    pub psi: PsiConfig,
    pub reject_under_pressure: bool,
    pub reservation_ttl: std::time::Duration,
    pub namespace_reservation_limit: crate::admission::reservations::NamespaceLimit,
    pub state_dir: PathBuf,
    /// The agent's overrides of the node's kubelet settings, and where its files are.
    pub kubelet: KubeletFlags,
    /// TLS for the API listener.
    pub tls: Option<TlsFiles>,
    /// The client certificates' names that may change state (`--admit-client-names`).
    pub admit_client_names: Vec<String>,
    /// The plain listener for `/metrics`, `/healthz`, `/readyz`.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `--allow-unauthenticated-clients`: the API beyond loopback without client certificates.
    pub allow_unauthenticated_clients: bool,
    /// What the listeners tolerate of their clients.
    pub limits: Limits,
    /// The map watch's limits.
    pub watch: WatchLimits,
}

impl RunConfig {
    /// How the API is secured, as the start-up line says it.
    pub fn api_security(&self) -> &'static str {
        match &self.tls {
            None => "off",
            Some(files) if files.client_ca.is_some() => "client certificates required",
            Some(_) => "server certificate only",
        }
    }

    /// Whether the API listens beyond loopback without client certificates (which only
    /// `--allow-unauthenticated-clients` allows).
    pub fn api_open_to_anyone(&self) -> bool {
        exposure(self.listen, self.tls.as_ref(), false).is_err()
    }

    /// The line that says the agent runs, with the map's `source`; warned first when
    /// [`RunConfig::api_open_to_anyone`].
    pub fn announce(&self, source: &Source) {
        self.warn_if_open();
        let priority = self.map_thread_priority;
        tracing::info!(
            source = %source,
            listen = %self.listen,
            api_threads = self.api_threads,
            map_thread_priority = priority.map_or_else(|| "none".to_owned(), |p| format!("SCHED_FIFO {p}")),
            tls = self.api_security(),
            metrics_listen = %self.metrics_listen.map_or_else(|| "none".to_owned(), |a| a.to_string()),
            "agent running"
        );
    }

    /// Warns, as the agent starts, when [`RunConfig::api_open_to_anyone`].
    fn warn_if_open(&self) {
        if self.api_open_to_anyone() {
            tracing::warn!(
                "the API on {} accepts requests from any client (--allow-unauthenticated-clients): anyone who reaches it can reserve hugepages",
                self.listen
            );
        }
    }
}

impl RunConfig {
    /// The configuration `args` give, each group validated in turn.
    pub fn of(args: RunArgs) -> Result<RunConfig, ConfigError> {
        let host = args.host.host()?;
        let addresses = args.api.addresses()?;
        let tls = args.tls.files(args.api.client_ca_file.clone())?;
        exposure(
            addresses.listen,
            tls.as_ref(),
            args.api.allow_unauthenticated_clients,
        )?;
        let limits = args.limits.limits(Limits::DEFAULT)?;
        at_least(&limits, "the body limit of /v1", BODY_LIMIT)?;
        let psi = args.psi.config()?;
        Ok(RunConfig {
            kubelet: args.kubelet.flags(&host, args.verification.verification)?,
            listen: addresses.listen,
            metrics_listen: addresses.metrics_listen,
            admit_client_names: args.api.admit_client_names()?,
            api_threads: usize::from(args.api.api_threads),
            max_containers: usize::try_from(args.api.max_containers).unwrap_or(usize::MAX),
            ebpf: args.probes.ebpf,
            fault_scope: args.probes.fault_scope,
            fault_attach: args.probes.fault_attach,
            reconcile_interval: args.map.reconcile_interval()?,
            map_thread_priority: args.map.map_thread_priority,
            verification: args.verification.settings(),
            reject_under_pressure: args.psi.reject_under_pressure,
            psi,
            reservation_ttl: args.reservations.ttl()?,
            namespace_reservation_limit: args.reservations.namespace_limit()?,
            state_dir: args.reservations.state_dir,
            tls,
            allow_unauthenticated_clients: args.api.allow_unauthenticated_clients,
            limits,
            watch: args.watch.limits()?,
            host,
        })
    }
}
