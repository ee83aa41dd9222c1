//! The agents' streams: one watch of the map (`GET /v1/hugepages?watch=true`) per node the Node
//! cache holds, each kept in the [`Table`]. Every [`SYNC`] the streams are matched to the cache:
//! a new node (or one whose address changed) gets a stream, a node gone loses its own and its
//! entry. A stream's first connection waits a random part of [`START_SPREAD`], so that a webhook
//! that starts beside thousands of nodes does not dial them in one instant; a stream that ends
//! (the agent restarted, the connection broke, no event within the freshness bound, an answer
//! that is not a stream) marks its node stale at once and connects again after a back-off that
//! doubles from [`RETRY_FIRST`] to [`RETRY_MOST`], each wait drawn at random between its half and
//! its whole, and resumes from the epoch and generation it last saw.
//!
//! The exchange is HTTP/1.1 on its own mTLS connection ([`super::dial`]), read here as the
//! agent writes it: the head (`httparse`), then the chunked body split into its events, one JSON
//! document a line, at most [`MAX_EVENT`] bytes each. What one stream holds while it waits is its
//! TLS state and no buffer (they are freed after each event): thousands of them fit the webhook's
//! memory, which hyper's client connection (about 34 KiB idle) would not.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash, Hasher, RandomState},
    net::SocketAddr,
    sync::Arc,
    time::Duration,
};

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use serde::Deserialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    sync::watch,
    task::JoinHandle,
    time::Instant,
};
use tracing::debug;

use super::{
    agents::Client,
    cache::NodeCache,
    dial::dial,
    http1::MAX_HEAD,
    identity::{IdentityError, Names},
    metrics::Metrics,
    pool::Key,
    table::Table,
};
use crate::api::watch::WatchState;

/// How often the streams are matched to the Node cache.
pub const SYNC: Duration = Duration::from_secs(1);
/// A stream's first connection waits a random part of this.
pub const START_SPREAD: Duration = Duration::from_secs(5);
/// The first wait before connecting again.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait before connecting again.
pub const RETRY_MOST: Duration = Duration::from_secs(30);
/// The largest event read (a state with thousands of reservations is well under it).
pub const MAX_EVENT: usize = 4 << 20;
/// What one read asks for at most, a state's event and its chunk framing in most cases.
const READ: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("cannot connect: {0}")]
    Dial(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("no event within {0:?}")]
    Silent(Duration),
    #[error("the agent closed the stream")]
    Closed,
    #[error("the answer's head: {0}")]
    Head(String),
    #[error("answered HTTP {0}, not a stream")]
    Status(u16),
    #[error("a chunk: {0}")]
    Chunk(&'static str),
    #[error("an event over {MAX_EVENT} bytes")]
    TooLarge,
    #[error("an event that is not one: {0}")]
    Event(String),
    #[error("the API server now has another agent on the node: {0}")]
    Renamed(String),
}

/// One event of a stream, as the agent writes it.
#[derive(Debug, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub epoch: String,
    pub generation: u64,
    /// The agent's version (none from agents older than the field).
    #[serde(default, rename = "agentVersion")]
    pub agent_version: Option<String>,
    #[serde(default)]
    pub object: Option<WatchState>,
}

/// Keeps a stream for every node of `cache`, in `table`, until `stop` turns true.
pub async fn run(
    cache: NodeCache,
    table: Arc<Table>,
    client: Client,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut streams: HashMap<String, (SocketAddr, JoinHandle<()>)> = HashMap::new();
    let mut every = tokio::time::interval(SYNC);
    // The cache's count of agent moves the streams last followed: the Nodes are listed again only
    // when an agent's address changed, or when a stream's task ended (it runs until aborted
    // here, unless it panicked).
    let mut followed = None;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            _ = every.tick() => {}
        }
        let standing = table.standing();
        metrics.streams(standing.fresh, standing.stale, standing.outside_skew);
        let changes = cache.agents_moved();
        let ended = streams.values().any(|(_, task)| task.is_finished());
        if followed == Some(changes) && !ended {
            continue;
        }
        followed = Some(changes);
        let wanted: HashMap<String, SocketAddr> = cache.agents().into_iter().collect();
        streams.retain(|name, (addr, task)| {
            let keep = wanted.get(name) == Some(addr) && !task.is_finished();
            if !keep {
                task.abort();
                table.forget(name);
            }
            keep
        });
        for (name, addr) in wanted {
            if streams.contains_key(&name) {
                continue;
            }
            let follow = follow(
                name.clone(),
                addr,
                table.clone(),
                client.clone(),
                metrics.clone(),
            );
            streams.insert(name, (addr, tokio::spawn(follow)));
        }
    }
    for (_, (_, task)) in streams {
        task.abort();
    }
}

