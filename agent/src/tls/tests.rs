use std::fs;

use rcgen::ExtendedKeyUsagePurpose;

use super::{
    test_pki::{ca, leaf},
    *,
};

/// Writes `bytes` at `path` as a new file (a new inode, as a Secret update makes).
fn replace(path: &Path, bytes: impl AsRef<[u8]>) {
    let tmp = path.with_extension("new");
    fs::write(&tmp, bytes).expect("write");
    fs::rename(&tmp, path).expect("rename");
}

struct Dir {
    _dir: tempfile::TempDir,
    files: TlsFiles,
}

/// The files of a valid server with a client CA.
fn valid() -> Dir {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: Some(dir.path().join("ca.crt")),
    };
    let (ca_pem, issuer) = ca("test CA");
    let (cert, key) = leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth);
    replace(&files.cert, cert);
    replace(&files.key, key);
    replace(files.client_ca.as_ref().expect("a CA"), ca_pem);
    Dir { _dir: dir, files }
}

fn loaded(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
    server_config(files, &Contents::read(files)?, Alpn::Http1)
}

#[test]
fn valid_files_make_a_config_for_http_1_1_with_or_without_a_client_ca() {
    let dir = valid();
    let config = loaded(&dir.files).expect("valid");
    assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    let contents = Contents::read(&dir.files).expect("readable");
    let both = server_config(&dir.files, &contents, Alpn::H2Http1).expect("valid");
    assert_eq!(
        both.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        "HTTP/2 first: a client offering both gets it"
    );
    let no_ca = TlsFiles {
        client_ca: None,
        ..dir.files.clone()
    };
    loaded(&no_ca).expect("valid without a client CA");
}

