//! The probes as the running agent keeps them: which faults the fault program inspects
//! (`--fault-scope`), the watch set kept current from cgroup events and rescans, retried faults
//! folded, the kernel-side counters read and logged. Without probes (eBPF off or refused) every
//! call is a no-op, so the caller needs no second path.
//!
//! Where this stops: a fault's meaning for the map, and a cgroup's for reservations, are the
//! caller's; this module answers "is this a fault we had not seen" and "what did the probes
//! count".

use std::collections::BTreeSet;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    Counters, EventStreams, ProbeError, Probes,
    events::{CgroupChange, CgroupEventInfo, FaultEvent, ProbeEvent},
    retries::{DEFAULT_WINDOW, RetryFilter},
    stream,
    watch::{CgroupV2, WatchError},
};
use crate::sysfs::HostFs;
use hugepage_agent_common::counters::Counter;

/// Decoded events buffered between the ring-buffer readers and the loop.
const CHANNEL: usize = 4096;

/// Which processes' faults are inspected (`--fault-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultScope {
    /// Only cgroups that can use hugepages (a hugetlb limit above zero, or none).
    HugetlbCgroups,
    /// Every process.
    All,
}

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error(transparent)]
    Probes(#[from] ProbeError),
    #[error("cgroup watch set: {0}")]
    Watch(#[from] WatchError),
    #[error("starting the event readers: {0}")]
    Io(#[from] std::io::Error),
}

/// What the probes lost or missed so far (their own counters, as last read), for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Losses {
    pub hugetlb_faults_lost: u64,
    pub cgroup_events_lost: u64,
    pub hugetlbfs_events_lost: u64,
    pub find_vma_busy: u64,
}

impl Losses {
    /// Events the ring buffers could not hold since `before` (every ring).
    pub fn events_lost_since(&self, before: &Losses) -> u64 {
        let total =
            |l: &Losses| l.hugetlb_faults_lost + l.cgroup_events_lost + l.hugetlbfs_events_lost;
        total(self).saturating_sub(total(before))
    }
}

/// The loaded probes (if any) and the state kept beside them.
pub struct LiveProbes {
    host: HostFs,
    v2: Option<CgroupV2>,
    probes: Option<Probes>,
    retries: RetryFilter,
    last_counters: Option<Counters>,
    /// The losses as last read.
    last_losses: Losses,
}

impl LiveProbes {
    /// No probes yet: everything is a no-op until [`LiveProbes::adopt`].
    pub fn new(host: HostFs) -> LiveProbes {
        LiveProbes {
            v2: CgroupV2::find(&host),
            host,
            probes: None,
            retries: RetryFilter::new(DEFAULT_WINDOW),
            last_counters: None,
            last_losses: Losses::default(),
        }
    }

    /// The cgroup v2 hierarchy, when the host has one.
    pub fn v2(&self) -> Option<&CgroupV2> {
        self.v2.as_ref()
    }

    /// Whether the hugetlbfs programs are attached: the evictions of files and segments are seen.
    pub fn sees_evictions(&self) -> bool {
        self.probes
            .as_ref()
            .is_some_and(|p| p.files_unavailable.is_none())
    }

    /// The task iterators, or why they are not loaded; `None` without probes.
    pub fn tasks(&self) -> Option<Result<std::sync::Arc<super::tasks::TaskIterators>, String>> {
        self.probes.as_ref().map(|p| p.tasks.clone())
    }

    /// Whether the fault program filters by cgroup (so a rescan must keep its watch set).
    pub fn filtering(&self) -> bool {
        self.probes.as_ref().is_some_and(|p| !p.watches_all())
    }

    /// Takes ownership of loaded probes: sets the fault scope and starts the event readers.
    pub fn adopt(
        &mut self,
        mut probes: Probes,
        streams: EventStreams,
        scope: FaultScope,
    ) -> Result<mpsc::Receiver<ProbeEvent>, LiveError> {
        match &probes.fault_fallback {
            None => info!(attach = %probes.fault_path.describe(), "fault probe attached"),
            Some(why) => info!(
                attach = %probes.fault_path.describe(),
                "fault probe attached; fexit, which sees each fault done, was refused: {why}"
            ),
        }
        if let Some(why) = &probes.page_size_unavailable {
            warn!("hugetlb faults will carry no page size: the kernel's BTF lacks {why}");
        }
        if let Some(why) = &probes.file_unavailable {
            warn!("hugetlb {why}");
        }
        match &probes.files_unavailable {
            None => info!("hugetlbfs probes attached"),
            Some(why) => info!(reason = %why, "hugetlbfs probes not attached"),
        }
        match &probes.tasks {
            Ok(_) => {
                info!("task iterators loaded (the holders' walk reads every process with them)")
            }
            Err(why) => {
                info!(reason = %why, "task iterators not loaded: the holders' walk reads /proc alone")
            }
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

    /// Logs a fault; `false` for a retry of one already seen.
    pub fn on_fault(&mut self, f: &FaultEvent) -> bool {
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
            file = f.file.map(|file| file.describe()),
            "hugetlb fault"
        );
        true
    }

    /// Keeps the watched set current: a new or newly entered cgroup is evaluated, a removed one
    /// forgotten. Limits written after mkdir are caught on attach and by the periodic rescan.
    pub fn on_cgroup(&mut self, c: &CgroupEventInfo) {
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

    /// Replaces the watch set with what a rescan found.
    pub fn sync_watched(&mut self, watched: &BTreeSet<u64>) {
        if let Some(probes) = self.probes.as_mut()
            && let Err(err) = probes.sync_watched(watched)
        {
            warn!("updating the watched-cgroup map: {}", err.explain());
        }
    }

    /// What the probes lost or missed so far, and how many events the ring buffers lost since
    /// the previous read (`None` without probes, or when unreadable).
    pub fn losses(&mut self) -> Option<(Losses, u64)> {
        let probes = self.probes.as_ref()?;
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
                let losses = Losses {
                    hugetlb_faults_lost: now.get(Counter::HugetlbFaultsLost),
                    cgroup_events_lost: now.get(Counter::CgroupEventsLost),
                    hugetlbfs_events_lost: now.get(Counter::HugetlbfsEventsLost),
                    find_vma_busy: now.get(Counter::FindVmaBusy),
                };
                let new = losses.events_lost_since(&self.last_losses);
                self.last_losses = losses;
                Some((losses, new))
            }
            Err(err) => {
                warn!("reading probe counters: {}", err.explain());
                None
            }
        }
    }

    /// Logs what the probes saw over the agent's life and detaches them; `true` if there were
    /// any.
    pub fn detach(&mut self) -> bool {
        let Some(probes) = self.probes.take() else {
            return false;
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
                hugetlbfs_events = c.get(Counter::HugetlbfsEvents),
                hugetlbfs_events_lost = c.get(Counter::HugetlbfsEventsLost),
                "probe totals"
            ),
            Err(err) => warn!("reading probe counters: {}", err.explain()),
        }
        drop(probes);
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake;

    #[test]
    fn without_probes_every_call_is_a_no_op() {
        let (_d, host) = fake::tree(&[(
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "0\n",
        )]);
        let mut live = LiveProbes::new(host);
        assert!(!live.filtering());
        assert_eq!(live.losses(), None);
        live.sync_watched(&BTreeSet::from([1, 2]));
        assert!(!live.detach());
    }

    #[test]
    fn events_lost_since_counts_every_ring_and_ignores_the_mmap_lock() {
        let before = Losses {
            hugetlb_faults_lost: 10,
            cgroup_events_lost: 5,
            hugetlbfs_events_lost: 3,
            find_vma_busy: 1,
        };
        let same = Losses {
            find_vma_busy: 9,
            ..before
        };
        assert_eq!(
            same.events_lost_since(&before),
            0,
            "a busy mmap lock loses no event"
        );
        let after = Losses {
            hugetlb_faults_lost: 2010,
            cgroup_events_lost: 905,
            hugetlbfs_events_lost: 10,
            find_vma_busy: 1,
        };
        assert_eq!(after.events_lost_since(&before), 2907);
        assert_eq!(before.events_lost_since(&after), 0, "never negative");
    }

    #[test]
    fn a_retried_fault_is_folded_into_the_first() {
        let (_d, host) = fake::tree(&[(
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "0\n",
        )]);
        let mut live = LiveProbes::new(host);
        let fault = FaultEvent {
            at: std::time::Duration::from_secs(1),
            done: None,
            cgroup_id: 42,
            tgid: 7,
            pid: 7,
            comm: "app".into(),
            address: 0x4000_0000,
            page_size: Some(2 << 20),
            write: true,
            error_code: 0,
            cpu: 0,
            numa_node: 0,
            file: None,
        };
        assert!(live.on_fault(&fault), "a new fault counts");
        assert!(!live.on_fault(&fault), "its retry does not");
    }
}
