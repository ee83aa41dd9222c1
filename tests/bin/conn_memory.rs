//! `cargo xtask bench conn-memory`: what one idle watched agent connection costs the webhook's
//! memory, in two client designs, against the real agent (issue #39: one long-lived watch per
//! node's agent, `GET /v1/hugepages?watch=true`, mTLS, one JSON event a line, a heartbeat every
//! 5 s; the target is the webhook's peak RSS ≤ 100 MB at 5,000 agents).
//!
//! * `http1`, the webhook's own client as shipped: [`stream::run`] itself, which dials each
//!   agent with [`hugepage_agent::webhook::dial`] (one TLS connection per agent), sends the watch
//!   over HTTP/1.1 and reads the chunked body with its own reader, each state put in the
//!   webhook's [`Table`].
//! * `h2`, hyper 1's HTTP/2 client: the same dial and the same client config (the webhook's,
//!   [`Client::tls_config`]) with ALPN `h2` only, then `hyper::client::conn::http2::handshake`
//!   with `TokioExecutor` and `TokioIo` (hyper's defaults), one connection per agent, the same
//!   watch sent on it and its body polled frame by frame, each state put in the same table. The
//!   connection's `SendRequest` is kept: the authoritative calls would share the connection.
//!
//! Each (design, N) runs in a process of its own (this binary again, with `--child`), so that
//! what one design left in the allocator is not counted in the other's. That process is set up
//! as the webhook's: transparent huge pages off and one malloc arena
//! ([`hugepage_agent::footprint`]), a current-thread runtime, the webhook's metrics, its agent
//! client built from the run's certificates, and its Node cache synced by list+watch from the
//! stand-in API server of `tests/apiserver.rs` (in the parent process), which holds N Nodes whose
//! `InternalIP`s are spread over `127.0.0.0/8`. Once the cache has synced it reads VmRSS and
//! VmHWM of `/proc/self/status` (*before*) and resets the peak (`clear_refs`), opens the N
//! streams (spread over [`START_SPREAD`], as the webhook does), waits until every node's first
//! SNAPSHOT is in the table, then `--settle` (default 10 s: two heartbeats), and reads them
//! again (*after*; the peak is the highest since *before*). Per stream is (after − before) / N.
//! It prints a table of both, then the streams of the largest N scaled to 5,000 agents with the
//! webhook's other memory there (about 25 MB, `extender-load --mode streamed`) against 100 MB.
//!
//! One release agent on `0.0.0.0` answers every address, as in `extender-load`: `--ebpf off`
//! over a generated host tree, TLS requiring client certificates, `--max-watchers` and
//! `--max-connections` above N, `--watch-max-duration 1h` so that no watch ends and reconnects
//! while measured. Before the runs it is asked, over one TLS connection offering `h2` and
//! `http/1.1`, which it chooses: an agent that does not choose `h2` cannot serve the `h2`
//! design, which is then not run and says so (`--agent PATH` names another agent binary; flags
//! after `--` come after xtask's and win). The agent's API offers HTTP/1.1 only today
//! (`tls::Alpn::Http1` in `run.rs`; its listener serves HTTP/2 where ALPN chose it). Nothing on the host is changed but this process's soft
//! limit of open files, raised as `extender-load` raises it, which the agent and the children
//! inherit.
//!
//! `conn-memory --agent PATH [--streams N,N,...] [--design both|http1|h2] [--settle S]
//! [--api-threads T]` (defaults 1000,5000; both; 10; 2).

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http_body_util::{BodyExt, Empty};
use hugepage_agent::{
    footprint,
    telemetry::encode::Format,
    tls::SERVER_NAME,
    webhook::{
        agent_tls::AgentCertificates,
        agents::{Client, ClientFiles},
        cache::NodeCache,
        dial::dial,
        identity::Names,
        kubeapi,
        metrics::Metrics,
        stream::{self, Event, MAX_EVENT, START_SPREAD},
        table::Table,
    },
};
use hugepage_agent_tests::{
    BenchFlags, Footprint,
    apiserver::StandInApiServer,
    cluster::{self, Pki, host_tree, node},
    free_port,
    mtls::{self, Connection, Versions},
    raise_open_files,
};
use hyper::{Request, body::Bytes, client::conn::http2, header::ACCEPT};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use serde::{Deserialize, Serialize};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

const USAGE: &str = "conn-memory --agent PATH [--streams N,N,...] [--design both|http1|h2] [--settle S] [--api-threads T]";

