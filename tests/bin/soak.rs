//! `cargo xtask bench soak [--minutes M]`: the release agent under a mixed load for a long time,
//! sampled every 10 s, to show that it does not grow and logs nothing the load does not explain.
//!
//! The agent runs with eBPF on (`--ebpf on`: a refusal is a start-up error, and the soak checks
//! that the map's source is `ebpf+sysfs`), a fresh `--state-dir`, `--reservation-ttl 5s`, PSI
//! triggers at a 1 % memory threshold read every second, on this machine's sysfs
//! (`--host-root /`), with a 2 MiB pool of 64 pages reserved for the run. The pool, the cgroups
//! and the hugetlb controller are restored on every exit: a panic unwinds through their guards,
//! and SIGINT or SIGTERM end the run early the same way (the report covers what ran). Until the
//! time is up:
//!
//! * admissions: `POST /v1/admit` over `--connections` kept-alive connections (default 8), at
//!   up to `--rate` requests/s (default 20,000) for 15 s, then 15 s idle. Of every 20 requests,
//!   1 names one of 32 pod UIDs in turn (admitted, it reserves 2 MiB, replacing that pod's
//!   earlier reservation), 3 ask 1 GiB of 2 MiB pages (more than the pool: refused), 1 is a whole
//!   `v1.Pod` with an init container and 15 the short form without a UID (admitted, nothing
//!   reserved);
//! * cgroup churn: 20 pod-shaped cgroups a second (`kubepods[/burstable]/pod<uid>/<container>`
//!   under a test cgroup, removed half a second later), their UIDs those of half the reserving
//!   pods, so that a removal ends a reservation (`pod_removed`);
//! * hugetlb faults: every 5 s the `toucher` faults 8 pages in the container cgroup of the first
//!   reserving pod and holds them 3 s (its reservation ends `faulted`);
//! * PSI: a reader confined to 32 MiB of memory stalls for 10 s of every minute
//!   ([`MemoryPressure`]), so the triggers fire and the memory conditions turn True and back;
//! * scrapes: `GET /metrics` and one of the other read endpoints every 2 s, and every 30 s a
//!   `DELETE /v1/reservations/{id}` (`deleted`);
//! * expiries: the other half's reservations of each burst expire in the idle phase after it
//!   (`expired`).
//!
//! Every 10 s it samples the agent's RSS and its anonymous part (`RssAnon`: the RSS also holds
//! the binary's own pages, read in as code runs the first time), open descriptors and threads
//! (`/proc/<pid>`), the ring buffers' lost events (`/metrics`), and the window's admissions with
//! their p99 (from the send to the whole answer). It prints the series; then, for each, the
//! least-squares slope per minute over the samples after the first minute (the warm-up), its
//! standard error, the spread of the residuals, and a verdict: "grows" when the slope is above
//! twice its standard error and the fitted rise over the run is larger than the spread, "flat"
//! otherwise. Then the totals and every WARN and ERROR line the agent logged (and any line that
//! is not JSON or has no textual `level`): those the setup or the load explains, named, apart
//! from the others. It exits 1 when the agent died, its RSS, anonymous memory or descriptors
//! grow, an admission or scrape failed, or it logged a WARN or ERROR that nothing explains; 130
//! when interrupted.
//!
//! `soak --agent PATH [--minutes M] [--rate R] [--connections C]` (defaults 10, 20000, 8).

use std::{
    collections::{BTreeMap, VecDeque},
    fs,
    io::{self, BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde_json::Value;

use hugepage_agent_tests::{
    BenchFlags, HostLock, HugepagePool, HugetlbController, MemoryPressure, Nested, Percentiles,
    TestCgroup, Toucher, free_port, fresh_state_dir, host_lock, peers::metric_sum, pod_cgroups,
    wait_ready, wait_timeout,
};

const USAGE: &str = "soak --agent PATH [--minutes M] [--rate R] [--connections C]";
const SAMPLE: Duration = Duration::from_secs(10);
const CYCLE: Duration = Duration::from_secs(30);
const BURST: Duration = Duration::from_secs(15);
const WARM_UP: Duration = Duration::from_secs(60);
const POOL_PAGES: u64 = 64;
const RESERVING_PODS: usize = 32;
/// The reserving pods whose cgroups the churn makes and removes.
const CHURNED_PODS: usize = RESERVING_PODS / 2;
const FAULTED_PAGES: usize = 8;
const TTL: &str = "5s";
const CONTAINER: &str = "50a50000000000000000000000000000000000000000000000000000000000c0";

/// Set by SIGINT, SIGTERM, the end of the run, or a worker that stops (a panic included).
static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that stopped the run, if one did.
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    SIGNALLED.store(signal, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM stop the run; the guards then restore the host as on any other exit.
fn catch_signals() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe { libc::signal(signal, handler as libc::sighandler_t) };
    }
}

fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Stops the run when dropped: a worker that returns or panics ends it for all.
struct EndsTheRun;

impl Drop for EndsTheRun {
    fn drop(&mut self) {
        STOP.store(true, Ordering::SeqCst);
    }
}

/// Sleeps until `until`; false when the run stopped first.
fn pause_until(until: Instant) -> bool {
    while !stopped() {
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(100)));
    }
    false
}

