//! Who a client is: the names of the certificate it presented in the handshake (its subject's
//! common name and its DNS subject alternative names), and whether any of them is one of a
//! list of allowed names. The handshake has already verified the certificate against the
//! client CA; these names only say which of the CA's certificates it is.

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use x509_parser::{extensions::GeneralName, prelude::FromDer};

/// The names a client certificate carries: its common name first (when it has one), then its
/// DNS subject alternative names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientNames(Vec<String>);

impl ClientNames {
    /// The names of the leaf certificate `der`; none if it cannot be read (it was verified, so
    /// that does not happen; no name is then allowed anything).
    pub fn of(der: &CertificateDer<'_>) -> ClientNames {
        let Ok((_, cert)) = x509_parser::certificate::X509Certificate::from_der(der.as_ref())
        else {
            return ClientNames::default();
        };
        let common = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_owned));
        let dns = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .into_iter()
            .flat_map(|san| san.value.general_names.iter())
            .filter_map(|name| match name {
                GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                _ => None,
            });
        ClientNames(common.chain(dns).collect())
    }

    /// Whether any of these names is one of `allowed`.
    pub fn any_of(&self, allowed: &[String]) -> bool {
        self.0.iter().any(|name| allowed.contains(name))
    }

    /// The names, comma-separated, for an answer or a log line.
    pub fn joined(&self) -> String {
        if self.0.is_empty() {
            return "(no common name or DNS name)".to_owned();
        }
        self.0.join(", ")
    }
}

/// A list of allowed names (a flag's comma-separated value), shared by every connection.
pub type AllowedNames = Arc<[String]>;

/// A flag's comma-separated names, each trimmed, empty ones dropped.
pub fn names(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}
