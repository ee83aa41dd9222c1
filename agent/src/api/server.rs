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
//!
//! **Who calls.** With a client CA, the names of the certificate a client presented
//! ([`ClientNames`]: its common name and DNS SANs) make the connection's [`Caller`], which every
//! request carries in its extensions: a listener with required names ([`Callers::required`],
//! the webhook's `--client-names`) closes a connection whose certificate has none of them right
//! after the handshake, before reading a request (counted as the handshake refusal
//! `name_not_allowed`); one with writers' names ([`Callers::writers`], the agent's
//! `--admit-client-names`) marks whether the caller may change state, which the routes check
//! ([`super::authz`]). Without a client CA there is no caller and nothing is checked.
//!
//! A client that misbehaves must not hurt the others; what a listener tolerates is its
//! [`Limits`], and what they did is counted in its [`ConnectionStats`]. Before its client is
//! authenticated a connection holds places of its own ([`slots`]):
//! * at most `max_connections_per_peer` from one source address, handshaking and served
//!   together, so that one peer cannot hold every place; one more is accepted and closed at
//!   once with a reset;
//! * at most `max_handshakes` TLS handshakes at once, counted apart from the served
//!   connections, so handshakes that stall keep no served connection out; each must end
//!   within `handshake_timeout`, and the first request's head must then be complete within
//!   `handshake_timeout` of it, or the connection is closed (counted `idle`);
//! * at most `max_connections` served at once (its threads together; a TLS connection counts
//!   from the end of its handshake): one more is accepted and closed at once with a reset, so
//!   the client learns at once instead of waiting in the backlog, where it would also delay the
//!   well-behaved connections queued behind it;
//! * a request's head must be complete within `header_read_timeout`, counted from when the
//!   connection is ready for it: hyper starts that timer when it waits for a head, after
//!   an answer too, so the same limit closes an idle keep-alive connection;
//! * a body must arrive within `body_read_timeout` of its head ([`super::body::Timed`]): the
//!   handler answers 408 and hyper, the body unread, closes the connection;
//! * a head over the read buffer (64 KiB) is answered 431 and the connection closed, bytes
//!   that are not HTTP 400 and closed (hyper's own answers, counted here);
//! * HTTP/2: at most `http2_max_concurrent_streams` streams at once, and GOAWAY
//!   `ENHANCE_YOUR_CALM` once a client has reset more than `http2_max_pending_reset_streams`
//!   streams before they were served (rapid reset, CVE-2023-44487) or made the server reset
//!   more than `http2_max_local_reset_streams` ("MadeYouReset", CVE-2025-8671); header lists
//!   as large as an HTTP/1.1 head; a ping every [`H2_PING_EVERY`] ends a connection whose
//!   peer is gone; a connection with no stream open for `http2_idle_timeout` is closed with
//!   GOAWAY (hyper has no such limit: the service counts the streams open, a stream's answer
//!   included until its body ends);
//! * a peer whose HTTP/2 connection was ended for abuse is refused at accept, as one over
//!   `max_connections` is, for `abuse_backoff`, longer if it goes on ([`backoff`]);
//! * the new connections of a peer in back-off, or at `max_connections_per_peer` and trying
//!   for more again and again, are dropped by the kernel before they reach the accept queue,
//!   at once ([`gate`]): its SYNs cost this process nothing.

mod backoff;
pub mod flags;
mod gate;
mod slots;

pub use backoff::MAX_BASE as MAX_ABUSE_BACKOFF;

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::SocketAddr,
    os::fd::OwnedFd,
    pin::Pin,
    sync::mpsc,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    thread,
    time::{Duration, Instant},
};

use axum::{Router, body::Body, response::Response};
use hyper::{
    Request,
    body::{Frame, Incoming, SizeHint},
    server::conn::{http1, http2},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::graceful::GracefulConnection,
    service::TowerToHyperService,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{oneshot, watch},
};
use tracing::{debug, error, info, warn};

use super::body::Timed;
use crate::{
    telemetry::connections::{ConnectionStats, Cut},
    tls::{
        Refusal, ServerTls,
        identity::{AllowedNames, ClientNames},
    },
};
use slots::{Handshakes, Handshaking, PeerSlot, Peers};

