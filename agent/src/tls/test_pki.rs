//! Certificates for the unit tests (test builds only): a CA and leaves it signs, as PEM, made
//! with rcgen. The integration tests have their own in `tests/mtls.rs`.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::SERVER_NAME;

/// A CA: its certificate (PEM) and an issuer for leaves.
pub fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("self-signed");
    (cert.pem(), Issuer::new(params, key))
}

/// A leaf of `issuer` for `usage`: (certificate PEM, key PEM). A server leaf carries
/// [`SERVER_NAME`], a client leaf no name.
pub fn leaf(issuer: &Issuer<'_, KeyPair>, usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let names = match usage {
        ExtendedKeyUsagePurpose::ServerAuth => vec![SERVER_NAME.to_owned()],
        _ => Vec::new(),
    };
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(names).expect("params");
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

/// A server leaf of `issuer` for `names`: (certificate PEM, key PEM).
pub fn named_leaf(issuer: &Issuer<'_, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("params");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

/// A leaf of `issuer` as the kubelet-serving signer makes them for `node`
/// (`O=<organization>, CN=system:node:<node>` in Go's order, `system:nodes` being the signer's,
/// and the node's name as a DNS name) with the extended key usages `usages` (none: no such
/// extension): (certificate PEM, key PEM).
pub fn kubelet_leaf(
    issuer: &Issuer<'_, KeyPair>,
    node: &str,
    usages: &[ExtendedKeyUsagePurpose],
    organization: Option<&str>,
) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec![node.to_owned()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(organization) = organization {
        params
            .distinguished_name
            .push(DnType::OrganizationName, organization);
    }
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    params.extended_key_usages = usages.to_vec();
    let cert = params.signed_by(&key, issuer).expect("signed");
    (cert.pem(), key.serialize_pem())
}

/// A server config presenting `cert` with `key` (PEM), asking for no client certificate.
pub fn server_config(cert: &str, key: &str) -> rustls::ServerConfig {
    rustls::ServerConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).expect("cert PEM")],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM"),
        )
        .expect("a server config")
}