/// `node`'s stream from its agent at `addr`, connected again whenever it ends.
async fn follow(
    node: String,
    addr: SocketAddr,
    table: Arc<Table>,
    client: Client,
    metrics: Arc<Metrics>,
) {
    tokio::time::sleep(START_SPREAD.mul_f64(drawn(&node, u32::MAX))).await;
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        let ended = match client.identity().name(&node) {
            Ok(name) => {
                let names = client.identity();
                stream(&node, (name, addr), &table, client.tls_config(), names).await
            }
            Err(e) => StreamError::from(e),
        };
        table.cut(&node);
        metrics.stream_ended();
        // A stream that lasted is a fresh start: the next failure waits the least again.
        if started.elapsed() > RETRY_MOST {
            failures = 0;
        }
        debug!(node, %addr, "the agent's stream ended: {ended}");
        let most = RETRY_FIRST
            .saturating_mul(2u32.saturating_pow(failures))
            .min(RETRY_MOST);
        tokio::time::sleep(jittered(&node, failures, most)).await;
        failures = failures.saturating_add(1);
    }
}

/// A wait between half of `most` and `most`, drawn for `node`'s `attempt`.
fn jittered(node: &str, attempt: u32, most: Duration) -> Duration {
    most.mul_f64(0.5 + drawn(node, attempt) / 2.0)
}

/// A number in [0, 1) drawn at random for `node`'s `attempt` (the process's random hash keys).
fn drawn(node: &str, attempt: u32) -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    node.hash(&mut hasher);
    attempt.hash(&mut hasher);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// One connection's stream, until it ends or `names` no longer gives the node the name it was
/// verified by; why it ended.
async fn stream(
    node: &str,
    (name, addr): Key,
    table: &Table,
    config: Arc<ClientConfig>,
    names: &Names,
) -> StreamError {
    let host = name.to_str().into_owned();
    let verified = name.clone();
    let mut io = match dial(config, addr, name).await {
        Ok(io) => io,
        Err(e) => return StreamError::Dial(e.to_string()),
    };
    let resume = table.resume(node, addr);
    let mut target = "/v1/hugepages?watch=true".to_owned();
    if let Some(epoch) = &resume.epoch {
        target.push_str(&format!("&epoch={epoch}&generation={}", resume.generation));
    }
    let request =
        format!("GET {target} HTTP/1.1\r\nhost: {host}\r\naccept: application/x-ndjson\r\n\r\n");
    if let Err(e) = io.write_all(request.as_bytes()).await {
        return e.into();
    }
    if let Err(e) = io.flush().await {
        return e.into();
    }
    let within = table.fresh_within();
    let mut reader = Reader::new(io, within);
    if let Err(e) = reader.head().await {
        return e;
    }
    loop {
        let line = match reader.line().await {
            Ok(line) => line,
            Err(e) => return e,
        };
        let event: Event = match serde_json::from_slice(&line) {
            Ok(event) => event,
            Err(e) => return StreamError::Event(e.to_string()),
        };
        let version = event.agent_version.as_deref();
        match (event.kind.as_str(), event.object) {
            ("SNAPSHOT" | "MODIFIED", Some(state)) => {
                table.put(node, addr, (&event.epoch, event.generation), version, state);
            }
            ("BOOKMARK", _) => table.heard(node, addr, version),
            (kind, _) => return StreamError::Event(format!("a {kind} event without a state")),
        }
        if let Some(renamed) = renamed(names, node, &verified) {
            return renamed;
        }
    }
}

