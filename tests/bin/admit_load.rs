//! `cargo xtask bench admit-load`: `POST /v1/admit` over loopback under a real load tool.
//!
//! Starts the release agent (eBPF as `--ebpf` auto gives it, logs to a file) and the load tool
//! in a cgroup whose hugetlb limits are 0, as the agent's own pod would be, waits for
//! `/readyz`, warms up, then, round after round (`--rounds`, default 3) and for each connection
//! count (`--connections`, default 16 and 50: a webhook's pool, and `oha`'s default), offers a
//! fixed rate (`--rate`) with `oha`: latency measured from the actual send, then
//! latency-corrected (a request is timed from when it was due, so a stall of the load tool's
//! own is charged too), and the same rate on `GET /healthz`, which does no work: the floor this
//! machine and load tool set at that concurrency. Then as fast as the agent goes.
//! Prints every run (throughput, percentiles, every non-200 answer and transport error) and the
//! median p99 of each over the rounds. The target is 20,000 requests/s with p99 under 2 ms; the
//! load tool shares the machine's two cores with the agent, so the figures are a floor for a real
//! node.
//!
//! `admit-load --agent PATH --oha PATH [--rate R] [--connections C[,C…]] [--seconds S] [--rounds N]`
//! (defaults 20000, 16,50, 10, 3).
//!
//! With `--tracing compare` (`cargo xtask bench admit-trace`) it measures the cost of
//! tracing instead: round after round, an agent with `OTEL_TRACES_EXPORTER=none`, one
//! exporting every span over OTLP/gRPC to the real receiver (`otlp_receiver.py --quiet`, in the
//! same cgroup), and one sampling 1 % of traces (`parentbased_traceidratio`, 0.01), each under the
//! fixed rate (from the actual send) and unthrottled, over the first connection count. It prints
//! each run with the agent's CPU time per admission at the fixed rate, the spans exported and
//! dropped and the receiver's CPU time per span, then the medians per mode and the ratios to
//! tracing off (target: within 10 %).
//!
//! With `--versus PATH` it compares this agent with another binary the same way (tracing off
//! for both), round by round: the allocator's choice was made so, and any change can be.
//!
//! With `--tls compare` (`cargo xtask bench admit-tls`) it compares plain HTTP with TLS the same
//! way: certificates are generated (a CA, the agent's certificate for its fixed name
//! [`SERVER_NAME`], a client certificate), the agent requires client certificates, and `oha`
//! presents one (`--cert`, `--key`: its native-tls build loads a PKCS#8 identity), verifies the
//! agent by that name while dialing 127.0.0.1 (`--cacert`, `--connect-to`), and keeps each
//! connection alive, so a connection pays one handshake and every admission pays the record
//! layer. It prints the ratios TLS / plain HTTP (target: within 10 %).
//!
//! With `--cpus split` (which `cargo xtask bench admit-tls` passes) the agent runs on the last
//! CPU this process may use and the load tool on the others, in every mode: a webhook calling a
//! node's agent encrypts and decrypts on its own machine, so its TLS work must not be charged to
//! the agent's latency, as it is when both share the cores (`--cpus shared`, the default).
//!
//! An agent over TLS also serves `--metrics-listen`, where readiness and `/metrics` are read;
//! without TLS they are read on the API port.
//! Every agent's memory (RSS, peak, `AnonHugePages`) is printed when it stops, and idle before
//! the load.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde::Deserialize;

use hugepage_agent_tests::{
    BenchFlags, Footprint, HugetlbController, TestCgroup, cpu_time, free_port, fresh_state_dir,
    host_lock, http,
    mtls::{Ca, Connection, Pair, SERVER_NAME, Versions, client_config},
    peers::{OtlpReceiver, get, metric_sum, otlp_python},
    spawn_in, wait_ready, wait_timeout,
};

/// The kubelet settings every bench agent runs with (there is no kubelet on this machine).
const KUBELET_SETTINGS: [(&str, &str); 2] = [
    ("HUGEPAGE_AGENT_MEMORY_MANAGER_POLICY", "Static"),
    ("HUGEPAGE_AGENT_TOPOLOGY_POLICY", "single-numa-node"),
];

