//! The webhook's flags: where it listens (`--listen`, `--metrics-listen`), who may call it
//! (`--client-ca-file`, `--client-names`), how it reaches the node agents
//! (`--agent-port`, the client side of mTLS, `--agent-identity` and, under `per-pod`, the agents'
//! pods' `--agent-namespace` and `--agent-selector`), what it tells the scheduler and the API server when
//! an agent does not answer (`--failure-policy`, `--agent-timeout`), the largest scheduler call
//! it reads (`--extender-body-limit`), the scheduler pods with hugepages are given
//! (`--scheduler-name`), the agents' streams (`--agent-streams`, `--stream-fresh-within`), and the
//! Kubernetes API (`--kubeconfig`).

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;

use super::{FailurePolicy, agents::ClientFiles, identity::IdentityArgs};
use crate::{
    api::budget,
    flags::{FlagError, above_zero, address, bytes, duration},
    kube::identifiers::dns1123_subdomain,
};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Webhook")]
pub struct WebhookArgs {
    /// Address of the HTTPS listener the API server and kube-scheduler call.
    #[arg(long, env = "HUGEPAGE_AGENT_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: String,
    /// PEM CA certificates: callers (kube-apiserver, kube-scheduler) must present a client
    /// certificate one of them signed, valid now and for client authentication, or the
    /// handshake fails. Re-read when it changes on disk.
    #[arg(long, env = "HUGEPAGE_AGENT_CLIENT_CA_FILE", value_name = "PATH")]
    pub client_ca_file: Option<PathBuf>,
    /// Comma-separated names: with --client-ca-file, a caller's certificate must carry one of
    /// them as its common name or a DNS name, or the connection is closed right after the
    /// handshake; empty: any certificate of the CA.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_CLIENT_NAMES",
        value_name = "NAMES",
        requires = "client_ca_file"
    )]
    pub client_names: Option<String>,
    /// A second, plain-HTTP listener serving only /metrics, /healthz and /readyz (kubelet
    /// probes and Prometheus present no client certificate), e.g. 0.0.0.0:9821; none by
    /// default.
    #[arg(long, env = "HUGEPAGE_AGENT_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// The port every node's agent listens on, at the node's first InternalIP.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_PORT", default_value_t = 9820, value_parser = clap::value_parser!(u16).range(1..))]
    pub agent_port: u16,
    /// PEM CA certificates the agents' server certificates chain to.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_CA_FILE", value_name = "PATH")]
    pub agent_ca_file: PathBuf,
    /// PEM client certificate the webhook presents to the agents (the leaf first).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_CLIENT_CERT_FILE",
        value_name = "PATH"
    )]
    pub agent_client_cert_file: PathBuf,
    /// PEM private key of `--agent-client-cert-file`.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_CLIENT_KEY_FILE",
        value_name = "PATH"
    )]
    pub agent_client_key_file: PathBuf,
    #[command(flatten)]
    pub identity: IdentityArgs,
    /// When an agent does not answer in time: ignore (keep the node) or fail (filter it out).
    #[arg(long, env = "HUGEPAGE_AGENT_FAILURE_POLICY", value_enum, default_value_t = FailurePolicy::Ignore)]
    pub failure_policy: FailurePolicy,
    /// One deadline for all the agent calls of one scheduler call (e.g. 2s, 500ms).
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_TIMEOUT", default_value = "2s")]
    pub agent_timeout: String,
    /// The largest `ExtenderArgs` body `/scheduler/filter` and `/scheduler/prioritize` read
    /// (413 beyond): the `nodenames` form (the shipped `nodeCacheCapable: true`) of 5,000
    /// nodes and a pod at the API server's largest is under 8Mi; the `nodes` form carries
    /// whole Node objects, tens of MiB on a large cluster (raise this, --body-budget and the
    /// memory limit with it).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_EXTENDER_BODY_LIMIT",
        default_value = "8Mi",
        value_name = "BYTES"
    )]
    pub extender_body_limit: String,
    /// The scheduler `/admission/mutate` gives a pod that asks for hugepages and names none: the
    /// `schedulerName` of the `scheduler` component's profile.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_SCHEDULER_NAME",
        default_value = "hugepage-agent",
        value_name = "NAME"
    )]
    pub scheduler_name: String,
    /// Keep a stream of every node agent's map (GET /v1/hugepages?watch=true) and answer the
    /// extender from it where a node's state alone decides; false: ask every candidate's agent.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_STREAMS", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub agent_streams: bool,
    /// A node's streamed state is used while its stream was heard (an event or a heartbeat)
    /// within this bound; after it the node is asked directly. Above the agents' heartbeat
    /// interval (the agent's watch-heartbeat flag, 5s by default).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_STREAM_FRESH_WITHIN",
        default_value = "10s",
        value_name = "DURATION"
    )]
    pub stream_fresh_within: String,
    /// How long a reservation a binding made may go unconfirmed by the API (its pod of that
    /// UID bound to that node) before the webhook releases it on the agent; above the time the
    /// API server takes from the validating webhook to the binding's write (milliseconds), and
    /// below the agents' --reservation-ttl (30s).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_RESERVATION_CONFIRM_WITHIN",
        default_value = "10s",
        value_name = "DURATION"
    )]
    pub reservation_confirm_within: String,
    /// kubeconfig of the Kubernetes API (its current context); without it, the in-cluster
    /// configuration of the pod the webhook runs in.
    #[arg(long, env = "HUGEPAGE_AGENT_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

