//! The real peers the telemetry, contract and deployment tests talk to, as `cargo xtask setup`
//! installs them: the OTLP receiver (`otlp_receiver.py` on PyPI's `opentelemetry-proto` and
//! `grpcio`, in a venv), Debian's Prometheus and promtool, `@grafana/schema` with TypeScript from
//! npm, PyPI's schemathesis (in a venv of its own) and `kubernetes-validate` with
//! `cel-expr-python` (in a venv) for the manifests. `HUGEPAGE_AGENT_OTLP_PYTHON`, `HUGEPAGE_AGENT_GRAFANA_SCHEMA`,
//! `HUGEPAGE_AGENT_SCHEMATHESIS` and `HUGEPAGE_AGENT_VALIDATE_PYTHON` point elsewhere if set.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use crate::free_port;

fn cache() -> PathBuf {
    let home = std::env::var_os("HOME").expect("HOME is set");
    PathBuf::from(home).join(".cache/hugepage-agent")
}

fn installed(var: &str, default: PathBuf) -> PathBuf {
    let path = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `cargo xtask setup` (it installs the test peers)",
        path.display()
    );
    path
}

/// The venv's Python that runs the OTLP receiver.
pub fn otlp_python() -> PathBuf {
    installed(
        "HUGEPAGE_AGENT_OTLP_PYTHON",
        cache().join("otlp-venv/bin/python"),
    )
}

/// The venv's Python with PyPI's `kubernetes-validate` (and PyYAML, which it brings) and
/// `cel-expr-python` (`from cel_expr_python import cel`).
pub fn validate_python() -> PathBuf {
    installed(
        "HUGEPAGE_AGENT_VALIDATE_PYTHON",
        cache().join("kubernetes-validate-venv/bin/python"),
    )
}

/// `kubernetes-validate`, beside that Python.
pub fn kubernetes_validate() -> PathBuf {
    let validate = validate_python().with_file_name("kubernetes-validate");
    assert!(
        validate.exists(),
        "{} is missing: run `cargo xtask setup`",
        validate.display()
    );
    validate
}

/// The npm prefix holding `@kubernetes-models/prometheus-operator` and `…/cert-manager`.
pub fn crd_models() -> PathBuf {
    installed("HUGEPAGE_AGENT_CRD_MODELS", cache().join("crd-models"))
}

/// The npm prefix holding `@grafana/schema` and `typescript`.
pub fn grafana_schema() -> PathBuf {
    installed(
        "HUGEPAGE_AGENT_GRAFANA_SCHEMA",
        cache().join("grafana-schema"),
    )
}

/// The `schemathesis` command, in its venv.
pub fn schemathesis() -> PathBuf {
    installed(
        "HUGEPAGE_AGENT_SCHEMATHESIS",
        cache().join("schemathesis-venv/bin/schemathesis"),
    )
}

/// The workspace root (this crate's parent).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .expect("the tests crate has a parent")
}

/// A running OTLP receiver; each span it received is one JSON value.
pub struct OtlpReceiver {
    child: Child,
    pub grpc: u16,
    pub http: u16,
    spans: mpsc::Receiver<serde_json::Value>,
    /// Every span received so far.
    pub seen: Vec<serde_json::Value>,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        OtlpReceiver::spawn(Command::new(otlp_python()), false)
    }

    /// A receiver that decodes every request and reports no spans, started in `cgroup`.
    pub fn start_quiet_in(cgroup: &crate::TestCgroup) -> OtlpReceiver {
        let mut cmd = Command::new(otlp_python());
        crate::spawn_in(&mut cmd, cgroup);
        OtlpReceiver::spawn(cmd, true)
    }

    fn spawn(mut cmd: Command, quiet: bool) -> OtlpReceiver {
        cmd.arg(workspace().join("tests/otlp_receiver.py"));
        if quiet {
            cmd.arg("--quiet");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OTLP receiver");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, spans) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).unwrap_or(serde_json::Value::String(line));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        let ready = spans
            .recv_timeout(Duration::from_secs(30))
            .expect("the OTLP receiver did not say it was ready within 30 s");
        assert_eq!(ready["ready"], true, "{ready}");
        let port = |k: &str| ready[k].as_u64().and_then(|p| u16::try_from(p).ok());
        OtlpReceiver {
            child,
            grpc: port("grpc").expect("gRPC port"),
            http: port("http").expect("HTTP port"),
            spans,
            seen: Vec::new(),
        }
    }

    /// Waits for a span satisfying `pred`; panics with what arrived after `within`.
    pub fn wait_span(
        &mut self,
        within: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        if let Some(found) = self.seen.iter().find(|s| pred(s)) {
            return found.clone();
        }
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.spans.recv_timeout(left) {
                Ok(span) => {
                    self.seen.push(span.clone());
                    if pred(&span) {
                        return span;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "no such span within {within:?}; received:\n{:#?}",
            self.seen
        );
    }

    /// The spans that arrive within `within` (added to `seen` too).
    pub fn collect(&mut self, within: Duration) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.spans.recv_timeout(left) {
                Ok(span) => got.push(span),
                Err(_) => break,
            }
        }
        self.seen.extend(got.iter().cloned());
        got
    }

    /// The receiver's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the receiver: the collector goes down.
    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real Prometheus server scraping one target, storage in a temporary directory.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// Scrapes `target` (`host:port`) every second, adding `labels` to its series.
    pub fn start(target: &str, labels: &[(&str, &str)]) -> Prometheus {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("hugepage-agent-prometheus-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("prometheus directory");
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}: \"{v}\""))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: hugepage-agent\n    static_configs:\n      \
             - targets: [\"{target}\"]\n        labels: {{{}}}\n",
            labels.join(", ")
        );
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "start prometheus (Debian's prometheus package; cargo xtask setup installs it)",
            );
        let prometheus = Prometheus { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(port, "/-/ready").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    /// An instant query: the `data` of the answer; panics unless the status is success.
    pub fn query(&self, expr: &str) -> serde_json::Value {
        let (status, body) = get(
            self.port,
            &format!("/api/v1/query?query={}", percent_encode(expr)),
        );
        let answer: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{expr}: HTTP {status}: {e}: {body}"));
        assert_eq!(answer["status"], "success", "{expr}: {answer}");
        answer["data"].clone()
    }

    /// Waits until `expr` returns at least one series.
    pub fn wait_for_data(&self, expr: &str, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let data = self.query(expr);
            if data["result"].as_array().is_some_and(|r| !r.is_empty()) {
                return data;
            }
            assert!(
                Instant::now() < deadline,
                "{expr} returned nothing within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs promtool with `args`, `stdin` on its standard input: (success, stdout + stderr).
pub fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(workspace().join("dashboards"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool (Debian's prometheus package; cargo xtask setup installs it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with extra headers: (status, body), chunked bodies
/// decoded; status 0 when nothing listens.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, String::from_utf8_lossy(&raw).into_owned());
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    (status, String::from_utf8_lossy(&body).into_owned())
}

pub fn get(port: u16, path: &str) -> (u16, String) {
    request(port, "GET", path, &[], "")
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..eol]);
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let rest = &body[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        body = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The sum of every sample of `name` in an exposition.
pub fn metric_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
