//! The memory budget for request bodies: how many bytes of bodies a listener holds at once,
//! across all its connections (`--body-budget`). A per-request limit bounds one body; without a
//! bound on all of them together, six clients sending the webhook's largest body at once took
//! it past its memory limit (#38).
//!
//! A body is charged as it arrives, frame by frame ([`super::body::read`]), never reserved ahead
//! by its `Content-Length`: a client that declares a large body and sends it a byte a second
//! holds only the bytes it sent, until `--body-read-timeout` ends it. A frame that does not fit
//! waits for room for at most [`WAIT`] (counted once per request); then the request is refused
//! with 503 and `Retry-After` ([`Exhausted`]), and what it held is given back. The waiting is
//! first come, first served (tokio's semaphore), and a frame is small (a socket read, 64 KiB at
//! most, or an HTTP/2 DATA frame), so no large request stands in front of small ones.
//!
//! A small body (one that declares at most [`SMALL_BODY`] bytes: an admission review, a
//! scheduler call, an agent's dry run) that finds the budget full takes its bytes from a reserve
//! of [`RESERVE_SHARE`] of it instead of waiting behind the large ones: a flood of bodies at the
//! limit made a well-behaved caller's few KiB wait up to the whole second (#38). The reserve is
//! part of the budget, so what all bodies hold together stays within it.
//!
//! What a request took stays charged ([`Charge`]) until the handler drops it, after the answer
//! is built: the parsed request lives as long. The listener's stats ([`ConnectionStats`]) show
//! the budget and the bytes held, and count the refusals (`limit="body_budget"`).

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::telemetry::connections::{ConnectionStats, Cut};

/// How long a request waits, in all, for room in the budget before it is refused.
pub const WAIT: Duration = Duration::from_secs(1);

/// The largest budget: the semaphore counts bytes in `u32` steps.
pub const MAX_BYTES: u64 = u32::MAX as u64;

/// A body that declares at most this many bytes may use the reserve.
pub const SMALL_BODY: usize = 64 << 10;

/// The reserve for small bodies: this fraction of the budget (one eighth).
pub const RESERVE_SHARE: usize = 8;

/// The budget was full for longer than [`WAIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the listener holds {budget} bytes of request bodies (--body-budget) and had no room for {wanted} more within {WAIT:?}; retry after {retry_after:?}"
)]
pub struct Exhausted {
    pub budget: usize,
    pub wanted: usize,
    /// What the answer's `Retry-After` says.
    pub retry_after: Duration,
}

/// One listener's budget for request bodies: the part any body may take, and the reserve.
#[derive(Debug)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    bytes: usize,
    stats: Arc<ConnectionStats>,
}

impl BodyBudget {
    /// A budget of `bytes` (at most [`MAX_BYTES`]), shown and counted in `stats`.
    pub fn new(bytes: usize, stats: Arc<ConnectionStats>) -> BodyBudget {
        let bytes = bytes.min(usize::try_from(MAX_BYTES).unwrap_or(usize::MAX));
        let reserve = bytes / RESERVE_SHARE;
        stats.set_body_budget(bytes);
        BodyBudget {
            permits: Arc::new(Semaphore::new(bytes - reserve)),
            reserve: Arc::new(Semaphore::new(reserve)),
            bytes,
            stats,
        }
    }

    /// [`BodyBudget::new`], to share between a listener's requests.
    pub fn shared(bytes: usize, stats: &Arc<ConnectionStats>) -> Arc<BodyBudget> {
        Arc::new(BodyBudget::new(bytes, Arc::clone(stats)))
    }

    /// The budget's size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The listener's stats, where refusals are counted.
    pub fn stats(&self) -> &ConnectionStats {
        &self.stats
    }

    /// The charge of a request whose body declares `declared` bytes (its `Content-Length`),
    /// empty.
    pub fn charge(&self, declared: Option<usize>) -> Charge {
        Charge {
            held: [None, None],
            small: declared.is_some_and(|n| n <= SMALL_BODY),
            stats: Arc::clone(&self.stats),
            waited: Duration::ZERO,
        }
    }

    /// Adds `bytes` to `charge`: at once when there is room (for a small body, in the reserve
    /// too), else waiting while the request has waited less than [`WAIT`] in all (a small body
    /// in the reserve's queue, any other in the budget's); refused (and counted) past it.
    pub async fn take(&self, charge: &mut Charge, bytes: usize) -> Result<(), Exhausted> {
        if bytes == 0 {
            return Ok(());
        }
        let exhausted = Exhausted {
            budget: self.bytes,
            wanted: bytes,
            retry_after: WAIT,
        };
        let Ok(n) = u32::try_from(bytes) else {
            self.stats.cut(Cut::BodyBudget);
            return Err(exhausted);
        };
        let at_once = Arc::clone(&self.permits)
            .try_acquire_many_owned(n)
            .map(|p| (p, 0))
            .or_else(|e| match charge.small {
                true => Arc::clone(&self.reserve)
                    .try_acquire_many_owned(n)
                    .map(|p| (p, 1)),
                false => Err(e),
            });
        let (permit, from) = match at_once {
            Ok(taken) => taken,
            Err(_) => {
                let (queue, from) = match charge.small {
                    true => (&self.reserve, 1),
                    false => (&self.permits, 0),
                };
                let left = WAIT.saturating_sub(charge.waited);
                let started = Instant::now();
                let waited =
                    tokio::time::timeout(left, Arc::clone(queue).acquire_many_owned(n)).await;
                charge.waited += started.elapsed();
                match waited {
                    Ok(Ok(permit)) => (permit, from),
                    // Timed out, or the semaphore closed (it never is).
                    Ok(Err(_)) | Err(_) => {
                        self.stats.cut(Cut::BodyBudget);
                        return Err(exhausted);
                    }
                }
            }
        };
        self.stats.body_taken(bytes);
        match charge.held[from].as_mut() {
            Some(held) => held.merge(permit),
            None => charge.held[from] = Some(permit),
        }
        Ok(())
    }
}