/// Connections waiting to be accepted.
const BACKLOG: u32 = 1024;
/// How long a thread's runtime waits for its blocking tasks once its server has drained.
const BLOCKING_GRACE: Duration = Duration::from_secs(1);
/// How long accepting pauses after an error that is not the connection's (out of descriptors).
const ACCEPT_PAUSE: Duration = Duration::from_secs(1);
/// Blocking threads per listener thread. The reservation file's writes take its lock one at a
/// time (a write that finds a later one done returns at once), so more threads than a writer
/// and the cgroup walks of `/v1/consumers` and `/v1/discrepancy` beside it would only wait,
/// each with its stack and allocator cache (tokio's default is 512: a burst of reserving
/// admissions over 8 connections started 8, then more after each idle spell). Writes and walks
/// share them: four walks at once on one thread (a client with the API's certificate asking
/// `/v1/consumers` in a loop) make that thread's reservation writes wait for one to end.
const BLOCKING_THREADS: usize = 4;

/// What a listener tolerates of its clients (the flags of the same names, `--max-connections`
/// and so on); see the module's documentation for what each does when it acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once on the listener, its threads together.
    pub max_connections: usize,
    /// From a connection being ready for a request (new, or idle after an answer) to that
    /// request's complete head.
    pub header_read_timeout: Duration,
    /// From a request's head to the end of its body.
    pub body_read_timeout: Duration,
    /// HTTP/2 streams open at once on one connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 streams the client reset before they were served, before GOAWAY.
    pub http2_max_pending_reset_streams: usize,
    /// HTTP/2 streams the server had to reset for the client's errors, before GOAWAY.
    pub http2_max_local_reset_streams: usize,
    /// How long a peer whose connection was ended for abuse is refused at first (doubling
    /// while it goes on); zero turns it off.
    pub abuse_backoff: Duration,
    /// Bytes of request bodies the listener holds at once, all connections together
    /// ([`super::budget`]).
    pub body_budget: usize,
    /// TLS handshakes running at once, apart from `max_connections`.
    pub max_handshakes: usize,
    /// How long a TLS handshake may take, and then how long the first request's head may take.
    pub handshake_timeout: Duration,
    /// Connections (handshaking and served) one source address may hold at once.
    pub max_connections_per_peer: usize,
    /// How long an HTTP/2 connection may have no stream open before it is closed (GOAWAY).
    pub http2_idle_timeout: Duration,
}

impl Limits {
    /// The webhook's defaults: [`Limits::DEFAULT`] but for `--max-connections` 256 (far above
    /// its clients: an HTTP/2 connection per API server, a few per scheduler, probes,
    /// Prometheus; each connection's HTTP/2 windows, [`H2_CONNECTION_WINDOW`], within its
    /// memory limit beside the body budget), `--body-budget` 64Mi (within the Deployment's
    /// 256 MiB memory limit with the Node cache, the agents' connections and each body's parse
    /// beside it, #38), and, in the same proportions as the agent's, `--max-handshakes` 128 and
    /// `--max-connections-per-peer` 64.
    pub const WEBHOOK: Limits = Limits {
        max_connections: 256,
        body_budget: 64 << 20,
        max_handshakes: 128,
        max_connections_per_peer: 64,
        ..Limits::DEFAULT
    };

    /// What an operator gets without flags: far above what the webhook's pools, the kubelet's
    /// probes and Prometheus open, and time-outs no answer on a working network comes near.
    pub const DEFAULT: Limits = Limits {
        max_connections: 1024,
        header_read_timeout: Duration::from_secs(30),
        body_read_timeout: Duration::from_secs(30),
        http2_max_concurrent_streams: 100,
        http2_max_pending_reset_streams: 20,
        http2_max_local_reset_streams: 1024,
        abuse_backoff: Duration::from_secs(1),
        body_budget: AGENT_BODY_BUDGET,
        // Half the connections: two peers are needed to fill it, one cannot (a quarter each).
        max_handshakes: 512,
        // A TLS 1.3 handshake is one round trip and a few milliseconds of CPU; a client dialing
        // for a request (the API server, the scheduler's pool, the webhook's pool) sends its
        // head at once. Five seconds is far above both on a working network, and half the
        // fixed ten seconds it replaces.
        handshake_timeout: Duration::from_secs(5),
        // A quarter: each API server keeps one HTTP/2 connection or a few, each scheduler an
        // HTTP/1.1 pool of tens at its busiest, each webhook replica one pool and one watch per
        // agent; four peers are needed to hold every place.
        max_connections_per_peer: 256,
        // Above Go's HTTP/2 transport's own idle time (90s for the API server's webhook
        // client is the IdleConnTimeout of net/http), so the client closes first in the common
        // case; a connection nobody uses frees its place within minutes.
        http2_idle_timeout: Duration::from_secs(120),
    };
}