/// Why a stream verified as `verified` must end, if the node's name changed since (only under
/// `per-pod`: the API server has another pod as the node's agent, or none).
fn renamed(names: &Names, node: &str, verified: &ServerName<'static>) -> Option<StreamError> {
    if !names.may_change() {
        return None;
    }
    match names.name(node) {
        Ok(now) if now == *verified => None,
        Ok(now) => Some(StreamError::Renamed(now.to_str().into_owned())),
        Err(e) => Some(e.into()),
    }
}

/// The answer read off a connection: its head, then its chunked body line by line.
struct Reader<S> {
    io: S,
    buf: Vec<u8>,
    /// Bytes of the current chunk not read yet.
    left: usize,
    /// The event being assembled, and how much of it holds no newline.
    line: Vec<u8>,
    scanned: usize,
    within: Duration,
}

impl<S: AsyncRead + Unpin> Reader<S> {
    fn new(io: S, within: Duration) -> Reader<S> {
        Reader {
            io,
            buf: Vec::new(),
            left: 0,
            line: Vec::new(),
            scanned: 0,
            within,
        }
    }

    /// More bytes into the buffer, within the freshness bound.
    async fn fill(&mut self) -> Result<(), StreamError> {
        if self.buf.len() == self.buf.capacity() {
            self.buf.reserve(READ);
        }
        match tokio::time::timeout(self.within, self.io.read_buf(&mut self.buf)).await {
            Err(_) => Err(StreamError::Silent(self.within)),
            Ok(Ok(0)) => Err(StreamError::Closed),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
        }
    }

    /// The head: `200` and a chunked body, or why not.
    async fn head(&mut self) -> Result<(), StreamError> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let status = response.code.unwrap_or_default();
                    if status != 200 {
                        return Err(StreamError::Status(status));
                    }
                    let chunked = response.headers.iter().any(|h| {
                        h.name.eq_ignore_ascii_case("transfer-encoding")
                            && h.value.eq_ignore_ascii_case(b"chunked")
                    });
                    if !chunked {
                        return Err(StreamError::Head("the body is not chunked".to_owned()));
                    }
                    self.buf.drain(..len);
                    return Ok(());
                }
                Ok(httparse::Status::Partial) if self.buf.len() >= MAX_HEAD => {
                    return Err(StreamError::Head(format!("over {MAX_HEAD} bytes")));
                }
                Ok(httparse::Status::Partial) => self.fill().await?,
                Err(e) => return Err(StreamError::Head(e.to_string())),
            }
        }
    }

    /// The next line of the body, without its newline.
    async fn line(&mut self) -> Result<Vec<u8>, StreamError> {
        loop {
            if let Some(at) = self.line[self.scanned..].iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.line.drain(..=self.scanned + at).collect();
                self.scanned = 0;
                line.pop();
                // Between events a stream holds no buffer: thousands of them wait at once.
                if self.line.is_empty() {
                    self.line = Vec::new();
                }
                if self.buf.is_empty() {
                    self.buf = Vec::new();
                }
                return Ok(line);
            }
            self.scanned = self.line.len();
            if self.line.len() > MAX_EVENT {
                return Err(StreamError::TooLarge);
            }
            self.chunk_data().await?;
        }
    }

    /// Moves the next bytes of chunk data from the buffer to the line.
    async fn chunk_data(&mut self) -> Result<(), StreamError> {
        while self.left == 0 {
            // A chunk's size line: hex digits (extensions after `;` ignored), CRLF.
            let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") else {
                if self.buf.len() > 64 {
                    return Err(StreamError::Chunk("a size line over 64 bytes"));
                }
                self.fill().await?;
                continue;
            };
            let text = std::str::from_utf8(&self.buf[..end])
                .map_err(|_| StreamError::Chunk("a size that is not text"))?;
            let digits = text.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(digits, 16)
                .map_err(|_| StreamError::Chunk("a size that is not hex"))?;
            if size == 0 {
                return Err(StreamError::Closed);
            }
            self.buf.drain(..end + 2);
            // The data and its CRLF.
            self.left = size + 2;
        }
        if self.buf.is_empty() {
            self.fill().await?;
        }
        let take = self.left.min(self.buf.len());
        let data = take.min(self.left.saturating_sub(2));
        self.line.extend_from_slice(&self.buf[..data]);
        self.buf.drain(..take);
        self.left -= take;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
