use std::{
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{Request, Response, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::ServerConfig;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::tls::{
    SERVER_NAME,
    test_pki::{ca, kubelet_leaf, leaf, named_leaf, server_config},
};
use crate::webhook::agent_tls::AgentCertificates;
use crate::webhook::{agent_pods::AgentPods, identity::POD_DOMAIN, pool::IDLE_TIMEOUT};

/// The client's files (a CA, a client certificate of it) and an agent's server config.
fn pki() -> (tempfile::TempDir, ClientFiles, Arc<ServerConfig>) {
    pki_for(&[SERVER_NAME])
}

/// As [`pki`], the agent's certificate for `names`.
fn pki_for(names: &[&str]) -> (tempfile::TempDir, ClientFiles, Arc<ServerConfig>) {
    pki_with(|issuer| named_leaf(issuer, names), AgentCertificates::Named)
}

/// As [`pki`], the agent's certificate (PEM certificate and key) made by `server` from the CA,
/// and the client checking agents' certificates as `agents` says.
fn pki_with(
    server: impl FnOnce(&rcgen::Issuer<'static, rcgen::KeyPair>) -> (String, String),
    agents: AgentCertificates,
) -> (tempfile::TempDir, ClientFiles, Arc<ServerConfig>) {
    let (ca_pem, issuer) = ca("agents' CA");
    let (server_cert, server_key) = server(&issuer);
    let (client_cert, client_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ClientAuth);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = ClientFiles {
        ca: dir.path().join("ca.crt"),
        cert: dir.path().join("client.crt"),
        key: dir.path().join("client.key"),
        agents,
    };
    for (path, pem) in [
        (&files.ca, &ca_pem),
        (&files.cert, &client_cert),
        (&files.key, &client_key),
    ] {
        std::fs::write(path, pem).expect("write");
    }
    (
        dir,
        files,
        Arc::new(server_config(&server_cert, &server_key)),
    )
}

/// A stand-in agent answering every request with a verdict; it counts the connections it
/// accepted, keeps the request targets, answers each `delay` after its request, and drops each
/// connection `linger` after accepting it.
struct Stand {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
}

async fn stand(config: Arc<ServerConfig>, linger: Duration, delay: Duration) -> Stand {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("its address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let targets = Arc::new(Mutex::new(Vec::new()));
    let (count, seen) = (accepted.clone(), targets.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (acceptor, seen) = (TlsAcceptor::from(config.clone()), seen.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    if let Ok(mut seen) = seen.lock() {
                        seen.push(request.uri().to_string());
                    }
                    let verdict = Bytes::from_static(br#"{"allowed":true,"numaNodes":[0]}"#);
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(verdict)))
                    }
                });
                let connection = http1::Builder::new().serve_connection(TokioIo::new(tls), service);
                // At `linger`, the connection is dropped: its socket closes, unannounced.
                let _ = tokio::time::timeout(linger, connection).await;
            });
        }
    });
    Stand {
        addr,
        accepted,
        targets,
    }
}

fn client(files: &ClientFiles) -> Client {
    client_as(files, Names::Shared)
}

fn client_as(files: &ClientFiles, identity: Names) -> Client {
    let (client, _reloader) =
        Client::new(files, 9820, identity, Arc::default()).expect("valid files");
    client
}

const POD: &[u8] = br#"{"metadata":{"name":"p"}}"#;

#[tokio::test]
async fn dry_runs_and_a_real_admission_differ_by_the_query_only_and_share_one_connection() {
    let (_dir, files, server) = pki();
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    let client = client(&files);
    for _ in 0..2 {
        let reply = client
            .admit("a", agent.addr, Bytes::from_static(POD), true)
            .await
            .expect("a verdict");
        assert!(reply.allowed);
    }
    let reply = client
        .admit("a", agent.addr, Bytes::from_static(POD), false)
        .await
        .expect("a verdict");
    assert_eq!(reply.numa_nodes, [0]);
    let targets = agent.targets.lock().expect("the targets").clone();
    assert_eq!(
        targets,
        [
            "/v1/admit?dryRun=true",
            "/v1/admit?dryRun=true",
            "/v1/admit"
        ]
    );
    assert_eq!(agent.accepted.load(Ordering::SeqCst), 1, "one connection");
}

#[tokio::test]
async fn a_connection_the_agent_closed_is_dropped_and_the_next_call_dials_anew() {
    let (_dir, files, server) = pki();
    let agent = stand(server, Duration::from_millis(200), Duration::ZERO).await;
    let client = client(&files);
    for round in 1..=3 {
        let reply = client
            .admit("a", agent.addr, Bytes::from_static(POD), true)
            .await;
        assert!(reply.is_ok_and(|r| r.allowed), "round {round}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert_eq!(agent.accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_agent_not_listening_is_an_error_naming_it_and_saying_so() {
    let (_dir, files, _) = pki();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("its address");
    drop(closed);
    let err = client(&files)
        .admit("a", addr, Bytes::from_static(POD), true)
        .await
        .expect_err("nobody listens");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("agent at {addr}: cannot connect: ")),
        "{text}"
    );
}

