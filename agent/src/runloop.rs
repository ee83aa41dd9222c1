//! The agent's loop: where each thing that happens goes. A hugetlb fault goes to the probes
//! (retries folded), the fault book, the holders' book and the map's refresher; a hugetlbfs
//! inode event to the holders' book; a cgroup event to the reservations'
//! pod inventory and the probe's watch set; a due re-read, a reconcile, a changed checkpoint or a
//! changed kubelet to the module that owns that state. Events the ring buffers lost leave the
//! inventory and the watch set behind: the loss counters are read every [`LOSS_POLL`], and a rise
//! brings the reconcile forward to now. Everything here runs on one task, so the map keeps its one
//! writer; each concern's state and rules live in its own module, which this one only calls and
//! whose outcomes it turns into metrics.
//!
//! The owners: [`Refresher`] (the map), [`LiveProbes`] (the loaded probes), [`Releaser`]
//! (reservations and pod cgroups), [`LiveState`] (the Memory Manager's state and the
//! discrepancy), [`LiveKubelet`] (the kubelet's settings). The loop ends when its stop signal
//! turns true, which the caller sends on the first SIGINT or SIGTERM ([`Shutdown`]).
//!
//! The loop runs on a thread of its own ([`RunLoop::spawn`]), named `map`, on a runtime of that
//! one thread: the thread waits on the ring buffers itself, so a fault's event wakes it alone,
//! and it takes the event in, re-reads sysfs and publishes the map without handing anything to
//! another thread. Each hand-over cost a wake-up of a sleeping thread, and where a sleeping
//! thread's CPU is an idle vCPU that wake-up can take milliseconds. Under
//! `--map-thread-priority` the thread runs under SCHED_FIFO for the events (faults, cgroup
//! events) and the re-reads they prompt, and drops to the default policy for the full
//! reconcile and the rescan of the cgroup tree ([`crate::numa::priority::Lowered`]).

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::{
    signal::unix::{Signal, SignalKind, signal},
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tracing::{info, warn};

use crate::{
    admission::release::{Ended, Releaser},
    consumers::FaultBook,
    holders::book::{Book, cgroup_now},
    host::{NumaNode, PageSize},
    kubelet::{
        cgroup_path::{Owner, classify},
        pods::PodCgroups,
    },
    kubeletconfig::live::LiveKubelet,
    memorymanager::live::LiveState,
    numa::{
        priority::Lowered,
        refresh::{Refreshed, Refresher},
        timer::Timer,
    },
    probes::{
        events::{CgroupChange, CgroupEventInfo, ProbeEvent},
        live::LiveProbes,
    },
    sysfs::{HostFs, cgroup_tree},
    telemetry::metrics::Metrics,
};

/// How often the kubelet's checkpoint (a `stat`) and its process and files are checked for changes.
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);
/// How often the probes' loss counters are read (a handful of map reads).
pub const LOSS_POLL: Duration = Duration::from_secs(1);
/// Events taken in at once before a due re-read or a tick gets its turn.
const BATCH: usize = 256;

/// The owners of every running concern, and the metrics their outcomes update.
pub struct RunLoop {
    pub host: HostFs,
    pub refresher: Refresher,
    pub probes: LiveProbes,
    pub releaser: Releaser,
    pub memory: LiveState,
    /// The node's kubelet settings, checked with the checkpoint.
    pub kubelet: LiveKubelet,
    /// Hugetlb faults per cgroup, for `GET /v1/consumers`.
    pub faults: FaultBook,
    /// Files and segments the probes saw made, faulted, fallocated and evicted.
    pub book: Book,
    pub metrics: Arc<Metrics>,
}

