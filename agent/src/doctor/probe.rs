//! One call as a peer makes it: the host resolved by this machine's resolver (as kube-scheduler's
//! does on its host), a TCP connection, a TLS handshake verified by the CA given and the name
//! given (never by the address), a client certificate presented when one is given, and one
//! HTTP/1.1 request whose answer is read in full. Each step that fails says which one it was, so
//! that the doctor can tell a name that does not resolve from a CA that does not verify.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};

use crate::{
    tls::provider,
    webhook::{
        dial::{DIAL_TIMEOUT, DialError, dial},
        http1::{self, Post},
    },
};

/// The largest answer read.
const ANSWER_LIMIT: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{what} is not usable: {detail}")]
    Material { what: String, detail: String },
    #[error("{host} does not resolve from here: {detail}")]
    Resolve { host: String, detail: String },
    #[error("cannot connect to {addr}: {detail}")]
    Connect { addr: SocketAddr, detail: String },
    #[error("the TLS handshake with {addr} failed: {detail}")]
    Handshake { addr: SocketAddr, detail: String },
    #[error("{addr} did not answer: {detail}")]
    Answer { addr: SocketAddr, detail: String },
    #[error("{request} at {addr} answered {status}: {excerpt}")]
    Status {
        request: String,
        addr: SocketAddr,
        status: u16,
        excerpt: String,
    },
    #[error("no answer from {addr} within {within:?}")]
    Timeout { addr: SocketAddr, within: Duration },
}

/// A client config trusting the certificates of `roots` (PEM, named `what` in errors), presenting
/// `client` (PEM chain and key) when given, HTTP/1.1.
pub fn client_config(
    what: &str,
    roots: &[u8],
    client: Option<(&[u8], &[u8])>,
) -> Result<ClientConfig, ProbeError> {
    let material = |detail: String| ProbeError::Material {
        what: what.to_owned(),
        detail,
    };
    let mut store = RootCertStore::empty();
    let certs = CertificateDer::pem_slice_iter(roots)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| material(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(material("no certificate (a PEM block CERTIFICATE)".into()));
    }
    for cert in certs {
        store
            .add(cert)
            .map_err(|e| material(format!("not a usable CA certificate: {e}")))?;
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| material(e.to_string()))?
        .with_root_certificates(store);
    let mut config = match client {
        Some((chain, key)) => {
            let chain = CertificateDer::pem_slice_iter(chain)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| material(format!("the client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| material(format!("the client key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| material(format!("the client certificate and key: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The addresses `host`:`port` resolves to on this machine, within `within`.
pub async fn resolve(host: &str, port: u16, within: Duration) -> Result<SocketAddr, ProbeError> {
    let failed = |detail: String| ProbeError::Resolve {
        host: host.to_owned(),
        detail,
    };
    let found = tokio::time::timeout(within, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| failed(format!("no answer within {within:?}")))?
        .map_err(|e| failed(e.to_string()))?
        .next();
    found.ok_or_else(|| failed("no address".into()))
}

/// `request` to `addr` over TLS with `config`, the server verified as `name`; the answer's body,
/// all of it, within `within`; an answer other than 200 is an error quoting it.
pub async fn call(
    config: Arc<ClientConfig>,
    addr: SocketAddr,
    name: ServerName<'static>,
    request: &Post<'_>,
    within: Duration,
) -> Result<Vec<u8>, ProbeError> {
    let exchange = async {
        let mut stream = dial(config, addr, name).await.map_err(|e| match e {
            DialError::Connect(e) => ProbeError::Connect {
                addr,
                detail: e.to_string(),
            },
            DialError::Handshake(e) => ProbeError::Handshake {
                addr,
                detail: e.to_string(),
            },
            DialError::Timeout => ProbeError::Timeout {
                addr,
                within: DIAL_TIMEOUT,
            },
        })?;
        http1::exchange(&mut stream, request, ANSWER_LIMIT)
            .await
            .map_err(|e| ProbeError::Answer {
                addr,
                detail: e.to_string(),
            })
    };
    let answer = tokio::time::timeout(within, exchange)
        .await
        .map_err(|_| ProbeError::Timeout { addr, within })??;
    if answer.status != 200 {
        return Err(ProbeError::Status {
            request: format!("{} {}", request.method, request.target),
            addr,
            status: answer.status,
            excerpt: excerpt(&answer.body),
        });
    }
    Ok(answer.body)
}

/// At most [`EXCERPT`] bytes of an answer's body, as text, to quote in a finding.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT)]);
    if body.len() > EXCERPT {
        format!("{text}… ({} bytes)", body.len())
    } else {
        text.into_owned()
    }
}

/// How much of an answer's body a finding quotes.
const EXCERPT: usize = 300;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_body_is_quoted_in_part() {
        assert_eq!(excerpt(b"refused"), "refused");
        let long = vec![b'x'; 1000];
        let quoted = excerpt(&long);
        assert!(quoted.starts_with(&"x".repeat(300)), "{quoted}");
        assert!(quoted.ends_with("… (1000 bytes)"), "{quoted}");
    }

    #[test]
    fn material_that_is_not_a_ca_is_named() {
        let err = client_config("the caBundle of webhook w", b"not pem", None)
            .expect_err("no certificate");
        assert_eq!(
            err.to_string(),
            "the caBundle of webhook w is not usable: no certificate (a PEM block CERTIFICATE)"
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_says_so() {
        let err = resolve("no-such-name.invalid", 443, Duration::from_secs(5))
            .await
            .expect_err("an .invalid name never resolves");
        assert!(
            err.to_string()
                .starts_with("no-such-name.invalid does not resolve from here: "),
            "{err}"
        );
    }
}