#[test]
fn bad_files_are_refused_with_the_flag_and_file_named() {
    let dir = valid();
    let files = &dir.files;
    let ca_path = files.client_ca.clone().expect("a CA");
    let show = |files: &TlsFiles| loaded(files).expect_err("refused").to_string();

    let missing = TlsFiles {
        cert: files.cert.with_file_name("absent.crt"),
        ..files.clone()
    };
    let err = show(&missing);
    assert!(
        err.starts_with(&format!("--tls-cert-file {}: ", missing.cert.display()))
            && err.contains("No such file"),
        "{err}"
    );

    let saved = fs::read(&files.cert).expect("read");
    replace(&files.cert, "not a certificate\n");
    assert_eq!(
        show(files),
        format!(
            "--tls-cert-file {}: no certificate (a PEM block CERTIFICATE)",
            files.cert.display()
        )
    );
    replace(
        &files.cert,
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    assert!(
        show(files).contains("not PEM certificates"),
        "{}",
        show(files)
    );
    replace(&files.cert, &saved);

    let saved = fs::read(&files.key).expect("read");
    replace(&files.key, fs::read(&files.cert).expect("read"));
    let err = show(files);
    assert!(
        err.starts_with(&format!(
            "--tls-private-key-file {}: no private key",
            files.key.display()
        )),
        "{err}"
    );
    let (_, other) = ca("another CA");
    let (_, other_key) = leaf(&other, ExtendedKeyUsagePurpose::ServerAuth);
    replace(&files.key, other_key);
    assert_eq!(
        show(files),
        format!(
            "--tls-cert-file {} and --tls-private-key-file {}: the private key is not the certificate's (the first certificate must be the key's)",
            files.cert.display(),
            files.key.display()
        )
    );
    replace(&files.key, &saved);

    replace(&ca_path, "");
    assert_eq!(
        show(files),
        format!(
            "--client-ca-file {}: no certificate (a PEM block CERTIFICATE)",
            ca_path.display()
        )
    );
    replace(&ca_path, vec![b'x'; (MAX_FILE + 1) as usize]);
    assert!(
        show(files).contains("larger than a certificate or key file can be"),
        "{}",
        show(files)
    );
}

/// The config the threads would accept with now.
fn served(tls: &ServerTls) -> Arc<ServerConfig> {
    tls.config.load_full()
}

#[test]
fn a_change_is_read_once_it_holds_still_and_a_bad_one_is_reported_once() {
    let dir = valid();
    let files = &dir.files;
    let stats = Arc::new(TlsStats::default());
    let (tls, mut reloader) = load(files, Alpn::Http1, stats.clone()).expect("valid");
    let first = served(&tls);
    assert_eq!(reloader.poll(), Polled::Unchanged);

    // Touched, same contents: read, nothing reloaded.
    replace(&files.cert, fs::read(&files.cert).expect("read"));
    assert_eq!(reloader.poll(), Polled::Settling);
    assert_eq!(reloader.poll(), Polled::Unchanged);
    assert!(Arc::ptr_eq(&first, &served(&tls)));

    // A new certificate and key (another CA's): swapped in once they hold still.
    let (ca_pem, issuer) = ca("rotated CA");
    let (cert, key) = leaf(&issuer, ExtendedKeyUsagePurpose::ServerAuth);
    replace(&files.cert, &cert);
    assert_eq!(reloader.poll(), Polled::Settling);
    replace(&files.key, &key);
    assert_eq!(reloader.poll(), Polled::Settling, "the key changed too");
    assert_eq!(reloader.poll(), Polled::Reloaded);
    let second = served(&tls);
    assert!(!Arc::ptr_eq(&first, &second));
    assert_eq!(reloader.poll(), Polled::Unchanged);

    // A broken certificate: refused, reported once, the previous config kept.
    replace(&files.cert, "-----BEGIN CERTIFICATE-----\n");
    assert_eq!(reloader.poll(), Polled::Settling);
    match reloader.poll() {
        Polled::Rejected(TlsError::File { flag, path, .. }) => {
            assert_eq!((flag, path), ("--tls-cert-file", files.cert.clone()));
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    for _ in 0..FULL_READ_EVERY + 1 {
        assert!(
            matches!(reloader.poll(), Polled::Unchanged | Polled::StillRejected),
            "reported once"
        );
    }
    assert!(Arc::ptr_eq(&second, &served(&tls)));

    // A missing key is another refusal, reported once as well.
    fs::remove_file(&files.key).expect("remove");
    assert_eq!(reloader.poll(), Polled::Settling);
    assert!(matches!(
        reloader.poll(),
        Polled::Rejected(TlsError::File {
            flag: "--tls-private-key-file",
            ..
        })
    ));
    assert_eq!(reloader.poll(), Polled::Unchanged, "not read again");

    // Back to what is served: nothing to do; the same broken file again is a new incident.
    replace(&files.cert, &cert);
    replace(&files.key, &key);
    assert_eq!(reloader.poll(), Polled::Settling);
    assert_eq!(reloader.poll(), Polled::Unchanged);
    replace(&files.cert, "-----BEGIN CERTIFICATE-----\n");
    assert_eq!(reloader.poll(), Polled::Settling);
    assert!(matches!(reloader.poll(), Polled::Rejected(_)));

    // A new client CA alone is a change as well.
    replace(&files.cert, &cert);
    replace(files.client_ca.as_ref().expect("a CA"), ca_pem);
    assert_eq!(reloader.poll(), Polled::Settling);
    assert_eq!(reloader.poll(), Polled::Reloaded);
    assert_eq!(stats.reloaded.load(Ordering::Relaxed), 2);
    assert_eq!(stats.rejected.load(Ordering::Relaxed), 3);
}

#[test]
fn handshake_errors_are_told_apart() {
    let tls = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
    let cert = |e: CertificateError| tls(rustls::Error::InvalidCertificate(e));
    for (err, want) in [
        (
            tls(rustls::Error::NoCertificatesPresented),
            Refusal::NoCertificate,
        ),
        (cert(CertificateError::UnknownIssuer), Refusal::Untrusted),
        (cert(CertificateError::BadSignature), Refusal::Untrusted),
        (cert(CertificateError::Expired), Refusal::Expired),
        (cert(CertificateError::NotValidYet), Refusal::Expired),
        (cert(CertificateError::InvalidPurpose), Refusal::WrongUsage),
        (cert(CertificateError::BadEncoding), Refusal::BadCertificate),
        (
            tls(rustls::Error::AlertReceived(
                rustls::AlertDescription::UnknownCA,
            )),
            Refusal::ClientAlert,
        ),
        (
            tls(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType,
            )),
            Refusal::Protocol,
        ),
        (
            io::Error::from(io::ErrorKind::UnexpectedEof),
            Refusal::Closed,
        ),
    ] {
        assert_eq!(Refusal::of(&err), want, "{err}");
    }
    let stats = TlsStats::default();
    stats.refused(Refusal::Expired);
    stats.refused(Refusal::Expired);
    assert_eq!(stats.refusals(Refusal::Expired), 2);
    assert_eq!(stats.refusals(Refusal::Untrusted), 0);
}

#[test]
fn the_expiries_follow_every_reload_and_stay_with_refused_files() {
    let dir = valid();
    let files = &dir.files;
    let stats = Arc::new(TlsStats::default());
    let (_tls, mut reloader) = load(files, Alpn::Http1, stats.clone()).expect("valid");
    let at = |label: &str| {
        let all = stats.expiry.all();
        all.iter().find(|(l, _)| *l == label).map(|(_, at)| *at)
    };
    let labels: Vec<&str> = stats.expiry.all().iter().map(|(l, _)| *l).collect();
    assert_eq!(labels, ["serving", "client_ca"]);
    let first = at("serving").expect("the served leaf's notAfter");

    // A leaf that expires at 2030-01-01: the gauge says so once it is served.
    let (_, issuer) = ca("rotated CA");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec![crate::tls::SERVER_NAME.to_owned()]).expect("params");
    params.not_after = rcgen::date_time_ymd(2030, 1, 1);
    let cert = params.signed_by(&key, &issuer).expect("signed");
    replace(&files.cert, cert.pem());
    replace(&files.key, key.serialize_pem());
    assert_eq!(reloader.poll(), Polled::Settling);
    assert_eq!(reloader.poll(), Polled::Reloaded);
    assert_eq!(at("serving"), Some(1_893_456_000));
    assert_ne!(at("serving"), Some(first));

    // A refused file changes nothing: the gauge is what is served.
    replace(&files.cert, "-----BEGIN CERTIFICATE-----\n");
    assert_eq!(reloader.poll(), Polled::Settling);
    assert!(matches!(reloader.poll(), Polled::Rejected(_)));
    assert_eq!(at("serving"), Some(1_893_456_000));
}