/// The bytes one request holds of its listener's budget (of the part any body may take, and of
/// the reserve); given back when dropped.
#[derive(Debug)]
pub struct Charge {
    held: [Option<OwnedSemaphorePermit>; 2],
    /// Whether the body declared itself small enough for the reserve.
    small: bool,
    stats: Arc<ConnectionStats>,
    /// How long the request has waited for room so far.
    waited: Duration,
}

impl Charge {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.held
            .iter()
            .flatten()
            .map(OwnedSemaphorePermit::num_permits)
            .sum()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.stats.body_given_back(self.bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_charge_holds_its_bytes_until_dropped_and_the_stats_show_them() {
        let stats = Arc::new(ConnectionStats::default());
        // 88 bytes for any body, 12 in reserve for small ones.
        let budget = BodyBudget::new(100, stats.clone());
        let mut charge = budget.charge(None);
        budget.take(&mut charge, 60).await.expect("room");
        budget.take(&mut charge, 28).await.expect("room");
        assert_eq!(charge.bytes(), 88);
        assert_eq!(stats.body_held(), 88);
        assert_eq!(stats.body_budget(), 100);
        drop(charge);
        assert_eq!(stats.body_held(), 0);
        let mut again = budget.charge(None);
        budget.take(&mut again, 88).await.expect("given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_budget_refuses_after_the_wait_counts_it_and_keeps_what_others_hold() {
        let stats = Arc::new(ConnectionStats::default());
        // 87 for any body, 12 in reserve.
        let budget = BodyBudget::new(99, stats.clone());
        let mut holder = budget.charge(None);
        budget.take(&mut holder, 80).await.expect("room");
        let mut late = budget.charge(None);
        budget
            .take(&mut late, 7)
            .await
            .expect("the last seven bytes");
        let started = tokio::time::Instant::now();
        let refused = budget.take(&mut late, 1).await;
        assert_eq!(
            refused,
            Err(Exhausted {
                budget: 99,
                wanted: 1,
                retry_after: WAIT
            })
        );
        assert!(started.elapsed() >= WAIT, "{:?}", started.elapsed());
        assert_eq!(stats.cuts(Cut::BodyBudget), 1);
        // A request that has waited its whole turn is refused at once the next time.
        let again = tokio::time::Instant::now();
        assert!(budget.take(&mut late, 1).await.is_err());
        assert_eq!(again.elapsed(), Duration::ZERO);
        assert_eq!(stats.body_held(), 87);
        drop(late);
        assert_eq!(stats.body_held(), 80);
    }

    /// Bug (#38): a well-behaved caller's few KiB waited behind a flood of bodies at the limit.
    #[tokio::test(start_paused = true)]
    async fn a_small_body_takes_the_reserve_when_the_budget_is_full_and_a_large_one_cannot() {
        let stats = Arc::new(ConnectionStats::default());
        let budget = BodyBudget::new(8 * SMALL_BODY, stats.clone());
        let mut flood = budget.charge(None);
        budget
            .take(&mut flood, 7 * SMALL_BODY)
            .await
            .expect("all but the reserve");
        let started = tokio::time::Instant::now();
        let mut small = budget.charge(Some(SMALL_BODY));
        budget
            .take(&mut small, SMALL_BODY)
            .await
            .expect("the reserve");
        assert_eq!(started.elapsed(), Duration::ZERO, "at once");
        assert_eq!(stats.body_held() as usize, 8 * SMALL_BODY);
        let mut large = budget.charge(Some(SMALL_BODY + 1));
        assert!(
            budget.take(&mut large, 1).await.is_err(),
            "the reserve is not its"
        );
        let mut second = budget.charge(Some(100));
        assert!(
            budget.take(&mut second, 100).await.is_err(),
            "the reserve is full"
        );
        drop(small);
        budget
            .take(&mut second, 100)
            .await
            .expect("the reserve again");
        assert_eq!(stats.body_held() as usize, 7 * SMALL_BODY + 100);
        drop((flood, second));
        assert_eq!(stats.body_held(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_waiting_for_room_gets_it_when_another_request_ends_within_the_wait() {
        let stats = Arc::new(ConnectionStats::default());
        let budget = Arc::new(BodyBudget::new(100, stats));
        let mut holder = budget.charge(None);
        budget.take(&mut holder, 88).await.expect("room");
        let waiting = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move {
                let mut charge = budget.charge(None);
                budget.take(&mut charge, 50).await.map(|()| charge.bytes())
            })
        };
        tokio::time::sleep(WAIT / 2).await;
        drop(holder);
        assert_eq!(waiting.await.expect("the task"), Ok(50));
    }

    #[tokio::test]
    async fn a_budget_above_the_largest_is_capped_and_an_oversized_frame_refused() {
        let stats = Arc::new(ConnectionStats::default());
        let budget = BodyBudget::new(usize::MAX, stats.clone());
        assert_eq!(budget.bytes() as u64, MAX_BYTES);
        let mut charge = budget.charge(None);
        assert!(budget.take(&mut charge, usize::MAX).await.is_err());
        assert_eq!(stats.cuts(Cut::BodyBudget), 1);
    }
}
