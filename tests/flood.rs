//! Request bodies that try to take the webhook's memory (#38), and the well-behaved callers that
//! must still be answered beside them: for `tests/body_budget.rs` and `cargo xtask bench
//! body-flood` (`bin/body_flood.rs`). Everything goes over real TLS sockets to the real webhook.
//!
//! The floods ([`Flood`]), each from threads of its own, each thread one request at a time on a
//! new connection:
//! * [`Flood::AtLimit`]: bodies just under their endpoint's limit, valid JSON the webhook reads
//!   to the end: `ExtenderArgs` (`nodenames` form) whose pod carries the padding, and
//!   `AdmissionReview`s of a pod created on a node, padded the same way. Half the padding is one
//!   long string, half a list of zeros (`[0,0,…]`), which a tree of JSON values holds at sixteen
//!   times its text;
//! * [`Flood::Declared`]: a `Content-Length` over the limit, no body sent;
//! * [`Flood::Chunked`]: `Transfer-Encoding: chunked` without end, 64 KiB a chunk;
//! * [`Flood::Slow`]: a body under the limit, declared, sent a byte a second.
//!
//! The callers ([`Caller`]) are the webhook's real peers' requests: kube-scheduler's filter
//! (`nodenames` form, HTTP/1.1, a connection kept alive) and the API server's admission review
//! of a pod created on a node (HTTP/2, one connection), each every [`CALLER_EVERY`], timed; and
//! the webhook's own dry run to a node's agent, for the same floods sent to an agent (its
//! `/v1/admit`, 1 MiB bodies, over mTLS).

use std::{
    collections::BTreeMap,
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use rustls::{ClientConfig, ClientConnection, StreamOwned};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};

use crate::{
    allowed_cpus, cluster,
    https::Https,
    mtls::{self, Versions},
    pin_this_thread,
};

/// The webhook's limit of an `AdmissionReview` (`webhook::routes::ADMISSION_REVIEW_LIMIT`).
pub const REVIEW_LIMIT: usize = 6 << 20;
/// The webhook's `--extender-body-limit` by default.
pub const EXTENDER_LIMIT: usize = 8 << 20;
/// The agent's limit of a `/v1` body (`api::admit::BODY_LIMIT`).
pub const AGENT_LIMIT: usize = 1 << 20;
/// The agent's dry run, the path the webhook asks.
pub const AGENT_DRY_RUN: &str = "/v1/admit?dryRun=true";
/// The shipped Deployment's memory limit (`deploy/components/webhook/deployment.yaml`).
pub const MEMORY_LIMIT_BYTES: u64 = 256 << 20;
/// How often each well-behaved caller asks.
pub const CALLER_EVERY: Duration = Duration::from_millis(100);

/// How long any read of these clients may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// One kind of flood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flood {
    AtLimit,
    Declared,
    Chunked,
    Slow,
}

impl Flood {
    pub const ALL: [Flood; 4] = [Flood::AtLimit, Flood::Declared, Flood::Chunked, Flood::Slow];

    pub fn name(self) -> &'static str {
        match self {
            Flood::AtLimit => "at the limit",
            Flood::Declared => "declared over the limit",
            Flood::Chunked => "chunked over the limit",
            Flood::Slow => "a byte a second",
        }
    }
}

/// What the floods were answered, by flood and status (0: no answer, the connection ended).
#[derive(Debug, Default)]
pub struct Tally {
    answers: Mutex<BTreeMap<(Flood, u16), u64>>,
    /// 503s without a `Retry-After`.
    pub no_retry_after: Mutex<u64>,
}

impl Tally {
    fn count(&self, flood: Flood, status: u16) {
        if let Ok(mut answers) = self.answers.lock() {
            *answers.entry((flood, status)).or_default() += 1;
        }
    }

