//! Who may call the webhook, and what a caller can hold before it is authenticated (#52): the
//! real webhook (HTTPS, its Node cache from the stand-in API server, no agents needed: the calls
//! here name no node with hugepages), over real sockets with certificates made here; peers are
//! told apart by their source addresses on loopback (127.0.0.1, 127.0.0.2, …).
//!
//! * With `--client-ca-file` and `--client-names`: no certificate and another CA's fail the
//!   handshake; the CA's certificate with an allowed name is answered; one with another name is
//!   closed after the handshake, unanswered, and counted `name_not_allowed`; the plain
//!   `--metrics-listen` serves probes and metrics and nothing else.
//! * Handshaked connections that send nothing, from one peer, hold at most
//!   `--max-connections-per-peer` places: a well-formed filter from another peer is answered
//!   within a second, as the idle ones are closed after `--handshake-timeout`.
//! * Stalled handshakes hold no served connection's place: with `--max-connections 4`, forty
//!   of them leave a caller from another peer answered at once, and each ends at
//!   `--handshake-timeout`, counted.
//! * An HTTP/2 connection with no stream open is closed after `--http2-idle-timeout`.
//! * A peer at `--max-connections-per-peer` that keeps trying for more has its new connections
//!   dropped by the kernel (the listener's socket filter, on the real kernel: a connect times
//!   out instead of being reset after an accept), keeps the connections it has, and connects
//!   again once below its limit; one that tries a few times only is refused at accept.

use std::{
    fs,
    io::Read,
    net::{IpAddr, Ipv4Addr, TcpStream},
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, agent_bin,
    apiserver::StandInApiServer,
    cluster::{self, Pki, WEBHOOK_NAME, args, pod, sample},
    free_port, http,
    https::Https,
    mtls::{self, Ca, Connection, Pair, Versions},
    wait_ready,
};
use rustls_pki_types::ServerName;

fn name() -> ServerName<'static> {
    ServerName::try_from(WEBHOOK_NAME).expect("a DNS name")
}

/// A webhook over `api` with the flags `extra` and its plain metrics listener; ready.
fn webhook(pki: &Pki, api: &StandInApiServer, extra: &[&str]) -> (Agent, u16) {
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    let mut flags = vec!["--metrics-listen", &listen];
    flags.extend_from_slice(extra);
    let webhook = cluster::webhook_with(
        &agent_bin(),
        pki,
        api,
        free_port(),
        ["ignore", "2s"],
        &[],
        &flags,
    );
    wait_ready(metrics, Duration::from_secs(20)).expect("the webhook is ready");
    (webhook, metrics)
}

/// The webhook's metrics, over its plain listener.
fn metrics(port: u16) -> String {
    let (status, text) = http(port, "GET", "/metrics", None, "");
    assert_eq!(status, 200, "{text}");
    text
}

/// A filter of a pod without hugepages (answered without any agent), from `source`, presenting
/// `identity`: the status, and how long from the connect to the answer.
fn filter_from(
    pki: &Pki,
    port: u16,
    source: IpAddr,
    identity: Option<&Pair>,
) -> std::io::Result<(u16, Duration)> {
    let started = Instant::now();
    let config = mtls::client_config(&[&pki.webhook], identity, Versions::Any);
    let body = args(pod(None), &[]).to_string();
    let answer = Connection::open_from(source, port, config, name())?.request(
        "POST",
        "/scheduler/filter",
        Some("application/json"),
        &body,
    )?;
    Ok((answer.status, started.elapsed()))
}

fn peer(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

#[test]
fn with_a_client_ca_only_its_certificates_of_the_allowed_names_are_answered() {
    let pki = Pki::new();
    let callers = Ca::new("callers CA");
    fs::write(pki.path("callers-ca.crt"), &callers.pem).expect("write the CA");
    let api = StandInApiServer::start();
    let ca = pki.path("callers-ca.crt").display().to_string();
    let (webhook, plain) = webhook(
        &pki,
        &api,
        &[
            "--client-ca-file",
            &ca,
            "--client-names",
            "kube-apiserver,kube-scheduler",
        ],
    );
    let port = webhook.port;

    let scheduler = callers.client("kube-scheduler");
    let (status, _) = filter_from(&pki, port, peer(1), Some(&scheduler)).expect("answered");
    assert_eq!(status, 200);

    let stranger = Ca::new("another CA").client("kube-scheduler");
    let refused: [(&str, Option<&Pair>); 2] =
        [("no certificate", None), ("another CA's", Some(&stranger))];
    for (what, identity) in refused {
        let outcome = filter_from(&pki, port, peer(1), identity);
        assert!(outcome.is_err(), "{what}: answered {outcome:?}");
    }
    let unnamed = callers.client("prometheus");
    let outcome = filter_from(&pki, port, peer(1), Some(&unnamed));
    assert!(outcome.is_err(), "a name not allowed: answered {outcome:?}");

    let deadline = Instant::now() + Duration::from_secs(5);
    let failures = |reason: &str| {
        let series =
            format!("hugepage_agent_webhook_tls_handshake_failures_total{{reason=\"{reason}\"}}");
        sample(&metrics(plain), &series).unwrap_or(0.0)
    };
    while failures("name_not_allowed") < 1.0 || failures("no_certificate") < 1.0 {
        assert!(Instant::now() < deadline, "{}", metrics(plain));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(failures("untrusted") >= 1.0, "{}", metrics(plain));

    // The plain listener: probes and metrics, nothing of the webhook's calls.
    assert_eq!(http(plain, "GET", "/healthz", None, "").0, 200);
    let body = args(pod(None), &[]).to_string();
    let (status, _) = http(
        plain,
        "POST",
        "/scheduler/filter",
        Some("application/json"),
        &body,
    );
    assert_eq!(status, 404);
}

#[test]
fn one_peer_s_silent_connections_leave_another_peer_answered_within_a_second() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let (webhook, plain) = webhook(&pki, &api, &[]);
    let port = webhook.port;
    let (_, floor) = filter_from(&pki, port, peer(2), None).expect("answered unloaded");

    // As many as the webhook's --max-connections: each completes its handshake (or is
    // refused at accept) and sends nothing.
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    let silent: Vec<Connection> = (0..256)
        .filter_map(|_| {
            let tcp = TcpStream::connect(("127.0.0.1", port)).ok()?;
            Connection::over(tcp, config.clone(), name()).ok()
        })
        .collect();
    assert!(!silent.is_empty(), "no silent connection was made");
    let (status, took) = filter_from(&pki, port, peer(2), None).expect("answered");
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(1),
        "answered after {took:?} (unloaded: {floor:?})"
    );
    let text = metrics(plain);
    let series = "hugepage_agent_webhook_http_limited_total{listener=\"webhook\",limit=\"max_connections_per_peer\"}";
    let cut = sample(&text, series).unwrap_or(0.0);
    assert!(cut >= 1.0, "{series} = {cut} in\n{text}");
    drop(silent);
}