const USAGE: &str = "admit-load --agent PATH --oha PATH [--rate R] [--connections C[,C...]] [--seconds S] [--rounds N] [--tracing compare | --tls compare | --versus PATH] [--cpus shared|split]";

struct Args {
    agent: PathBuf,
    oha: PathBuf,
    rate: u32,
    connections: Vec<u32>,
    seconds: u32,
    compare_tracing: bool,
    compare_tls: bool,
    versus: Option<PathBuf>,
    rounds: u32,
    /// `--cpus split`: the agent on the last CPU, the load tool on the others.
    split: Option<Split>,
}

/// CPUs kept apart: the agent's, and the load tool's.
#[derive(Debug, Clone)]
struct Split {
    agent: Vec<usize>,
    client: Vec<usize>,
}

impl Split {
    /// The last CPU this process may run on for the agent, the others for the load tool.
    fn of_this_machine() -> Split {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: the set is a valid cpu_set_t of the size passed.
        let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
        assert_eq!(
            rc,
            0,
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        );
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: i is below CPU_SETSIZE.
            .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
            .collect();
        let Some((&last, others)) = cpus.split_last().filter(|(_, o)| !o.is_empty()) else {
            panic!("--cpus split needs two CPUs at least; this process may run on {cpus:?}");
        };
        Split {
            agent: vec![last],
            client: others.to_vec(),
        }
    }
}

/// Makes `cmd` run on `cpus` only (its threads inherit it).
fn pin(cmd: &mut Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: the CPU came from sched_getaffinity, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: between fork and exec only sched_setaffinity (a system call) runs, on a set made
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn parse_args() -> Args {
    let flags = BenchFlags::parse(
        USAGE,
        &[
            "--agent",
            "--oha",
            "--rate",
            "--connections",
            "--seconds",
            "--tracing",
            "--rounds",
            "--versus",
            "--tls",
            "--cpus",
        ],
    );
    let compare = |flag: &str| match flags.word(flag, "none") {
        "none" => false,
        "compare" => true,
        _ => {
            eprintln!("usage: {USAGE}");
            std::process::exit(2);
        }
    };
    let compare_tracing = compare("--tracing");
    let compare_tls = compare("--tls");
    Args {
        agent: flags.path("--agent"),
        oha: flags.path("--oha"),
        rate: flags.number("--rate", 20_000) as u32,
        connections: flags
            .numbers("--connections", &[16, 50])
            .into_iter()
            .map(|c| c as u32)
            .collect(),
        seconds: flags.number("--seconds", 10) as u32,
        compare_tracing,
        compare_tls,
        versus: flags.optional_path("--versus"),
        rounds: flags.number("--rounds", 3) as u32,
        split: match flags.word("--cpus", "shared") {
            "shared" => None,
            "split" => Some(Split::of_this_machine()),
            _ => {
                eprintln!("usage: {USAGE}");
                std::process::exit(2);
            }
        },
    }
}

/// What `oha --output-format json` reported, as numbers.
#[derive(Debug, Default, PartialEq)]
struct LoadReport {
    requests_per_sec: f64,
    /// `p50`, `p99`, `p99.9`, … → seconds.
    latency: BTreeMap<String, f64>,
    /// HTTP status → count.
    statuses: BTreeMap<String, u64>,
    /// Transport error → count.
    errors: BTreeMap<String, u64>,
}

fn parse_oha(json: &str) -> Result<LoadReport, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let numbers = |key: &str| -> BTreeMap<String, f64> {
        v[key]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let counts = |key: &str| {
        numbers(key)
            .into_iter()
            .map(|(k, n)| (k, n as u64))
            .collect()
    };
    Ok(LoadReport {
        requests_per_sec: v["summary"]["requestsPerSec"]
            .as_f64()
            .ok_or("no summary.requestsPerSec")?,
        latency: numbers("latencyPercentiles"),
        statuses: counts("statusCodeDistribution"),
        errors: counts("errorDistribution"),
    })
}

/// How `oha` offers load.
#[derive(Clone, Copy)]
enum Load<'a> {
    /// As fast as the connections go.
    Unthrottled,
    /// A fixed rate, latency measured from the actual send.
    Fixed { rate: u32 },
    /// A fixed rate, latency-corrected (a request is timed from when it was due, so a stall is
    /// charged to every request it delayed), every request's times stored in `db` for
    /// [`delays`].
    Recorded { rate: u32, db: &'a Path },
}

/// Percentiles (`p50`, `p99`, `p99.9`, `max`) → seconds.
type Percentiles = BTreeMap<String, f64>;

/// Each request's delays in a recorded run, as `oha_delays.py` reads them.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delays {
    requests: u64,
    /// From the actual send to the answer: the server and the network.
    from_send: Percentiles,
    /// From when the request was due: what a client sending on schedule sees.
    corrected: Percentiles,
    /// How late `oha` sent: waiting for a free connection, and its own lateness.
    send_delay: Percentiles,
    /// The part of the send delay while every connection had a request in flight.
    connection_wait: Percentiles,
    /// The rest: a connection was free and `oha` had not sent yet.
    oha_delay: Percentiles,
}

