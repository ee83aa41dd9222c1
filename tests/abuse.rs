//! Clients that misbehave do not hurt a well-behaved one: the real agent (`run`, over a host
//! tree, `--ebpf off`, plain HTTP on loopback) and the real webhook (HTTPS, HTTP/2 by ALPN), with
//! short limits so that each acts within seconds. Each test runs one abuse from other threads
//! while a well-behaved client, on one connection kept alive as the webhook's pool keeps its
//! own, asks `POST /v1/admit?dryRun=true` (the webhook: its admission review) every 100 ms and
//! gets its answer every time; then checks that the limit did what it says and counted it in
//! `/metrics` (read on the well-behaved connection: a new one may be over the limit).

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::Command,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent,
    abusers::{self, KeptAlive, SlowBody},
    agent_bin,
    apiserver::StandInApiServer,
    cluster::{self, Pki, WEBHOOK_NAME},
    https::Https,
    mtls::{self, Versions},
};
use serde_json::Value;

/// What the well-behaved client asks: a dry run of one 2 MiB page on NUMA node 0.
const ADMIT: &str =
    r#"{"containers":[{"name":"a","resources":{"hugepages-2Mi":"2Mi"}}],"numaNodes":[0]}"#;
const ADMIT_PATH: &str = "/v1/admit?dryRun=true";
/// How often the well-behaved client asks (well within every time-out of these tests).
const EVERY: Duration = Duration::from_millis(100);

/// The agent over a host tree with `flags` (the limits under test).
fn agent(flags: &[&str]) -> (tempfile::TempDir, Agent) {
    let tree = cluster::host_tree(2048);
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree.path())
        .args(["--ebpf", "off", "--topology-policy", "single-numa-node"])
        .args(["--memory-manager-policy", "Static"])
        .args(flags);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    (tree, agent)
}

fn addr(agent: &Agent) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, agent.port))
}

/// Runs `abuse` on another thread while the well-behaved `client` admits every [`EVERY`];
/// every admission must be answered 200, and at least one must be asked while the abuse runs.
/// What `abuse` returned.
fn while_admitting<T: Send + 'static>(
    client: &mut KeptAlive,
    abuse: impl FnOnce() -> T + Send + 'static,
) -> T {
    // A panic of the abuse ends its thread too: the loop stops, and the join reports it.
    let abuser = thread::spawn(abuse);
    let mut asked = 0;
    while !abuser.is_finished() {
        let (status, answer) = client
            .request("POST", ADMIT_PATH, ADMIT)
            .expect("the well-behaved client is answered while the abuse runs");
        assert_eq!(status, 200, "{answer}");
        let verdict: Value = serde_json::from_str(&answer).expect("a verdict");
        assert_eq!(verdict["allowed"], true, "{verdict}");
        asked += 1;
        thread::sleep(EVERY);
    }
    assert!(asked > 0, "no admission was asked while the abuse ran");
    abuser.join().expect("the abuse thread")
}

