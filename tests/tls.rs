//! The API secured (issue #16), over real sockets with certificates made here, on a built host
//! tree (`--host-root`, `--ebpf off`): nothing on the host changes.
//!
//! * Client certificates: a valid one is served over TLS 1.3 and 1.2 (HTTP/1.1 by ALPN); none,
//!   an expired one, one of another CA and one for server authentication only fail the
//!   handshake, each counted by why, and nothing they sent changes anything.
//! * Who may change state: a certificate of the CA not named in `--admit-client-names` is
//!   answered 403 on a real admission and a release (nothing reserved), 200 on a dry run and on
//!   reads; the webhook's certificate (the default name) admits.
//! * The server certificate carries the fixed DNS name the clients verify while dialing the IP.
//! * The plain metrics listener serves `/metrics`, `/healthz`, `/readyz` and nothing of `/v1`.
//! * Rotation through a Kubernetes Secret volume (a symbolic link swapped): a kept-alive
//!   connection keeps working, new connections get the new certificate and client CA, and a
//!   broken file keeps the previous material and is reported once.
//! * The refusal rule: an API beyond loopback without a client CA does not start (exit 2, one
//!   line), unless `--allow-unauthenticated-clients`.

use std::{
    fs,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use hugepage_agent_tests::{
    Agent, agent_bin, free_port, http,
    mtls::{Answer, Ca, Connection, Pair, Versions, client_config},
    output,
    peers::metric_sum,
    put, wait_ready,
};
use rustls_pki_types::ServerName;

/// One NUMA node with 512 free 2 MiB pages, quiet pressure, an empty cgroup v2 tree; no kubelet
/// checkpoint (the Memory Manager's state is built from sysfs).
fn host_tree() -> tempfile::TempDir {
    let tree = tempfile::tempdir().expect("a host tree");
    let w = |path: &str, content: &str| put(tree.path(), path, content);
    let quiet = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=10\n";
    w("/sys/devices/system/node/online", "0\n");
    let node = "/sys/devices/system/node/node0";
    w(&format!("{node}/cpulist"), "0-1\n");
    w(&format!("{node}/distance"), "10\n");
    w(
        &format!("{node}/meminfo"),
        "Node 0 MemTotal:       16777216 kB\nNode 0 MemFree: 1 kB\n",
    );
    for dir in [
        format!("{node}/hugepages/hugepages-2048kB"),
        "/sys/kernel/mm/hugepages/hugepages-2048kB".to_owned(),
    ] {
        for (file, v) in [
            ("nr_hugepages", "512\n"),
            ("free_hugepages", "512\n"),
            ("surplus_hugepages", "0\n"),
            ("resv_hugepages", "0\n"),
        ] {
            w(&format!("{dir}/{file}"), v);
        }
    }
    w(
        "/proc/meminfo",
        "MemTotal:       16777216 kB\nHugePages_Total:     512\nHugepagesize:       2048 kB\n",
    );
    for resource in ["memory", "io", "cpu"] {
        w(&format!("/proc/pressure/{resource}"), quiet);
        w(
            &format!("/sys/fs/cgroup/kubepods.slice/{resource}.pressure"),
            quiet,
        );
    }
    w(
        "/sys/fs/cgroup/cgroup.controllers",
        "cpu io memory hugetlb\n",
    );
    w(
        "/sys/fs/cgroup/cgroup.subtree_control",
        "cpu io memory hugetlb\n",
    );
    tree
}

const ADMIT: &str = r#"{"pod":{"namespace":"tls","name":"dpdk","uid":"16160000-0000-4000-8000-000000000001","qosClass":"Guaranteed"},"containers":[{"name":"fwd","resources":{"hugepages-2Mi":"4Mi","memory":"1Gi"}}],"numaNodes":[0]}"#;

/// The agent's command line over `tree`, with `args`.
fn agent(tree: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree)
        .args(["--ebpf", "off"])
        .args(args);
    cmd
}

/// An agent with TLS and a client CA from `files` (`tls.crt`, `tls.key`, `ca.crt` in a
/// directory), its metrics listener on a port of its own; ready.
struct Secured {
    agent: Agent,
    metrics: u16,
    _tree: tempfile::TempDir,
}

