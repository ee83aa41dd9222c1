use std::{
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper::{Response, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::*;
use crate::tls::test_pki::{ca, leaf};

/// The client's files (a CA, a client certificate of it) and an agent's server config.
fn pki() -> (tempfile::TempDir, ClientFiles, Arc<ServerConfig>) {
    let (ca_pem, issuer) = ca("agents' CA");
    let (server_cert, server_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = leaf(&issuer, ExtendedKeyUsagePurpose::ClientAuth);
    let dir = tempfile::tempdir().expect("tempdir");
    let files = ClientFiles {
        ca: dir.path().join("ca.crt"),
        cert: dir.path().join("client.crt"),
        key: dir.path().join("client.key"),
    };
    for (path, pem) in [
        (&files.ca, &ca_pem),
        (&files.cert, &client_cert),
        (&files.key, &client_key),
    ] {
        std::fs::write(path, pem).expect("write");
    }
    let server = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(server_cert.as_bytes()).expect("cert PEM")],
            PrivateKeyDer::from_pem_slice(server_key.as_bytes()).expect("key PEM"),
        )
        .expect("a server config");
    (dir, files, Arc::new(server))
}

/// A stand-in agent answering every request with a verdict; it counts the connections it
/// accepted, keeps the request targets, and drops each connection `linger` after accepting it.
struct Stand {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
}

async fn stand(config: Arc<ServerConfig>, linger: Duration) -> Stand {
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
                    async move { Ok::<_, std::convert::Infallible>(Response::new(Full::new(verdict))) }
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
    let (client, _reloader) = Client::new(files, 9820, Arc::default()).expect("valid files");
    client
}

const POD: &[u8] = br#"{"metadata":{"name":"p"}}"#;

#[tokio::test]
async fn dry_runs_and_a_real_admission_differ_by_the_query_only_and_share_one_connection() {
    let (_dir, files, server) = pki();
    let agent = stand(server, Duration::from_secs(60)).await;
    let client = client(&files);
    for _ in 0..2 {
        let reply = client
            .admit(agent.addr, Bytes::from_static(POD), true)
            .await
            .expect("a verdict");
        assert!(reply.allowed);
    }
    let reply = client
        .admit(agent.addr, Bytes::from_static(POD), false)
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
    let agent = stand(server, Duration::from_millis(200)).await;
    let client = client(&files);
    for round in 1..=3 {
        let reply = client
            .admit(agent.addr, Bytes::from_static(POD), true)
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
        .admit(addr, Bytes::from_static(POD), true)
        .await
        .expect_err("nobody listens");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("agent at {addr}: cannot connect: ")),
        "{text}"
    );
}
