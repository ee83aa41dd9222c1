//! The command line (`Cli`, as typed) and the validated configuration (`Config`, as used), one
//! subcommand at a time: each takes the groups of flags it uses and no others, each group kept
//! beside the subsystem it sets (`sysfs::flags`, `api::flags`, `api::server::flags`,
//! `tls::flags`, `probes::flags`, `numa::flags`, `admission::flags`, `psi::flags`,
//! `kubeletconfig::flags`, `logging`, `webhook::flags`), read with the shared [`crate::flags`].
//!
//! Every flag also reads `HUGEPAGE_AGENT_<FLAG>` from the environment. Validation happens before
//! any program is loaded or file is read, and names the flag at fault. No subcommand is `run`
//! with its defaults; a flag follows the subcommand it belongs to.

use std::path::PathBuf;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::{
    admission::{flags::VerificationArgs, verify::Settings},
    api::{
        flags::ApiFlagError,
        server::{
            Limits,
            flags::{Http2Args, LimitArgs},
        },
    },
    client::{AgentUrl, ClientError},
    doctor::{self, flags::DoctorArgs},
    flags::FlagError,
    kubelet::features::FeatureGates,
    kubeletconfig::{
        flags::{GateArgs, KubeletArgs, KubeletFlagError, KubeletFlags, parse_scope},
        settings::{KubeletSettings, Layer},
    },
    logging::{LogArgs, LogFormat},
    memorymanager::hints::Scope,
    sysfs::{HostFs, flags::HostArgs},
    telemetry::traces::{TraceConfig, TracesError},
    tls::flags::{ServingTlsArgs, TlsFlagError},
    topologymanager::Policy,
    webhook::{self, flags::WebhookArgs, routes::ADMISSION_REVIEW_LIMIT},
};

#[derive(Debug, Parser)]
#[command(
    name = "hugepage-agent",
    version,
    about = "Per-NUMA hugepage verification for Kubernetes nodes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<CliCommand>,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// The agent: probes, the hugepage map, verification and reservations over its API, PSI
    /// conditions, telemetry (the default).
    Run(Box<RunArgs>),
    /// Print the per-NUMA hugepage table of this host, or of a running agent.
    Status(ReadArgs),
    /// Print what holds the hugepages that are not a running process's private mapping (hugetlbfs
    /// files, SysV segments, memfds), who uses each one, and those held by nothing that runs, on
    /// this host or a running agent's; it never deletes or detaches anything.
    Holders(ReadArgs),
    /// Verify one request against this host's sysfs: exit 0 admitted, 1 rejected, 2 bad input.
    Check(Box<CheckArgs>),
    /// The kubelet Memory Manager's topology hints for a pod on a given state, as JSON.
    Hints(HintsArgs),
    /// The Topology Manager's merge of given hints under a policy, as JSON.
    Merge(MergeArgs),
    /// The cluster side: a kube-scheduler extender (`/scheduler/filter`,
    /// `/scheduler/prioritize`) and a validating admission webhook (`/admission/validate`) over
    /// HTTPS, asking the node agents over mTLS.
    Webhook(Box<WebhookCommandArgs>),
    /// Test, from where it runs, the path from kube-apiserver and kube-scheduler to every node's
    /// agent: each webhook called as kube-apiserver calls it (its caBundle verified), each
    /// extender of kube-scheduler's file as kube-scheduler calls it (its address resolved), each
    /// node's agent as the webhook calls it; says what is wrong; exit 0 nothing wrong, 1 otherwise.
    Doctor(Box<DoctorArgs>),
}

impl CliCommand {
    /// `run` with its defaults and the environment's variables: what no subcommand means.
    pub fn default_run() -> CliCommand {
        let run = RunArgs::from_arg_matches(
            &RunArgs::augment_args(clap::Command::new("run")).get_matches_from(["run"]),
        );
        CliCommand::Run(Box::new(run.unwrap_or_else(|e| e.exit())))
    }
}

