//! Folds retried faults into one.
//!
//! A fault the kernel retries fires `page_fault_user` again for the same address, so one touched
//! huge page can produce two records. A record is a retry when the same thread group faulted the
//! same huge page with the same error code within a short window. Retries are counted, not
//! dropped silently; a read fault followed by a write fault to the same page stays two events.

use std::{collections::HashMap, time::Duration};

use super::events::FaultEvent;

/// How long a fault is remembered; retries arrive microseconds apart.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(100);

/// Entries kept before old ones are pruned.
const PRUNE_AT: usize = 8192;

#[derive(Debug)]
pub struct RetryFilter {
    window: Duration,
    seen: HashMap<(u32, u64, u64), Duration>,
    retries: u64,
}

impl RetryFilter {
    pub fn new(window: Duration) -> RetryFilter {
        RetryFilter {
            window,
            seen: HashMap::new(),
            retries: 0,
        }
    }

    /// `true` for a new fault, `false` (and counted) for a retry of one just seen.
    pub fn admit(&mut self, event: &FaultEvent) -> bool {
        let key = (event.tgid, event.page_address(), event.error_code);
        let fresh = match self.seen.insert(key, event.at) {
            Some(before) => event.at.saturating_sub(before) > self.window,
            None => true,
        };
        if !fresh {
            self.retries += 1;
        }
        if self.seen.len() > PRUNE_AT {
            let horizon = event.at.saturating_sub(self.window);
            self.seen.retain(|_, &mut at| at >= horizon);
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
        }
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
    fn memory_stays_bounded() {
        let mut filter = RetryFilter::new(DEFAULT_WINDOW);
        for i in 0..(PRUNE_AT as u64 * 3) {
            filter.admit(&fault(1, i << 21, 6, i));
        }
        assert!(filter.seen.len() <= PRUNE_AT + 1, "{}", filter.seen.len());
    }
}
