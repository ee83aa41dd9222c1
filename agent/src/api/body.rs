//! Request bodies read in turns. The API thread serves every connection, so a client sending the
//! largest bodies allowed (1 MiB) must not hold it for the whole of a body's arrival: a body is
//! collected frame by frame (each at most one socket read, see `server`'s read buffer), and past
//! its first [`TURN`] bytes the thread is handed back to the other connections after every frame.
//! The frames are kept as they came ([`Received`]); joining them into one buffer is left to
//! whoever parses the body, so a large body is copied (and its buffer faulted in) on the heavy
//! lane, not on the API thread, and a typical body, one frame, is never copied. A body whose
//! `Content-Length` is over the limit is refused before any of it is read; one that turns out
//! longer, as soon as it does.
//!
//! A body must also arrive in time: the listener hands every request its body wrapped in
//! [`Timed`], which fails with [`TimedOut`] once `--body-read-timeout` has passed since the head
//! was read (a client sending a byte a second holds a connection no longer than that), and
//! [`read`] reports it as [`BodyError::TimedOut`].
//!
//! And every frame is charged to the listener's [`BodyBudget`] as it arrives: what a body holds
//! stays charged until its [`Charge`] is dropped, and a body that finds no room in time is
//! [`BodyError::Busy`]. A body over its limit is counted (`limit="body_too_large"`).

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::budget::{BodyBudget, Charge, Exhausted};
use crate::telemetry::connections::{ConnectionStats, Cut};

/// Bytes of a body read before the thread takes turns with other connections (a typical
/// admission's body is a few hundred bytes to a few KiB).
pub const TURN: usize = 16 << 10;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("reading the body: {0}")]
    Read(String),
    #[error("the body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error(transparent)]
    Busy(#[from] Exhausted),
}

/// A body still arriving when its time was up.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the body did not arrive within {0:?}")]
pub struct TimedOut(pub Duration);

/// A request body that must end within a time from when it was wrapped (when the request's head
/// was read); past it, the next frame it waits for is [`TimedOut`], counted in `stats`. The
/// timer is armed only when the body first has to wait for the client: a body that came with
/// its head (nearly every request, and every one without a body) costs no timer.
#[derive(Debug)]
pub struct Timed<B> {
    inner: B,
    limit: Duration,
    started: Instant,
    deadline: Option<Pin<Box<Sleep>>>,
    stats: Arc<ConnectionStats>,
}

impl<B> Timed<B> {
    pub fn new(inner: B, limit: Duration, stats: Arc<ConnectionStats>) -> Timed<B> {
        Timed {
            inner,
            limit,
            started: Instant::now(),
            deadline: None,
            stats,
        }
    }
}

