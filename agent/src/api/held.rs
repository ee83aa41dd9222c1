//! The latest walk of the hugepages' holders ([`crate::holders`]) for `GET /metrics`: walked
//! again at a scrape when the last one is older than [`FRESH_FOR`], off the API threads, one
//! walk at a time, waited for at most [`WALK_WITHIN`]. `GET /v1/consumers` always walks afresh
//! and leaves its walk here too.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    holders::{self, Holders},
    sysfs::{HostFs, hugepages},
};

/// How long a walk answers scrapes: shorter than any scrape interval Prometheus is given in
/// practice (15 s or more), so each scrape sees a walk of its own, and a flood of scrapes
/// walks at most once per this.
pub const FRESH_FOR: Duration = Duration::from_secs(5);

/// How long a scrape waits for a walk before it answers with the latest one.
pub const WALK_WITHIN: Duration = Duration::from_secs(5);

/// A walk and when it was made.
type Walked = Option<(Instant, Arc<Holders>)>;

/// The latest walk and when it was made.
#[derive(Debug, Clone, Default)]
pub struct LatestWalk {
    /// Held by the scrape that walks: scrapes meanwhile answer with the latest walk.
    walking: Arc<tokio::sync::Mutex<()>>,
    latest: Arc<Mutex<Walked>>,
}

impl LatestWalk {
    /// The latest walk younger than [`FRESH_FOR`], or a new one. While another scrape walks,
    /// or when a walk takes longer than [`WALK_WITHIN`] (a process whose `maps` blocks on its
    /// memory lock), the latest walk however old; `None` when there is none yet (the metrics
    /// then leave the holders out).
    pub async fn fresh(&self, host: &HostFs) -> Option<Arc<Holders>> {
        if let Some(held) = self.young() {
            return Some(held);
        }
        let Ok(_walking) = self.walking.try_lock() else {
            return self.latest();
        };
        let host = host.clone();
        let walk = tokio::task::spawn_blocking(move || walk(&host));
        match tokio::time::timeout(WALK_WITHIN, walk).await {
            Ok(Ok(Some(walked))) => Some(self.keep(walked)),
            _ => self.latest(),
        }
    }

    /// Keeps `held` as the latest walk, and returns it shared.
    pub fn keep(&self, held: Holders) -> Arc<Holders> {
        let held = Arc::new(held);
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some((Instant::now(), held.clone()));
        }
        held
    }

    fn latest(&self) -> Option<Arc<Holders>> {
        let latest = self.latest.lock().ok()?;
        latest.as_ref().map(|(_, held)| held.clone())
    }

    fn young(&self) -> Option<Arc<Holders>> {
        let latest = self.latest.lock().ok()?;
        let (at, held) = latest.as_ref()?;
        (at.elapsed() < FRESH_FOR).then(|| held.clone())
    }
}

fn walk(host: &HostFs) -> Option<Holders> {
    let pools = hugepages::read_table(host).ok()?;
    Some(holders::walk(host, &pools))
}
