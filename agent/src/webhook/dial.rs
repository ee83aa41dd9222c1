//! Dialling a node's agent for the webhook's connection pool ([`super::pool`]): TCP to the
//! node's `InternalIP` and `--agent-port`, `TCP_NODELAY`, then TLS with the client config given,
//! verifying the agent by the CA and the name `--agent-identity` gives the node
//! ([`super::identity`]; never by the address) and presenting the client certificate. Both steps together are bounded by [`DIAL_TIMEOUT`], so
//! that an agent that accepts and never answers cannot hold a call past it.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

/// How long a TCP connection and its TLS handshake may take together.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to an agent, TLS established: boxed, so that the futures of the calls that
/// hold one (a thousand at once) and the idle pool carry a pointer, not its kilobyte of TLS
/// state.
pub type Stream = Box<TlsStream<TcpStream>>;

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot connect: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
    #[error("no connection within {DIAL_TIMEOUT:?}")]
    Timeout,
}

/// A new connection to the agent at `addr` with `config`, verified as `name`.
pub async fn dial(
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    name: ServerName<'static>,
) -> Result<Stream, DialError> {
    let dialled = async move {
        let tcp = TcpStream::connect(addr).await.map_err(DialError::Connect)?;
        // A request is one small write: it leaves at once.
        let _ = tcp.set_nodelay(true);
        let tls = TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(DialError::Handshake)?;
        Ok(Box::new(tls))
    };
    // Boxed: a dial is the rare case, and its TLS handshake state would otherwise be carried
    // in every call's future.
    tokio::time::timeout(DIAL_TIMEOUT, Box::pin(dialled))
        .await
        .map_err(|_| DialError::Timeout)?
}