/// The agent's `--body-budget` by default: sixteen of its largest bodies (1 MiB each) at once,
/// within the DaemonSet's 80 MiB memory limit with the agent's own 10 to 25 MiB beside it.
pub const AGENT_BODY_BUDGET: usize = 16 << 20;

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

/// How often an HTTP/2 connection is pinged, and how long the answer may take before the
/// connection is closed: a peer gone without a word frees its place.
pub const H2_PING_EVERY: Duration = Duration::from_secs(60);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Which client certificates a listener serves and which may change state, by their names.
#[derive(Debug, Clone, Default)]
pub struct Callers {
    /// A certificate with none of these names is closed after the handshake (the webhook's
    /// `--client-names`); `None`: any certificate of the client CA.
    pub required: Option<AllowedNames>,
    /// Only a certificate with one of these names may change state (the agent's
    /// `--admit-client-names`); `None`: any certificate of the client CA.
    pub writers: Option<AllowedNames>,
}

impl Callers {
    /// Any certificate of the client CA is served; only one named in `names` changes state.
    pub fn writers(names: impl Into<AllowedNames>) -> Callers {
        Callers {
            required: None,
            writers: Some(names.into()),
        }
    }
}

/// Who sent a request, by its connection's client certificate: in every request's extensions
/// when the listener asks for client certificates.
#[derive(Debug, Clone)]
pub struct Caller {
    pub names: Arc<ClientNames>,
    /// Whether its names are among [`Callers::writers`].
    pub may_change: bool,
}

/// What one listener serves with: its routes, its TLS and which callers it serves, its limits
/// and their counts, the places connections hold, and the peers it refuses for a while.
#[derive(Debug, Clone)]
pub struct Serving {
    pub router: Router,
    pub tls: Option<ServerTls>,
    pub callers: Callers,
    pub limits: Limits,
    pub stats: Arc<ConnectionStats>,
    backoff: Arc<backoff::Backoff>,
    peers: Arc<Peers>,
    handshakes: Arc<Handshakes>,
    /// Wakes the keeper of the listener's filter ([`gate::keep`]) when a peer is to be filtered.
    gate: Arc<tokio::sync::Notify>,
}

impl Serving {
    pub fn new(
        router: Router,
        tls: Option<ServerTls>,
        limits: Limits,
        stats: Arc<ConnectionStats>,
    ) -> Serving {
        Serving {
            router,
            tls,
            callers: Callers::default(),
            limits,
            stats,
            backoff: Arc::new(backoff::Backoff::new(limits.abuse_backoff)),
            peers: Arc::default(),
            handshakes: Arc::default(),
            gate: Arc::default(),
        }
    }

    /// The same, serving `callers` by their certificates' names.
    pub fn with_callers(self, callers: Callers) -> Serving {
        Serving { callers, ..self }
    }
}

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

    /// Starts `threads` threads serving on `bound` until `stop` turns true, each connection
    /// over TLS when `serving` has it and within its limits, and waits until each listens; a
    /// thread that cannot start is an error naming it.
    pub fn start(
        bound: Bound,
        threads: usize,
        serving: Serving,
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
            // The first thread keeps the socket's filter ([`gate`]) on a descriptor of its own.
            let gate = (index == 0)
                .then(|| bound.listener.try_clone().map(OwnedFd::from))
                .transpose()
                .map_err(|source| failed(index, source))?;
            let (tx, rx) = oneshot::channel();
            let serving = serving.clone();
            let stop = stop.clone();
            let listening = listening.clone();
            let thread = format!("{name}-{index}");
            thread::Builder::new()
                .name(thread.clone())
                .spawn(move || {
                    serve_thread(index, (socket, gate), serving, stop, listening);
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
    (socket, gate): (std::net::TcpListener, Option<OwnedFd>),
    serving: Serving,
    stop: watch::Receiver<bool>,
    listening: mpsc::Sender<Listening>,
) {
    let started = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
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
    runtime.block_on(serve(listener, gate, serving, stop));
    runtime.shutdown_timeout(BLOCKING_GRACE);
}

/// Accepts until `stop` turns true, each connection in a task of its own (a TLS handshake
/// included, so a slow client holds up nobody) or, over `max_connections`, closed at once;
/// then waits for every connection to end, each told to close once its request in flight is
/// answered.
async fn serve(
    listener: TcpListener,
    gate: Option<OwnedFd>,
    serving: Serving,
    mut stop: watch::Receiver<bool>,
) {
    if let Some(socket) = gate {
        tokio::spawn(gate::keep(socket, serving.clone(), stop.clone()));
    }
    // Every connection's task holds a receiver; once all are dropped, every connection ended.
    let (open, connection) = watch::channel(());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                gate::shed(&tcp);
                let place = match place(&serving, peer) {
                    Ok(place) => place,
                    Err(why) => {
                        refuse(tcp, peer, why, &serving);
                        continue;
                    }
                };
                tokio::spawn(serve_connection(
                    tcp,
                    peer,
                    serving.clone(),
                    stop.clone(),
                    (connection.clone(), place),
                ));
            }
            Err(err) => accept_failed(err).await,
        }
    }
    drop(listener);
    drop(connection);
    open.closed().await;
}

