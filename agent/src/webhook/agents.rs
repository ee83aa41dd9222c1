//! The webhook's calls to the node agents, one function with the query as its parameter
//! ([`Client::admit`]): `POST /v1/admit?dryRun=true` for the extender (and for admission
//! requests that are dry runs), `POST /v1/admit`, which reserves, for the admission webhook;
//! and `DELETE /v1/reservations/{id}` ([`Client::release`]) for a reservation the API did not
//! confirm ([`super::confirm`]).
//!
//! Connections are kept alive and reused by the name the agent is verified as
//! (`--agent-identity`, [`super::identity`]) and its address ([`super::pool`]); a connection that
//! failed or that the agent closed is closed, never parked again. A dial may take up to
//! [`super::dial::DIAL_TIMEOUT`] and an answer [`ANSWER_TIMEOUT`]: a call abandoned by its
//! caller's deadline is left to finish within them ([`super::ask`]), so that its connection is
//! parked for the next call instead of closed. A request that got no byte of answer on a reused connection (the
//! agent closed it as it was sent) is sent once more on a new one: a dry run changes nothing, and
//! an admission by pod UID again is the same admission (the agent does not count a pod's own
//! reservation against it). Connections are dialled by [`super::dial`] with the client config
//! current at the time: when the client's files are reloaded ([`super::agent_tls`]), the next
//! call starts a new pool, so that every call after a reload uses the new material, and the old
//! pool's connections close.
//!
//! The exchange itself is [`super::http1`]'s. An answer is read up to [`ANSWER_LIMIT`] bytes;
//! anything but a 200 with the verdict's JSON is an error naming the agent's address. Each call
//! is a span carrying the trace onwards ([`super::trace`]).

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use hyper::body::Bytes;
use rustls::ClientConfig;
use serde::Deserialize;
use tracing::Instrument;

pub use super::agent_tls::ClientFiles;
use super::{
    dial::{Stream, dial},
    http1::{self, Answer, Http1Error, Post},
    identity::{IdentityError, Names},
    pool::{Idle, Key, SWEEP_EVERY},
    trace,
};
use crate::{
    client::problem_detail,
    tls::{Current, Reloader, TlsError, TlsStats, watched},
};

/// How long an agent may take to answer on an open connection.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most an agent's answer may be.
pub const ANSWER_LIMIT: usize = 1 << 20;
const ADMIT: &str = "/v1/admit";
const RESERVATIONS: &str = "/v1/reservations";

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("agent at {addr}: {detail}")]
    Http { addr: SocketAddr, detail: String },
    #[error("agent at {addr}: HTTP {status}: {detail}")]
    Status {
        addr: SocketAddr,
        status: u16,
        detail: String,
    },
    #[error("agent at {addr}: the answer is not a verdict: {detail}")]
    Answer { addr: SocketAddr, detail: String },
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// What the webhook reads of an agent's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub allowed: bool,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// The NUMA nodes the pod would be served from.
    #[serde(default)]
    pub numa_nodes: Vec<u32>,
    #[serde(default)]
    pub checks: Vec<CheckReply>,
    /// The reservation a real admission made.
    #[serde(default)]
    pub reservation: Option<ReservationReply>,
}

/// The reservation of a verdict: its id, for `DELETE /v1/reservations/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ReservationReply {
    pub id: String,
}

/// One page size's check in a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReply {
    pub resource: String,
    pub requested_bytes: u64,
    pub available_bytes: u64,
}

/// The connections of one client config.
struct Pool {
    config: Arc<ClientConfig>,
    idle: Idle,
}

/// Calls agents on `port` with the client certificate, over pooled connections.
#[derive(Clone)]
pub struct Client {
    /// The client config in use, swapped by the files' reloader.
    config: Current<ClientConfig>,
    pool: Arc<ArcSwap<Pool>>,
    port: u16,
    identity: Names,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("port", &self.port)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Reads the files and builds the client, which verifies agents as `identity` says, and the
    /// reloader that watches the files (reloads and refusals counted in `stats`); errors name the
    /// flag and file at fault.
    pub fn new(
        files: &ClientFiles,
        port: u16,
        identity: Names,
        stats: Arc<TlsStats>,
    ) -> Result<(Client, Reloader<ClientFiles>), TlsError> {
        let (config, reloader) = watched(files.clone(), stats)?;
        let pool = Arc::new(ArcSwap::from_pointee(Pool {
            config: config.load_full(),
            idle: Idle::default(),
        }));
        tokio::spawn(sweep(Arc::downgrade(&pool)));
        let client = Client {
            config,
            pool,
            port,
            identity,
        };
        Ok((client, reloader))
    }

    /// The client config in use (the files' latest good reading).
    pub fn tls_config(&self) -> Arc<ClientConfig> {
        self.config.load_full()
    }

    /// The port agents listen on (`--agent-port`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How agents are verified (`--agent-identity`).
    pub fn identity(&self) -> &Names {
        &self.identity
    }