    /// Every (flood, status) and how many.
    pub fn answers(&self) -> BTreeMap<(Flood, u16), u64> {
        self.answers.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

/// Where the floods and the callers go.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// The name its certificate is verified by.
    pub name: &'static str,
    /// HTTP/1.1 only (no ALPN): the floods, the scheduler's filter and the webhook's dry runs.
    pub http1: Arc<ClientConfig>,
    /// Offers `h2`: the API server's reviews.
    pub h2: Arc<ClientConfig>,
}

impl Target {
    /// The webhook listening on loopback `port`, verified by the cluster's webhook CA and name.
    pub fn webhook(pki: &cluster::Pki, port: u16) -> Target {
        let http1 = mtls::client_config(&[&pki.webhook], None, Versions::Any);
        let mut h2 = (*http1).clone();
        h2.alpn_protocols = vec![b"h2".to_vec()];
        Target {
            addr: SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)),
            name: cluster::WEBHOOK_NAME,
            http1,
            h2: Arc::new(h2),
        }
    }
}

/// A pod as the API server stores it, asking for 2 MiB hugepages, on `node` when given, with
/// `padding` bytes of annotations: a string, or a list of zeros.
fn padded_pod(node: Option<&str>, padding: usize, zeros: bool) -> Value {
    let mut pod = cluster::pod(Some("4Mi"));
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    let pad = if zeros {
        Value::Array(vec![json!(0); padding / 2])
    } else {
        json!("x".repeat(padding))
    };
    pod["metadata"]["annotations"] = json!({ "padding": pad });
    pod
}

/// `ExtenderArgs` (`nodenames`) of `names` with a padded pod, just under `limit` bytes.
pub fn filter_at(limit: usize, names: &[&str], zeros: bool) -> Vec<u8> {
    fill(
        limit,
        |padding| json!({"pod": padded_pod(None, padding, zeros), "nodenames": names}),
    )
}

/// An `AdmissionReview` of a padded pod created on `node`, just under `limit` bytes.
pub fn review_at(limit: usize, node: &str, zeros: bool) -> Vec<u8> {
    fill(limit, |padding| {
        cluster::creation_review(&padded_pod(Some(node), padding, zeros), "flood", true)
    })
}

/// `make(padding)` serialized, with the padding that takes it to just under `limit`.
fn fill(limit: usize, make: impl Fn(usize) -> Value) -> Vec<u8> {
    let bare = make(0).to_string().len();
    let mut padding = limit.saturating_sub(bare + 64);
    loop {
        let body = make(padding).to_string().into_bytes();
        if body.len() < limit {
            return body;
        }
        padding -= (body.len() - limit) + 64;
    }
}

/// A TLS connection to the target, HTTP/1.1.
fn connect(target: &Target) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
    // Given up as an abuser's: a flood that hammers one listener has its SYNs dropped.
    let tcp = crate::abusers::connect(target.addr)?;
    tcp.set_read_timeout(Some(READ_TIMEOUT))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(target.name).map_err(io::Error::other)?;
    let tls = ClientConnection::new(target.http1.clone(), name).map_err(io::Error::other)?;
    Ok(StreamOwned::new(tls, tcp))
}

/// An answer's status and whether it said `Retry-After`, read from its head; `None` when the
/// connection ended first.
fn answer(stream: &mut impl Read) -> Option<(u16, bool)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.contains("\r\nretry-after:")))
}

/// One request of `flood` to `path` with `body` (its at-limit body; the others make their own
/// from `limit`): the answer's status (0: none) and whether it said `Retry-After`. A slow body
/// gives up when `stop` is set.
fn one(
    target: &Target,
    flood: Flood,
    path: &str,
    body: &[u8],
    limit: usize,
    stop: &AtomicBool,
) -> (u16, bool) {
    let Ok(mut stream) = connect(target) else {
        return (0, false);
    };
    let name = target.name;
    let head = |length: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: {name}\r\ncontent-type: application/json\r\n{length}\r\n"
        )
    };
    let sent = match flood {
        Flood::AtLimit => stream
            .write_all(head(&format!("content-length: {}\r\n", body.len())).as_bytes())
            .and_then(|()| stream.write_all(body)),
        Flood::Declared => {
            stream.write_all(head(&format!("content-length: {}\r\n", limit + 1)).as_bytes())
        }
        Flood::Chunked => chunked(&mut stream, &head("transfer-encoding: chunked\r\n"), limit),
        Flood::Slow => {
            let started = stream
                .write_all(head(&format!("content-length: {}\r\n", limit / 2)).as_bytes())
                .and_then(|()| stream.flush());
            if started.is_ok() {
                return drip(&mut stream, stop);
            }
            started
        }
    };
    let _ = stream.flush();
    // The answer may come before the whole body was sent (413 while reading): read it anyway.
    let _ = sent;
    answer(&mut stream).unwrap_or((0, false))
}

