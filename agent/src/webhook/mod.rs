//! `hugepage-agent webhook`: the cluster side. A kube-scheduler extender that asks the node
//! agents before a node is chosen, and a validating admission webhook that has the chosen
//! node's agent admit (and reserve) when the pod is bound. This module is the command's wiring:
//! the HTTPS listener
//! (`--listen`, `--tls-cert-file`, `--tls-private-key-file`, with `--client-ca-file` its callers'
//! certificates asked for and, with `--client-names`, their names checked; re-read on change by
//! [`crate::tls`]'s reloader; HTTP/2 and HTTP/1.1), the plain listener for probes and Prometheus
//! (`--metrics-listen`), the mTLS client of the agents ([`agents`],
//! over pooled connections ([`dial`]), its files re-read on change too ([`agent_tls`])), the
//! routes ([`routes`], each call continuing the caller's trace ([`trace`])), and the stop on
//! SIGINT or SIGTERM.
//!
//! What each part does: [`extender`] is the wire format of `k8s.io/kube-scheduler/extender/v1`;
//! [`pod`] and [`node`] read what the webhook needs of the pod and of each `Node` (its first
//! `InternalIP`, its allocatable hugepages); [`ask`] calls every candidate's agent at once under
//! one deadline; [`admission`] judges a binding ([`review`] is its wire format); [`mutate`]
//! gives a pod with hugepages the second scheduler; [`decide`]
//! turns the agents' answers into the filter's and prioritize's answers, plain functions with no
//! I/O; [`scheduler`] runs those steps for one call;
//! [`stream`] keeps a watch of every agent's map and [`table`] their states, from which the
//! extender answers where a state alone decides; [`metrics`] counts them.
//! The Kubernetes API is reached through [`kubeapi`] (`--kubeconfig`, else in-cluster); the Node
//! cache ([`cache`]) starts with the command and `/readyz` answers 200 once it has synced.

pub mod admission;
pub mod agent_pods;
pub mod agent_tls;
pub mod agents;
pub mod ask;
pub mod cache;
pub mod confirm;
pub mod context;
pub mod decide;
pub mod dial;
pub mod extender;
pub mod flags;
pub mod follow;
pub mod http1;
pub mod identity;
pub mod kubeapi;
pub mod metrics;
pub mod mutate;
pub mod node;
pub mod pod;
pub mod pool;
pub mod review;
pub mod routes;
pub mod scheduler;
pub mod skew;
pub mod stream;
pub mod table;
pub mod trace;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::ValueEnum;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
    task::JoinHandle,
};
use tracing::{info, warn};

use crate::{
    api::{
        budget::BodyBudget,
        server::{Callers, Endpoint, Limits, Server, ServerError, Serving},
    },
    telemetry::export::ExportStats,
    tls::{self, Alpn, TlsError, TlsFiles},
};

/// The listener's threads: the work is waiting on agents, so two serve many calls at once.
const THREADS: usize = 2;
/// How long calls in flight may take to finish after the stop signal.
const DRAIN: Duration = Duration::from_secs(5);

/// What the scheduler is told when an agent does not answer in time (or answers nonsense).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailurePolicy {
    /// Keep the node, and admit the binding with a warning: nothing else checks its hugepages
    /// (today's kubelets do not verify them at admission; KEP-5759 is a proposal), so a pod may
    /// then fail at its first hugetlb mapping or fault.
    Ignore,
    /// Filter the node out, with a message saying its agent did not answer.
    Fail,
}

/// The webhook's own settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where it listens (`--listen`).
    pub listen: SocketAddr,
    /// The plain listener for `/metrics`, `/healthz`, `/readyz` (`--metrics-listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// The names a caller's certificate must carry one of (`--client-names`); `None`: any
    /// certificate of `--client-ca-file` (in `tls`), or any caller without it.
    pub client_names: Option<Vec<String>>,
    /// What its listener tolerates of its clients.
    pub limits: Limits,
    /// Its serving certificate and key (`--tls-cert-file`, `--tls-private-key-file`).
    pub tls: TlsFiles,
    /// The port every node's agent listens on (`--agent-port`).
    pub agent_port: u16,
    /// The files of the client side of mTLS with the agents.
    pub agent_tls: agents::ClientFiles,
    /// The name each agent is verified by (`--agent-identity`, and the agents' pods under
    /// `per-pod`).
    pub agent_identity: identity::IdentityArgs,
    pub failure_policy: FailurePolicy,
    /// One deadline for all the agent calls of one scheduler call (`--agent-timeout`).
    pub agent_timeout: Duration,
    /// The largest `ExtenderArgs` body read (`--extender-body-limit`).
    pub extender_body_limit: usize,
    /// The Kubernetes API's kubeconfig (`--kubeconfig`); `None`: the in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// The scheduler `/admission/mutate` gives pods with hugepages (`--scheduler-name`).
    pub scheduler_name: String,
    /// The bound of a streamed state's freshness (`--stream-fresh-within`); `None`: no streams
    /// (`--agent-streams false`).
    pub streams: Option<Duration>,
    /// How long a binding's reservation may go unconfirmed by the API
    /// (`--reservation-confirm-within`).
    pub reservation_confirm_within: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    KubeApi(#[from] kubeapi::KubeApiError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs the webhook on its `--listen` over TLS, within its limits, until SIGINT or SIGTERM;
/// `/metrics` shows the trace exporter's `traces`.
pub fn run(settings: &Settings, traces: Arc<ExportStats>) -> Result<(), WebhookError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run_async(settings, traces))
}