/// A pod UID of the soak: `k` in `0..RESERVING_PODS`.
fn pod_uid(k: usize) -> String {
    format!("50a50000-0000-4000-8000-{k:012x}")
}

// ---------------------------------------------------------------------------------------------
// HTTP

/// One kept-alive HTTP/1.1 connection to the agent, opened again when the agent closes it.
struct Client {
    port: u16,
    conn: Option<BufReader<TcpStream>>,
}

impl Client {
    fn new(port: u16) -> Client {
        Client { port, conn: None }
    }

    /// Sends `request` (a whole HTTP/1.1 request) and reads the answer: status and body. A
    /// kept-alive connection the agent has closed meanwhile is retried once on a new one.
    fn send(&mut self, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        let reused = self.conn.is_some();
        match self.try_send(request) {
            Err(_) if reused => self.try_send(request),
            answer => answer,
        }
    }

    fn try_send(&mut self, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => {
                let stream = TcpStream::connect(("127.0.0.1", self.port))?;
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(Duration::from_secs(10)))?;
                self.conn.insert(BufReader::new(stream))
            }
        };
        let answer = exchange(conn, request);
        if !matches!(answer, Ok((_, _, true))) {
            self.conn = None;
        }
        answer.map(|(status, body, _)| (status, body))
    }
}

fn refused(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Writes `request` and reads one answer: status, body, whether the connection stays open.
fn exchange(conn: &mut BufReader<TcpStream>, request: &[u8]) -> io::Result<(u16, Vec<u8>, bool)> {
    conn.get_mut().write_all(request)?;
    let mut line = String::new();
    if conn.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the agent closed the connection",
        ));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| refused(format!("status line {line:?}")))?;
    let (mut length, mut chunked, mut keep) = (None, false, true);
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(refused("the answer's headers end early".to_owned()));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "connection" => keep = !value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            conn.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| refused(format!("chunk size {line:?}")))?;
            // The chunk and its CRLF; after the last (empty) one, the final CRLF.
            let mut chunk = vec![0; size + 2];
            conn.read_exact(&mut chunk)?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        conn.read_exact(&mut body)?;
    } else {
        conn.read_to_end(&mut body)?;
        keep = false;
    }
    Ok((status, body, keep))
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn request(method: &str, path: &str) -> Vec<u8> {
    format!("{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n").into_bytes()
}

// ---------------------------------------------------------------------------------------------
// Admissions

/// The kinds of admission request the load sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A pod UID: admitted, and reserves 2 MiB.
    Reserving,
    /// 1 GiB of 2 MiB pages, more than the pool: refused.
    TooLarge,
    /// A whole `v1.Pod` with an init container.
    WholePod,
    /// The short form without a UID: admitted, nothing reserved.
    Short,
}

const KINDS: [Kind; 4] = [Kind::Reserving, Kind::TooLarge, Kind::WholePod, Kind::Short];

/// The kind of the `i`-th request: 1, 3, 1 and 15 of every 20.
fn kind_of(i: u64) -> Kind {
    match i % 20 {
        0 => Kind::Reserving,
        1..=3 => Kind::TooLarge,
        4 => Kind::WholePod,
        _ => Kind::Short,
    }
}

/// Every request the load sends, ready to write.
struct Requests {
    reserving: Vec<Vec<u8>>,
    too_large: Vec<u8>,
    whole_pod: Vec<u8>,
    short: Vec<u8>,
}

impl Requests {
    fn new() -> Requests {
        let short = |name: &str, uid: Option<&str>, huge: &str| {
            let uid = uid.map(|u| format!(",\"uid\":\"{u}\"")).unwrap_or_default();
            post(
                "/v1/admit",
                &format!(
                    r#"{{"pod":{{"namespace":"soak","name":"{name}"{uid}}},"containers":[{{"name":"app","resources":{{"hugepages-2Mi":"{huge}","memory":"64Mi"}}}},{{"name":"sidecar","resources":{{"memory":"16Mi"}}}}]}}"#
                ),
            )
        };
        let resources = |huge: &str, memory: &str| {
            format!(
                r#"{{"requests":{{"hugepages-2Mi":"{huge}","memory":"{memory}","cpu":"1"}},"limits":{{"hugepages-2Mi":"{huge}","memory":"{memory}","cpu":"1"}}}}"#
            )
        };
        let whole_pod = format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"namespace":"soak","name":"whole"}},"spec":{{"initContainers":[{{"name":"init","resources":{}}}],"containers":[{{"name":"app","resources":{}}}]}}}}"#,
            resources("2Mi", "16Mi"),
            resources("4Mi", "64Mi")
        );
        Requests {
            reserving: (0..RESERVING_PODS)
                .map(|k| short(&format!("reserving-{k}"), Some(&pod_uid(k)), "2Mi"))
                .collect(),
            too_large: short("too-large", None, "1Gi"),
            whole_pod: post("/v1/admit", &whole_pod),
            short: short("short", None, "2Mi"),
        }
    }

    /// The `i`-th request.
    fn get(&self, i: u64) -> (Kind, &[u8]) {
        let kind = kind_of(i);
        let bytes = match kind {
            Kind::Reserving => &self.reserving[(i / 20) as usize % RESERVING_PODS],
            Kind::TooLarge => &self.too_large,
            Kind::WholePod => &self.whole_pod,
            Kind::Short => &self.short,
        };
        (kind, bytes)
    }
}

