//! The webhook's side of mTLS with the node agents: its files (`--agent-ca-file`,
//! `--agent-client-cert-file`, `--agent-client-key-file`) and the rustls client config they
//! make. The files are watched like the served ones ([`crate::tls::Reloader`]): a rotated client
//! certificate or CA is used for the connections dialled after the reload, and files that cannot
//! be used keep the previous config, logged once and counted. Dialling and the calls themselves
//! are [`super::dial`]'s and [`super::agents`]'s.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{PrivateKeyDer, pem::PemObject};

use crate::tls::{
    Material, TlsError, certificates,
    expiry::{self, Expiry},
    kubelet::KubeletVerifier,
    provider, read_file,
};

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
    /// What an agent's certificate is checked for besides the chain to `ca`.
    pub agents: AgentCertificates,
}

/// What an agent's server certificate must be besides chaining to `--agent-ca-file`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentCertificates {
    /// Valid for the DNS name the agent was dialled by (`--agent-identity shared`, `per-node`,
    /// `per-pod`).
    #[default]
    Named,
    /// The kubelet serving certificate of the node dialled (`--agent-identity kubelet`,
    /// [`crate::tls::kubelet`]).
    Kubelet,
}

/// What the client's files held, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientContents {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Material for ClientFiles {
    type Contents = ClientContents;
    type Config = ClientConfig;
    const RELOADED: &'static str =
        "agent client TLS files reloaded: new connections to the agents get the new material";
    const REJECTED: &'static str =
        "agent client TLS files changed but cannot be used; the previous material is still used";

    fn each(&self) -> Vec<(&'static str, &Path)> {
        vec![
            (CA_FLAG, self.ca.as_path()),
            (CERT_FLAG, self.cert.as_path()),
            (KEY_FLAG, self.key.as_path()),
        ]
    }

    fn read(&self) -> Result<ClientContents, TlsError> {
        Ok(ClientContents {
            ca: read_file(CA_FLAG, &self.ca)?,
            cert: read_file(CERT_FLAG, &self.cert)?,
            key: read_file(KEY_FLAG, &self.key)?,
        })
    }

    fn build(&self, contents: &ClientContents) -> Result<ClientConfig, TlsError> {
        client_config(self, contents)
    }

    fn expiries(&self, contents: &ClientContents) -> Vec<Expiry> {
        let client = expiry::of_leaf("agent_client", &contents.cert);
        let ca = expiry::of_bundle("agent_ca", &contents.ca);
        client.into_iter().chain(ca).collect()
    }
}

/// The rustls client config: the agents' CA as the only trust anchor, TLS 1.3 and 1.2, agents'
/// certificates verified as `files.agents` says, the client certificate presented, HTTP/1.1.
fn client_config(files: &ClientFiles, contents: &ClientContents) -> Result<ClientConfig, TlsError> {
    let file = |flag: &'static str, path: &PathBuf, detail: String| TlsError::File {
        flag,
        path: path.clone(),
        detail,
    };
    let mut roots = RootCertStore::empty();
    for ca in certificates(CA_FLAG, &files.ca, &contents.ca)? {
        roots.add(ca).map_err(|e| {
            file(
                CA_FLAG,
                &files.ca,
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    let chain = certificates(CERT_FLAG, &files.cert, &contents.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| file(KEY_FLAG, &files.key, format!("not a PEM private key: {e}")))?;
    let provider = provider();
    let algorithms = provider.signature_verification_algorithms;
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match files.agents {
        AgentCertificates::Named => builder.with_root_certificates(roots),
        AgentCertificates::Kubelet => {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(KubeletVerifier::new(
                    Arc::new(roots),
                    algorithms,
                )))
        }
    };
    let mut config = builder.with_client_auth_cert(chain, key).map_err(|e| {
        let detail = format!("not usable with {CERT_FLAG} {}: {e}", files.cert.display());
        file(KEY_FLAG, &files.key, detail)
    })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