/// The delays of the requests a [`Load::Recorded`] run over `connections` stored in `db`.
fn delays(db: &Path, connections: u32) -> Delays {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oha_delays.py");
    let out = Command::new(otlp_python())
        .arg(&script)
        .arg(db)
        .arg(connections.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("reading what {} printed: {e}", script.display()))
}

/// What one `oha` run sends: `POST` of a body, or `GET`, and how it connects.
#[derive(Clone, Copy)]
struct Target<'a> {
    url: &'a str,
    /// `POST` of this JSON body; `GET` without.
    body: Option<&'a str>,
    /// `oha`'s TLS flags for the agent (empty over plain HTTP).
    client: &'a [String],
}

/// One `oha` run over `connections` connections.
fn oha(
    args: &Args,
    pod: &TestCgroup,
    target: Target<'_>,
    connections: u32,
    seconds: u32,
    load: Load<'_>,
) -> LoadReport {
    let mut cmd = Command::new(&args.oha);
    spawn_in(&mut cmd, pod);
    if let Some(split) = &args.split {
        pin(&mut cmd, &split.client);
    }
    cmd.args(["--no-tui", "--output-format", "json", "-z"])
        .arg(format!("{seconds}s"))
        .args(["-c", &connections.to_string()]);
    match load {
        Load::Unthrottled => {}
        Load::Fixed { rate } => {
            cmd.args(["-q", &rate.to_string()]);
        }
        Load::Recorded { rate, db } => {
            // oha adds to a database that exists.
            let _ = std::fs::remove_file(db);
            cmd.args(["-q", &rate.to_string(), "--latency-correction", "--db-url"])
                .arg(db);
        }
    }
    cmd.args(target.client);
    if let Some(body) = target.body {
        cmd.args(["-m", "POST", "-T", "application/json", "-d", body]);
    }
    cmd.arg(target.url);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", args.oha.display()));
    assert!(
        out.status.success(),
        "oha failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_oha(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("reading oha's JSON: {e}"))
}

fn print(label: &str, r: &LoadReport) {
    let ms = |p: &str| r.latency.get(p).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "{label:<44} {:>9.0} req/s  p50 {:6.3} ms  p99 {:6.3} ms  p99.9 {:6.3} ms  statuses {:?}",
        r.requests_per_sec,
        ms("p50"),
        ms("p99"),
        ms("p99.9"),
        r.statuses
    );
    print_errors(r);
}

/// Every transport error `oha` counted.
fn print_errors(r: &LoadReport) {
    for (e, n) in &r.errors {
        println!("    error x{n}: {e}");
    }
}

const BODY: &str = r#"{"pod":{"namespace":"bench","name":"dpdk-0","uid":"00000000-0000-0000-0000-000000000001"},"containers":[{"name":"app","resources":{"hugepages-2Mi":"2Mi","hugepages-1Gi":"1Gi","memory":"1Gi"}}]}"#;

/// Certificates for an agent that requires client certificates, and for `oha` to present one.
struct BenchTls {
    dir: tempfile::TempDir,
    ca: Ca,
    client: Pair,
}