/// The places a connection holds from its accept: its peer's, and a served connection's
/// (plain HTTP) or a handshake's (TLS).
struct Place {
    _peer: PeerSlot,
    first: First,
}

/// A place dropped with the connection (served) or at the end of its handshake.
enum First {
    Served { _counted: Counted },
    Handshake { _handshaking: Handshaking },
}

/// The places a new connection from `peer` takes, or the limit that refuses it.
fn place(serving: &Serving, peer: SocketAddr) -> Result<Place, Cut> {
    let limits = &serving.limits;
    if serving.backoff.waits(peer.ip(), Instant::now()) {
        return Err(Cut::Backoff);
    }
    let peer_slot = match Peers::take(&serving.peers, peer.ip(), limits.max_connections_per_peer) {
        Ok(slot) => slot,
        Err(tried) => {
            if tried == gate::HAMMERING {
                // Filtered now, not at the next look.
                serving.gate.notify_one();
            }
            return Err(Cut::PerPeer);
        }
    };
    let first = if serving.tls.is_some() {
        match Handshakes::take(&serving.handshakes, limits.max_handshakes) {
            Some(handshaking) => First::Handshake {
                _handshaking: handshaking,
            },
            None => return Err(Cut::Handshakes),
        }
    } else {
        match Counted::open(serving) {
            Some(counted) => First::Served { _counted: counted },
            None => return Err(Cut::OverLimit),
        }
    };
    Ok(Place {
        _peer: peer_slot,
        first,
    })
}

/// A connection counted open in its listener's stats until dropped.
struct Counted(Arc<ConnectionStats>);

