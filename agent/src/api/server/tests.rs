use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::Arc,
};

use axum::{Router, routing::get};
use tokio::sync::Notify;

use super::*;
use crate::tls;

/// `GET path` over a new connection; the answer's body.
fn get_body(addr: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    // A request nobody serves fails the test instead of hanging it.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// `/slow` blocks its thread until `release` is notified (`entered` says it has started);
/// `/` answers with the name of the thread that served it.
fn router(entered: Arc<Notify>, release: Arc<std::sync::Barrier>) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { thread::current().name().unwrap_or("?").to_owned() }),
        )
        .route(
            "/slow",
            get(move || {
                entered.notify_one();
                // Blocks the thread's runtime, as a slow synchronous step would.
                release.wait();
                async { "done" }
            }),
        )
}

/// A server of `threads` threads, one of them blocked in a `/slow` request.
struct Blocked {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: Server,
    /// Lets the `/slow` request finish.
    release: Arc<std::sync::Barrier>,
    /// The `/slow` request's answer.
    slow: tokio::task::JoinHandle<String>,
}

async fn blocked(threads: usize) -> Blocked {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(std::sync::Barrier::new(2));
    let bound = Server::bind(Endpoint::API, any_port()).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let app = router(Arc::clone(&entered), Arc::clone(&release));
    let serving = Serving::new(app, None, Limits::DEFAULT, Arc::default());
    let server = Server::start(bound, threads, serving, stopped).expect("start");
    let slow = tokio::task::spawn_blocking(move || get_body(addr, "/slow"));
    entered.notified().await;
    Blocked {
        addr,
        stop,
        server,
        release,
        slow,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_thread_blocked_in_a_request_leaves_new_connections_to_the_others() {
    let Blocked {
        addr,
        stop,
        server,
        release,
        slow,
    } = blocked(2).await;
    let blocked = tokio::task::spawn_blocking(move || {
        (0..5)
            .map(|_| get_body(addr, "/"))
            .collect::<std::collections::BTreeSet<_>>()
    })
    .await
    .expect("client");
    assert_eq!(
        blocked.len(),
        1,
        "one thread answered while the other was blocked: {blocked:?}"
    );
    assert!(
        blocked.iter().all(|name| name.starts_with("http-api-")),
        "{blocked:?}"
    );
    release.wait();
    assert_eq!(slow.await.expect("client"), "done");
    stop.send(true).expect("stop");
    assert_eq!(
        server.stopped(Duration::from_secs(5)).await,
        Drained::default()
    );
    assert!(
        TcpStream::connect(addr).is_err(),
        "nothing listens on {addr} once drained"
    );
}

#[tokio::test]
async fn a_port_another_socket_holds_is_refused_even_if_it_allows_sharing() {
    // A second agent's listener, or anything that set SO_REUSEPORT to share the port.
    let other = TcpSocket::new_v4().expect("socket");
    other.set_reuseport(true).expect("SO_REUSEPORT");
    other.set_reuseaddr(true).expect("SO_REUSEADDR");
    other.bind(any_port()).expect("bind");
    let addr = other.local_addr().expect("address");
    let _held = other.listen(8).expect("listen");
    let err = Server::bind(Endpoint::API, addr).expect_err("the port is taken");
    assert!(
        err.to_string().starts_with(&format!("--listen {addr}: ")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_request_still_running_at_the_deadline_is_reported_busy() {
    let Blocked {
        stop,
        server,
        release,
        slow,
        ..
    } = blocked(1).await;
    stop.send(true).expect("stop");
    let drained = server.stopped(Duration::from_millis(200)).await;
    assert_eq!(
        drained,
        Drained {
            busy: 1,
            failed: None
        }
    );
    release.wait();
    assert_eq!(
        slow.await.expect("client"),
        "done",
        "the request in flight is answered"
    );
}

/// PEM files of a CA, a server certificate for [`tls::SERVER_NAME`] and a client certificate,
/// and a client config that trusts the CA and presents that client certificate.
struct Pki {
    dir: tempfile::TempDir,
    roots: rustls::RootCertStore,
    client: Arc<rustls::ClientConfig>,
}

/// A client config trusting `roots`, of TLS 1.3 and 1.2.
fn client_builder(
    roots: rustls::RootCertStore,
) -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
}

fn pki() -> Pki {
    use rcgen::ExtendedKeyUsagePurpose;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

    use crate::tls::test_pki::{ca, leaf};
    let (ca_pem, issuer) = ca("test CA");
    let (server_cert, server_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ClientAuth);
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, pem) in [
        ("ca.crt", &ca_pem),
        ("tls.crt", &server_cert),
        ("tls.key", &server_key),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write");
    }
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("CA PEM"))
        .expect("trust the CA");
    let client = client_builder(roots.clone())
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(client_cert.as_bytes()).expect("cert PEM")],
            PrivateKeyDer::from_pem_slice(client_key.as_bytes()).expect("key PEM"),
        )
        .expect("client certificate");
    Pki {
        dir,
        roots,
        client: Arc::new(client),
    }
}

