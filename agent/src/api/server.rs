//! The HTTP listeners' own threads, apart from the agent's run loop: the API (`--listen`,
//! `--api-threads` of them, default 1) and the plain metrics listener (`--metrics-listen`, one).
//! Each thread is a single-threaded runtime accepting on its listener's one socket, so a request
//! is read, verified and answered on one thread, and a thread that is busy leaves new
//! connections to the others.
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
//!
//! Each accepted connection is served by a task of its own: with TLS ([`ServerTls`]) the
//! handshake runs there, with the config current at the accept and a deadline, so a client that
//! stalls its handshake holds up no one and a reload never touches a connection in flight; then
//! hyper serves HTTP/1.1 with keep-alive. A refused handshake is counted by why. Where the TLS
//! config offers HTTP/2 ([`crate::tls::Alpn`], the webhook's listener) and the client chose it,
//! the connection is served as HTTP/2; the agent's API never offers it, and its connections are
//! HTTP/1.1 only.

use std::{io, net::SocketAddr, sync::mpsc, thread, time::Duration};

use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::graceful::GracefulConnection,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{oneshot, watch},
};
use tracing::{error, info, warn};

use crate::tls::{HANDSHAKE_TIMEOUT, Refusal, ServerTls};

/// Connections waiting to be accepted.
const BACKLOG: u32 = 1024;
/// How long a thread's runtime waits for its blocking tasks once its server has drained.
const BLOCKING_GRACE: Duration = Duration::from_secs(1);
/// How long accepting pauses after an error that is not the connection's (out of descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// A listener: the flag that names its address, and its threads' name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub flag: &'static str,
    pub threads: &'static str,
}

impl Endpoint {
    /// The API (`--listen`): `/v1`, metrics and probes, TLS when configured.
    pub const API: Endpoint = Endpoint {
        flag: "--listen",
        threads: "http-api",
    };
    /// Plain HTTP for `/metrics`, `/healthz`, `/readyz` only (`--metrics-listen`).
    pub const METRICS: Endpoint = Endpoint {
        flag: "--metrics-listen",
        threads: "http-metrics",
    };
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{flag} {addr}: {source}")]
    Listen {
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("starting thread {name}-{index}: {source}")]
    Thread {
        name: &'static str,
        index: usize,
        #[source]
        source: io::Error,
    },
}

/// How the threads ended after the stop signal.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Threads still busy at the deadline.
    pub busy: usize,
    /// The first thread that ended without saying so (it panicked).
    pub failed: Option<String>,
}

/// The listening socket, bound; [`Server::start`] makes the threads.
#[derive(Debug)]
pub struct Bound {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    endpoint: Endpoint,
}

impl Bound {
    /// The address bound (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The running threads of one listener or more.
#[derive(Debug)]
pub struct Server {
    done: Vec<(String, oneshot::Receiver<()>)>,
}

impl Server {
    /// Binds the listening socket (no other socket may hold the port); call within a runtime.
    pub fn bind(endpoint: Endpoint, addr: SocketAddr) -> Result<Bound, ServerError> {
        let listen = |source| ServerError::Listen {
            flag: endpoint.flag,
            addr,
            source,
        };
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
        Ok(Bound {
            listener,
            addr,
            endpoint,
        })
    }

    /// Starts `threads` threads serving `router` on `bound` until `stop` turns true, each
    /// connection over TLS when `tls` is given, and waits until each listens; a thread that
    /// cannot start is an error naming it.
    pub fn start(
        bound: Bound,
        threads: usize,
        router: Router,
        tls: Option<ServerTls>,
        stop: watch::Receiver<bool>,
    ) -> Result<Server, ServerError> {
        let name = bound.endpoint.threads;
        let failed = |index, source| ServerError::Thread {
            name,
            index,
            source,
        };
        let mut done = Vec::with_capacity(threads);
        let (listening, started) = mpsc::channel();
        for index in 0..threads.max(1) {
            let socket = bound
                .listener
                .try_clone()
                .map_err(|source| failed(index, source))?;
            let (tx, rx) = oneshot::channel();
            let router = router.clone();
            let tls = tls.clone();
            let stop = stop.clone();
            let listening = listening.clone();
            let thread = format!("{name}-{index}");
            thread::Builder::new()
                .name(thread.clone())
                .spawn(move || {
                    serve_thread(index, socket, router, tls, stop, listening);
                    let _ = tx.send(());
                })
                .map_err(|source| failed(index, source))?;
            done.push((thread, rx));
        }
        drop(listening);
        for _ in 0..done.len() {
            match started.recv() {
                Ok(Ok(())) => {}
                Ok(Err((index, source))) => return Err(failed(index, source)),
                Err(_) => {
                    return Err(failed(
                        0,
                        io::Error::other("a thread ended before it listened"),
                    ));
                }
            }
        }
        Ok(Server { done })
    }

    /// These threads and `other`'s, stopped and waited for together.
    pub fn and(mut self, other: Server) -> Server {
        self.done.extend(other.done);
        self
    }