impl RunLoop {
    /// Serves events, due re-reads, reconciles (every `reconcile`) and checkpoint checks until
    /// `shutdown` completes.
    async fn run(
        &mut self,
        events: &mut mpsc::Receiver<ProbeEvent>,
        shutdown: impl Future<Output = ()>,
        reconcile: Duration,
    ) {
        tokio::pin!(shutdown);
        let mut reconcile = tokio::time::interval(reconcile);
        let mut checkpoint_poll = tokio::time::interval(CHECKPOINT_POLL);
        let mut loss_poll = tokio::time::interval(LOSS_POLL);
        let timer = Timer::new()
            .inspect_err(|e| {
                warn!("no timerfd ({e}): the map's re-reads wait on whole milliseconds");
            })
            .ok();
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                Some(event) = events.recv() => self.handle_batch(event, events),
                () = sleep_until(timer.as_ref(), self.refresher.due()), if self.refresher.due().is_some() => self.refresh(),
                _ = reconcile.tick() => self.reconcile(),
                _ = checkpoint_poll.tick() => self.checkpoint_tick(),
                _ = loss_poll.tick() => self.loss_tick(),
            }
        }
    }

    /// Runs the loop on a thread of its own (see the module's documentation), on a runtime made
    /// there: `start` first, on that thread (what it registers with the runtime, the probes'
    /// ring buffers, is polled there), then the loop on its events until `stop` turns true; the
    /// probes are detached as the thread ends. A runtime that cannot be made is `start`'s error;
    /// a thread that cannot be made is the error returned.
    pub fn spawn<E: From<std::io::Error> + Send + 'static>(
        mut self,
        start: impl FnOnce(&mut RunLoop) -> Result<mpsc::Receiver<ProbeEvent>, E> + Send + 'static,
        mut stop: watch::Receiver<bool>,
        reconcile: Duration,
    ) -> std::io::Result<LoopThread<E>> {
        let (started_tx, started) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel();
        std::thread::Builder::new()
            .name("map".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = started_tx.send(Err(E::from(err)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut events = match start(&mut self) {
                        Ok(events) => events,
                        Err(err) => {
                            let _ = started_tx.send(Err(err));
                            return;
                        }
                    };
                    let _ = started_tx.send(Ok(()));
                    let stopped = async move {
                        let _ = stop.wait_for(|stop| *stop).await;
                    };
                    self.run(&mut events, stopped, reconcile).await;
                    self.stop();
                    let _ = ended_tx.send(());
                });
            })?;
        Ok(LoopThread { started, ended })
    }

    /// `first` and the events already waiting behind it, up to [`BATCH`]: a re-read that a
    /// fault made due waits for the faults that came with it (a burst of them shares one
    /// re-read), never for later ones.
    fn handle_batch(&mut self, first: ProbeEvent, events: &mut mpsc::Receiver<ProbeEvent>) {
        self.handle(first);
        for _ in 1..BATCH {
            match events.try_recv() {
                Ok(event) => self.handle(event),
                Err(_) => break,
            }
        }
    }

    /// One decoded probe event.
    pub fn handle(&mut self, event: ProbeEvent) {
        match event {
            ProbeEvent::Fault(f) => {
                if self.probes.on_fault(&f) {
                    self.faults.record(f.cgroup_id, SystemTime::now());
                    self.book
                        .fault(&f, cgroup_now(&self.host, self.probes.v2()));
                    self.metrics.fault(f.numa_node, f.page_size.map(PageSize));
                    self.refresher
                        .schedule(f.page_size.map(PageSize), f.at, f.settled());
                }
            }
            ProbeEvent::Cgroup(c) => self.on_cgroup(&c),
            ProbeEvent::File(e) => self.book.file(&e, cgroup_now(&self.host, self.probes.v2())),
        }
    }

    fn on_cgroup(&mut self, c: &CgroupEventInfo) {
        self.metrics.cgroup_event(c.change);
        let owner = classify(&c.path);
        if c.change == CgroupChange::Rmdir {
            self.faults.forget(c.cgroup_id);
        }
        if c.is_v2() {
            match c.change {
                // A mkdir read after its cgroup went (its rmdir lost with a full ring buffer)
                // must not bring a removed pod back into the inventory.
                CgroupChange::Mkdir if self.is_current(c) => {
                    self.releaser.on_mkdir(&c.path, &owner)
                }
                CgroupChange::Rmdir => {
                    let ended = self.releaser.on_rmdir(&owner);
                    self.count(&ended);
                }
                _ => {}
            }
            // The watch map is updated before the event is logged: a logged mkdir is watched.
            self.probes.on_cgroup(c);
        }
        log_cgroup(c, owner);
    }

    /// The coalesced re-read the faults asked for.
    pub fn refresh(&mut self) {
        if let Refreshed::Changed { fault_to_map, .. } = self.refresher.refresh() {
            if let Some(delay) = fault_to_map {
                self.metrics.event_to_map(delay);
            }
            self.update_discrepancy();
        }
        self.release_faulted();
    }

    /// Whether the cgroup of event `c` still exists (the same cgroup, not one of the same path).
    fn is_current(&self, c: &CgroupEventInfo) -> bool {
        self.probes
            .v2()
            .is_some_and(|v2| v2.is_current(&self.host, &c.path, c.cgroup_id))
    }

    /// Reconciles now if the ring buffers lost events since the last read of the counters.
    pub fn loss_tick(&mut self) {
        let lost = self.read_probe_losses();
        if lost > 0 {
            warn!(
                lost,
                "probe events lost (ring buffer full): reconciling now"
            );
            self.reconcile();
        }
    }

    /// The safety net: full cgroup rescan and sysfs re-read; a missed fault (-EBUSY) shows here.
    /// The loss counters are read first: what is lost after that read shows at the next tick.
    pub fn reconcile(&mut self) {
        let _lowered = Lowered::for_the_scan();
        self.read_probe_losses();
        self.rescan_cgroups();
        if let Err(err) = self.refresher.reconcile() {
            warn!("reconciling the hugepage map: {err}");
        }
        self.release_faulted();
        // Built from the pools when there is no checkpoint: follow them.
        if self.memory.follows_pools() {
            self.memory.reload(&self.refresher.current());
        }
        self.update_discrepancy();
    }

    /// Re-reads the kubelet's settings if its process or files changed (a change of reserved
    /// memory reaches the Memory Manager's state), and its checkpoint if the file changed.
    pub fn checkpoint_tick(&mut self) {
        if self.kubelet.tick() {
            let reserved = &self.kubelet.current().settings.reserved_memory.value;
            self.memory
                .set_reserved(reserved, &self.refresher.current());
            self.update_discrepancy();
        }
        if self.memory.checkpoint_changed() {
            self.memory.reload(&self.refresher.current());
            self.update_discrepancy();
        }
    }

    /// `memory_manager_hugepages_discrepancy_bytes`: the checkpoint against the latest pools;
    /// none without a usable checkpoint.
    pub fn update_discrepancy(&self) {
        let Some(discrepancies) = self.memory.discrepancy(&self.refresher.current()) else {
            return self.metrics.clear_discrepancy();
        };
        for d in discrepancies {
            let bytes = i64::try_from(d.discrepancy_bytes).unwrap_or(if d.discrepancy_bytes < 0 {
                i64::MIN
            } else {
                i64::MAX
            });
            self.metrics
                .set_discrepancy(PageSize(d.page_size_bytes), NumaNode(d.numa_node), bytes);
        }
    }

    /// Reads the probes' own counters into the metrics; returns how many events the ring
    /// buffers lost since the previous read.
    pub fn read_probe_losses(&mut self) -> u64 {
        let Some((losses, new)) = self.probes.losses() else {
            return 0;
        };
        self.metrics.set_probe_losses(losses);
        new
    }

    /// Detaches the probes (logging their totals).
    pub fn stop(&mut self) {
        if self.probes.detach() {
            info!("eBPF programs detached");
        }
    }

    fn release_faulted(&self) {
        let ended = self.releaser.release_faulted(SystemTime::now());
        self.count(&ended);
    }

    fn count(&self, ended: &Ended) {
        for (_, why) in ended {
            self.metrics.reservation_ended(*why);
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
        if let Some(v2) = self.probes.v2().cloned() {
            let mut ids = HashSet::new();
            let host = &self.host;
            let mut visit = |rel: &str| {
                pods.on_mkdir(rel, &classify(rel));
                ids.extend(v2.id(host, rel).ok());
            };
            if self.probes.filtering() {
                match v2.scan_visiting(host, visit) {
                    Ok(scan) => self.probes.sync_watched(&scan.watched),
                    Err(err) => return warn!("rescanning cgroups: {err}"),
                }
            } else if let Err(err) = cgroup_tree::walk(host, &v2.mount, &mut visit) {
                return warn!("rescanning pod cgroups: {err}");
            }
            // Faults of cgroups whose rmdir was lost are forgotten here.
            self.faults.retain(|id| ids.contains(&id));
        }
        let ended = self.releaser.replace_pods(pods);
        self.count(&ended);
    }
}

