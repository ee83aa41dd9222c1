//! The agent's API as flags: where it listens (`--listen`, `--api-threads`), who may call it
//! (`--client-ca-file`, `--allow-unauthenticated-clients`) and which of them may change state
//! (`--admit-client-names`), the plain listener for probes and
//! Prometheus (`--metrics-listen`), how large a pod a request may carry (`--max-containers`),
//! and the map watch's limits (`--max-watchers`, `--watch-heartbeat`, `--watch-max-duration`).
//!
//! One rule guards the API: the agent refuses to start when `--listen` is not a loopback address
//! and no `--client-ca-file` is given (anyone who reaches the port could reserve hugepages),
//! unless `--allow-unauthenticated-clients` says the operator means it ([`exposure`]).

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;

use super::{admit::DEFAULT_MAX_CONTAINERS, watch::WatchLimits};
use crate::{
    flags::{FlagError, above_zero, address, duration},
    kube::json::MAX_OBJECTS,
    tls::TlsFiles,
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiFlagError {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error("--metrics-listen {0}: the address of --listen; give it a port of its own")]
    SameListen(SocketAddr),
    #[error("--admit-client-names: no name given: no client could admit")]
    NoAdmitNames,
    #[error(
        "--listen {0} is not a loopback address and no --client-ca-file is given: anyone who reaches it could reserve hugepages; give --client-ca-file with --tls-cert-file and --tls-private-key-file, listen on 127.0.0.1, or add --allow-unauthenticated-clients if that is meant"
    )]
    Unauthenticated(SocketAddr),
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "API")]
pub struct ApiArgs {
    /// Address of the HTTP API.
    #[arg(long, env = "HUGEPAGE_AGENT_LISTEN", default_value = "127.0.0.1:9820")]
    pub listen: String,
    /// Threads that serve the HTTP API, all accepting on the `--listen` socket. One answers tens
    /// of thousands of admissions a second (reservation files are written on other threads);
    /// more add contention, not speed, unless the agent has cores to spare.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_API_THREADS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=64)
    )]
    pub api_threads: u16,
    /// PEM CA certificates: API clients must present a certificate one of them signed, valid
    /// now and for client authentication. Needs the TLS flags.
    #[arg(long, env = "HUGEPAGE_AGENT_CLIENT_CA_FILE", value_name = "PATH")]
    pub client_ca_file: Option<PathBuf>,
    /// Comma-separated names (a client certificate's common name or one of its DNS names) that
    /// may admit for real (POST /v1/admit without dryRun=true) and release reservations (DELETE
    /// /v1/reservations/{id}); any other certificate of --client-ca-file may only read and is
    /// answered 403. The default is the common name of the webhook's client certificate.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_ADMIT_CLIENT_NAMES",
        default_value = "hugepage-agent-webhook",
        value_name = "NAMES"
    )]
    pub admit_client_names: String,
    /// A second, plain-HTTP listener serving only /metrics, /healthz and /readyz (for kubelet
    /// probes and Prometheus), e.g. 0.0.0.0:9821; none by default.
    #[arg(long, env = "HUGEPAGE_AGENT_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Serve the API on a non-loopback `--listen` without client certificates: anyone who
    /// reaches the port can reserve hugepages. Refused without this flag.
    #[arg(long, env = "HUGEPAGE_AGENT_ALLOW_UNAUTHENTICATED_CLIENTS")]
    pub allow_unauthenticated_clients: bool,
    /// Containers (app and init together) a pod may have in `POST /v1/admit` and
    /// `POST /v1/hints`; a pod with more is refused (413). This bounds the work one request may
    /// cause: real pods have a handful, a few dozen at the most.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_CONTAINERS",
        default_value_t = DEFAULT_MAX_CONTAINERS,
        value_parser = clap::value_parser!(u32).range(1..=MAX_OBJECTS as i64)
    )]
    pub max_containers: u32,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Map watch")]
pub struct WatchArgs {
    /// Watches of the map (`GET /v1/hugepages?watch=true`) open at once; one more is refused
    /// with 503. Each webhook replica keeps one per agent. Each watch is also a connection
    /// (--max-connections).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_WATCHERS",
        default_value_t = WatchLimits::DEFAULT.max_watchers as u32,
        value_parser = clap::value_parser!(u32).range(1..=65536)
    )]
    pub max_watchers: u32,
    /// A watch is sent a BOOKMARK after this long without a change, so that its client knows
    /// the stream is alive (e.g. 5s).
    #[arg(long, env = "HUGEPAGE_AGENT_WATCH_HEARTBEAT", default_value = "5s")]
    pub watch_heartbeat: String,
    /// A watch ends after this long, jittered up to twice it; its client resumes from the
    /// generation it saw (e.g. 5m).
    #[arg(long, env = "HUGEPAGE_AGENT_WATCH_MAX_DURATION", default_value = "5m")]
    pub watch_max_duration: String,
}

impl WatchArgs {
    /// The limits, each read.
    pub fn limits(&self) -> Result<WatchLimits, FlagError> {
        Ok(WatchLimits {
            max_watchers: self.max_watchers as usize,
            heartbeat: duration("--watch-heartbeat", &self.watch_heartbeat, above_zero)?,
            max_duration: duration("--watch-max-duration", &self.watch_max_duration, above_zero)?,
        })
    }
}

/// Where the API and the plain listener listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addresses {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
}

impl ApiArgs {
    /// The addresses, each read, the plain listener's not the API's.
    pub fn addresses(&self) -> Result<Addresses, ApiFlagError> {
        let listen = address("--listen", &self.listen, "127.0.0.1:9820 or [::]:9820")?;
        let metrics_listen = self
            .metrics_listen
            .as_deref()
            .map(|text| address("--metrics-listen", text, "0.0.0.0:9821"))
            .transpose()?;
        if let Some(metrics) = metrics_listen
            && metrics == listen
            && metrics.port() != 0
        {
            return Err(ApiFlagError::SameListen(metrics));
        }
        Ok(Addresses {
            listen,
            metrics_listen,
        })
    }
}

/// The refusal rule: an API beyond loopback requires client certificates, unless `allow`.
pub fn exposure(
    listen: SocketAddr,
    tls: Option<&TlsFiles>,
    allow: bool,
) -> Result<(), ApiFlagError> {
    let authenticated = tls.is_some_and(|t| t.client_ca.is_some());
    if listen.ip().to_canonical().is_loopback() || authenticated || allow {
        Ok(())
    } else {
        Err(ApiFlagError::Unauthenticated(listen))
    }
}

impl ApiArgs {
    /// `--admit-client-names`, at least one.
    pub fn admit_client_names(&self) -> Result<Vec<String>, ApiFlagError> {
        let names = crate::tls::identity::names(&self.admit_client_names);
        if names.is_empty() {
            return Err(ApiFlagError::NoAdmitNames);
        }
        Ok(names)
    }
}