/// A chunked body past `limit`, 64 KiB a chunk, until the server stops reading.
fn chunked(
    stream: &mut StreamOwned<ClientConnection, TcpStream>,
    head: &str,
    limit: usize,
) -> io::Result<()> {
    stream.write_all(head.as_bytes())?;
    let chunk = vec![b' '; 64 << 10];
    let mut sent = 0;
    while sent <= limit + chunk.len() {
        write!(stream, "{:x}\r\n", chunk.len())?;
        stream.write_all(&chunk)?;
        stream.write_all(b"\r\n")?;
        sent += chunk.len();
    }
    stream.flush()
}

/// A byte a second until the server answers, or `stop` is set (no answer: 0).
fn drip(stream: &mut StreamOwned<ClientConnection, TcpStream>, stop: &AtomicBool) -> (u16, bool) {
    let _ = stream.sock.set_read_timeout(Some(Duration::from_secs(1)));
    while !stop.load(Ordering::Relaxed) {
        let mut peek = [0u8; 1];
        match stream.sock.peek(&mut peek) {
            Ok(0) => return (0, false),
            Ok(_) => {
                let _ = stream.sock.set_read_timeout(Some(READ_TIMEOUT));
                return answer(stream).unwrap_or((0, false));
            }
            Err(_) => {
                if stream
                    .write_all(b" ")
                    .and_then(|()| stream.flush())
                    .is_err()
                {
                    return answer(stream).unwrap_or((0, false));
                }
            }
        }
    }
    (0, false)
}

/// Request bodies, taken in turn.
pub type Bodies = Arc<Vec<Vec<u8>>>;

/// Threads of one flood against one path.
#[derive(Clone)]
pub struct Wave {
    pub flood: Flood,
    pub path: &'static str,
    /// The at-limit bodies.
    pub bodies: Bodies,
    /// The path's limit.
    pub limit: usize,
    pub threads: usize,
    /// The CPU the threads run on, if kept to one: a flood's client is its own machine's load,
    /// not the node's.
    pub cpu: Option<usize>,
}

/// The last CPU this process may run on, when it may run on two or more: where the floods go,
/// the target and its callers keeping the others.
pub fn flood_cpu() -> Option<usize> {
    let cpus = allowed_cpus();
    (cpus.len() > 1).then(|| cpus.last().copied()).flatten()
}

/// The webhook's floods: 8 threads of at-limit bodies on each endpoint, 2 declared over the
/// limit, 2 chunked past it, 24 a byte a second.
pub fn webhook_waves(cpu: Option<usize>) -> Vec<Wave> {
    let (filters, reviews) = bodies();
    let wave = |flood, path, bodies: &Bodies, limit, threads| Wave {
        flood,
        path,
        bodies: Arc::clone(bodies),
        limit,
        threads,
        cpu,
    };
    let (filter, validate) = ("/scheduler/filter", "/admission/validate");
    vec![
        wave(Flood::AtLimit, filter, &filters, EXTENDER_LIMIT, 8),
        wave(Flood::AtLimit, validate, &reviews, REVIEW_LIMIT, 8),
        wave(Flood::Declared, filter, &filters, EXTENDER_LIMIT, 2),
        wave(Flood::Chunked, validate, &reviews, REVIEW_LIMIT, 2),
        wave(Flood::Slow, filter, &filters, EXTENDER_LIMIT, 24),
    ]
}

/// An agent's floods, the same on its `/v1/admit` with 1 MiB bodies: 32 threads of at-limit
/// bodies, 2 declared over, 2 chunked past, 16 a byte a second.
pub fn agent_waves(cpu: Option<usize>) -> Vec<Wave> {
    let bodies = agent_bodies();
    [
        (Flood::AtLimit, 32),
        (Flood::Declared, 2),
        (Flood::Chunked, 2),
        (Flood::Slow, 16),
    ]
    .into_iter()
    .map(|(flood, threads)| Wave {
        flood,
        path: AGENT_DRY_RUN,
        bodies: Arc::clone(&bodies),
        limit: AGENT_LIMIT,
        threads,
        cpu,
    })
    .collect()
}