impl Counted {
    /// Counts a connection open, or `None` if `max_connections` already are.
    fn open(serving: &Serving) -> Option<Counted> {
        let stats = &serving.stats;
        stats
            .try_open(serving.limits.max_connections)
            .then(|| Counted(Arc::clone(stats)))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Closes a connection over the limit, or of a peer that must wait, at once, with a reset (no
/// FIN, no TIME_WAIT left here), and counts it.
fn refuse(tcp: TcpStream, peer: SocketAddr, why: Cut, serving: &Serving) {
    serving.stats.cut(why);
    debug!(%peer, limit = why.label(), "connection refused at accept");
    // Without it the close is an orderly FIN: the client learns the same, a little later.
    let _ = tcp.set_zero_linger();
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

/// One connection: the TLS handshake (with its deadline) when configured, its caller's names
/// checked, then HTTP/1.1, or HTTP/2 as well when ALPN chose `h2`; how it ended is counted if a
/// limit ended it. `held` keeps the listener's drain waiting and the connection's places taken
/// until it ends (a handshake's place only until the handshake ends).
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    serving: Serving,
    mut stop: watch::Receiver<bool>,
    held: (watch::Receiver<()>, Place),
) {
    let (_drain, Place { _peer, first }) = held;
    let limits = serving.limits;
    let Some(tls) = serving.tls.as_ref() else {
        let service = TimedBodies::new(&serving, None);
        let idle = service.activity.idle(limits.handshake_timeout, None);
        let ended = until_stopped(http1_connection(tcp, service, &limits), idle, stop).await;
        drop(first);
        return counted(ended, peer, &serving);
    };
    let handshake = tokio::time::timeout(limits.handshake_timeout, tls.acceptor().accept(tcp));
    let shaken = tokio::select! {
        shaken = handshake => shaken,
        _ = stop.wait_for(|stopped| *stopped) => return,
    };
    drop(first);
    let stream = match shaken {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => return tls.refused(Refusal::of(&err)),
        Err(_) => return tls.refused(Refusal::Timeout),
    };
    let caller = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(ClientNames::of);
    if let (Some(names), Some(required)) = (&caller, &serving.callers.required)
        && !names.any_of(required)
    {
        debug!(%peer, names = %names.joined(), "client certificate of none of the allowed names");
        return tls.refused(Refusal::NameNotAllowed);
    }
    let Some(_counted) = Counted::open(&serving) else {
        return serving.stats.cut(Cut::OverLimit);
    };
    let caller = caller.map(|names| Caller {
        may_change: serving
            .callers
            .writers
            .as_ref()
            .is_none_or(|writers| names.any_of(writers)),
        names: Arc::new(names),
    });
    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
    let service = TimedBodies::new(&serving, caller);
    let ended = if h2 {
        let idle = service
            .activity
            .idle(limits.handshake_timeout, Some(limits.http2_idle_timeout));
        let connection = http2_builder(&limits).serve_connection(TokioIo::new(stream), service);
        until_stopped(connection, idle, stop).await
    } else {
        let idle = service.activity.idle(limits.handshake_timeout, None);
        until_stopped(http1_connection(stream, service, &limits), idle, stop).await
    };
    counted(ended, peer, &serving);
}

/// The requests of one connection in flight (an answer until its body ends), and when the last
/// ended: what closes a connection that sent no request in time, or an idle HTTP/2 one.
#[derive(Debug)]
struct Activity {
    open: AtomicUsize,
    served: AtomicBool,
    last: Mutex<Instant>,
}

/// One request in flight, until dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            served: AtomicBool::new(false),
            last: Mutex::new(Instant::now()),
        })
    }

    fn begin(self: &Arc<Activity>) -> InFlight {
        self.open.fetch_add(1, Ordering::AcqRel);
        self.served.store(true, Ordering::Release);
        InFlight(Arc::clone(self))
    }

    /// Ends when no request has come within `first` of now, or, once one has, when no request
    /// has been in flight for `then` (never without it).
    fn idle(
        self: &Arc<Activity>,
        first: Duration,
        then: Option<Duration>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let activity = Arc::clone(self);
        let start = Instant::now();
        async move {
            loop {
                let served = activity.served.load(Ordering::Acquire);
                let (since, limit) = match (served, then) {
                    (false, _) => (start, first),
                    (true, Some(limit)) => (
                        *activity.last.lock().unwrap_or_else(|e| e.into_inner()),
                        limit,
                    ),
                    (true, None) => return std::future::pending().await,
                };
                let now = Instant::now();
                let busy = activity.open.load(Ordering::Acquire) > 0;
                if !busy && now >= since + limit {
                    return;
                }
                let wake = if busy { now + limit } else { since + limit };
                tokio::time::sleep_until(wake.into()).await;
            }
        }
    }
}

/// The router, each request's body wrapped in [`Timed`] with `body_read_timeout` and its
/// caller in its extensions; each request counted in flight until its answer's body ends.
#[derive(Clone)]
struct TimedBodies {
    router: TowerToHyperService<Router>,
    limit: Duration,
    stats: Arc<ConnectionStats>,
    caller: Option<Caller>,
    activity: Arc<Activity>,
}

