//! When the certificates in use expire, for the `*_tls_certificate_expiry_timestamp_seconds`
//! gauges: the `notAfter` of a served or presented leaf (the first certificate of its file) and
//! the earliest `notAfter` among a CA file's certificates (the first of them to lapse breaks the
//! chains it anchors). A [`super::Reloader`] records them each time it builds a config, so the
//! gauges follow every reload; a file with no certificate it can read records nothing.

use std::sync::Mutex;

use rustls_pki_types::{CertificateDer, pem::PemObject};
use x509_parser::prelude::{FromDer, X509Certificate};

/// One certificate's expiry: its label (`certificate="serving"`, …) and `notAfter` in seconds
/// since the epoch.
pub type Expiry = (&'static str, i64);

/// The expiries of the material in use, replaced at every reload.
#[derive(Debug, Default)]
pub struct Expiries {
    current: Mutex<Vec<Expiry>>,
}

impl Expiries {
    /// Records `expiries` in place of those recorded before.
    pub fn set(&self, expiries: Vec<Expiry>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = expiries;
    }

    /// The expiries recorded, in the order given.
    pub fn all(&self) -> Vec<Expiry> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The `notAfter` of the first certificate of `pem` (a leaf file: the leaf comes first).
pub fn leaf(pem: &[u8]) -> Option<i64> {
    not_afters(pem).into_iter().next()
}

/// The earliest `notAfter` among the certificates of `pem` (a CA bundle).
pub fn earliest(pem: &[u8]) -> Option<i64> {
    not_afters(pem).into_iter().min()
}

/// `(label, leaf(pem))` when there is one.
pub fn of_leaf(label: &'static str, pem: &[u8]) -> Option<Expiry> {
    leaf(pem).map(|at| (label, at))
}

/// `(label, earliest(pem))` when there is one.
pub fn of_bundle(label: &'static str, pem: &[u8]) -> Option<Expiry> {
    earliest(pem).map(|at| (label, at))
}

/// The `notAfter` of each certificate of `pem` that parses, in the file's order.
fn not_afters(pem: &[u8]) -> Vec<i64> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .filter_map(|der| {
            X509Certificate::from_der(der.as_ref())
                .ok()
                .map(|(_, cert)| cert.validity().not_after.timestamp())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair, date_time_ymd};

    use super::*;

    /// A self-signed certificate (PEM) that expires at the start of `day` of 2030's January.
    fn expiring(day: u8) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["a.example".to_owned()]).expect("params");
        params.not_after = date_time_ymd(2030, 1, day);
        params.self_signed(&key).expect("self-signed").pem()
    }

    /// 2030-01-01T00:00:00Z.
    const NEW_YEAR_2030: i64 = 1_893_456_000;
    const DAY: i64 = 86_400;

    #[test]
    fn a_leaf_is_the_first_certificate_and_a_bundle_its_earliest() {
        let bundle = format!("{}{}{}", expiring(9), expiring(3), expiring(20));
        assert_eq!(leaf(bundle.as_bytes()), Some(NEW_YEAR_2030 + 8 * DAY));
        assert_eq!(earliest(bundle.as_bytes()), Some(NEW_YEAR_2030 + 2 * DAY));
        assert_eq!(
            of_bundle("client_ca", bundle.as_bytes()),
            Some(("client_ca", NEW_YEAR_2030 + 2 * DAY))
        );
    }

    #[test]
    fn what_is_not_a_certificate_has_no_expiry() {
        assert_eq!(leaf(b"not PEM at all"), None);
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(earliest(garbage.as_bytes()), None);
        let expiries = Expiries::default();
        expiries.set(vec![("serving", 1)]);
        expiries.set(of_leaf("serving", garbage.as_bytes()).into_iter().collect());
        assert_eq!(expiries.all(), Vec::new());
    }
}
