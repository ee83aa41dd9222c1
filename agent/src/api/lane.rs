//! The heavy lane: admissions and hints whose body or pod is larger than a typical pod's are
//! worked out on a thread of their own, one at a time and under `SCHED_IDLE` (it has what the
//! machine's other threads leave of the CPU, and a sliver when they leave nothing), so that one
//! client's largest bodies never stand between another client's small request and its answer. The API thread reads such a body and hands it over ([`Lane::run`]); waiting for the
//! lane is asynchronous and holds up nothing else on the API thread.
//!
//! A request goes to the lane when its body is over [`HEAVY_BODY`] bytes (it is parsed there
//! too), or when its pod, once parsed, has more than [`HEAVY_CONTAINERS`] containers: the work
//! of an admission grows with both, and below them it costs the API thread less than a typical
//! admission does twice. `--max-containers` bounds what one request can cost the lane.

use std::{io, panic::AssertUnwindSafe, thread};

use tokio::sync::{mpsc, oneshot};

/// Bodies larger than this are parsed and worked out on the lane (a typical pod's body is a
/// few hundred bytes to a few KiB; parsing 16 KiB takes some tens of microseconds).
pub const HEAVY_BODY: usize = 16 << 10;

/// Pods of more containers than this (app and init) are worked out on the lane.
pub const HEAVY_CONTAINERS: usize = 8;

/// Requests waiting for the lane before a new one waits to be queued.
const QUEUE: usize = 16;

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    #[error("starting the heavy-request thread: {0}")]
    Start(#[source] io::Error),
    #[error("the heavy-request thread has stopped")]
    Stopped,
    #[error("the request failed on the heavy-request thread")]
    Panicked,
}

/// The lane's queue; cloned into every API thread's state.
#[derive(Debug, Clone)]
pub struct Lane {
    jobs: mpsc::Sender<Job>,
}

impl Lane {
    /// Starts the lane's thread. It ends once every [`Lane`] is dropped.
    pub fn start() -> Result<Lane, LaneError> {
        let (jobs, mut queue) = mpsc::channel::<Job>(QUEUE);
        thread::Builder::new()
            .name("http-api-heavy".to_owned())
            .spawn(move || {
                lower_priority();
                while let Some(job) = queue.blocking_recv() {
                    job();
                }
            })
            .map_err(LaneError::Start)?;
        Ok(Lane { jobs })
    }

    /// Runs `work` on the lane, after the requests queued before it, and returns the first of
    /// what it returned; the second (what the work leaves to free) is dropped on the lane once
    /// the first is on its way.
    pub async fn run<T: Send + 'static, L: 'static>(
        &self,
        work: impl FnOnce() -> (T, L) + Send + 'static,
    ) -> Result<T, LaneError> {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            // A request that panics fails alone, as it would on the API thread.
            match std::panic::catch_unwind(AssertUnwindSafe(work)) {
                Ok((out, left)) => {
                    let _ = done.send(Ok(out));
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(left)));
                }
                Err(_) => {
                    let _ = done.send(Err(LaneError::Panicked));
                }
            }
        });
        self.jobs.send(job).await.map_err(|_| LaneError::Stopped)?;
        result.await.map_err(|_| LaneError::Stopped)?
    }
}

/// Puts the calling thread under `SCHED_IDLE`: any other thread that wants the CPU (the API
/// threads, the run loop, the node's own work) takes it at once, where nice 10 still shares it
/// for a time slice; on a CPU that is never idle the lane still runs, at a weight of 3 against a
/// nice-0 thread's 1024, so a large request is answered late rather than never. A refusal leaves the thread as it is, with a warning (a thread may always
/// lower its own policy, so this does not happen in practice).
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: gettid has no preconditions; sched_setscheduler on our own thread id, with a
    // parameter that outlives the call, changes that thread only.
    let rc = unsafe { libc::sched_setscheduler(libc::gettid(), libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::warn!(
            "the heavy-request thread keeps its scheduling policy: sched_setscheduler(SCHED_IDLE): {}",
            io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_lane_thread_in_turn_at_a_lower_priority() {
        let lane = Lane::start().expect("the lane");
        let (name, policy) = lane
            .run(|| {
                let name = thread::current().name().map(str::to_owned);
                // SAFETY: sched_getscheduler of our own thread id has no preconditions.
                let policy = unsafe { libc::sched_getscheduler(libc::gettid()) };
                ((name, policy), ())
            })
            .await
            .expect("ran");
        assert_eq!(name.as_deref(), Some("http-api-heavy"));
        assert_eq!(policy, libc::SCHED_IDLE);
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // Queued together (each task sends its job when first polled, in order).
        let runs: Vec<_> = (0..5)
            .map(|i| {
                let (lane, order) = (lane.clone(), order.clone());
                tokio::spawn(async move {
                    lane.run(move || (order.lock().expect("order").push(i), ()))
                        .await
                })
            })
            .collect();
        for run in runs {
            run.await.expect("joined").expect("ran");
        }
        assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4]);
    }

    #[tokio::test]
    async fn a_request_that_panics_fails_alone() {
        let lane = Lane::start().expect("the lane");
        let failed = lane.run(|| -> (u8, ()) { panic!("a bad request") }).await;
        assert!(matches!(failed, Err(LaneError::Panicked)), "{failed:?}");
        assert_eq!(lane.run(|| (7, ())).await.expect("the lane still runs"), 7);
    }

    /// What the work leaves is freed after its answer is sent: the answer never waits for it.
    #[tokio::test]
    async fn what_the_work_leaves_is_freed_after_the_answer() {
        struct Leftover(std::sync::mpsc::Receiver<()>);
        impl Drop for Leftover {
            fn drop(&mut self) {
                // Freed only once the test, holding the answer, says so.
                let _ = self.0.recv();
            }
        }
        let lane = Lane::start().expect("the lane");
        let (free, freed) = std::sync::mpsc::channel();
        let answer = lane.run(move || (7, Leftover(freed))).await;
        assert_eq!(answer.expect("answered before the leftover was freed"), 7);
        free.send(()).expect("the leftover is still held");
        assert_eq!(lane.run(|| (8, ())).await.expect("the lane runs on"), 8);
    }
}
