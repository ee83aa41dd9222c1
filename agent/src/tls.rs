//! TLS for the API listener (`--tls-cert-file`, `--tls-private-key-file`, `--client-ca-file`, the
//! kubelet's names): rustls on `ring`, TLS 1.3 and 1.2, no OpenSSL. The agent's API offers
//! HTTP/1.1 by ALPN; the webhook's listener offers HTTP/2 first, then HTTP/1.1 ([`Alpn`]).
//!
//! **What is served.** One [`ServerConfig`] built from the three files: the certificate chain
//! (the leaf first) and its private key (PKCS#8, PKCS#1 or SEC1 PEM), and, with a client CA, a
//! client-certificate verifier ([`WebPkiClientVerifier`]) that requires a certificate chaining to
//! one of the CA file's certificates, valid now, and usable for client authentication (an
//! extended key usage without `clientAuth` is refused). A client without such a certificate
//! fails the handshake; its request is never read.
//!
//! **How a client finds and verifies an agent.** The server certificate is presented whatever
//! name the client asks for (SNI is ignored), so a client that knows only a `Node` dials the
//! node's `InternalIP` and verifies the certificate by the CA and the fixed DNS name
//! [`SERVER_NAME`], which every agent's certificate carries: one certificate (one Secret) serves
//! every node, no per-node certificate with the node's IP is needed, and a client never trusts
//! an address for a name.
//!
//! **Rotation.** The served config sits behind an atomic pointer ([`ArcSwap`]); each connection
//! takes the config current when it is accepted and keeps it, so connections in flight are never
//! dropped. A [`Reloader`] polls the files every second ([`POLL`]): a change of any file's device,
//! inode, size, mtime or ctime (a Kubernetes Secret volume swaps a symbolic link: new inodes),
//! once it has held still for one poll (cert-manager writing the certificate then the key), and
//! every minute regardless ([`FULL_READ_EVERY`]), makes it read the files; contents equal to what
//! is served change nothing, new contents are built into a new config and swapped in, and
//! contents that fail keep the old config and are reported once ([`Polled::Rejected`]) until the
//! files change again. The reloader is generic over the files it watches ([`Material`]): the
//! served files here ([`Serving`]), the webhook's client side of mTLS with the agents elsewhere.

use std::{
    io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use rustls::{
    CertificateError, RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    server::WebPkiClientVerifier,
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

/// The DNS name every agent's server certificate carries (a subject alternative name), and the
/// name a client verifies it by while dialing the node's IP.
pub const SERVER_NAME: &str = "node.hugepage-agent.internal";
/// How often the files are checked for changes.
pub const POLL: Duration = Duration::from_secs(1);
/// Every this many polls the files are read even if nothing about them seems changed (a file
/// system whose timestamps are coarse).
pub const FULL_READ_EVERY: u32 = 60;
/// Larger files are not certificates or keys.
const MAX_FILE: u64 = 1 << 20;

const CERT_FLAG: &str = "--tls-cert-file";
const KEY_FLAG: &str = "--tls-private-key-file";
const CA_FLAG: &str = "--client-ca-file";

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TlsError {
    #[error("{flag} {}: {detail}", path.display())]
    File {
        flag: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{CERT_FLAG} {} and {KEY_FLAG} {}: {detail}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        detail: String,
    },
    #[error("the TLS configuration: {0}")]
    Config(String),
}

/// The files given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With it, clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Each file with its flag.
    fn each(&self) -> impl Iterator<Item = (&'static str, &Path)> {
        [(CERT_FLAG, &self.cert), (KEY_FLAG, &self.key)]
            .into_iter()
            .map(|(flag, path)| (flag, path.as_path()))
            .chain(self.client_ca.iter().map(|p| (CA_FLAG, p.as_path())))
    }

    fn error(flag: &'static str, path: &Path, detail: impl Into<String>) -> TlsError {
        TlsError::File {
            flag,
            path: path.to_path_buf(),
            detail: detail.into(),
        }
    }
}

/// What the files held, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl Contents {
    pub fn read(files: &TlsFiles) -> Result<Contents, TlsError> {
        Ok(Contents {
            cert: read_file(CERT_FLAG, &files.cert)?,
            key: read_file(KEY_FLAG, &files.key)?,
            client_ca: files
                .client_ca
                .as_deref()
                .map(|p| read_file(CA_FLAG, p))
                .transpose()?,
        })
    }
}

