//! The serving certificate's flags (`--tls-cert-file`, `--tls-private-key-file`), the same for
//! the agent's API and the webhook; they go together.

use std::path::PathBuf;

use clap::Args;

use super::TlsFiles;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsFlagError {
    #[error("{given} needs {missing}: a certificate and its private key go together")]
    Pair {
        given: &'static str,
        missing: &'static str,
    },
    #[error(
        "--client-ca-file needs --tls-cert-file and --tls-private-key-file: client certificates are asked for in the TLS handshake"
    )]
    ClientCaWithoutTls,
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "TLS")]
pub struct ServingTlsArgs {
    /// PEM certificate chain the listener presents over TLS (the leaf first), with
    /// `--tls-private-key-file`; re-read when it changes on disk.
    #[arg(long, env = "HUGEPAGE_AGENT_TLS_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `--tls-cert-file` (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "HUGEPAGE_AGENT_TLS_PRIVATE_KEY_FILE", value_name = "PATH")]
    pub tls_private_key_file: Option<PathBuf>,
}

impl ServingTlsArgs {
    /// The TLS files the flags name: none, or a certificate and key (and the CA of the clients
    /// it asks certificates of, `client_ca`, only with them).
    pub fn files(&self, client_ca: Option<PathBuf>) -> Result<Option<TlsFiles>, TlsFlagError> {
        const CERT: &str = "--tls-cert-file";
        const KEY: &str = "--tls-private-key-file";
        match (
            self.tls_cert_file.clone(),
            self.tls_private_key_file.clone(),
        ) {
            (Some(cert), Some(key)) => Ok(Some(TlsFiles {
                cert,
                key,
                client_ca,
            })),
            (Some(_), None) => Err(TlsFlagError::Pair {
                given: CERT,
                missing: KEY,
            }),
            (None, Some(_)) => Err(TlsFlagError::Pair {
                given: KEY,
                missing: CERT,
            }),
            (None, None) if client_ca.is_some() => Err(TlsFlagError::ClientCaWithoutTls),
            (None, None) => Ok(None),
        }
    }
}