    /// `POST /v1/admit` with `body` (a `v1.Pod`) to the agent of `node` at `addr`: a dry run
    /// when `dry_run` (`?dryRun=true`: verification and NUMA selection only), else the real
    /// admission, which reserves a pod admitted by its UID.
    pub async fn admit(
        &self,
        node: &str,
        addr: SocketAddr,
        body: Bytes,
        dry_run: bool,
    ) -> Result<Reply, CallError> {
        let span = trace::agent_call(addr, ADMIT, dry_run);
        let key = (self.identity.name(node)?, addr);
        let result = self
            .exchange(key, body, dry_run, &span)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(reply) => {
                span.record("admission.allowed", reply.allowed);
            }
            Err(e) => {
                span.record("otel.status_code", "error");
                span.record("error.message", e.to_string());
            }
        }
        result
    }

    /// `DELETE /v1/reservations/{id}` on the agent of `node` at `addr`: the reservation
    /// released, or already gone (404). An id of anything but ASCII letters, digits and `-`
    /// (agents make `<micros>-<n>`) is not sent.
    pub async fn release(&self, node: &str, addr: SocketAddr, id: &str) -> Result<(), CallError> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(CallError::Answer {
                addr,
                detail: format!("reservation id {id:?} is not an agent's"),
            });
        }
        let target = format!("{RESERVATIONS}/{id}");
        let key = (self.identity.name(node)?, addr);
        let host = key.0.to_str();
        let post = Post {
            method: "DELETE",
            target: &target,
            host: &host,
            headers: &[],
            body: &[],
        };
        let answer = self.send(&key, &post).await?;
        match answer.status {
            200..=299 | 404 => Ok(()),
            status => Err(CallError::Status {
                addr,
                status,
                detail: problem_detail(&answer.body),
            }),
        }
    }

    /// The pool of the client config in use (a new one after a reload).
    fn pool(&self) -> Arc<Pool> {
        let config = self.config.load_full();
        let pool = self.pool.load_full();
        if Arc::ptr_eq(&pool.config, &config) {
            return pool;
        }
        let fresh = Arc::new(Pool {
            config,
            idle: Idle::default(),
        });
        let before = self.pool.compare_and_swap(&pool, fresh.clone());
        if Arc::ptr_eq(&before, &pool) {
            fresh
        } else {
            // Another call started the new pool first.
            self.pool.load_full()
        }
    }

    /// The request, its answer, and the answer read.
    async fn exchange(
        &self,
        key: Key,
        body: Bytes,
        dry_run: bool,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let target = if dry_run {
            "/v1/admit?dryRun=true"
        } else {
            ADMIT
        };
        let trace = trace::outgoing(span);
        let headers: Vec<(&str, &[u8])> = trace
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()))
            .collect();
        let addr = key.1;
        let host = key.0.to_str();
        let post = Post {
            method: "POST",
            target,
            host: &host,
            headers: &headers,
            body: &body,
        };
        let answer = self.send(&key, &post).await?;
        span.record("http.response.status_code", answer.status);
        if answer.status != 200 {
            return Err(CallError::Status {
                addr,
                status: answer.status,
                detail: problem_detail(&answer.body),
            });
        }
        serde_json::from_slice(&answer.body).map_err(|e| CallError::Answer {
            addr,
            detail: e.to_string(),
        })
    }

    /// `post` on an idle connection to `key`, or on a new one; the connection is parked again
    /// after an answer that leaves it reusable.
    async fn send(&self, key: &Key, post: &Post<'_>) -> Result<Answer, CallError> {
        let pool = self.pool();
        let failed = |e: Http1Error| CallError::Http {
            addr: key.1,
            detail: e.to_string(),
        };
        let (stream, answer) = match pool.idle.take(key, Instant::now()) {
            Some(mut stream) => match exchange_on(&mut stream, post).await {
                Err(Http1Error::Unanswered(_)) => on_new(&pool, key, post).await?,
                answer => (stream, answer),
            },
            None => on_new(&pool, key, post).await?,
        };
        let answer = answer.map_err(failed)?;
        if answer.reusable {
            pool.idle.park(key.clone(), stream, Instant::now());
        }
        Ok(answer)
    }
}

/// `post` on a new connection to `key` with the pool's config: the connection and the
/// exchange's result.
async fn on_new(
    pool: &Pool,
    key: &Key,
    post: &Post<'_>,
) -> Result<(Stream, Result<Answer, Http1Error>), CallError> {
    let (name, addr) = key.clone();
    let mut stream = dial(pool.config.clone(), addr, name)
        .await
        .map_err(|e| CallError::Http {
            addr,
            detail: e.to_string(),
        })?;
    let answer = exchange_on(&mut stream, post).await;
    Ok((stream, answer))
}

/// `post` on `stream`, answered within [`ANSWER_TIMEOUT`].
async fn exchange_on(stream: &mut Stream, post: &Post<'_>) -> Result<Answer, Http1Error> {
    tokio::time::timeout(ANSWER_TIMEOUT, http1::exchange(stream, post, ANSWER_LIMIT))
        .await
        .unwrap_or_else(|_| {
            Err(Http1Error::Read(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {ANSWER_TIMEOUT:?}"),
            )))
        })
}

/// Closes expired idle connections every [`SWEEP_EVERY`], in the pool current at the time,
/// until the client is gone.
async fn sweep(pool: Weak<ArcSwap<Pool>>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.load().idle.sweep(Instant::now());
    }
}

#[cfg(test)]
mod tests;