impl BenchTls {
    fn new() -> BenchTls {
        let dir = tempfile::Builder::new()
            .prefix("hugepage-agent-admit-tls-")
            .tempdir()
            .expect("a directory for the certificates");
        let ca = Ca::new("admit-load CA");
        ca.server("hugepage-agent").write(dir.path(), "tls");
        let client = ca.client("admit-load");
        client.write(dir.path(), "client");
        std::fs::write(dir.path().join("ca.crt"), &ca.pem).expect("write the CA");
        BenchTls { dir, ca, client }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The agent's flags.
    fn agent_args(&self) -> [String; 6] {
        [
            "--tls-cert-file".to_owned(),
            self.path("tls.crt"),
            "--tls-private-key-file".to_owned(),
            self.path("tls.key"),
            "--client-ca-file".to_owned(),
            self.path("ca.crt"),
        ]
    }

    /// `oha`'s flags for the agent on `port`: trust the CA, present the client certificate,
    /// reach the agent's name at 127.0.0.1.
    fn oha_args(&self, port: u16) -> Vec<String> {
        vec![
            "--cacert".to_owned(),
            self.path("ca.crt"),
            "--cert".to_owned(),
            self.path("client.crt"),
            "--key".to_owned(),
            self.path("client.key"),
            "--connect-to".to_owned(),
            format!("{SERVER_NAME}:{port}:127.0.0.1:{port}"),
        ]
    }
}

/// A release agent started for a benchmark, its log in a file.
struct Running {
    child: std::process::Child,
    port: u16,
    /// Its `--metrics-listen` port.
    metrics: u16,
    /// `http://127.0.0.1:PORT`, or `https://` and the agent's name.
    base: String,
    /// `oha`'s TLS flags for it.
    client: Vec<String>,
    log: PathBuf,
    _state: tempfile::TempDir,
}

impl Running {
    /// Starts the agent `binary` in `pod` with `env` added (over TLS with `tls`, on `cpus` only
    /// when given), and waits for `/readyz`.
    fn start(
        binary: &Path,
        pod: &TestCgroup,
        env: &[(&str, &str)],
        tls: Option<&BenchTls>,
        cpus: Option<&[usize]>,
    ) -> Running {
        let port = free_port();
        // Over TLS, readiness and `/metrics` are read on the plain metrics listener; without
        // TLS on the API port itself (so that an older binary can be compared with --versus).
        let metrics = if tls.is_some() { free_port() } else { port };
        let log = std::env::temp_dir().join(format!("hugepage-agent-admit-load-{port}.log"));
        let log_file = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let state = fresh_state_dir(0);
        let mut agent = Command::new(binary);
        agent
            .args([
                "run",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--log-format",
                "json",
            ])
            .args(
                tls.map(|t| {
                    let mut args = t.agent_args().to_vec();
                    args.extend([
                        "--metrics-listen".to_owned(),
                        format!("127.0.0.1:{metrics}"),
                    ]);
                    args
                })
                .unwrap_or_default(),
            )
            .arg("--state-dir")
            .arg(state.path())
            // A node whose kubelet pins memory (the Static Memory Manager policy, single-numa-node):
            // every admission takes the kubelet's hints and selection. Environment, not flags, so
            // that a binary older than these settings (--versus) runs the same way.
            .envs(KUBELET_SETTINGS)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log_file);
        spawn_in(&mut agent, pod);
        if let Some(cpus) = cpus {
            pin(&mut agent, cpus);
        }
        let mut child = agent
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        if wait_ready(metrics, Duration::from_secs(30)).is_none() {
            let _ = child.kill();
            panic!("the agent was not ready within 30 s; see {}", log.display());
        }
        let (status, answer) = match tls {
            None => http(port, "POST", "/v1/admit", Some("application/json"), BODY),
            Some(tls) => {
                let config = client_config(&[&tls.ca], Some(&tls.client), Versions::Any);
                let answer = Connection::open(port, config)
                    .and_then(|mut c| {
                        c.request("POST", "/v1/admit", Some("application/json"), BODY)
                    })
                    .unwrap_or_else(|e| panic!("an admission over TLS: {e}"));
                (answer.status, answer.body)
            }
        };
        assert_eq!(status, 200, "{answer}");
        let (base, client) = match tls {
            None => (format!("http://127.0.0.1:{port}"), Vec::new()),
            Some(tls) => (format!("https://{SERVER_NAME}:{port}"), tls.oha_args(port)),
        };
        Running {
            child,
            port,
            metrics,
            base,
            client,
            log,
            _state: state,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, and the exit status; prints the agent's memory first.
    fn stop(mut self) -> std::process::ExitStatus {
        println!(
            "agent memory at the end (peak: since the load began): {}",
            Footprint::of(self.child.id())
        );
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = wait_timeout(&mut self.child, Duration::from_secs(15));
        // The log is kept only when the agent failed: a bench leaves nothing else behind.
        if status.success() {
            let _ = std::fs::remove_file(&self.log);
        } else {
            println!("agent failed ({status}); its log: {}", self.log.display());
        }
        status
    }
}

fn main() {
    let args = parse_args();
    if let Some(split) = &args.split {
        println!(
            "CPUs kept apart: the agent on {:?}, the load tool on {:?} (a remote client's work is never on the agent's CPU)",
            split.agent, split.client
        );
    }
    // The agent and the load run as a pod that requested no hugepages would: in a cgroup whose
    // hugetlb limits are 0, so the fault probe filters their own faults, as on a real node.
    let lock = host_lock();
    let _controller = HugetlbController::enable(&lock);
    let pod = TestCgroup::create(&lock, "admit-load");
    pod.set("hugetlb.2MB.max", "0");
    pod.set("hugetlb.1GB.max", "0");
    match (&args.versus, args.compare_tracing, args.compare_tls) {
        (Some(versus), ..) => compare_agents(&args, &pod, versus),
        (None, true, _) => compare_tracing(&args, &pod),
        (None, false, true) => compare_tls(&args, &pod),
        (None, false, false) => load(&args, &pod),
    }
}

fn load(args: &Args, pod: &TestCgroup) {
    let agent = Running::start(
        &args.agent,
        pod,
        &[("OTEL_TRACES_EXPORTER", "none")],
        None,
        args.split.as_ref().map(|s| s.agent.as_slice()),
    );
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "agent memory idle (ready, one admission, 2 s; the peak is start-up's): {}",
        Footprint::of(agent.child.id())
    );
    Footprint::reset_peak(agent.child.id());
    let (_, ready) = http(agent.metrics, "GET", "/readyz", None, "");
    let (_, answer) = http(
        agent.port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        BODY,
    );
    println!("agent ready: {ready}");
    println!("request: {BODY}");
    println!("answer:  {answer}");
    let (admit, healthz) = (agent.url("/v1/admit"), agent.url("/healthz"));
    let admit = Target {
        url: &admit,
        body: Some(BODY),
        client: &[],
    };
    let floor = Target {
        url: &healthz,
        body: None,
        client: &[],
    };
    let first = args.connections[0];
    oha(args, pod, admit, first, 2, Load::Unthrottled);
    let db = std::env::temp_dir().join(format!("hugepage-agent-oha-{}.db", agent.port));
    let recorded = Load::Recorded {
        rate: args.rate,
        db: &db,
    };
    let mut runs: Vec<(String, Target<'_>, u32)> = Vec::new();
    for &c in &args.connections {
        runs.push((format!("{c} conns, POST /v1/admit"), admit, c));
        runs.push((format!("{c} conns, GET /healthz (floor)"), floor, c));
    }
    // Per run: p99 from the send, corrected, of the wait for a connection and of oha's lateness.
    let mut p99s: Vec<[Vec<f64>; 4]> = vec![Default::default(); runs.len()];
    let mut throughput: Vec<f64> = Vec::new();
    for round in 1..=args.rounds {
        for (i, (label, target, connections)) in runs.iter().enumerate() {
            let report = oha(args, pod, *target, *connections, args.seconds, recorded);
            let d = delays(&db, *connections);
            print_recorded(&format!("round {round}, {label}"), &report, &d);
            for (into, from) in p99s[i].iter_mut().zip([
                &d.from_send,
                &d.corrected,
                &d.connection_wait,
                &d.oha_delay,
            ]) {
                into.push(from.get("p99").copied().unwrap_or(f64::NAN));
            }
        }
        let report = oha(args, pod, admit, first, args.seconds, Load::Unthrottled);
        print(
            &format!("round {round}, {first} conns, POST /v1/admit, unthrottled"),
            &report,
        );
        throughput.push(report.requests_per_sec);
    }
    let _ = std::fs::remove_file(&db);
    let status = agent.stop();
    println!("agent stopped: {status}");
    println!(
        "p99 at {} req/s, median of {} rounds (lowest to highest):",
        args.rate, args.rounds
    );
    for ((label, ..), [from_send, corrected, wait, late]) in runs.iter().zip(&p99s) {
        let ms = |v: &[f64]| {
            let (median, low, high) = spread(v);
            format!(
                "{:6.3} ms ({:.3} to {:.3})",
                median * 1e3,
                low * 1e3,
                high * 1e3
            )
        };
        println!(
            "  {label:<32} from the send {}  corrected {}",
            ms(from_send),
            ms(corrected)
        );
        println!(
            "  {:<32} sent late: waiting for a connection {}  oha's own lateness {}",
            "",
            ms(wait),
            ms(late)
        );
    }
    let (median, low, high) = spread(&throughput);
    println!("  {first} conns, unthrottled: {median:.0} req/s ({low:.0} to {high:.0})");
    println!("target: 20000 req/s with p99 under 2 ms");
}

/// One recorded run: throughput and statuses as `oha` counted them, the delays per request.
fn print_recorded(label: &str, r: &LoadReport, d: &Delays) {
    let ms = |p: &Percentiles, q: &str| p.get(q).map_or(f64::NAN, |s| s * 1000.0);
    println!(
        "{label:<44} {:>7.0} req/s  from the send p50 {:6.3} p99 {:6.3} p99.9 {:6.3} ms  corrected p99 {:7.3} ms  sent late p99 {:7.3} ms (connection wait {:7.3}, oha {:7.3})  ({} requests, statuses {:?})",
        r.requests_per_sec,
        ms(&d.from_send, "p50"),
        ms(&d.from_send, "p99"),
        ms(&d.from_send, "p99.9"),
        ms(&d.corrected, "p99"),
        ms(&d.send_delay, "p99"),
        ms(&d.connection_wait, "p99"),
        ms(&d.oha_delay, "p99"),
        d.requests,
        r.statuses
    );
    print_errors(r);
}

/// Median, lowest and highest of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(&low), Some(&high)) => (v[v.len() / 2], low, high),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

/// One mode's figures of one round: unthrottled req/s, p99 at the fixed rate and unthrottled.
#[derive(Debug, Clone, Copy)]
struct Figures {
    throughput: f64,
    p99_fixed: f64,
    p99_unthrottled: f64,
    /// The agent's CPU time per admission at the fixed rate, µs.
    agent_us: f64,
}

fn compare_tracing(args: &Args, pod: &TestCgroup) {
    let receiver = OtlpReceiver::start_quiet_in(pod);
    let endpoint = format!("http://127.0.0.1:{}", receiver.grpc);
    let exporting = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ];
    let sampled = [
        exporting[0],
        exporting[1],
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
    ];
    let agent = args.agent.as_path();
    let modes: [Mode<'_>; 3] = [
        Mode::plain("tracing off", agent, &[("OTEL_TRACES_EXPORTER", "none")]),
        Mode::plain("tracing on, every span", agent, &exporting),
        Mode::plain("tracing on, 1 % sampled", agent, &sampled),
    ];
    compare(args, pod, &modes, Some(&receiver));
    receiver.stop();
    println!("target: tracing on within 10 % of tracing off");
}

/// A way of running the agent: its label, binary, added environment, and TLS.
struct Mode<'a> {
    label: &'a str,
    binary: &'a Path,
    env: &'a [(&'a str, &'a str)],
    tls: Option<&'a BenchTls>,
}