/// Every flag, the parent's and the child's.
const FLAGS: &[&str] = &[
    "--agent",
    "--streams",
    "--design",
    "--settle",
    "--api-threads",
    "--child",
    "--agent-port",
    "--pki",
    "--kubeconfig",
];

/// The line of a child's stdout that carries its figures.
const FIGURES: &str = "conn-memory figures:";
/// The webhook's default `--stream-fresh-within`.
const FRESH_WITHIN: Duration = Duration::from_secs(10);
/// How long the Node cache may take to sync, and the streams to bring every first SNAPSHOT.
const SYNC_WITHIN: Duration = Duration::from_secs(120);
const OPEN_WITHIN: Duration = Duration::from_secs(300);
/// The webhook's count of ended streams.
const ENDS: &str = "hugepage_agent_webhook_stream_ends_total";
/// The memory target of issue #39, and the webhook's other memory at 5,000 nodes (its Node
/// cache and the rest, from `extender-load --mode streamed`), for the projection printed.
const TARGET_MB: f64 = 100.0;
const OTHER_MB: f64 = 25.0;
const TARGET_AGENTS: f64 = 5000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Design {
    Http1,
    H2,
}

impl Design {
    fn flag(self) -> &'static str {
        match self {
            Design::Http1 => "http1",
            Design::H2 => "h2",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Design::Http1 => "(a) HTTP/1.1, webhook::stream",
            Design::H2 => "(b) hyper HTTP/2 client",
        }
    }
}

/// What one child measured.
#[derive(Debug, Serialize, Deserialize)]
struct Figures {
    streams: usize,
    /// Nodes fresh in the table when *after* was read.
    fresh: usize,
    /// Streams that ended while measured (the webhook's count for `http1`).
    ended: usize,
    before_rss_kib: u64,
    before_peak_kib: u64,
    /// When the last first SNAPSHOT was in.
    fresh_rss_kib: u64,
    after_rss_kib: u64,
    /// The highest since *before* (VmHWM reset there).
    after_peak_kib: u64,
    opened_ms: u64,
}

fn main() {
    let flags = BenchFlags::parse(USAGE, FLAGS);
    match flags.choice("--child", &["none", "http1", "h2"]) {
        "http1" => child(&flags, Design::Http1),
        "h2" => child(&flags, Design::H2),
        _ => parent(&flags),
    }
}

