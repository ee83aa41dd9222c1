//! Agents that serve with their node's kubelet serving certificate (`--agent-identity kubelet`):
//! a per-node identity the cluster already issues. The kubelet asks for its serving certificate
//! with a CertificateSigningRequest to the signer `kubernetes.io/kubelet-serving`, whose
//! certificates have the subject `CN=system:node:<node>, O=system:nodes`; kube-controller-manager
//! never approves those itself, so each is approved by an administrator or an approver that
//! checks the requester is that node (kubeadm's documentation names such approvers). Root on node
//! X then holds node X's certificate and no other.
//!
//! The verifier ([`KubeletVerifier`]) checks what the kubelet-serving signer guarantees, not a
//! DNS name: the chain to the CA (the signer's, `--agent-ca-file`), validity and `serverAuth`
//! usage as any server certificate (the extension required, where webpki would take a
//! certificate without it), then a subject of exactly one common name
//! `system:node:<node>` and the organization `system:nodes` alone, `<node>` being the node the
//! caller dialled. rustls hands a verifier only the name it dialled, so the node travels in that
//! name, `<node>.`[`KUBELET_DOMAIN`] ([`server_name`]); no certificate carries it and it is not
//! checked against the certificate's alternative names. A kubelet's *client* certificate has the
//! same subject but only `clientAuth` and is refused.

use std::sync::Arc;

use rustls::{
    CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        verify_server_cert_signed_by_trust_anchor,
    },
    crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature},
    server::ParsedCertificate,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::prelude::FromDer;

/// The domain of the names that carry the dialled node to the verifier.
pub const KUBELET_DOMAIN: &str = "kubelet.hugepage-agent.internal";

/// The organization of every kubelet certificate's subject.
const NODES: &str = "system:nodes";

/// The name a client dials the agent of `node` by under `--agent-identity kubelet`.
pub fn server_name(node: &str) -> String {
    format!("{node}.{KUBELET_DOMAIN}")
}

/// Why a certificate is not the dialled node's kubelet serving certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeletError {
    #[error("{0:?} is not a name of the form <node>.{KUBELET_DOMAIN}")]
    NotKubeletName(String),
    #[error("the certificate cannot be read: {0}")]
    Unreadable(String),
    #[error(
        "the certificate has no extended key usage serverAuth (the kubelet-serving signer always writes one)"
    )]
    NotServing,
    #[error(
        "the certificate's subject is {presented}, not CN=system:node:{node}, O={NODES} (the kubelet serving certificate of node {node:?}, the node dialled)"
    )]
    OtherSubject { node: String, presented: String },
}

/// Verifies a server as the kubelet serving certificate of the node its name carries.
#[derive(Debug)]
pub struct KubeletVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl KubeletVerifier {
    /// A verifier trusting `roots` (the kubelet-serving signer's CA), checking signatures with
    /// `algorithms`.
    pub fn new(roots: Arc<RootCertStore>, algorithms: WebPkiSupportedAlgorithms) -> Self {
        KubeletVerifier { roots, algorithms }
    }
}

/// The node `name` carries: `<node>.`[`KUBELET_DOMAIN`].
fn node_of(name: &ServerName<'_>) -> Result<String, KubeletError> {
    let text = name.to_str();
    text.strip_suffix(KUBELET_DOMAIN)
        .and_then(|rest| rest.strip_suffix('.'))
        .filter(|node| !node.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| KubeletError::NotKubeletName(text.into_owned()))
}

/// Whether `der` is node `node`'s serving certificate: an extended key usage with `serverAuth`,
/// and a subject of one common name `system:node:<node>` and one organization, `system:nodes`.
pub fn check_subject(der: &CertificateDer<'_>, node: &str) -> Result<(), KubeletError> {
    let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref())
        .map_err(|e| KubeletError::Unreadable(e.to_string()))?;
    let subject = cert.subject();
    let texts = |values: Vec<&x509_parser::x509::AttributeTypeAndValue<'_>>| {
        values
            .into_iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Result<Vec<_>, _>>()
    };
    let common = texts(subject.iter_common_name().collect());
    let organizations = texts(subject.iter_organization().collect());
    // webpki takes a certificate without the extension as fit for any use; the signer always
    // writes one.
    let serving = matches!(
        cert.extended_key_usage(),
        Ok(Some(usage)) if usage.value.server_auth
    );
    if !serving {
        return Err(KubeletError::NotServing);
    }
    let expected = format!("system:node:{node}");
    match (common, organizations) {
        (Ok(common), Ok(organizations)) if common == [expected] && organizations == [NODES] => {
            Ok(())
        }
        _ => Err(KubeletError::OtherSubject {
            node: node.to_owned(),
            presented: subject.to_string(),
        }),
    }
}

/// `e` as rustls reports it: another subject as a certificate not valid for the dialled name
/// (its text says which subject it has and which it needed), anything else as an error of ours.
fn refused(e: KubeletError, dialled: &ServerName<'_>) -> Error {
    match e {
        KubeletError::OtherSubject { node, presented } => {
            Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected: dialled.to_owned(),
                presented: vec![format!(
                    "the subject {presented} (node {node:?}'s kubelet serving certificate is CN=system:node:{node}, O={NODES})"
                )],
            })
        }
        other => Error::General(other.to_string()),
    }
}

impl ServerCertVerifier for KubeletVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let node = node_of(server_name).map_err(|e| refused(e, server_name))?;
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        check_subject(end_entity, &node).map_err(|e| refused(e, server_name))?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