#[test]
fn stalled_handshakes_hold_no_served_connection_s_place_and_end_at_their_time_out() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let (webhook, plain) = webhook(
        &pki,
        &api,
        &["--max-connections", "4", "--handshake-timeout", "2s"],
    );
    let port = webhook.port;
    let stalled: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    let (status, took) = filter_from(&pki, port, peer(3), None).expect("answered");
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    for mut tcp in stalled {
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let started = Instant::now();
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest);
        assert!(started.elapsed() < Duration::from_secs(5), "not closed");
    }
    let series = "hugepage_agent_webhook_tls_handshake_failures_total{reason=\"timeout\"}";
    let text = metrics(plain);
    assert_eq!(sample(&text, series), Some(40.0), "{text}");
}

#[test]
fn an_http2_connection_with_no_stream_open_is_closed_after_the_idle_time_out() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let (webhook, plain) = webhook(&pki, &api, &["--http2-idle-timeout", "1s"]);
    let mut config = (*mtls::client_config(&[&pki.webhook], None, Versions::Any)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let at = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, webhook.port));
    let mut h2 = Https::connect(at, std::sync::Arc::new(config), WEBHOOK_NAME);
    assert_eq!(h2.alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(h2.request("GET", "/healthz", &[], "").0, 200);
    let series = "hugepage_agent_webhook_http_limited_total{listener=\"webhook\",limit=\"idle\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while sample(&metrics(plain), series).unwrap_or(0.0) < 1.0 {
        assert!(Instant::now() < deadline, "{}", metrics(plain));
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(h2);
}

/// `hugepage_agent_webhook_http_peers_filtered{listener="webhook"}` reaches `n` within 5 s.
fn until_filtered(plain: u16, n: f64) {
    let series = "hugepage_agent_webhook_http_peers_filtered{listener=\"webhook\"}";
    let deadline = Instant::now() + Duration::from_secs(5);
    while sample(&metrics(plain), series) != Some(n) {
        assert!(
            Instant::now() < deadline,
            "{series} never {n}: {}",
            metrics(plain)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_peer_hammering_at_its_limit_has_its_new_connections_dropped_by_the_kernel_and_keeps_its_own() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let (webhook, plain) = webhook(
        &pki,
        &api,
        &[
            "--max-connections-per-peer",
            "3",
            "--handshake-timeout",
            "30s",
        ],
    );
    let port = webhook.port;
    until_filtered(plain, 0.0);
    let config = mtls::client_config(&[&pki.webhook], None, Versions::Any);
    // Peer .7: one connection served (kept alive), two that never handshake: its three.
    let mut served = Connection::open_from(peer(7), port, config.clone(), name()).expect("served");
    assert_eq!(
        served
            .request("GET", "/healthz", None, "")
            .expect("answered")
            .status,
        200
    );
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| mtls::connect_from(peer(7), port).expect("connect"))
        .collect();
    // Reaching its limit is not enough: a few more tries are refused at accept, as before.
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..3 {
        let _ = mtls::connect_from_within(peer(7), port, Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(600));
    until_filtered(plain, 0.0);
    // Trying on and on is: filtered within a quarter of a second.
    for _ in 0..40 {
        let _ = mtls::connect_from_within(peer(7), port, Duration::from_millis(100));
    }
    until_filtered(plain, 1.0);
    let refused = "hugepage_agent_webhook_http_limited_total{listener=\"webhook\",limit=\"max_connections_per_peer\"}";
    let before = sample(&metrics(plain), refused).unwrap_or(0.0);
    // Its next connection never completes: its SYNs (the first and the one retried after 1 s)
    // are dropped before the accept queue; refused at accept, it would connect, then be reset.
    let outcome = mtls::connect_from_within(peer(7), port, Duration::from_millis(1500));
    assert!(
        outcome
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut),
        "{outcome:?}"
    );
    assert_eq!(
        sample(&metrics(plain), refused).unwrap_or(0.0),
        before,
        "nothing reached the accept"
    );
    // The connection it has is served on; another peer connects at once.
    assert_eq!(
        served
            .request("GET", "/healthz", None, "")
            .expect("answered")
            .status,
        200
    );
    let (status, took) = filter_from(&pki, port, peer(8), None).expect("answered");
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "answered after {took:?}");
    // Below its limit again, it connects and is served.
    drop(stalled);
    until_filtered(plain, 0.0);
    let (status, _) = filter_from(&pki, port, peer(7), None).expect("answered again");
    assert_eq!(status, 200);
}