async fn run_async(settings: &Settings, traces: Arc<ExportStats>) -> Result<(), WebhookError> {
    let (listen, limits) = (settings.listen, settings.limits);
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let metrics = Arc::new(metrics::Metrics::new(traces));
    let kube = kubeapi::client(settings.kubeconfig.as_deref()).await?;
    let (stop, stopped) = watch::channel(false);
    let (names, pod_watch) = names(&settings.agent_identity, &kube, &metrics, &stopped);
    let (client, client_reloader) = agents::Client::new(
        &settings.agent_tls,
        settings.agent_port,
        names,
        metrics.agent_tls.clone(),
    )?;
    let (server_tls, reloader) = tls::load(&settings.tls, Alpn::H2Http1, metrics.tls.clone())?;
    let endpoint = Endpoint {
        flag: "--listen",
        threads: "webhook",
    };
    let bound = Server::bind(endpoint, listen)?;
    let metrics_bound = settings
        .metrics_listen
        .map(|addr| Server::bind(Endpoint::METRICS, addr))
        .transpose()?;
    let addr = bound.addr();
    let (nodes, node_watch) = cache::NodeCache::start(
        kube.clone(),
        settings.agent_port,
        Arc::clone(&metrics),
        stopped.clone(),
    );
    let table = settings
        .streams
        .map(|fresh| Arc::new(table::Table::new(fresh)));
    let streams = table.as_ref().map(|table| {
        let run = stream::run(
            nodes.clone(),
            table.clone(),
            client.clone(),
            metrics.clone(),
            stopped.clone(),
        );
        tokio::spawn(run)
    });
    let pending = Arc::new(confirm::Pending::new(settings.reservation_confirm_within));
    let confirming = tokio::spawn(confirm::run(
        pending.clone(),
        kube.clone(),
        client.clone(),
        metrics.clone(),
        stopped.clone(),
    ));
    let connections = Arc::clone(&metrics.connections);
    let context = routes::Context {
        pending,
        table,
        client,
        policy: settings.failure_policy,
        timeout: settings.agent_timeout,
        metrics,
        nodes,
        kube,
        bodies: BodyBudget::shared(limits.body_budget, &connections),
        extender_body_limit: settings.extender_body_limit,
        scheduler_name: Arc::from(settings.scheduler_name.as_str()),
    };
    let watcher = tokio::spawn(reloader.watch(stopped.clone()));
    let client_watcher = tokio::spawn(client_reloader.watch(stopped.clone()));
    let callers = Callers {
        required: settings.client_names.clone().map(Into::into),
        writers: None,
    };
    let serving = Serving::new(
        routes::router(context.clone()),
        Some(server_tls),
        limits,
        connections,
    )
    .with_callers(callers);
    let mut server = Server::start(bound, THREADS, serving, stopped.clone())?;
    if let Some(bound) = metrics_bound {
        let stats = Arc::clone(&context.metrics.metrics_connections);
        let plain = Serving::new(routes::metrics_router(context), None, limits, stats);
        server = server.and(Server::start(bound, 1, plain, stopped)?);
    }
    info!(
        listen = %addr,
        agent_port = settings.agent_port,
        failure_policy = ?settings.failure_policy,
        agent_timeout = ?settings.agent_timeout,
        "webhook running"
    );
    let signal = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    info!(signal, "shutting down");
    let _ = stop.send(true);
    for watcher in [watcher, client_watcher] {
        if let Err(err) = watcher.await {
            warn!("a TLS file watcher failed: {err}");
        }
    }
    if let Err(err) = confirming.await {
        warn!("the confirmation of reservations failed: {err}");
    }
    if let Err(err) = node_watch.await {
        warn!("the Node watch failed: {err}");
    }
    if let Some(pod_watch) = pod_watch
        && let Err(err) = pod_watch.await
    {
        warn!("the watch of the agents' pods failed: {err}");
    }
    if let Some(streams) = streams
        && let Err(err) = streams.await
    {
        warn!("the agents' streams failed: {err}");
    }
    server.drain(DRAIN).await;
    Ok(())
}

/// The names agents are verified by, and under `per-pod` the watch of their pods that gives
/// them (its errors counted in `metrics`; it ends when `stop` turns true).
fn names(
    args: &identity::IdentityArgs,
    kube: &::kube::Client,
    metrics: &Arc<metrics::Metrics>,
    stop: &watch::Receiver<bool>,
) -> (identity::Names, Option<JoinHandle<()>>) {
    match args.agent_identity {
        identity::AgentIdentity::Shared => (identity::Names::Shared, None),
        identity::AgentIdentity::PerNode => (identity::Names::PerNode, None),
        identity::AgentIdentity::Kubelet => (identity::Names::Kubelet, None),
        identity::AgentIdentity::PerPod => {
            let metrics = Arc::clone(metrics);
            let (pods, task) = agent_pods::AgentPods::start(
                kube.clone(),
                &args.agent_namespace,
                &args.agent_selector,
                stop.clone(),
                move || metrics.agent_pod_watch_error(),
            );
            (identity::Names::PerPod(pods), Some(task))
        }
    }
}
