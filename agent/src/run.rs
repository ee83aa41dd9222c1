//! `hugepage-agent run`: serve the HTTP API, start the probes (or fall back to sysfs), log every
//! hugetlb fault and cgroup event, keep the probe's watched-cgroup map current, keep the hugepage
//! map fresh, evaluate PSI into node conditions, and on SIGINT or SIGTERM drain the API and
//! detach the probes.
//!
//! Fault records are prompts and attribution hints, never the accounting: each one schedules a
//! coalesced re-read of the touched page size, and what the map holds comes from sysfs. The
//! periodic reconcile re-reads everything and is the only source when eBPF is off.

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use arc_swap::ArcSwap;
use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, watch},
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    admission::reservations::{Released, Reservation, Store},
    admission::verify::Verifier,
    api::{
        self, AppState, Readiness,
        server::{Server, ServerError},
    },
    config::{Config, EbpfMode, FaultScope},
    consumers::FaultBook,
    kubelet::cgroup_path::{Owner, classify},
    kubelet::pods::PodCgroups,
    memorymanager::{
        discrepancy,
        live::{MemoryManagerView, StateLoader, StateSource},
    },
    numa::{
        PageSize,
        map::{Change, MapWriter, Snapshot, Source},
    },
    probes::{
        EventStreams, ProbeError, Probes,
        events::{CgroupChange, CgroupEventInfo, FaultEvent, ProbeEvent},
        retries::{DEFAULT_WINDOW, RetryFilter},
        stream,
        watch::{CgroupV2, WatchError},
    },
    psi::monitor::Monitor,
    sysfs::{HostFs, SysfsError, cgroup_tree, hugetlb_cgroup, topology},
    telemetry::{
        export::ExportStats,
        metrics::{Metrics, ProbeTotals},
    },
    topologymanager::NumaInfo,
};
use hugepage_agent_common::counters::Counter;

/// Faults arriving within this delay share one sysfs re-read. The tracepoint fires when a fault
/// starts, before its page is taken; a 2 MiB fault has finished by then.
const COALESCE: Duration = Duration::from_millis(2);
/// A prompted re-read that saw no change (the fault had not taken its page yet; a 1 GiB fault
/// zeroes its page first) is repeated, each time after twice the delay: 4, 8, … 512 ms.
const FOLLOW_UPS: u32 = 8;
/// How long in-flight API requests may take once shutdown begins.
const DRAIN: Duration = Duration::from_secs(5);
/// Decoded events buffered between the ring-buffer readers and the loop.
const CHANNEL: usize = 4096;
/// How often the kubelet's checkpoint is checked for changes (a `stat`).
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("eBPF probes required (--ebpf on) but unavailable: {0}")]
    ProbesRequired(String),
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error("cgroup watch set: {0}")]
    Watch(#[from] WatchError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    State(String),
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// Runs the agent until a shutdown signal; `/metrics` shows the trace exporter's `traces`.
pub fn run(config: &Config, traces: Arc<ExportStats>) -> Result<(), RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_async(config, traces))
}