/// Answers counted by kind: admitted, refused, failed (not a 200 verdict).
#[derive(Default)]
struct Tally {
    counts: [[AtomicU64; 3]; 4],
    /// The first failures, as they were.
    failures: Mutex<Vec<String>>,
}

impl Tally {
    fn count(&self, kind: Kind, answer: io::Result<(u16, Vec<u8>)>) {
        let slot = match &answer {
            Ok((200, body)) if contains(body, b"\"allowed\":true") => 0,
            Ok((200, body)) if contains(body, b"\"allowed\":false") => 1,
            _ => 2,
        };
        self.counts[kind as usize][slot].fetch_add(1, Ordering::Relaxed);
        if slot == 2 {
            let what = match answer {
                Ok((status, body)) => {
                    format!("{kind:?}: {status} {}", String::from_utf8_lossy(&body))
                }
                Err(e) => format!("{kind:?}: {e}"),
            };
            self.fail(what);
        }
    }

    fn fail(&self, what: String) {
        if let Ok(mut failures) = self.failures.lock()
            && failures.len() < 20
        {
            failures.push(what);
        }
    }

    fn get(&self, kind: Kind, slot: usize) -> u64 {
        self.counts[kind as usize][slot].load(Ordering::Relaxed)
    }

    fn answered(&self) -> u64 {
        KINDS
            .iter()
            .map(|&k| (0..3).map(|s| self.get(k, s)).sum::<u64>())
            .sum()
    }

