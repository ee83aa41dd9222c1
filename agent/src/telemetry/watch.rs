//! The map watch's counters (`GET /v1/hugepages?watch=true`, [`crate::api::watch`]): watchers
//! now, watches refused for want of a slot, events sent per type, and states published. Updated
//! by the watch without locks, read at scrape time.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::encode::{Encoder, Kind};

/// Event types, in the order of [`WatchStats::events`].
pub const EVENT_KINDS: [&str; 3] = ["SNAPSHOT", "MODIFIED", "BOOKMARK"];

#[derive(Debug, Default)]
pub struct WatchStats {
    /// Watches open now.
    pub watchers: AtomicUsize,
    /// Watches refused because `--max-watchers` were open.
    pub refused: AtomicU64,
    /// Events sent, per [`EVENT_KINDS`].
    pub events: [AtomicU64; 3],
    /// New states the hub published (their content changed).
    pub published: AtomicU64,
}

impl WatchStats {
    /// Writes the watch's families.
    pub fn encode(&self, e: &mut Encoder) {
        const WATCHERS: &str = "hugepage_agent_watchers";
        e.family(
            WATCHERS,
            Kind::Gauge,
            "Open watches of the map (GET /v1/hugepages?watch=true).",
        );
        let open = self.watchers.load(Ordering::Relaxed);
        e.sample(WATCHERS, &[], open as f64);
        const REFUSED: &str = "hugepage_agent_watches_refused_total";
        e.family(
            REFUSED,
            Kind::Counter,
            "Watches refused with 503 because --max-watchers were open.",
        );
        let refused = self.refused.load(Ordering::Relaxed);
        e.sample(REFUSED, &[], refused as f64);
        const EVENTS: &str = "hugepage_agent_watch_events_total";
        e.family(
            EVENTS,
            Kind::Counter,
            "Watch events sent, per type: SNAPSHOT (a watch's first state), MODIFIED (a new state), BOOKMARK (a heartbeat).",
        );
        for (kind, n) in EVENT_KINDS.iter().zip(&self.events) {
            e.sample(EVENTS, &[("type", kind)], n.load(Ordering::Relaxed) as f64);
        }
        const PUBLISHED: &str = "hugepage_agent_watch_states_total";
        e.family(
            PUBLISHED,
            Kind::Counter,
            "States of the map the watch published: each a change of free, reserved or unreserved hugepages on a NUMA node, or of the NUMA selection's inputs.",
        );
        let published = self.published.load(Ordering::Relaxed);
        e.sample(PUBLISHED, &[], published as f64);
    }
}
