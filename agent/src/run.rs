//! `hugepage-agent run`: the wiring. What starts, in what order, what stops it: signals first
//! (a signal that arrives once the agent says it runs must stop it cleanly), the API's socket
//! (and the metrics listener's), the map and its refresher, the TLS material and its watcher,
//! the reservations, PSI, the kubelet's settings, the Memory Manager's state, the listeners'
//! threads and the heavy lane, then the loop's own thread ([`crate::runloop`]), which starts the
//! probes (or sysfs alone), releases readiness and runs until SIGINT or SIGTERM. Then everything
//! is told to stop at once: the loop stops and detaches the probes, PSI and the TLS watcher
//! stop, while the listeners drain; the process ends once all have.
//!
//! Each running concern lives with its state: the map's refresh in `numa::refresh`, the probes in
//! `probes::live`, reservation release in `admission::release`, the Memory Manager's state in
//! `memorymanager::live`, the kubelet's settings in `kubeletconfig::live`; this file only wires.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::{
    admission::{release::Releaser, reservations::Store, verify::Verifier},
    api::{
        self, AppState, Readiness,
        budget::BodyBudget,
        lane::Lane,
        server::{Callers, Endpoint, Server, ServerError, Serving},
        watch::{Hub, Inputs as HubInputs},
    },
    config::RunConfig,
    consumers::FaultBook,
    kubelet::pods::PodCgroups,
    kubeletconfig::live::LiveKubelet,
    memorymanager::live::{LiveState, StateLoader},
    numa::{
        map::{MapWriter, Source},
        priority::{PriorityError, realtime},
        refresh::Refresher,
    },
    probes::{
        EventStreams, Probes,
        events::ProbeEvent,
        flags::EbpfMode,
        live::{LiveError, LiveProbes},
    },
    psi::monitor::Monitor,
    runloop::{RunLoop, Shutdown},
    sysfs::{self, SysfsError, topology},
    telemetry::{export::ExportStats, metrics::Metrics},
    tls::{self, TlsError},
};

/// How long in-flight API requests may take once shutdown begins.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("eBPF probes required (--ebpf on) but unavailable: {0}")]
    ProbesRequired(String),
    #[error(transparent)]
    Probes(#[from] LiveError),
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    State(String),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Priority(#[from] PriorityError),
}

/// Runs the agent until a shutdown signal; `/metrics` shows the trace exporter's `traces`.
pub fn run(config: &RunConfig, traces: Arc<ExportStats>) -> Result<(), RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_async(config, traces))
}

