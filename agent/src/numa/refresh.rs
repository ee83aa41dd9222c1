//! Keeping the map fresh: the owner of the map's one writer. A hugetlb fault is a prompt, never
//! the accounting: it makes a re-read of its page size due at once, shared by every fault the
//! run loop takes in before it gets to it (it takes in the events waiting, a batch at a time,
//! before a due re-read: a burst of faults shares one). The probe sees a fault as it starts, but the kernel
//! takes the page from the pool (`alloc_hugetlb_folio`, which lowers `free_hugepages`) before it
//! zeroes it, microseconds later, and the probe's event takes longer than that to wake the agent:
//! the first re-read nearly always sees the page gone. One that saw no change (the fault had not
//! taken its page yet) is repeated after [`FIRST_FOLLOW_UP`], then after twice the delay each
//! time, up to [`FOLLOW_UPS`] times (1.6 s in all, for a 1 GiB page's slowest fault). A fault
//! seen done (the fexit probe, where the kernel allows it) has its page taken already: the
//! re-read it prompts is the only one, whatever it sees.
//! The periodic reconcile re-reads everything. Each re-read is logged as the pools' changes, and a
//! prompted one carries a `map refresh` span with the fault's time. A pool that turns unreadable
//! is logged once with the file (the map keeps its last figures, marked stale), and once more
//! when it reads again.
//!
//! Where this stops: what a change means for reservations, the discrepancy or the metrics is the
//! caller's; this module only reads sysfs into the map and says what changed.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use tokio::time::Instant;
use tracing::{info, warn};

use super::map::{Change, MapWriter, Reread, Snapshot, Source, monotonic_now};
use crate::{host::PageSize, sysfs::SysfsError};

/// The wait before the first repeat of a prompted re-read that saw no change: a 2 MiB page is
/// taken within it (the run loop waits with [`super::timer`], of microsecond resolution).
pub const FIRST_FOLLOW_UP: Duration = Duration::from_micros(100);
/// A prompted re-read that saw no change is repeated, each time after twice the delay: 0.1, 0.2,
/// 0.4 … 819 ms (1.6 s in all).
pub const FOLLOW_UPS: u32 = 14;

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
    /// A fault waiting was seen as it started (or will be taken again): its page may not be
    /// taken yet.
    started: bool,
}

/// What a prompted re-read found.
#[derive(Debug)]
pub enum Refreshed {
    /// Pools changed (the fault's page is taken); the delay from the first fault to the snapshot.
    Changed {
        changes: Vec<Change>,
        fault_to_map: Option<Duration>,
    },
    /// Nothing changed yet: another re-read is scheduled.
    Again,
    /// Nothing changed after every follow-up, or the re-read failed (logged).
    Settled,
}

/// The map's one writer and the re-reads that faults have asked for.
pub struct Refresher {
    writer: MapWriter,
    pending: Pending,
}

impl Refresher {
    /// Takes the map's writer; logs the pools of its first snapshot.
    pub fn new(writer: MapWriter) -> Refresher {
        log_snapshot(&writer.current());
        Refresher {
            writer,
            pending: Pending::default(),
        }
    }

    pub fn current(&self) -> Arc<Snapshot> {
        self.writer.current()
    }

    pub fn set_source(&mut self, source: Source) {
        self.writer.set_source(source);
    }

    /// When the next prompted re-read is due, if one is.
    pub fn due(&self) -> Option<Instant> {
        self.pending.due
    }

    /// A fault of `size` (unknown: every size) at CLOCK_MONOTONIC `fault_at`; `settled` when it
    /// was seen done and will not be taken again (see [`crate::probes::events::FaultEvent`]).
    pub fn schedule(&mut self, size: Option<PageSize>, fault_at: Duration, settled: bool) {
        let p = &mut self.pending;
        p.started |= !settled;
        match size {
            Some(size) => {
                p.sizes.insert(size);
            }
            None => p.all = true,
        }
        p.first_fault = Some(p.first_fault.map_or(fault_at, |t| t.min(fault_at)));
        p.due.get_or_insert_with(Instant::now);
    }