    fn failed(&self) -> u64 {
        KINDS.iter().map(|&k| self.get(k, 2)).sum()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether `at` (since the start) is in a burst.
fn in_burst(at: Duration) -> bool {
    at.as_nanos() % CYCLE.as_nanos() < BURST.as_nanos()
}

/// Time spent in bursts within the first `elapsed` of the run.
fn burst_time(elapsed: Duration) -> Duration {
    let cycles = (elapsed.as_nanos() / CYCLE.as_nanos()) as u32;
    let rest = elapsed.saturating_sub(CYCLE * cycles);
    BURST * cycles + rest.min(BURST)
}

/// Shared by the connections of the load.
struct Load<'a> {
    port: u16,
    requests: &'a Requests,
    /// The next request's number (it picks the kind).
    next: AtomicU64,
    /// This sample window's latencies.
    window: Mutex<Vec<Duration>>,
    tally: Tally,
    started: Instant,
    /// Time between two requests on one connection during a burst.
    interval: Duration,
}

/// One connection of the load: requests at its share of the rate in bursts, nothing between.
fn admit(load: &Load<'_>) {
    let _ends = EndsTheRun;
    let mut client = Client::new(load.port);
    let mut due = Instant::now();
    while !stopped() {
        let now = Instant::now();
        let at = now - load.started;
        if !in_burst(at) {
            let into = Duration::from_nanos((at.as_nanos() % CYCLE.as_nanos()) as u64);
            if !pause_until(now + (CYCLE - into)) {
                break;
            }
            due = Instant::now();
            continue;
        }
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_secs(1) {
            due = now;
        }
        due += load.interval;
        let (kind, bytes) = load.requests.get(load.next.fetch_add(1, Ordering::Relaxed));
        let sent = Instant::now();
        let answer = client.send(bytes);
        let took = sent.elapsed();
        if let Ok(mut window) = load.window.lock() {
            window.push(took);
        }
        load.tally.count(kind, answer);
    }
}

// ---------------------------------------------------------------------------------------------
// The rest of the mix

/// Pod-shaped cgroups made and removed, 20 a second; how many were made.
fn churn(root: &TestCgroup) -> u64 {
    let _ends = EndsTheRun;
    let mut live: VecDeque<Nested> = VecDeque::new();
    let mut made = 0u64;
    let mut due = Instant::now();
    while pause_until(due) {
        due += Duration::from_millis(50);
        // The reserving pods 1 to 15: the first's cgroup is the toucher's, and the reservations
        // of the others (16 to 31) are left to expire.
        let k = 1 + made as usize % (CHURNED_PODS - 1);
        let qos = if made.is_multiple_of(2) {
            "kubepods/burstable"
        } else {
            "kubepods"
        };
        let pod = root.dir.join(qos).join(format!("pod{}", pod_uid(k)));
        fs::create_dir(&pod).unwrap_or_else(|e| panic!("mkdir {}: {e}", pod.display()));
        let mut dirs = Nested(vec![pod.clone()]);
        fs::write(pod.join("cgroup.subtree_control"), "+hugetlb")
            .unwrap_or_else(|e| panic!("enabling hugetlb in {}: {e}", pod.display()));
        let container = pod.join(format!("{made:064x}"));
        fs::create_dir(&container).unwrap_or_else(|e| panic!("mkdir {}: {e}", container.display()));
        dirs.0.push(container);
        live.push_back(dirs);
        if live.len() > 10 {
            live.pop_front();
        }
        made += 1;
    }
    made
}

/// The toucher faulting pages in `container` every 5 s, holding them 3 s; how many runs.
fn fault(toucher: &str, container: &Path) -> u64 {
    let _ends = EndsTheRun;
    let mut runs = 0;
    let mut due = Instant::now() + Duration::from_secs(2);
    while pause_until(due) {
        due += Duration::from_secs(5);
        let held = Toucher::run(toucher, Some(container), FAULTED_PAGES, 0);
        runs += 1;
        pause_until(Instant::now() + Duration::from_secs(3));
        drop(held);
    }
    runs
}

/// Memory pressure for 10 s of every minute; how many times.
fn pressure(lock: &HostLock) -> u64 {
    let _ends = EndsTheRun;
    let mut times = 0;
    let mut due = Instant::now() + Duration::from_secs(20);
    while pause_until(due) {
        due += Duration::from_secs(60);
        let reader = MemoryPressure::start(lock, "soak-psi");
        times += 1;
        pause_until(Instant::now() + Duration::from_secs(10));
        drop(reader);
    }
    times
}

/// What the scrapes did: scrapes, reservations deleted.
#[derive(Default)]
struct Scraped {
    scrapes: u64,
    deleted: u64,
}

/// `/metrics` and another read endpoint every 2 s, a reservation deleted every 30 s.
fn scrape(port: u16, tally: &Tally) -> Scraped {
    const OTHERS: [&str; 7] = [
        "/v1/hugepages",
        "/v1/consumers",
        "/v1/reservations",
        "/v1/conditions",
        "/v1/events",
        "/v1/kubelet",
        "/readyz",
    ];
    let _ends = EndsTheRun;
    let mut client = Client::new(port);
    let mut done = Scraped::default();
    let mut due = Instant::now();
    let mut round = 0usize;
    while pause_until(due) {
        due += Duration::from_secs(2);
        for path in ["/metrics", OTHERS[round % OTHERS.len()]] {
            match client.send(&request("GET", path)) {
                Ok((200, _)) => done.scrapes += 1,
                Ok((status, body)) => tally.fail(format!(
                    "GET {path}: {status} {}",
                    String::from_utf8_lossy(&body)
                )),
                Err(e) => tally.fail(format!("GET {path}: {e}")),
            }
        }
        // 6 s into a burst (a cycle is 15 rounds), when there are reservations to delete.
        if round % 15 == 3
            && let Some(id) = first_reservation(&mut client)
        {
            let path = format!("/v1/reservations/{id}");
            match client.send(&request("DELETE", &path)) {
                Ok((200, _)) => done.deleted += 1,
                // It ended meanwhile (expired, faulted, its pod removed).
                Ok((404, _)) => {}
                Ok((status, body)) => tally.fail(format!(
                    "DELETE {path}: {status} {}",
                    String::from_utf8_lossy(&body)
                )),
                Err(e) => tally.fail(format!("DELETE {path}: {e}")),
            }
        }
        round += 1;
    }
    done
}

fn first_reservation(client: &mut Client) -> Option<String> {
    let (_, body) = client.send(&request("GET", "/v1/reservations")).ok()?;
    let listed: Value = serde_json::from_slice(&body).ok()?;
    Some(listed["reservations"].get(0)?["id"].as_str()?.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The agent and its log

/// The agent; killed if the soak ends without stopping it.
struct SoakAgent {
    child: Child,
}

impl SoakAgent {
    /// The exit status if it has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM and the wait; the status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        if let Some(status) = self.exited() {
            return status;
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        wait_timeout(&mut self.child, Duration::from_secs(15))
    }
}

impl Drop for SoakAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent's log as the soak keeps it: lines counted by level, the WARN and ERROR lines, the
/// last lines, and the map's source from "agent running".
#[derive(Default)]
struct LogSummary {
    levels: BTreeMap<String, u64>,
    warnings: Vec<Value>,
    /// WARN and ERROR lines beyond those kept.
    more_warnings: u64,
    tail: VecDeque<String>,
    source: Option<String>,
}

const WARNINGS_KEPT: usize = 10_000;

/// Follows the agent's stderr (JSON lines) until it closes.
fn follow(stderr: ChildStderr, summary: Arc<Mutex<LogSummary>>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let value: Value = serde_json::from_str(&line).unwrap_or(Value::String(line.clone()));
            let level = match (&value, value["level"].as_str()) {
                (Value::String(_), _) => "(not JSON)",
                (_, Some(level)) => level,
                (_, None) => "(no level)",
            }
            .to_owned();
            let Ok(mut s) = summary.lock() else { return };
            if value["message"] == "agent running" {
                s.source = value["source"].as_str().map(str::to_owned);
            }
            if !matches!(level.as_str(), "TRACE" | "DEBUG" | "INFO") {
                if s.warnings.len() < WARNINGS_KEPT {
                    s.warnings.push(value);
                } else {
                    s.more_warnings += 1;
                }
            }
            *s.levels.entry(level).or_default() += 1;
            s.tail.push_back(line);
            if s.tail.len() > 20 {
                s.tail.pop_front();
            }
        }
    })
}