impl<B> hyper::body::Body for Timed<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match this
                .deadline
                .get_or_insert_with(|| {
                    Box::pin(tokio::time::sleep_until(this.started + this.limit))
                })
                .as_mut()
                .poll(cx)
            {
                Poll::Ready(()) => {
                    this.stats.cut(Cut::BodyTimeout);
                    Poll::Ready(Some(Err(TimedOut(this.limit).into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The [`BodyError`] of a frame that failed: [`TimedOut`] (under axum's wrapping) or a read.
fn failed(err: axum::Error) -> BodyError {
    let err = err.into_inner();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err.as_ref());
    while let Some(e) = source {
        if let Some(TimedOut(limit)) = e.downcast_ref::<TimedOut>() {
            return BodyError::TimedOut(*limit);
        }
        source = e.source();
    }
    BodyError::Read(err.to_string())
}

/// A body as it arrived: its frames, in order, and what they hold of the budget.
#[derive(Debug)]
pub struct Received {
    frames: Vec<Bytes>,
    len: usize,
    charge: Charge,
}

impl Received {
    /// Bytes in the body.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body in one buffer (the frame itself when there is one, else a copy of them all),
    /// and its charge, to keep while what is parsed from it lives.
    pub fn join(self) -> (Bytes, Charge) {
        let bytes = match <[Bytes; 1]>::try_from(self.frames) {
            Ok([only]) => only,
            Err(frames) => {
                let mut joined = Vec::with_capacity(self.len);
                frames.iter().for_each(|f| joined.extend_from_slice(f));
                Bytes::from(joined)
            }
        };
        (bytes, self.charge)
    }
}

/// The request's `Content-Length`, when it sends one that reads as a number.
pub fn declared(headers: &hyper::HeaderMap) -> Option<usize> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
}

/// The whole body, at most `limit` bytes, charged to `budget`; `declared` is its
/// `Content-Length`, if any.
pub async fn read(
    body: Body,
    declared: Option<usize>,
    limit: usize,
    budget: &BodyBudget,
) -> Result<Received, BodyError> {
    let too_large = || {
        budget.stats().cut(Cut::BodyTooLarge);
        BodyError::TooLarge { limit }
    };
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = body;
    let mut received = Received {
        frames: Vec::new(),
        len: 0,
        charge: budget.charge(declared),
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(failed)?;
        let Ok(data) = frame.into_data() else {
            // Trailers: nothing of the request.
            continue;
        };
        received.len += data.len();
        if received.len > limit {
            return Err(too_large());
        }
        budget.take(&mut received.charge, data.len()).await?;
        if !data.is_empty() {
            received.frames.push(data);
        }
        if received.len > TURN {
            tokio::task::yield_now().await;
        }
    }
    Ok(received)
}

#[cfg(test)]
mod tests {
    use std::{
        collections::VecDeque,
        pin::Pin,
        task::{Context, Poll, Waker},
    };

    use hyper::body::Frame;

    use super::*;

    /// A body whose frames are ready at once, one per chunk.
    struct Chunks(VecDeque<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    fn chunked(chunks: Vec<Vec<u8>>) -> Body {
        Body::new(Chunks(chunks.into_iter().map(Bytes::from).collect()))
    }

    /// A budget far above any body here, with stats of its own.
    fn roomy() -> BodyBudget {
        BodyBudget::new(1 << 30, Arc::default())
    }

    /// The body's bytes, or why it was refused.
    fn bytes(read: Result<Received, BodyError>) -> Result<Bytes, BodyError> {
        read.map(|r| r.join().0)
    }

    #[tokio::test]
    async fn a_body_in_one_frame_is_taken_as_it_is_and_chunks_are_joined_in_order() {
        let budget = roomy();
        let frame = Bytes::from_static(b"{\"a\":1}");
        let one = read(chunked(vec![frame.to_vec()]), Some(7), 100, &budget).await;
        let one = one.expect("within the limit");
        assert_eq!(one.len(), 7);
        let (joined, charge) = one.join();
        assert_eq!(joined, frame);
        assert_eq!(charge.bytes(), 7);
        let parts = vec![b"ab".to_vec(), Vec::new(), b"cd".to_vec(), b"e".to_vec()];
        let parts = read(chunked(parts), None, 100, &budget)
            .await
            .expect("within the limit");
        assert_eq!(parts.len(), 5);
        assert_eq!(parts.join().0, Bytes::from_static(b"abcde"));
        let empty = read(chunked(Vec::new()), None, 100, &budget)
            .await
            .expect("empty");
        assert!(empty.is_empty());
        assert_eq!(empty.join().0, Bytes::new());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_by_its_length_or_as_soon_as_it_exceeds_it() {
        let stats = Arc::new(ConnectionStats::default());
        let budget = BodyBudget::new(1 << 20, stats.clone());
        let too_large = Err(BodyError::TooLarge { limit: 100 });
        let declared = read(chunked(vec![vec![b'x'; 10]]), Some(101), 100, &budget).await;
        assert_eq!(bytes(declared), too_large);
        let two = || chunked(vec![vec![b'x'; 60], vec![b'x'; 60]]);
        let undeclared = read(two(), None, 100, &budget).await;
        assert_eq!(bytes(undeclared), too_large);
        let understated = read(two(), Some(10), 100, &budget).await;
        assert_eq!(bytes(understated), too_large);
        assert_eq!(stats.cuts(Cut::BodyTooLarge), 3);
        assert_eq!(
            stats.body_held(),
            0,
            "a refused body gives back what it took"
        );
    }

    /// Bug (#38): six 50 MB bodies at once took the webhook past its memory limit; the budget
    /// bounds the bytes all bodies hold together.
    #[tokio::test(start_paused = true)]
    async fn bodies_hold_at_most_the_budget_together_and_one_that_finds_no_room_is_busy() {
        let stats = Arc::new(ConnectionStats::default());
        // 88 bytes for any body, 12 in reserve for small ones.
        let budget = BodyBudget::new(100, stats.clone());
        let first = read(chunked(vec![vec![b'x'; 60]]), None, 100, &budget)
            .await
            .expect("room for the first");
        assert_eq!(stats.body_held(), 60);
        let second = read(
            chunked(vec![vec![b'x'; 20], vec![b'x'; 30]]),
            None,
            100,
            &budget,
        )
        .await;
        assert!(
            matches!(
                second,
                Err(BodyError::Busy(Exhausted {
                    budget: 100,
                    wanted: 30,
                    ..
                }))
            ),
            "{second:?}"
        );
        assert_eq!(
            stats.body_held(),
            60,
            "the refused body gave back its first frame"
        );
        assert_eq!(stats.cuts(Cut::BodyBudget), 1);
        // A declared length reserves nothing ahead: a body that has sent nothing holds nothing.
        let silent = Body::new(Timed::new(Silent, Duration::from_secs(5), stats.clone()));
        let waiting = read(silent, Some(100), 100, &budget);
        let timed = tokio::time::timeout(Duration::from_secs(1), waiting).await;
        assert!(timed.is_err(), "still waiting for its bytes");
        assert_eq!(stats.body_held(), 60);
        drop(first);
        assert_eq!(stats.body_held(), 0);
    }

    /// A body that never sends anything.
    struct Silent;

    impl hyper::body::Body for Silent {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_body_still_arriving_at_its_deadline_is_cut_and_counted_one_in_time_is_not() {
        let limit = Duration::from_millis(200);
        let stats = Arc::new(ConnectionStats::default());
        let budget = roomy();
        let silent = Body::new(Timed::new(Silent, limit, stats.clone()));
        let started = Instant::now();
        assert_eq!(
            bytes(read(silent, None, 100, &budget).await),
            Err(BodyError::TimedOut(limit))
        );
        assert!(
            started.elapsed() >= limit,
            "cut after {:?}",
            started.elapsed()
        );
        assert_eq!(stats.cuts(Cut::BodyTimeout), 1);
        let chunks = Chunks(vec![Bytes::from_static(b"ab"); 3].into());
        let prompt = Body::new(Timed::new(chunks, limit, stats.clone()));
        let prompt = read(prompt, None, 100, &budget).await;
        assert_eq!(bytes(prompt), Ok(Bytes::from_static(b"ababab")));
        assert_eq!(stats.cuts(Cut::BodyTimeout), 1);
    }

    /// Bug (#23): a 1 MiB body was read to its end before any other connection was served.
    /// Past [`TURN`] bytes the reader yields after every frame.
    #[tokio::test]
    async fn past_the_first_turn_the_reader_yields_after_every_frame() {
        let frames = 8;
        let body = chunked(vec![vec![b'x'; TURN]; frames]);
        let budget = roomy();
        let mut reading = Box::pin(read(body, None, 1 << 20, &budget));
        let mut pending = 0;
        let mut cx = Context::from_waker(Waker::noop());
        let whole = loop {
            match std::future::Future::poll(reading.as_mut(), &mut cx) {
                Poll::Ready(whole) => break whole,
                Poll::Pending => pending += 1,
            }
        };
        assert_eq!(whole.map(|b| b.len()), Ok(frames * TURN));
        // The first frame is within the turn; each of the others is followed by a yield.
        assert_eq!(pending, frames - 1);
    }
}
