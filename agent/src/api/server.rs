//! The HTTP API's own threads (`--api-threads`, default 1), apart from the agent's run loop: each
//! a single-threaded runtime accepting on the one `--listen` socket, so a request is read,
//! verified and answered on one thread, and a thread that is busy leaves new connections to the
//! others.
//!
//! On the work-stealing runtime that also runs the agent's loop, every readiness event woke a
//! second worker (a futex wake and a context switch) and the two workers handed connections back
//! and forth; on a two-core node shared with the load, that cost more CPU than the admission.
//! Here a thread waits in its own `epoll_wait` and nothing crosses threads but the shared state.
//!
//! [`Server::bind`] binds the socket before anything starts, without `SO_REUSEPORT`: a port that
//! another process holds (a second agent on the node) fails the start instead of splitting the
//! admissions between two reservation stores. Each thread registers a duplicate of the socket
//! with its own runtime; [`Server::start`] returns once every thread listens, or with the first
//! that could not. [`Server::stopped`] waits, up to a deadline, for every thread to drain after
//! the stop signal.

use std::{io, net::SocketAddr, sync::mpsc, thread, time::Duration};

use axum::Router;
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::{oneshot, watch},
};

/// Connections waiting to be accepted.
const BACKLOG: u32 = 1024;
/// How long a thread's runtime waits for its blocking tasks once its server has drained.
const BLOCKING_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("--listen {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("starting HTTP API thread {index}: {source}")]
    Thread {
        index: usize,
        #[source]
        source: io::Error,
    },
}

/// How the API threads ended after the stop signal.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Threads still busy at the deadline.
    pub busy: usize,
    /// The first error a thread's server stopped with.
    pub failed: Option<String>,
}

/// The listening socket, bound; [`Server::start`] makes the threads.
#[derive(Debug)]
pub struct Bound {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl Bound {
    /// The address bound (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The running API threads.
#[derive(Debug)]
pub struct Server {
    done: Vec<oneshot::Receiver<io::Result<()>>>,
}

impl Server {
    /// Binds the listening socket (no other socket may hold the port); call within a runtime.
    pub fn bind(addr: SocketAddr) -> Result<Bound, ServerError> {
        let listen = |source| ServerError::Listen { addr, source };
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .map_err(listen)?;
        // SO_REUSEADDR lets a restarted agent bind while old connections sit in TIME_WAIT; it
        // does not let two listeners share the port.
        socket.set_reuseaddr(true).map_err(listen)?;
        // Linux copies TCP_NODELAY to accepted connections: answers leave without waiting.
        socket.set_nodelay(true).map_err(listen)?;
        socket.bind(addr).map_err(listen)?;
        let listener = socket.listen(BACKLOG).map_err(listen)?;
        let addr = listener.local_addr().map_err(listen)?;
        let listener = listener.into_std().map_err(listen)?;
        Ok(Bound { listener, addr })
    }

    /// Starts `threads` API threads serving `router` until `stop` turns true, and waits until
    /// each listens; a thread that cannot start is an error naming it.
    pub fn start(
        bound: Bound,
        threads: usize,
        router: Router,
        stop: watch::Receiver<bool>,
    ) -> Result<Server, ServerError> {
        let mut done = Vec::with_capacity(threads);
        let (listening, started) = mpsc::channel();
        for index in 0..threads.max(1) {
            let socket = bound
                .listener
                .try_clone()
                .map_err(|source| ServerError::Thread { index, source })?;
            let (tx, rx) = oneshot::channel();
            let router = router.clone();
            let stop = stop.clone();
            let listening = listening.clone();
            thread::Builder::new()
                .name(format!("http-api-{index}"))
                .spawn(move || {
                    let _ = tx.send(serve_thread(index, socket, router, stop, listening));
                })
                .map_err(|source| ServerError::Thread { index, source })?;
            done.push(rx);
        }
        drop(listening);
        for _ in 0..done.len() {
            match started.recv() {
                Ok(Ok(())) => {}
                Ok(Err((index, source))) => return Err(ServerError::Thread { index, source }),
                Err(_) => {
                    return Err(ServerError::Thread {
                        index: 0,
                        source: io::Error::other("a thread ended before it listened"),
                    });
                }
            }
        }
        Ok(Server { done })
    }

    /// Waits up to `deadline` for every thread to finish.
    pub async fn stopped(mut self, deadline: Duration) -> Drained {
        let until = tokio::time::Instant::now() + deadline;
        let mut drained = Drained::default();
        for done in &mut self.done {
            // A thread that has finished answers even after the deadline.
            match tokio::time::timeout_at(until, done).await {
                Err(_) => drained.busy += 1,
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => {
                    drained.failed.get_or_insert(err.to_string());
                }
                Ok(Err(_)) => {
                    drained
                        .failed
                        .get_or_insert_with(|| "the thread ended without an answer".to_owned());
                }
            }
        }
        drained
    }
}

/// Whether a thread listens, or why it cannot (its index and the error).
type Listening = Result<(), (usize, io::Error)>;

/// One API thread: its runtime, its registration of the socket (reported on `listening`), the
/// server.
fn serve_thread(
    index: usize,
    socket: std::net::TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
    listening: mpsc::Sender<Listening>,
) -> io::Result<()> {
    let started = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .and_then(|runtime| {
            let listener = {
                let _entered = runtime.enter();
                TcpListener::from_std(socket)?
            };
            Ok((runtime, listener))
        });
    let (runtime, listener) = match started {
        Ok(started) => started,
        Err(err) => {
            // Server::start fails with it; nothing waits for this thread's result.
            let _ = listening.send(Err((index, err)));
            return Ok(());
        }
    };
    let _ = listening.send(Ok(()));
    let served = runtime.block_on(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            })
            .await
    });
    runtime.shutdown_timeout(BLOCKING_GRACE);
    served
}

#[cfg(test)]
mod tests;