/// A WARN or ERROR line the setup or the load explains: its name, and how to know one.
struct Explained {
    name: &'static str,
    matches: fn(&Value) -> bool,
}

fn reason(line: &Value) -> &str {
    line["reason"].as_str().unwrap_or_default()
}

/// The WARN and ERROR lines the soak causes on purpose, or this machine's set-up does.
const EXPLAINED: [Explained; 2] = [
    Explained {
        name: "PSI warning events from the soak's memory pressure (High…/NodeHas…ContentionPressure)",
        matches: |l| {
            let r = reason(l);
            l["level"] == "WARN"
                && r.ends_with("ContentionPressure")
                && (r.starts_with("High") || r.starts_with("NodeHas"))
        },
    },
    Explained {
        name: "the pods' PSI scope is unavailable: this machine has no kubepods cgroup (no kubelet)",
        matches: |l| l["level"] == "WARN" && reason(l) == "PressureUnavailable",
    },
];

/// The name of what explains `line`, if anything does.
fn explain(line: &Value) -> Option<&'static str> {
    EXPLAINED.iter().find(|e| (e.matches)(line)).map(|e| e.name)
}

// ---------------------------------------------------------------------------------------------
// Samples and slopes

/// One 10 s sample.
struct Sample {
    at: Duration,
    rss_kib: u64,
    /// The anonymous part of the RSS (the heap, the arenas, the stacks): what a leak grows.
    anon_kib: u64,
    fds: u64,
    threads: u64,
    lost: f64,
    admissions: usize,
    p99: Option<Duration>,
    load1: String,
}

fn status_field(pid: u32, name: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A least-squares line through a series, and whether it says the series grows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit {
    /// Per minute.
    slope: f64,
    /// The slope's standard error, per minute.
    se: f64,
    /// Largest residual minus smallest: the series' noise about the line.
    spread: f64,
    /// The line's rise from the first point to the last.
    rise: f64,
    grows: bool,
}

/// The fit of `points` (minutes, value); `None` for fewer than three points.
fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let tm = points.iter().map(|p| p.0).sum::<f64>() / nf;
    let ym = points.iter().map(|p| p.1).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.0 - tm).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - tm) * (p.1 - ym)).sum();
    let slope = sxy / sxx;
    let residuals: Vec<f64> = points
        .iter()
        .map(|p| p.1 - (ym + slope * (p.0 - tm)))
        .collect();
    let se = (residuals.iter().map(|r| r * r).sum::<f64>() / (nf - 2.0) / sxx).sqrt();
    let spread = residuals.iter().copied().fold(f64::MIN, f64::max)
        - residuals.iter().copied().fold(f64::MAX, f64::min);
    let rise = slope * (points[n - 1].0 - points[0].0);
    Some(Fit {
        slope,
        se,
        spread,
        rise,
        grows: slope > 2.0 * se && rise > spread,
    })
}

// ---------------------------------------------------------------------------------------------

struct Args {
    agent: PathBuf,
    minutes: u64,
    rate: u64,
    connections: u64,
}

fn main() {
    let flags = BenchFlags::parse(USAGE, &["--agent", "--minutes", "--rate", "--connections"]);
    let args = Args {
        agent: flags.path("--agent"),
        minutes: flags.number("--minutes", 10),
        rate: flags.number("--rate", 20_000),
        connections: flags.number("--connections", 8),
    };
    catch_signals();
    let code = soak(&args);
    std::process::exit(code);
}

