//! The latest walk of the hugepages' holders ([`crate::holders`]) for `GET /metrics`: walked
//! again at a scrape when the last one is older than [`FRESH_FOR`], or when the probes' book saw
//! a hugetlbfs file made, fallocated, truncated or evicted since ([`Book::generation`]), off the
//! API threads, waited for at most [`WALK_WITHIN`]. `GET /v1/consumers` always walks afresh and
//! leaves its walk here too. One walk at a time, whoever asks: a scrape that gave up waiting
//! leaves its walk holding the gate until it ends, so scrapes meanwhile answer with the latest
//! walk instead of starting more, and a `GET /v1/consumers` that finds a walk running waits
//! for it and answers with it (it began after the request).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    holders::{self, Holders, book::Book},
    host::HugepageTable,
    sysfs::{HostFs, hugepages},
};

/// How long a walk answers scrapes: shorter than any scrape interval Prometheus is given in
/// practice (15 s or more), so each scrape sees a walk of its own, and a flood of scrapes
/// walks at most once per this.
pub const FRESH_FOR: Duration = Duration::from_secs(5);

/// How long a scrape waits for a walk before it answers with the latest one.
pub const WALK_WITHIN: Duration = Duration::from_secs(5);

/// A walk, when it was made, and the book's generation as it began.
type Walked = Option<(Instant, u64, Arc<Holders>)>;

/// The latest walk and when it was made, and the book it reconciles.
#[derive(Debug, Clone, Default)]
pub struct LatestWalk {
    /// What the probes saw between walks; the run loop writes it.
    pub book: Book,
    /// Held by the walk under way (moved into it, so it is held until the walk ends, not
    /// until its caller stops waiting).
    walking: Arc<tokio::sync::Mutex<()>>,
    latest: Arc<Mutex<Walked>>,
}

impl LatestWalk {
    /// The latest walk younger than [`FRESH_FOR`], or a new one. While another scrape walks,
    /// or when a walk takes longer than [`WALK_WITHIN`] (a process whose `maps` blocks on its
    /// memory lock), the latest walk however old; `None` when there is none yet (the metrics
    /// then leave the holders out).
    pub async fn fresh(&self, host: &HostFs) -> Option<Arc<Holders>> {
        if let Some(held) = self.young(self.book.generation()) {
            return Some(held);
        }
        let Ok(walking) = self.walking.clone().try_lock_owned() else {
            return self.latest();
        };
        let (host, latest) = (host.clone(), self.clone());
        let walk = tokio::task::spawn_blocking(move || {
            let pools = hugepages::read_table(&host).ok()?;
            Some(latest.walk_holding(&host, &pools, walking))
        });
        match tokio::time::timeout(WALK_WITHIN, walk).await {
            Ok(Ok(Some(walked))) => Some(walked),
            _ => self.latest(),
        }
    }

    /// Walks the host now with the book, keeps the walk as the latest, and returns it shared;
    /// when a walk is under way, waits for it and returns it instead (it began after this was
    /// asked). Blocks: call it off the API threads.
    pub fn walk(&self, host: &HostFs, pools: &HugepageTable) -> Arc<Holders> {
        let asked = Instant::now();
        let walking = self.walking.clone().blocking_lock_owned();
        if let Ok(latest) = self.latest.lock()
            && let Some((at, generation, held)) = latest.as_ref()
            && *at > asked
            && *generation == self.book.generation()
        {
            return held.clone();
        }
        self.walk_holding(host, pools, walking)
    }

    /// Walks with the gate held by `_walking` until the walk is kept.
    fn walk_holding(
        &self,
        host: &HostFs,
        pools: &HugepageTable,
        _walking: tokio::sync::OwnedMutexGuard<()>,
    ) -> Arc<Holders> {
        let generation = self.book.generation();
        self.keep(generation, holders::walk_with(host, pools, &self.book))
    }

    /// Keeps `held`, walked from the book's `generation`, as the latest walk, and returns it
    /// shared.
    fn keep(&self, generation: u64, held: Holders) -> Arc<Holders> {
        let held = Arc::new(held);
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some((Instant::now(), generation, held.clone()));
        }
        held
    }

    fn latest(&self) -> Option<Arc<Holders>> {
        let latest = self.latest.lock().ok()?;
        latest.as_ref().map(|(_, _, held)| held.clone())
    }

    /// The latest walk when younger than [`FRESH_FOR`] and made from the book's `generation`.
    fn young(&self, generation: u64) -> Option<Arc<Holders>> {
        let latest = self.latest.lock().ok()?;
        let (at, walked_from, held) = latest.as_ref()?;
        (at.elapsed() < FRESH_FOR && *walked_from == generation).then(|| held.clone())
    }
}