/// A certificate or key file's bytes; errors (a file larger than any such file can be among
/// them) name `flag` and `path`.
pub fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let size = std::fs::metadata(path)
        .map_err(|e| TlsFiles::error(flag, path, e.to_string()))?
        .len();
    if size > MAX_FILE {
        return Err(TlsFiles::error(
            flag,
            path,
            format!("{size} bytes: larger than a certificate or key file can be"),
        ));
    }
    std::fs::read(path).map_err(|e| TlsFiles::error(flag, path, e.to_string()))
}

/// The application protocols a listener offers by ALPN, its preferred first (a client that
/// offers several gets the first of these it offers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// HTTP/1.1 only: the agent's API.
    Http1,
    /// HTTP/2, then HTTP/1.1: the webhook's listener (the kube-apiserver calls admission
    /// webhooks over HTTP/2 when it is offered).
    H2Http1,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::H2Http1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// The provider every config uses: ring, TLS 1.3 and 1.2.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Builds the server config `contents` describe, offering `alpn`; errors name the file at fault.
pub fn server_config(
    files: &TlsFiles,
    contents: &Contents,
    alpn: Alpn,
) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let chain = certificates(CERT_FLAG, &files.cert, &contents.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
        TlsFiles::error(
            KEY_FLAG,
            &files.key,
            match e {
                rustls_pki_types::pem::Error::NoItemsFound => {
                    "no private key (a PEM block PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)"
                        .to_owned()
                }
                other => format!("not a PEM private key: {other}"),
            },
        )
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsFiles::error(KEY_FLAG, &files.key, format!("unusable key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing);
    if let Err(e) = certified.keys_match() {
        let detail = match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                "the private key is not the certificate's (the first certificate must be the key's)"
                    .to_owned()
            }
            other => format!("the certificate cannot be checked against the key: {other}"),
        };
        return Err(TlsError::Pair {
            cert: files.cert.clone(),
            key: files.key.clone(),
            detail,
        });
    }
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(CA_FLAG, path, pem)? {
                roots.add(ca).map_err(|e| {
                    TlsFiles::error(CA_FLAG, path, format!("not a usable CA certificate: {e}"))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsFiles::error(CA_FLAG, path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config =
        builder.with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
    config.alpn_protocols = alpn.protocols();
    Ok(config)
}

/// Every certificate of a PEM file (at least one); errors name `flag` and `path`.
pub fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFiles::error(flag, path, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(TlsFiles::error(
            flag,
            path,
            "no certificate (a PEM block CERTIFICATE)",
        ));
    }
    Ok(chain)
}

/// One file's identity and age as `stat` (through symbolic links) sees it, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    Present {
        dev: u64,
        ino: u64,
        size: u64,
        mtime: (i64, i64),
        ctime: (i64, i64),
    },
    Missing(io::ErrorKind),
}

fn stamps(files: &impl Material) -> Vec<Stamp> {
    files
        .each()
        .into_iter()
        .map(|(_, path)| match std::fs::metadata(path) {
            Ok(m) => Stamp::Present {
                dev: m.dev(),
                ino: m.ino(),
                size: m.size(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            },
            Err(e) => Stamp::Missing(e.kind()),
        })
        .collect()
}

/// Why a handshake failed, as `hugepage_agent_tls_handshake_failures_total{reason}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client presented no certificate.
    NoCertificate,
    /// Its certificate does not chain to the client CA.
    Untrusted,
    /// Its certificate has expired or is not valid yet.
    Expired,
    /// Its certificate is not for client authentication (extended key usage).
    WrongUsage,
    /// Its certificate is refused for another reason.
    BadCertificate,
    /// The client ended the handshake with an alert (it did not accept the server's certificate).
    ClientAlert,
    /// Not TLS, or TLS this server does not speak.
    Protocol,
    /// The connection closed or failed during the handshake.
    Closed,
    /// The handshake took longer than `--handshake-timeout`.
    Timeout,
    /// The certificate is the CA's but none of its names is in the listener's allowed names
    /// (the webhook's `--client-names`): closed right after the handshake, no request read.
    NameNotAllowed,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::NoCertificate,
        Refusal::Untrusted,
        Refusal::Expired,
        Refusal::WrongUsage,
        Refusal::BadCertificate,
        Refusal::ClientAlert,
        Refusal::Protocol,
        Refusal::Closed,
        Refusal::Timeout,
        Refusal::NameNotAllowed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_certificate",
            Refusal::Untrusted => "untrusted",
            Refusal::Expired => "expired",
            Refusal::WrongUsage => "wrong_usage",
            Refusal::BadCertificate => "bad_certificate",
            Refusal::ClientAlert => "client_alert",
            Refusal::Protocol => "protocol",
            Refusal::Closed => "closed",
            Refusal::Timeout => "timeout",
            Refusal::NameNotAllowed => "name_not_allowed",
        }
    }

    /// The refusal an accept's error stands for.
    pub fn of(err: &io::Error) -> Refusal {
        let Some(tls) = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
        else {
            return Refusal::Closed;
        };
        match tls {
            rustls::Error::NoCertificatesPresented => Refusal::NoCertificate,
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    Refusal::Untrusted
                }
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => Refusal::Expired,
                CertificateError::InvalidPurpose
                | CertificateError::InvalidPurposeContext { .. } => Refusal::WrongUsage,
                _ => Refusal::BadCertificate,
            },
            rustls::Error::AlertReceived(_) => Refusal::ClientAlert,
            _ => Refusal::Protocol,
        }
    }
}