/// `status`'s and `holders`' flags: what they read and how they print it.
#[derive(Debug, Args)]
pub struct ReadArgs {
    /// JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Ask a running agent (plain HTTP) instead of reading this host, e.g.
    /// http://127.0.0.1:9820.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    #[command(flatten)]
    pub host: HostArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// `hugepages-<size>=<quantity>`, e.g. `hugepages-2Mi=4Gi`; repeat for several sizes.
    #[arg(long = "request", required = true)]
    pub requests: Vec<String>,
    /// NUMA nodes to check, e.g. `0,1` (default: the NUMA nodes the node's kubelet would select
    /// for a Guaranteed pod asking these resources; every node under Memory Manager policy `None`).
    #[arg(long)]
    pub numa: Option<String>,
    /// Topology Manager policy for picking NUMA nodes when `--numa` is not given (default:
    /// the node's kubelet's, or `--topology-policy`).
    #[arg(long, value_enum)]
    pub policy: Option<Policy>,
    /// The whole answer as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub verification: VerificationArgs,
    #[command(flatten)]
    pub kubelet: KubeletArgs,
}

#[derive(Debug, Args)]
pub struct HintsArgs {
    /// A kubelet checkpoint (`memory_manager_state`, checksum verified) or the same JSON
    /// without `checksum` (hand-written, not verified).
    #[arg(long, value_name = "STATE.json")]
    pub state: PathBuf,
    /// A `v1.Pod` as JSON.
    #[arg(long, value_name = "POD.json")]
    pub pod: PathBuf,
    /// The container to hint for in container scope (default: the only app container).
    #[arg(long)]
    pub container: Option<String>,
    /// Topology Manager scope: container (the default) or pod.
    #[arg(long, value_parser = parse_scope)]
    pub scope: Option<Scope>,
    #[command(flatten)]
    pub gates: GateArgs,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// `{"policy":…,"policyOptions":{…},"numaNodes":[…],"distances":{…},"providers":[…]}`.
    #[arg(long, value_name = "MERGE.json")]
    pub input: PathBuf,
}

#[derive(Debug, Args)]
pub struct WebhookCommandArgs {
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub tls: ServingTlsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub http2: Http2Args,
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(transparent)]
    Flag(#[from] FlagError),
    #[error(transparent)]
    Api(#[from] ApiFlagError),
    #[error(transparent)]
    Tls(#[from] TlsFlagError),
    #[error(transparent)]
    Kubelet(#[from] KubeletFlagError),
    #[error(transparent)]
    From(#[from] ClientError),
    #[error(transparent)]
    Traces(#[from] TracesError),
    #[error(
        "webhook needs --tls-cert-file and --tls-private-key-file: the scheduler calls it over HTTPS"
    )]
    WebhookWithoutTls,
    #[error(
        "--body-budget {budget} is smaller than {flag} {limit}: a body at that limit could never be read"
    )]
    BudgetBelowLimit {
        budget: usize,
        flag: &'static str,
        limit: usize,
    },
}

/// The validated configuration: the command, and how it logs and traces.
#[derive(Debug, Clone)]
pub struct Config {
    pub command: Command,
    pub log_format: LogFormat,
    /// OpenTelemetry export, from the standard `OTEL_*` variables (`run` and `webhook`).
    pub traces: TraceConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Run(Box<RunConfig>),
    Status {
        host: HostFs,
        json: bool,
        from: Option<AgentUrl>,
    },
    Holders {
        host: HostFs,
        json: bool,
        from: Option<AgentUrl>,
    },
    Check(Box<CheckConfig>),
    Hints {
        state: PathBuf,
        pod: PathBuf,
        container: Option<String>,
        scope: Scope,
        gates: FeatureGates,
    },
    Merge {
        input: PathBuf,
    },
    Webhook(Box<webhook::Settings>),
    Doctor(Box<doctor::flags::Settings>),
}

/// `check`'s configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckConfig {
    pub host: HostFs,
    pub kubelet: KubeletFlags,
    pub verification: Settings,
    pub requests: Vec<String>,
    pub numa: Option<String>,
    pub policy: Option<Policy>,
    pub json: bool,
}