/// The whole soak; the exit code. Every guard is dropped (the host restored) before it returns.
fn soak(args: &Args) -> i32 {
    let toucher = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("toucher")))
        .filter(|t| t.exists())
        .expect("the toucher binary beside this one (cargo xtask bench builds both)");
    let toucher = toucher.to_string_lossy().into_owned();
    eprintln!("waiting for the tests' host lock");
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, POOL_PAGES);
    let _controller = HugetlbController::enable(&lock);
    let root = TestCgroup::create(&lock, "soak");
    let first_pod = format!("pod{}", pod_uid(0));
    let (_pods, container) = pod_cgroups(&root, &["kubepods", "burstable", &first_pod, CONTAINER]);
    let state = fresh_state_dir(0);
    let port = free_port();
    let mut child = Command::new(&args.agent)
        .args(["run", "--ebpf", "on", "--host-root", "/"])
        .args(["--reservation-ttl", TTL])
        .args(["--psi-memory-threshold", "1", "--psi-interval", "1s"])
        .args([
            "--log-format",
            "json",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--state-dir")
        .arg(state.path())
        .env("HUGEPAGE_AGENT_MEMORY_MANAGER_POLICY", "Static")
        .env("HUGEPAGE_AGENT_TOPOLOGY_POLICY", "single-numa-node")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", args.agent.display()));
    let stderr = child.stderr.take().expect("the agent's stderr");
    let mut agent = SoakAgent { child };
    let summary = Arc::new(Mutex::new(LogSummary::default()));
    let follower = follow(stderr, Arc::clone(&summary));
    let pid = agent.child.id();
    let ready = wait_ready(port, Duration::from_secs(30));
    let source = summary.lock().ok().and_then(|s| s.source.clone());
    if ready.is_none() || source.as_deref() != Some("ebpf+sysfs") {
        let status = agent.terminate();
        let _ = follower.join();
        let tail = summary.lock().map(|s| s.tail.clone()).unwrap_or_default();
        eprintln!(
            "the agent did not start on eBPF (ready: {}, source {source:?}, {status}); its last lines:",
            ready.is_some()
        );
        for line in tail {
            eprintln!("  {line}");
        }
        return 1;
    }
    println!(
        "soak: {} min, admissions at up to {} req/s over {} connections ({} s bursts every {} s), agent pid {pid} on 127.0.0.1:{port}, eBPF ({})",
        args.minutes,
        args.rate,
        args.connections,
        BURST.as_secs(),
        CYCLE.as_secs(),
        source.unwrap_or_default()
    );
    println!("load average at the start: {}", loadavg());

    let requests = Requests::new();
    let load = Load {
        port,
        requests: &requests,
        next: AtomicU64::new(0),
        window: Mutex::new(Vec::new()),
        tally: Tally::default(),
        started: Instant::now(),
        interval: Duration::from_secs_f64(args.connections as f64 / args.rate as f64),
    };
    let duration = Duration::from_secs(args.minutes * 60);
    let mut samples = Vec::new();
    let mut died = None;
    let (churned, touched, pressured, scraped) = std::thread::scope(|s| {
        let _ends = EndsTheRun;
        for _ in 0..args.connections {
            s.spawn(|| admit(&load));
        }
        let churner = s.spawn(|| churn(&root));
        let faulter = s.spawn(|| fault(&toucher, &container));
        let presser = s.spawn(|| pressure(&lock));
        let scraper = s.spawn(|| scrape(port, &load.tally));
        println!(
            "{:>6} {:>9} {:>9} {:>5} {:>8} {:>6} {:>11} {:>9}   load",
            "time", "RSS MiB", "anon MiB", "fds", "threads", "lost", "admissions", "p99 ms"
        );
        let mut metrics = Client::new(port);
        let mut due = load.started + SAMPLE;
        while pause_until(due) {
            due += SAMPLE;
            if let Some(status) = agent.exited() {
                died = Some(status);
                break;
            }
            let (rss_kib, anon_kib, fds, threads) = (
                status_field(pid, "VmRSS:"),
                status_field(pid, "RssAnon:"),
                open_fds(pid),
                status_field(pid, "Threads:"),
            );
            let lost = match metrics.send(&request("GET", "/metrics")) {
                Ok((200, body)) => metric_sum(
                    &String::from_utf8_lossy(&body),
                    "hugepage_agent_ring_buffer_lost_events_total",
                ),
                _ => f64::NAN,
            };
            let mut window = load
                .window
                .lock()
                .map(|mut w| std::mem::take(&mut *w))
                .unwrap_or_default();
            let sample = Sample {
                at: load.started.elapsed(),
                rss_kib,
                anon_kib,
                fds,
                threads,
                lost,
                admissions: window.len(),
                p99: (!window.is_empty()).then(|| Percentiles::of(&mut window).p99),
                load1: loadavg(),
            };
            println!(
                "{:>3}:{:02} {:>9.2} {:>9.2} {:>5} {:>8} {:>6} {:>11} {:>9}   {}",
                sample.at.as_secs() / 60,
                sample.at.as_secs() % 60,
                sample.rss_kib as f64 / 1024.0,
                sample.anon_kib as f64 / 1024.0,
                sample.fds,
                sample.threads,
                sample.lost,
                sample.admissions,
                sample
                    .p99
                    .map_or("-".to_owned(), |p| format!("{:.3}", p.as_secs_f64() * 1e3)),
                sample.load1
            );
            samples.push(sample);
            if load.started.elapsed() >= duration {
                break;
            }
        }
        STOP.store(true, Ordering::SeqCst);
        let join = |what: &str, handle: std::thread::ScopedJoinHandle<'_, u64>| {
            handle
                .join()
                .unwrap_or_else(|_| panic!("the {what} stopped"))
        };
        (
            join("cgroup churn", churner),
            join("toucher", faulter),
            join("memory pressure", presser),
            scraper.join().expect("the scrapes stopped"),
        )
    });
    let ran = load.started.elapsed();
    let final_metrics = Client::new(port)
        .send(&request("GET", "/metrics"))
        .map(|(_, body)| String::from_utf8_lossy(&body).into_owned())
        .unwrap_or_default();
    let status = died.unwrap_or_else(|| agent.terminate());
    let _ = follower.join();
    let summary = summary
        .lock()
        .map(|mut s| std::mem::take(&mut *s))
        .unwrap_or_default();
    let report = Report {
        args,
        ran,
        samples: &samples,
        tally: &load.tally,
        summary: &summary,
        final_metrics: &final_metrics,
        churned,
        touched,
        pressured,
        scraped,
    };
    let mut failed = report.print();
    match died {
        Some(status) => {
            println!("FAIL: the agent died during the run: {status}; its last lines:");
            for line in &summary.tail {
                println!("  {line}");
            }
            failed = true;
        }
        None => println!("agent stopped on SIGTERM: {status}"),
    }
    println!("load average at the end: {}", loadavg());
    match SIGNALLED.load(Ordering::SeqCst) {
        0 if failed => 1,
        0 => 0,
        signal => {
            println!(
                "interrupted by signal {signal}: the host is restored, the figures cover what ran"
            );
            130
        }
    }
}

