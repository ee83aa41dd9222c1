use std::time::Duration;

use super::*;

const HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n";

fn reader(bytes: &'static [u8]) -> Reader<&'static [u8]> {
    Reader::new(bytes, Duration::from_secs(1))
}

#[tokio::test]
async fn lines_are_read_across_chunk_boundaries_and_the_last_chunk_ends_the_stream() {
    // `{"a":1}\n` split over two chunks, then `{"b":2}\n{"c":3}\n` in one, then the end.
    let text = format!(
        "{HEAD}3\r\n{{\"a\r\n5\r\n\":1}}\n\r\n10\r\n{{\"b\":2}}\n{{\"c\":3}}\n\r\n0\r\n\r\n"
    );
    let bytes: &'static [u8] = Box::leak(text.into_bytes().into_boxed_slice());
    let mut r = reader(bytes);
    r.head().await.expect("a stream's head");
    assert_eq!(r.line().await.expect("a"), br#"{"a":1}"#);
    assert_eq!(r.line().await.expect("b"), br#"{"b":2}"#);
    assert_eq!(r.line().await.expect("c"), br#"{"c":3}"#);
    assert!(matches!(r.line().await, Err(StreamError::Closed)));
}

#[tokio::test]
async fn an_answer_that_is_not_a_chunked_200_is_refused_naming_why() {
    let mut refused =
        reader(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n");
    assert!(matches!(
        refused.head().await,
        Err(StreamError::Status(503))
    ));
    let mut whole = reader(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
    let Err(StreamError::Head(why)) = whole.head().await else {
        panic!("a body with a length is not a stream");
    };
    assert_eq!(why, "the body is not chunked");
    let mut garbled = reader(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n");
    garbled.head().await.expect("the head");
    assert!(matches!(garbled.line().await, Err(StreamError::Chunk(_))));
    let mut cut = reader(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\"");
    cut.head().await.expect("the head");
    assert!(matches!(cut.line().await, Err(StreamError::Closed)));
}

#[tokio::test]
async fn a_stream_that_says_nothing_within_the_bound_ends_as_silent() {
    let (ours, mut theirs) = tokio::io::duplex(1024);
    theirs.write_all(HEAD.as_bytes()).await.expect("the head");
    let mut r = Reader::new(ours, Duration::from_millis(50));
    r.head().await.expect("the head");
    assert!(matches!(r.line().await, Err(StreamError::Silent(_))));
}

#[tokio::test]
async fn an_event_over_the_limit_ends_the_stream() {
    let (ours, mut theirs) = tokio::io::duplex(64 << 10);
    let writer = tokio::spawn(async move {
        theirs.write_all(HEAD.as_bytes()).await.expect("the head");
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..5 {
            let size = format!("{:x}\r\n", chunk.len());
            if theirs.write_all(size.as_bytes()).await.is_err()
                || theirs.write_all(&chunk).await.is_err()
                || theirs.write_all(b"\r\n").await.is_err()
            {
                return;
            }
        }
    });
    let mut r = Reader::new(ours, Duration::from_secs(5));
    r.head().await.expect("the head");
    assert!(matches!(r.line().await, Err(StreamError::TooLarge)));
    drop(r);
    writer.await.expect("the writer");
}

#[test]
fn first_connections_spread_over_the_whole_window() {
    let draws: Vec<f64> = (0..1000)
        .map(|i| drawn(&format!("node-{i}"), u32::MAX))
        .collect();
    assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
    let early = draws.iter().filter(|d| **d < 0.25).count();
    let late = draws.iter().filter(|d| **d >= 0.75).count();
    assert!(
        early > 150 && late > 150,
        "{early} early, {late} late of 1000"
    );
}

#[test]
fn waits_are_drawn_between_half_and_all_of_the_most() {
    let most = Duration::from_secs(8);
    let waits: Vec<Duration> = (0..200).map(|i| jittered("node-a", i, most)).collect();
    assert!(
        waits.iter().all(|w| *w >= most / 2 && *w <= most),
        "{waits:?}"
    );
    let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
    assert!(
        distinct.len() > 150,
        "drawn at random, not one value: {}",
        distinct.len()
    );
}

#[test]
fn an_events_agent_version_is_read_and_an_event_without_one_has_none() {
    let named: Event = serde_json::from_str(
        r#"{"type":"BOOKMARK","epoch":"e","generation":3,"agentVersion":"0.2.0"}"#,
    )
    .expect("an event");
    assert_eq!(named.agent_version.as_deref(), Some("0.2.0"));
    let older: Event = serde_json::from_str(r#"{"type":"BOOKMARK","epoch":"e","generation":3}"#)
        .expect("an event");
    assert_eq!(older.agent_version, None);
}

/// A stand-in agent at `config` that answers the first request of each connection with a
/// stream of bookmarks, one every 20 ms, for as long as the connection lasts.
async fn bookmarking(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if tls.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                if tls.write_all(HEAD.as_bytes()).await.is_err() {
                    return;
                }
                let event = "{\"type\":\"BOOKMARK\",\"epoch\":\"e\",\"generation\":1}\n";
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                loop {
                    if tls.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    let _ = tls.flush().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn under_per_pod_a_stream_ends_at_its_next_event_once_the_node_has_another_agent_pod() {
    use rcgen::ExtendedKeyUsagePurpose;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

    use crate::{
        tls::test_pki::{ca, leaf, named_leaf, server_config},
        webhook::{agent_pods::AgentPods, identity::POD_DOMAIN},
    };
    let (ca_pem, issuer) = ca("agents' CA");
    let pod_a = format!("agent-a.hugepage-agent.{POD_DOMAIN}");
    let (cert, key) = named_leaf(&issuer, &[&pod_a]);
    let addr = bookmarking(Arc::new(server_config(&cert, &key))).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("the CA"))
        .expect("a CA");
    let (client_cert, client_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ClientAuth);
    let client = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(client_cert.as_bytes()).expect("cert")],
            PrivateKeyDer::from_pem_slice(client_key.as_bytes()).expect("key"),
        )
        .expect("a client config");
    let pods = AgentPods::placed("hugepage-agent", &[("agent-a", "node-a")]);
    let names = Names::PerPod(pods.clone());
    let table = Arc::new(Table::new(Duration::from_secs(5)));
    let name = names.name("node-a").expect("agent-a's name");
    let following = tokio::spawn({
        let (table, names, client) = (table.clone(), names.clone(), Arc::new(client));
        async move { stream("node-a", (name, addr), &table, client, &names).await }
    });
    // Bookmarks flow, and the stream goes on while agent-a is node-a's agent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!following.is_finished(), "the stream ended on its own");
    // A rollout: the API server now has agent-b on node-a. agent-a's connection still answers.
    pods.replace(&[("agent-b", "node-a")]);
    let ended = tokio::time::timeout(Duration::from_secs(2), following)
        .await
        .expect("the stream ended within its next events")
        .expect("the task");
    let StreamError::Renamed(now) = ended else {
        panic!("ended otherwise: {ended}");
    };
    assert_eq!(now, format!("agent-b.hugepage-agent.{POD_DOMAIN}"));
}
