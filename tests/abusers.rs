//! Clients that misbehave, and the well-behaved one they must not hurt, over real sockets: for
//! `tests/abuse.rs` and `cargo xtask bench abuse` (`bin/abuse_load.rs`).
//!
//! The well-behaved client is [`KeptAlive`]: one HTTP/1.1 connection kept alive for every
//! request, as the webhook's pool keeps its connections to an agent. The abusers each do one
//! thing a listener must bound: a head that never ends ([`slow_head`]), a connection that says
//! nothing ([`silent`]), a head larger than the read buffer ([`oversized_head`]), bytes that are
//! not HTTP ([`garbage`]), a body sent a byte at a time ([`SlowBody`]), and HTTP/2 streams
//! opened and reset in a loop ([`reset_loop`]).

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::{Duration, Instant},
};

use hyper::Request;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

/// How long any read of these clients may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an abuser's connect may wait: a listener that filters the abuser's SYNs leaves
/// it to the kernel's retries (two minutes), as it would a real one that gave up sooner. Under
/// the first retry's second, so a connect tried while filtered fails whatever happens next.
pub const CONNECT_WITHIN: Duration = Duration::from_millis(500);

/// An abuser's connection to `addr`, given up after [`CONNECT_WITHIN`].
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, CONNECT_WITHIN)
}

/// A request that starts well and never ends its head.
pub const SLOW_HEAD: &[u8] = b"POST /v1/admit HTTP/1.1\r\nHost: agent\r\nX-Slow: ";

/// One HTTP/1.1 connection kept alive for every request.
pub struct KeptAlive {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl KeptAlive {
    pub fn connect(addr: SocketAddr) -> io::Result<KeptAlive> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(KeptAlive {
            stream,
            buffer: Vec::new(),
        })
    }

    /// The connection, to wait on.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// `method path` with a JSON `body` (none when empty): the status and the body.
    pub fn request(&mut self, method: &str, path: &str, body: &str) -> io::Result<(u16, String)> {
        let ctype = if body.is_empty() {
            ""
        } else {
            "content-type: application/json\r\n"
        };
        write!(
            self.stream,
            "{method} {path} HTTP/1.1\r\nhost: agent\r\n{ctype}content-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        read_answer(&mut self.stream, &mut self.buffer)
    }
}

/// One answer from `stream` (with a `content-length`), bytes past it left in `buffer`.
pub fn read_answer(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> io::Result<(u16, String)> {
    let mut chunk = [0u8; 8192];
    let eof = || io::Error::new(io::ErrorKind::UnexpectedEof, "closed before the answer");
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(eof());
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, head.clone()))?;
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(eof());
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buffer[head_end..head_end + length]).into_owned();
    buffer.drain(..head_end + length);
    Ok((status, body))
}

/// A connection that has sent [`SLOW_HEAD`] and nothing more (a slowloris).
pub fn slow_head(addr: SocketAddr) -> io::Result<TcpStream> {
    let mut stream = connect(addr)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.write_all(SLOW_HEAD)?;
    Ok(stream)
}

/// A connection that sends nothing at all.
pub fn silent(addr: SocketAddr) -> io::Result<TcpStream> {
    let stream = connect(addr)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    Ok(stream)
}

/// Waits until the server closes `stream` (end of stream or a reset), sending one more byte of
/// the head every `drip` if given; how long that took, or `None` if it was not closed within
/// `within`. What the server sent before is in `answer`.
pub fn closed(
    stream: &mut TcpStream,
    drip: Option<Duration>,
    within: Duration,
    answer: &mut Vec<u8>,
) -> Option<Duration> {
    let started = Instant::now();
    let step = drip.unwrap_or(within).min(within);
    stream.set_read_timeout(Some(step)).ok()?;
    let mut chunk = [0u8; 4096];
    while started.elapsed() < within {
        match stream.read(&mut chunk) {
            Ok(0) => return Some(started.elapsed()),
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if drip.is_some() && stream.write_all(b"a").is_err() {
                    return Some(started.elapsed());
                }
            }
            Err(_) => return Some(started.elapsed()),
        }
    }
    None
}

/// A request head of `bytes` bytes or more (one header that long), sent whole; the answer read
/// until the server closes.
pub fn oversized_head(addr: SocketAddr, bytes: usize) -> io::Result<String> {
    let mut head = b"POST /v1/admit HTTP/1.1\r\nHost: agent\r\nX-Big: ".to_vec();
    head.resize(head.len() + bytes, b'a');
    head.extend_from_slice(b"\r\n\r\n");
    send_and_read(addr, &head)
}