/// The `i`th of `of` addresses spread evenly over `127.0.0.0/8` (never `.0.0.0` nor the
/// broadcast address), as `extender-load` spreads its Nodes.
fn spread(i: usize, of: usize) -> Ipv4Addr {
    let stride = ((1u32 << 24) - 2) / of.max(1) as u32;
    Ipv4Addr::from(0x7f00_0000 | (1 + i as u32 * stride))
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The protocol the agent on 127.0.0.1:`port` chooses when a client offers `h2` and `http/1.1`.
fn chosen_protocol(pki: &Pki, port: u16) -> String {
    let mut config =
        (*mtls::client_config(&[&pki.agents], Some(&pki.client), Versions::Any)).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    match Connection::open(port, Arc::new(config)) {
        Ok(connection) => connection.alpn().map_or_else(
            || "none".to_owned(),
            |p| String::from_utf8_lossy(&p).into_owned(),
        ),
        Err(e) => format!("no connection ({e})"),
    }
}

fn parent(flags: &BenchFlags) {
    let agent_bin = flags.path("--agent");
    let counts: Vec<usize> = flags
        .numbers("--streams", &[1000, 5000])
        .into_iter()
        .map(|n| n as usize)
        .collect();
    let designs = match flags.choice("--design", &["both", "http1", "h2"]) {
        "http1" => vec![Design::Http1],
        "h2" => vec![Design::H2],
        _ => vec![Design::Http1, Design::H2],
    };
    let settle = flags.number("--settle", 10);
    let threads = flags.number("--api-threads", 2).to_string();
    let largest = counts.iter().copied().max().unwrap_or(0);
    println!("{}", raise_open_files(largest as u64 + 1024));

    let pki = Pki::new();
    let tree = host_tree(2048);
    let port = free_port();
    let mut cmd = cluster::tree_agent_command(&agent_bin, &pki, tree.path(), &[]);
    cmd.args(cluster::watched_by(largest, &threads))
        .args(["--watch-max-duration", "1h"]);
    let agent = cluster::start_agent(cmd, Ipv4Addr::UNSPECIFIED, port, |_| true);
    let protocol = chosen_protocol(&pki, port);
    let speaks_h2 = protocol == "h2";
    println!(
        "one agent ({}) on 0.0.0.0:{port} (--api-threads {threads}) answers every Node's InternalIP; offered h2 and http/1.1 over TLS, it chose: {protocol}",
        agent_bin.display()
    );
    if !speaks_h2 && designs.contains(&Design::H2) {
        println!(
            "the agent does not choose h2 on its API port: the h2 design is not run (it needs an agent that offers h2; --agent PATH runs another)"
        );
    }
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(e) => {
            eprintln!("conn-memory: this binary's path: {e}");
            std::process::exit(1);
        }
    };

    let mut results: Vec<(Design, usize, Result<Figures, String>)> = Vec::new();
    for &n in &counts {
        let api = StandInApiServer::start();
        for i in 0..n {
            api.put_node(node(&format!("node-{i:04}"), spread(i, n), "8Gi"));
        }
        let dir = tempfile::tempdir().expect("a directory for the kubeconfig");
        let kubeconfig = api.kubeconfig(dir.path());
        for &design in &designs {
            if design == Design::H2 && !speaks_h2 {
                results.push((
                    design,
                    n,
                    Err(format!("not run: the agent chose {protocol}")),
                ));
                continue;
            }
            println!("{}, {n} streams: a process of its own", design.label());
            let mut run = Command::new(&me);
            run.args(["--child", design.flag()])
                .args(["--streams", &n.to_string()])
                .args(["--agent-port", &port.to_string()])
                .arg("--pki")
                .arg(pki.dir.path())
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["--settle", &settle.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            let figures = run
                .output()
                .map_err(|e| format!("cannot run {}: {e}", me.display()))
                .and_then(|out| {
                    let text = String::from_utf8_lossy(&out.stdout);
                    text.lines()
                        .find_map(|l| l.strip_prefix(FIGURES))
                        .ok_or_else(|| format!("no figures ({})", out.status))
                        .and_then(|json| {
                            serde_json::from_str::<Figures>(json).map_err(|e| e.to_string())
                        })
                });
            if let Ok(f) = &figures {
                println!("  {}", line(design, f));
            }
            results.push((design, n, figures));
        }
    }
    drop(agent);

    println!("\n{}", header());
    for (design, n, figures) in &results {
        match figures {
            Ok(f) => println!("{}", line(*design, f)),
            Err(e) => println!("{:<30} {n:>7}  {e}", design.label()),
        }
    }
    println!(
        "\nat 5,000 agents, each stream as measured at the largest N, with the webhook's other memory ({OTHER_MB} MB):"
    );
    for &design in &designs {
        let at_largest = results
            .iter()
            .filter(|(d, _, _)| *d == design)
            .filter_map(|(_, _, f)| f.as_ref().ok())
            .max_by_key(|f| f.streams);
        if let Some(f) = at_largest {
            let settled = per_stream_kib(f.after_rss_kib, f) * TARGET_AGENTS / 1024.0;
            let peak = per_stream_kib(f.after_peak_kib, f) * TARGET_AGENTS / 1024.0;
            let total = peak + OTHER_MB;
            let met = if total <= TARGET_MB { "met" } else { "missed" };
            println!(
                "{:<30} streams {settled:.1} MB settled, {peak:.1} MB at their peak; peak + {OTHER_MB} = {total:.1} MB: <= {TARGET_MB} MB {met}",
                design.label()
            );
        }
    }
}

/// The table's two header lines, in the columns of [`line`].
fn header() -> String {
    let row = |cells: [&str; 11]| {
        format!(
            "{:<30} {:>7} {:>6} {:>5} {:>11} {:>9} {:>10} {:>8} {:>15} {:>12} {:>12}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10]
        )
    };
    let first = row([
        "design",
        "streams",
        "fresh",
        "ended",
        "before RSS",
        "at fresh",
        "after RSS",
        "peak",
        "per stream",
        "peak/stream",
        "all fresh",
    ]);
    let second = row(["", "", "", "", "MB", "MB", "MB", "MB", "KiB", "KiB", "in"]);
    format!("{first}\n{second}")
}

fn per_stream_kib(kib: u64, f: &Figures) -> f64 {
    (kib as f64 - f.before_rss_kib as f64) / f.streams.max(1) as f64
}

fn line(design: Design, f: &Figures) -> String {
    format!(
        "{:<30} {:>7} {:>6} {:>5} {:>11.1} {:>9.1} {:>10.1} {:>8.1} {:>15.1} {:>12.1} {:>10.1} s",
        design.label(),
        f.streams,
        f.fresh,
        f.ended,
        mb(f.before_rss_kib),
        mb(f.fresh_rss_kib),
        mb(f.after_rss_kib),
        mb(f.after_peak_kib),
        per_stream_kib(f.after_rss_kib, f),
        per_stream_kib(f.after_peak_kib, f),
        f.opened_ms as f64 / 1000.0
    )
}

/// One (design, N): the webhook's side in this process, its figures on stdout.
fn child(flags: &BenchFlags, design: Design) {
    if let Err(e) = footprint::disable_transparent_huge_pages() {
        eprintln!("conn-memory: cannot turn transparent huge pages off: {e}");
    }
    if !footprint::one_malloc_arena() {
        eprintln!("conn-memory: glibc refused M_ARENA_MAX 1");
    }
    let n = flags.number("--streams", 1000) as usize;
    let port = flags.number("--agent-port", 0) as u16;
    let pki = flags.path("--pki");
    let kubeconfig = flags.path("--kubeconfig");
    let settle = Duration::from_secs(flags.number("--settle", 10));
    let measured = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime: {e}"))
        .and_then(|rt| rt.block_on(measure(design, n, port, &pki, &kubeconfig, settle)));
    match measured.and_then(|f| serde_json::to_string(&f).map_err(|e| e.to_string())) {
        Ok(json) => {
            println!("{FIGURES}{json}");
            // Not the N connections' teardown: the figures are out.
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("conn-memory: {}, {n} streams: {e}", design.label());
            std::process::exit(1);
        }
    }
}

/// How the `h2` streams ended: how many, and the first one's reason.
#[derive(Default)]
struct Ended {
    count: AtomicUsize,
    first: Mutex<Option<String>>,
}

impl Ended {
    fn add(&self, node: &str, why: String) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert_with(|| format!("{node}: {why}"));
    }

    fn first(&self) -> String {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first.clone().unwrap_or_else(|| "none ended".to_owned())
    }
}