impl Pki {
    fn files(&self) -> tls::TlsFiles {
        tls::TlsFiles {
            cert: self.dir.path().join("tls.crt"),
            key: self.dir.path().join("tls.key"),
            client_ca: Some(self.dir.path().join("ca.crt")),
        }
    }
}

/// `GET /` over TLS with `client`: the answer, or the error that ended the exchange.
async fn get_tls(addr: SocketAddr, client: Arc<rustls::ClientConfig>) -> io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let name = rustls_pki_types::ServerName::try_from(tls::SERVER_NAME).expect("a DNS name");
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut stream = tokio_rustls::TlsConnector::from(client)
        .connect(name, tcp)
        .await?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_client_stalling_its_handshake_holds_up_no_one_and_a_refusal_is_counted() {
    let pki = pki();
    let stats = Arc::new(tls::TlsStats::default());
    let (server_tls, _reloader) =
        tls::load(&pki.files(), tls::Alpn::Http1, stats.clone()).expect("valid files");
    let bound = Server::bind(Endpoint::API, any_port()).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let app = Router::new().route("/", get(|| async { "hello over TLS" }));
    let serving = Serving::new(app, Some(server_tls), Limits::DEFAULT, Arc::default());
    let server = Server::start(bound, 1, serving, stopped).expect("start");

    // Connected, and silent: its handshake waits in its own task.
    let _stalled = TcpStream::connect(addr).expect("connect");
    let answer = tokio::time::timeout(Duration::from_secs(5), get_tls(addr, pki.client.clone()))
        .await
        .expect("answered while another handshake stalls")
        .expect("a valid client certificate");
    assert!(answer.ends_with("hello over TLS"), "{answer}");

    // No client certificate: refused in the handshake, counted by why.
    let anonymous = client_builder(pki.roots.clone()).with_no_client_auth();
    let refused = get_tls(addr, Arc::new(anonymous)).await;
    assert!(
        refused.is_err(),
        "answered without a certificate: {refused:?}"
    );
    let counted = async {
        while stats.refusals(tls::Refusal::NoCertificate) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), counted)
        .await
        .expect("the refusal is counted as no_certificate");

    stop.send(true).expect("stop");
    assert_eq!(
        server.stopped(Duration::from_secs(5)).await,
        Drained::default(),
        "the stalled handshake does not hold up the stop"
    );
}

/// A server of one thread with `limits` answering `GET /` with "hello"; its stats.
fn limited(
    limits: Limits,
) -> (
    SocketAddr,
    watch::Sender<bool>,
    Server,
    Arc<ConnectionStats>,
) {
    let bound = Server::bind(Endpoint::API, any_port()).expect("bind");
    let addr = bound.addr();
    let (stop, stopped) = watch::channel(false);
    let stats = Arc::new(ConnectionStats::default());
    let app = Router::new().route("/", get(|| async { "hello" }));
    let serving = Serving::new(app, None, limits, stats.clone());
    let server = Server::start(bound, 1, serving, stopped).expect("start");
    (addr, stop, server, stats)
}