/// A `--body-budget` below the largest body the listener must read.
pub(crate) fn at_least(
    limits: &Limits,
    flag: &'static str,
    limit: usize,
) -> Result<(), ConfigError> {
    if limits.body_budget < limit {
        return Err(ConfigError::BudgetBelowLimit {
            budget: limits.body_budget,
            flag,
            limit,
        });
    }
    Ok(())
}

fn webhook_config(args: WebhookCommandArgs) -> Result<webhook::Settings, ConfigError> {
    let read = args.webhook.read()?;
    let limits = args.http2.over(args.limits.limits(Limits::WEBHOOK)?)?;
    let largest = read.extender_body_limit.max(ADMISSION_REVIEW_LIMIT);
    at_least(&limits, "--extender-body-limit", largest)?;
    Ok(webhook::Settings {
        listen: read.listen,
        limits,
        tls: args
            .tls
            .files(args.webhook.client_ca_file.clone())?
            .ok_or(ConfigError::WebhookWithoutTls)?,
        metrics_listen: read.metrics_listen,
        client_names: read.client_names,
        agent_port: args.webhook.agent_port,
        agent_tls: read.agent_tls,
        agent_identity: read.identity,
        failure_policy: args.webhook.failure_policy,
        agent_timeout: read.agent_timeout,
        extender_body_limit: read.extender_body_limit,
        kubeconfig: args.webhook.kubeconfig,
        scheduler_name: read.scheduler_name,
        streams: read.streams,
        reservation_confirm_within: read.reservation_confirm_within,
    })
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Config, ConfigError> {
        let (command, log_format) = match cli.command.unwrap_or_else(CliCommand::default_run) {
            CliCommand::Run(args) => {
                let log = args.log.log_format;
                (Command::Run(Box::new(RunConfig::of(*args)?)), log)
            }
            CliCommand::Status(args) => {
                let from = args.from.as_deref().map(AgentUrl::parse).transpose()?;
                let (host, json) = (args.host.host()?, args.json);
                (Command::Status { host, json, from }, LogFormat::Text)
            }
            CliCommand::Holders(args) => {
                let from = args.from.as_deref().map(AgentUrl::parse).transpose()?;
                let (host, json) = (args.host.host()?, args.json);
                (Command::Holders { host, json, from }, LogFormat::Text)
            }
            CliCommand::Check(args) => {
                let host = args.host.host()?;
                let check = CheckConfig {
                    kubelet: args.kubelet.flags(&host, args.verification.verification)?,
                    verification: args.verification.settings(),
                    requests: args.requests,
                    numa: args.numa,
                    policy: args.policy,
                    json: args.json,
                    host,
                };
                (Command::Check(Box::new(check)), LogFormat::Text)
            }
            CliCommand::Hints(args) => {
                let mut layer = Layer::default();
                args.gates.into_layer(&mut layer)?;
                let hints = Command::Hints {
                    gates: KubeletSettings::resolve(&[&layer]).feature_gates(),
                    state: args.state,
                    pod: args.pod,
                    container: args.container,
                    scope: args.scope.unwrap_or(Scope::Container),
                };
                (hints, LogFormat::Text)
            }
            CliCommand::Merge(args) => (Command::Merge { input: args.input }, LogFormat::Text),
            CliCommand::Webhook(args) => {
                let log = args.log.log_format;
                (Command::Webhook(Box::new(webhook_config(*args)?)), log)
            }
            CliCommand::Doctor(args) => (Command::Doctor(Box::new(args.read()?)), LogFormat::Text),
        };
        let traces = match command {
            Command::Run(_) | Command::Webhook(_) => TraceConfig::from_env()?,
            _ => TraceConfig::off(),
        };
        Ok(Config {
            command,
            log_format,
            traces,
        })
    }
}

mod run;
#[cfg(test)]
mod tests;

pub use run::{RunArgs, RunConfig};