    /// The coalesced re-read the faults asked for.
    pub fn refresh(&mut self) -> Refreshed {
        let pending = std::mem::take(&mut self.pending);
        let span = refresh_span(&pending);
        let _entered = span.enter();
        let sizes = (!pending.all).then_some(&pending.sizes);
        match self.writer.refresh(sizes, pending.first_fault) {
            Ok(reread) => {
                log_transitions(&reread);
                let (changes, fault_to_map) = (reread.changes, reread.fault_to_map);
                span.record("hugepage_agent.pools_changed", changes.len() as i64);
                if changes.is_empty() && pending.started && pending.follow_ups < FOLLOW_UPS {
                    self.pending = Pending {
                        due: Some(Instant::now() + FIRST_FOLLOW_UP * 2u32.pow(pending.follow_ups)),
                        follow_ups: pending.follow_ups + 1,
                        ..pending
                    };
                    return Refreshed::Again;
                }
                if let Some(delay) = fault_to_map {
                    span.record("hugepage_agent.event_to_map_us", delay.as_micros() as i64);
                }
                log_changes(&changes, fault_to_map, Some(pending.follow_ups));
                Refreshed::Changed {
                    changes,
                    fault_to_map,
                }
            }
            Err(err) => {
                warn!("re-reading hugepage pools: {err}");
                Refreshed::Settled
            }
        }
    }

    /// Re-reads every pool (the safety net: a fault the probe missed shows here).
    pub fn reconcile(&mut self) -> Result<Vec<Change>, SysfsError> {
        let reread = self.writer.reconcile()?;
        log_transitions(&reread);
        log_changes(&reread.changes, None, None);
        Ok(reread.changes)
    }
}

