//! `hugepage-agent run`: start the probes (or fall back to sysfs), log every hugetlb fault and
//! cgroup event, keep the probe's watched-cgroup map current, re-read the hugepage pools when a
//! fault prompts it and on every reconcile tick, and detach cleanly on SIGINT or SIGTERM.
//!
//! Fault records are prompts and attribution hints, never the accounting: each one schedules a
//! coalesced re-read of sysfs, and what is logged as "changed" comes from sysfs.

use std::time::Duration;

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc,
    time::Instant,
};
use tracing::{debug, info, warn};

use crate::{
    config::{Config, EbpfMode, FaultScope},
    numa::HugepageTable,
    probes::{
        EventStreams, ProbeError, Probes,
        events::{CgroupChange, CgroupEventInfo, FaultEvent, ProbeEvent},
        retries::{DEFAULT_WINDOW, RetryFilter},
        stream,
        watch::{CgroupV2, WatchError},
    },
    sysfs::{HostFs, SysfsError, hugepages},
};
use hugepage_agent_common::counters::Counter;

/// Faults arriving within this delay share one sysfs re-read.
const COALESCE: Duration = Duration::from_millis(20);
/// Decoded events buffered between the ring-buffer readers and the loop.
const CHANNEL: usize = 4096;

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
}

/// Runs the agent until a shutdown signal.
pub fn run(config: &Config) -> Result<(), RunError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run_async(config))
}

async fn run_async(config: &Config) -> Result<(), RunError> {
    // Installed first: a signal that arrives once the agent says it runs must stop it cleanly.
    let shutdown = Shutdown::install()?;
    let table = hugepages::read_table(&config.host)?;
    log_table(&table);
    let mut agent = Agent {
        host: config.host.clone(),
        v2: CgroupV2::find(&config.host),
        probes: None,
        retries: RetryFilter::new(DEFAULT_WINDOW),
        table,
        last_counters: None,
    };
    let mut events = match start_probes(config)? {
        Some((probes, streams)) => {
            let rx = agent.adopt(probes, streams, config.fault_scope)?;
            info!(source = "ebpf+sysfs", "agent running");
            rx
        }
        None => {
            info!(source = "sysfs", "agent running");
            mpsc::channel(1).1
        }
    };
    let shutdown = shutdown.wait();
    tokio::pin!(shutdown);
    let mut reconcile = tokio::time::interval(config.reconcile_interval);
    let mut refresh_at: Option<Instant> = None;
    loop {
        tokio::select! {
            signal = &mut shutdown => {
                info!(signal, "shutting down");
                break;
            }
            Some(event) = events.recv() => {
                if agent.handle(event) && refresh_at.is_none() {
                    refresh_at = Some(Instant::now() + COALESCE);
                }
            }
            () = sleep_until(refresh_at), if refresh_at.is_some() => {
                refresh_at = None;
                agent.refresh_table();
            }
            _ = reconcile.tick() => agent.reconcile(),
        }
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

/// Loads the probes as `--ebpf` asks; `None` means sysfs-only operation.
fn start_probes(config: &Config) -> Result<Option<(Probes, EventStreams)>, RunError> {
    match config.ebpf {
        EbpfMode::Off => {
            info!("eBPF disabled (--ebpf off): the hugepage map comes from sysfs polling only");
            Ok(None)
        }
        mode => match Probes::load(&config.host) {
            Ok(loaded) => Ok(Some(loaded)),
            Err(err) if mode == EbpfMode::Auto => {
                warn!("eBPF unavailable, running on sysfs only: {}", err.explain());
                Ok(None)
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
    table: HugepageTable,
    last_counters: Option<crate::probes::Counters>,
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
        Ok(rx)
    }

    /// Logs one event; returns whether sysfs should be re-read.
    fn handle(&mut self, event: ProbeEvent) -> bool {
        match event {
            ProbeEvent::Fault(fault) => self.on_fault(&fault),
            ProbeEvent::Cgroup(cgroup) => {
                self.on_cgroup(&cgroup);
                false
            }
        }
    }

    fn on_fault(&mut self, f: &FaultEvent) -> bool {
        if !self.retries.admit(f) {
            debug!(
                tgid = f.tgid,
                address = format_args!("{:#x}", f.address),
                "retried hugetlb fault folded"
            );
            return false;
        }
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
        // The watch map is updated before the event is logged: a logged mkdir is a watched cgroup.
        if c.is_v2() {
            self.update_watch(c);
        }
        info!(change, cgroup_id = c.cgroup_id, hierarchy = c.hierarchy, level = c.level, path = %c.path, pid, truncated = c.truncated, "cgroup event");
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
        if let (Some(probes), Some(v2)) = (self.probes.as_mut(), self.v2.as_ref())
            && !probes.watches_all()
        {
            match v2.scan(&self.host) {
                Ok(scan) => {
                    if let Err(err) = probes.sync_watched(&scan.watched) {
                        warn!("updating the watched-cgroup map: {}", err.explain());
                    }
                }
                Err(err) => warn!("rescanning cgroups: {err}"),
            }
        }
        if let Some(probes) = &self.probes {
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
                    self.last_counters = Some(now);
                }
                Err(err) => warn!("reading probe counters: {}", err.explain()),
            }
        }
        self.refresh_table();
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

    /// Re-reads sysfs and logs every pool whose counts changed.
    fn refresh_table(&mut self) {
        let table = match hugepages::read_table(&self.host) {
            Ok(table) => table,
            Err(err) => {
                warn!("re-reading hugepage pools: {err}");
                return;
            }
        };
        for now in &table.nodes {
            let before = self
                .table
                .nodes
                .iter()
                .find(|p| p.node == now.node && p.size == now.size);
            if before != Some(now) {
                info!(
                    node = now.node.0,
                    size = %now.size,
                    total = now.total,
                    free = now.free,
                    free_before = before.map(|b| b.free),
                    surplus = now.surplus,
                    "hugepage pool changed"
                );
            }
        }
        self.table = table;
    }
}

fn log_table(table: &HugepageTable) {
    for p in &table.nodes {
        info!(node = p.node.0, size = %p.size, total = p.total, free = p.free, surplus = p.surplus, "hugepage pool");
    }
    for g in &table.global {
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