async fn measure(
    design: Design,
    n: usize,
    port: u16,
    pki: &Path,
    kubeconfig: &Path,
    settle: Duration,
) -> Result<Figures, String> {
    let metrics = Arc::new(Metrics::new(Arc::default()));
    let files = ClientFiles {
        ca: pki.join("agents-ca.crt"),
        cert: pki.join("client.crt"),
        key: pki.join("client.key"),
        agents: AgentCertificates::Named,
    };
    let (client, _reloader) = Client::new(&files, port, Names::Shared, metrics.agent_tls.clone())
        .map_err(|e| e.to_string())?;
    let kube = kubeapi::client(Some(kubeconfig))
        .await
        .map_err(|e| e.to_string())?;
    // Kept until the end: a dropped sender stops the cache and the streams.
    let (stop, stopped) = watch::channel(false);
    let (cache, _node_watch) = NodeCache::start(kube, port, metrics.clone(), stopped.clone());
    let synced_by = Instant::now() + SYNC_WITHIN;
    while !cache.is_synced() || cache.agents().len() < n {
        if Instant::now() > synced_by {
            return Err(format!(
                "the Node cache did not sync {n} Nodes within {SYNC_WITHIN:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let table = Arc::new(Table::new(FRESH_WITHIN));
    let mut h2_config: ClientConfig = (*client.tls_config()).clone();
    h2_config.alpn_protocols = vec![b"h2".to_vec()];
    let h2_config = Arc::new(h2_config);
    let ended = Arc::new(Ended::default());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = std::process::id();
    let before = Footprint::of(pid);
    Footprint::reset_peak(pid);
    let started = Instant::now();
    let _streams: JoinHandle<()> = match design {
        Design::Http1 => tokio::spawn(stream::run(
            cache,
            table.clone(),
            client,
            metrics.clone(),
            stopped,
        )),
        Design::H2 => tokio::spawn(h2_streams(
            cache.agents(),
            table.clone(),
            h2_config,
            ended.clone(),
        )),
    };
    let ended_count = |metrics: &Metrics| match design {
        Design::Http1 => {
            cluster::sample(&metrics.render(Format::Prometheus), ENDS).unwrap_or(0.0) as usize
        }
        Design::H2 => ended.count.load(Ordering::Relaxed),
    };
    let open_by = Instant::now() + OPEN_WITHIN;
    while table.standing().fresh < n {
        if Instant::now() > open_by {
            return Err(format!(
                "{} of {n} nodes fresh after {OPEN_WITHIN:?}; {} streams ended (h2: first {})",
                table.standing().fresh,
                ended_count(&metrics),
                ended.first()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let opened = started.elapsed();
    let at_fresh = Footprint::of(pid);
    eprintln!(
        "  every first SNAPSHOT in after {:.1} s; settling {settle:?}",
        opened.as_secs_f64()
    );
    tokio::time::sleep(settle).await;
    let after = Footprint::of(pid);
    let figures = Figures {
        streams: n,
        fresh: table.standing().fresh,
        ended: ended_count(&metrics),
        before_rss_kib: before.rss_kib,
        before_peak_kib: before.peak_rss_kib,
        fresh_rss_kib: at_fresh.rss_kib,
        after_rss_kib: after.rss_kib,
        after_peak_kib: after.peak_rss_kib,
        opened_ms: opened.as_millis() as u64,
    };
    drop(stop);
    Ok(figures)
}

/// An `h2` stream for every agent, their first connections spread over [`START_SPREAD`] as the
/// webhook spreads its own; the tasks are kept by node, as [`stream::run`] keeps them.
async fn h2_streams(
    agents: Vec<(String, SocketAddr)>,
    table: Arc<Table>,
    config: Arc<ClientConfig>,
    ended: Arc<Ended>,
) {
    let n = agents.len().max(1);
    let mut streams: HashMap<String, (SocketAddr, JoinHandle<()>)> = HashMap::new();
    for (i, (node, addr)) in agents.into_iter().enumerate() {
        let (table, config, ended) = (table.clone(), config.clone(), ended.clone());
        let name = node.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(START_SPREAD.mul_f64(i as f64 / n as f64)).await;
            let why = h2_stream(&node, addr, &table, config).await;
            table.cut(&node);
            ended.add(&node, why);
        });
        streams.insert(name, (addr, task));
    }
    std::future::pending::<()>().await;
}

/// One agent's watch over hyper's HTTP/2 client connection, until it ends; why it ended.
async fn h2_stream(
    node: &str,
    addr: SocketAddr,
    table: &Table,
    config: Arc<ClientConfig>,
) -> String {
    let name = match Names::Shared.name(node) {
        Ok(name) => name,
        Err(e) => return e.to_string(),
    };
    let io = match dial(config, addr, name).await {
        Ok(io) => io,
        Err(e) => return e.to_string(),
    };
    if io.get_ref().1.alpn_protocol() != Some(b"h2") {
        return "ALPN did not choose h2".to_owned();
    }
    let (mut sender, connection) =
        match http2::handshake(TokioExecutor::new(), TokioIo::new(io)).await {
            Ok(pair) => pair,
            Err(e) => return format!("the HTTP/2 handshake: {e}"),
        };
    tokio::spawn(connection);
    let request = Request::get(format!("https://{SERVER_NAME}/v1/hugepages?watch=true"))
        .header(ACCEPT, "application/x-ndjson")
        .body(Empty::<Bytes>::new());
    let request = match request {
        Ok(request) => request,
        Err(e) => return format!("the request: {e}"),
    };
    let response = match sender.send_request(request).await {
        Ok(response) => response,
        Err(e) => return format!("the watch: {e}"),
    };
    if response.status() != 200 {
        return format!("answered HTTP {}, not a stream", response.status());
    }
    let within = table.fresh_within();
    let mut body = response.into_body();
    let mut line: Vec<u8> = Vec::new();
    loop {
        let frame = match tokio::time::timeout(within, body.frame()).await {
            Err(_) => return format!("no event within {within:?}"),
            Ok(None) => return "the agent closed the stream".to_owned(),
            Ok(Some(Err(e))) => return e.to_string(),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        line.extend_from_slice(&data);
        while let Some(at) = line.iter().position(|b| *b == b'\n') {
            let event: Event = match serde_json::from_slice(&line[..at]) {
                Ok(event) => event,
                Err(e) => return format!("an event that is not one: {e}"),
            };
            let version = event.agent_version.as_deref();
            match (event.kind.as_str(), event.object) {
                ("SNAPSHOT" | "MODIFIED", Some(state)) => {
                    table.put(node, addr, (&event.epoch, event.generation), version, state);
                }
                ("BOOKMARK", _) => table.heard(node, addr, version),
                (kind, _) => return format!("a {kind} event without a state"),
            }
            line.drain(..=at);
        }
        if line.len() > MAX_EVENT {
            return format!("an event over {MAX_EVENT} bytes");
        }
        // Between events no buffer is held, as the webhook's own reader holds none.
        if line.is_empty() {
            line = Vec::new();
        }
    }
}