/// The webhook's own flags, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// `--client-names`; `None`: any certificate of `--client-ca-file`.
    pub client_names: Option<Vec<String>>,
    pub agent_tls: ClientFiles,
    pub agent_timeout: std::time::Duration,
    pub extender_body_limit: usize,
    pub scheduler_name: String,
    /// `--stream-fresh-within`, when `--agent-streams` is true.
    pub streams: Option<std::time::Duration>,
    pub reservation_confirm_within: std::time::Duration,
    pub identity: IdentityArgs,
}

impl WebhookArgs {
    /// What the flags give, each read.
    pub fn read(&self) -> Result<Read, FlagError> {
        Ok(Read {
            listen: address("--listen", &self.listen, "0.0.0.0:8443")?,
            metrics_listen: self
                .metrics_listen
                .as_deref()
                .map(|text| address("--metrics-listen", text, "0.0.0.0:9821"))
                .transpose()?,
            client_names: self
                .client_names
                .as_deref()
                .map(crate::tls::identity::names)
                .filter(|names| !names.is_empty()),
            agent_tls: ClientFiles {
                ca: self.agent_ca_file.clone(),
                cert: self.agent_client_cert_file.clone(),
                key: self.agent_client_key_file.clone(),
                agents: self.identity.agent_identity.certificates(),
            },
            agent_timeout: duration("--agent-timeout", &self.agent_timeout, above_zero)?,
            extender_body_limit: bytes(
                "--extender-body-limit",
                &self.extender_body_limit,
                budget::MAX_BYTES,
            )?,
            scheduler_name: scheduler_name(&self.scheduler_name)?,
            streams: self
                .agent_streams
                .then(|| {
                    duration(
                        "--stream-fresh-within",
                        &self.stream_fresh_within,
                        above_zero,
                    )
                })
                .transpose()?,
            reservation_confirm_within: duration(
                "--reservation-confirm-within",
                &self.reservation_confirm_within,
                above_zero,
            )?,
            identity: self.identity.clone().checked()?,
        })
    }
}

/// `--scheduler-name`: a pod's `spec.schedulerName` must be a DNS subdomain (the API server's
/// validation), or every pod given it would be refused.
fn scheduler_name(value: &str) -> Result<String, FlagError> {
    dns1123_subdomain(value).map_err(|e| FlagError::Name {
        flag: "--scheduler-name",
        value: value.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(value.to_owned())
}