/// Bytes that are not HTTP (a TLS ClientHello's start, then text); the answer read until the
/// server closes.
pub fn garbage(addr: SocketAddr) -> io::Result<String> {
    send_and_read(
        addr,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP\r\n\r\n",
    )
}

/// Sends `bytes` on a new connection and reads until the server closes (a reset after the
/// answer counts as closed).
fn send_and_read(addr: SocketAddr, bytes: &[u8]) -> io::Result<String> {
    let mut stream = connect(addr)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    // The server may answer and close before it has read everything: a failed write is fine.
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset && !answer.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A `POST /v1/admit` whose head is complete and whose body of `length` bytes comes one byte
/// per [`SlowBody::drip`].
pub struct SlowBody {
    pub stream: TcpStream,
}

impl SlowBody {
    pub fn start(addr: SocketAddr, length: usize) -> io::Result<SlowBody> {
        let mut stream = connect(addr)?;
        write!(
            stream,
            "POST /v1/admit HTTP/1.1\r\nhost: agent\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n{{"
        )?;
        Ok(SlowBody { stream })
    }

    /// Sends a byte of the body every `every` until the server answers; the answer's status,
    /// how long it took, and whether the server then closed the connection.
    pub fn drip(&mut self, every: Duration, within: Duration) -> io::Result<(u16, Duration, bool)> {
        let started = Instant::now();
        let mut answer = Vec::new();
        self.stream.set_read_timeout(Some(every))?;
        let mut chunk = [0u8; 4096];
        loop {
            if started.elapsed() > within {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"));
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if answer.is_empty() {
                        // Once the server has answered, a byte more may meet a closed socket.
                        let _ = self.stream.write_all(b" ");
                    }
                    continue;
                }
                Err(_) if !answer.is_empty() => break,
                Err(e) => return Err(e),
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                let took = started.elapsed();
                let mut rest = Vec::new();
                let closed =
                    closed(&mut self.stream, None, Duration::from_secs(5), &mut rest).is_some();
                let text = String::from_utf8_lossy(&answer);
                let status = text
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                return Ok((status, took, closed));
            }
        }
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "closed before an answer",
        ))
    }
}

/// An `AdmissionReview` of a pod without hugepages created on a node: the webhook allows it
/// without asking an agent.
pub fn plain_pod_review(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": crate::cluster::pod(None),
            "dryRun": false
        }
    })
}

/// How an HTTP/2 reset loop ended.
#[derive(Debug)]
pub struct ResetLoop {
    /// Streams opened and reset before the connection ended.
    pub streams: usize,
    /// The error that ended it (a GOAWAY from the server, when the limit acted).
    pub ended: Option<h2::Error>,
}

/// Opens streams (`POST path`, no body yet) on one HTTP/2 connection to `addr` and resets each
/// at once (rapid reset, CVE-2023-44487), until the connection ends or `most` streams were
/// reset. The connection is TLS with `config` (which must offer `h2`), the server verified as
/// `name`.
pub async fn reset_loop(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    name: &str,
    path: &str,
    most: usize,
) -> io::Result<ResetLoop> {
    let server = ServerName::try_from(name.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tcp = tokio::time::timeout(CONNECT_WITHIN, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    tcp.set_nodelay(true)?;
    let tls = TlsConnector::from(config).connect(server, tcp).await?;
    let (client, connection) = h2::client::handshake(tls).await.map_err(io::Error::other)?;
    let driver = tokio::spawn(connection);
    let mut streams = 0;
    let mut client = client;
    let mut ended = None;
    let uri = format!("https://{name}{path}");
    while streams < most {
        if let Err(e) = std::future::poll_fn(|cx| client.poll_ready(cx)).await {
            ended = Some(e);
            break;
        }
        let request = Request::post(uri.as_str())
            .header("content-type", "application/json")
            .body(())
            .map_err(io::Error::other)?;
        match client.send_request(request, false) {
            Ok((_answer, mut body)) => {
                body.send_reset(h2::Reason::CANCEL);
                streams += 1;
            }
            Err(e) => {
                ended = Some(e);
                break;
            }
        }
        if streams % 64 == 0 {
            // Let the connection's task write what is queued.
            tokio::task::yield_now().await;
        }
    }
    drop(client);
    // The connection's own end says why, when the loop did not see it.
    let finished = tokio::time::timeout(Duration::from_secs(10), driver).await;
    if let Ok(Ok(Err(e))) = finished
        && ended.as_ref().is_none_or(|e| !e.is_go_away())
    {
        ended = Some(e);
    }
    Ok(ResetLoop { streams, ended })
}
