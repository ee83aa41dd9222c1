//! The command line (`Cli`, as typed) and the validated configuration (`Config`, as used).
//!
//! Every flag also reads `HUGEPAGE_AGENT_<FLAG>` from the environment. Validation happens before
//! any program is loaded or file is read, and names the flag at fault.
//!
//! One rule guards the API: `run` refuses to start when `--listen` is not a loopback address
//! and no `--client-ca-file` is given (anyone who reaches the port could reserve hugepages),
//! unless `--allow-unauthenticated-clients` says the operator means it ([`exposure`]).

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

use crate::{
    admission::verify::{Gate, Mode, OnSysfsError, Settings},
    api::{
        admit::{BODY_LIMIT, DEFAULT_MAX_CONTAINERS},
        budget,
        server::{
            AGENT_BODY_BUDGET, Limits, MAX_ABUSE_BACKOFF, WEBHOOK_BODY_BUDGET,
            WEBHOOK_MAX_CONNECTIONS,
        },
    },
    client::{AgentUrl, ClientError},
    kube::json::MAX_OBJECTS,
    kubeletconfig::{
        cmdline,
        settings::{
            Layer, LayerError, MIRRORED_GATES, Source, Sourced, VERIFICATION_GATE, check_options,
            key_values, parse_memory_manager_policy,
        },
    },
    logging::LogFormat,
    memorymanager::hints::Scope,
    probes::live::FaultScope,
    psi::monitor::PsiConfig,
    quantity::{format_binary, parse_bytes},
    sysfs::HostFs,
    telemetry::traces::{TraceConfig, TracesError},
    tls::TlsFiles,
    topologymanager::Policy,
    webhook::{self, FailurePolicy, agents::ClientFiles},
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
    /// Prefix for /sys and /proc (the DaemonSet mounts the host at /host).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HOST_ROOT",
        default_value = "/",
        global = true
    )]
    pub host_root: PathBuf,
    /// Load the eBPF probes: auto (fall back to sysfs when refused), on (refusal is fatal), off.
    #[arg(long, env = "HUGEPAGE_AGENT_EBPF", value_enum, default_value_t = EbpfMode::Auto, global = true)]
    pub ebpf: EbpfMode,
    /// Which processes' faults the probe inspects: those of cgroups that can use hugepages, or all.
    #[arg(long, env = "HUGEPAGE_AGENT_FAULT_SCOPE", value_enum, default_value_t = FaultScope::HugetlbCgroups, global = true)]
    pub fault_scope: FaultScope,
    /// Address of the HTTP API.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_LISTEN",
        default_value = "127.0.0.1:9820",
        global = true
    )]
    pub listen: String,
    /// Threads that serve the HTTP API, all accepting on the `--listen` socket. One answers tens
    /// of thousands of admissions a second (reservation files are written on other threads);
    /// more add contention, not speed, unless the agent has cores to spare.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_API_THREADS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=64),
        global = true
    )]
    pub api_threads: u16,
    /// PEM certificate chain the API presents over TLS (the leaf first), with
    /// `--tls-private-key-file`; re-read when it changes on disk.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_TLS_CERT_FILE",
        value_name = "PATH",
        global = true
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--tls-cert-file` (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_TLS_PRIVATE_KEY_FILE",
        value_name = "PATH",
        global = true
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// PEM CA certificates: API clients must present a certificate one of them signed, valid
    /// now and for client authentication. Needs the TLS flags.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_CLIENT_CA_FILE",
        value_name = "PATH",
        global = true
    )]
    pub client_ca_file: Option<PathBuf>,
    /// A second, plain-HTTP listener serving only /metrics, /healthz and /readyz (for kubelet
    /// probes and Prometheus), e.g. 0.0.0.0:9821; none by default.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_METRICS_LISTEN",
        value_name = "ADDR",
        global = true
    )]
    pub metrics_listen: Option<String>,
    /// Serve the API on a non-loopback `--listen` without client certificates: anyone who
    /// reaches the port can reserve hugepages. Refused without this flag.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_ALLOW_UNAUTHENTICATED_CLIENTS",
        global = true
    )]
    pub allow_unauthenticated_clients: bool,
    /// Containers (app and init together) a pod may have in `POST /v1/admit` and
    /// `POST /v1/hints`; a pod with more is refused (413). This bounds the work one request may
    /// cause: real pods have a handful, a few dozen at the most.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_CONTAINERS",
        default_value_t = DEFAULT_MAX_CONTAINERS,
        value_parser = clap::value_parser!(u32).range(1..=MAX_OBJECTS as i64),
        global = true
    )]
    pub max_containers: u32,
    /// Connections each listener (`--listen`, `--metrics-listen`, the webhook's) keeps open at
    /// once; one more is accepted and closed at once with a reset, and counted. Default: 1024
    /// for `run`, 256 for `webhook` (its clients are the API servers, one HTTP/2 connection
    /// each, the schedulers, probes and Prometheus; each connection may hold 128 KiB of HTTP/2
    /// data besides the body budget).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_MAX_CONNECTIONS",
        value_parser = clap::value_parser!(u32).range(1..),
        global = true
    )]
    pub max_connections: Option<u32>,
    /// How long a connection may take to send a request's complete head, counted from when it
    /// is ready for one: a new connection, or a keep-alive one after its last answer, so an idle
    /// connection is closed after it too. Ends slow heads (slowloris).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HEADER_READ_TIMEOUT",
        default_value = "30s",
        global = true
    )]
    pub header_read_timeout: String,
    /// How long a request's body may take to arrive after its head; past it the request is
    /// answered 408 and the connection closed.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_BODY_READ_TIMEOUT",
        default_value = "30s",
        global = true
    )]
    pub body_read_timeout: String,
    /// HTTP/2 streams one connection may have open at once (the webhook's listener).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_CONCURRENT_STREAMS",
        default_value_t = 100,
        value_parser = clap::value_parser!(u32).range(1..),
        global = true
    )]
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 streams a client may reset before they are served (rapid reset,
    /// CVE-2023-44487) before the connection is ended with GOAWAY.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_PENDING_RESET_STREAMS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..),
        global = true
    )]
    pub http2_max_pending_reset_streams: u32,
    /// HTTP/2 streams the server may reset for a client's errors ("MadeYouReset",
    /// CVE-2025-8671) before the connection is ended with GOAWAY.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_HTTP2_MAX_LOCAL_RESET_STREAMS",
        default_value_t = 1024,
        value_parser = clap::value_parser!(u32).range(1..),
        global = true
    )]
    pub http2_max_local_reset_streams: u32,
    /// How long a peer (IP address) whose HTTP/2 connection was ended for abuse (GOAWAY
    /// ENHANCE_YOUR_CALM) is refused at accept; twice as long for each further abuse, up to 64
    /// times; 0s turns it off.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_ABUSE_BACKOFF",
        default_value = "1s",
        global = true
    )]
    pub abuse_backoff: String,
    /// Bytes of request bodies the listener holds at once, all connections together (e.g. 64Mi):
    /// a body that finds no room within a second is answered 503 with Retry-After. Default:
    /// 16Mi for `run` (sixteen of its largest bodies), 64Mi for `webhook` (within its
    /// Deployment's 256Mi memory limit).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_BODY_BUDGET",
        value_name = "BYTES",
        global = true
    )]
    pub body_budget: Option<String>,
    /// How often sysfs and the cgroup tree are re-read in full (e.g. 10s, 500ms, 1m).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_RECONCILE_INTERVAL",
        default_value = "10s",
        global = true
    )]
    pub reconcile_interval: String,
    #[arg(long, env = "HUGEPAGE_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Override of the MemoryManagerHugepagesVerification gate: off admits every request without
    /// reading sysfs (default: the kubelet's gate when it sets it, else on).
    #[arg(long, env = "HUGEPAGE_AGENT_VERIFICATION", value_enum, global = true)]
    pub verification: Option<Gate>,
    /// kep: available = free_hugepages; strict: minus pages reserved by mappings but not faulted.
    #[arg(long, env = "HUGEPAGE_AGENT_VERIFICATION_MODE", value_enum, default_value_t = Mode::Kep, global = true)]
    pub verification_mode: Mode,
    /// How long an admitted pod's hugepages stay reserved if its cgroup never faults them (e.g. 30s).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_RESERVATION_TTL",
        default_value = "30s",
        global = true
    )]
    pub reservation_ttl: String,
    /// Where state that must survive a restart (reservations) is kept.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_STATE_DIR",
        default_value = "/var/lib/hugepage-agent",
        global = true
    )]
    pub state_dir: PathBuf,
    /// PSI memory threshold in percent: `some` avg60 (and avg10) at or above it sets the
    /// *MemoryContentionPressure conditions.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_PSI_MEMORY_THRESHOLD",
        default_value_t = 10.0,
        global = true
    )]
    pub psi_memory_threshold: f64,
    /// PSI io threshold in percent, for the *DiskContentionPressure conditions.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_PSI_IO_THRESHOLD",
        default_value_t = 25.0,
        global = true
    )]
    pub psi_io_threshold: f64,
    /// How often pressure is read when no PSI trigger fires (e.g. 5s).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_PSI_INTERVAL",
        default_value = "5s",
        global = true
    )]
    pub psi_interval: String,
    /// Refuse admission of hugepage pods while a *MemoryContentionPressure condition is True.
    #[arg(long, env = "HUGEPAGE_AGENT_REJECT_UNDER_PRESSURE", global = true)]
    pub reject_under_pressure: bool,
    /// When a sysfs file cannot be read during verification: admit (the KEP's choice) or reject.
    #[arg(long, env = "HUGEPAGE_AGENT_ON_SYSFS_ERROR", value_enum, default_value_t = OnSysfsError::Admit, global = true)]
    pub on_sysfs_error: OnSysfsError,
    /// Override of the kubelet's Topology Manager policy (default: the node's kubelet's).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_TOPOLOGY_POLICY",
        value_enum,
        global = true
    )]
    pub topology_policy: Option<Policy>,
    /// Override of the kubelet's `--topology-manager-policy-options`, e.g.
    /// `prefer-closest-numa-nodes=true`.
    #[arg(long, env = "HUGEPAGE_AGENT_TOPOLOGY_POLICY_OPTIONS", global = true)]
    pub topology_policy_options: Option<String>,
    /// Override of the kubelet's Topology Manager scope: container or pod.
    #[arg(long, env = "HUGEPAGE_AGENT_TOPOLOGY_SCOPE", value_parser = parse_scope, global = true)]
    pub topology_scope: Option<Scope>,
    /// Override of the kubelet's Memory Manager policy: None (nothing pinned: verified on every
    /// NUMA node) or Static.
    #[arg(long, env = "HUGEPAGE_AGENT_MEMORY_MANAGER_POLICY", global = true)]
    pub memory_manager_policy: Option<String>,
    /// The kubelet Memory Manager checkpoint (default: <host-root>/var/lib/kubelet/memory_manager_state).
    #[arg(long, env = "HUGEPAGE_AGENT_KUBELET_STATE", global = true)]
    pub kubelet_state: Option<PathBuf>,
    /// The kubelet's configuration file (a host path) when no kubelet process is found (default:
    /// the first of the places installers write it).
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_KUBELET_CONFIG",
        value_name = "FILE",
        global = true
    )]
    pub kubelet_config: Option<PathBuf>,
    /// Override of the kubelet's `--reserved-memory`, used when there is no checkpoint, e.g.
    /// `0:memory=1Gi,hugepages-1Gi=2Gi`; repeat or separate nodes with `;`.
    #[arg(
        long,
        env = "HUGEPAGE_AGENT_RESERVED_MEMORY",
        value_delimiter = ' ',
        global = true
    )]
    pub reserved_memory: Vec<String>,
    /// Override of kubelet feature gates the agent mirrors, e.g.
    /// `PodLevelResources=true,MemoryManagerHugepagesVerification=false`; each gate named
    /// replaces the kubelet's.
    #[arg(long, env = "HUGEPAGE_AGENT_FEATURE_GATES", global = true)]
    pub feature_gates: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// The agent: probes, the hugepage map, logs of faults and cgroup events (the default).
    Run,
    /// Print the per-NUMA hugepage table of this host.
    Status {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show a running agent's map instead of reading this host, e.g. http://127.0.0.1:9820.
        #[arg(long, value_name = "URL")]
        from: Option<String>,
    },
    /// Verify one request against this host's sysfs: exit 0 admitted, 1 rejected, 2 bad input.
    Check {
        /// `hugepages-<size>=<quantity>`, e.g. `hugepages-2Mi=4Gi`; repeat for several sizes.
        #[arg(long = "request", required = true)]
        requests: Vec<String>,
        /// NUMA nodes to check, e.g. `0,1` (default: every node).
        #[arg(long)]
        numa: Option<String>,
        /// Topology Manager policy for picking NUMA nodes when `--numa` is not given (default:
        /// the node's kubelet's, or `--topology-policy`).
        #[arg(long, value_enum)]
        policy: Option<Policy>,
        /// The whole answer as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The kubelet Memory Manager's topology hints for a pod on a given state, as JSON.
    Hints {
        /// A kubelet checkpoint (`memory_manager_state`, checksum verified) or the same JSON
        /// without `checksum` (hand-written, not verified).
        #[arg(long, value_name = "STATE.json")]
        state: PathBuf,
        /// A `v1.Pod` as JSON.
        #[arg(long, value_name = "POD.json")]
        pod: PathBuf,
        /// The container to hint for in container scope (default: the only app container).
        #[arg(long)]
        container: Option<String>,
        /// Topology Manager scope (default: `--topology-scope`).
        #[arg(long, value_parser = parse_scope)]
        scope: Option<Scope>,
    },
    /// The Topology Manager's merge of given hints under a policy, as JSON.
    Merge {
        /// `{"policy":…,"policyOptions":{…},"numaNodes":[…],"distances":{…},"providers":[…]}`.
        #[arg(long, value_name = "MERGE.json")]
        input: PathBuf,
    },
    /// The cluster side: a kube-scheduler extender (`/scheduler/filter`,
    /// `/scheduler/prioritize`) over HTTPS on `--listen` (`--tls-cert-file`,
    /// `--tls-private-key-file`), asking the node agents over mTLS.
    Webhook {
        /// The port every node's agent listens on, at the node's first InternalIP.
        #[arg(long, env = "HUGEPAGE_AGENT_AGENT_PORT", default_value_t = 9820, value_parser = clap::value_parser!(u16).range(1..))]
        agent_port: u16,
        /// PEM CA certificates the agents' server certificates chain to.
        #[arg(long, env = "HUGEPAGE_AGENT_AGENT_CA_FILE", value_name = "PATH")]
        agent_ca_file: PathBuf,
        /// PEM client certificate the webhook presents to the agents (the leaf first).
        #[arg(
            long,
            env = "HUGEPAGE_AGENT_AGENT_CLIENT_CERT_FILE",
            value_name = "PATH"
        )]
        agent_client_cert_file: PathBuf,
        /// PEM private key of `--agent-client-cert-file`.
        #[arg(
            long,
            env = "HUGEPAGE_AGENT_AGENT_CLIENT_KEY_FILE",
            value_name = "PATH"
        )]
        agent_client_key_file: PathBuf,
        /// When an agent does not answer in time: ignore (keep the node) or fail (filter it out).
        #[arg(long, env = "HUGEPAGE_AGENT_FAILURE_POLICY", value_enum, default_value_t = FailurePolicy::Ignore)]
        failure_policy: FailurePolicy,
        /// One deadline for all the agent calls of one scheduler call (e.g. 2s, 500ms).
        #[arg(long, env = "HUGEPAGE_AGENT_AGENT_TIMEOUT", default_value = "2s")]
        agent_timeout: String,
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
        extender_body_limit: String,
        /// kubeconfig of the Kubernetes API (its current context); without it, the in-cluster
        /// configuration of the pod the webhook runs in.
        #[arg(long, env = "HUGEPAGE_AGENT_KUBECONFIG", value_name = "PATH")]
        kubeconfig: Option<PathBuf>,
    },
}

fn parse_scope(text: &str) -> Result<Scope, String> {
    text.parse()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EbpfMode {
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Run,
    Status {
        json: bool,
        from: Option<AgentUrl>,
    },
    Check {
        requests: Vec<String>,
        numa: Option<String>,
        policy: Option<Policy>,
        json: bool,
    },
    Hints {
        state: PathBuf,
        pod: PathBuf,
        container: Option<String>,
        scope: Scope,
    },
    Merge {
        input: PathBuf,
    },
    Webhook(webhook::Settings),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--host-root {0}: not a directory")]
    HostRoot(PathBuf),
    #[error(transparent)]
    From(#[from] ClientError),
    #[error("--listen {0:?}: expected an address and port such as 127.0.0.1:9820 or [::]:9820")]
    Listen(String),
    #[error("{flag} {value:?}: {reason}")]
    Interval {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{flag} {value}: expected a percentage above 0 and at most 100")]
    Threshold { flag: &'static str, value: String },
    #[error(transparent)]
    Traces(#[from] TracesError),
    #[error(transparent)]
    Kubelet(#[from] LayerError),
    #[error(
        "--feature-gates: unrecognized feature gate {0:?}: the agent mirrors MemoryManagerHugepagesVerification, PodLevelResources and PodLevelResourceManagers"
    )]
    UnknownGate(String),
    #[error("{given} needs {missing}: a certificate and its private key go together")]
    TlsPair {
        given: &'static str,
        missing: &'static str,
    },
    #[error(
        "--client-ca-file needs --tls-cert-file and --tls-private-key-file: client certificates are asked for in the TLS handshake"
    )]
    ClientCaWithoutTls,
    #[error("--metrics-listen {0:?}: expected an address and port such as 0.0.0.0:9821")]
    MetricsListen(String),
    #[error("--metrics-listen {0}: the address of --listen; give it a port of its own")]
    SameListen(std::net::SocketAddr),
    #[error(
        "webhook needs --tls-cert-file and --tls-private-key-file: the scheduler calls it over HTTPS"
    )]
    WebhookWithoutTls,
    #[error("{flag} {value:?}: {reason}")]
    Bytes {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "--body-budget {budget} is smaller than {flag} {limit}: a body at that limit could never be read"
    )]
    BudgetBelowLimit {
        budget: usize,
        flag: &'static str,
        limit: usize,
    },
    #[error(
        "--listen {0} is not a loopback address and no --client-ca-file is given: anyone who reaches it could reserve hugepages; give --client-ca-file with --tls-cert-file and --tls-private-key-file, listen on 127.0.0.1, or add --allow-unauthenticated-clients if that is meant"
    )]
    Unauthenticated(std::net::SocketAddr),
}

/// The TLS files the flags name: none, or a certificate and key (and maybe a client CA).
fn tls_files(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<TlsFiles>, ConfigError> {
    const CERT: &str = "--tls-cert-file";
    const KEY: &str = "--tls-private-key-file";
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert,
            key,
            client_ca,
        })),
        (Some(_), None) => Err(ConfigError::TlsPair {
            given: CERT,
            missing: KEY,
        }),
        (None, Some(_)) => Err(ConfigError::TlsPair {
            given: KEY,
            missing: CERT,
        }),
        (None, None) if client_ca.is_some() => Err(ConfigError::ClientCaWithoutTls),
        (None, None) => Ok(None),
    }
}

/// The refusal rule: an API beyond loopback requires client certificates, unless `allow`.
pub fn exposure(
    listen: std::net::SocketAddr,
    tls: Option<&TlsFiles>,
    allow: bool,
) -> Result<(), ConfigError> {
    let authenticated = tls.is_some_and(|t| t.client_ca.is_some());
    if listen.ip().to_canonical().is_loopback() || authenticated || allow {
        Ok(())
    } else {
        Err(ConfigError::Unauthenticated(listen))
    }
}

/// The agent's flags that override the kubelet's settings, as one layer over them.
fn flag_layer(cli: &Cli) -> Result<Layer, ConfigError> {
    fn at<T>(value: T, flag: &'static str) -> Sourced<T> {
        Sourced {
            value,
            source: Source::Flag(flag),
        }
    }
    let mut layer = Layer {
        policy: cli.topology_policy.map(|p| at(p, "--topology-policy")),
        scope: cli.topology_scope.map(|s| at(s, "--topology-scope")),
        ..Layer::default()
    };
    if let Some(text) = &cli.topology_policy_options {
        const FLAG: &str = "--topology-policy-options";
        let options = key_values(FLAG, text)?;
        check_options(FLAG, &options)?;
        layer.options = Some(at(options, FLAG));
    }
    if let Some(text) = &cli.memory_manager_policy {
        const FLAG: &str = "--memory-manager-policy";
        layer.memory_manager_policy = Some(at(parse_memory_manager_policy(FLAG, text)?, FLAG));
    }
    if !cli.reserved_memory.is_empty() {
        let reserved = cmdline::reserved_memory(&cli.reserved_memory)?;
        layer.reserved_memory = Some(at(reserved, "--reserved-memory"));
    }
    if let Some(text) = &cli.feature_gates {
        const FLAG: &str = "--feature-gates";
        for (name, value) in key_values(FLAG, text)? {
            let gate = MIRRORED_GATES
                .into_iter()
                .find(|g| *g == name)
                .ok_or_else(|| ConfigError::UnknownGate(name.clone()))?;
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(LayerError {
                        field: FLAG.into(),
                        detail: format!("{name}={value}: not true or false"),
                    }
                    .into());
                }
            };
            layer.gates.insert(gate, at(on, FLAG));
        }
    }
    if let Some(gate) = cli.verification {
        layer
            .gates
            .insert(VERIFICATION_GATE, at(gate == Gate::On, "--verification"));
    }
    Ok(layer)
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub command: Command,
    pub host: HostFs,
    pub listen: std::net::SocketAddr,
    pub api_threads: usize,
    /// The most containers a pod in a request may have (`--max-containers`).
    pub max_containers: usize,
    pub ebpf: EbpfMode,
    pub fault_scope: FaultScope,
    pub reconcile_interval: Duration,
    pub log_format: LogFormat,
    pub verification: Settings,
    pub psi: PsiConfig,
    pub reject_under_pressure: bool,
    pub reservation_ttl: Duration,
    pub state_dir: PathBuf,
    /// The agent's flags that override the node's kubelet settings.
    pub kubelet_flags: Layer,
    /// `--kubelet-config`: the file read when no kubelet process is found (a host path).
    pub kubelet_config: Option<PathBuf>,
    /// The kubelet Memory Manager checkpoint, as a path on this machine.
    pub kubelet_state: PathBuf,
    /// OpenTelemetry export, from the standard `OTEL_*` variables.
    pub traces: TraceConfig,
    /// TLS for the API listener.
    pub tls: Option<TlsFiles>,
    /// The plain listener for `/metrics`, `/healthz`, `/readyz`.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `--allow-unauthenticated-clients`: the API beyond loopback without client certificates.
    pub allow_unauthenticated_clients: bool,
    /// What every listener tolerates of its clients (`--max-connections`, the time-outs, the
    /// HTTP/2 limits).
    pub limits: Limits,
}

impl Config {
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
}

impl TryFrom<Cli> for Config {
    type Error = ConfigError;

    fn try_from(cli: Cli) -> Result<Config, ConfigError> {
        if !cli.host_root.is_dir() {
            return Err(ConfigError::HostRoot(cli.host_root));
        }
        let reconcile_interval = duration("--reconcile-interval", &cli.reconcile_interval, |d| {
            d.is_zero().then(|| "must be above zero".to_owned())
        })?;
        let reservation_ttl = duration("--reservation-ttl", &cli.reservation_ttl, |d| {
            d.is_zero().then(|| "must be above zero".to_owned())
        })?;
        let psi_interval = duration("--psi-interval", &cli.psi_interval, |d| {
            (d < Duration::from_millis(100)).then(|| "must be at least 100ms".to_owned())
        })?;
        for (flag, value) in [
            ("--psi-memory-threshold", cli.psi_memory_threshold),
            ("--psi-io-threshold", cli.psi_io_threshold),
        ] {
            if !(value > 0.0 && value <= 100.0) {
                return Err(ConfigError::Threshold {
                    flag,
                    value: value.to_string(),
                });
            }
        }
        let mut limits = limits(&cli)?;
        let traces = TraceConfig::from_env()?;
        let listen = cli
            .listen
            .parse()
            .map_err(|_| ConfigError::Listen(cli.listen.clone()))?;
        let metrics_listen = cli
            .metrics_listen
            .as_deref()
            .map(|text| {
                text.parse::<std::net::SocketAddr>()
                    .map_err(|_| ConfigError::MetricsListen(text.to_owned()))
            })
            .transpose()?;
        if let Some(metrics) = metrics_listen
            && metrics == listen
            && metrics.port() != 0
        {
            return Err(ConfigError::SameListen(metrics));
        }
        let kubelet_flags = flag_layer(&cli)?;
        let tls = tls_files(
            cli.tls_cert_file,
            cli.tls_private_key_file,
            cli.client_ca_file,
        )?;
        if matches!(cli.command, None | Some(CliCommand::Run)) {
            exposure(listen, tls.as_ref(), cli.allow_unauthenticated_clients)?;
        }
        let command = match cli.command {
            None | Some(CliCommand::Run) => Command::Run,
            Some(CliCommand::Status { json, from }) => Command::Status {
                json,
                from: from.as_deref().map(AgentUrl::parse).transpose()?,
            },
            Some(CliCommand::Check {
                requests,
                numa,
                policy,
                json,
            }) => Command::Check {
                requests,
                numa,
                policy,
                json,
            },
            Some(CliCommand::Hints {
                state,
                pod,
                container,
                scope,
            }) => Command::Hints {
                state,
                pod,
                container,
                scope: scope.or(cli.topology_scope).unwrap_or(Scope::Container),
            },
            Some(CliCommand::Merge { input }) => Command::Merge { input },
            Some(CliCommand::Webhook {
                agent_port,
                agent_ca_file,
                agent_client_cert_file,
                agent_client_key_file,
                failure_policy,
                agent_timeout,
                extender_body_limit,
                kubeconfig,
            }) => Command::Webhook(webhook::Settings {
                kubeconfig,
                extender_body_limit: bytes("--extender-body-limit", &extender_body_limit)?,
                tls: tls.clone().ok_or(ConfigError::WebhookWithoutTls)?,
                agent_port,
                agent_tls: ClientFiles {
                    ca: agent_ca_file,
                    cert: agent_client_cert_file,
                    key: agent_client_key_file,
                },
                failure_policy,
                agent_timeout: duration("--agent-timeout", &agent_timeout, |d| {
                    d.is_zero().then(|| "must be above zero".to_owned())
                })?,
            }),
        };
        let (default_budget, default_connections, largest) = match &command {
            Command::Webhook(settings) => (
                WEBHOOK_BODY_BUDGET,
                WEBHOOK_MAX_CONNECTIONS,
                (
                    "--extender-body-limit",
                    settings
                        .extender_body_limit
                        .max(webhook::routes::ADMISSION_REVIEW_LIMIT),
                ),
            ),
            _ => (
                AGENT_BODY_BUDGET,
                Limits::DEFAULT.max_connections,
                ("the body limit of /v1", BODY_LIMIT),
            ),
        };
        if cli.max_connections.is_none() {
            limits.max_connections = default_connections;
        }
        limits.body_budget = match cli.body_budget.as_deref() {
            Some(text) => bytes("--body-budget", text)?,
            None => default_budget,
        };
        if limits.body_budget < largest.1 {
            return Err(ConfigError::BudgetBelowLimit {
                budget: limits.body_budget,
                flag: largest.0,
                limit: largest.1,
            });
        }
        let host = HostFs::new(cli.host_root.clone());
        let kubelet_state = cli
            .kubelet_state
            .clone()
            .unwrap_or_else(|| host.path("/var/lib/kubelet/memory_manager_state"));
        Ok(Config {
            listen,
            api_threads: usize::from(cli.api_threads),
            max_containers: usize::try_from(cli.max_containers).unwrap_or(usize::MAX),
            command,
            host,
            kubelet_flags,
            kubelet_config: cli.kubelet_config,
            kubelet_state,
            ebpf: cli.ebpf,
            fault_scope: cli.fault_scope,
            reconcile_interval,
            log_format: cli.log_format,
            psi: PsiConfig {
                memory_threshold: cli.psi_memory_threshold,
                io_threshold: cli.psi_io_threshold,
                interval: psi_interval,
            },
            reject_under_pressure: cli.reject_under_pressure,
            reservation_ttl,
            state_dir: cli.state_dir,
            traces,
            tls,
            metrics_listen,
            allow_unauthenticated_clients: cli.allow_unauthenticated_clients,
            limits,
            verification: Settings {
                gate: cli.verification.unwrap_or(Gate::On),
                mode: cli.verification_mode,
                on_sysfs_error: cli.on_sysfs_error,
            },
        })
    }
}

/// The listeners' limits the flags set.
fn limits(cli: &Cli) -> Result<Limits, ConfigError> {
    let above_zero = |d: Duration| d.is_zero().then(|| "must be above zero".to_owned());
    let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
    Ok(Limits {
        // Set by the command, as the body budget: its default differs.
        max_connections: cli.max_connections.map_or(0, count),
        header_read_timeout: duration(
            "--header-read-timeout",
            &cli.header_read_timeout,
            above_zero,
        )?,
        body_read_timeout: duration("--body-read-timeout", &cli.body_read_timeout, above_zero)?,
        http2_max_concurrent_streams: cli.http2_max_concurrent_streams,
        http2_max_pending_reset_streams: count(cli.http2_max_pending_reset_streams),
        http2_max_local_reset_streams: count(cli.http2_max_local_reset_streams),
        abuse_backoff: duration("--abuse-backoff", &cli.abuse_backoff, |d| {
            (d > MAX_ABUSE_BACKOFF).then(|| {
                format!(
                    "must be at most {}",
                    humantime::format_duration(MAX_ABUSE_BACKOFF)
                )
            })
        })?,
        body_budget: 0,
    })
}

/// A size flag: a Kubernetes quantity of bytes (`64Mi`, `8388608`), above zero and at most
/// [`budget::MAX_BYTES`].
fn bytes(flag: &'static str, text: &str) -> Result<usize, ConfigError> {
    let invalid = |reason: String| ConfigError::Bytes {
        flag,
        value: text.to_owned(),
        reason,
    };
    let n = parse_bytes(text).map_err(|e| invalid(e.to_string()))?;
    if n == 0 || n > budget::MAX_BYTES {
        return Err(invalid(format!(
            "must be above 0 and at most {}",
            format_binary(budget::MAX_BYTES)
        )));
    }
    usize::try_from(n).map_err(|e| invalid(e.to_string()))
}

/// A duration flag: parsed, then `reject` says what is wrong with the value, if anything.
fn duration(
    flag: &'static str,
    text: &str,
    reject: impl Fn(Duration) -> Option<String>,
) -> Result<Duration, ConfigError> {
    parse_duration(text)
        .and_then(|d| reject(d).map_or(Ok(d), Err))
        .map_err(|reason| ConfigError::Interval {
            flag,
            value: text.to_owned(),
            reason,
        })
}

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h` (`30s`, `500ms`, `1.5m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| "needs a unit: ms, s, m or h".to_owned())?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubeletconfig::settings::VERIFICATION_GATE;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("hugepage-agent").chain(args.iter().copied()))
            .expect("parse")
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").unwrap_err().contains("needs a unit"));
        assert!(
            parse_duration("10d")
                .unwrap_err()
                .contains("unknown unit \"d\"")
        );
        assert!(parse_duration("s").unwrap_err().contains("not a number"));
    }

    #[test]
    fn no_subcommand_means_run_and_flags_work_on_either_side() {
        let config = Config::try_from(cli(&["--ebpf", "off"])).expect("valid");
        assert_eq!((config.command, config.ebpf), (Command::Run, EbpfMode::Off));
        let config =
            Config::try_from(cli(&["status", "--json", "--host-root", "/"])).expect("valid");
        assert_eq!(
            config.command,
            Command::Status {
                json: true,
                from: None
            }
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        let err = Config::try_from(cli(&["--host-root", "/no/such/dir"])).unwrap_err();
        assert_eq!(err.to_string(), "--host-root /no/such/dir: not a directory");
        let err = Config::try_from(cli(&["--reconcile-interval", "0s"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--reconcile-interval \"0s\": must be above zero"
        );
        assert!(Cli::try_parse_from(["hugepage-agent", "--ebpf", "maybe"]).is_err());
        let err = Config::try_from(cli(&["status", "--from", "node-1:9820"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--from \"node-1:9820\": expected an http:// URL such as http://127.0.0.1:9820"
        );
        let err = Config::try_from(cli(&["--psi-memory-threshold", "0"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--psi-memory-threshold 0: expected a percentage above 0 and at most 100"
        );
        let err = Config::try_from(cli(&["--psi-io-threshold", "101"])).unwrap_err();
        assert!(
            err.to_string().starts_with("--psi-io-threshold 101"),
            "{err}"
        );
        let err = Config::try_from(cli(&["--psi-interval", "10ms"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--psi-interval \"10ms\": must be at least 100ms"
        );
        let err = Config::try_from(cli(&["--listen", "localhost"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--listen \"localhost\": expected an address and port such as 127.0.0.1:9820 or [::]:9820"
        );
        for threads in ["0", "65", "two"] {
            let err = Cli::try_parse_from(["hugepage-agent", "--api-threads", threads])
                .expect_err("out of range");
            assert!(
                err.to_string().contains("'--api-threads <API_THREADS>'"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_kubelet_setting_flags_are_overrides_with_no_default_of_their_own() {
        let config = Config::try_from(cli(&[])).expect("valid");
        assert_eq!(config.kubelet_flags, Layer::default());
        assert_eq!(config.verification.gate, Gate::On);
        let config = Config::try_from(cli(&[
            "--topology-policy",
            "best-effort",
            "--memory-manager-policy",
            "Static",
            "--feature-gates",
            "PodLevelResources=true,MemoryManagerHugepagesVerification=true",
            "--verification",
            "off",
            "--reserved-memory",
            "0:memory=1Gi",
            "--kubelet-config",
            "/etc/kubernetes/kubelet/config.json",
        ]))
        .expect("valid");
        let flags = &config.kubelet_flags;
        let policy = flags.policy.as_ref().expect("policy");
        assert_eq!(
            (policy.value, &policy.source),
            (Policy::BestEffort, &Source::Flag("--topology-policy"))
        );
        assert!(flags.scope.is_none() && flags.options.is_none());
        let gate = &flags.gates[VERIFICATION_GATE];
        assert_eq!(
            (gate.value, &gate.source),
            (false, &Source::Flag("--verification")),
            "--verification wins over --feature-gates"
        );
        assert!(flags.gates["PodLevelResources"].value);
        assert_eq!(
            flags
                .reserved_memory
                .as_ref()
                .map(|r| r.value[&0]["memory"]),
            Some(1 << 30)
        );
        assert_eq!(
            config.kubelet_config.as_deref(),
            Some(std::path::Path::new("/etc/kubernetes/kubelet/config.json"))
        );
        for (args, expected) in [
            (
                ["--feature-gates", "CPUManager=true"],
                "--feature-gates: unrecognized feature gate \"CPUManager\"",
            ),
            (
                ["--memory-manager-policy", "static"],
                "--memory-manager-policy: \"static\" is not None or Static",
            ),
            (
                ["--topology-policy-options", "closest=true"],
                "--topology-policy-options: unknown topology policy option \"closest\"",
            ),
            (
                ["--reserved-memory", "memory=1Gi"],
                "--reserved-memory: \"memory=1Gi\": expected <numa node>:<type>=<quantity>",
            ),
        ] {
            let err = Config::try_from(cli(&args)).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn one_api_thread_unless_told() {
        assert_eq!(Config::try_from(cli(&[])).expect("valid").api_threads, 1);
        let config = Config::try_from(cli(&["--api-threads", "4"])).expect("valid");
        assert_eq!(config.api_threads, 4);
    }

    #[test]
    fn the_api_beyond_loopback_needs_client_certificates_or_the_opt_out() {
        let err = Config::try_from(cli(&["--listen", "0.0.0.0:9820"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--listen 0.0.0.0:9820 is not a loopback address and no --client-ca-file is given: anyone who reaches it could reserve hugepages; give --client-ca-file with --tls-cert-file and --tls-private-key-file, listen on 127.0.0.1, or add --allow-unauthenticated-clients if that is meant"
        );
        let tls = [
            "--tls-cert-file",
            "c.pem",
            "--tls-private-key-file",
            "k.pem",
        ];
        let without_ca =
            Config::try_from(cli(&[&["run", "--listen", "[::]:9820"][..], &tls].concat()));
        assert_eq!(
            without_ca.unwrap_err(),
            ConfigError::Unauthenticated("[::]:9820".parse().expect("address")),
            "TLS without client certificates lets anyone in as well"
        );
        for listen in [
            "127.0.0.1:9820",
            "127.1.2.3:9820",
            "[::1]:9820",
            "[::ffff:127.0.0.1]:9820",
        ] {
            Config::try_from(cli(&["--listen", listen])).expect("loopback needs no client CA");
        }
        let config = Config::try_from(cli(&[
            &["--listen", "0.0.0.0:9820"][..],
            &tls,
            &["--client-ca-file", "ca.pem"],
        ]
        .concat()))
        .expect("client certificates required");
        assert_eq!(
            config.tls,
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: Some("ca.pem".into()),
            })
        );
        let config = Config::try_from(cli(&[
            "--listen",
            "10.0.0.5:9820",
            "--allow-unauthenticated-clients",
        ]))
        .expect("the operator means it");
        assert!(config.allow_unauthenticated_clients && config.tls.is_none());
        Config::try_from(cli(&["status", "--listen", "0.0.0.0:9820"]))
            .expect("only the agent itself listens");
    }

    #[test]
    fn tls_flags_go_together() {
        let err = Config::try_from(cli(&["--tls-cert-file", "c.pem"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--tls-cert-file needs --tls-private-key-file: a certificate and its private key go together"
        );
        let err = Config::try_from(cli(&["--tls-private-key-file", "k.pem"])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--tls-private-key-file needs --tls-cert-file"),
            "{err}"
        );
        let err = Config::try_from(cli(&["--client-ca-file", "ca.pem"])).unwrap_err();
        assert_eq!(err, ConfigError::ClientCaWithoutTls);
        let config = Config::try_from(cli(&[])).expect("valid");
        assert_eq!((config.tls, config.metrics_listen), (None, None));
    }

    #[test]
    fn the_metrics_listener_has_an_address_of_its_own() {
        let config = Config::try_from(cli(&["--metrics-listen", "0.0.0.0:9821"])).expect("valid");
        assert_eq!(
            config.metrics_listen,
            Some("0.0.0.0:9821".parse().expect("address"))
        );
        let err = Config::try_from(cli(&["--metrics-listen", ":9821"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--metrics-listen \":9821\": expected an address and port such as 0.0.0.0:9821"
        );
        let err = Config::try_from(cli(&["--metrics-listen", "127.0.0.1:9820"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--metrics-listen 127.0.0.1:9820: the address of --listen; give it a port of its own"
        );
    }

    #[test]
    fn the_webhook_needs_its_certificate_and_the_agents_files() {
        let agents = [
            "--agent-ca-file",
            "ca.pem",
            "--agent-client-cert-file",
            "client.pem",
            "--agent-client-key-file",
            "client-key.pem",
        ];
        let tls = [
            "--tls-cert-file",
            "c.pem",
            "--tls-private-key-file",
            "k.pem",
        ];
        let config = Config::try_from(cli(&[
            &["webhook", "--listen", "0.0.0.0:8443"][..],
            &agents,
            &tls,
        ]
        .concat()))
        .expect("valid");
        let Command::Webhook(settings) = config.command else {
            panic!("not the webhook: {:?}", config.command);
        };
        assert_eq!(
            (
                settings.agent_port,
                settings.failure_policy,
                settings.agent_timeout
            ),
            (9820, FailurePolicy::Ignore, Duration::from_secs(2)),
            "the defaults"
        );
        assert_eq!(settings.agent_tls.cert, PathBuf::from("client.pem"));
        assert_eq!(settings.tls.cert, PathBuf::from("c.pem"));
        assert_eq!(
            (
                settings.extender_body_limit,
                config.limits.body_budget,
                config.limits.max_connections
            ),
            (8 << 20, WEBHOOK_BODY_BUDGET, WEBHOOK_MAX_CONNECTIONS),
            "the webhook's own defaults"
        );
        let err = Config::try_from(cli(&[&["webhook"][..], &agents].concat())).unwrap_err();
        assert_eq!(err, ConfigError::WebhookWithoutTls);
        let err = Config::try_from(cli(&[
            &["webhook", "--agent-timeout", "0s"][..],
            &agents,
            &tls,
        ]
        .concat()))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--agent-timeout \"0s\": must be above zero"
        );
        let config = Config::try_from(cli(&[
            &[
                "webhook",
                "--failure-policy",
                "fail",
                "--agent-port",
                "10250",
            ][..],
            &agents,
            &tls,
        ]
        .concat()))
        .expect("valid");
        assert!(matches!(
            config.command,
            Command::Webhook(webhook::Settings {
                agent_port: 10250,
                failure_policy: FailurePolicy::Fail,
                ..
            })
        ));
        for bad in [
            &["webhook", "--failure-policy", "open"][..],
            &["webhook", "--agent-port", "0"],
        ] {
            assert!(
                Cli::try_parse_from(
                    std::iter::once("hugepage-agent")
                        .chain(bad.iter().copied())
                        .chain(agents)
                )
                .is_err()
            );
        }
        assert!(
            Cli::try_parse_from(["hugepage-agent", "webhook"]).is_err(),
            "the agents' files are required"
        );
    }

    /// Bug (#38): nothing bounded the bytes of all request bodies together.
    #[test]
    fn the_body_budget_is_a_quantity_no_smaller_than_the_largest_body_it_must_hold() {
        let budget = |args: &[&str]| Config::try_from(cli(args)).map(|c| c.limits.body_budget);
        assert_eq!(budget(&[]), Ok(AGENT_BODY_BUDGET));
        assert_eq!(budget(&["--body-budget", "32Mi"]), Ok(32 << 20));
        assert_eq!(
            budget(&["--body-budget", "512Ki"]).map_err(|e| e.to_string()),
            Err("--body-budget 524288 is smaller than the body limit of /v1 1048576: a body at that limit could never be read".to_owned())
        );
        for bad in ["0", "-1Mi", "lots", "5Gi"] {
            let err = budget(&[&format!("--body-budget={bad}")])
                .expect_err(bad)
                .to_string();
            assert!(
                err.starts_with(&format!("--body-budget {bad:?}: ")),
                "{err}"
            );
        }
        let webhook = |more: &[&str]| {
            let args = [
                &[
                    "webhook",
                    "--tls-cert-file",
                    "c",
                    "--tls-private-key-file",
                    "k",
                ][..],
                &["--agent-ca-file", "a", "--agent-client-cert-file", "b"],
                &["--agent-client-key-file", "d"],
                more,
            ]
            .concat();
            Config::try_from(cli(&args)).map(|c| c.limits.body_budget)
        };
        assert_eq!(webhook(&[]), Ok(WEBHOOK_BODY_BUDGET));
        let err = webhook(&["--extender-body-limit", "100Mi"]).expect_err("over the budget");
        assert_eq!(
            err,
            ConfigError::BudgetBelowLimit {
                budget: WEBHOOK_BODY_BUDGET,
                flag: "--extender-body-limit",
                limit: 100 << 20
            }
        );
        assert_eq!(
            webhook(&["--extender-body-limit", "100Mi", "--body-budget", "400Mi"]),
            Ok(400 << 20)
        );
    }

    #[test]
    fn the_listeners_limits_have_their_defaults_unless_told() {
        let config = Config::try_from(cli(&[])).expect("valid");
        assert_eq!(config.limits, Limits::DEFAULT);
        let told = cli(&[
            "--max-connections",
            "8",
            "--header-read-timeout",
            "500ms",
            "--body-read-timeout",
            "2s",
            "--http2-max-concurrent-streams",
            "4",
            "--http2-max-pending-reset-streams",
            "5",
            "--http2-max-local-reset-streams",
            "6",
            "--abuse-backoff",
            "250ms",
        ]);
        let limits = Config::try_from(told).expect("valid").limits;
        assert_eq!(
            limits,
            Limits {
                max_connections: 8,
                header_read_timeout: Duration::from_millis(500),
                body_read_timeout: Duration::from_secs(2),
                http2_max_concurrent_streams: 4,
                http2_max_pending_reset_streams: 5,
                http2_max_local_reset_streams: 6,
                abuse_backoff: Duration::from_millis(250),
                body_budget: AGENT_BODY_BUDGET,
            }
        );
        let off = Config::try_from(cli(&["--abuse-backoff", "0s"])).expect("valid");
        assert_eq!(off.limits.abuse_backoff, Duration::ZERO);
        let most = Config::try_from(cli(&["--abuse-backoff", "1h"])).expect("valid");
        assert_eq!(most.limits.abuse_backoff, MAX_ABUSE_BACKOFF);
        let err = Config::try_from(cli(&["--abuse-backoff", "61m"])).expect_err("too long");
        assert_eq!(
            err.to_string(),
            "--abuse-backoff \"61m\": must be at most 1h",
            "the flag, its value and the most"
        );
        let zero = cli(&["--body-read-timeout", "0s"]);
        let err = Config::try_from(zero).expect_err("zero");
        assert!(err.to_string().starts_with("--body-read-timeout "), "{err}");
        let none = ["hugepage-agent", "--max-connections", "0"];
        assert!(Cli::try_parse_from(none).is_err(), "no connections at all");
    }

    #[test]
    fn a_pod_may_have_256_containers_unless_told() {
        let config = Config::try_from(cli(&[])).expect("valid");
        assert_eq!(config.max_containers, 256);
        let config = Config::try_from(cli(&["--max-containers", "4000"])).expect("valid");
        assert_eq!(config.max_containers, 4000);
        for max in ["0", "1.5", "many"] {
            let err = Cli::try_parse_from(["hugepage-agent", "--max-containers", max])
                .expect_err("not a count");
            assert!(
                err.to_string()
                    .contains("'--max-containers <MAX_CONTAINERS>'"),
                "{err}"
            );
        }
    }
}