/// A stand-in agent that answers the first request on each connection, and on its second
/// request reads it whole and closes the connection without a byte of answer (as an agent does
/// that closes an idle connection just as a request is sent); it counts connections.
async fn closes_on_second_request(config: Arc<ServerConfig>) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("its address");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = TlsAcceptor::from(config.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 8192];
                let verdict = br#"{"allowed":true,"numaNodes":[1]}"#;
                for answered in [true, false] {
                    // The request ends with the pod's JSON, which ends with '}'.
                    let mut got = Vec::new();
                    while !got.ends_with(b"}") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    if answered {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                            verdict.len()
                        );
                        let _ = tls.write_all(head.as_bytes()).await;
                        let _ = tls.write_all(verdict).await;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_request_unanswered_on_a_reused_connection_is_sent_once_more_on_a_new_one() {
    let (_dir, files, server) = pki();
    let (addr, accepted) = closes_on_second_request(server).await;
    let client = client(&files);
    for call in 1..=3 {
        let reply = client
            .admit("a", addr, Bytes::from_static(POD), call == 3)
            .await;
        assert!(
            reply.as_ref().is_ok_and(|r| r.numa_nodes == [1]),
            "call {call}: {reply:?}"
        );
    }
    // 1 on a new connection; 2 unanswered on it, then on a second; 3 unanswered on that, then
    // on a third.
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn idle_connections_are_closed_by_the_sweep_once_expired_and_not_before() {
    let (_dir, files, server) = pki();
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    let client = client(&files);
    let call = || client.admit("a", agent.addr, Bytes::from_static(POD), true);
    assert!(call().await.is_ok_and(|r| r.allowed));
    let parked = Instant::now();
    let pool = client.pool();
    assert_eq!(pool.idle.sweep(parked + IDLE_TIMEOUT / 2), 0);
    assert!(call().await.is_ok_and(|r| r.allowed));
    assert_eq!(agent.accepted.load(Ordering::SeqCst), 1, "reused");
    assert_eq!(pool.idle.sweep(Instant::now() + IDLE_TIMEOUT), 1);
    assert!(call().await.is_ok_and(|r| r.allowed));
    assert_eq!(agent.accepted.load(Ordering::SeqCst), 2, "dialled anew");
}

#[tokio::test]
async fn a_call_past_the_deadline_finishes_in_the_background_and_its_connection_is_reused() {
    use crate::webhook::{
        ask::{Ask, Heard, ask_all},
        metrics::Metrics,
    };
    let (_dir, files, server) = pki();
    let agent = stand(server, Duration::from_secs(60), Duration::from_millis(300)).await;
    let client = client(&files);
    let metrics = Metrics::new(Arc::default());
    let body = Bytes::from_static(POD);
    let targets = [Ok(("a".to_owned(), agent.addr))];
    let ask = Ask { dry_run: true };
    let late = ask_all(
        &client,
        &body,
        &targets,
        ask,
        Duration::from_millis(50),
        &metrics,
    )
    .await;
    assert!(
        matches!(&late[..], [Heard::Silent(why)] if why.ends_with("no answer within 50ms")),
        "{late:?}"
    );
    // The late call is answered at 300 ms, and its connection parked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let heard = ask_all(
        &client,
        &body,
        &targets,
        ask,
        Duration::from_secs(2),
        &metrics,
    )
    .await;
    assert!(
        matches!(&heard[..], [Heard::Answer(reply)] if reply.allowed),
        "{heard:?}"
    );
    assert_eq!(agent.accepted.load(Ordering::SeqCst), 1, "one connection");
    assert_eq!(agent.targets.lock().expect("the targets").len(), 2);
}

#[tokio::test]
async fn per_node_verifies_the_node_dialled_and_never_pools_one_nodes_connection_for_another() {
    let node_a = format!("node-a.{SERVER_NAME}");
    let (_dir, files, server) = pki_for(&[SERVER_NAME, &node_a]);
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    let per_node = client_as(&files, Names::PerNode);
    let body = || Bytes::from_static(POD);
    let reply = per_node.admit("node-a", agent.addr, body(), true).await;
    assert!(reply.is_ok_and(|r| r.allowed), "node A's agent is node A");
    // Node A's connection is parked; node B's call at the same address dials and is refused.
    let err = per_node
        .admit("node-b", agent.addr, body(), true)
        .await
        .expect_err("node A's certificate does not name node B");
    let text = err.to_string();
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(text.contains("not valid for name"), "{text}");
    assert_eq!(
        agent.accepted.load(Ordering::SeqCst),
        2,
        "a second connection"
    );
    let shared = client_as(&files, Names::Shared);
    let reply = shared.admit("node-b", agent.addr, body(), true).await;
    assert!(
        reply.is_ok_and(|r| r.allowed),
        "shared: any agent of the CA"
    );
}

#[tokio::test]
async fn per_pod_verifies_the_pod_the_api_server_has_on_the_node_dialled() {
    let pod_a = format!("agent-a.hugepage-agent.{POD_DOMAIN}");
    let (_dir, files, server) = pki_for(&[SERVER_NAME, &pod_a]);
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    let pods = AgentPods::placed(
        "hugepage-agent",
        &[("agent-a", "node-a"), ("agent-b", "node-b")],
    );
    let per_pod = client_as(&files, Names::PerPod(pods));
    let body = || Bytes::from_static(POD);
    let reply = per_pod.admit("node-a", agent.addr, body(), true).await;
    assert!(reply.is_ok_and(|r| r.allowed), "node A's pod is agent-a");
    // The same key at node B's address: node B's agent is agent-b, which it does not name.
    let text = per_pod
        .admit("node-b", agent.addr, body(), true)
        .await
        .expect_err("agent-a's certificate does not name agent-b")
        .to_string();
    assert!(text.contains("not valid for name"), "{text}");
    // A node with no agent pod is not dialled at all.
    let before = agent.accepted.load(Ordering::SeqCst);
    let text = per_pod
        .admit("node-c", agent.addr, body(), true)
        .await
        .expect_err("no pod on node C")
        .to_string();
    assert!(
        text.contains("no agent pod in namespace hugepage-agent is on node node-c"),
        "{text}"
    );
    assert_eq!(agent.accepted.load(Ordering::SeqCst), before, "no dial");
}

#[tokio::test]
async fn kubelet_identity_takes_the_dialled_nodes_serving_certificate_and_no_other() {
    let serving = &[ExtendedKeyUsagePurpose::ServerAuth];
    let nodes = Some("system:nodes");
    let (_dir, files, server) = pki_with(
        |issuer| kubelet_leaf(issuer, "node-a", serving, nodes),
        AgentCertificates::Kubelet,
    );
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    let kubelet = client_as(&files, Names::Kubelet);
    let body = || Bytes::from_static(POD);
    let reply = kubelet.admit("node-a", agent.addr, body(), true).await;
    assert!(
        reply.is_ok_and(|r| r.allowed),
        "node A's kubelet certificate"
    );
    // Node A's key answering at node B's address.
    let text = kubelet
        .admit("node-b", agent.addr, body(), true)
        .await
        .expect_err("node A's certificate is not node B's")
        .to_string();
    assert!(text.contains("TLS handshake failed"), "{text}");
    assert!(
        text.contains("only valid for the subject O=system:nodes, CN=system:node:node-a"),
        "{text}"
    );
    assert!(text.contains("is CN=system:node:node-b"), "{text}");
    // The same certificate, checked by name: it carries no name of ours.
    let named = ClientFiles {
        agents: AgentCertificates::Named,
        ..files.clone()
    };
    let text = client_as(&named, Names::Shared)
        .admit("node-a", agent.addr, body(), true)
        .await
        .expect_err("a kubelet's certificate is not node.hugepage-agent.internal")
        .to_string();
    assert!(text.contains("not valid for name"), "{text}");
    // The kubelet's client certificate has node A's subject but is not a server's.
    let client_auth = &[ExtendedKeyUsagePurpose::ClientAuth];
    let text = kubelet_refused(|issuer| kubelet_leaf(issuer, "node-a", client_auth, nodes)).await;
    assert!(text.contains("TLS handshake failed"), "{text}");
    // Another organization under node A's common name.
    let masters = Some("system:masters");
    let text = kubelet_refused(|issuer| kubelet_leaf(issuer, "node-a", serving, masters)).await;
    assert!(text.contains("O=system:masters"), "{text}");
}

/// What node A's call says when its agent serves the certificate `server` makes, checked as
/// its kubelet's serving certificate (it must be refused).
async fn kubelet_refused(
    server: impl FnOnce(&rcgen::Issuer<'static, rcgen::KeyPair>) -> (String, String),
) -> String {
    let (_dir, files, server) = pki_with(server, AgentCertificates::Kubelet);
    let agent = stand(server, Duration::from_secs(60), Duration::ZERO).await;
    client_as(&files, Names::Kubelet)
        .admit("node-a", agent.addr, Bytes::from_static(POD), true)
        .await
        .expect_err("not node A's kubelet serving certificate")
        .to_string()
}
