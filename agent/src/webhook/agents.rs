//! The webhook's calls to the node agents, one function with the query as its parameter
//! ([`Client::admit`]): `POST /v1/admit?dryRun=true` for the extender (and for admission
//! requests that are dry runs), `POST /v1/admit`, which reserves, for the admission webhook.
//!
//! Connections are kept alive and reused, pooled by agent address (hyper's pool): at most
//! [`IDLE_PER_AGENT`] idle ones per agent, each closed after [`IDLE_TIMEOUT`] unused; one that
//! the agent closed or that failed is dropped, never handed out again (a request that had not
//! started on a reused connection found closed is sent again on another). Connections are
//! dialled by [`super::dial`] with the client config current at the time: when the client's
//! files are reloaded ([`super::agent_tls`]), the next call starts a new pool, so that every call
//! after a reload uses the new material, and the old pool's connections close.
//!
//! An answer is read up to [`ANSWER_LIMIT`] bytes; anything but a 200 with the verdict's JSON is
//! an error naming the agent's address. Each call is a span carrying the trace onwards
//! ([`super::trace`]).

use std::{net::SocketAddr, sync::Arc, time::Duration};

use arc_swap::ArcSwap;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    Request, StatusCode,
    body::Bytes,
    header::{CONTENT_TYPE, HOST},
};
use hyper_util::{
    client::legacy,
    rt::{TokioExecutor, TokioTimer},
};
use rustls::ClientConfig;
use serde::Deserialize;
use tracing::Instrument;

pub use super::agent_tls::ClientFiles;
use super::{
    dial::{DialError, Dialer},
    trace,
};
use crate::tls::{Current, Reloader, SERVER_NAME, TlsError, TlsStats, watched};

/// Each pooled connection's read buffer: a verdict is about a kilobyte, and a thousand
/// connections with hyper's growing buffer (from 8 KiB up) hold megabytes for nothing.
const READ_BUFFER: usize = 4096;

/// The most an agent's answer may be.
pub const ANSWER_LIMIT: usize = 1 << 20;
/// Idle connections kept per agent: a filter call asks each agent once, and calls overlap
/// little.
pub const IDLE_PER_AGENT: usize = 4;
/// How long an idle connection is kept.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

const ADMIT: &str = "/v1/admit";

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
    http: legacy::Client<Dialer, Full<Bytes>>,
}

impl Pool {
    fn new(config: Arc<ClientConfig>) -> Pool {
        let http = legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(IDLE_PER_AGENT)
            .pool_idle_timeout(IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .http1_read_buf_exact_size(READ_BUFFER)
            .build(Dialer::new(config.clone()));
        Pool { config, http }
    }
}

/// Calls agents on `port` with the client certificate, over pooled connections.
#[derive(Clone)]
pub struct Client {
    /// The client config in use, swapped by the files' reloader.
    config: Current<ClientConfig>,
    pool: Arc<ArcSwap<Pool>>,
    port: u16,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Reads the files and builds the client, and the reloader that watches the files (reloads
    /// and refusals counted in `stats`); errors name the flag and file at fault.
    pub fn new(
        files: &ClientFiles,
        port: u16,
        stats: Arc<TlsStats>,
    ) -> Result<(Client, Reloader<ClientFiles>), TlsError> {
        let (config, reloader) = watched(files.clone(), stats)?;
        let pool = Arc::new(ArcSwap::from_pointee(Pool::new(config.load_full())));
        Ok((Client { config, pool, port }, reloader))
    }

    /// The port agents listen on (`--agent-port`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `POST /v1/admit` with `body` (a `v1.Pod`) to the agent at `addr`: a dry run when
    /// `dry_run` (`?dryRun=true`: verification and NUMA selection only), else the real
    /// admission, which reserves a pod admitted by its UID.
    pub async fn admit(
        &self,
        addr: SocketAddr,
        body: Bytes,
        dry_run: bool,
    ) -> Result<Reply, CallError> {
        let span = trace::agent_call(addr, ADMIT, dry_run);
        let result = self
            .exchange(addr, body, dry_run, &span)
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

    /// The pool of the client config in use (a new one after a reload).
    fn pool(&self) -> Arc<Pool> {
        let config = self.config.load_full();
        let pool = self.pool.load_full();
        if Arc::ptr_eq(&pool.config, &config) {
            return pool;
        }
        let fresh = Arc::new(Pool::new(config));
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
        addr: SocketAddr,
        body: Bytes,
        dry_run: bool,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let query = if dry_run { "?dryRun=true" } else { "" };
        let http = |detail: String| CallError::Http { addr, detail };
        let mut request = Request::post(format!("https://{addr}{ADMIT}{query}"))
            .header(HOST, SERVER_NAME)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| http(e.to_string()))?;
        request.headers_mut().extend(trace::outgoing(span));
        let response = self
            .pool()
            .http
            .request(request)
            .await
            .map_err(|e| failed(addr, &e))?;
        let status = response.status();
        span.record("http.response.status_code", status.as_u16());
        let bytes = Limited::new(response.into_body(), ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|e| http(format!("reading the answer: {e}")))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(CallError::Status {
                addr,
                status: status.as_u16(),
                detail: problem_detail(&bytes),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| CallError::Answer {
            addr,
            detail: e.to_string(),
        })
    }
}

/// A failed exchange: the dial's error when it is one, else hyper's causes on one line (its
/// own message is only "client error (…)").
fn failed(addr: SocketAddr, err: &legacy::Error) -> CallError {
    let mut causes = Vec::new();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(dial) = cause.downcast_ref::<DialError>() {
            return CallError::Http {
                addr,
                detail: dial.to_string(),
            };
        }
        causes.push(cause.to_string());
        source = cause.source();
    }
    let detail = if causes.is_empty() {
        err.to_string()
    } else {
        causes.join(": ")
    };
    CallError::Http { addr, detail }
}

/// The `detail` of a problem document, else the body's start.
fn problem_detail(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

#[cfg(test)]
mod tests;