impl Secured {
    fn start(files: &Path) -> Secured {
        let tree = host_tree();
        let metrics = free_port();
        let path = |name: &str| files.join(name).display().to_string();
        let mut agent = Agent::start(agent(
            tree.path(),
            &[
                "--tls-cert-file",
                &path("tls.crt"),
                "--tls-private-key-file",
                &path("tls.key"),
                "--client-ca-file",
                &path("ca.crt"),
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
            ],
        ));
        let running = agent.wait_for("agent running", Duration::from_secs(20), |_| true);
        assert_eq!(running["tls"], "client certificates required", "{running}");
        // The API answers only over TLS: readiness is asked on the metrics listener.
        wait_ready(metrics, Duration::from_secs(10)).expect("the agent is ready");
        Secured {
            agent,
            metrics,
            _tree: tree,
        }
    }

    fn port(&self) -> u16 {
        self.agent.port
    }

    /// The sum of the series of metric `name` (with `{labels}` when given), from the metrics
    /// listener.
    fn metric(&self, name: &str) -> f64 {
        let (status, text) = http(self.metrics, "GET", "/metrics", None, "");
        assert_eq!(status, 200, "{text}");
        match name.split_once('{') {
            None => metric_sum(&text, name),
            Some(_) => text
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("no series {name} in:\n{text}")),
        }
    }

    /// Waits until the handshakes refused for `reason` reach `count`.
    fn wait_refused(&self, reason: &str, count: f64) {
        let series = format!("hugepage_agent_tls_handshake_failures_total{{reason=\"{reason}\"}}");
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.metric(&series) < count {
            assert!(
                Instant::now() < deadline,
                "{series} did not reach {count}: {}",
                self.metric(&series)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `request` on a new connection with `config`.
fn once(
    port: u16,
    config: std::sync::Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<Answer> {
    let content_type = (!body.is_empty()).then_some("application/json");
    Connection::open(port, config)?.request(method, path, content_type, body)
}

fn json(answer: &Answer) -> serde_json::Value {
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

#[test]
fn a_valid_client_certificate_is_served_and_every_other_client_fails_the_handshake() {
    let files = tempfile::tempdir().expect("a directory for the TLS files");
    let ca = Ca::new("hugepage-agent CA");
    ca.server("hugepage-agent").write(files.path(), "tls");
    fs::write(files.path().join("ca.crt"), &ca.pem).expect("write the CA");
    let secured = Secured::start(files.path());
    let port = secured.port();

    let webhook = ca.client("hugepage-agent-webhook");
    let valid = client_config(&[&ca], Some(&webhook), Versions::Any);
    let mut kept = Connection::open(port, valid.clone()).expect("a valid client");
    assert_eq!(kept.version(), Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(
        kept.alpn().as_deref(),
        Some(&b"http/1.1"[..]),
        "h2 offered, HTTP/1.1 chosen"
    );
    let admitted = kept
        .request("POST", "/v1/admit", Some("application/json"), ADMIT)
        .expect("an answer");
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let answer = json(&admitted);
    assert_eq!(answer["allowed"], true, "{answer:#}");
    assert!(answer["reservation"]["id"].is_string(), "{answer:#}");
    let listed = kept
        .request("GET", "/v1/reservations", None, "")
        .expect("the same connection, kept alive");
    assert_eq!(
        json(&listed)["reservations"].as_array().map(Vec::len),
        Some(1)
    );
    let tls12 = client_config(&[&ca], Some(&webhook), Versions::Tls12);
    let mut old = Connection::open(port, tls12).expect("TLS 1.2 is accepted");
    assert_eq!(old.version(), Some(rustls::ProtocolVersion::TLSv1_2));
    assert_eq!(
        old.request("GET", "/healthz", None, "")
            .expect("answer")
            .status,
        200
    );

    let admissions = secured.metric("hugepage_agent_admissions_total");
    let stranger = Ca::new("another CA");
    let refused: [(&str, Option<Pair>, &str); 4] = [
        ("no certificate", None, "no_certificate"),
        ("expired", Some(ca.expired_client("expired")), "expired"),
        (
            "another CA's",
            Some(stranger.client("stranger")),
            "untrusted",
        ),
        (
            "for server authentication only",
            Some(ca.server_auth_client("server-auth-only")),
            "wrong_usage",
        ),
    ];
    for (what, identity, reason) in refused {
        let config = client_config(&[&ca], identity.as_ref(), Versions::Any);
        let outcome = once(port, config, "POST", "/v1/admit", ADMIT);
        assert!(
            outcome.is_err(),
            "a client certificate {what}: answered {outcome:?}"
        );
        secured.wait_refused(reason, 1.0);
    }

    // Plain HTTP on the TLS port: no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The agent may close before all of it is sent.
    let _ = write!(
        plain,
        "POST /v1/admit HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ADMIT}",
        ADMIT.len()
    );
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(
        !reply.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    secured.wait_refused("protocol", 1.0);

    // The certificate names the agent, not the node's address: verified by IP it is refused
    // (by the client, which tells the server so).
    let by_ip = Connection::open_as(
        port,
        valid.clone(),
        ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()),
    );
    let err = by_ip.err().expect("no IP address in the certificate");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    secured.wait_refused("client_alert", 1.0);

    // Nothing the refused clients sent was admitted or reserved.
    assert_eq!(
        secured.metric("hugepage_agent_admissions_total"),
        admissions
    );
    let listed = kept
        .request("GET", "/v1/reservations", None, "")
        .expect("the first connection still serves");
    assert_eq!(
        json(&listed)["reservations"].as_array().map(Vec::len),
        Some(1)
    );
    let (exit, log) = secured.agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
}

#[test]
fn a_certificate_not_named_in_admit_client_names_may_read_and_dry_run_but_not_reserve() {
    let files = tempfile::tempdir().expect("a directory for the TLS files");
    let ca = Ca::new("hugepage-agent CA");
    ca.server("hugepage-agent").write(files.path(), "tls");
    fs::write(files.path().join("ca.crt"), &ca.pem).expect("write the CA");
    let secured = Secured::start(files.path());
    let port = secured.port();

    let reader = client_config(&[&ca], Some(&ca.client("dashboard")), Versions::Any);
    let mut conn = Connection::open(port, reader).expect("a certificate of the CA");
    let refused = conn
        .request("POST", "/v1/admit", Some("application/json"), ADMIT)
        .expect("an answer");
    assert_eq!(refused.status, 403, "{refused:?}");
    let problem = json(&refused);
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("dashboard") && detail.contains("--admit-client-names"),
        "{problem:#}"
    );
    let listed = conn
        .request("GET", "/v1/reservations", None, "")
        .expect("a read");
    assert_eq!(listed.status, 200, "{listed:?}");
    assert_eq!(
        json(&listed)["reservations"].as_array().map(Vec::len),
        Some(0),
        "nothing reserved"
    );
    let dry = conn
        .request(
            "POST",
            "/v1/admit?dryRun=true",
            Some("application/json"),
            ADMIT,
        )
        .expect("a dry run");
    assert_eq!(dry.status, 200, "{dry:?}");
    assert_eq!(json(&dry)["dryRun"], true);

    let webhook = client_config(
        &[&ca],
        Some(&ca.client("hugepage-agent-webhook")),
        Versions::Any,
    );
    let mut admitting = Connection::open(port, webhook).expect("the webhook's certificate");
    let admitted = admitting
        .request("POST", "/v1/admit", Some("application/json"), ADMIT)
        .expect("an answer");
    assert_eq!(admitted.status, 200, "{admitted:?}");
    let id = json(&admitted)["reservation"]["id"]
        .as_str()
        .expect("a reservation")
        .to_owned();
    let release = conn
        .request("DELETE", &format!("/v1/reservations/{id}"), None, "")
        .expect("an answer");
    assert_eq!(release.status, 403, "{release:?}");
    let listed = conn
        .request("GET", "/v1/reservations", None, "")
        .expect("a read");
    assert_eq!(
        json(&listed)["reservations"].as_array().map(Vec::len),
        Some(1),
        "the reservation is still held"
    );
    let (exit, log) = secured.agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
}

#[test]
fn the_metrics_listener_serves_metrics_and_probes_and_nothing_of_v1() {
    let files = tempfile::tempdir().expect("a directory for the TLS files");
    let ca = Ca::new("hugepage-agent CA");
    ca.server("hugepage-agent").write(files.path(), "tls");
    fs::write(files.path().join("ca.crt"), &ca.pem).expect("write the CA");
    let secured = Secured::start(files.path());
    let metrics = secured.metrics;

    let (status, text) = http(metrics, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    assert!(
        text.contains("hugepage_agent_tls_handshake_failures_total{reason=\"untrusted\"} 0"),
        "{text}"
    );
    assert_eq!(http(metrics, "GET", "/healthz", None, "").0, 200);
    let (status, ready) = http(metrics, "GET", "/readyz", None, "");
    assert_eq!(status, 200, "{ready}");
    for (method, path, body) in [
        ("POST", "/v1/admit", ADMIT),
        ("POST", "/v1/hints", ADMIT),
        ("GET", "/v1/hugepages", ""),
        ("GET", "/v1/reservations", ""),
        ("DELETE", "/v1/reservations/any", ""),
        ("GET", "/openapi.json", ""),
    ] {
        let mut stream = TcpStream::connect(("127.0.0.1", metrics)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read");
        assert!(
            answer.starts_with("HTTP/1.1 404"),
            "{method} {path}: {answer}"
        );
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{method} {path}: {answer}"
        );
    }
    assert_eq!(secured.metric("hugepage_agent_admissions_total"), 0.0);
    assert_eq!(secured.metric("hugepage_agent_reservations"), 0.0);
    let client = client_config(&[&ca], Some(&ca.client("webhook")), Versions::Any);
    let listed = once(secured.port(), client, "GET", "/v1/reservations", "").expect("an answer");
    assert_eq!(json(&listed)["reservations"], serde_json::json!([]));
    let (exit, log) = secured.agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
}

/// A directory as the kubelet projects a Secret: every file a symbolic link through `..data`,
/// itself a link to the current version's directory, swapped atomically on an update.
struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    fn publish(&mut self, files: &[(&str, &str)]) {
        use std::os::unix::fs::symlink;
        self.version += 1;
        let data = format!("..2026_01_01_00_00_0{}", self.version);
        fs::create_dir(self.dir.join(&data)).expect("the version's directory");
        for (name, content) in files {
            fs::write(self.dir.join(&data).join(name), content).expect("write");
        }
        let tmp = self.dir.join("..data_tmp");
        symlink(&data, &tmp).expect("symlink");
        fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let link = self.dir.join(name);
            if fs::symlink_metadata(&link).is_err() {
                symlink(format!("..data/{name}"), &link).expect("symlink");
            }
        }
    }
}

const RELOADED: &str = "TLS files reloaded: new connections get the new material";
const REJECTED: &str =
    "TLS files changed but cannot be used; the previous material is still served";

#[test]
fn rotation_reaches_new_connections_keeps_those_in_flight_and_a_bad_file_is_reported_once() {
    let files = tempfile::tempdir().expect("a directory for the Secret");
    let mut volume = SecretVolume {
        dir: files.path().to_path_buf(),
        version: 0,
    };
    let server_ca = Ca::new("agents' CA");
    let (first, second) = (server_ca.server("agent one"), server_ca.server("agent two"));
    let (clients_one, clients_two) = (Ca::new("clients, first"), Ca::new("clients, second"));
    let (old_client, new_client) = (clients_one.client("webhook"), clients_two.client("webhook"));
    volume.publish(&[
        ("tls.crt", &first.cert),
        ("tls.key", &first.key),
        ("ca.crt", &clients_one.pem),
    ]);
    let mut secured = Secured::start(files.path());
    let port = secured.port();
    let old = client_config(&[&server_ca], Some(&old_client), Versions::Any);
    let new = client_config(&[&server_ca], Some(&new_client), Versions::Any);

    let mut kept = Connection::open(port, old.clone()).expect("the first client CA's client");
    assert_eq!(kept.server_certificate(), Some(first.der()));
    assert_eq!(
        kept.request("GET", "/v1/hugepages", None, "")
            .expect("answer")
            .status,
        200
    );

    // The Secret is updated: a new server certificate and a new client CA.
    volume.publish(&[
        ("tls.crt", &second.cert),
        ("tls.key", &second.key),
        ("ca.crt", &clients_two.pem),
    ]);
    secured
        .agent
        .wait_for(RELOADED, Duration::from_secs(10), |_| true);
    let answer = kept
        .request("GET", "/v1/hugepages", None, "")
        .expect("the connection in flight keeps its material");
    assert_eq!(answer.status, 200);
    let refused = once(port, old.clone(), "GET", "/v1/hugepages", "");
    assert!(refused.is_err(), "the old client CA is gone: {refused:?}");
    secured.wait_refused("untrusted", 1.0);
    let mut fresh = Connection::open(port, new.clone()).expect("the new client CA's client");
    assert_eq!(fresh.server_certificate(), Some(second.der()));
    assert_eq!(
        fresh
            .request("GET", "/v1/hugepages", None, "")
            .expect("answer")
            .status,
        200
    );

    // A broken certificate: the previous material stays, and the log says why, once.
    volume.publish(&[
        ("tls.crt", "-----BEGIN CERTIFICATE-----\ntruncated\n"),
        ("tls.key", &second.key),
        ("ca.crt", &clients_two.pem),
    ]);
    let warning = secured
        .agent
        .wait_for(REJECTED, Duration::from_secs(10), |_| true);
    let why = warning["error"].as_str().unwrap_or_default();
    let cert_path = files.path().join("tls.crt");
    assert!(
        why.starts_with(&format!("--tls-cert-file {}: ", cert_path.display())),
        "{warning}"
    );
    assert_eq!(warning["level"], "WARN", "{warning}");
    // Several polls later, still one line.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(secured.agent.lines_with(REJECTED).len(), 1);
    assert_eq!(secured.agent.lines_with(RELOADED).len(), 1);
    let mut after = Connection::open(port, new).expect("still served");
    assert_eq!(after.server_certificate(), Some(second.der()));
    assert_eq!(
        after
            .request("GET", "/healthz", None, "")
            .expect("answer")
            .status,
        200
    );
    assert_eq!(
        kept.request("GET", "/healthz", None, "")
            .expect("answer")
            .status,
        200
    );
    assert_eq!(
        secured.metric("hugepage_agent_tls_reloads_total{result=\"reloaded\"}"),
        1.0
    );
    assert_eq!(
        secured.metric("hugepage_agent_tls_reloads_total{result=\"rejected\"}"),
        1.0
    );
    // What is served expires when rcgen's certificates do (4096-01-01), the leaf and the CA alike.
    for certificate in ["serving", "client_ca"] {
        let series = format!(
            "hugepage_agent_tls_certificate_expiry_timestamp_seconds{{certificate=\"{certificate}\"}}"
        );
        assert_eq!(secured.metric(&series), 67_090_118_400.0, "{series}");
    }
    let (exit, log) = secured.agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
}

#[test]
fn an_api_beyond_loopback_without_a_client_ca_is_refused_at_start_unless_meant() {
    let tree = host_tree();
    let state = tempfile::tempdir().expect("a state directory");
    let files = tempfile::tempdir().expect("a directory for the TLS files");
    let ca = Ca::new("hugepage-agent CA");
    ca.server("hugepage-agent").write(files.path(), "tls");
    let cert = files.path().join("tls.crt").display().to_string();
    let key = files.path().join("tls.key").display().to_string();
    let port = free_port();
    let refusal = |listen: &str| {
        format!(
            "hugepage-agent: --listen {listen} is not a loopback address and no --client-ca-file is given: anyone who reaches it could reserve hugepages; give --client-ca-file with --tls-cert-file and --tls-private-key-file, listen on 127.0.0.1, or add --allow-unauthenticated-clients if that is meant\n"
        )
    };
    let plain = format!("0.0.0.0:{port}");
    let mut cmd = agent(tree.path(), &["--listen", &plain]);
    cmd.arg("--state-dir").arg(state.path());
    let (status, _, err) = output(cmd);
    assert_eq!((status.code(), err), (Some(2), refusal(&plain)));

    // TLS without client certificates, the address from the environment: the same.
    let any_v6 = format!("[::]:{port}");
    let mut cmd = agent(
        tree.path(),
        &["--tls-cert-file", &cert, "--tls-private-key-file", &key],
    );
    cmd.arg("--state-dir")
        .arg(state.path())
        .env("HUGEPAGE_AGENT_LISTEN", &any_v6);
    let (status, _, err) = output(cmd);
    assert_eq!((status.code(), err), (Some(2), refusal(&any_v6)));
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nothing listened"
    );
    assert_eq!(
        fs::read_dir(state.path()).expect("state dir").count(),
        0,
        "nothing was written"
    );

    // The operator means it: the agent runs, and warns once.
    let mut open = Agent::start_on(
        agent(tree.path(), &["--allow-unauthenticated-clients"]),
        0,
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    );
    open.wait_for("agent running", Duration::from_secs(20), |l| {
        l["tls"] == "off"
    });
    let (status, _) = http(open.port, "GET", "/healthz", None, "");
    assert_eq!(status, 200);
    let (exit, log) = open.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
    let warned: Vec<_> = log
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| {
            m.contains("accepts requests from any client (--allow-unauthenticated-clients)")
        })
        .collect();
    assert_eq!(warned.len(), 1, "{log:#?}");
}