/// The span of a map refresh an eBPF event prompted, with the event's time: its
/// CLOCK_MONOTONIC timestamp as the kernel took it, and the wall-clock time that stands for.
fn refresh_span(pending: &Pending) -> tracing::Span {
    let (wall, mono) = match pending.first_fault {
        Some(at) => {
            let ago = monotonic_now().saturating_sub(at);
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

/// Each change; for one a fault prompted, how long after the fault and after how many re-reads
/// that saw no change yet (`repeats`).
fn log_changes(changes: &[Change], fault_to_map: Option<Duration>, repeats: Option<u32>) {
    for c in changes {
        info!(
            node = c.now.node.0,
            size = %c.now.size,
            total = c.now.total,
            free = c.now.free,
            free_before = c.before.as_ref().map(|b| b.free),
            surplus = c.now.surplus,
            fault_to_map_us = fault_to_map.map(|d| d.as_micros() as u64),
            repeats,
            "hugepage pool changed"
        );
    }
}

/// Pools that turned unreadable (the map keeps their last figures) or readable again.
fn log_transitions(reread: &Reread) {
    for (key, err) in &reread.unreadable {
        warn!(
            node = key.node.map(|n| n.0),
            size = %key.size,
            error = %err,
            "hugepage pool unreadable: the map keeps its last figures, marked stale"
        );
    }
    for (key, mark) in &reread.recovered {
        let stale_ms = mark.since.elapsed().map_or(0, |d| d.as_millis() as u64);
        info!(
            node = key.node.map(|n| n.0),
            size = %key.size,
            stale_ms,
            "hugepage pool readable again"
        );
    }
}

fn log_snapshot(s: &Snapshot) {
    for n in &s.nodes {
        for p in &n.sizes {
            info!(node = n.info.node.0, size = %PageSize(p.page_size_bytes), total = p.total, free = p.free, surplus = p.surplus, "hugepage pool");
        }
    }
    for g in s.global.iter().map(|g| &g.pool) {
        info!(size = %g.size, total = g.total, free = g.free, reserved = g.reserved, surplus = g.surplus, "hugepage pool (system-wide)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::{HostFs, fake};

    const MI2: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";

    fn refresher() -> (tempfile::TempDir, HostFs, Refresher) {
        let (dir, host) = fake::tree(&[
            ("/sys/devices/system/node/online", "0\n"),
            ("/sys/devices/system/node/node0/cpulist", "0\n"),
            ("/sys/devices/system/node/node0/distance", "10\n"),
            (&format!("{MI2}/nr_hugepages"), "8\n"),
            (&format!("{MI2}/free_hugepages"), "8\n"),
            (&format!("{MI2}/surplus_hugepages"), "0\n"),
        ]);
        let (writer, _) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
        (dir, host, Refresher::new(writer))
    }

    #[tokio::test]
    async fn a_fault_makes_a_reread_due_at_once_and_faults_before_it_share_it() {
        let (_d, _host, mut r) = refresher();
        assert_eq!(r.due(), None);
        let before = Instant::now();
        r.schedule(Some(PageSize(2 << 20)), Duration::from_secs(5), false);
        let due = r.due().expect("a re-read is due");
        assert!(
            due >= before && due <= Instant::now(),
            "due at once, not after a delay"
        );
        r.schedule(Some(PageSize(2 << 20)), Duration::from_secs(4), true);
        assert_eq!(
            r.due(),
            Some(due),
            "the second fault waits for the same re-read"
        );
        assert_eq!(r.pending.first_fault, Some(Duration::from_secs(4)));
    }

    #[tokio::test]
    async fn a_reread_that_sees_no_change_is_repeated_with_a_doubled_delay_then_settles() {
        let (_d, _host, mut r) = refresher();
        r.schedule(Some(PageSize(2 << 20)), monotonic_now(), false);
        for k in 0..FOLLOW_UPS {
            let before = Instant::now();
            assert!(matches!(r.refresh(), Refreshed::Again));
            let due = r.due().expect("a follow-up is due");
            // 0.1, 0.2, 0.4, … ms after the re-read.
            assert!(
                due >= before + FIRST_FOLLOW_UP * 2u32.pow(k),
                "follow-up {k} due after {:?}",
                due - before
            );
        }
        assert!(
            matches!(r.refresh(), Refreshed::Changed { ref changes, .. } if changes.is_empty())
        );
        assert_eq!(r.due(), None, "no re-read after the last follow-up");
    }

    #[tokio::test]
    async fn a_reread_that_sees_the_page_taken_reports_the_change_and_the_delay() {
        let (dir, _host, mut r) = refresher();
        r.schedule(Some(PageSize(2 << 20)), monotonic_now(), false);
        fake::write(dir.path(), &format!("{MI2}/free_hugepages"), "7\n");
        match r.refresh() {
            Refreshed::Changed {
                changes,
                fault_to_map,
            } => {
                assert_eq!(changes.len(), 1);
                assert_eq!(changes[0].now.free, 7);
                assert!(fault_to_map.is_some(), "a prompted change has a delay");
            }
            other => panic!("expected a change, got {other:?}"),
        }
        assert_eq!(r.current().nodes[0].sizes[0].free, 7);
        assert_eq!(r.due(), None);
    }

    #[tokio::test]
    async fn a_fault_seen_done_is_read_once_even_when_nothing_changed() {
        let (_d, _host, mut r) = refresher();
        r.schedule(Some(PageSize(2 << 20)), monotonic_now(), true);
        assert!(
            matches!(r.refresh(), Refreshed::Changed { ref changes, .. } if changes.is_empty()),
            "no follow-up: its page was taken (or it failed) before the event"
        );
        assert_eq!(r.due(), None);
        // One seen as it started among those waiting: followed up as before.
        r.schedule(Some(PageSize(2 << 20)), monotonic_now(), true);
        r.schedule(Some(PageSize(2 << 20)), monotonic_now(), false);
        assert!(matches!(r.refresh(), Refreshed::Again));
    }
}