impl<'a> Mode<'a> {
    /// Over plain HTTP.
    fn plain(label: &'a str, binary: &'a Path, env: &'a [(&'a str, &'a str)]) -> Mode<'a> {
        Mode {
            label,
            binary,
            env,
            tls: None,
        }
    }
}

/// `--tls compare`: plain HTTP against TLS with client certificates, alternating round by round,
/// tracing off for both.
fn compare_tls(args: &Args, pod: &TestCgroup) {
    let tls = BenchTls::new();
    let off: &[(&str, &str)] = &[("OTEL_TRACES_EXPORTER", "none")];
    let modes = [
        Mode::plain("plain HTTP", &args.agent, off),
        Mode {
            label: "TLS, client certificate",
            binary: &args.agent,
            env: off,
            tls: Some(&tls),
        },
    ];
    println!(
        "TLS: the agent's certificate names {SERVER_NAME} (no IP address) and it requires client certificates of a generated CA; oha presents one, verifies the agent by that name while dialing 127.0.0.1, and keeps each connection alive"
    );
    compare(args, pod, &modes, None);
    println!("target: TLS within 10 % of plain HTTP");
}

/// `--versus PATH`: this agent against another binary (another allocator, another commit),
/// alternating round by round on the same machine, tracing off for both.
fn compare_agents(args: &Args, pod: &TestCgroup, versus: &Path) {
    let off: &[(&str, &str)] = &[("OTEL_TRACES_EXPORTER", "none")];
    let this = format!("this agent ({})", args.agent.display());
    let other = format!("versus ({})", versus.display());
    let modes: [Mode<'_>; 2] = [
        Mode::plain(&this, &args.agent, off),
        Mode::plain(&other, versus, off),
    ];
    compare(args, pod, &modes, None);
}

/// Round after round, each mode's agent under the fixed rate and unthrottled; every run, then
/// the medians per mode and the ratios to the first mode. With a `receiver`, the spans each
/// exported and the receiver's CPU per span.
fn compare(args: &Args, pod: &TestCgroup, modes: &[Mode<'_>], receiver: Option<&OtlpReceiver>) {
    let mut figures: Vec<Vec<Figures>> = vec![Vec::new(); modes.len()];
    for round in 1..=args.rounds {
        for (i, mode) in modes.iter().enumerate() {
            let label = mode.label;
            let cpus = args.split.as_ref().map(|s| s.agent.as_slice());
            let agent = Running::start(mode.binary, pod, mode.env, mode.tls, cpus);
            Footprint::reset_peak(agent.child.id());
            let url = agent.url("/v1/admit");
            let admit = Target {
                url: &url,
                body: Some(BODY),
                client: &agent.client,
            };
            let connections = args.connections[0];
            oha(args, pod, admit, connections, 2, Load::Unthrottled);
            let agent_before = cpu_time(agent.child.id());
            let receiver_before = receiver.map(|r| cpu_time(r.pid()));
            let exported_before = metric_sum(&get(agent.metrics, "/metrics").1, EXPORTED);
            let fixed = oha(
                args,
                pod,
                admit,
                connections,
                args.seconds,
                Load::Fixed { rate: args.rate },
            );
            let agent_cpu = cpu_time(agent.child.id()).saturating_sub(agent_before);
            let free = oha(
                args,
                pod,
                admit,
                connections,
                args.seconds,
                Load::Unthrottled,
            );
            let receiver_cpu = receiver
                .zip(receiver_before)
                .map(|(r, before)| cpu_time(r.pid()).saturating_sub(before));
            let (_, exposition) = get(agent.metrics, "/metrics");
            let exported = metric_sum(&exposition, EXPORTED) - exported_before;
            let port = agent.port;
            let status = agent.stop();
            assert!(status.success(), "agent on {port} stopped with {status}");
            print(
                &format!("round {round}, {label}, {} req/s offered", args.rate),
                &fixed,
            );
            print(&format!("round {round}, {label}, unthrottled"), &free);
            if mode.tls.is_some() {
                println!(
                    "    TLS handshakes refused: {}",
                    metric_sum(&exposition, "hugepage_agent_tls_handshake_failures_total")
                );
            }
            let answered: u64 = fixed.statuses.values().sum();
            let agent_us = agent_cpu.as_secs_f64() * 1e6 / answered.max(1) as f64;
            println!("    agent CPU per admission at the fixed rate {agent_us:.1} us");
            if let Some(receiver_cpu) = receiver_cpu.filter(|_| i > 0) {
                println!(
                    "    spans exported {exported}, dropped {} (queue full or failed export); the receiver's CPU {:.1} us per span",
                    metric_sum(&exposition, "hugepage_agent_trace_spans_dropped_total"),
                    receiver_cpu.as_secs_f64() * 1e6 / exported.max(1.0),
                );
            }
            figures[i].push(Figures {
                throughput: free.requests_per_sec,
                p99_fixed: p99(&fixed),
                p99_unthrottled: p99(&free),
                agent_us,
            });
        }
    }
    let median = |mode: usize, f: fn(&Figures) -> f64| {
        spread(&figures[mode].iter().map(f).collect::<Vec<_>>()).0
    };
    println!("medians over {} rounds:", args.rounds);
    for (i, Mode { label, .. }) in modes.iter().enumerate() {
        println!(
            "  {label:<24} unthrottled {:>8.0} req/s  p99 at {} req/s {:6.3} ms  p99 unthrottled {:6.3} ms  agent CPU {:5.1} us per admission",
            median(i, |f| f.throughput),
            args.rate,
            median(i, |f| f.p99_fixed) * 1000.0,
            median(i, |f| f.p99_unthrottled) * 1000.0,
            median(i, |f| f.agent_us),
        );
    }
    let first = modes.first().map_or("", |m| m.label);
    for (i, Mode { label, .. }) in modes.iter().enumerate().skip(1) {
        println!(
            "ratio {label} / {first}: throughput {:.3}, p99 at {} req/s {:.3}, p99 unthrottled {:.3}",
            median(i, |f| f.throughput) / median(0, |f| f.throughput),
            args.rate,
            median(i, |f| f.p99_fixed) / median(0, |f| f.p99_fixed),
            median(i, |f| f.p99_unthrottled) / median(0, |f| f.p99_unthrottled),
        );
    }
}

/// Spans the agent has exported so far.
const EXPORTED: &str = "hugepage_agent_trace_spans_exported_total";

fn p99(r: &LoadReport) -> f64 {
    r.latency.get("p99").copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oha_json_is_read() {
        let json = r#"{"summary":{"successRate":1.0,"total":10.0,"requestsPerSec":19994.5},
            "latencyPercentiles":{"p50":0.0003,"p99":0.0015,"p99.9":0.004},
            "statusCodeDistribution":{"200":199945},
            "errorDistribution":{"connection closed":2}}"#;
        let r = parse_oha(json).expect("oha's shape");
        assert_eq!(r.requests_per_sec, 19994.5);
        assert_eq!(r.latency.get("p99"), Some(&0.0015));
        assert_eq!(r.statuses.get("200"), Some(&199_945));
        assert_eq!(r.errors.get("connection closed"), Some(&2));
        assert!(parse_oha(r#"{"summary":{}}"#).is_err());
    }

    #[test]
    fn a_recorded_run_is_read_request_by_request() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("oha.db");
        // oha's table: when due, when sent, when answered (seconds from the start).
        let made = Command::new(otlp_python())
            .args([
                "-c",
                "import sqlite3, sys\n\
                 db = sqlite3.connect(sys.argv[1])\n\
                 db.execute('CREATE TABLE oha (url TEXT, start REAL, start_latency_correction REAL, end REAL, duration REAL, status INTEGER, len_bytes INTEGER, run INTEGER)')\n\
                 rows = [(0.000, 0.000, 0.004), (0.001, 0.004, 0.005), (0.006, 0.008, 0.009)]\n\
                 db.executemany('INSERT INTO oha VALUES (\\'/\\', ?, ?, ?, 0, 200, 0, 1)', [(s, d, e) for d, s, e in rows])\n\
                 db.commit()",
            ])
            .arg(&db)
            .status()
            .expect("python");
        assert!(made.success());
        // Over one connection: the second request waits 3 ms for the first's answer; the third
        // is sent 2 ms late with the connection free.
        let d = delays(&db, 1);
        assert_eq!(d.requests, 3);
        let close = |p: &Percentiles, q: &str, want: f64| {
            let got = p[q];
            assert!((got - want).abs() < 1e-9, "{q}: {got} != {want}");
        };
        close(&d.from_send, "p50", 0.001);
        close(&d.from_send, "max", 0.004);
        close(&d.corrected, "p50", 0.004);
        close(&d.corrected, "p99", 0.004);
        close(&d.send_delay, "p50", 0.002);
        close(&d.send_delay, "max", 0.003);
        close(&d.connection_wait, "max", 0.003);
        close(&d.connection_wait, "p50", 0.0);
        close(&d.oha_delay, "max", 0.002);
        close(&d.oha_delay, "p50", 0.0);
        // Over two connections nobody waited for one: all of it is oha's.
        let d = delays(&db, 2);
        close(&d.connection_wait, "max", 0.0);
        close(&d.oha_delay, "max", 0.003);
    }
}
