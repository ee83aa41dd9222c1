//! `doctor`'s flags: the cluster it asks (`--kubeconfig`), the ValidatingWebhookConfiguration
//! whose webhooks it calls (`--webhook-configuration`), kube-scheduler's configuration file whose
//! extenders it calls (`--scheduler-config`), the agents' port and the client side of their mTLS
//! (the webhook's own flags and environment variables, so that the doctor run in the webhook's
//! pod uses the webhook's certificate), and how long each call may take (`--timeout`).

use std::{path::PathBuf, time::Duration};

use clap::Args;

use crate::{
    flags::{FlagError, above_zero, duration},
    webhook::{agents::ClientFiles, identity::IdentityArgs},
};

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Doctor")]
pub struct DoctorArgs {
    /// kubeconfig of the cluster (its current context); without it, the in-cluster
    /// configuration of the pod the doctor runs in.
    #[arg(long, env = "HUGEPAGE_AGENT_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The ValidatingWebhookConfiguration whose webhooks are called as kube-apiserver calls
    /// them: its Service's ClusterIP and port, verified by its caBundle and the Service's DNS
    /// name.
    #[arg(long, default_value = "hugepage-agent", value_name = "NAME")]
    pub webhook_configuration: String,
    /// kube-scheduler's configuration file (its --config): each extender's urlPrefix is resolved
    /// and called from here with the file's tlsConfig, as kube-scheduler does. Run the doctor
    /// where kube-scheduler runs (on kubeadm, a control-plane node's host network).
    #[arg(long, value_name = "PATH")]
    pub scheduler_config: Option<PathBuf>,
    /// The port every node's agent listens on, at the node's first InternalIP.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_PORT", default_value_t = 9820, value_parser = clap::value_parser!(u16).range(1..))]
    pub agent_port: u16,
    /// PEM CA certificates the agents' server certificates chain to; with the client
    /// certificate and key (all three or none), every node with hugepages has its agent called
    /// (a dry run). In the webhook's pod: /etc/hugepage-agent/agent-client/ca.crt.
    #[arg(long, env = "HUGEPAGE_AGENT_AGENT_CA_FILE", value_name = "PATH")]
    pub agent_ca_file: Option<PathBuf>,
    /// PEM client certificate presented to the agents (the webhook's).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_CLIENT_CERT_FILE",
        value_name = "PATH"
    )]
    pub agent_client_cert_file: Option<PathBuf>,
    /// PEM private key of `--agent-client-cert-file`.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_AGENT_CLIENT_KEY_FILE",
        value_name = "PATH"
    )]
    pub agent_client_key_file: Option<PathBuf>,
    #[command(flatten)]
    pub identity: IdentityArgs,
    /// How long one call (resolution, connection, handshake and answer) may take.
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub timeout: String,
    /// The findings as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// What `doctor` is asked to check, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
    pub webhook_configuration: String,
    pub scheduler_config: Option<PathBuf>,
    pub agent_port: u16,
    /// The agents' mTLS files; `None` when any of the three is not given.
    pub agent_tls: Option<ClientFiles>,
    pub agent_identity: IdentityArgs,
    pub timeout: Duration,
    pub json: bool,
}

impl DoctorArgs {
    /// The settings the flags give, each read.
    pub fn read(self) -> Result<Settings, FlagError> {
        let agent_tls = match (
            self.agent_ca_file,
            self.agent_client_cert_file,
            self.agent_client_key_file,
        ) {
            (Some(ca), Some(cert), Some(key)) => Some(ClientFiles {
                ca,
                cert,
                key,
                agents: self.identity.agent_identity.certificates(),
            }),
            (None, None, None) => None,
            (ca, cert, key) => {
                let missing: Vec<&str> = [
                    ("--agent-ca-file", ca.is_none()),
                    ("--agent-client-cert-file", cert.is_none()),
                    ("--agent-client-key-file", key.is_none()),
                ]
                .into_iter()
                .filter_map(|(flag, missing)| missing.then_some(flag))
                .collect();
                return Err(FlagError::Together {
                    flags: "--agent-ca-file, --agent-client-cert-file and --agent-client-key-file",
                    missing: missing.join(", "),
                });
            }
        };
        Ok(Settings {
            kubeconfig: self.kubeconfig,
            webhook_configuration: self.webhook_configuration,
            scheduler_config: self.scheduler_config,
            agent_port: self.agent_port,
            agent_tls,
            agent_identity: self.identity.checked()?,
            timeout: duration("--timeout", &self.timeout, above_zero)?,
            json: self.json,
        })
    }
}