impl TimedBodies {
    fn new(serving: &Serving, caller: Option<Caller>) -> TimedBodies {
        TimedBodies {
            router: TowerToHyperService::new(serving.router.clone()),
            limit: serving.limits.body_read_timeout,
            stats: Arc::clone(&serving.stats),
            caller,
            activity: Activity::new(),
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for TimedBodies {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let in_flight = self.activity.begin();
        let mut request = request.map(|body| Timed::new(body, self.limit, Arc::clone(&self.stats)));
        if let Some(caller) = &self.caller {
            request.extensions_mut().insert(caller.clone());
        }
        let answer = self.router.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| {
                Body::new(Answering {
                    body,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// An answer's body, its request counted in flight until the body ends.
struct Answering {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Answering {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// HTTP/1.1 over `io`, kept alive, with the read buffer and the head's time-out.
fn http1_connection<I>(
    io: I,
    service: TimedBodies,
    limits: &Limits,
) -> impl GracefulConnection<Error = hyper::Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    http1::Builder::new()
        .max_buf_size(READ_BUFFER)
        // The buffer alone does not bound a head: one read may fill it past its size (hyper
        // reads into all the capacity it reserved), and a 70 KiB head was served.
        .max_header_size(READ_BUFFER)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), service)
}

/// What one HTTP/2 stream may send before the handler reads it: the protocol's own initial
/// window (hyper's default is 1 MiB). Data a client sends that no handler has read yet (a body
/// waiting for room in `--body-budget`) stays in h2's buffers, outside the budget; these windows
/// bound it per connection.
const H2_STREAM_WINDOW: u32 = 64 << 10;
/// The same for all the streams of one connection together (hyper's default is 1 MiB): with
/// `--max-connections` 1024, at most 128 MiB unread in all, and on the connections the API
/// servers keep (one each, their reviews a few KiB) it never fills.
const H2_CONNECTION_WINDOW: u32 = 128 << 10;

/// HTTP/2 with the limits' streams and resets, and small flow-control windows.
fn http2_builder(limits: &Limits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .max_pending_accept_reset_streams(limits.http2_max_pending_reset_streams)
        .max_local_error_reset_streams(limits.http2_max_local_reset_streams)
        .max_header_list_size(READ_BUFFER as u32)
        .keep_alive_interval(H2_PING_EVERY)
        .keep_alive_timeout(H2_PING_TIMEOUT);
    builder
}

/// Counts the end of a connection if a limit made it, and makes a peer that abused HTTP/2
/// wait; other errors are the client's going away, nothing to report.
fn counted(ended: Result<Option<Cut>, hyper::Error>, peer: SocketAddr, serving: &Serving) {
    let err = match ended {
        Ok(Some(why)) => {
            debug!(%peer, limit = why.label(), "connection closed by a limit");
            return serving.stats.cut(why);
        }
        Ok(None) => return,
        Err(err) => err,
    };
    let Some(why) = cut_by(&err) else { return };
    debug!(%peer, limit = why.label(), "connection ended by a limit: {err}");
    serving.stats.cut(why);
    if why == Cut::Http2Abuse {
        let wait = serving.backoff.abused(peer.ip(), Instant::now());
        serving.gate.notify_one();
        if !wait.is_zero() {
            warn!(peer = %peer.ip(), ?wait, "HTTP/2 connection ended for abuse ({err}); the peer's new connections are refused meanwhile");
        }
    }
}

/// The limit that ended a connection with `err`, if one did.
fn cut_by(err: &hyper::Error) -> Option<Cut> {
    if err.is_timeout() {
        return Some(Cut::HeaderTimeout);
    }
    if err.is_parse_too_large() {
        return Some(Cut::HeadTooLarge);
    }
    if err.is_parse() {
        return Some(Cut::Malformed);
    }
    let h2 = std::error::Error::source(err)?.downcast_ref::<h2::Error>()?;
    (h2.is_go_away() && !h2.is_remote() && h2.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM))
        .then_some(Cut::Http2Abuse)
}

/// Serves `connection` until the client closes it, `idle` ends, or `stop` turns true; then lets
/// it finish the requests it has begun (HTTP/2: GOAWAY). How it ended; an idle end is counted
/// by the caller through [`counted`] as [`Cut::Idle`] when `idle` ended it.
async fn until_stopped<C>(
    connection: C,
    idle: impl Future<Output = ()>,
    mut stop: watch::Receiver<bool>,
) -> Result<Option<Cut>, hyper::Error>
where
    C: GracefulConnection<Error = hyper::Error>,
{
    tokio::pin!(connection);
    let cut = tokio::select! {
        ended = connection.as_mut() => return ended.map(|()| None),
        _ = idle => Some(Cut::Idle),
        _ = stop.wait_for(|stopped| *stopped) => None,
    };
    connection.as_mut().graceful_shutdown();
    if cut.is_none() {
        return connection.await.map(|()| None);
    }
    // Idle: nothing in flight; a peer that does not read the GOAWAY is not waited for.
    match tokio::time::timeout(IDLE_CLOSE_GRACE, connection).await {
        Ok(ended) => ended.map(|()| cut),
        Err(_) => Ok(cut),
    }
}

/// How long an idle connection told to close may take to close before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests;