/// `hugepage_agent_http_limited_total{listener="api",limit}` read over `client`.
fn limited(client: &mut KeptAlive, limit: &str) -> f64 {
    let (status, text) = client.request("GET", "/metrics", "").expect("metrics");
    assert_eq!(status, 200, "{text}");
    let series =
        format!("hugepage_agent_http_limited_total{{listener=\"api\",limit=\"{limit}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or_else(|| panic!("{series} in\n{text}"))
}

#[test]
fn slow_heads_are_closed_after_the_header_timeout_while_admissions_are_answered() {
    let (_tree, agent) = agent(&["--header-read-timeout", "1s"]);
    let at = addr(&agent);
    let mut client = KeptAlive::connect(at).expect("connect");
    let took = while_admitting(&mut client, move || {
        let mut slow: Vec<_> = (0..50)
            .map(|_| abusers::slow_head(at).expect("connect"))
            .collect();
        slow.iter_mut()
            .map(|s| {
                // One byte more of the head every 200 ms: it is arriving, but never complete.
                let drip = Some(Duration::from_millis(200));
                let mut answer = Vec::new();
                let took = abusers::closed(s, drip, Duration::from_secs(20), &mut answer);
                assert!(
                    answer.is_empty() || answer.starts_with(b"HTTP/1.1 408"),
                    "{answer:?}"
                );
                took
            })
            .collect::<Vec<_>>()
    });
    assert!(
        took.iter().all(Option::is_some),
        "every slow head was closed: {took:?}"
    );
    assert!(limited(&mut client, "header_timeout") >= 50.0);
}

#[test]
fn an_idle_connection_is_closed_after_the_header_timeout_new_or_after_an_answer() {
    let (_tree, agent) = agent(&["--header-read-timeout", "1s"]);
    let at = addr(&agent);
    let mut client = KeptAlive::connect(at).expect("connect");
    let (new, answered) = while_admitting(&mut client, move || {
        let mut silent = abusers::silent(at).expect("connect");
        let mut answer = Vec::new();
        let new = abusers::closed(&mut silent, None, Duration::from_secs(20), &mut answer);
        let mut once = KeptAlive::connect(at).expect("connect");
        let (status, _) = once.request("GET", "/healthz", "").expect("answered");
        assert_eq!(status, 200);
        let mut stream = once.into_stream();
        let answered = abusers::closed(&mut stream, None, Duration::from_secs(20), &mut answer);
        (new, answered)
    });
    let new = new.expect("a silent new connection is closed");
    let answered = answered.expect("a connection idle after its answer is closed");
    for idle in [new, answered] {
        assert!(idle >= Duration::from_millis(900), "closed after {idle:?}");
    }
    assert!(limited(&mut client, "header_timeout") >= 2.0);
}

#[test]
fn a_connection_over_the_limit_is_refused_and_counted_and_the_held_ones_still_answer() {
    let (_tree, agent) = agent(&["--max-connections", "8", "--header-read-timeout", "60s"]);
    let at = addr(&agent);
    let mut client = KeptAlive::connect(at).expect("connect");
    // Holds the seven other places; each answers once so that it is surely counted open.
    let mut held: Vec<_> = (0..7)
        .map(|_| {
            let mut c = KeptAlive::connect(at).expect("connect");
            assert_eq!(c.request("GET", "/healthz", "").expect("answered").0, 200);
            c
        })
        .collect();
    let refused = while_admitting(&mut client, move || {
        (0..20)
            .map(|_| {
                let mut over = KeptAlive::connect(at).expect("the kernel accepts it");
                over.request("GET", "/healthz", "")
            })
            .collect::<Vec<_>>()
    });
    for answer in &refused {
        assert!(answer.is_err(), "answered over the limit: {answer:?}");
    }
    assert!(limited(&mut client, "max_connections") >= 20.0);
    for c in &mut held {
        assert_eq!(c.request("GET", "/healthz", "").expect("answered").0, 200);
    }
    held.clear();
    // Their places come back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = KeptAlive::connect(at).and_then(|mut c| c.request("GET", "/healthz", ""));
        if matches!(again, Ok((200, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "no place came back: {again:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_oversized_head_is_431_and_garbage_400_each_closed_and_counted() {
    let (_tree, agent) = agent(&[]);
    let at = addr(&agent);
    let mut client = KeptAlive::connect(at).expect("connect");
    let answers = while_admitting(&mut client, move || {
        (0..20)
            .map(|_| {
                let big = abusers::oversized_head(at, 70 << 10).expect("an answer");
                let bad = abusers::garbage(at).expect("an answer");
                (big, bad)
            })
            .collect::<Vec<_>>()
    });
    for (big, bad) in &answers {
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
        assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    }
    assert!(limited(&mut client, "head_too_large") >= 20.0);
    assert!(limited(&mut client, "malformed") >= 20.0);
}

#[test]
fn a_body_sent_a_byte_at_a_time_is_cut_with_408_and_its_connection_closed() {
    let (_tree, agent) = agent(&["--body-read-timeout", "1s"]);
    let at = addr(&agent);
    let mut client = KeptAlive::connect(at).expect("connect");
    let cut = while_admitting(&mut client, move || {
        (0..5)
            .map(|_| {
                let mut slow = SlowBody::start(at, 4096).expect("connect");
                slow.drip(Duration::from_millis(100), Duration::from_secs(20))
                    .expect("an answer")
            })
            .collect::<Vec<_>>()
    });
    for (status, took, closed) in &cut {
        assert_eq!(*status, 408);
        assert!(*took >= Duration::from_millis(900), "cut after {took:?}");
        assert!(closed, "the connection is closed after the 408");
    }
    assert!(limited(&mut client, "body_timeout") >= 5.0);
}

/// An HTTP/2 connection that resets streams in a loop is ended with GOAWAY
/// `ENHANCE_YOUR_CALM`, and its peer's new connections are refused for `--abuse-backoff` (its
/// SYNs dropped by the listener's socket filter, or reset at accept before the filter is on),
/// twice as long after a second abuse; the well-behaved client's kept-alive connection, from
/// the same address, is answered throughout.
#[test]
fn http2_streams_reset_in_a_loop_end_in_goaway_and_the_peer_waits_longer_each_time() {
    const BACKOFF: Duration = Duration::from_millis(600);
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let webhook = cluster::webhook(
        &agent_bin(),
        &pki,
        &api,
        1,
        "ignore",
        "2s",
        &[
            ("HUGEPAGE_AGENT_HTTP2_MAX_PENDING_RESET_STREAMS", "20"),
            ("HUGEPAGE_AGENT_ABUSE_BACKOFF", "600ms"),
        ],
    );
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, webhook.port));
    let mut config = (*mtls::client_config(&[&pki.webhook], None, Versions::Any)).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let h2 = Arc::new(config);
    let mut client = Https::connect(at, h2.clone(), WEBHOOK_NAME);
    assert_eq!(client.alpn.as_deref(), Some(&b"h2"[..]));
    // The abuser's own kept-alive connection, opened before any abuse, on which it waits for the
    // webhook to have counted each GOAWAY before it tries again (its new connections would be
    // refused, all being from 127.0.0.1).
    let mut watcher = Https::connect(at, h2.clone(), WEBHOOK_NAME);
    let abuser = thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let abuse = || {
            runtime.block_on(abusers::reset_loop(
                at,
                h2.clone(),
                WEBHOOK_NAME,
                "/admission/validate",
                100_000,
            ))
        };
        // Waits until the webhook's metrics, read on the watcher's connection, show `holds`.
        let mut until = |what: &str, holds: &dyn Fn(&str) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, text) = watcher.request("GET", "/metrics", &[], "");
                assert_eq!(status, 200, "{text}");
                if holds(&text) {
                    return;
                }
                assert!(Instant::now() < deadline, "{what}: never:\n{text}");
                thread::sleep(Duration::from_millis(5));
            }
        };
        let abused = |n: f64| move |text: &str| webhook_limited(text, "http2_abuse") >= n;
        let started = Instant::now();
        let mut ended = Vec::new();
        let mut refused = 0;
        // The first abuse, then at once again: refused.
        ended.push(abuse().expect("the first reset loop"));
        until("the first abuse counted", &abused(1.0));
        let first = Instant::now();
        let filtered = "hugepage_agent_webhook_http_peers_filtered{listener=\"webhook\"} 1";
        until("the peer filtered", &|text| {
            text.lines().any(|l| l == filtered)
        });
        abuse().expect_err("a new connection at once after the GOAWAY");
        refused += 1;
        // After the wait (and before it has passed once more), served, and abusing again: now
        // it waits twice as long. The refused connect above may have taken its time-out.
        thread::sleep((first + BACKOFF + BACKOFF / 4).saturating_duration_since(Instant::now()));
        ended.push(abuse().expect("the second reset loop, after the wait"));
        until("the second abuse counted", &abused(2.0));
        thread::sleep(BACKOFF + BACKOFF / 4);
        abuse().expect_err("a new connection within the doubled wait");
        refused += 1;
        thread::sleep(BACKOFF);
        ended.push(abuse().expect("the third reset loop, after the doubled wait"));
        (ended, refused, started..Instant::now())
    });
    let mut asked = 0;
    let mut answered = Vec::new();
    while !abuser.is_finished() {
        let body = abusers::plain_pod_review(&format!("review-{asked}")).to_string();
        let (status, answer) = client.request("POST", "/admission/validate", &[], &body);
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).expect("an AdmissionReview");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        answered.push(Instant::now());
        asked += 1;
        thread::sleep(EVERY);
    }
    let (ended, refused, abusing) = abuser.join().expect("the abuse thread");
    // Answered throughout: never two seconds without an answer while the abuse went on (it
    // lasts more than 2 s; the refused windows 0.6 and 1.2 s).
    let mut last = abusing.start;
    for at in answered.iter().filter(|at| abusing.contains(*at)) {
        assert!(
            *at - last < Duration::from_secs(2),
            "no answer for {:?} while the abuse went on ({asked} asked)",
            *at - last
        );
        last = *at;
    }
    assert!(
        abusing.end - last < Duration::from_secs(2),
        "no answer in the abuse's last {:?}",
        abusing.end - last
    );
    for ended in ended {
        let err = ended.ended.unwrap_or_else(|| {
            panic!(
                "{} streams reset and the connection still open",
                ended.streams
            )
        });
        // The GOAWAY, or the socket the server closed after it, when the client was writing
        // more resets (a broken pipe); the server's count below says why it ended.
        let calm = err.is_go_away()
            && err.is_remote()
            && err.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM);
        assert!(calm || err.is_io(), "{err}");
    }
    let (status, text) = client.request("GET", "/metrics", &[], "");
    assert_eq!(status, 200);
    assert_eq!(
        webhook_limited(&text, "http2_abuse"),
        3.0,
        "one per reset loop"
    );
    // The refused connections the filter dropped never reached the accept.
    assert!(
        webhook_limited(&text, "abuse_backoff") <= f64::from(refused),
        "at most one per refused"
    );
}

/// The webhook's count of a limit in its `/metrics` text.
fn webhook_limited(text: &str, limit: &str) -> f64 {
    let series = format!(
        "hugepage_agent_webhook_http_limited_total{{listener=\"webhook\",limit=\"{limit}\"}} "
    );
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str())?.parse().ok())
        .unwrap_or_else(|| panic!("{series} in\n{text}"))
}
