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

/// A body as it arrived: its frames, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Received {
    frames: Vec<Bytes>,
    len: usize,
}

impl Received {
    /// Bytes in the body.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The body in one buffer: the frame itself when there is one, else a copy of them all.
    pub fn join(self) -> Bytes {
        match <[Bytes; 1]>::try_from(self.frames) {
            Ok([only]) => only,
            Err(frames) => {
                let mut joined = Vec::with_capacity(self.len);
                frames.iter().for_each(|f| joined.extend_from_slice(f));
                Bytes::from(joined)
            }
        }
    }
}

/// The whole body, at most `limit` bytes; `declared` is its `Content-Length`, if any.
pub async fn read(
    body: Body,
    declared: Option<usize>,
    limit: usize,
) -> Result<Received, BodyError> {
    if declared.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = body;
    let mut received = Received::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(failed)?;
        let Ok(data) = frame.into_data() else {
            // Trailers: nothing of the request.
            continue;
        };
        received.len += data.len();
        if received.len > limit {
            return Err(BodyError::TooLarge { limit });
        }
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

    #[tokio::test]
    async fn a_body_in_one_frame_is_taken_as_it_is_and_chunks_are_joined_in_order() {
        let frame = Bytes::from_static(b"{\"a\":1}");
        let one = read(chunked(vec![frame.to_vec()]), Some(7), 100).await;
        let one = one.expect("within the limit");
        assert_eq!(one.len(), 7);
        let joined = one.join();
        assert_eq!(joined, frame);
        let parts = vec![b"ab".to_vec(), Vec::new(), b"cd".to_vec(), b"e".to_vec()];
        let parts = read(chunked(parts), None, 100)
            .await
            .expect("within the limit");
        assert_eq!(parts.len(), 5);
        assert_eq!(parts.join(), Bytes::from_static(b"abcde"));
        let empty = read(chunked(Vec::new()), None, 100).await.expect("empty");
        assert!(empty.is_empty());
        assert_eq!(empty.join(), Bytes::new());
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_by_its_length_or_as_soon_as_it_exceeds_it() {
        let declared = read(chunked(vec![vec![b'x'; 10]]), Some(101), 100).await;
        assert_eq!(declared, Err(BodyError::TooLarge { limit: 100 }));
        let undeclared = read(chunked(vec![vec![b'x'; 60], vec![b'x'; 60]]), None, 100).await;
        assert_eq!(undeclared, Err(BodyError::TooLarge { limit: 100 }));
        let understated = read(chunked(vec![vec![b'x'; 60], vec![b'x'; 60]]), Some(10), 100).await;
        assert_eq!(understated, Err(BodyError::TooLarge { limit: 100 }));
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
        let silent = Body::new(Timed::new(Silent, limit, stats.clone()));
        let started = Instant::now();
        assert_eq!(
            read(silent, None, 100).await,
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
        let prompt = read(prompt, None, 100).await.expect("in time");
        assert_eq!(prompt.join(), Bytes::from_static(b"ababab"));
        assert_eq!(stats.cuts(Cut::BodyTimeout), 1);
    }

    /// Bug (#23): a 1 MiB body was read to its end before any other connection was served.
    /// Past [`TURN`] bytes the reader yields after every frame.
    #[tokio::test]
    async fn past_the_first_turn_the_reader_yields_after_every_frame() {
        let frames = 8;
        let body = chunked(vec![vec![b'x'; TURN]; frames]);
        let mut reading = Box::pin(read(body, None, 1 << 20));
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
