//! The latest walk of the hugepages' holders ([`crate::holders`]) for `GET /metrics`: walked
//! again at a scrape when the last one is older than [`FRESH_FOR`], off the API threads, one
//! walk at a time. `GET /v1/consumers` always walks afresh and leaves its walk here too.

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

/// A walk and when it was made.
type Walked = Option<(Instant, Arc<Holders>)>;

/// The latest walk and when it was made.
#[derive(Debug, Clone, Default)]
pub struct LatestWalk {
    /// Held by the scrape that walks, so that scrapes at once make one walk.
    walking: Arc<tokio::sync::Mutex<()>>,
    latest: Arc<Mutex<Walked>>,
}

impl LatestWalk {
    /// The latest walk younger than [`FRESH_FOR`], or a new one; `None` when the pools cannot
    /// be read or the walk fails (the metrics then leave the holders out).
    pub async fn fresh(&self, host: &HostFs) -> Option<Arc<Holders>> {
        let _one_at_a_time = self.walking.lock().await;
        if let Some(held) = self.young() {
            return Some(held);
        }
        let host = host.clone();
        let walked = tokio::task::spawn_blocking(move || walk(&host))
            .await
            .ok()??;
        Some(self.keep(walked))
    }

    /// Keeps `held` as the latest walk, and returns it shared.
    pub fn keep(&self, held: Holders) -> Arc<Holders> {
        let held = Arc::new(held);
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Some((Instant::now(), held.clone()));
        }
        held
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