/// Waits up to 5 s for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let waited = async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), waited)
        .await
        .unwrap_or_else(|_| panic!("{what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_connection_over_the_limit_is_closed_at_once_and_counted_and_its_place_comes_back() {
    let limits = Limits {
        max_connections: 1,
        ..Limits::DEFAULT
    };
    let (addr, stop, server, stats) = limited(limits);
    let held = TcpStream::connect(addr).expect("connect");
    eventually("the first is open", || stats.open() == 1).await;
    refused_at_accept(addr, "answered over the limit").await;
    assert_eq!(stats.cuts(Cut::OverLimit), 1);
    drop(held);
    eventually("the first is closed", || stats.open() == 0).await;
    let answer = tokio::task::spawn_blocking(move || get_body(addr, "/"))
        .await
        .expect("client");
    assert_eq!(answer, "hello");
    stop.send(true).expect("stop");
    assert_eq!(
        server.stopped(Duration::from_secs(5)).await,
        Drained::default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_head_not_complete_in_time_and_an_idle_connection_are_closed_and_counted() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::DEFAULT
    };
    let (addr, stop, _server, stats) = limited(limits);
    let closed_after = move |head: &'static [u8]| {
        let mut tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        tcp.write_all(head).expect("send");
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        (started.elapsed(), rest)
    };
    let (slow, _) = tokio::task::spawn_blocking(move || closed_after(b"GET / HTTP/1.1\r\nHost"))
        .await
        .expect("client");
    assert!(slow < Duration::from_secs(4), "closed after {slow:?}");
    // Answered, then idle: closed by the same time-out.
    let (idle, answer) =
        tokio::task::spawn_blocking(move || closed_after(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"))
            .await
            .expect("client");
    assert!(String::from_utf8_lossy(&answer).ends_with("hello"));
    assert!(idle < Duration::from_secs(4), "closed after {idle:?}");
    eventually("both counted", || stats.cuts(Cut::HeaderTimeout) == 2).await;
    stop.send(true).expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_oversized_head_is_431_and_garbage_400_each_counted() {
    let (addr, stop, _server, stats) = limited(Limits::DEFAULT);
    let answer = move |request: Vec<u8>| {
        let mut tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = tcp.write_all(&request);
        let mut answer = Vec::new();
        let _ = tcp.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let mut big = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', READ_BUFFER + (6 << 10)));
    let too_large = tokio::task::spawn_blocking(move || answer(big))
        .await
        .expect("client");
    assert!(too_large.starts_with("HTTP/1.1 431 "), "{too_large}");
    let garbage = b"\x16\x03\x01\x00\xffnot http at all\r\n\r\n".to_vec();
    let bad = tokio::task::spawn_blocking(move || answer(garbage))
        .await
        .expect("client");
    assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    eventually("counted", || {
        stats.cuts(Cut::HeadTooLarge) == 1 && stats.cuts(Cut::Malformed) == 1
    })
    .await;
    stop.send(true).expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_connection_without_a_first_request_in_time_is_closed_and_counted_idle() {
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::DEFAULT
    };
    let (addr, stop, _server, stats) = limited(limits);
    let took = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).expect("connect");
        tcp.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        started.elapsed()
    })
    .await
    .expect("client");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    eventually("counted", || stats.cuts(Cut::Idle) == 1).await;
    // One that asks at once is answered, and kept alive past the first request's limit.
    let body = tokio::task::spawn_blocking(move || get_body(addr, "/"))
        .await
        .expect("client");
    assert_eq!(body, "hello");
    stop.send(true).expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn one_peer_holds_at_most_its_places_and_the_next_is_reset() {
    let limits = Limits {
        max_connections_per_peer: 2,
        ..Limits::DEFAULT
    };
    let (addr, stop, _server, stats) = limited(limits);
    let held: Vec<_> = (0..2)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    eventually("both open", || stats.open() == 2).await;
    refused_at_accept(addr, "answered over the peer's places").await;
    assert_eq!(stats.cuts(Cut::PerPeer), 1);
    drop(held);
    eventually("closed", || stats.open() == 0).await;
    stop.send(true).expect("stop");
}

/// A request on a new connection to `addr` gets no answer: the connection is closed at accept,
/// by a reset or an empty close (`why` says what an answer would mean).
async fn refused_at_accept(addr: SocketAddr, why: &'static str) {
    let over = tokio::task::spawn_blocking(move || {
        let mut over = TcpStream::connect(addr).expect("the kernel accepts it");
        over.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let _ = write!(over, "GET / HTTP/1.1\r\nHost: t\r\n\r\n");
        let mut answer = Vec::new();
        over.read_to_end(&mut answer).map(|_| answer)
    })
    .await
    .expect("client");
    match over {
        Ok(answer) => assert!(answer.is_empty(), "{why}"),
        Err(err) => assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}"),
    }
}