/// Runs `wave` against `target` until `stop`, each thread one request at a time on a new
/// connection, counting each answer in `tally`.
pub fn start(
    target: &Target,
    wave: &Wave,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> Vec<JoinHandle<()>> {
    (0..wave.threads)
        .map(|i| {
            let (target, wave, stop, tally) = (
                target.clone(),
                wave.clone(),
                Arc::clone(stop),
                Arc::clone(tally),
            );
            thread::spawn(move || {
                if let Some(cpu) = wave.cpu {
                    pin_this_thread(cpu);
                }
                let mut turn = i;
                let bodies = &wave.bodies;
                while !stop.load(Ordering::Relaxed) {
                    let body = bodies
                        .get(turn % bodies.len().max(1))
                        .map_or(&[][..], |b| b);
                    turn += 1;
                    let (status, retry_after) =
                        one(&target, wave.flood, wave.path, body, wave.limit, &stop);
                    if status == 0 && wave.flood == Flood::Slow && stop.load(Ordering::Relaxed) {
                        // Given up at the end, not answered.
                        break;
                    }
                    tally.count(wave.flood, status);
                    if status == 503
                        && !retry_after
                        && let Ok(mut n) = tally.no_retry_after.lock()
                    {
                        *n += 1;
                    }
                    if status == 0 {
                        // Refused at accept (over --max-connections): not a busy loop.
                        thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

/// What a well-behaved caller got: each call's status and how long it took.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    pub statuses: Vec<u16>,
    pub took: Vec<Duration>,
    /// When each answer came.
    pub at: Vec<Instant>,
}

/// Which of the webhook's peers a caller is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// kube-scheduler's filter, `nodenames` form, over HTTP/1.1 kept alive.
    Scheduler,
    /// The API server's review of a pod created on a node, over HTTP/2.
    ApiServer,
    /// The webhook's dry run of a pod to a node's agent, over HTTP/1.1 kept alive.
    Webhook,
}

/// Starts `caller` asking every [`CALLER_EVERY`] until `stop`: the scheduler filters `node`, the
/// API server reviews a pod placed on `node`, the webhook asks an agent a dry run. Each pod asks
/// for hugepages, so the webhook asks the node's agent each time.
pub fn call(
    target: &Target,
    caller: Caller,
    node: &'static str,
    stop: &Arc<AtomicBool>,
) -> JoinHandle<Calls> {
    let (target, stop) = (target.clone(), Arc::clone(stop));
    thread::spawn(move || {
        let (config, path, body) = match caller {
            Caller::Scheduler => (
                target.http1.clone(),
                "/scheduler/filter",
                json!({"pod": cluster::pod(Some("4Mi")), "nodenames": [node]}),
            ),
            Caller::ApiServer => {
                let mut pod = cluster::pod(Some("4Mi"));
                pod["spec"]["nodeName"] = json!(node);
                (
                    target.h2.clone(),
                    "/admission/validate",
                    cluster::creation_review(&pod, "good", true),
                )
            }
            Caller::Webhook => (
                target.http1.clone(),
                AGENT_DRY_RUN,
                cluster::pod(Some("4Mi")),
            ),
        };
        let body = body.to_string();
        let mut client = Https::connect(target.addr, config, target.name);
        let mut calls = Calls::default();
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let (status, _) = client.request("POST", path, &[], &body);
            calls.took.push(started.elapsed());
            calls.statuses.push(status);
            calls.at.push(Instant::now());
            thread::sleep(CALLER_EVERY.saturating_sub(started.elapsed()));
        }
        calls
    })
}

/// The at-limit bodies of each of the webhook's endpoints: half padded with a string, half
/// with zeros.
fn bodies() -> (Bodies, Bodies) {
    let filters = [false, true].map(|zeros| filter_at(EXTENDER_LIMIT, &["nobody"], zeros));
    let reviews = [false, true].map(|zeros| review_at(REVIEW_LIMIT, "nobody", zeros));
    (Arc::new(filters.to_vec()), Arc::new(reviews.to_vec()))
}

/// The at-limit bodies of an agent's `/v1/admit`: a pod padded the same two ways.
fn agent_bodies() -> Bodies {
    let pods = [false, true].map(|zeros| fill(AGENT_LIMIT, |p| padded_pod(None, p, zeros)));
    Arc::new(pods.to_vec())
}
