//! The HTTP API's own threads (`--api-threads`, default 1): each a single-threaded runtime
//! accepting on its own `SO_REUSEPORT` listener on the `--listen` address, so the kernel spreads
//! connections over them and a request is read, verified and answered on one thread.
//!
//! On the work-stealing runtime that also runs the agent's loop, every readiness event woke a
//! second worker (a futex wake and a context switch) and the two workers handed connections back
//! and forth; on a two-core node shared with the load, that cost more CPU than the admission.
//! Here a thread waits in its own `epoll_wait` and nothing crosses threads but the shared state.
//!
//! [`Server::bind`] binds the first listener on the caller's runtime (so a bad `--listen` fails
//! the start, and port 0 resolves once); the other threads bind the resolved address.
//! [`Server::stopped`] waits, up to a deadline, for every thread to drain after the stop signal.

use std::{io, net::SocketAddr, thread, time::Duration};

use axum::Router;
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::{oneshot, watch},
};

/// Connections waiting to be accepted, per listener.
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

/// How the API threads ended.
#[derive(Debug)]
pub enum Drained {
    /// Every thread drained its connections.
    All,
    /// A thread's server stopped with an error (the first one).
    Failed(String),
    /// This many threads were still busy at the deadline.
    Busy(usize),
}

/// The first listener, bound; [`Server::start`] makes the threads.
#[derive(Debug)]
pub struct Bound {
    first: std::net::TcpListener,
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

/// A listener on `addr` that shares its port with the other API threads' listeners.
fn listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

impl Server {
    /// Binds the first listener; call from within a runtime.
    pub fn bind(addr: SocketAddr) -> Result<Bound, ServerError> {
        let listen = |source| ServerError::Listen { addr, source };
        let first = listener(addr).map_err(listen)?;
        let addr = first.local_addr().map_err(listen)?;
        let first = first.into_std().map_err(listen)?;
        Ok(Bound { first, addr })
    }

    /// Starts `threads` API threads serving `router` until `stop` turns true. A thread that
    /// cannot bind its listener serves nothing and reports the error when drained.
    pub fn start(
        bound: Bound,
        threads: usize,
        router: Router,
        stop: watch::Receiver<bool>,
    ) -> Result<Server, ServerError> {
        let mut done = Vec::with_capacity(threads);
        let mut first = Some(bound.first);
        for index in 0..threads.max(1) {
            let (tx, rx) = oneshot::channel();
            let given = first.take();
            let addr = bound.addr;
            let router = router.clone();
            let stop = stop.clone();
            thread::Builder::new()
                .name(format!("http-api-{index}"))
                .spawn(move || {
                    let _ = tx.send(serve_thread(given, addr, router, stop));
                })
                .map_err(|source| ServerError::Thread { index, source })?;
            done.push(rx);
        }
        Ok(Server { done })
    }

    /// Waits up to `deadline` for every thread to finish.
    pub async fn stopped(mut self, deadline: Duration) -> Drained {
        let until = tokio::time::Instant::now() + deadline;
        let mut failed = None;
        let mut busy = 0;
        for done in &mut self.done {
            // A thread that has finished answers even after the deadline.
            match tokio::time::timeout_at(until, done).await {
                Err(_) => busy += 1,
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => {
                    failed.get_or_insert(err.to_string());
                }
                Ok(Err(_)) => {
                    failed.get_or_insert_with(|| "the thread ended without an answer".to_owned());
                }
            }
        }
        match (busy, failed) {
            (0, None) => Drained::All,
            (0, Some(err)) => Drained::Failed(err),
            (busy, _) => Drained::Busy(busy),
        }
    }
}

/// One API thread: its runtime, its listener (`given`, or a new one on `addr`), the server.
fn serve_thread(
    given: Option<std::net::TcpListener>,
    addr: SocketAddr,
    router: Router,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let served = runtime.block_on(async move {
        let listener = match given {
            Some(std) => TcpListener::from_std(std)?,
            None => listener(addr)?,
        };
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