/// Handshakes refused and reloads, for `/metrics`.
#[derive(Debug, Default)]
pub struct TlsStats {
    refused: [AtomicU64; Refusal::ALL.len()],
    reloaded: AtomicU64,
    rejected: AtomicU64,
    /// When the certificates in use expire, as of the last build.
    pub expiry: expiry::Expiries,
}

impl TlsStats {
    pub fn refused(&self, why: Refusal) {
        if let Some(i) = Refusal::ALL.iter().position(|r| *r == why) {
            self.refused[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Handshakes refused for `why` so far.
    pub fn refusals(&self, why: Refusal) -> u64 {
        Refusal::ALL
            .iter()
            .position(|r| *r == why)
            .map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Changed files loaded so far.
    pub fn reloads(&self) -> u64 {
        self.reloaded.load(Ordering::Relaxed)
    }

    /// Changed files refused so far (the previous material kept).
    pub fn rejections(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}

/// What the API threads share: the config to accept with, and where refusals are counted.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<ArcSwap<ServerConfig>>,
    stats: Arc<TlsStats>,
}

impl ServerTls {
    /// An acceptor with the config current now; the connection keeps it.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.load_full())
    }

    /// A handshake failed.
    pub fn refused(&self, why: Refusal) {
        debug!(reason = why.label(), "TLS handshake refused");
        self.stats.refused(why);
    }
}

/// A config in use, which a [`Reloader`] swaps in place.
pub type Current<C> = Arc<ArcSwap<C>>;

/// Files that make one rustls config, watched by a [`Reloader`].
pub trait Material: std::fmt::Debug + Send + 'static {
    /// What the files held, byte for byte.
    type Contents: std::fmt::Debug + PartialEq + Send;
    /// What they make.
    type Config: std::fmt::Debug + Send + Sync + 'static;
    /// The log line of a reload.
    const RELOADED: &'static str;
    /// The log line of a refusal (its `error` says why).
    const REJECTED: &'static str;

    /// Each file with its flag.
    fn each(&self) -> Vec<(&'static str, &Path)>;
    fn read(&self) -> Result<Self::Contents, TlsError>;
    /// The config `contents` make; errors name the file at fault.
    fn build(&self, contents: &Self::Contents) -> Result<Self::Config, TlsError>;
    /// When the certificates of `contents` expire ([`expiry`]).
    fn expiries(&self, contents: &Self::Contents) -> Vec<expiry::Expiry>;
}

/// The served files and the protocols offered: the API listener's material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub files: TlsFiles,
    pub alpn: Alpn,
}

impl Material for Serving {
    type Contents = Contents;
    type Config = ServerConfig;
    const RELOADED: &'static str = "TLS files reloaded: new connections get the new material";
    const REJECTED: &'static str =
        "TLS files changed but cannot be used; the previous material is still served";

    fn each(&self) -> Vec<(&'static str, &Path)> {
        self.files.each().collect()
    }

    fn read(&self) -> Result<Contents, TlsError> {
        Contents::read(&self.files)
    }

    fn build(&self, contents: &Contents) -> Result<ServerConfig, TlsError> {
        server_config(&self.files, contents, self.alpn)
    }

    fn expiries(&self, contents: &Contents) -> Vec<expiry::Expiry> {
        let ca = contents.client_ca.as_deref();
        let serving = expiry::of_leaf("serving", &contents.cert);
        serving
            .into_iter()
            .chain(ca.and_then(|ca| expiry::of_bundle("client_ca", ca)))
            .collect()
    }
}

/// What one poll of the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Polled {
    /// Nothing to do: unchanged, or changed back to what is in use.
    Unchanged,
    /// The files changed since the last poll; they are read once they hold still.
    Settling,
    /// New material is used for new connections.
    Reloaded,
    /// The new files cannot be used; the previous material is still in use.
    Rejected(TlsError),
    /// The same unusable files as last reported.
    StillRejected,
}

/// Watches the files and swaps the config in use when they change.
#[derive(Debug)]
pub struct Reloader<M: Material> {
    material: M,
    config: Current<M::Config>,
    stats: Arc<TlsStats>,
    /// What the files held when the config in use was built.
    serving: M::Contents,
    /// The stamps of the last poll.
    last: Vec<Stamp>,
    /// The stamps the files had when last read.
    read: Vec<Stamp>,
    /// The last files refused: their contents (when readable) and why.
    rejected: Option<(Option<M::Contents>, TlsError)>,
    polls: u32,
}

/// Reads and builds the material at start-up: the config the API threads share, and its
/// [`Reloader`].
pub fn load(
    files: &TlsFiles,
    alpn: Alpn,
    stats: Arc<TlsStats>,
) -> Result<(ServerTls, Reloader<Serving>), TlsError> {
    let serving = Serving {
        files: files.clone(),
        alpn,
    };
    let (config, reloader) = watched(serving, stats.clone())?;
    Ok((ServerTls { config, stats }, reloader))
}

/// Reads and builds `material` at start-up: the config, swapped in place on every reload, and
/// the [`Reloader`] that does it (reloads and refusals counted in `stats`).
pub fn watched<M: Material>(
    material: M,
    stats: Arc<TlsStats>,
) -> Result<(Current<M::Config>, Reloader<M>), TlsError> {
    let before = stamps(&material);
    let contents = material.read()?;
    let config = Arc::new(ArcSwap::from_pointee(material.build(&contents)?));
    stats.expiry.set(material.expiries(&contents));
    let reloader = Reloader {
        material,
        config: config.clone(),
        stats,
        serving: contents,
        last: before.clone(),
        read: before,
        rejected: None,
        polls: 0,
    };
    Ok((config, reloader))
}

impl<M: Material> Reloader<M> {
    /// One look at the files (see the module's documentation).
    pub fn poll(&mut self) -> Polled {
        let now = stamps(&self.material);
        self.polls = self.polls.wrapping_add(1);
        if now != self.last {
            self.last = now;
            return Polled::Settling;
        }
        if now == self.read && !self.polls.is_multiple_of(FULL_READ_EVERY) {
            return Polled::Unchanged;
        }
        self.read = now;
        let contents = match self.material.read() {
            Ok(contents) => contents,
            Err(e) => return self.reject(None, e),
        };
        if contents == self.serving {
            self.rejected = None;
            return Polled::Unchanged;
        }
        if let Some((Some(refused), _)) = &self.rejected
            && *refused == contents
        {
            return Polled::StillRejected;
        }
        match self.material.build(&contents) {
            Ok(config) => {
                self.config.store(Arc::new(config));
                self.stats.expiry.set(self.material.expiries(&contents));
                self.serving = contents;
                self.rejected = None;
                self.stats.reloaded.fetch_add(1, Ordering::Relaxed);
                Polled::Reloaded
            }
            Err(e) => self.reject(Some(contents), e),
        }
    }

    fn reject(&mut self, contents: Option<M::Contents>, e: TlsError) -> Polled {
        let refused = (contents, e);
        if self.rejected.as_ref() == Some(&refused) {
            return Polled::StillRejected;
        }
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let e = refused.1.clone();
        self.rejected = Some(refused);
        Polled::Rejected(e)
    }

    /// The files, as `--flag path` pairs, for the log.
    fn files(&self) -> String {
        let each = self.material.each();
        let pairs: Vec<String> = each
            .iter()
            .map(|(flag, path)| format!("{flag} {}", path.display()))
            .collect();
        pairs.join(", ")
    }

    /// Polls every [`POLL`] until `stop` turns true, logging each reload and each refusal once.
    pub async fn watch(mut self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|stopped| *stopped) => return,
            }
            match self.poll() {
                Polled::Reloaded => info!(files = %self.files(), "{}", M::RELOADED),
                Polled::Rejected(e) => warn!(error = %e, "{}", M::REJECTED),
                Polled::Unchanged | Polled::Settling | Polled::StillRejected => {}
            }
        }
    }
}

pub mod expiry;
pub mod flags;
pub mod identity;
pub mod kubelet;
#[cfg(test)]
pub(crate) mod test_pki;
#[cfg(test)]
mod tests;
