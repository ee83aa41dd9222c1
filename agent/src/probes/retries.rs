//! Folds retried faults into one.
//!
//! A fault the kernel retries fires `page_fault_user` again for the same address, so one touched
//! huge page can produce two records. A record is a retry when the same thread group faulted the
//! same huge page of the same file with the same error code within a short window (an address
//! unmapped and mapped again to another file, or segment, is another page). Retries are counted, not
//! dropped silently; a read fault followed by a write fault to the same page stays two events.
//!
//! Only the faults of the last window or two are remembered: once per window the older ones are
//! forgotten, and the table gives back room a burst left unused. (It once kept every fault until
//! 8,192 had been seen, so an agent whose pods fault a few pages now and then grew for hours.)

use std::{collections::HashMap, time::Duration};

use super::events::FaultEvent;

/// How long a fault is remembered; retries arrive microseconds apart.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

/// Below this capacity the table is not shrunk.
const SMALLEST: usize = 64;

/// Thread group, huge page and error code.
type FaultKey = (u32, u64, u64);
/// The file's device and inode, when the record names it.
type FileId = Option<(u32, u64)>;

#[derive(Debug)]
pub struct RetryFilter {
    window: Duration,
    seen: HashMap<FaultKey, (Duration, FileId)>,
    /// When faults older than the window were last forgotten (the events' clock).
    pruned: Duration,
    retries: u64,
}

impl RetryFilter {
    pub fn new(window: Duration) -> RetryFilter {
        RetryFilter {
            window,
            seen: HashMap::new(),
            pruned: Duration::ZERO,
            retries: 0,
        }
    }

    /// `true` for a new fault, `false` (and counted) for a retry of one just seen.
    pub fn admit(&mut self, event: &FaultEvent) -> bool {
        let file = event.file.map(|f| (f.dev, f.ino));
        let key = (event.tgid, event.page_address(), event.error_code);
        let fresh = match self.seen.insert(key, (event.at, file)) {
            // A record that names no file (fexit after the handler dropped the mmap lock) is
            // the same fault as its retry, which names it.
            Some((before, was)) => {
                event.at.saturating_sub(before) > self.window
                    || matches!((was, file), (Some(a), Some(b)) if a != b)
            }
            None => true,
        };
        if !fresh {
            self.retries += 1;
        }
        if event.at.saturating_sub(self.pruned) > self.window {
            let horizon = event.at.saturating_sub(self.window);
            self.seen.retain(|_, &mut (at, _)| at >= horizon);
            if self.seen.capacity() > SMALLEST && self.seen.len() < self.seen.capacity() / 4 {
                self.seen.shrink_to(self.seen.len() * 2);
            }
            self.pruned = event.at;
        }
        fresh
    }

    /// Retries folded so far.
    pub fn retries(&self) -> u64 {
        self.retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(tgid: u32, address: u64, error_code: u64, at_ms: u64) -> FaultEvent {
        FaultEvent {
            at: Duration::from_millis(at_ms),
            done: None,
            cgroup_id: 1,
            tgid,
            pid: tgid,
            comm: "t".into(),
            address,
            page_size: Some(2 << 20),
            write: error_code & 2 != 0,
            error_code,
            cpu: 0,
            numa_node: 0,
            file: None,
        }
    }

    #[test]
    fn the_same_address_in_another_file_is_another_fault() {
        use crate::probes::events::FaultFile;
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        let in_file = |ino| FaultEvent {
            file: Some(FaultFile {
                dev: 15,
                ino,
                shared: true,
                sysv: false,
                ipc_ns: 0,
            }),
            ..fault(1, 0x20_0000, 6, 0)
        };
        assert!(filter.admit(&in_file(7)));
        assert!(filter.admit(&in_file(8)), "mapped again to another file");
        assert!(!filter.admit(&in_file(8)));
        let unnamed = fault(1, 0x40_0000, 6, 0);
        assert!(filter.admit(&unnamed));
        assert!(
            !filter.admit(&FaultEvent {
                address: 0x40_0000,
                ..in_file(7)
            }),
            "a record that named no file (the lock dropped) and its retry, which names it, are one fault"
        );
    }

    #[test]
    fn retry_of_the_same_page_is_folded_and_counted() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        assert!(filter.admit(&fault(1, 0x20_0000, 6, 0)));
        assert!(!filter.admit(&fault(1, 0x20_0040, 6, 1)));
        assert_eq!(filter.retries(), 1);
    }

    #[test]
    fn other_pages_processes_and_access_kinds_are_new() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        assert!(filter.admit(&fault(1, 0x20_0000, 6, 0)));
        assert!(filter.admit(&fault(1, 0x40_0000, 6, 0)));
        assert!(filter.admit(&fault(2, 0x20_0000, 6, 0)));
        assert!(filter.admit(&fault(1, 0x20_0000, 4, 0)));
        assert_eq!(filter.retries(), 0);
    }

    #[test]
    fn the_same_page_after_the_window_is_a_new_fault() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        assert!(filter.admit(&fault(1, 0x20_0000, 6, 0)));
        assert!(filter.admit(&fault(1, 0x20_0000, 6, 500)));
    }

    #[test]
    fn only_the_last_windows_faults_are_kept() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        // One new page a millisecond for 30 s: 100 faults a window.
        for i in 0..30_000u64 {
            filter.admit(&fault(1, i << 21, 6, i));
        }
        assert!(filter.seen.len() <= 201, "{}", filter.seen.len());
    }

    #[test]
    fn a_few_faults_now_and_then_are_forgotten_and_a_burst_gives_its_room_back() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        // A toucher of 8 pages every 5 s, a new process each time, for an hour.
        for run in 0..720u64 {
            for page in 0..8 {
                filter.admit(&fault(run as u32 + 2, page << 21, 6, run * 5000));
            }
        }
        assert_eq!(filter.seen.len(), 8, "the last run's pages only");
        // A burst of 10,000 pages within one window, then the toucher again.
        for i in 0..10_000u64 {
            filter.admit(&fault(1, i << 21, 6, 4_000_000 + i / 1000));
        }
        assert!(filter.seen.capacity() >= 10_000);
        for page in 0..8 {
            filter.admit(&fault(9999, page << 21, 6, 4_010_000));
        }
        assert_eq!(filter.seen.len(), 8);
        assert!(filter.seen.capacity() <= 1024, "{}", filter.seen.capacity());
    }
}
