//! The client side of mTLS with the node agents (`--agent-ca-file`, `--agent-client-cert-file`,
//! `--agent-client-key-file`) and the one call made to them: `POST /v1/admit` (`?dryRun=true`).
//!
//! An agent is dialled at its node's `InternalIP` and verified by the CA and the fixed name
//! [`SERVER_NAME`] that every agent's certificate carries (see [`crate::tls`]); the webhook
//! presents its client certificate. Each call opens its own connection (HTTP/1.1); the files are
//! read once, at start-up. The extender asks for dry runs; the admission webhook for the real
//! admission, which reserves. An answer is read up to [`ANSWER_LIMIT`] bytes; anything but a
//! 200 with the verdict's JSON is an error naming the agent's address.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    Request, StatusCode,
    body::Bytes,
    header::{CONTENT_TYPE, HOST},
};
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{PrivateKeyDer, ServerName, pem::PemObject};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::tls::{SERVER_NAME, TlsError, certificates, provider};

/// The most an agent's answer may be.
pub const ANSWER_LIMIT: usize = 1 << 20;

const CA_FLAG: &str = "--agent-ca-file";
const CERT_FLAG: &str = "--agent-client-cert-file";
const KEY_FLAG: &str = "--agent-client-key-file";

/// The client's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CA the agents' server certificates chain to.
    pub ca: PathBuf,
    /// The webhook's client certificate (the leaf first) and its key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("agent at {addr}: cannot connect: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("agent at {addr}: TLS handshake failed: {source}")]
    Handshake {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
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

/// Dials agents on `port` with the client certificate.
#[derive(Clone)]
pub struct Client {
    connector: TlsConnector,
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
    /// Reads the files and builds the client; errors name the flag and file at fault.
    pub fn new(files: &ClientFiles, port: u16) -> Result<Client, TlsError> {
        Ok(Client {
            connector: TlsConnector::from(Arc::new(client_config(files)?)),
            port,
        })
    }

    /// The port agents listen on (`--agent-port`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `POST /v1/admit` with `body` (a `v1.Pod`) to the agent at `addr`: a dry run (no
    /// reservation) when `dry_run`, else the real admission, which reserves by the pod's UID.
    pub async fn admit(
        &self,
        addr: SocketAddr,
        body: Bytes,
        dry_run: bool,
    ) -> Result<Reply, CallError> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| CallError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(SERVER_NAME).map_err(|e| CallError::Http {
            addr,
            detail: e.to_string(),
        })?;
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|source| CallError::Handshake { addr, source })?;
        let http = |e: hyper::Error| CallError::Http {
            addr,
            detail: e.to_string(),
        };
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(http)?;
        tokio::spawn(connection);
        let path = if dry_run {
            "/v1/admit?dryRun=true"
        } else {
            "/v1/admit"
        };
        let request = Request::post(path)
            .header(HOST, SERVER_NAME)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| CallError::Http {
                addr,
                detail: e.to_string(),
            })?;
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        let bytes = Limited::new(response.into_body(), ANSWER_LIMIT)
            .collect()
            .await
            .map_err(|e| CallError::Http {
                addr,
                detail: format!("reading the answer: {e}"),
            })?
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

/// The `detail` of a problem document, else the body's start.
fn problem_detail(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("detail")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

/// The rustls client config: the agents' CA as the only trust anchor, TLS 1.3 and 1.2, the
/// client certificate presented, HTTP/1.1.
fn client_config(files: &ClientFiles) -> Result<ClientConfig, TlsError> {
    let file = |flag: &'static str, path: &PathBuf, detail: String| TlsError::File {
        flag,
        path: path.clone(),
        detail,
    };
    let read =
        |flag, path: &PathBuf| std::fs::read(path).map_err(|e| file(flag, path, e.to_string()));
    let mut roots = RootCertStore::empty();
    for ca in certificates(CA_FLAG, &files.ca, &read(CA_FLAG, &files.ca)?)? {
        roots.add(ca).map_err(|e| {
            file(
                CA_FLAG,
                &files.ca,
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    let chain = certificates(CERT_FLAG, &files.cert, &read(CERT_FLAG, &files.cert)?)?;
    let key = PrivateKeyDer::from_pem_slice(&read(KEY_FLAG, &files.key)?)
        .map_err(|e| file(KEY_FLAG, &files.key, format!("not a PEM private key: {e}")))?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            let detail = format!("not usable with {CERT_FLAG} {}: {e}", files.cert.display());
            file(KEY_FLAG, &files.key, detail)
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