async fn run_async(config: &RunConfig, traces: Arc<ExportStats>) -> Result<(), RunError> {
    let shutdown = Shutdown::install()?;
    let bound = Server::bind(Endpoint::API, config.listen)?;
    let metrics_bound = config
        .metrics_listen
        .map(|addr| Server::bind(Endpoint::METRICS, addr))
        .transpose()?;
    let (writer, map) = sysfs::settled(|| MapWriter::new(config.host.clone(), Source::Sysfs))?;
    let refresher = Refresher::new(writer);
    let metrics = Arc::new(Metrics::for_host(&refresher.current(), traces));
    let (tls, reloader) = (config.tls.as_ref())
        .map(|files| tls::load(files, tls::Alpn::Http1, metrics.tls.clone()))
        .transpose()?
        .unzip();
    let readiness = Readiness::default();
    let faults = FaultBook::default();
    let store = Store::restore(&config.state_dir, config.reservation_ttl)
        .map_err(|e| RunError::State(format!("--state-dir: {e}")))?
        .limit_namespaces(config.namespace_reservation_limit);
    let reservations = Arc::new(Mutex::new(store));
    let (mut psi_monitor, psi_reader) = Monitor::new(config.host.clone(), config.psi);
    psi_monitor.evaluate(std::time::SystemTime::now());
    let kubelet = LiveKubelet::load(
        config.host.clone(),
        config.kubelet.config.clone(),
        config.kubelet.layer.clone(),
        sysfs::settled(|| topology::read(&config.host))?,
    )
    .map_err(|e| RunError::State(e.to_string()))?;
    let loader = StateLoader::new(
        config.host.clone(),
        config.kubelet.state.clone(),
        kubelet.current().settings.reserved_memory.value.clone(),
    );
    let memory = LiveState::load(loader, &refresher.current());
    let (hub, publisher) = Hub::new(
        HubInputs {
            map: map.clone(),
            reservations: reservations.clone(),
            kubelet: kubelet.reader(),
            memory_manager: memory.reader(),
            mode: config.verification.mode,
            psi: psi_reader.clone(),
            reject_under_pressure: config.reject_under_pressure,
        },
        config.watch,
        metrics.watch.clone(),
    );
    let state = AppState {
        memory_manager: memory.reader(),
        kubelet: kubelet.reader(),
        map,
        verifier: Arc::new(sysfs::settled(|| Verifier::new(config.host.clone()))?),
        settings: config.verification,
        readiness: readiness.clone(),
        psi: psi_reader,
        faults: faults.clone(),
        host: config.host.clone(),
        reservations: reservations.clone(),
        reject_under_pressure: config.reject_under_pressure,
        metrics: metrics.clone(),
        max_containers: config.max_containers,
        heavy: Lane::start().map_err(|e| RunError::State(e.to_string()))?,
        bodies: BodyBudget::shared(config.limits.body_budget, &metrics.api_connections),
        watch: hub,
        held: Default::default(),
    };
    tokio::spawn(publisher);
    let (stop_server, stopped) = watch::channel(false);
    let psi_task = tokio::spawn(psi_monitor.run(stopped.clone()));
    let tls_task = reloader.map(|r| tokio::spawn(r.watch(stopped.clone())));
    let (api_stats, book) = (metrics.api_connections.clone(), state.held.book.clone());
    let api = Serving::new(api::router(state.clone()), tls, config.limits, api_stats)
        .with_callers(Callers::writers(config.admit_client_names.clone()));
    let mut server = Server::start(bound, config.api_threads, api, stopped.clone())?;
    if let Some(bound) = metrics_bound {
        let stats = metrics.metrics_connections.clone();
        let plain = Serving::new(api::metrics_router(state), None, config.limits, stats);
        server = server.and(Server::start(bound, 1, plain, stopped.clone())?);
    }
    let pods = PodCgroups::at_start(&config.host);
    let agent = RunLoop {
        host: config.host.clone(),
        refresher,
        probes: LiveProbes::new(config.host.clone()),
        releaser: Releaser::new(config.host.clone(), pods, reservations),
        memory,
        kubelet,
        faults,
        book,
        metrics,
    };
    agent.update_discrepancy();
    let started = {
        let config = config.clone();
        move |agent: &mut RunLoop| start(agent, &config, &readiness)
    };
    let mut thread = agent.spawn(started, stopped, config.reconcile_interval)?;
    (&mut thread.started).await.map_err(|_| lost_thread())??;
    let signal = tokio::select! {
        signal = shutdown.wait() => signal,
        _ = &mut thread.ended => return Err(lost_thread()),
    };
    info!(signal, "shutting down");
    let _ = stop_server.send(true);
    if let Err(err) = psi_task.await {
        warn!("PSI monitor task failed: {err}");
    }
    if let Some(task) = tls_task
        && let Err(err) = task.await
    {
        warn!("the TLS file watcher failed: {err}");
    }
    server.drain(DRAIN).await;
    thread.ended.await.map_err(|_| lost_thread())
}

/// The map thread's start: its priority if asked, the probes (or sysfs alone), readiness, and
/// the line that says the agent runs; the probes' events for the loop.
fn start(
    agent: &mut RunLoop,
    config: &RunConfig,
    readiness: &Readiness,
) -> Result<mpsc::Receiver<ProbeEvent>, RunError> {
    if let Some(priority) = config.map_thread_priority {
        realtime(priority)?;
    }
    let (events, probes_state) = match start_probes(config)? {
        Ok((probes, streams)) => {
            let rx = agent.probes.adopt(probes, streams, config.fault_scope)?;
            agent.book.watch_evictions(agent.probes.sees_evictions());
            agent.book.read_tasks(agent.probes.tasks());
            agent.read_probe_losses();
            agent.refresher.set_source(Source::EbpfSysfs);
            (rx, "attached".to_owned())
        }
        Err(why) => (mpsc::channel(1).1, why),
    };
    readiness.release(probes_state);
    config.announce(&agent.refresher.current().source);
    Ok(events)
}

fn lost_thread() -> RunError {
    RunError::State("the map's thread stopped (it panicked)".to_owned())
}

/// Loads the probes as `--ebpf` asks; `Ok(Err(why))` means sysfs-only operation.
fn start_probes(config: &RunConfig) -> Result<Result<(Probes, EventStreams), String>, RunError> {
    match config.ebpf {
        EbpfMode::Off => {
            info!("eBPF disabled (--ebpf off): the hugepage map comes from sysfs polling only");
            Ok(Err("off (--ebpf off)".to_owned()))
        }
        mode => match Probes::load(&config.host, config.fault_attach) {
            Ok(loaded) => Ok(Ok(loaded)),
            Err(err) if mode == EbpfMode::Auto => {
                let why = err.explain();
                warn!("eBPF unavailable, running on sysfs only: {why}");
                Ok(Err(format!("refused: {why}")))
            }
            Err(err) => Err(RunError::ProbesRequired(err.explain())),
        },
    }
}