async fn run_async(config: &Config, traces: Arc<ExportStats>) -> Result<(), RunError> {
    // Installed first: a signal that arrives once the agent says it runs must stop it cleanly.
    let shutdown = Shutdown::install()?;
    let bound = Server::bind(config.listen)?;
    let (writer, map) = MapWriter::new(config.host.clone(), Source::Sysfs)?;
    log_snapshot(&writer.current());
    let metrics = Arc::new(metrics_for(&writer.current(), traces));
    let readiness = Readiness::default();
    let faults = FaultBook::default();
    let (store, set_aside) = Store::open(&config.state_dir, config.reservation_ttl)
        .map_err(|e| RunError::State(format!("--state-dir: {e}")))?;
    if let Some(warning) = set_aside {
        warn!("{warning}");
    }
    info!(restored = store.list().len(), dir = %config.state_dir.display(), "reservations loaded");
    let reservations = Arc::new(Mutex::new(store));
    let (mut psi_monitor, psi_reader) = Monitor::new(config.host.clone(), config.psi);
    psi_monitor.evaluate(std::time::SystemTime::now());
    let numa_info =
        NumaInfo::from_topology(&topology::read(&config.host)?, &config.topology.options)
            .map_err(|e| RunError::State(format!("the Topology Manager: {e}")))?;
    let mut state_loader = StateLoader::new(
        config.host.clone(),
        config.kubelet_state.clone(),
        config.reserved_memory.clone(),
    );
    let view = state_loader
        .load(&writer.current())
        .map_err(|e| RunError::State(format!("the Memory Manager state: {e}")))?;
    log_memory_manager(&view);
    let memory_manager = Arc::new(ArcSwap::from_pointee(view));
    let state = AppState {
        memory_manager: memory_manager.clone(),
        numa_info: Arc::new(numa_info),
        topology: config.topology,
        map,
        verifier: Arc::new(Verifier::new(config.host.clone())?),
        settings: config.verification,
        readiness: readiness.clone(),
        psi: psi_reader,
        faults: faults.clone(),
        host: config.host.clone(),
        reservations: reservations.clone(),
        reject_under_pressure: config.reject_under_pressure,
        metrics: metrics.clone(),
    };
    let (stop_server, stopped) = watch::channel(false);
    let psi_task = tokio::spawn(psi_monitor.run(stopped.clone()));
    let server = Server::start(bound, config.api_threads, api::router(state), stopped)?;
    let mut agent = Agent {
        host: config.host.clone(),
        v2: CgroupV2::find(&config.host),
        probes: None,
        retries: RetryFilter::new(DEFAULT_WINDOW),
        writer,
        faults,
        pods: PodCgroups::scan(&config.host).unwrap_or_else(|err| {
            warn!(
                "finding pod cgroups: {err}; reservations end by expiry until the next reconcile"
            );
            PodCgroups::default()
        }),
        reservations,
        pending: Pending::default(),
        last_counters: None,
        state_loader,
        memory_manager,
        metrics,
    };
    agent.update_discrepancy();
    let (mut events, probes_state) = match start_probes(config)? {
        Ok((probes, streams)) => {
            let rx = agent.adopt(probes, streams, config.fault_scope)?;
            agent.writer.set_source(Source::EbpfSysfs);
            (rx, "attached".to_owned())
        }
        Err(why) => (mpsc::channel(1).1, why),
    };
    readiness.release(probes_state);
    info!(source = %agent.writer.current().source, listen = %config.listen, api_threads = config.api_threads, "agent running");
    let shutdown = shutdown.wait();
    tokio::pin!(shutdown);
    let mut reconcile = tokio::time::interval(config.reconcile_interval);
    let mut checkpoint_poll = tokio::time::interval(CHECKPOINT_POLL);
    loop {
        tokio::select! {
            signal = &mut shutdown => {
                info!(signal, "shutting down");
                break;
            }
            Some(event) = events.recv() => agent.handle(event),
            () = sleep_until(agent.pending.due), if agent.pending.due.is_some() => agent.refresh(),
            _ = reconcile.tick() => agent.reconcile(),
            _ = checkpoint_poll.tick() => {
                if agent.state_loader.changed() {
                    agent.reload_memory_manager();
                }
            }
        }
    }
    let _ = stop_server.send(true);
    if let Err(err) = psi_task.await {
        warn!("PSI monitor task failed: {err}");
    }
    let drained = server.stopped(DRAIN).await;
    if let Some(err) = &drained.failed {
        warn!("the HTTP API stopped with an error: {err}");
    }
    match drained.busy {
        0 => info!("HTTP API drained"),
        n => warn!("{n} HTTP API thread(s) still busy after {DRAIN:?}; stopping anyway"),
    }
    agent.log_totals();
    if agent.probes.take().is_some() {
        info!("eBPF programs detached");
    }
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Loads the probes as `--ebpf` asks; `Ok(Err(why))` means sysfs-only operation.
fn start_probes(config: &Config) -> Result<Result<(Probes, EventStreams), String>, RunError> {
    match config.ebpf {
        EbpfMode::Off => {
            info!("eBPF disabled (--ebpf off): the hugepage map comes from sysfs polling only");
            Ok(Err("off (--ebpf off)".to_owned()))
        }
        mode => match Probes::load(&config.host) {
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

/// SIGINT and SIGTERM, caught from the moment [`Shutdown::install`] returns.
struct Shutdown {
    interrupt: Signal,
    terminate: Signal,
}

impl Shutdown {
    fn install() -> std::io::Result<Shutdown> {
        Ok(Shutdown {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The name of the first signal received.
    async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

struct Agent {
    host: HostFs,
    v2: Option<CgroupV2>,
    probes: Option<Probes>,
    retries: RetryFilter,
    writer: MapWriter,
    /// Hugetlb faults per cgroup, for `GET /v1/consumers`.
    faults: FaultBook,
    /// Where each pod's cgroup is, to see a reserved pod fault its pages or go.
    pods: PodCgroups,
    reservations: Arc<Mutex<Store>>,
    pending: Pending,
    last_counters: Option<crate::probes::Counters>,
    /// Reads the kubelet's checkpoint (or builds its state) for NUMA selection.
    state_loader: StateLoader,
    memory_manager: Arc<ArcSwap<MemoryManagerView>>,
    metrics: Arc<Metrics>,
}

/// Page sizes that faults touched since the last re-read, and when that re-read is due.
#[derive(Debug, Default)]
struct Pending {
    sizes: BTreeSet<PageSize>,
    /// A fault of unknown page size: re-read every size.
    all: bool,
    /// CLOCK_MONOTONIC time of the earliest fault waiting.
    first_fault: Option<Duration>,
    due: Option<Instant>,
    /// How many re-reads of these faults saw no change so far.
    follow_ups: u32,
}

impl Agent {
    /// Takes ownership of loaded probes: sets the fault scope and starts the event readers.
    fn adopt(
        &mut self,
        mut probes: Probes,
        streams: EventStreams,
        scope: FaultScope,
    ) -> Result<mpsc::Receiver<ProbeEvent>, RunError> {
        if let Some(why) = &probes.page_size_unavailable {
            warn!("hugetlb faults will carry no page size: the kernel's BTF lacks {why}");
        }
        match (scope, &self.v2) {
            (FaultScope::All, _) => {
                probes.set_watch_all(true)?;
                info!("fault probe inspects every process (--fault-scope all)");
            }
            (FaultScope::HugetlbCgroups, None) => {
                probes.set_watch_all(true)?;
                warn!(
                    "no cgroup v2 hierarchy: the fault probe cannot filter by cgroup and inspects every process"
                );
            }
            (FaultScope::HugetlbCgroups, Some(v2)) => {
                let scan = v2.scan(&self.host)?;
                probes.sync_watched(&scan.watched)?;
                info!(
                    watched = scan.watched.len(),
                    cgroups = scan.cgroups,
                    hierarchy = %v2.mount,
                    "fault probe inspects the cgroups that can use hugepages"
                );
            }
        }
        if let Some(logger) = probes.logger.take() {
            spawn_log_forwarder(logger)?;
        }
        let rx = stream::spawn(streams, CHANNEL)?;
        self.probes = Some(probes);
        self.read_probe_counters();
        Ok(rx)
    }

    /// Logs one event; a fault schedules a coalesced re-read of its page size.
    fn handle(&mut self, event: ProbeEvent) {
        match event {
            ProbeEvent::Fault(fault) => {
                if self.on_fault(&fault) {
                    self.schedule(fault.page_size.map(PageSize), fault.at);
                }
            }
            ProbeEvent::Cgroup(cgroup) => self.on_cgroup(&cgroup),
        }
    }

    fn schedule(&mut self, size: Option<PageSize>, fault_at: Duration) {
        let p = &mut self.pending;
        match size {
            Some(size) => {
                p.sizes.insert(size);
            }
            None => p.all = true,
        }
        p.first_fault = Some(p.first_fault.map_or(fault_at, |t| t.min(fault_at)));
        p.due.get_or_insert_with(|| Instant::now() + COALESCE);
    }

    /// Logs a fault; `false` for a retry of one already seen.
    fn on_fault(&mut self, f: &FaultEvent) -> bool {
        if !self.retries.admit(f) {
            debug!(
                tgid = f.tgid,
                address = format_args!("{:#x}", f.address),
                "retried hugetlb fault folded"
            );
            return false;
        }
        self.faults
            .record(f.cgroup_id, std::time::SystemTime::now());
        self.metrics.fault(f.numa_node, f.page_size.map(PageSize));
        info!(
            pid = f.pid,
            tgid = f.tgid,
            comm = %f.comm,
            cgroup_id = f.cgroup_id,
            address = format_args!("{:#x}", f.address),
            page_size = f.page_size.unwrap_or(0),
            write = f.write,
            cpu = f.cpu,
            numa_node = f.numa_node,
            "hugetlb fault"
        );
        true
    }

    fn on_cgroup(&mut self, c: &CgroupEventInfo) {
        let change = match c.change {
            CgroupChange::Mkdir => "mkdir",
            CgroupChange::Rmdir => "rmdir",
            CgroupChange::AttachTask { .. } => "attach_task",
            CgroupChange::Release => "release",
        };
        let pid = match c.change {
            CgroupChange::AttachTask { pid } => Some(pid),
            _ => None,
        };
        self.metrics.cgroup_event(c.change);
        let owner = classify(&c.path);
        if c.change == CgroupChange::Rmdir {
            self.faults.forget(c.cgroup_id);
        }
        if c.is_v2() {
            match c.change {
                CgroupChange::Mkdir => self.pods.on_mkdir(&c.path, &owner),
                CgroupChange::Rmdir => {
                    if let Some(uid) = self.pods.on_rmdir(&owner) {
                        self.release(|r, _| (r.pod_uid == uid).then_some(Released::PodRemoved));
                    }
                }
                _ => {}
            }
            // The watch map is updated before the event is logged: a logged mkdir is watched.
            self.update_watch(c);
        }
        let (pod_uid, qos, container_id) = match owner {
            Owner::Pod {
                uid,
                qos,
                container,
            } => (Some(uid.0), Some(qos), container.map(|c| c.id)),
            Owner::System => (None, None, None),
        };
        info!(change, cgroup_id = c.cgroup_id, hierarchy = c.hierarchy, level = c.level, path = %c.path, pid, truncated = c.truncated, pod_uid, qos = qos.map(tracing::field::display), container_id, "cgroup event");
    }

    /// Keeps the watched set current: a new or newly entered cgroup is evaluated, a removed one
    /// forgotten. Limits written after mkdir are caught on attach and by the periodic rescan.
    fn update_watch(&mut self, c: &CgroupEventInfo) {
        let (Some(probes), Some(v2)) = (self.probes.as_mut(), self.v2.as_ref()) else {
            return;
        };
        let result = match c.change {
            CgroupChange::Rmdir => probes.unwatch(c.cgroup_id),
            CgroupChange::Mkdir | CgroupChange::AttachTask { .. } => {
                match v2.can_use_hugepages(&self.host, &c.path) {
                    Ok(true) => probes.watch(c.cgroup_id),
                    Ok(false) => probes.unwatch(c.cgroup_id),
                    Err(err) => {
                        debug!(path = %c.path, "cgroup gone before its limits were read: {err}");
                        Ok(())
                    }
                }
            }
            CgroupChange::Release => Ok(()),
        };
        if let Err(err) = result {
            warn!("updating the watched-cgroup map: {}", err.explain());
        }
    }

    /// The safety net: full cgroup rescan and sysfs re-read; a missed fault (-EBUSY) shows here.
    fn reconcile(&mut self) {
        self.rescan_cgroups();
        self.read_probe_counters();
        match self.writer.reconcile() {
            Ok(changes) => log_changes(&changes, None),
            Err(err) => warn!("reconciling the hugepage map: {err}"),
        }
        self.release_faulted();
        // Built from the pools when there is no checkpoint: follow them.
        if self.memory_manager.load().source == StateSource::Sysfs {
            self.reload_memory_manager();
        } else {
            self.update_discrepancy();
        }
    }

    /// Re-reads the Memory Manager state; a failure keeps the last good one.
    fn reload_memory_manager(&mut self) {
        let before = self.memory_manager.load();
        match self.state_loader.load(&self.writer.current()) {
            Ok(view) => {
                if view.source != before.source
                    || view.checkpoint_error != before.checkpoint_error
                    || view.source == StateSource::Checkpoint
                {
                    log_memory_manager(&view);
                }
                self.memory_manager.store(Arc::new(view));
            }
            Err(err) => warn!("re-reading the Memory Manager state: {err}; keeping the last one"),
        }
        self.update_discrepancy();
    }

    /// `memory_manager_hugepages_discrepancy_bytes`: the checkpoint against the latest pools;
    /// none without a usable checkpoint.
    fn update_discrepancy(&self) {
        let view = self.memory_manager.load();
        if view.source != StateSource::Checkpoint {
            return self.metrics.clear_discrepancy();
        }
        for d in discrepancy::compute(&view.state, &self.writer.current(), None) {
            let bytes = i64::try_from(d.discrepancy_bytes).unwrap_or(if d.discrepancy_bytes < 0 {
                i64::MIN
            } else {
                i64::MAX
            });
            self.metrics.set_discrepancy(
                PageSize(d.page_size_bytes),
                crate::numa::NumaNode(d.numa_node),
                bytes,
            );
        }
    }

    /// One walk of the v2 tree feeds both the probe's watch set (when it filters by cgroup) and
    /// the pod cgroups; pods gone since the last walk end their reservations. A walk that fails
    /// changes nothing: it must not read as "every pod is gone".
    fn rescan_cgroups(&mut self) {
        let mut pods = match PodCgroups::v1(&self.host) {
            Ok(pods) => pods,
            Err(err) => return warn!("rescanning pod cgroups: {err}"),
        };
        let filtering = self.probes.as_ref().is_some_and(|p| !p.watches_all());
        match (&self.v2, self.probes.as_mut()) {
            (Some(v2), Some(probes)) if filtering => {
                match v2.scan_visiting(&self.host, |rel| pods.on_mkdir(rel, &classify(rel))) {
                    Ok(scan) => {
                        if let Err(err) = probes.sync_watched(&scan.watched) {
                            warn!("updating the watched-cgroup map: {}", err.explain());
                        }
                    }
                    Err(err) => return warn!("rescanning cgroups: {err}"),
                }
            }
            (Some(v2), _) => {
                let walked = cgroup_tree::walk(&self.host, &v2.mount, |rel| {
                    pods.on_mkdir(rel, &classify(rel))
                });
                if let Err(err) = walked {
                    return warn!("rescanning pod cgroups: {err}");
                }
            }
            (None, _) => {}
        }
        let gone = self.pods.gone_in(&pods);
        self.pods = pods;
        if !gone.is_empty() {
            self.release(|r, _| gone.contains(&r.pod_uid).then_some(Released::PodRemoved));
        }
    }

    /// Reads the probes' counters into the metrics.
    fn read_probe_counters(&mut self) {
        let Some(probes) = &self.probes else {
            return;
        };
        match probes.counters() {
            Ok(now) => {
                if let Some(before) = self.last_counters
                    && now.get(Counter::FindVmaBusy) > before.get(Counter::FindVmaBusy)
                {
                    debug!(
                        busy = now.get(Counter::FindVmaBusy),
                        "faults missed while the mmap lock was held; sysfs re-read covers them"
                    );
                }
                self.metrics.set_probe_totals(ProbeTotals {
                    hugetlb_faults_lost: now.get(Counter::HugetlbFaultsLost),
                    cgroup_events_lost: now.get(Counter::CgroupEventsLost),
                    find_vma_busy: now.get(Counter::FindVmaBusy),
                });
                self.last_counters = Some(now);
            }
            Err(err) => warn!("reading probe counters: {}", err.explain()),
        }
    }

    /// What the probes saw over the agent's life: every counter, and the retries folded here.
    fn log_totals(&self) {
        let Some(probes) = &self.probes else {
            return;
        };
        match probes.counters() {
            Ok(c) => info!(
                faults_seen = c.faults_seen(),
                faults_filtered = c.get(Counter::FaultsFiltered),
                faults_not_hugetlb = c.get(Counter::FaultsNotHugetlb),
                find_vma_busy = c.get(Counter::FindVmaBusy),
                find_vma_failed = c.get(Counter::FindVmaFailed),
                hugetlb_faults = c.get(Counter::HugetlbFaults),
                hugetlb_faults_lost = c.get(Counter::HugetlbFaultsLost),
                hugetlb_fault_retries_folded = self.retries.retries(),
                cgroup_events = c.get(Counter::CgroupEvents),
                cgroup_events_lost = c.get(Counter::CgroupEventsLost),
                "probe totals"
            ),
            Err(err) => warn!("reading probe counters: {}", err.explain()),
        }
    }

    /// The coalesced re-read the faults asked for.
    fn refresh(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let span = refresh_span(&pending);
        let _entered = span.enter();
        let sizes = (!pending.all).then_some(&pending.sizes);
        let refreshed = self.writer.refresh(sizes, pending.first_fault);
        if let Ok(changes) = &refreshed {
            span.record("hugepage_agent.pools_changed", changes.len() as i64);
        }
        match refreshed {
            Ok(changes)
                if changes.is_empty()
                    && pending.follow_ups < FOLLOW_UPS
                    && self.pending.due.is_none() =>
            {
                self.pending = Pending {
                    due: Some(Instant::now() + COALESCE * 2u32.pow(pending.follow_ups + 1)),
                    follow_ups: pending.follow_ups + 1,
                    ..pending
                };
            }
            Ok(changes) => {
                let delay = self.writer.current().fault_to_map;
                if let Some(delay) = delay {
                    self.metrics.event_to_map(delay);
                    span.record("hugepage_agent.event_to_map_us", delay.as_micros() as i64);
                }
                log_changes(&changes, delay);
                self.update_discrepancy();
            }
            Err(err) => warn!("re-reading hugepage pools: {err}"),
        }
        self.release_faulted();
    }

    /// Ends the expired reservations and those whose pods have faulted their pages.
    fn release_faulted(&mut self) {
        let now = std::time::SystemTime::now();
        self.release(|r, agent| {
            if r.expires_at <= now {
                Some(Released::Expired)
            } else {
                agent.has_faulted(r).then_some(Released::Faulted)
            }
        });
    }

    /// Whether `r`'s pod cgroup is charged with at least the reserved bytes of every size.
    fn has_faulted(&self, r: &Reservation) -> bool {
        let Some((dir, hierarchy)) = self.pods.dir(&r.pod_uid) else {
            return false;
        };
        let sizes: Vec<PageSize> = r.bytes.keys().copied().collect();
        match hugetlb_cgroup::read(&self.host, dir, hierarchy, &sizes) {
            Ok(usage) => r.bytes.iter().all(|(size, &bytes)| {
                usage
                    .iter()
                    .any(|u| u.page_size_bytes == size.0 && u.in_use_bytes >= bytes)
            }),
            Err(err) => {
                debug!("reading the hugetlb usage of pod {}: {err}", r.pod_uid);
                false
            }
        }
    }

    /// Releases the reservations `pick` gives a reason for (one save), and logs each.
    fn release(&self, pick: impl Fn(&Reservation, &Agent) -> Option<Released>) {
        let Ok((gone, snapshot)) = self
            .reservations
            .lock()
            .map(|mut store| store.release(|r| pick(r, self)))
        else {
            warn!("the reservation store is poisoned");
            return;
        };
        for (r, why) in gone {
            self.metrics.reservation_ended(why);
            info!(id = %r.id, pod_uid = %r.pod_uid, reason = ?why, "reservation released");
        }
        // Written without the lock: admissions do not wait for this disk write.
        if let Some(snapshot) = snapshot
            && let Err(err) = snapshot.write()
        {
            warn!(
                "saving the reservations: {err}; the file keeps the released ones until they expire"
            );
        }
    }
}

fn log_memory_manager(view: &MemoryManagerView) {
    match (&view.source, &view.checkpoint_error) {
        (StateSource::Checkpoint, _) => info!(
            path = %view.checkpoint_path.display(),
            nodes = view.state.machine_state.len(),
            pods = view.state.entries.len(),
            "Memory Manager state read from the kubelet's checkpoint"
        ),
        (StateSource::Sysfs, Some(err)) => warn!(
            "the kubelet's checkpoint is refused: {err}; NUMA selection uses the state built from sysfs"
        ),
        (StateSource::Sysfs, None) => info!(
            path = %view.checkpoint_path.display(),
            "no kubelet Memory Manager checkpoint: NUMA selection uses the state built from sysfs and --reserved-memory"
        ),
    }
}

/// The metrics of the host the first snapshot shows.
fn metrics_for(s: &Snapshot, traces: Arc<ExportStats>) -> Metrics {
    let nodes: Vec<_> = s.nodes.iter().map(|n| n.info.node).collect();
    let sizes: BTreeSet<PageSize> = s
        .global
        .iter()
        .map(|g| g.size)
        .chain(
            s.nodes
                .iter()
                .flat_map(|n| n.sizes.iter().map(|p| PageSize(p.page_size_bytes))),
        )
        .collect();
    let sizes: Vec<PageSize> = sizes.into_iter().collect();
    Metrics::new(&sizes, &nodes, traces)
}

/// The span of a map refresh an eBPF event prompted, with the event's time: its
/// CLOCK_MONOTONIC timestamp as the kernel took it, and the wall-clock time that stands for.
fn refresh_span(pending: &Pending) -> tracing::Span {
    let (wall, mono) = match pending.first_fault {
        Some(at) => {
            let ago = crate::numa::map::monotonic_now().saturating_sub(at);
            let wall = std::time::SystemTime::now() - ago;
            (
                humantime::format_rfc3339_micros(wall).to_string(),
                i64::try_from(at.as_nanos()).unwrap_or(i64::MAX),
            )
        }
        None => (String::new(), 0),
    };
    let sizes: Vec<String> = pending.sizes.iter().map(|s| s.to_string()).collect();
    tracing::debug_span!(
        "map refresh",
        hugepage_agent.trigger = "ebpf hugetlb fault",
        hugepage_agent.event.time = wall.as_str(),
        hugepage_agent.event.monotonic_ns = mono,
        hugepage_agent.page_sizes = if pending.all {
            "all".to_owned()
        } else {
            sizes.join(",")
        }
        .as_str(),
        hugepage_agent.follow_up = i64::from(pending.follow_ups),
        hugepage_agent.pools_changed = tracing::field::Empty,
        hugepage_agent.event_to_map_us = tracing::field::Empty,
    )
}

fn log_changes(changes: &[Change], fault_to_map: Option<Duration>) {
    for c in changes {
        info!(
            node = c.now.node.0,
            size = %c.now.size,
            total = c.now.total,
            free = c.now.free,
            free_before = c.before.as_ref().map(|b| b.free),
            surplus = c.now.surplus,
            fault_to_map_us = fault_to_map.map(|d| d.as_micros() as u64),
            "hugepage pool changed"
        );
    }
}

fn log_snapshot(s: &Snapshot) {
    for n in &s.nodes {
        for p in &n.sizes {
            info!(node = n.info.node.0, size = %PageSize(p.page_size_bytes), total = p.total, free = p.free, surplus = p.surplus, "hugepage pool");
        }
    }
    for g in &s.global {
        info!(size = %g.size, total = g.total, free = g.free, reserved = g.reserved, surplus = g.surplus, "hugepage pool (system-wide)");
    }
}

/// Forwards aya-log records written by the kernel programs to the agent's log.
fn spawn_log_forwarder(logger: aya_log::EbpfLogger<&'static dyn log::Log>) -> std::io::Result<()> {
    let mut fd = stream::readable(logger)?;
    tokio::spawn(async move {
        while let Ok(mut guard) = fd.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
    Ok(())
}