/// Until `at` (at once when it has come), on `timer` when there is one: tokio's own timers round
/// a deadline up to the next whole millisecond.
async fn sleep_until(timer: Option<&Timer>, at: Option<Instant>) {
    let Some(at) = at else { return };
    let waited = match timer {
        Some(timer) => timer.sleep_until(at).await,
        None => {
            tokio::time::sleep_until(at).await;
            Ok(())
        }
    };
    if let Err(e) = waited {
        warn!("waiting on the timerfd: {e}; waiting on tokio's timer");
        tokio::time::sleep_until(at).await;
    }
}

/// Logs one cgroup event. The cgroup's depth is `cgroup_level`: in the JSON log a field named
/// `level` would follow the line's own `level` and, read as JSON, replace its severity.
fn log_cgroup(c: &CgroupEventInfo, owner: Owner) {
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
    let (pod_uid, qos, container_id) = match owner {
        Owner::Pod {
            uid,
            qos,
            container,
        } => (Some(uid.0), Some(qos), container.map(|c| c.id)),
        Owner::System => (None, None, None),
    };
    info!(change, cgroup_id = c.cgroup_id, hierarchy = c.hierarchy, cgroup_level = c.level, path = %c.path, pid, truncated = c.truncated, pod_uid, qos = qos.map(tracing::field::display), container_id, "cgroup event");
}

