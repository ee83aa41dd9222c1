//! Dialling a node's agent for the webhook's connection pool ([`super::agents`]): TCP to the
//! address the pool asks for (`https://IP:PORT`, the node's `InternalIP`), `TCP_NODELAY`, then
//! TLS with the client config given, verifying the agent by the CA and the fixed name
//! [`SERVER_NAME`] (never by the address) and presenting the client certificate. Both steps
//! together are bounded by [`DIAL_TIMEOUT`], so that a connection the pool finishes in the
//! background (it does when an idle one came free first) cannot hang on an agent that accepts
//! and never answers. Requests and answers are [`super::agents`]'s.

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use hyper::Uri;
use hyper_util::{
    client::legacy::connect::{Connected, Connection},
    rt::TokioIo,
};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

use crate::tls::SERVER_NAME;

/// How long a TCP connection and its TLS handshake may take together.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("not an agent's address: {0:?}")]
    Address(String),
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("no connection within {DIAL_TIMEOUT:?}")]
    Timeout,
}

/// The pool's connector: dials with one client config (a new config makes a new pool).
#[derive(Clone)]
pub struct Dialer {
    config: Arc<ClientConfig>,
}

impl Dialer {
    pub fn new(config: Arc<ClientConfig>) -> Dialer {
        Dialer { config }
    }
}

/// A connection to an agent, TLS established.
#[derive(Debug)]
pub struct Dialled(TokioIo<TlsStream<TcpStream>>);

impl tower_service::Service<Uri> for Dialer {
    type Response = Dialled;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Dialled, DialError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(dial(self.config.clone(), uri))
    }
}

async fn dial(config: Arc<ClientConfig>, uri: Uri) -> Result<Dialled, DialError> {
    let authority = uri.authority().map_or("", |a| a.as_str());
    let addr: SocketAddr = authority
        .parse()
        .map_err(|_| DialError::Address(authority.to_owned()))?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| DialError::Address(e.to_string()))?;
    let dialled = async move {
        let tcp = TcpStream::connect(addr).await.map_err(DialError::Connect)?;
        // An answer is one small write: it leaves at once.
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(DialError::Handshake)?;
        Ok(Dialled(TokioIo::new(tls)))
    };
    tokio::time::timeout(DIAL_TIMEOUT, dialled)
        .await
        .map_err(|_| DialError::Timeout)?
}

impl Connection for Dialled {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Dialled {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Dialled {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
