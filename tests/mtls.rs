//! Certificates made in the tests (rcgen) and a TLS client of the agent's API (rustls, over a
//! real socket, kept alive): a CA, the agent's server certificate for the fixed name
//! [`SERVER_NAME`], client certificates that are valid, expired, or for server authentication
//! only, and client configs that trust CAs and present one of them.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    path::Path,
    sync::Arc,
    time::Duration,
};

pub use hugepage_agent::tls::SERVER_NAME;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    date_time_ymd,
};
use rustls::{ClientConfig, ClientConnection, ProtocolVersion, RootCertStore, StreamOwned};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};

/// A certificate and its private key, as PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert: String,
    pub key: String,
}

impl Pair {
    /// The certificate as DER, as a server presents it.
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert.as_bytes()).expect("the PEM rcgen wrote")
    }

    /// Writes `<stem>.crt` and `<stem>.key` in `dir`.
    pub fn write(&self, dir: &Path, stem: &str) {
        for (ext, pem) in [("crt", &self.cert), ("key", &self.key)] {
            let path = dir.join(format!("{stem}.{ext}"));
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

/// A certificate authority.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// Validity of a leaf: rcgen's default (1975 to 4096), or a window in the past.
#[derive(Clone, Copy)]
enum Validity {
    Default,
    Expired,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("a self-signed CA").pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(
        &self,
        common_name: &str,
        names: Vec<String>,
        usage: ExtendedKeyUsagePurpose,
        validity: Validity,
    ) -> Pair {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        if let Validity::Expired = validity {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// The agent's server certificate: the DNS name [`SERVER_NAME`] only (no IP address),
    /// for server authentication.
    pub fn server(&self, common_name: &str) -> Pair {
        self.leaf(
            common_name,
            vec![SERVER_NAME.to_owned()],
            ExtendedKeyUsagePurpose::ServerAuth,
            Validity::Default,
        )
    }

    /// A kubelet serving certificate of `node`, as the signer `kubernetes.io/kubelet-serving`
    /// issues them: `O=system:nodes, CN=system:node:<node>`, the node's name as a DNS name, for
    /// server authentication.
    pub fn kubelet_serving(&self, node: &str) -> Pair {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(vec![node.to_owned()]).expect("leaf params");
        // In the order Go writes them.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("system:node:{node}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for the DNS name `name` (a webhook's Service), for server
    /// authentication.
    pub fn server_named(&self, common_name: &str, name: &str) -> Pair {
        self.server_names(common_name, &[name])
    }

    /// A server certificate for each DNS name of `names`, for server authentication.
    pub fn server_names(&self, common_name: &str, names: &[&str]) -> Pair {
        self.leaf(
            common_name,
            names.iter().map(|n| (*n).to_owned()).collect(),
            ExtendedKeyUsagePurpose::ServerAuth,
            Validity::Default,
        )
    }

    /// A client certificate for client authentication.
    pub fn client(&self, common_name: &str) -> Pair {
        self.leaf(
            common_name,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            Validity::Default,
        )
    }

    /// A client certificate that expired in 2021.
    pub fn expired_client(&self, common_name: &str) -> Pair {
        self.leaf(
            common_name,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
            Validity::Expired,
        )
    }

    /// A certificate for server authentication only, presented as a client's.
    pub fn server_auth_client(&self, common_name: &str) -> Pair {
        self.leaf(
            common_name,
            Vec::new(),
            ExtendedKeyUsagePurpose::ServerAuth,
            Validity::Default,
        )
    }
}

/// Which TLS versions a client offers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Versions {
    /// TLS 1.3 and 1.2.
    Any,
    /// TLS 1.2 only.
    Tls12,
}

/// A client config trusting `trust` for the server, presenting `identity` (or no certificate).
pub fn client_config(
    trust: &[&Ca],
    identity: Option<&Pair>,
    versions: Versions,
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for ca in trust {
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).expect("CA PEM"))
            .expect("a trust anchor");
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()));
    let builder = match versions {
        Versions::Any => builder.with_safe_default_protocol_versions(),
        Versions::Tls12 => builder.with_protocol_versions(&[&rustls::version::TLS12]),
    }
    .expect("protocol versions")
    .with_root_certificates(roots);
    let mut config = match identity {
        Some(pair) => builder
            .with_client_auth_cert(
                vec![pair.der()],
                PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).expect("key PEM"),
            )
            .expect("a client certificate"),
        None => builder.with_no_client_auth(),
    };
    // It speaks HTTP/1.1 only, and says so: a server offering HTTP/2 must not choose it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// An answer of the agent.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// One kept-alive HTTPS connection to 127.0.0.1.
pub struct Connection {
    stream: StreamOwned<ClientConnection, TcpStream>,
    /// Bytes read past the last answer.
    pending: Vec<u8>,
}

impl Connection {
    /// Connects to 127.0.0.1:`port` and completes the handshake, verifying the server as
    /// [`SERVER_NAME`].
    pub fn open(port: u16, config: Arc<ClientConfig>) -> io::Result<Connection> {
        let name = ServerName::try_from(SERVER_NAME).expect("a DNS name");
        Connection::open_as(port, config, name)
    }

    /// [`Connection::open`], verifying the server as `name`.
    pub fn open_as(
        port: u16,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Connection> {
        Connection::over(TcpStream::connect(("127.0.0.1", port))?, config, name)
    }

    /// [`Connection::open_as`] from the source address `source` (127.0.0.2 and so on are peers
    /// of their own on loopback).
    pub fn open_from(
        source: std::net::IpAddr,
        port: u16,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Connection> {
        Connection::over(connect_from(source, port)?, config, name)
    }

    /// [`Connection::open_as`] to `addr`.
    pub fn open_to(
        addr: std::net::SocketAddr,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Connection> {
        Connection::over(TcpStream::connect(addr)?, config, name)
    }

    /// The handshake over `tcp`, verifying the server as `name`.
    pub fn over(
        tcp: TcpStream,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Connection> {
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        // As Go's clients (kube-scheduler's, kube-apiserver's) do: a request is never held back
        // waiting for the server's delayed ACK of the one before.
        tcp.set_nodelay(true)?;
        let tls = ClientConnection::new(config, name).map_err(io::Error::other)?;
        let mut stream = StreamOwned::new(tls, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(Connection {
            stream,
            pending: Vec::new(),
        })
    }

    /// The certificate the server presented.
    pub fn server_certificate(&self) -> Option<CertificateDer<'static>> {
        self.stream
            .conn
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|c| c.clone().into_owned())
    }

    pub fn version(&self) -> Option<ProtocolVersion> {
        self.stream.conn.protocol_version()
    }

    pub fn alpn(&self) -> Option<Vec<u8>> {
        self.stream.conn.alpn_protocol().map(<[u8]>::to_vec)
    }

    /// One request on this connection, kept alive; the answer (its body by `content-length`).
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> io::Result<Answer> {
        let ctype = content_type
            .map(|t| format!("content-type: {t}\r\n"))
            .unwrap_or_default();
        // One write: the head and the body leave in as few TLS records and segments as fit.
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {SERVER_NAME}\r\n{ctype}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.stream.write_all(request.as_bytes())?;
        self.stream.flush()?;
        let end = loop {
            if let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no status line: {head:?}")))?;
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("no content-length: {head:?}")))?;
        let content_type = header("content-type").unwrap_or_default();
        while self.pending.len() < end + 4 + length {
            self.fill()?;
        }
        let rest = self.pending.split_off(end + 4 + length);
        let body = String::from_utf8_lossy(&self.pending[end + 4..]).into_owned();
        self.pending = rest;
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk)? {
            0 => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            n => {
                self.pending.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }
}

/// A TCP connection to 127.0.0.1:`port` from the source address `source`.
pub fn connect_from(source: std::net::IpAddr, port: u16) -> io::Result<TcpStream> {
    // The kernel's own retries give up after about two minutes.
    connect_from_within(source, port, std::time::Duration::from_secs(150))
}

/// [`connect_from`], given up (`TimedOut`) after `within`.
pub fn connect_from_within(
    source: std::net::IpAddr,
    port: u16,
    within: std::time::Duration,
) -> io::Result<TcpStream> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tcp = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind((source, 0).into())?;
        let connect = socket.connect((std::net::Ipv4Addr::LOCALHOST, port).into());
        match tokio::time::timeout(within, connect).await {
            Ok(tcp) => tcp,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    })?;
    let tcp = tcp.into_std()?;
    tcp.set_nonblocking(false)?;
    Ok(tcp)
}