/// Everything the soak prints at the end.
struct Report<'a> {
    args: &'a Args,
    ran: Duration,
    samples: &'a [Sample],
    tally: &'a Tally,
    summary: &'a LogSummary,
    final_metrics: &'a str,
    churned: u64,
    touched: u64,
    pressured: u64,
    scraped: Scraped,
}

/// The sum of `name`'s series whose labels include `label` (`reason="expired"`).
fn metric_with(exposition: &str, name: &str, label: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Report<'_> {
    /// Prints the report; whether anything in it fails the soak.
    fn print(&self) -> bool {
        let mut failed = false;
        let fitted: Vec<&Sample> = self.samples.iter().filter(|s| s.at >= WARM_UP).collect();
        println!();
        println!(
            "slopes over {} samples after the first {} s (least squares, per minute):",
            fitted.len(),
            WARM_UP.as_secs()
        );
        println!(
            "{:<14} {:>12} {:>12} {:>12} {:>12}  verdict",
            "series", "slope/min", "std error", "spread", "rise"
        );
        type Series = (&'static str, bool, fn(&Sample) -> Option<f64>);
        let series: [Series; 7] = [
            ("RSS KiB", true, |s| Some(s.rss_kib as f64)),
            ("anon KiB", true, |s| Some(s.anon_kib as f64)),
            ("fds", true, |s| Some(s.fds as f64)),
            ("threads", false, |s| Some(s.threads as f64)),
            ("lost events", false, |s| {
                Some(s.lost).filter(|l| l.is_finite())
            }),
            ("p99 ms", false, |s| s.p99.map(|p| p.as_secs_f64() * 1e3)),
            ("admissions", false, |s| Some(s.admissions as f64)),
        ];
        for (name, must_be_flat, value) in series {
            let points: Vec<(f64, f64)> = fitted
                .iter()
                .filter_map(|s| Some((s.at.as_secs_f64() / 60.0, value(s)?)))
                .collect();
            match fit(&points) {
                Some(f) => {
                    let verdict = if f.grows { "grows" } else { "flat" };
                    println!(
                        "{name:<14} {:>12.3} {:>12.3} {:>12.3} {:>12.3}  {verdict}",
                        f.slope, f.se, f.spread, f.rise
                    );
                    if must_be_flat && f.grows {
                        println!("FAIL: the agent's {name} grows");
                        failed = true;
                    }
                }
                None => println!("{name:<14} too few samples to fit"),
            }
        }
        let answered = self.tally.answered();
        let bursts = burst_time(self.ran);
        println!();
        println!(
            "admissions: {answered} in {:.0} s ({:.0} s of bursts): {:.0} req/s achieved in the bursts, {} offered at most (target of the issue: 10^6 in all, {})",
            self.ran.as_secs_f64(),
            bursts.as_secs_f64(),
            answered as f64 / bursts.as_secs_f64().max(1e-9),
            self.args.rate,
            if answered >= 1_000_000 {
                "reached"
            } else {
                "not reached"
            }
        );
        println!(
            "{:<10} {:>10} {:>10} {:>8}",
            "kind", "admitted", "refused", "failed"
        );
        for kind in KINDS {
            println!(
                "{:<10} {:>10} {:>10} {:>8}",
                format!("{kind:?}"),
                self.tally.get(kind, 0),
                self.tally.get(kind, 1),
                self.tally.get(kind, 2)
            );
        }
        let m = |name: &str, label: &str| metric_with(self.final_metrics, name, label);
        let ended = "hugepage_agent_reservations_ended_total";
        println!(
            "reservations: {} made; ended: {} faulted, {} pod_removed, {} expired, {} deleted",
            metric_sum(self.final_metrics, "hugepage_agent_reservations_made_total"),
            m(ended, "reason=\"faulted\""),
            m(ended, "reason=\"pod_removed\""),
            m(ended, "reason=\"expired\""),
            m(ended, "reason=\"deleted\"")
        );
        let events = "hugepage_agent_cgroup_events_total";
        println!(
            "the rest of the mix: {} pod cgroups churned (agent saw {} mkdir, {} rmdir), {} toucher runs ({} hugetlb faults seen), {} memory-pressure spells, {} scrapes, {} reservations deleted by the scrapes",
            self.churned,
            m(events, "event=\"mkdir\""),
            m(events, "event=\"rmdir\""),
            self.touched,
            metric_sum(self.final_metrics, "hugepage_agent_hugetlb_faults_total"),
            self.pressured,
            self.scraped.scrapes,
            self.scraped.deleted
        );
        let failures = self.tally.failed();
        let other = self
            .tally
            .failures
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default();
        if !other.is_empty() {
            println!("FAIL: {failures} admission(s) and some scrapes failed; the first:");
            for f in &other {
                println!("  {f}");
            }
            failed = true;
        }
        println!();
        println!("agent log lines by level: {:?}", self.summary.levels);
        let mut explained: BTreeMap<&str, (u64, &Value)> = BTreeMap::new();
        let mut unexplained = Vec::new();
        for line in &self.summary.warnings {
            match explain(line) {
                Some(name) => explained.entry(name).or_insert((0, line)).0 += 1,
                None => unexplained.push(line),
            }
        }
        println!("WARN/ERROR lines the setup or the load explains:");
        for (name, (count, example)) in &explained {
            println!("  {count:>6} x {name}\n         e.g. {example}");
        }
        if explained.is_empty() {
            println!("  none");
        }
        if unexplained.is_empty() && self.summary.more_warnings == 0 {
            println!("WARN/ERROR lines nothing explains: none");
        } else {
            println!(
                "FAIL: WARN/ERROR lines nothing explains: {} (and {} not kept):",
                unexplained.len(),
                self.summary.more_warnings
            );
            for line in unexplained.iter().take(50) {
                println!("  {line}");
            }
            failed = true;
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_straight_rise_grows_and_noise_about_a_level_is_flat() {
        let rising: Vec<(f64, f64)> = (0..20)
            .map(|i| (i as f64, 100.0 + 3.0 * i as f64))
            .collect();
        let f = fit(&rising).expect("a fit");
        assert!((f.slope - 3.0).abs() < 1e-9 && f.grows, "{f:?}");
        let level: Vec<(f64, f64)> = (0..20)
            .map(|i| (i as f64, 100.0 + if i % 2 == 0 { 2.0 } else { -2.0 }))
            .collect();
        assert!(!fit(&level).expect("a fit").grows);
        let constant: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 7.0)).collect();
        let f = fit(&constant).expect("a fit");
        assert_eq!((f.slope, f.se, f.grows), (0.0, 0.0, false));
        let falling: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 50.0 - i as f64)).collect();
        assert!(
            !fit(&falling).expect("a fit").grows,
            "shrinking is not growing"
        );
        assert!(
            fit(&rising[..2]).is_none(),
            "two points say nothing of noise"
        );
    }

    #[test]
    fn a_small_rise_within_the_noise_is_flat() {
        // 0.1 a minute over 10 minutes, under a sawtooth of amplitude 5: the rise (1) is inside
        // the spread, so it is not called growth however steady it is.
        let points: Vec<(f64, f64)> = (0..60)
            .map(|i| {
                let t = i as f64 / 6.0;
                (t, 1000.0 + 0.1 * t + if i % 3 == 0 { 5.0 } else { 0.0 })
            })
            .collect();
        assert!(!fit(&points).expect("a fit").grows);
    }

    #[test]
    fn the_mix_and_the_bursts() {
        let kinds: Vec<Kind> = (0..20).map(kind_of).collect();
        let count = |k: Kind| kinds.iter().filter(|&&x| x == k).count();
        assert_eq!(
            [Kind::Reserving, Kind::TooLarge, Kind::WholePod, Kind::Short].map(count),
            [1, 3, 1, 15]
        );
        let requests = Requests::new();
        assert_ne!(requests.get(0).1, requests.get(20).1, "the UIDs rotate");
        assert_eq!(
            requests.get(0).1,
            requests.get(20 * RESERVING_PODS as u64).1
        );
        assert!(in_burst(Duration::from_secs(14)) && !in_burst(Duration::from_secs(15)));
        assert!(in_burst(Duration::from_secs(31)));
        assert_eq!(burst_time(Duration::from_secs(70)), Duration::from_secs(40));
        assert_eq!(burst_time(Duration::from_secs(50)), Duration::from_secs(30));
    }

    #[test]
    fn psi_events_and_the_missing_kubepods_scope_are_explained_and_nothing_else() {
        let line = |level: &str, reason: &str| serde_json::json!({"level": level, "reason": reason, "message": "m"});
        assert!(explain(&line("WARN", "HighMemoryContentionPressure")).is_some());
        assert!(explain(&line("WARN", "NodeHasSystemMemoryContentionPressure")).is_some());
        assert!(explain(&line("WARN", "PressureUnavailable")).is_some());
        assert!(explain(&line("ERROR", "HighMemoryContentionPressure")).is_none());
        assert!(explain(&line("WARN", "")).is_none());
        assert!(
            explain(
                &serde_json::json!({"level": "WARN", "message": "rescanning pod cgroups: gone"})
            )
            .is_none()
        );
    }

    #[test]
    fn answers_are_read_by_length_and_in_chunks() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).expect("read");
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                .expect("write");
            let _ = s.read(&mut buf).expect("read");
            s.write_all(b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
                .expect("write");
        });
        let mut client = Client::new(port);
        assert_eq!(
            client.send(&request("GET", "/a")).expect("first"),
            (200, b"hello".to_vec())
        );
        assert_eq!(
            client
                .send(&request("GET", "/b"))
                .expect("second, same connection"),
            (404, b"abcde".to_vec())
        );
        server.join().expect("server");
    }
}