    /// Waits up to `deadline` for every thread to finish.
    /// Waits for the threads up to `deadline` and logs how the listeners stopped.
    pub async fn drain(self, deadline: Duration) {
        let drained = self.stopped(deadline).await;
        if let Some(err) = &drained.failed {
            warn!("the HTTP listeners stopped with an error: {err}");
        }
        match drained.busy {
            0 => info!("HTTP API drained"),
            n => {
                warn!("{n} HTTP listener thread(s) still busy after {deadline:?}; stopping anyway")
            }
        }
    }

    pub async fn stopped(mut self, deadline: Duration) -> Drained {
        let until = tokio::time::Instant::now() + deadline;
        let mut drained = Drained::default();
        for (thread, done) in &mut self.done {
            // A thread that has finished answers even after the deadline.
            match tokio::time::timeout_at(until, done).await {
                Err(_) => drained.busy += 1,
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    drained
                        .failed
                        .get_or_insert_with(|| format!("thread {thread} ended without an answer"));
                }
            }
        }
        drained
    }
}

/// Whether a thread listens, or why it cannot (its index and the error).
type Listening = Result<(), (usize, io::Error)>;

/// One thread: its runtime, its registration of the socket (reported on `listening`), the
/// server.
fn serve_thread(
    index: usize,
    socket: std::net::TcpListener,
    router: Router,
    tls: Option<ServerTls>,
    stop: watch::Receiver<bool>,
    listening: mpsc::Sender<Listening>,
) {
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
            // Server::start fails with it.
            let _ = listening.send(Err((index, err)));
            return;
        }
    };
    let _ = listening.send(Ok(()));
    runtime.block_on(serve(listener, router, tls, stop));
    runtime.shutdown_timeout(BLOCKING_GRACE);
}

/// Accepts until `stop` turns true, each connection in a task of its own (a TLS handshake
/// included, so a slow client holds up nobody); then waits for every connection to end, each
/// told to close once its request in flight is answered.
async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
) {
    // Every connection's task holds a receiver; once all are dropped, every connection ended.
    let (open, connection) = watch::channel(());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        match accepted {
            Ok((tcp, _)) => {
                tokio::spawn(serve_connection(
                    tcp,
                    router.clone(),
                    tls.clone(),
                    stop.clone(),
                    connection.clone(),
                ));
            }
            Err(err) => accept_failed(err).await,
        }
    }
    drop(listener);
    drop(connection);
    open.closed().await;
}

/// An accept error: the connection's own (it is gone) or the process's (out of descriptors:
/// pause, so as not to spin, and try again).
async fn accept_failed(err: io::Error) {
    if matches!(
        err.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    ) {
        return;
    }
    error!("accepting a connection: {err}; pausing {ACCEPT_PAUSE:?}");
    tokio::time::sleep(ACCEPT_PAUSE).await;
}

/// The most a connection reads from its socket at once (hyper's default is about 400 KiB): one
/// read of a large body holds the API thread for a few microseconds, not a tenth of a
/// millisecond, and the body reader takes turns between reads ([`super::body`]). Headers must
/// fit in it too; 64 KiB is four times what the kube-apiserver accepts in a request line and
/// headers by default.
const READ_BUFFER: usize = 64 << 10;

/// One connection: the TLS handshake (with its deadline) when configured, then HTTP/1.1, or
/// HTTP/2 as well when ALPN chose `h2`.
async fn serve_connection(
    tcp: TcpStream,
    router: Router,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
    _open: watch::Receiver<()>,
) {
    let Some(tls) = tls else {
        return until_stopped(http1_connection(tcp, router), stop).await;
    };
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor().accept(tcp));
    let shaken = tokio::select! {
        shaken = handshake => shaken,
        _ = stop.wait_for(|stopped| *stopped) => return,
    };
    match shaken {
        Ok(Ok(stream)) if stream.get_ref().1.alpn_protocol() == Some(b"h2") => {
            let connection = http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
            until_stopped(connection, stop).await;
        }
        Ok(Ok(stream)) => until_stopped(http1_connection(stream, router), stop).await,
        Ok(Err(err)) => tls.refused(Refusal::of(&err)),
        Err(_) => tls.refused(Refusal::Timeout),
    }
}

/// HTTP/1.1 over `io`, kept alive.
fn http1_connection<I>(io: I, router: Router) -> impl GracefulConnection
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    http1::Builder::new()
        .max_buf_size(READ_BUFFER)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router))
}

/// Serves `connection` until the client closes it or `stop` turns true; then lets it finish the
/// requests it has begun.
async fn until_stopped(connection: impl GracefulConnection, mut stop: watch::Receiver<bool>) {
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        _ = stop.wait_for(|stopped| *stopped) => connection.as_mut().graceful_shutdown(),
    }
    // Errors of a connection are the client's (it went away); nothing to report.
    let _ = connection.await;
}

#[cfg(test)]
mod tests;
