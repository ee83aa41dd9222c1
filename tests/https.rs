//! An HTTPS client on hyper for the tests: HTTP/2 or HTTP/1.1, whichever ALPN chose among the
//! protocols the client config offers (HTTP/1.1 when none was chosen), with headers of the
//! test's choosing (a `traceparent`), verifying the server by the config's CAs and a name. One
//! connection, kept alive for every request, driven by a runtime of its own.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::{
    Request,
    body::Bytes,
    client::conn::{http1, http2},
    header::{CONTENT_TYPE, HOST},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::{net::TcpStream, runtime::Runtime};
use tokio_rustls::TlsConnector;

/// How long a request may take.
const TIMEOUT: Duration = Duration::from_secs(20);

enum Sender {
    Http1(http1::SendRequest<Full<Bytes>>),
    Http2(http2::SendRequest<Full<Bytes>>),
}

/// One connection.
pub struct Https {
    runtime: Runtime,
    sender: Sender,
    name: String,
    /// The protocol ALPN chose, if any.
    pub alpn: Option<Vec<u8>>,
}

impl Https {
    /// Connects to `addr`, verifying the server as `name` with `config` (its ALPN protocols
    /// offered), and starts HTTP/2 if ALPN chose `h2`, else HTTP/1.1.
    pub fn connect(addr: SocketAddr, config: Arc<ClientConfig>, name: &str) -> Https {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let server = ServerName::try_from(name.to_owned()).expect("a DNS name");
        let (sender, alpn) = runtime.block_on(async {
            let tcp = TcpStream::connect(addr).await.expect("connect");
            // As Go's clients (the kube-apiserver's, kube-scheduler's): an HTTP/2 request's
            // HEADERS and DATA frames leave at once, not 40 ms apart behind a delayed ACK.
            tcp.set_nodelay(true).expect("TCP_NODELAY");
            let tls = TlsConnector::from(config)
                .connect(server, tcp)
                .await
                .expect("the TLS handshake");
            let alpn = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            let io = TokioIo::new(tls);
            let sender = if alpn.as_deref() == Some(b"h2") {
                let (sender, connection) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .expect("the HTTP/2 handshake");
                tokio::spawn(connection);
                Sender::Http2(sender)
            } else {
                let (sender, connection) =
                    http1::handshake(io).await.expect("the HTTP/1.1 handshake");
                tokio::spawn(connection);
                Sender::Http1(sender)
            };
            (sender, alpn)
        });
        Https {
            runtime,
            sender,
            name: name.to_owned(),
            alpn,
        }
    }

    /// `method path` with `headers` and `body` (JSON when not empty): the status and the body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut request = Request::builder().method(method);
        request = match self.sender {
            // HTTP/2 carries the authority in the URI (`:authority`).
            Sender::Http2(_) => request.uri(format!("https://{}{path}", self.name)),
            Sender::Http1(_) => request.uri(path).header(HOST, &self.name),
        };
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("a request");
        let sender = &mut self.sender;
        self.runtime.block_on(async {
            let answer = async {
                let response = match sender {
                    Sender::Http1(s) => {
                        s.ready().await.expect("the connection is usable");
                        s.send_request(request).await
                    }
                    Sender::Http2(s) => {
                        s.ready().await.expect("the connection is usable");
                        s.send_request(request).await
                    }
                }
                .expect("an answer");
                let status = response.status().as_u16();
                let body = response
                    .into_body()
                    .collect()
                    .await
                    .expect("the body")
                    .to_bytes();
                (status, String::from_utf8_lossy(&body).into_owned())
            };
            tokio::time::timeout(TIMEOUT, answer)
                .await
                .unwrap_or_else(|_| panic!("{method} {path}: no answer within {TIMEOUT:?}"))
        })
    }
}