/// The loop's thread, seen from the one that started it.
pub struct LoopThread<E> {
    /// What `start` returned (an error: the loop did not run); closed if the thread panicked.
    pub started: oneshot::Receiver<Result<(), E>>,
    /// Sent once the loop stopped and the probes are detached; closed if the thread panicked.
    pub ended: oneshot::Receiver<()>,
}

/// SIGINT and SIGTERM, caught from the moment [`Shutdown::install`] returns.
pub struct Shutdown {
    interrupt: Signal,
    terminate: Signal,
}

impl Shutdown {
    pub fn install() -> std::io::Result<Shutdown> {
        Ok(Shutdown {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The name of the first signal received.
    pub async fn wait(mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Arc, Mutex},
        time::Duration,
    };

    use super::*;

    /// Collects what the log writes.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Written {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("the buffer").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_cgroup_event_in_the_json_log_keeps_its_severity_and_its_depth() {
        let written = Written::default();
        let to = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(move || to.clone())
            .finish();
        let event = CgroupEventInfo {
            at: Duration::ZERO,
            change: CgroupChange::Mkdir,
            cgroup_id: 7,
            hierarchy: 0,
            level: 4,
            path: "/kubepods/burstable/pod0".to_owned(),
            truncated: false,
        };
        tracing::subscriber::with_default(subscriber, || log_cgroup(&event, Owner::System));
        let text = String::from_utf8(written.0.lock().expect("the buffer").clone()).expect("UTF-8");
        assert_eq!(text.matches("\"level\":").count(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
        assert_eq!(
            (&line["level"], &line["cgroup_level"]),
            (&"INFO".into(), &4.into()),
            "{line}"
        );
    }
}
